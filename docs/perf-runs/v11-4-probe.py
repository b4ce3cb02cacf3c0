"""v11 probe 4: confirm sweep 2's grid changes on every geometry with a chunked tail, three
interleaved repeats. Large plans at T = 1024 / 4096 / 16384: the prologue's programs an SM (24, the
plan; 32 / 48 / 64) and, on Qwen3-Next TP 1, the gate in q's tiles at 4 heads a block, 48 an SM; the
write's (16, the plan; 24 / 32). Geometries: Qwen3-Next-80B-A3B TP 1 and 4 (16/2/256, 4/1/256 R64),
MiMo-V2-Flash's q/k (64/4/192 R64), Qwen3.5-27B TP 1 (24/4/256 R64 gated, mRoPE). Then the gated
layer's small-batch plan at T = 8 / 64 / 256 against 1 token x 4 heads x 2 warps and whole rows
(probe 3's best). Each line: ours / the same-bytes copy of the same run."""
import dataclasses
import torch
from vllm_ascend_ext.bench import _Timer, _triton_copy, bytes_moved, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda
device = torch.device("cuda"); timer = _Timer(device, 0); facts = cuda_facts(torch.cuda.current_device())
R, SMS = dataclasses.replace, facts.num_sms


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


def run(g, kv, n, variants):
    fn, copy, modes = setup(g, n, kv)
    for rep in range(3):
        for label, plan in variants.items():
            for calls in modes:
                with tiling.forced(plan=plan):
                    us = timer(fn, calls)
                print(f"{g.label[:28]:28} {'kv' if kv else 'pro':3} x{calls:<2d} T={n:5d} {label:22} rep{rep} "
                      f"{us:8.2f} copy {copy[calls]:8.2f} {us / copy[calls]:5.3f}", flush=True)


for name, tp in (("Qwen3-Next-80B-A3B", 1), ("Qwen3-Next-80B-A3B", 4), ("MiMo-V2-Flash-qk", 1), ("Qwen3.5-27B", 1)):
    g = model(name).shard(tp)
    for kv in (False, True):
        shape = R(KernelShape.of(g, 2, 4), kv_cache=kv)
        base = cuda.plan(shape, facts)
        per_sm = base.max_programs // SMS
        vs = {f"plan {per_sm}/SM": base}
        vs |= {f"{k}/SM": R(base, max_programs=SMS * k) for k in ((24, 32) if kv else (32, 48, 64))}
        if not kv and (name, tp) == ("Qwen3-Next-80B-A3B", 1):
            vs["gq bh4 48/SM"] = R(base, max_programs=SMS * 48, g_in_q_tiles=True, block_heads=4)
        for n in (1024, 4096, 16384):
            run(g, kv, n, vs)
g = model("Qwen3-Next-80B-A3B").shard(1)
for kv in (False, True):
    base = cuda.small_batch_plan(R(KernelShape.of(g, 2, 4), kv_cache=kv), facts)
    vs = {"plan": base, "bt1 bh4 w2": R(base, block_heads=4, num_warps=2),
          "whole bt1 bh4 w2": R(base, block_heads=4, num_warps=2, whole_rows=True, two_piece_tail=False),
          "whole bt1 bh8 w2": R(base, num_warps=2, whole_rows=True, two_piece_tail=False)}
    for n in (8, 64, 256):
        run(g, kv, n, vs)
