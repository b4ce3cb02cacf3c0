"""The profiled workload: one provider of the benchmark, run a fixed number of times.

``python -m vllm_ascend_ext.cli.workload --provider ours --model Qwen3-8B --tokens 4096`` builds
the benchmark's inputs for one geometry (:func:`vllm_ascend_ext.bench.cases.make_inputs`, the
generator of ``ops.reference``), warms the
provider up (compilation, autotuning, caches), synchronises, runs it ``--iterations`` times and
synchronises again. It is what ``scripts/profile_msprof.sh`` runs under msprof and what
``profile`` runs under torch.profiler on CUDA.

With ``--out DIR`` it writes ``DIR/workload.json`` (provider, model, tp, tokens, dtypes,
iterations, device): ``report`` reads it to name the run's kernels by provider, to count
prologues, and to know the geometry the fused kernel's bytes come from. The folder is created
and checked before the workload runs. Bad input, a ``--backend`` whose device is absent, or a
malformed environment variable is one line on stderr and exit status 2.
"""

from __future__ import annotations

import json
import sys

from ..devices import DEVICE_NAMES, ensure_interpreter
from ..ops.settings import SettingError
from .common import CliError, CliParser, check_settings, output_dir, usable_device
from .geometry import resolve_model, shard_checked

__all__ = ["main", "make_call", "sidecar", "synchronize"]

PROVIDERS = ("eager", "compile", "ours")
DTYPE = "bf16"  # what vllm_ascend_ext.bench.cases.make_inputs builds by default
CACHE_DTYPE = "fp32"


def synchronize(device) -> None:
    """Wait for the device's queued work (no-op on CPU)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":  # pragma: no cover - needs an NPU
        torch.npu.synchronize(device)


def make_call(provider: str, model: str, tp: int, tokens: int, device):
    """A zero-argument callable running ``provider`` once on fresh benchmark inputs.

    Raises
    ------
    CliError
        On an unknown provider, model, a TP size that does not shard the model, or a geometry
        the op refuses.
    """
    import torch

    from ..bench.cases import make_inputs
    from ..bench.prologue import unfused_prologue

    if provider not in PROVIDERS:
        raise CliError(f"--provider must be one of {', '.join(PROVIDERS)}, got {provider!r}")
    geometry, _ = shard_checked(resolve_model(model), tp)
    inputs = make_inputs(geometry, tokens, device)
    if provider == "ours":
        from ..ops import split_qkv_rmsnorm_rope as fn
    elif provider == "compile":
        fn = torch.compile(unfused_prologue, dynamic=False)
    else:
        fn = unfused_prologue
    return lambda: fn(**inputs)


def sidecar(provider: str, model: str, tp: int, tokens: int, iterations: int, device_name: str) -> dict:
    """What ``report`` needs to know about a profiled run (written as ``workload.json``).

    ``iterations`` counts the provider's calls inside the profiled region: a kernel launched
    fewer times than that belongs to the set-up (input creation), not to the prologue.
    """
    return {"provider": provider, "model": model, "tp": tp, "tokens": tokens, "dtype": DTYPE,
            "cache_dtype": CACHE_DTYPE, "iterations": iterations, "device": device_name}


def device_name(device) -> str:
    """A human name of ``device`` (the GPU's or NPU's product name when there is one)."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "npu":  # pragma: no cover - needs an NPU
        return torch.npu.get_device_name(device)
    return "cpu"


def main(argv: list[str] | None = None) -> int:
    """Run the workload; exit status 0, or 2 with one line on bad input."""
    parser = CliParser(prog="python -m vllm_ascend_ext.cli.workload",
                       description="Run one benchmark provider a fixed number of times (for profilers).")
    parser.add_argument("--provider", choices=PROVIDERS, default="ours")
    parser.add_argument("--model", default="Qwen3-8B", help="preset or config.json (default Qwen3-8B)")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--backend", choices=DEVICE_NAMES, help="default: detected")
    parser.add_argument("--out", help="write workload.json here")
    args = parser.parse_args(argv)
    try:
        for name in ("tp", "tokens", "iterations"):
            if getattr(args, name) < 1:
                raise CliError(f"--{name} must be a positive integer, got {getattr(args, name)}")
        if args.warmup < 0:
            raise CliError(f"--warmup must be non-negative, got {args.warmup}")
        backend = usable_device(args.backend)
        ensure_interpreter(backend)
        check_settings()
        out = output_dir(args.out, "--out") if args.out else None
        import torch

        device = torch.device(backend.torch_device)
        call = make_call(args.provider, args.model, args.tp, args.tokens, device)
        for _ in range(args.warmup):
            call()
        synchronize(device)
        for _ in range(args.iterations):
            call()
        synchronize(device)
        if out is not None:
            # msprof sees the whole process: the warm-up calls are profiled prologues too.
            meta = sidecar(args.provider, args.model, args.tp, args.tokens, args.warmup + args.iterations,
                           device_name(device))
            (out / "workload.json").write_text(json.dumps(meta, indent=1) + "\n")
    except CliError as exc:
        sys.stderr.write(f"{parser.prog}: error: {exc}\n")
        return exc.code
    except SettingError as exc:
        sys.stderr.write(f"{parser.prog}: error: {str(exc).splitlines()[0]}\n")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
