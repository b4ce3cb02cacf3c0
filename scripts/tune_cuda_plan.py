#!/usr/bin/env python3
"""Sweep CUDA launch-plan knobs for split_qkv_rmsnorm_rope on the local GPU.

Times ``ours`` (CUDA-graph replay, ``triton.testing.do_bench`` median) for every combination of
tile size, elements per thread (hence warps) and programs per SM on the benchmark geometries,
and prints, per (geometry, T), the current plan (``ops/tiling/cuda.py``) beside the best
combination. First it times two latency probes: one dependent load chain as the op has at one
token (positions -> cos/sin row -> store) and a single load -> store, to show what a one-token
launch cannot beat. The numbers back the constants in ``ops/tiling/cuda.py``; log them in
``docs/performance.md``.
"""

import argparse
import itertools
import json
import sys

import torch
import triton
import triton.language as tl

from vllm_ascend_ext.bench.cases import bytes_moved, make_inputs
from vllm_ascend_ext.bench.timing import Timer, copy_bandwidth, launch_floor
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import BENCH_GEOMETRIES, model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda


@triton.jit
def _chain_probe(pos_ptr, cache_ptr, out_ptr, CHAIN: tl.constexpr):
    d = tl.arange(0, 64)
    if CHAIN:
        row = tl.load(pos_ptr)
        tl.store(out_ptr + d, tl.load(cache_ptr + row * 128 + d))
    else:
        tl.store(out_ptr + d, tl.load(cache_ptr + d))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 4096, 16384])
    parser.add_argument("--tile", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--per-thread", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--per-sm", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--max-heads", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--json", help="write every measurement here")
    args = parser.parse_args()
    device = torch.device("cuda")
    timer = Timer(device, 0)
    facts = cuda_facts(torch.cuda.current_device())
    bandwidth, launch = copy_bandwidth(device, timer), launch_floor(device, timer)
    pos = torch.tensor([5], device=device)
    cache = torch.randn(4096, 128, device=device)
    out = torch.empty(64, device=device)
    probes = {chain: timer(lambda: _chain_probe[(1,)](pos, cache, out, CHAIN=chain, num_warps=1))
              for chain in (False, True)}
    print(f"copy {bandwidth / 1e9:.0f} GB/s, empty replay {launch:.2f} us, load->store "
          f"{probes[False]:.2f} us, pos->cos->store {probes[True]:.2f} us, {facts.num_sms} SMs")
    records = []
    for name, tp in BENCH_GEOMETRIES:
        g = model(name).shard(tp)
        shape = KernelShape.of(g, 2, 4)
        for count in args.tokens:
            current = cuda.plan_for_tokens(shape, facts, count)  # what the op launches
            inputs = make_inputs(g, count, device)
            floor = bytes_moved(g, count) / bandwidth * 1e6
            results = []
            for knobs in itertools.product(args.tile, args.per_thread, args.per_sm, args.max_heads):
                plan = cuda.plan(shape, facts, tile_elements=knobs[0], elements_per_thread=knobs[1],
                                 programs_per_sm=knobs[2], max_block_heads=knobs[3])
                with tiling.forced(plan=plan):
                    us = timer(lambda: split_qkv_rmsnorm_rope(**inputs))
                results.append((us, *knobs))
                records.append(dict(geometry=g.label, tokens=count, tile=knobs[0], per_thread=knobs[1],
                                    per_sm=knobs[2], max_heads=knobs[3], warps=plan.num_warps,
                                    block_tokens=plan.block_tokens, us=us, floor_us=floor, launch_us=launch))
            with tiling.forced(plan=current):
                now = timer(lambda: split_qkv_rmsnorm_rope(**inputs))
            best = min(results)
            print(f"{g.label:20} T={count:6d} current {now:8.2f} us ({now / floor:5.2f} floor, "
                  f"{now / launch:5.2f} launch) best {best[0]:8.2f} us tile={best[1]} "
                  f"per_thread={best[2]} per_sm={best[3]} max_heads={best[4]}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(bandwidth=bandwidth, launch=launch, probes=probes, records=records), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
