"""Device facts, read once per device: the one module that knows how big a core is.

Every launch plan is sized from three numbers: the Ascend vector-core count and Unified
Buffer (UB) bytes, and the CUDA SM count. They are read here and nowhere else.

Ascend facts are resolved in this order (the first that answers wins):

1. the device, when an NPU is present: ``num_vectorcore`` from triton-ascend's driver
   properties and ``UB_SIZE`` from CANN's platform spec;
2. the environment: ``VLLM_ASCEND_EXT_VECTOR_CORES`` and ``VLLM_ASCEND_EXT_UB_BYTES``
   (for planning or lowering for an NPU that is not attached, as CI does);
3. the per-SoC default table below, for the SoC named by ``VLLM_ASCEND_EXT_SOC`` (default
   ``Ascend910B3``, the target the CPU lowering check uses).

The CUDA SM count comes from the device, else ``VLLM_ASCEND_EXT_NUM_SMS``, else the H200's
132 (the GPU this project measures on; used when the CUDA plan is emulated on the CPU). The
variables are read through :mod:`.settings`: a value that does not parse, or is out of range,
raises :class:`~.settings.SettingError` (a ``ValueError``) naming the variable.

Nothing here imports ``torch_npu`` or CANN modules unless an NPU is actually in use.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from . import settings

__all__ = [
    "ASCEND_SOC_DEFAULTS",
    "AscendFacts",
    "CudaFacts",
    "ascend_facts",
    "cuda_facts",
    "device_kind",
]

DEFAULT_SOC = settings.DEFAULT_SOC
#: SMs of the NVIDIA H200 SXM, the lent GPU every CUDA figure in docs/performance.md comes from.
DEFAULT_NUM_SMS = 132

#: Per-SoC defaults: (vector cores, UB bytes per vector core). From CANN's platform
#: description files (``platform_config/<soc>.ini``: ``vector_core_cnt`` and ``ub_size``).
#: Atlas A2 (910B) and A3 (910C, per die) vector cores carry 192 KiB of UB each. The names are
#: :data:`.settings.ASCEND_SOCS` (a test keeps the two the same).
ASCEND_SOC_DEFAULTS: dict[str, tuple[int, int]] = {
    "Ascend910B1": (48, 192 * 1024),
    "Ascend910B2": (48, 192 * 1024),
    "Ascend910B2C": (48, 192 * 1024),
    "Ascend910B3": (40, 192 * 1024),
    "Ascend910B4": (40, 192 * 1024),
    "Ascend910_9391": (48, 192 * 1024),
    "Ascend910_9392": (48, 192 * 1024),
}


@dataclass(frozen=True)
class AscendFacts:
    """What an Ascend launch plan needs to know about one NPU (or the NPU it targets)."""

    soc: str
    num_vector_cores: int
    ub_bytes: int
    source: str  # "device", "env" or "default": where the numbers came from


@dataclass(frozen=True)
class CudaFacts:
    """What a CUDA launch plan needs to know about one GPU. ``dependent_launch``: kernels may be
    launched with programmatic dependent launch (compute capability 9.0 and later, and
    ``VLLM_ASCEND_EXT_CUDA_PDL`` on); never without a GPU, since the interpreter cannot run it."""

    name: str
    num_sms: int
    source: str
    dependent_launch: bool = False


def device_kind(device: torch.device | str) -> str:
    """The kind of device ``device`` is, as the launch plans and the device facts tell them apart:
    ``"ascend"`` (an NPU: torch's ``npu`` or ``privateuseone``), ``"cuda"``, or ``"cpu"`` (anything
    else)."""
    kind = torch.device(device).type
    if kind == "cuda":
        return "cuda"
    if kind in ("npu", "privateuseone"):
        return "ascend"
    return "cpu"


@functools.lru_cache(maxsize=None)
def _npu_facts(index: int) -> AscendFacts:  # pragma: no cover - needs an NPU and CANN
    import torch_npu  # noqa: F401  (registers the npu device)
    import triton.runtime.driver as driver

    props = driver.active.utils.get_device_properties(index)
    cores = int(props["num_vectorcore"])
    soc = torch.npu.get_device_name(index)
    ub = settings.ub_bytes()
    if ub is None:
        try:
            from tbe.common.platform import get_soc_spec

            ub = int(get_soc_spec("UB_SIZE"))
        except ImportError:
            ub = ASCEND_SOC_DEFAULTS.get(soc, (0, 0))[1] or None
    if ub is None:
        raise RuntimeError(
            f"cannot read the UB size of {soc}: CANN's tbe.common.platform is not importable "
            f"and {soc} has no default; set {settings.UB_BYTES}"
        )
    return AscendFacts(soc=soc, num_vector_cores=cores, ub_bytes=ub, source="device")


def ascend_facts(index: int | None = None) -> AscendFacts:
    """Vector cores and UB bytes of NPU ``index``, or of the targeted SoC when none is present.

    Parameters
    ----------
    index : int or None
        NPU index. ``None`` means no NPU is in use (CPU interpreter, planning, lowering):
        the numbers come from the environment or the per-SoC default table.

    Returns
    -------
    AscendFacts
        Cached: each device is read once per process.

    Raises
    ------
    SettingError
        A ``ValueError`` naming the variable whose value does not parse or is out of range (an
        unknown SoC, a UB too small for the op's smallest tile).

    Notes
    -----
    The environment is read on every call and only the result for one reading is cached, so
    a process that changes the variables is planned with the new values.
    """
    if index is not None:
        return _npu_facts(index)
    return _facts_from(settings.soc(), settings.vector_cores(), settings.ub_bytes())


@functools.lru_cache(maxsize=None)
def _facts_from(soc: str, cores: int | None, ub: int | None) -> AscendFacts:
    source = "env" if cores is not None or ub is not None else "default"
    default_cores, default_ub = ASCEND_SOC_DEFAULTS[soc]
    return AscendFacts(soc=soc, num_vector_cores=default_cores if cores is None else cores,
                       ub_bytes=default_ub if ub is None else ub, source=source)


def cuda_facts(index: int | None = None) -> CudaFacts:
    """SM count of CUDA device ``index``, and whether it takes dependent launches (read once per
    device).

    ``None`` means no GPU is in use (the CUDA plan emulated on the CPU): the count comes from
    ``VLLM_ASCEND_EXT_NUM_SMS``, else :data:`DEFAULT_NUM_SMS`.
    """
    if index is not None:
        return _gpu_facts(index)
    settings.cuda_pdl_enabled()  # parsed without a GPU too: a malformed value shows wherever facts are read
    sms = settings.num_sms()
    if sms is None:
        return CudaFacts(name="NVIDIA H200 (default)", num_sms=DEFAULT_NUM_SMS, source="default")
    return CudaFacts(name="(env)", num_sms=sms, source="env")


@functools.lru_cache(maxsize=None)
def _gpu_facts(index: int) -> CudaFacts:
    props = torch.cuda.get_device_properties(index)
    return CudaFacts(name=props.name, num_sms=props.multi_processor_count, source="device",
                     dependent_launch=props.major >= 9 and settings.cuda_pdl_enabled())
