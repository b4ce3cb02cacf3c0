"""v11 probe 0: the gate moved in q's tiles (``CudaPlan.g_in_q_tiles``, the kernel's G_WITH_Q),
on the benchmark's gated layer (Qwen3-Next-80B-A3B at TP 1: 16/2/256 R64, (1 + w)), both ops, at
T = 8 / 256 (small-batch plan) and 4096 / 16384 (large plan). Variants: the plan the op picks; the
gate in q's tiles with the same 8 heads a block (q's 2 blocks then move 2x the bytes of k's one);
the same with 4 heads a block (4 q blocks + 1 k block: the head blocks of the default plan).
The cache write is also timed amortised (20 calls in one graph). Two repeats, interleaved."""
import dataclasses
import torch
from vllm_ascend_ext.bench import _Timer, _triton_copy, bytes_moved, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda
device = torch.device("cuda"); timer = _Timer(device, 0); facts = cuda_facts(torch.cuda.current_device())
R = dataclasses.replace

g = model("Qwen3-Next-80B-A3B").shard(1)
for kv in (False, True):
    shape = R(KernelShape.of(g, 2, 4), kv_cache=kv)
    for n in (8, 256, 4096, 16384):
        base = cuda.plan_for_tokens(shape, facts, n)
        vs = {"default": base, "gq bh8": R(base, g_in_q_tiles=True),
              "gq bh4": R(base, g_in_q_tiles=True, block_heads=4)}
        modes = [1] + ([20] if kv and n >= 4096 else [])
        if kv:
            args, cache = make_kv_inputs(g, n, device)
            fn = lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache)
        else:
            args = make_inputs(g, n, device)
            fn = lambda: split_qkv_rmsnorm_rope(**args)
        # the copy of the same bytes, timed like the op (amortised too)
        nb = max(1, bytes_moved(g, n, kv_cache=kv) // 4)
        src = torch.zeros(nb, dtype=torch.int16, device=device); dst = torch.empty_like(src)
        for calls in modes:
            copy = min(timer(lambda: _triton_copy(src, dst, b, w), calls) for b, w in ((2048, 4), (8192, 8)))
            for rep in range(2):
                for label, plan in vs.items():
                    with tiling.forced(plan=plan):
                        us = timer(fn, calls)
                    print(f"{g.label:34} {'kv' if kv else 'pro'} x{calls:<2d} T={n:5d} {label:8} rep{rep} "
                          f"{us:8.2f} copy {copy:8.2f} {us / copy:5.2f}", flush=True)
