"""v11 probe 5: the v11 rules on chunked geometries the probes before did not time. The small-batch
plan's whole rows (2 warps) against the plan before v11 (two-piece tail, 4 warps) at T = 8 / 64 / 256,
both ops, on Qwen3-Next TP 4 / 8 (4/1/256, 2/1/256 R64 gated) and Qwen3.5-35B-A3B TP 1 (16/2/256 R64
gated, mRoPE: 2 tokens a tile); the chunked mRoPE prologue's 64 programs an SM against 8 on
Qwen3.5-35B-A3B TP 1 and Qwen3.5-397B-A17B TP 1 (32/2/256) at T = 4096 / 16384. Two interleaved
repeats; each line: ours / the same-bytes copy of the same run."""
import dataclasses
import torch
from vllm_ascend_ext.bench import _Timer, _triton_copy, bytes_moved, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda
device = torch.device("cuda"); timer = _Timer(device, 0); facts = cuda_facts(torch.cuda.current_device())
R, SMS = dataclasses.replace, facts.num_sms


def run(g, kv, n, variants):
    if kv:
        args, cache = make_kv_inputs(g, n, device)
        fn = lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache)
    else:
        args = make_inputs(g, n, device)
        fn = lambda: split_qkv_rmsnorm_rope(**args)
    nb = max(1, bytes_moved(g, n, kv_cache=kv) // 4)
    src = torch.zeros(nb, dtype=torch.int16, device=device); dst = torch.empty_like(src)
    copy = min(timer(lambda: _triton_copy(src, dst, b, w)) for b, w in ((2048, 4), (8192, 8)))
    for rep in range(2):
        for label, plan in variants.items():
            with tiling.forced(plan=plan):
                us = timer(fn)
            print(f"{g.label[:36]:36} {'kv' if kv else 'pro':3} T={n:5d} {label:18} rep{rep} {us:8.2f} "
                  f"copy {copy:8.2f} {us / copy:5.3f}", flush=True)


for name, tp in (("Qwen3-Next-80B-A3B", 4), ("Qwen3-Next-80B-A3B", 8), ("Qwen3.5-35B-A3B", 1)):
    g = model(name).shard(tp)
    for kv in (False, True):
        small = cuda.small_batch_plan(R(KernelShape.of(g, 2, 4), kv_cache=kv), facts)
        before = R(small, whole_rows=False, two_piece_tail=True, num_warps=cuda.SMALL_WARPS)
        for n in (8, 64, 256):
            run(g, kv, n, {"whole rows (v11)": small, "before v11": before})
for name in ("Qwen3.5-35B-A3B", "Qwen3.5-397B-A17B"):
    g = model(name).shard(1)
    large = cuda.plan(KernelShape.of(g, 2, 4), facts)
    for n in (4096, 16384):
        run(g, False, n, {"64/SM (v11)": large, "8/SM before": R(large, max_programs=SMS * 8)})
