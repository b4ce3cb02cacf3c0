#!/usr/bin/env python3
"""Launch an op once per benchmark geometry at one token count, for a profiler.

    ncu --clock-control none -k regex:split_qkv --launch-skip 1 python3 scripts/ncu_one_launch.py 16384
    ncu --cache-control all --clock-control none -k 'regex:mla_kernel|least' --section WarpStateStats \\
        python3 scripts/ncu_one_launch.py 1 --op split_qkv_rmsnorm_rope_mla

``split_qkv_rmsnorm_rope`` (the default): each geometry of ``BENCH_GEOMETRIES``.
``split_qkv_rmsnorm_rope_mla``: each row of the MLA benchmark (``catalog.MLA_GEOMETRIES``), its two
launches as the benchmark's ``ours`` (the prologue with the bf16 combined cache write, then the q
side), then ``bench_mla_cuda_peer.py``'s least-work kernel (one position, its cos/sin row, stored):
the floor the launches are held against at one call a graph.

Each geometry runs twice (the first launch compiles); profile the second with ``--launch-skip``
or take every other kernel. Nothing is timed here: the profiler does that.
"""

import argparse
import sys

import torch

from vllm_ascend_ext.bench.cases import make_inputs, make_mla_case, mla_launches
from vllm_ascend_ext.bench.catalog import MLA_GEOMETRIES
from vllm_ascend_ext import ops
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope
from vllm_ascend_ext.ops.models import BENCH_GEOMETRIES, mla_model, model

OPS = ("split_qkv_rmsnorm_rope", "split_qkv_rmsnorm_rope_mla")


def launch_mla(tokens: int, device: torch.device) -> None:
    """The MLA benchmark's rows: our launches (``cases.mla_launches``: V2-Lite's is one), then the
    least-work kernel, twice each."""
    from bench_mla_cuda_peer import least_work_launch  # a sibling script: scripts/ is on the path

    least = least_work_launch(device)
    for name, tp in MLA_GEOMETRIES:
        spec = mla_model(name)
        case = make_mla_case(spec, spec.heads_at(tp), tokens, device)
        ours = mla_launches(ops, case)
        for _ in range(2):
            ours()
            least()
        torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tokens", type=int, nargs="?", default=16384)
    parser.add_argument("--op", choices=OPS, default=OPS[0])
    args = parser.parse_args()
    if args.tokens < 1 or not torch.cuda.is_available():
        print("ncu_one_launch: needs a CUDA GPU and a positive token count", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    if args.op == "split_qkv_rmsnorm_rope_mla":
        launch_mla(args.tokens, device)
        return 0
    for name, tp in BENCH_GEOMETRIES:
        inputs = make_inputs(model(name).shard(tp), args.tokens, device)
        for _ in range(2):
            split_qkv_rmsnorm_rope(**inputs)
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
