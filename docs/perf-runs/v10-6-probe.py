"""v10 probe 6: the gate moved in q's tiles (``CudaPlan.g_in_q_tiles``, the kernel's G_WITH_Q):
each q tile copies its heads' gate after q's stores, so the gate needs no head blocks of its own
(its D values follow q's in qkv). The benchmark's gated layer, Qwen3-Next-80B-A3B at TP 1
(16/2/256 R64, (1 + w)), both ops, T = 256 (small-batch plan) and 4096 / 16384 (large plan), against
the plan the op picks. Two repeats, interleaved."""
import dataclasses
import torch
from vllm_ascend_ext.bench import _Timer, bytes_moved, copy_replay, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda
device = torch.device("cuda"); timer = _Timer(device, 0); facts = cuda_facts(torch.cuda.current_device())
R = dataclasses.replace

for name in ("Qwen3-Next-80B-A3B",):
    g = model(name).shard(1)
    for kv in (False, True):
        shape = R(KernelShape.of(g, 2, 4), kv_cache=kv)
        for n in (256, 4096, 16384):
            base = cuda.plan_for_tokens(shape, facts, n)
            vs = {"default": base, "gate in q": R(base, g_in_q_tiles=True)}
            copy = copy_replay(device, timer, bytes_moved(g, n, kv_cache=kv))
            if kv:
                args, cache = make_kv_inputs(g, n, device)
                fn = lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache)
            else:
                args = make_inputs(g, n, device)
                fn = lambda: split_qkv_rmsnorm_rope(**args)
            for rep in range(2):
                for label, plan in vs.items():
                    with tiling.forced(plan=plan):
                        us = timer(fn)
                    print(f"{g.label:34} {'kv' if kv else 'pro'} T={n:5d} {label:10} rep{rep} {us:8.2f} "
                          f"copy {copy:8.2f} {us / copy:5.2f}", flush=True)
