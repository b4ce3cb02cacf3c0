"""v9 probe 1: probe 0 found 4 warps under a register cap (80) with 12-16 programs an SM faster on
mRoPE (T = 4096 1.16 -> 1.11 x the copy) and the gated layer's prologue. Here: the cap and the
programs per SM around that point, on every benchmark geometry (is it a general plan?), both ops,
T = 1024 / 4096 / 16384; the gated layer's small-batch plan at T = 256. Two repeats, interleaved."""
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


def large(shape):
    base = cuda.plan(shape, facts)
    out = {"default": base}
    for cap, psm in ((72, 12), (80, 10), (80, 12), (80, 14), (80, 16), (88, 12), (88, 16), (80, 24)):
        out[f"w4 nreg{cap} psm{psm}"] = R(base, num_warps=4, max_registers=cap, max_programs=S * psm)
    out["w4 nocap psm8"] = R(base, num_warps=4, max_registers=0, max_programs=S * 8)
    return out


def small(shape):
    base = cuda.small_batch_plan(shape, facts)
    out = {"small default": base, "large default": cuda.plan(shape, facts),
           "large w4 nreg80 psm12": R(cuda.plan(shape, facts), num_warps=4, max_registers=80, max_programs=S * 12)}
    for warps in (2, 8):
        out[f"small w{warps}"] = R(base, num_warps=warps)
    for bt in (1, 2):
        if bt != base.block_tokens:
            out[f"small bt{bt}"] = R(base, block_tokens=bt)
    out["small nreg80"] = R(base, max_registers=80)
    out["small late"] = R(base, late_rows=not base.late_rows)
    out["small tail32 chunks"] = R(base, two_piece_tail=False, tail_lanes=32)
    out["small tail64 chunks"] = R(base, two_piece_tail=False, tail_lanes=64)
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


GEOS = (("Qwen3-Next-80B-A3B", 1), ("Qwen3-VL-8B", 1), ("Qwen3-8B", 1), ("Qwen3-235B-A22B", 1),
        ("Gemma-4-31B:sliding", 1), ("Qwen3-32B", 8))
for name, tp in GEOS:
    g = model(name).shard(tp)
    for kv in (False, True):
        shape = KernelShape.of(g, 2, 4)
        if kv:
            shape = R(shape, kv_cache=True)
        for n in (1024, 4096, 16384):
            run(g, kv, n, large(shape), copy_replay(device, timer, bytes_moved(g, n, kv_cache=kv)))
        if name == "Qwen3-Next-80B-A3B":
            run(g, kv, 256, small(shape), copy_replay(device, timer, bytes_moved(g, 256, kv_cache=kv)))
