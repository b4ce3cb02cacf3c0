#!/usr/bin/env python3
"""Launch split_qkv_rmsnorm_rope once per benchmark geometry at one token count, for a profiler.

    ncu --clock-control none -k regex:split_qkv --launch-skip 1 python3 scripts/ncu_one_launch.py 16384

Each geometry runs twice (the first launch compiles); profile the second with ``--launch-skip``
or take every other kernel. Nothing is timed here: the profiler does that.
"""

import sys

import torch

from vllm_ascend_ext.bench.cases import make_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope
from vllm_ascend_ext.ops.models import BENCH_GEOMETRIES, model


def main() -> int:
    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
    for name, tp in BENCH_GEOMETRIES:
        args = make_inputs(model(name).shard(tp), tokens, torch.device("cuda"))
        for _ in range(2):
            split_qkv_rmsnorm_rope(**args)
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
