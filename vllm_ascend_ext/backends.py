"""Where the op runs in this process: an NPU, a CUDA GPU, or the CPU through Triton's interpreter.

Shared by the benchmark library (:mod:`vllm_ascend_ext.bench`) and the command line
(:mod:`vllm_ascend_ext.cli`): the library never imports the command line, and both decide the
device the same way. Nothing here imports ``torch_npu``, vLLM or Triton at import time;
:func:`detect_backend` imports ``torch`` (and ``torch_npu`` only when it is installed) when it
is called.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from .ops import settings

__all__ = [
    "BACKENDS",
    "DEVICES",
    "Backend",
    "detect_backend",
    "ensure_interpreter",
    "unavailable_reason",
]

#: The backends, by the name ``--backend`` takes.
BACKENDS = ("npu", "cuda", "cpu")
#: The torch device string the op uses on each backend.
DEVICES = {"npu": "npu:0", "cuda": "cuda:0", "cpu": "cpu"}


@dataclass(frozen=True)
class Backend:
    """Where the op would run here, and why.

    Attributes
    ----------
    name : str
        ``"npu"``, ``"cuda"`` or ``"cpu"`` (the Triton interpreter).
    reason : str
        One sentence saying why this backend was chosen over the others.
    device : str
        The torch device string the op would use (``"npu:0"``, ``"cuda:0"``, ``"cpu"``).
    forced : bool
        Named by the caller rather than found: the device may not exist here
        (:func:`unavailable_reason` says whether it does).
    """

    name: str
    reason: str
    device: str
    forced: bool = False


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _npu_available() -> tuple[bool, str]:
    """Whether an NPU is usable, importing ``torch_npu`` only when it is installed."""
    if importlib.util.find_spec("torch_npu") is None:
        return False, "torch_npu is not installed"
    try:
        import torch
        import torch_npu  # noqa: F401  (registers torch.npu)
    except Exception as exc:  # noqa: BLE001 - torch_npu raises many kinds when CANN is missing or mismatched
        return False, f"torch_npu does not import ({_first_line(exc)})"
    try:
        count = torch.npu.device_count()
    except Exception as exc:  # noqa: BLE001 - a driver error of any kind means no usable NPU
        return False, f"torch.npu.device_count() failed ({_first_line(exc)})"
    if count < 1:
        return False, "torch_npu imports but sees no NPU"
    return True, f"torch_npu sees {count} NPU(s)"


def _cuda_available() -> tuple[bool, str]:
    """Whether torch sees a CUDA GPU, and its name or why not."""
    import torch

    if torch.cuda.is_available():
        return True, f"CUDA GPU found: {torch.cuda.get_device_name(0)}"
    return False, "torch has no CUDA build" if torch.version.cuda is None else "torch sees no CUDA GPU"


def unavailable_reason(name: str) -> str | None:
    """Why backend ``name`` cannot run in this process, or ``None`` when it can.

    Parameters
    ----------
    name : str
        ``"npu"``, ``"cuda"`` or ``"cpu"`` (always available).

    Returns
    -------
    str or None
        One phrase such as ``"torch_npu is not installed"``.

    Raises
    ------
    ValueError
        If ``name`` is not one of :data:`BACKENDS`.
    """
    if name not in BACKENDS:
        raise ValueError(f"name must be one of {', '.join(BACKENDS)}, got {name!r}")
    if name == "cpu":
        return None
    ok, why = _npu_available() if name == "npu" else _cuda_available()
    return None if ok else why


def detect_backend(forced: str | None = None) -> Backend:
    """The backend the op would run on in this process.

    Order: an NPU (``torch_npu`` installed, importable, at least one device), else a CUDA GPU,
    else the CPU through the Triton interpreter.

    Parameters
    ----------
    forced : str or None
        ``"npu"``, ``"cuda"`` or ``"cpu"`` to skip the probe; the reason then says so. The
        device is not looked for: ask :func:`unavailable_reason`.

    Returns
    -------
    Backend

    Raises
    ------
    ValueError
        If ``forced`` is not one of :data:`BACKENDS`.
    """
    if forced is not None:
        if forced not in BACKENDS:
            raise ValueError(f"forced must be one of {', '.join(BACKENDS)}, got {forced!r}")
        return Backend(forced, "chosen with --backend", DEVICES[forced], forced=True)
    npu_ok, npu_why = _npu_available()
    if npu_ok:
        return Backend("npu", npu_why, DEVICES["npu"])
    cuda_ok, cuda_why = _cuda_available()
    if cuda_ok:
        return Backend("cuda", f"no NPU ({npu_why}); {cuda_why}", DEVICES["cuda"])
    return Backend("cpu", f"no NPU ({npu_why}) and no CUDA GPU ({cuda_why}): "
                          "the op runs through the Triton interpreter on CPU tensors", DEVICES["cpu"])


def ensure_interpreter(backend: Backend) -> None:
    """Turn on Triton's interpreter for the CPU backend, before the op module is imported.

    Triton reads ``TRITON_INTERPRET`` when a kernel is decorated, so this must run before
    ``vllm_ascend_ext.ops.split_qkv_rmsnorm_rope`` is first imported. Other backends are left
    as they are.

    Parameters
    ----------
    backend : Backend
        The backend the op will run on.
    """
    if backend.name == "cpu":
        os.environ[settings.TRITON_INTERPRET] = "1"
