"""Which device the op would run on in this process: an NPU, a CUDA GPU, or the CPU through Triton's
interpreter (:func:`detect_device`).

The command line's ``--backend`` names one of :data:`DEVICE_NAMES`; ``doctor``, ``bench``, ``profile``
and the profiled workload decide the device here, the same way. Nothing here imports ``torch_npu``,
vLLM or Triton at import time; :func:`detect_device` imports ``torch`` (and ``torch_npu`` only when it
is installed) when it is called.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from .ops import settings

__all__ = [
    "DEVICE_NAMES",
    "TORCH_DEVICES",
    "Device",
    "detect_device",
    "ensure_interpreter",
    "unavailable_reason",
]

#: The devices, by the name ``--backend`` takes.
DEVICE_NAMES = ("npu", "cuda", "cpu")
#: The torch device string the op uses on each.
TORCH_DEVICES = {"npu": "npu:0", "cuda": "cuda:0", "cpu": "cpu"}


@dataclass(frozen=True)
class Device:
    """Where the op would run here, and why.

    Attributes
    ----------
    name : str
        ``"npu"``, ``"cuda"`` or ``"cpu"`` (the Triton interpreter).
    reason : str
        One sentence saying why this device was chosen over the others.
    torch_device : str
        The torch device string the op would use (``"npu:0"``, ``"cuda:0"``, ``"cpu"``).
    forced : bool
        Named by the caller rather than found: the device may not exist here
        (:func:`unavailable_reason` says whether it does).
    """

    name: str
    reason: str
    torch_device: str
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
    """Why device ``name`` cannot run the op in this process, or ``None`` when it can.

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
        If ``name`` is not one of :data:`DEVICE_NAMES`.
    """
    if name not in DEVICE_NAMES:
        raise ValueError(f"name must be one of {', '.join(DEVICE_NAMES)}, got {name!r}")
    if name == "cpu":
        return None
    ok, why = _npu_available() if name == "npu" else _cuda_available()
    return None if ok else why


def detect_device(forced: str | None = None) -> Device:
    """The device the op would run on in this process.

    Order: an NPU (``torch_npu`` installed, importable, at least one device), else a CUDA GPU,
    else the CPU through the Triton interpreter.

    Parameters
    ----------
    forced : str or None
        ``"npu"``, ``"cuda"`` or ``"cpu"`` to skip the probe; the reason then says so. The
        device is not looked for: ask :func:`unavailable_reason`.

    Returns
    -------
    Device

    Raises
    ------
    ValueError
        If ``forced`` is not one of :data:`DEVICE_NAMES`.
    """
    if forced is not None:
        if forced not in DEVICE_NAMES:
            raise ValueError(f"forced must be one of {', '.join(DEVICE_NAMES)}, got {forced!r}")
        return Device(forced, "chosen with --backend", TORCH_DEVICES[forced], forced=True)
    npu_ok, npu_why = _npu_available()
    if npu_ok:
        return Device("npu", npu_why, TORCH_DEVICES["npu"])
    cuda_ok, cuda_why = _cuda_available()
    if cuda_ok:
        return Device("cuda", f"no NPU ({npu_why}); {cuda_why}", TORCH_DEVICES["cuda"])
    return Device("cpu", f"no NPU ({npu_why}) and no CUDA GPU ({cuda_why}): "
                         "the op runs through the Triton interpreter on CPU tensors", TORCH_DEVICES["cpu"])


def ensure_interpreter(device: Device) -> None:
    """Turn on Triton's interpreter for the CPU, before the op module is imported.

    Triton reads ``TRITON_INTERPRET`` when a kernel is decorated, so this must run before
    ``vllm_ascend_ext.ops.split_qkv_rmsnorm_rope`` is first imported. Other devices are left
    as they are.

    Parameters
    ----------
    device : Device
        The device the op will run on.
    """
    if device.name == "cpu":
        os.environ[settings.TRITON_INTERPRET] = "1"
