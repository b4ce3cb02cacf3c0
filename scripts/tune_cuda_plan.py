#!/usr/bin/env python3
"""Sweep CUDA launch-plan knobs for split_qkv_rmsnorm_rope on the local GPU.

Times ``ours`` (CUDA-graph replay, ``triton.testing.do_bench`` median) for every combination of
tile size, warps and programs per SM on the benchmark geometries, and prints, per (geometry, T),
the time of the current plan (``ops/tiling/cuda.py``) beside the best combination. The numbers
back the constants in ``ops/tiling/cuda.py``; log them in ``docs/perf-notes.md``.
"""

import argparse
import itertools
import json
import sys

import torch

from vllm_ascend_ext.bench import _Timer, bytes_moved, copy_bandwidth, launch_floor, make_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import BENCH_GEOMETRIES, model
from vllm_ascend_ext.ops.tiling import KernelShape, block_heads_for, cuda, prev_pow2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 1024, 4096, 16384])
    parser.add_argument("--tile", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--warps", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--per-sm", type=int, nargs="+", default=[4, 8, 16, 1 << 20])
    parser.add_argument("--json", help="write every measurement here")
    args = parser.parse_args()
    device = torch.device("cuda")
    timer = _Timer(device, 0)
    facts = cuda_facts(torch.cuda.current_device())
    bandwidth, launch = copy_bandwidth(device, timer), launch_floor(device, timer)
    print(f"copy {bandwidth / 1e9:.0f} GB/s, empty replay {launch:.2f} us, {facts.num_sms} SMs")
    records = []
    for name, tp in BENCH_GEOMETRIES:
        g = model(name).shard(tp)
        shape = KernelShape(g.num_q_heads, g.num_kv_heads, g.head_dim, g.rotary_dim, 2, 4, g.is_neox)
        current = cuda.plan(shape, facts)
        for count in args.tokens:
            inputs = make_inputs(g, count, device)
            floor = bytes_moved(g, count) / bandwidth * 1e6
            results = []
            for tile, warps, per_sm in itertools.product(args.tile, args.warps, args.per_sm):
                heads = block_heads_for(shape, cuda.MAX_BLOCK_HEADS, cuda.MAX_HEAD_WASTE)
                tokens = prev_pow2(max(1, tile // shape.padded_head_dim) // heads)
                plan = cuda.CudaPlan(block_tokens=tokens, block_heads=heads,
                                     max_programs=facts.num_sms * per_sm, num_warps=warps)
                with tiling.forced(plan=plan):
                    us = timer(lambda: split_qkv_rmsnorm_rope(**inputs))
                results.append((us, tile, warps, per_sm))
                records.append(dict(geometry=g.label, tokens=count, tile=tile, warps=warps,
                                    per_sm=per_sm, us=us, floor_us=floor, launch_us=launch))
            with tiling.forced(plan=current):
                now = timer(lambda: split_qkv_rmsnorm_rope(**inputs))
            best = min(results)
            print(f"{g.label:20} T={count:6d} current {now:8.2f} us ({now / floor:5.2f} floor, "
                  f"{now / launch:5.2f} launch) best {best[0]:8.2f} us tile={best[1]} "
                  f"warps={best[2]} per_sm={best[3]}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(records, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
