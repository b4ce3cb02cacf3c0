#!/usr/bin/env python3
"""Multi-rank benchmark of ``split_qkv_tp_rmsnorm_rope`` (issue 12): one spawned process per rank.

Each rank (NCCL with one GPU per rank on CUDA; gloo and the Triton interpreter on CPU, a smoke run)
checks, then times, at each token count: ``ours_tp`` (the fused op, all-reduce on the group),
``unfused_tp`` (vLLM's PyTorch path: split, local mean of squares, all-reduce of the [T, 2] fp32
tensor, norm, RoPE) and ``copy+allreduce`` (a copy of the op's bytes plus a bare all-reduce of
[T, 2] fp32). On CUDA each call is captured in a CUDA graph with its collective (eager calls timed
with events if the capture fails: the table says so). Every rank prints its rows; rank 0 prints
the table and issue 12's bar lines and writes ``bench_split_qkv_tp_rmsnorm_rope.{txt,csv,json}``
under ``--out``. The library is :func:`vllm_ascend_ext.bench.tp.run_tp_ranks`.

    python3 scripts/bench_split_qkv_tp_rmsnorm_rope.py --ranks 2 --out results/bench-tp
    python3 scripts/bench_split_qkv_tp_rmsnorm_rope.py --backend cpu --ranks 2 --tokens 1,5 --geometry 4/2/16/8

Exit status 1 when a check of ``ours_tp`` against the float64 reference fails.
"""

import argparse
import sys
from pathlib import Path


def _geometry(text: str):
    from vllm_ascend_ext.ops.models import AttentionGeometry

    try:
        hq, hkv, d, r = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--geometry takes Hq/Hkv/D/R of the full layer, got {text!r}") from None
    return AttentionGeometry(hq, hkv, d, r, qk_norm_across_heads=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="processes = TP size (default 2)")
    parser.add_argument("--backend", choices=("cuda", "cpu"), help="default cuda when a GPU is visible")
    parser.add_argument("--tokens", help="token counts, comma-separated (default 1,8,64,256,1024,4096,16384 "
                                         "on CUDA, 1,5 on CPU)")
    parser.add_argument("--providers", help="comma-separated subset of ours_tp,unfused_tp,copy+allreduce")
    parser.add_argument("--model", default=None, help="a row of ops/models.py (default MiniMax-M2), sharded")
    parser.add_argument("--geometry", type=_geometry, help="a full layer Hq/Hkv/D/R instead of --model")
    parser.add_argument("--reps", type=int, help="CPU: calls per timing (default 3)")
    parser.add_argument("--out", type=Path, help="folder of the txt/csv/json (rank 0 writes them)")
    args = parser.parse_args(argv)

    from vllm_ascend_ext.bench.catalog import TP_MODEL
    from vllm_ascend_ext.bench.harness import check_rows
    from vllm_ascend_ext.bench.tp import run_tp_ranks
    from vllm_ascend_ext.ops.models import model

    try:
        tokens = tuple(int(t) for t in args.tokens.split(",")) if args.tokens else None
    except ValueError:
        parser.error(f"--tokens takes comma-separated ints, got {args.tokens!r}")
    providers = tuple(p.strip() for p in args.providers.split(",")) if args.providers else None
    if args.geometry is not None:
        geometries = (("custom", args.geometry),)
    else:
        name = args.model or TP_MODEL
        geometries = ((name, model(name)),)
    result = run_tp_ranks(args.ranks, args.backend, tokens, providers, geometries, args.out, args.reps)
    return 1 if check_rows(result["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
