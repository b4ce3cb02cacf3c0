"""v9 probe 2, two repeats interleaved, one run. (a) K_WITH_Q (``CudaPlan.k_in_q_tiles``): k's head
block j moved in the tile of q's block j, so a token block's positions are read once and k's small
blocks cost no loop iteration of their own; on the large plans of the benchmark's geometries, both
ops, T = 1024 / 4096 / 16384 (8/1/128 also at 4 and 16 programs an SM). (b) The v9 plan rules
(mRoPE: 4 warps, cap 80, 12 an SM; chunked-tail prologue: 4 warps, cap 80, 24 an SM) against the
v8 plans on table rows probe 1 did not time (Qwen3.5's gated mRoPE, MiMo's 192-dim heads, narrow
TP shards). Prints one line a timing.

(a) needs the K_WITH_Q kernel variant and ``CudaPlan.k_in_q_tiles`` it was run with; both were
taken out again after this run (rejected, perf-notes v9), so (a) no longer runs on the current tree."""
import dataclasses
import torch
from vllm_ascend_ext.bench import _Timer, bytes_moved, copy_replay, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda, prev_pow2
device = torch.device("cuda"); timer = _Timer(device, 0); facts = cuda_facts(torch.cuda.current_device())
R = dataclasses.replace
S = facts.num_sms


def v8_plan(shape, p):
    """The v8 rules for the same tile: warps from the widest sub-tile, 8 an SM (16 capped at 128
    with the cache write)."""
    widest = p.block_tokens * p.block_heads * max(shape.half_pad, p.tail_width(shape))
    warps = max(2, min(8, prev_pow2(widest // 1024)))
    kv = shape.kv_cache
    return R(p, num_warps=warps, max_registers=128 if kv else 0, max_programs=S * (16 if kv else 8))


def run(g, kv, n, vs):
    copy = copy_replay(device, timer, bytes_moved(g, n, kv_cache=kv))
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
                print(f"{g.label:28} {label:22} FAILED {type(e).__name__}: {str(e)[:160]}", flush=True)
                continue
            print(f"{g.label[:28]:28} {'kv' if kv else 'pro'} T={n:5d} {label:22} rep{rep} {us:8.2f} "
                  f"copy {copy:8.2f} {us / copy:5.2f}", flush=True)


def shape_of(g, kv):
    shape = KernelShape.of(g, 2, 4)
    return R(shape, kv_cache=True) if kv else shape


for name, tp in (("Qwen3-32B", 8), ("Qwen3-Next-80B-A3B", 1), ("Qwen3-235B-A22B", 1), ("Qwen3-8B", 1),
                 ("Qwen3-VL-8B", 1), ("Qwen3-8B", 4)):
    g = model(name).shard(tp)
    for kv in (False, True):
        p = cuda.plan(shape_of(g, kv), facts)
        vs = {"default": p, "kwq": R(p, k_in_q_tiles=True)}
        if name == "Qwen3-32B":
            for psm in (4, 16):
                vs[f"kwq psm{psm}"] = R(p, k_in_q_tiles=True, max_programs=S * psm)
        for n in (1024, 4096, 16384):
            run(g, kv, n, vs)

for name, tp in (("Qwen3.5-35B-A3B", 1), ("Qwen3.5-35B-A3B", 4), ("MiMo-V2-Flash-qk", 1), ("Qwen3-Next-80B-A3B", 4),
                 ("Qwen2.5-VL-7B", 1), ("Qwen3-VL-8B", 8)):
    g = model(name).shard(tp)
    for kv in (False, True):
        shape = shape_of(g, kv)
        p = cuda.plan(shape, facts)
        if kv and not shape.mrope:
            continue  # the chunked rule is the prologue's only
        for n in (4096, 16384):
            run(g, kv, n, {"v9": p, "v8": v8_plan(shape, p)})
