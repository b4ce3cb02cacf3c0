"""v11 probe 3: each q and k head held as one contiguous row (``CudaPlan.whole_rows``, the kernel's
WHOLE_ROW: the rotary lanes load their pair element a second time) instead of rotary halves and a
chunked or two-piece tail. Part A, the gated layer (Qwen3-Next-80B-A3B TP 1: 16/2/256 R64, (1 + w)),
both ops: whole-row plans (tokens and heads a tile, warps, register cap, the gate in q's tiles,
programs an SM) at T = 4096 / 16384 and small-batch ones at T = 8 / 64 / 256, beside the plan the op
picks and sweep 2's best. Part B, the other benchmark geometries (full rotary): the plan the op
picks with and without whole rows. Each line: ours / the same-bytes copy of the same run (one call
a captured graph; the write also amortised over 20)."""
import dataclasses
import itertools
import torch
from vllm_ascend_ext.bench import _Timer, _triton_copy, bytes_moved, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import BENCH_GEOMETRIES, model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda
device = torch.device("cuda"); timer = _Timer(device, 0); facts = cuda_facts(torch.cuda.current_device())
R, SMS = dataclasses.replace, facts.num_sms
LARGE = [(1, 8, 2, 0), (1, 8, 4, 0), (2, 8, 4, 0), (2, 8, 8, 0), (4, 8, 8, 0), (2, 4, 2, 0), (4, 4, 4, 0),
         (1, 16, 4, 0), (2, 8, 4, 128)]
SMALL = [(1, 8, 4), (1, 4, 2), (1, 8, 2), (1, 16, 4), (2, 8, 4), (1, 16, 8)]
SWEEP2_BEST = {False: dict(block_heads=4, g_in_q_tiles=True, max_programs=SMS * 48),
               True: dict(max_programs=SMS * 24)}


def timed(fn, copy, kv, n, label, plan, modes):
    for calls in modes:
        try:
            with tiling.forced(plan=plan):
                us = timer(fn, calls)
        except Exception as exc:  # noqa: BLE001 - a point that does not compile
            print(f"{'kv' if kv else 'pro'} T={n} {label}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            return
        print(f"{'kv' if kv else 'pro':3} x{calls:<2d} T={n:5d} {label:44} {us:8.2f} copy {copy[calls]:8.2f} "
              f"{us / copy[calls]:5.3f}", flush=True)


def setup(g, n, kv):
    if kv:
        args, cache = make_kv_inputs(g, n, device)
        fn = lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache)
    else:
        args = make_inputs(g, n, device)
        fn = lambda: split_qkv_rmsnorm_rope(**args)
    nb = max(1, bytes_moved(g, n, kv_cache=kv) // 4)
    src = torch.zeros(nb, dtype=torch.int16, device=device); dst = torch.empty_like(src)
    modes = (1, 20) if kv and n >= 4096 else (1,)
    copy = {c: min(timer(lambda: _triton_copy(src, dst, b, w), c) for b, w in ((2048, 4), (8192, 8))) for c in modes}
    return fn, copy, modes


g = model("Qwen3-Next-80B-A3B").shard(1)
for kv in (False, True):
    shape = R(KernelShape.of(g, 2, 4), kv_cache=kv)
    for n in (8, 64, 256, 4096, 16384):
        fn, copy, modes = setup(g, n, kv)
        timed(fn, copy, kv, n, "DEFAULT", cuda.plan_for_tokens(shape, facts, n), modes)
        if n >= 4096:
            base = cuda.plan(shape, facts)
            timed(fn, copy, kv, n, "sweep-2 best", R(base, **SWEEP2_BEST[kv]), modes)
            for (bt, bh, w, cap), gq, per_sm in itertools.product(LARGE, (False, True), (16, 32, 64)):
                p = R(base, block_tokens=bt, block_heads=bh, num_warps=w, max_registers=cap, tail_lanes=0,
                      max_programs=SMS * per_sm, g_in_q_tiles=gq, whole_rows=True, pos_ahead=False)
                timed(fn, copy, kv, n, f"whole bt{bt} bh{bh} w{w} cap{cap} gq{int(gq)} {per_sm}/SM", p, modes)
        else:
            base = cuda.small_batch_plan(shape, facts)
            for bt, bh, w in SMALL:
                p = R(base, block_tokens=bt, block_heads=bh, num_warps=w, whole_rows=True, two_piece_tail=False)
                timed(fn, copy, kv, n, f"whole small bt{bt} bh{bh} w{w}", p, modes)
for name, tp in BENCH_GEOMETRIES:
    g = model(name).shard(tp)
    if g.label.startswith("16/2/256 R64"):
        continue
    for kv in (False, True):
        shape = R(KernelShape.of(g, 2, 4), kv_cache=kv)
        for n in (64, 4096, 16384):
            fn, copy, modes = setup(g, n, kv)
            base = cuda.plan_for_tokens(shape, facts, n)
            for label, plan in (("DEFAULT", base), ("DEFAULT + whole rows", R(base, whole_rows=True))):
                timed(fn, copy, kv, n, f"{g.label[:20]} {label}", plan, modes)
