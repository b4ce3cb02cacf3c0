"""One-off H200 sweep for issue 10 (not shipped): ours vs the same-bytes copy on new variants,
and CUDA plan candidates for the partial-rotary 16/2/256 R64 geometry."""
import json, sys, itertools, time
import torch
from vllm_ascend_ext import bench
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope as op
from vllm_ascend_ext.ops.models import AttentionGeometry as G
from vllm_ascend_ext.ops.tiling import KernelShape, forced, cuda
from vllm_ascend_ext.ops.tiling.cuda import CudaPlan
from vllm_ascend_ext.ops import device as dev

device = torch.device("cuda")
timer = bench._Timer(device, 50)
out = {"rows": [], "sweep": []}
TOK = (1, 64, 256, 4096, 16384)
SWEEP_TOK = (64, 4096, 16384)
log = open(sys.argv[1] + ".log", "w", buffering=1)
geos = {
    "32/8/128": G(32, 8, 128, 128),
    "64/4/128": G(64, 4, 128, 128),
    "8/1/128": G(8, 1, 128, 128),
    "16/2/256 R64 w+1": G(16, 2, 256, 64, weight_offset=1.0),
    "32/8/128 mrope-i": G(32, 8, 128, 128, mrope_section=(24, 20, 20), mrope_interleaved=True),
    "16/2/256 R64 w+1 gate": G(16, 2, 256, 64, weight_offset=1.0, q_gate=True),
    "16/8/256 vnorm": G(16, 8, 256, 256, v_norm=True),
    "32/4/512 R128 vnorm": G(32, 4, 512, 128, v_norm=True),
    "16/0/256 qonly": G(16, 0, 256, 256),
}
def time_ours(g, T, plan=None):
    args = bench.make_inputs(g, T, device, seed=T)
    if plan is None:
        return timer(lambda: op(**args))
    with forced(plan=plan):
        return timer(lambda: op(**args))
for name, g in geos.items():
    for T in TOK:
        nbytes = bench.bytes_moved(g, T)
        copy = bench.copy_replay(device, timer, nbytes)
        ours = time_ours(g, T)
        out["rows"].append(dict(geo=name, T=T, ours=ours, copy=copy, ratio=ours / copy))
        print(f"{name:24s} T={T:6d} ours {ours:7.2f} copy {copy:7.2f} ratio {ours/copy:5.2f}", file=log)
facts = dev.cuda_facts(0)
sweep_geos = {"16/2/256 R64 w+1": geos["16/2/256 R64 w+1"]}
for name, g in sweep_geos.items():
    shape = KernelShape.of(g, 2, 4)
    copies = {T: bench.copy_replay(device, timer, bench.bytes_moved(g, T)) for T in SWEEP_TOK}
    for tail, bt, warps, late in itertools.product((32, 64), (2, 4), (2, 4), (False,)):
        plan = CudaPlan(block_tokens=bt, block_heads=8, max_programs=facts.num_sms * 8, kv_block_heads=2,
                        num_warps=warps, tail_lanes=tail, late_rows=late)
        for T in SWEEP_TOK:
            try:
                us = time_ours(g, T, plan)
            except Exception as e:  # noqa
                us = float("nan")
            out["sweep"].append(dict(geo=name, tail=tail, bt=bt, warps=warps, late=late, T=T, us=us, ratio=us / copies[T]))
            print(out["sweep"][-1], file=log)
    best = {}
    for r in out["sweep"]:
        if r["geo"] != name: continue
        if r["T"] not in best or r["us"] < best[r["T"]]["us"]:
            best[r["T"]] = r
    for T, r in sorted(best.items()):
        print("best", name, T, r, file=log)
json.dump(out, open(sys.argv[1], "w"), indent=1)
