"""``vllm-ascend-ext bench``: check and time the fused op on the detected device.

The work is :mod:`vllm_ascend_ext.bench` (the benchmark core: providers ``eager`` /
``compile`` / ``ours``, the float64 check, the table, CSV/JSON, the PNG, CUDA-graph timing on
CUDA, small interpreter sizes on CPU). This module picks the device the way ``doctor`` does,
resolves the token counts and providers so the progress bar knows its length, draws the bar
through the core's ``progress`` callback, and hands the rest to ``vllm_ascend_ext.bench.main``.
"""

from __future__ import annotations

import contextlib
import sys

from .common import BACKENDS, CliError, Progress, detect_backend, ensure_interpreter
from .geometry import parse_int_list

__all__ = ["add_parser", "resolve", "run"]

#: torch device names the core's ``--device`` takes, by backend.
DEVICE_OF = {"npu": "npu", "cuda": "cuda", "cpu": "cpu"}


def resolve(backend: str, tokens: str | None, providers: str | None) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Token counts and providers of the run: the ones given, else the core's defaults.

    Raises
    ------
    CliError
        On a token count that is not a positive integer or an unknown provider.
    """
    from .. import bench as core

    counts = parse_int_list(tokens, "--tokens") if tokens else (
        core.CPU_TOKENS if backend == "cpu" else core.GPU_TOKENS)
    if providers:
        names = tuple(p.strip() for p in providers.split(",") if p.strip())
        unknown = [p for p in names if p not in core.PROVIDERS]
        if unknown or not names:
            raise CliError(f"--providers takes a comma-separated subset of {', '.join(core.PROVIDERS)}, "
                           f"got {providers!r}")
    else:
        names = core.default_providers(DEVICE_OF[backend])
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
                                            "(default: all on an accelerator, eager,ours on CPU)")
    parser.add_argument("--out", help="output folder (default results/bench)")
    parser.add_argument("--backend", choices=BACKENDS, metavar="BACKEND",
                        help="run on npu, cuda or cpu instead of the detected backend")
    parser.add_argument("--no-progress", action="store_true", help="draw no progress bar")
    parser.set_defaults(run=run)


def run(args) -> int:
    """Run the benchmark core with a progress bar; its exit status is ours."""
    backend = detect_backend(args.backend)
    ensure_interpreter(backend)
    from .. import bench as core
    from ..ops.models import BENCH_GEOMETRIES

    tokens, providers = resolve(backend.name, args.tokens, args.providers)
    if backend.name == "cpu":
        sys.stderr.write("bench: CPU through the Triton interpreter (small sizes): CPU timings through "
                         "the Triton interpreter mean nothing for NPU or GPU speed\n")
    argv = ["--device", DEVICE_OF[backend.name], "--tokens", *map(str, tokens), "--providers", *providers]
    if args.out:
        argv += ["--out", args.out]
    bar = Progress(len(BENCH_GEOMETRIES) * len(tokens) * len(providers), label="bench",
                   enabled=not args.no_progress)
    try:
        with contextlib.redirect_stdout(_EndBarOnOutput(sys.stdout, bar)):
            status = core.main(argv, progress=bar.begin)
    except SystemExit as exc:  # the core's own argument errors
        raise CliError(f"the benchmark core rejected {' '.join(argv)}", code=int(exc.code or 2)) from None
    finally:
        bar.close()
    return status


class _EndBarOnOutput:
    """stdout that completes the progress bar before the first thing the core prints.

    The core calls ``progress`` before each measurement and prints its table after the last;
    the first write to stdout therefore means every measurement is done.
    """

    def __init__(self, stream, bar: Progress):
        self._stream, self._bar = stream, bar

    def write(self, text: str) -> int:
        if self._bar.active:
            self._bar.finish()
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)
