"""v11 sweep 2: launch plans for the gated layer (Qwen3-Next-80B-A3B TP 1: 16/2/256 R64, (1 + w)),
the one benchmark row above the copy bars. Large plans at T = 4096 / 16384 (tokens a tile, warps,
register cap, the gate in q's tiles at 4 heads a block, programs an SM), both ops; small-batch plans
at T = 8 / 64 / 256 (tokens and heads a tile, warps, programs an SM). Each line: ours / the
same-bytes copy of the same run (one call a captured graph; the write also amortised over 20).
A compile failure prints and moves on. Ends with the best per (op, T, mode)."""
import dataclasses
import itertools
import torch
from vllm_ascend_ext.bench import _Timer, _triton_copy, bytes_moved, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda
device = torch.device("cuda"); timer = _Timer(device, 0); facts = cuda_facts(torch.cuda.current_device())
R, SMS = dataclasses.replace, facts.num_sms
g = model("Qwen3-Next-80B-A3B").shard(1)
LARGE = {False: [(4, 4, 80), (2, 2, 80), (2, 4, 80), (8, 4, 80), (8, 8, 80), (4, 4, 96), (4, 2, 128), (4, 8, 64)],
         True: [(4, 2, 128), (4, 4, 80), (4, 4, 96), (2, 2, 128), (8, 4, 96), (8, 2, 128)]}
PER_SM = {False: (16, 24, 32, 48), True: (8, 16, 24)}
SMALL = [(1, 8, 4), (1, 16, 4), (1, 16, 8), (1, 8, 2), (1, 8, 8), (2, 8, 4), (1, 4, 2), (2, 16, 8)]
best = {}


def run(kv, n, label, plan, calls_list=(1,)):
    for calls in calls_list:
        try:
            with tiling.forced(plan=plan):
                us = timer(fn, calls)
        except Exception as exc:  # noqa: BLE001 - a sweep point that does not compile
            print(f"{'kv' if kv else 'pro'} T={n} {label}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            return
        r = us / copy[calls]
        key = ('kv' if kv else 'pro', n, calls)
        print(f"{key[0]:3} x{calls:<2d} T={n:5d} {label:44} {us:8.2f} copy {copy[calls]:8.2f} {r:5.3f}", flush=True)
        if key not in best or r < best[key][0]:
            best[key] = (r, us, label)


for kv in (False, True):
    shape = R(KernelShape.of(g, 2, 4), kv_cache=kv)
    for n in (8, 64, 256, 4096, 16384):
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
        run(kv, n, "DEFAULT", cuda.plan_for_tokens(shape, facts, n), modes)
        if n >= 4096:
            base = cuda.plan(shape, facts)
            for (bt, w, cap), gq, per_sm in itertools.product(LARGE[kv], (False, True), PER_SM[kv]):
                p = R(base, block_tokens=bt, num_warps=w, max_registers=cap, max_programs=SMS * per_sm,
                      g_in_q_tiles=gq, block_heads=4 if gq else base.block_heads)
                run(kv, n, f"bt{bt} w{w} cap{cap} gq{int(gq)} {per_sm}/SM", p, modes)
        else:
            base = cuda.small_batch_plan(shape, facts)
            for (bt, bh, w), per_sm in itertools.product(SMALL, (4, 8) if n == 256 else (8,)):
                p = R(base, block_tokens=bt, block_heads=bh, num_warps=w, max_programs=SMS * per_sm)
                run(kv, n, f"small bt{bt} bh{bh} w{w} {per_sm}/SM", p)
            if n == 256:
                for per_sm in PER_SM[kv]:
                    run(kv, n, f"large {per_sm}/SM", R(cuda.plan(shape, facts), max_programs=SMS * per_sm))
print("best:")
for key, (r, us, label) in sorted(best.items()):
    print(f"  {key[0]:3} x{key[2]:<2d} T={key[1]:5d} {r:5.3f} {us:8.2f} {label}")
