"""``vllm-ascend-ext bench``: check and time the fused op on the detected device.

The work is :mod:`vllm_ascend_ext.bench` (the benchmark library: providers ``eager`` /
``compile`` / ``ours``, the float64 check, the table, CSV/JSON/text, the PNG, CUDA-graph timing
on CUDA, small interpreter sizes on CPU; with ``--op split_qkv_rmsnorm_rope_kv_cache`` the
KV-cache run, providers ``ours_kv`` / ``ours+scatter`` / ``ours`` / ``copy_kv``, timed one call a
graph and amortised). This module picks the device the way ``doctor`` does,
checks the options, the environment and the output folder before anything is measured, calls
:func:`vllm_ascend_ext.bench.run` with a progress bar as its ``progress`` callback, finishes the
bar when the run returns, then prints the table and writes the files.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .common import BACKENDS, CliError, Progress, check_settings, output_dir, usable_backend
from .geometry import parse_int_list

__all__ = ["DEFAULT_OUT", "OP_NAMES", "add_parser", "resolve", "run"]

#: ``--op``'s choices (the benchmark library's ``OPS``, spelled here so ``--help`` imports no torch).
OP_NAMES = ("split_qkv_rmsnorm_rope", "split_qkv_rmsnorm_rope_kv_cache")

#: Where the files go without ``--out`` (``results/`` is git-ignored).
DEFAULT_OUT = Path("results") / "bench"


def resolve(backend: str, tokens: str | None, providers: str | None,
            op: str | None = None) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Token counts and providers of the run: the ones given, else the library's defaults.

    Parameters
    ----------
    backend : str
        ``"npu"``, ``"cuda"`` or ``"cpu"``: picks the defaults.
    tokens, providers : str or None
        ``--tokens`` and ``--providers`` as typed (comma-separated).
    op : str, optional
        ``--op`` (default the prologue op): whose providers.

    Returns
    -------
    tokens : tuple of int
    providers : tuple of str

    Raises
    ------
    CliError
        On a token count that is not a positive integer or an unknown provider.
    """
    from .. import bench as core

    op = op or core.OP
    known = core.OPS[op]
    counts = parse_int_list(tokens, "--tokens") if tokens is not None else (
        core.CPU_TOKENS if backend == "cpu" else core.GPU_TOKENS)
    if providers is not None:
        names = tuple(p.strip() for p in providers.split(",") if p.strip())
        unknown = [p for p in names if p not in known]
        if unknown or not names:
            raise CliError(f"--providers takes a comma-separated subset of {', '.join(known)}"
                           f"{'' if op == core.OP else ' with --op ' + op}, got {providers!r}")
    else:
        names = core.default_providers(backend, op)
    return tuple(counts), names


def add_parser(subparsers) -> None:
    """Declare ``bench`` and its options."""
    parser = subparsers.add_parser(
        "bench", help="check the op against a float64 reference and time it vs eager and torch.compile",
        description="The main job: on the detected device (NPU, CUDA, or the CPU through the Triton "
                    "interpreter), check the fused op against a float64 reference and time it against "
                    "the unfused eager and torch.compile paths for the benchmark geometries; print a "
                    "table and write CSV, JSON and a PNG (bandwidth vs tokens per provider, with the "
                    "floor). On CPU the sizes are small and the timings mean nothing for NPU or GPU speed.")
    parser.add_argument("--tokens", help="token counts, comma-separated (default: 1,8,64 on CPU; "
                                         "1 to 16384 on an accelerator)")
    parser.add_argument("--providers", help="comma-separated subset of eager,compile,ours "
                                            "(default: all on an accelerator, eager,ours on CPU); with "
                                            "--op split_qkv_rmsnorm_rope_kv_cache of ours_kv,ours+scatter,ours,"
                                            "copy_kv (default all)")
    parser.add_argument("--op", choices=OP_NAMES, default=OP_NAMES[0], metavar="OP",
                        help="the op to benchmark: split_qkv_rmsnorm_rope (default) or "
                             "split_qkv_rmsnorm_rope_kv_cache (the prologue writing k and v into a bf16 paged "
                             "cache; timed one call per captured graph and amortised over 20 in one graph)")
    parser.add_argument("--out", help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--backend", choices=BACKENDS, metavar="BACKEND",
                        help="run on npu, cuda or cpu instead of the detected backend (its device must be here)")
    parser.add_argument("--host", action="store_true",
                        help="host mode: host microseconds per call at T = 1 (eager loop, best of 3) of each op "
                             "directly, through torch.ops and (CUDA) inside a torch.compile'd function, beside "
                             "torch.Tensor.add_ and the unfused eager path; writes bench_host.*")
    parser.add_argument("--no-progress", action="store_true", help="draw no progress bar")
    parser.set_defaults(run=run)


def run(args) -> int:
    """Check, then measure, then print and write; exit status 1 when a check against the reference fails."""
    backend = usable_backend(args.backend)
    tokens, providers = resolve(backend.name, args.tokens, args.providers, args.op)
    from ..backends import ensure_interpreter

    ensure_interpreter(backend)
    check_settings()
    out = output_dir(args.out if args.out is not None else DEFAULT_OUT, "--out")

    import torch

    from .. import bench as core
    from ..ops.models import BENCH_GEOMETRIES

    device = torch.device(backend.device)
    if args.host:
        from ..bench_host import format_host_table, run_host, write_host_outputs

        result = run_host(device)
        text = format_host_table(result)
        print(text)
        print("wrote " + ", ".join(str(p) for p in write_host_outputs(result, out, text=text)))
        return 0
    if backend.name == "cpu":
        sys.stderr.write("bench: CPU through the Triton interpreter (small sizes): CPU timings through "
                         "the Triton interpreter mean nothing for NPU or GPU speed\n")
    bar = Progress(len(BENCH_GEOMETRIES) * len(tokens) * len(providers), label="bench",
                   enabled=not args.no_progress)
    try:
        result = core.run(device, tokens, providers, progress=bar.begin, op=args.op)
        bar.finish()
    finally:
        bar.close()
    lines = [core.format_table(result)]
    lines += ["bar: " + line for line in (core.bar_verdict(result) if device.type == "cuda" else [])]
    if device.type == "cpu":
        lines.append(core.CPU_DISCLAIMER)
    failures = core.check_rows(result["rows"])
    lines += ["CHECK FAILED: " + line for line in failures]
    text = "\n".join(lines)
    print(text)
    paths = core.write_outputs(result, out, text=text)  # the text file holds what was printed above
    print("wrote " + ", ".join(str(p) for p in paths))
    return 1 if failures else 0
