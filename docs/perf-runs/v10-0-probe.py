"""v10 probe 0: the positions (and, with the KV-cache write, the slots) of a program's next tile
loaded during its current tile (``CudaPlan.pos_ahead``, the kernel's POS_AHEAD), so the cos/sin
gather and the cache addresses wait on no load after a program's first tile. On every benchmark
geometry, both ops, T = 1024 / 4096 / 16384; the write also at 8 programs an SM (where a program
has tiles to run ahead on). Two repeats, interleaved."""
import dataclasses
import torch
from vllm_ascend_ext.bench import _Timer, bytes_moved, copy_replay, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda
device = torch.device("cuda"); timer = _Timer(device, 0); facts = cuda_facts(torch.cuda.current_device())
R = dataclasses.replace
S = facts.num_sms


def variants(shape, kv):
    base = cuda.plan(shape, facts)
    out = {"default": base, "ahead": R(base, pos_ahead=True)}
    if kv:
        out["psm8"] = R(base, max_programs=S * 8)
        out["psm8 ahead"] = R(base, max_programs=S * 8, pos_ahead=True)
    return out


def run(g, kv, n, vs, copy):
    if kv:
        args, cache = make_kv_inputs(g, n, device)
        fn = lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache)
    else:
        args = make_inputs(g, n, device)
        fn = lambda: split_qkv_rmsnorm_rope(**args)
    for rep in range(2):
        for label, plan in vs.items():
            try:
                with tiling.forced(plan=plan):
                    us = timer(fn)
            except Exception as e:  # a knob the kernel refuses: say so, go on
                print(f"{g.label:28} {label:22} FAILED {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
            print(f"{g.label:28} {'kv' if kv else 'pro'} T={n:5d} {label:22} rep{rep} {us:8.2f} "
                  f"copy {copy:8.2f} {us / copy:5.2f}", flush=True)


GEOS = (("Qwen3-32B", 8), ("Qwen3-Next-80B-A3B", 1), ("Qwen3-VL-8B", 1), ("Qwen3-8B", 1),
        ("Qwen3-235B-A22B", 1), ("Gemma-4-31B:sliding", 1))
for name, tp in GEOS:
    g = model(name).shard(tp)
    for kv in (False, True):
        shape = KernelShape.of(g, 2, 4)
        if kv:
            shape = R(shape, kv_cache=True)
        for n in (1024, 4096, 16384):
            run(g, kv, n, variants(shape, kv), copy_replay(device, timer, bytes_moved(g, n, kv_cache=kv)))
