"""``vllm-ascend-ext bench``: check and time the fused op on the detected device.

The work is :mod:`vllm_ascend_ext.bench` (the benchmark library): :mod:`~vllm_ascend_ext.bench.prologue`
(providers ``eager`` / ``compile`` / ``ours``, the float64 check, the table, CSV/JSON/text, the PNG,
CUDA-graph timing on CUDA, small interpreter sizes on CPU); with ``--op split_qkv_rmsnorm_rope_kv_cache``
:mod:`~vllm_ascend_ext.bench.kv_cache`, providers ``ours_kv`` / ``ours+scatter`` / ``ours`` / ``copy_kv``,
timed one call a graph and amortised; with ``--op split_qkv_rmsnorm_rope_mla``
:mod:`~vllm_ascend_ext.bench.mla`, providers ``ours`` / ``vllm`` / ``copy``, timed both ways; with
``--host`` :mod:`~vllm_ascend_ext.bench.host`. This module picks the device the way ``doctor`` does,
checks the options, the environment and the output folder before anything is measured, calls the
op's run with a progress bar as its ``progress`` callback, finishes the bar when the run returns,
then prints the table and writes the files (:mod:`~vllm_ascend_ext.bench.report`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..devices import DEVICE_NAMES
from .common import CliError, Progress, check_settings, output_dir, usable_device
from .geometry import parse_int_list

__all__ = ["DEFAULT_OUT", "OP_NAMES", "add_parser", "resolve", "run"]

#: ``--op``'s choices (the benchmark library's ``catalog.OPS``, spelled here so ``--help`` imports nothing).
OP_NAMES = ("split_qkv_rmsnorm_rope", "split_qkv_rmsnorm_rope_kv_cache", "split_qkv_rmsnorm_rope_mla")
MLA_OP = OP_NAMES[2]

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
    from ..bench import catalog

    op = op or catalog.OP
    known = catalog.OPS[op]
    cpu_tokens = catalog.MLA_CPU_TOKENS if op == MLA_OP else catalog.CPU_TOKENS
    counts = parse_int_list(tokens, "--tokens") if tokens is not None else (
        cpu_tokens if backend == "cpu" else catalog.GPU_TOKENS)
    if providers is not None:
        names = tuple(p.strip() for p in providers.split(",") if p.strip())
        unknown = [p for p in names if p not in known]
        if unknown or not names:
            raise CliError(f"--providers takes a comma-separated subset of {', '.join(known)}"
                           f"{'' if op == catalog.OP else ' with --op ' + op}, got {providers!r}")
    else:
        names = catalog.default_providers(backend, op)
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
                                            "copy_kv (default all); with --op split_qkv_rmsnorm_rope_mla of "
                                            "ours,vllm,copy (default all)")
    parser.add_argument("--op", choices=OP_NAMES, default=OP_NAMES[0], metavar="OP",
                        help="the op to benchmark: split_qkv_rmsnorm_rope (default) or "
                             "split_qkv_rmsnorm_rope_kv_cache (the prologue writing k and v into a bf16 paged "
                             "cache; timed one call per captured graph and amortised over 20 in one graph) or "
                             "split_qkv_rmsnorm_rope_mla (the MLA prologue and q-side RoPE of DeepSeek-V3, Kimi-K2 "
                             "and DeepSeek-V2-Lite, writing a bf16 MLA cache, against vLLM's Triton "
                             "fused_q_kv_rmsnorm followed by RoPE and the cache write in PyTorch, and against the "
                             "same-bytes copy; timed both ways)")
    parser.add_argument("--vllm-source", metavar="DIR",
                        help="with --op split_qkv_rmsnorm_rope_mla: where vLLM's "
                             "vllm/models/common/ops/fused_qk_rmsnorm.py is (the file, its folder, a vLLM checkout "
                             "or a site-packages), so that the vllm provider runs vLLM's own kernel on a machine "
                             "without vLLM (only the @triton.jit kernel is loaded from it; nothing of vLLM is "
                             "copied into this project); default: the installed vLLM")
    parser.add_argument("--out", help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--backend", choices=DEVICE_NAMES, metavar="BACKEND",
                        help="run on npu, cuda or cpu instead of the detected backend (its device must be here)")
    parser.add_argument("--host", action="store_true",
                        help="host mode: host microseconds per call at T = 1 (eager loop, best of 3) of each op "
                             "directly, its launches alone, its launch-cache hit alone, through torch.ops and (CUDA) "
                             "inside a torch.compile'd function, beside torch.Tensor.add_ and the unfused eager "
                             "path; writes bench_host.*")
    parser.add_argument("--meta", action="store_true",
                        help="with --host: every tensor on the meta device (validation, launch cache, plan and "
                             "allocation, no launch): the Python per call on this CPU, no accelerator needed")
    parser.add_argument("--no-progress", action="store_true", help="draw no progress bar")
    parser.set_defaults(run=run)


def run(args) -> int:
    """Check, then measure, then print and write; exit status 1 when a check against the reference fails."""
    if args.meta and not args.host:
        raise CliError("--meta is a flag of --host")
    backend = usable_device(args.backend)
    tokens, providers = resolve(backend.name, args.tokens, args.providers, args.op)
    from ..devices import ensure_interpreter

    ensure_interpreter(backend)
    check_settings()
    if args.op == MLA_OP:
        _check_mla(args, providers)
    elif args.vllm_source is not None:
        raise CliError(f"--vllm-source is for the vllm provider of --op {MLA_OP}")
    out = output_dir(args.out if args.out is not None else DEFAULT_OUT, "--out")

    import torch

    from ..bench import kv_cache, prologue, report
    from ..ops.models import BENCH_GEOMETRIES

    device = torch.device(backend.torch_device)
    if args.op == MLA_OP:
        return _run_mla(args, device, backend.name, tokens, providers, out)
    if args.host:
        from ..bench.host import format_host_table, run_host

        result = run_host(torch.device("meta") if args.meta else device)
        text = format_host_table(result)
        print(text)
        print("wrote " + ", ".join(str(p) for p in report.write_host_outputs(result, out, text=text)))
        return 0
    if args.op == OP_NAMES[0]:
        run_op, table, verdict = prologue.run, prologue.format_table, prologue.bar_verdict
    else:
        run_op, table, verdict = kv_cache.run_kv_cache, kv_cache.format_kv_table, kv_cache.kv_bar_verdict
    if backend.name == "cpu":
        sys.stderr.write("bench: CPU through the Triton interpreter (small sizes): CPU timings through "
                         "the Triton interpreter mean nothing for NPU or GPU speed\n")
    bar = Progress(len(BENCH_GEOMETRIES) * len(tokens) * len(providers), label="bench",
                   enabled=not args.no_progress)
    try:
        result = run_op(device, tokens, providers, progress=bar.begin)
        bar.finish()
    finally:
        bar.close()
    text, failures = report.summary(result, table(result), verdict(result) if device.type == "cuda" else [])
    print(text)
    paths = report.write_outputs(result, out, text=text)  # the text file holds what was printed above
    print("wrote " + ", ".join(str(p) for p in paths))
    return 1 if failures else 0


def _check_mla(args, providers) -> None:
    """Refuse what an MLA run cannot do before anything is written: ``--host``, ``--vllm-source``
    without the vllm provider, and a vllm provider whose kernel is not found."""
    if args.host:
        raise CliError(f"--host is not a mode of --op {MLA_OP}")
    if "vllm" not in providers:
        if args.vllm_source is not None:
            raise CliError(f"--vllm-source is for the vllm provider of --op {MLA_OP}")
        return
    from ..bench import mla

    try:
        mla.load_vllm_kernel(args.vllm_source)
    except ValueError as exc:
        raise CliError(f"--vllm-source: {str(exc).removeprefix('vllm_source').lstrip(': ')} (or leave the "
                       f"vllm provider out: --providers ours,copy)") from None


def _run_mla(args, device, backend_name: str, tokens, providers, out: Path) -> int:
    """``--op split_qkv_rmsnorm_rope_mla``: :func:`vllm_ascend_ext.bench.mla.run_mla` behind the bar;
    the vLLM kernel is found (``--vllm-source``, else the installed vLLM) before anything runs."""
    from ..bench import catalog, mla, report

    if backend_name == "cpu":
        sys.stderr.write("bench: CPU through the Triton interpreter (small sizes): CPU timings through "
                         "the Triton interpreter mean nothing for NPU or GPU speed\n")
    bar = Progress(len(catalog.MLA_GEOMETRIES) * len(tokens) * len(providers), label="bench",
                   enabled=not args.no_progress)
    try:
        result = mla.run_mla(device, tokens, providers, progress=bar.begin, vllm_source=args.vllm_source)
        bar.finish()
    finally:
        bar.close()
    text, failures = mla.mla_report(result)
    print(text)
    paths = report.write_outputs(result, out, text=text)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 1 if failures else 0
