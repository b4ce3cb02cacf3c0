"""``vllm-ascend-ext profile``: the benchmark workload under a profiler, then ``report``.

* NPU: ``scripts/profile_msprof.sh`` runs the workload (:mod:`vllm_ascend_ext.cli.workload`)
  under msprof in both forms: the application form once per provider (``op_summary_*.csv``
  per run) and ``msprof op`` on the fused kernel (``OPPROF_*``). The script holds the exact
  command lines and the CANN pages they follow.
* CUDA: each provider runs in this process under ``torch.profiler`` (CPU + CUDA activities);
  per provider a Chrome trace (``trace.json``, for chrome://tracing or Perfetto), the
  profiler's kernel table (``kernels.txt``) and ``workload.json``.
* CPU: profiling needs an NPU or a GPU; the command says so in one line and exits 1.

Everything goes under ``--out`` (default ``results/profile-<time>/``; ``results/`` is
git-ignored), and the run ends with ``report`` on it (``report.png`` beside).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ..devices import DEVICE_NAMES, detect_device, ensure_interpreter
from ..ops import settings
from . import report
from .common import CliError, check_settings, output_dir, results_dir, usable_device
from .geometry import parse_int_list, resolve_model, shard_checked

__all__ = ["add_parser", "msprof_script", "run"]

PROVIDERS = ("eager", "compile", "ours")


def msprof_script() -> Path:
    """``scripts/profile_msprof.sh`` of the source checkout, or ``VLLM_ASCEND_EXT_MSPROF_SCRIPT``.

    Returns
    -------
    Path
        The script (read through :func:`vllm_ascend_ext.ops.settings.msprof_script`).

    Raises
    ------
    CliError
        Exit status 1 when it does not exist (an install without the source tree).
    """
    override = settings.msprof_script()
    path = override or Path(__file__).resolve().parents[2] / "scripts" / "profile_msprof.sh"
    if not path.is_file():
        raise CliError(f"{path} not found: run from a source checkout of vllm-ascend-ext or set "
                       f"{settings.MSPROF_SCRIPT}", code=1)
    return path


def _workload_args(args) -> list[str]:
    return ["--model", args.model, "--tp", str(args.tp), "--tokens", str(args.tokens),
            "--iterations", str(args.iterations), "--warmup", str(args.warmup)]


def _profile_npu(args, providers, out: Path | None, script: Path) -> Path | None:
    env = dict(os.environ, PYTHON=sys.executable, PROVIDERS=" ".join(providers))
    target = str(out) if out is not None else "<out>"
    command = ["bash", str(script), target, *_workload_args(args)]
    if args.dry_run:
        env["DRY_RUN"] = "1"
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        sys.stdout.write(done.stdout)
        if done.returncode:
            raise CliError(f"{script.name} failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}",
                           code=1)
        return None
    done = subprocess.run(command, env=env)
    if done.returncode:
        raise CliError(f"{script.name} exited with status {done.returncode}; its output is above", code=1)
    return out / "msprof"


def _profile_cuda(args, providers, out: Path | None, device) -> Path | None:
    if args.dry_run:
        for provider in providers:
            print(f"torch.profiler (CPU + CUDA) around {args.iterations} calls of {provider} after "
                  f"{args.warmup} warm-up calls -> <out>/torch/{provider}/trace.json, kernels.txt, workload.json")
        return None
    import torch
    from torch.profiler import ProfilerActivity, profile

    from .workload import device_name, make_call, sidecar, synchronize

    for provider in providers:
        folder = out / "torch" / provider
        folder.mkdir(parents=True, exist_ok=True)
        call = make_call(provider, args.model, args.tp, args.tokens, device)
        for _ in range(args.warmup):
            call()
        synchronize(device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.iterations):
                call()
            synchronize(device)
        prof.export_chrome_trace(str(folder / "trace.json"))
        averages = prof.key_averages()
        try:
            table = averages.table(sort_by="device_time_total", row_limit=25)
        except (AttributeError, KeyError, ValueError):
            table = averages.table(sort_by="cuda_time_total", row_limit=25)
        (folder / "kernels.txt").write_text(table + "\n")
        meta = sidecar(provider, args.model, args.tp, args.tokens, args.iterations, device_name(device))
        (folder / "workload.json").write_text(json.dumps(meta, indent=1) + "\n")
        del call
        torch.cuda.empty_cache()
    return out / "torch"


def add_parser(subparsers) -> None:
    """Declare ``profile`` and its options."""
    parser = subparsers.add_parser(
        "profile", help="run the benchmark workload under msprof (NPU) or torch.profiler (CUDA)",
        description="Profile the benchmark workload: on an NPU under msprof, in its application "
                    "and `msprof op` forms (scripts/profile_msprof.sh); on CUDA under torch.profiler "
                    "(Chrome trace and kernel table). Output under results/; then `report` on it. "
                    "Profiling needs an NPU or a GPU.")
    parser.add_argument("--model", default="Qwen3-8B", help="preset or config.json (default Qwen3-8B)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per call (default 4096)")
    parser.add_argument("--iterations", type=int, default=20, help="profiled calls per provider (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="unprofiled calls first (default 3)")
    parser.add_argument("--providers", default=",".join(PROVIDERS),
                        help="comma-separated subset of eager,compile,ours (default all)")
    parser.add_argument("--out", help="output folder (default results/profile-<time>)")
    parser.add_argument("--backend", choices=DEVICE_NAMES, metavar="BACKEND",
                        help="profile as on npu or cuda instead of the detected backend")
    parser.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    parser.add_argument("--no-report", action="store_true", help="do not run `report` at the end")
    parser.set_defaults(run=run)


def run(args) -> int:
    """Profile on the NPU or GPU; refuse on the CPU.

    The options, the model, the device, the environment and the output folder are checked
    before anything runs.
    """
    for name in ("tp", "tokens", "iterations"):
        parse_int_list(str(getattr(args, name)), f"--{name}")
    if args.warmup < 0:
        raise CliError(f"--warmup must be non-negative, got {args.warmup}")
    providers = tuple(p.strip() for p in args.providers.split(",") if p.strip())
    if not providers or any(p not in PROVIDERS for p in providers):
        raise CliError(f"--providers takes a comma-separated subset of {', '.join(PROVIDERS)}, got {args.providers!r}")
    shard_checked(resolve_model(args.model), args.tp)
    backend = detect_device(args.backend) if args.dry_run else usable_device(args.backend)
    if backend.name == "cpu":
        raise CliError("profiling needs an NPU (msprof) or a CUDA GPU (torch.profiler); "
                       f"this machine has neither ({backend.reason.split(':')[0]})", code=1)
    if args.dry_run:
        if backend.name == "npu":
            _profile_npu(args, providers, None, msprof_script())
        else:
            _profile_cuda(args, providers, None, None)
        return 0
    script = msprof_script() if backend.name == "npu" else None
    if backend.name == "npu" and shutil.which("msprof") is None:
        raise CliError("msprof is not on PATH: install CANN and `source <install dir>/ascend-toolkit/set_env.sh`",
                       code=1)
    ensure_interpreter(backend)
    check_settings()
    out = output_dir(args.out, "--out") if args.out else results_dir(None, "profile")
    if backend.name == "npu":
        report_root = _profile_npu(args, providers, out, script)
    else:
        import torch

        report_root = _profile_cuda(args, providers, out, torch.device(backend.torch_device))
    print(f"profile: {out}")
    if args.no_report:
        return 0
    return report.run(report.arguments(report_root, png=out / "report.png"))
