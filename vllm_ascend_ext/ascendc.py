"""The AscendC fallback of ``split_qkv_rmsnorm_rope``: its plan, tiling, UB model and torch op.

The kernel lives in ``csrc/split_qkv_rmsnorm_rope/``. Everything it is told comes from here:
:func:`plan` takes the Triton op's Ascend plan (``vllm_ascend_ext.ops.tiling.ascend``, the one
source of tile sizes) and keeps its ``block_heads`` and grid; :func:`ub_buffers` lists, by name
and bytes, exactly the buffers the kernel's ``TPipe::InitBuffer`` calls allocate, and
``block_tokens`` is halved until they fit the same UB budget as the Triton model. :func:`tiling`
packs the :class:`Tiling` struct (a ctypes mirror of ``split_qkv_rmsnorm_rope_tiling.h``) that
every vector core reads.

Torch ops (namespace ``vllm_ascend_ext``):

* ``split_qkv_rmsnorm_rope_ascendc(qkv, q_weight, k_weight, cos_sin_cache, positions,
  num_q_heads, num_kv_heads, head_dim, eps=1e-6, *, is_neox=True, q_bias=None, k_bias=None,
  weight_offset=0.0) -> (q, k)``: new q ``[T, Hq*D]`` and k ``[T, Hkv*D]``;
* ``split_qkv_rmsnorm_rope_ascendc_(qkv!, ...) -> ()``: the same, written into ``qkv``.

Both have a Meta (fake) implementation always and a PrivateUse1 (NPU) implementation only when
the CANN-built library ``libvllm_ascend_ext_ascendc.so`` is present. :func:`split_qkv_rmsnorm_rope`
is the Python API of the Triton op (``inplace`` flag, returns ``(q, k, v)`` with v a view).
:func:`register_cpu_launch` adds CPU implementations that run the host build of the kernel
(tests only: it is the proof without hardware, not a CPU backend).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from .ops import settings

__all__ = [
    "AscendCPlan",
    "MAX_HEAD_DIM",
    "SUPPORTED_DTYPES",
    "Tiling",
    "library_path",
    "library_status",
    "plan",
    "register_cpu_launch",
    "split_qkv_rmsnorm_rope",
    "tiling",
    "forced",
    "ub_buffers",
    "unsupported_reason",
]

#: Largest head the kernel handles: ReduceSum's scratch is sized for 256 fp32 per row.
MAX_HEAD_DIM = 256
#: qkv (and weight/bias) dtypes the kernel is built for; the cache may also be fp32.
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
CACHE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

ENV_LIBRARY = settings.ASCENDC_LIB
LIBRARY_NAME = "libvllm_ascend_ext_ascendc.so"

# --- mirror of split_qkv_rmsnorm_rope_tiling.h -------------------------------------------------
FLAG_NEOX = 1 << 0
FLAG_Q_WEIGHT = 1 << 1
FLAG_K_WEIGHT = 1 << 2
FLAG_Q_BIAS = 1 << 3
FLAG_K_BIAS = 1 << 4
FLAG_POS_INT64 = 1 << 5
DTYPE_CODES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}

# Kernel constants (split_qkv_rmsnorm_rope_kernel.cpp, namespace sqrr).
BUFFER_NUM = 2
SUM_STRIDE = 8
WORK_FLOATS = 8
CONST_FLOATS = 16
UB_ALIGN = 32
FP32 = 4


class Tiling(ctypes.Structure):
    """ctypes mirror of ``SplitQkvRmsnormRopeTiling`` (field order and types must match)."""

    _fields_ = [
        ("qkvRowStride", ctypes.c_uint64),
        ("qOutRowStride", ctypes.c_uint64),
        ("kOutRowStride", ctypes.c_uint64),
        ("cacheRowStride", ctypes.c_uint64),
        ("positionStride", ctypes.c_uint64),
        ("numTokens", ctypes.c_uint32),
        ("numQHeads", ctypes.c_uint32),
        ("numKvHeads", ctypes.c_uint32),
        ("headDim", ctypes.c_uint32),
        ("headDimPadded", ctypes.c_uint32),
        ("rotaryDim", ctypes.c_uint32),
        ("maxPosition", ctypes.c_uint32),
        ("blockTokens", ctypes.c_uint32),
        ("blockHeads", ctypes.c_uint32),
        ("numTiles", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("dtype", ctypes.c_uint32),
        ("cacheDtype", ctypes.c_uint32),
        ("eps", ctypes.c_float),
        ("weightOffset", ctypes.c_float),
        ("ubBytes", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    ]

    def words(self) -> list[int]:
        """The struct's bytes as little-endian uint32 words (the ``int[]`` the NPU binding takes)."""
        raw = bytes(self)
        return [int.from_bytes(raw[i:i + 4], "little") for i in range(0, len(raw), 4)]


def _align(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def padded_head_dim(head_dim: int) -> int:
    """A head's pitch in UB: ``D`` rounded up to 16 elements (32 bytes of bf16/fp16)."""
    return _align(head_dim, 16)


@dataclass(frozen=True)
class AscendCPlan:
    """The AscendC launch: the Triton plan's head blocking and grid, tokens fitted to this UB list.

    Attributes
    ----------
    block_tokens, block_heads, max_programs : int
        Tile shape and the most vector cores launched (they loop over tiles grid-stride).
    triton_block_tokens : int
        The Triton plan's ``block_tokens``; ``block_tokens`` is smaller only when the AscendC
        buffers of that many tokens do not fit ``ub_budget``.
    ub_buffers : tuple of (str, int)
        Every UB buffer the kernel allocates, in allocation order, bytes rounded to 32.
    ub_budget, ub_capacity : int
        The budget the Triton UB model is checked against, and the vector core's UB.
    """

    block_tokens: int
    block_heads: int
    max_programs: int
    triton_block_tokens: int
    ub_buffers: tuple[tuple[str, int], ...]
    ub_budget: int
    ub_capacity: int

    @property
    def ub_bytes(self) -> int:
        """Bytes the kernel allocates per vector core."""
        return sum(size for _, size in self.ub_buffers)

    def num_tiles(self, num_tokens: int, num_q_heads: int, num_kv_heads: int) -> int:
        """Tiles covering ``num_tokens`` tokens: q heads in blocks, then k heads in blocks."""
        head_blocks = -(-num_q_heads // self.block_heads) + -(-num_kv_heads // self.block_heads)
        return -(-num_tokens // self.block_tokens) * head_blocks

    def grid(self, num_tokens: int, num_q_heads: int, num_kv_heads: int) -> int:
        """Vector cores to launch: one per tile, at most ``max_programs``."""
        return max(1, min(self.num_tiles(num_tokens, num_q_heads, num_kv_heads), self.max_programs))


def ub_buffers(
    head_dim: int, rotary_dim: int, block_tokens: int, block_heads: int, elem_bytes: int, cache_bytes: int,
    *, q_weight: bool, k_weight: bool, q_bias: bool, k_bias: bool,
) -> tuple[tuple[str, int], ...]:
    """The UB the AscendC kernel allocates per vector core, as ``(name, bytes)`` in allocation order.

    Mirrors ``SplitQkvRmsnormRope::Init`` buffer for buffer (each rounded up to 32 bytes, as
    ``TPipe::InitBuffer`` does); the host-sim tests check the sum equals what the kernel
    allocated. ``Dp`` is :func:`padded_head_dim`, a tile row holds ``block_heads * Dp`` elements.
    """
    dp = padded_head_dim(head_dim)
    pitch = block_heads * dp
    cache_pitch = _align(rotary_dim * cache_bytes, UB_ALIGN)
    csx = 2 * _align(rotary_dim, 8) + CONST_FLOATS
    sums = block_tokens * block_heads * SUM_STRIDE * FP32
    items = [
        ("x in (dtype) x2", BUFFER_NUM, block_tokens * pitch * elem_bytes),
        ("cos/sin rows in (cache dtype) x2", BUFFER_NUM, block_tokens * cache_pitch),
        ("y out (dtype) x2", BUFFER_NUM, block_tokens * pitch * elem_bytes),
        ("x fp32", 1, block_tokens * pitch * FP32),
        ("partner / squares fp32", 1, pitch * FP32),
        ("cos spread fp32", 1, pitch * FP32),
        ("signed sin spread fp32", 1, pitch * FP32),
        ("partner offsets u32", 1, pitch * 4),
        ("cos offsets u32", 1, pitch * 4),
        ("sin offsets u32", 1, pitch * 4),
        ("cos|sin|-cos|-sin|1|0 per token fp32", 1, block_tokens * csx * FP32),
    ]
    if q_weight or k_weight:
        items += [
            ("row sums of squares fp32", 1, sums),
            ("ones fp32", 1, sums),
            ("ReduceSum scratch fp32", 1, WORK_FLOATS * FP32),
        ]
    for name, present in (("q weight", q_weight), ("k weight", k_weight), ("q bias", q_bias), ("k bias", k_bias)):
        if present:
            items.append((f"{name} per head fp32", 1, pitch * FP32))
    out = []
    for name, count, size in items:
        out.append((name, count * _align(size, UB_ALIGN)))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def plan(
    num_q_heads: int, num_kv_heads: int, head_dim: int, rotary_dim: int, elem_bytes: int, cache_bytes: int,
    *, q_weight: bool = True, k_weight: bool = True, q_bias: bool = False, k_bias: bool = False,
    is_neox: bool = True, device_index: int | None = None,
) -> AscendCPlan:
    """The AscendC plan for one layer geometry, derived from the Triton op's Ascend plan.

    ``block_heads`` and the grid come unchanged from ``vllm_ascend_ext.ops.tiling.ascend.plan``;
    ``block_tokens`` starts at that plan's and is halved while :func:`ub_buffers` exceeds the
    same budget (``ops.tiling.ascend.ub_budget``). ``is_neox`` picks the Triton plan the op
    itself would launch for that rotary style.

    Raises
    ------
    ValueError
        If one token of ``block_heads`` heads does not fit the budget.
    """
    from vllm_ascend_ext.ops.device import ascend_facts
    from vllm_ascend_ext.ops.tiling import KernelShape
    from vllm_ascend_ext.ops.tiling import ascend as ascend_tiling

    facts = ascend_facts(device_index)
    shape = KernelShape(num_q_heads, num_kv_heads, head_dim, rotary_dim, elem_bytes, cache_bytes, is_neox)
    base = ascend_tiling.plan(shape, facts)
    budget = ascend_tiling.ub_budget(facts)
    flags = dict(q_weight=q_weight, k_weight=k_weight, q_bias=q_bias, k_bias=k_bias)

    def buffers(tokens: int) -> tuple[tuple[str, int], ...]:
        return ub_buffers(head_dim, rotary_dim, tokens, base.block_heads, elem_bytes, cache_bytes, **flags)

    tokens = base.block_tokens
    while tokens > 1 and sum(b for _, b in buffers(tokens)) > budget:
        tokens //= 2
    listed = buffers(tokens)
    if sum(b for _, b in listed) > budget:
        raise ValueError(
            f"AscendC split_qkv_rmsnorm_rope: one token of {base.block_heads} heads of D={head_dim} needs "
            f"{sum(b for _, b in listed)} bytes of UB, budget {budget}"
        )
    return AscendCPlan(
        block_tokens=tokens, block_heads=base.block_heads, max_programs=base.max_programs,
        triton_block_tokens=base.block_tokens, ub_buffers=listed, ub_budget=budget, ub_capacity=facts.ub_bytes,
    )


_forced_plan: list = [None]


@contextlib.contextmanager
def forced(plan_: AscendCPlan):
    """Within the block every launch uses ``plan_`` (tests: tile boundaries, many blocks)."""
    saved = _forced_plan[0]
    _forced_plan[0] = plan_
    try:
        yield plan_
    finally:
        _forced_plan[0] = saved


def unsupported_reason(
    dtype: torch.dtype, head_dim: int, *, weight_dtypes: tuple[torch.dtype, ...] = (),
    cache_dtype: torch.dtype | None = None,
) -> str | None:
    """Why the AscendC kernel cannot serve a call (``None`` when it can).

    The kernel serves bf16/fp16 qkv, NeoX and GPT-J, partial rotary, bias, no-norm, any head
    counts and even ``head_dim <= 256``; weights and biases must have qkv's dtype, the cache may
    be bf16, fp16 or fp32. The Triton op also takes fp32 qkv, weights of another dtype and
    ``head_dim`` up to 512.
    """
    if dtype not in SUPPORTED_DTYPES:
        return f"the AscendC kernel supports bf16/fp16 qkv, not {dtype}"
    if head_dim > MAX_HEAD_DIM:
        return f"the AscendC kernel supports head_dim <= {MAX_HEAD_DIM}, not {head_dim}"
    for wd in weight_dtypes:
        if wd != dtype:
            return f"the AscendC kernel needs weights/biases in qkv's dtype {dtype}, got {wd}"
    if cache_dtype is not None and cache_dtype not in CACHE_DTYPES:
        return f"the AscendC kernel supports a bf16/fp16/fp32 cos_sin_cache, not {cache_dtype}"
    return None


def _check(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps,
           q_bias, k_bias, weight_offset) -> int:
    """Validate arguments (ValueError naming the argument); returns the rotary dim."""
    for name, value in (("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    if not isinstance(qkv, torch.Tensor) or qkv.dim() != 2:
        raise ValueError("qkv must be a 2-D tensor [T, (num_q_heads + 2*num_kv_heads) * head_dim]")
    width = (num_q_heads + 2 * num_kv_heads) * head_dim
    if qkv.shape[1] != width:
        raise ValueError(f"qkv has {qkv.shape[1]} columns; the head counts and head_dim need {width}")
    if qkv.stride(1) != 1 or (qkv.shape[0] > 1 and qkv.stride(0) < width):
        raise ValueError("qkv must have a contiguous last dim and a row stride of at least its width")
    weights = [t.dtype for t in (q_weight, k_weight, q_bias, k_bias) if isinstance(t, torch.Tensor)]
    reason = unsupported_reason(qkv.dtype, head_dim, weight_dtypes=tuple(weights),
                                cache_dtype=getattr(cos_sin_cache, "dtype", None))
    if reason is not None:
        raise ValueError(reason)
    for name, vec, weight in (("q_weight", q_weight, True), ("k_weight", k_weight, True),
                              ("q_bias", q_bias, q_weight), ("k_bias", k_bias, k_weight)):
        if vec is None:
            continue
        if weight is None:
            raise ValueError(f"{name} is only allowed together with a weight")
        if not isinstance(vec, torch.Tensor) or vec.shape != (head_dim,) or vec.stride(0) != 1:
            raise ValueError(f"{name} must be a contiguous [{head_dim}] tensor")
        if vec.device != qkv.device:
            raise ValueError(f"{name} is on {vec.device}, qkv on {qkv.device}")
    cache = cos_sin_cache
    if not isinstance(cache, torch.Tensor) or cache.dim() != 2 or cache.shape[0] < 1:
        raise ValueError("cos_sin_cache must be a 2-D tensor [max_position, rotary_dim]")
    rotary_dim = cache.shape[1]
    if rotary_dim % 2 or not 2 <= rotary_dim <= head_dim:
        raise ValueError(f"cos_sin_cache's rotary_dim must be even and in [2, head_dim={head_dim}], got {rotary_dim}")
    if cache.stride(1) != 1 or cache.device != qkv.device:
        raise ValueError("cos_sin_cache must have a contiguous last dim and sit on qkv's device")
    if not isinstance(positions, torch.Tensor) or positions.dim() != 1 or positions.shape[0] != qkv.shape[0]:
        raise ValueError("positions must be a 1-D tensor with one entry per token of qkv")
    if positions.dtype not in (torch.int32, torch.int64) or positions.device != qkv.device:
        raise ValueError("positions must be int32 or int64 on qkv's device")
    if not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite non-negative float, got {eps!r}")
    if not isinstance(weight_offset, (int, float)) or not math.isfinite(weight_offset):
        raise ValueError(f"weight_offset must be a finite float, got {weight_offset!r}")
    return rotary_dim


def tiling(
    qkv: torch.Tensor, q_out: torch.Tensor, k_out: torch.Tensor, cos_sin_cache: torch.Tensor,
    positions: torch.Tensor, num_q_heads: int, num_kv_heads: int, head_dim: int, eps: float, *,
    is_neox: bool, q_weight: bool, k_weight: bool, q_bias: bool, k_bias: bool, weight_offset: float,
    plan_override: AscendCPlan | None = None, device_index: int | None = None,
) -> tuple[Tiling, int, AscendCPlan]:
    """The tiling struct and block count for one launch (host-side only: no device access).

    Returns
    -------
    tiling : Tiling
        What every vector core reads.
    block_dim : int
        Vector cores to launch.
    plan : AscendCPlan
        The plan it came from (``plan_override`` when given: tests force tile shapes with it).
    """
    rotary_dim = cos_sin_cache.shape[1]
    elem = qkv.element_size()
    p = plan_override or _forced_plan[0] or plan(
        num_q_heads, num_kv_heads, head_dim, rotary_dim, elem, cos_sin_cache.element_size(),
        q_weight=q_weight, k_weight=k_weight, q_bias=q_bias, k_bias=k_bias, is_neox=is_neox,
        device_index=device_index,
    )
    num_tokens = qkv.shape[0]
    flags = (FLAG_NEOX if is_neox else 0) | (FLAG_Q_WEIGHT if q_weight else 0) | (FLAG_K_WEIGHT if k_weight else 0)
    flags |= (FLAG_Q_BIAS if q_bias else 0) | (FLAG_K_BIAS if k_bias else 0)
    flags |= FLAG_POS_INT64 if positions.dtype == torch.int64 else 0
    t = Tiling(
        qkvRowStride=qkv.stride(0), qOutRowStride=q_out.stride(0), kOutRowStride=k_out.stride(0),
        cacheRowStride=cos_sin_cache.stride(0), positionStride=positions.stride(0),
        numTokens=num_tokens, numQHeads=num_q_heads, numKvHeads=num_kv_heads, headDim=head_dim,
        headDimPadded=padded_head_dim(head_dim), rotaryDim=rotary_dim, maxPosition=cos_sin_cache.shape[0],
        blockTokens=p.block_tokens, blockHeads=p.block_heads,
        numTiles=p.num_tiles(num_tokens, num_q_heads, num_kv_heads), flags=flags,
        dtype=DTYPE_CODES[qkv.dtype], cacheDtype=DTYPE_CODES[cos_sin_cache.dtype],
        eps=float(eps), weightOffset=float(weight_offset), ubBytes=p.ub_capacity, reserved=0,
    )
    return t, p.grid(num_tokens, num_q_heads, num_kv_heads), p


# --- torch ops ------------------------------------------------------------------------------------
_ARGS = (
    "Tensor? q_weight, Tensor? k_weight, Tensor cos_sin_cache, Tensor positions, int num_q_heads, "
    "int num_kv_heads, int head_dim, float eps=1e-06, *, bool is_neox=True, Tensor? q_bias=None, "
    "Tensor? k_bias=None, float weight_offset=0.0"
)
_lib = torch.library.Library("vllm_ascend_ext", "FRAGMENT")  # noqa: TOR901
_lib.define(f"split_qkv_rmsnorm_rope_ascendc(Tensor qkv, {_ARGS}) -> (Tensor, Tensor)")
_lib.define(f"split_qkv_rmsnorm_rope_ascendc_(Tensor(a!) qkv, {_ARGS}) -> ()")


def _outputs(qkv, num_q_heads, num_kv_heads, head_dim, inplace):
    if inplace:
        q = qkv[:, : num_q_heads * head_dim]
        k = qkv[:, num_q_heads * head_dim:(num_q_heads + num_kv_heads) * head_dim]
        return q, k
    q = qkv.new_empty((qkv.shape[0], num_q_heads * head_dim))
    k = qkv.new_empty((qkv.shape[0], num_kv_heads * head_dim))
    return q, k


@torch.library.register_fake("vllm_ascend_ext::split_qkv_rmsnorm_rope_ascendc", lib=_lib)
def _fake(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps=1e-6, *,
          is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0):
    return _outputs(qkv, num_q_heads, num_kv_heads, head_dim, inplace=False)


@torch.library.register_fake("vllm_ascend_ext::split_qkv_rmsnorm_rope_ascendc_", lib=_lib)
def _fake_inplace(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps=1e-6,
                  *, is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0):
    return None


def _make_impl(launch, inplace: bool):
    """A backend implementation of the functional or in-place op around ``launch``."""

    def impl(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps=1e-6, *,
             is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0):
        _check(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps,
               q_bias, k_bias, weight_offset)
        q, k = _outputs(qkv, num_q_heads, num_kv_heads, head_dim, inplace)
        if qkv.shape[0] > 0:
            t, block_dim, _ = tiling(
                qkv, q, k, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps, is_neox=is_neox,
                q_weight=q_weight is not None, k_weight=k_weight is not None, q_bias=q_bias is not None,
                k_bias=k_bias is not None, weight_offset=weight_offset,
                device_index=qkv.device.index if qkv.device.type != "cpu" else None,
            )
            launch(qkv, q, k, cos_sin_cache, positions, q_weight, k_weight, q_bias, k_bias, block_dim, t)
        return None if inplace else (q, k)

    return impl


# --- the CANN-built library -------------------------------------------------------------------
ELF_MAGIC = b"\x7fELF"
#: ``e_type`` of a shared object (``elf.h``); read at byte 16 of the header.
ET_DYN = 3
_ELF_TYPES = {0: "ET_NONE", 1: "ET_REL", 2: "ET_EXEC", 3: "ET_DYN", 4: "ET_CORE"}


def _not_shared_library(path: Path) -> str | None:
    """Why ``path`` is not an ELF shared object, from its header alone (``None`` when it is)."""
    try:
        with path.open("rb") as f:
            header = f.read(18)
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if header[:4] != ELF_MAGIC:
        return "no ELF magic"
    if len(header) < 18:
        return f"ELF header truncated at {len(header)} bytes"
    order = {1: "little", 2: "big"}.get(header[5])
    if order is None:
        return f"ELF data encoding {header[5]} is neither little- nor big-endian"
    e_type = int.from_bytes(header[16:18], order)
    if e_type != ET_DYN:
        return f"ELF type {_ELF_TYPES.get(e_type, e_type)}, not ET_DYN"
    return None


def library_status() -> tuple[Path | None, str | None]:
    """Where the CANN-built op library is, and what is wrong with it, without loading it.

    ``VLLM_ASCEND_EXT_ASCENDC_LIB`` names the library; unset, it is looked for next to this file
    (where ``setup.py`` installs it). The check reads the ELF header only (magic and
    ``e_type == ET_DYN``): loading the real library needs CANN and torch_npu.

    Returns
    -------
    path : Path or None
        The library looked at; ``None`` when the variable is unset and none was built here.
    problem : str or None
        ``None`` when ``path`` is an ELF shared object; otherwise ``"does not exist"`` or
        ``"is not a shared library (<why>)"``.
    """
    override = settings.ascendc_library()
    path = override if override is not None else Path(__file__).with_name(LIBRARY_NAME)
    if not path.exists():
        return (None, None) if override is None else (path, "does not exist")
    if not path.is_file():
        return path, "is not a shared library (not a regular file)"
    why = _not_shared_library(path)
    return path, None if why is None else f"is not a shared library ({why})"


def library_path() -> Path | None:
    """The CANN-built op library when :func:`library_status` finds a shared object, else ``None``."""
    path, problem = library_status()
    return path if problem is None else None


@functools.lru_cache(maxsize=None)
def load_npu_library() -> bool:
    """Load the CANN-built library and register the PrivateUse1 implementations (once).

    Returns ``False`` (and registers nothing) when :func:`library_path` finds none. Raises what
    ``torch.ops.load_library`` raises when it is present but cannot load.
    """
    path = library_path()
    if path is None:
        return False
    torch.ops.load_library(str(path))  # pragma: no cover - needs CANN and torch_npu
    launch_op = torch.ops.vllm_ascend_ext._split_qkv_rmsnorm_rope_ascendc_launch  # pragma: no cover

    def launch(qkv, q, k, cache, positions, qw, kw, qb, kb, block_dim, t):  # pragma: no cover
        launch_op(qkv, q, k, cache, positions, qw, kw, qb, kb, block_dim, t.words())

    _lib.impl("split_qkv_rmsnorm_rope_ascendc", _make_impl(launch, False), "PrivateUse1")  # pragma: no cover
    _lib.impl("split_qkv_rmsnorm_rope_ascendc_", _make_impl(launch, True), "PrivateUse1")  # pragma: no cover
    return True  # pragma: no cover


def register_cpu_launch(launch) -> None:
    """Register CPU implementations of both ops around ``launch`` (tests only).

    The tests pass the host build of the kernel (``tests/csrc/host_sim.py``): a callable
    ``launch(qkv, q, k, cache, positions, q_weight, k_weight, q_bias, k_bias, block_dim, tiling)``.
    That is the proof without hardware, not a CPU backend. Registering again replaces the launch.
    """
    _cpu_launch[0] = launch
    if not _cpu_registered:
        _lib.impl("split_qkv_rmsnorm_rope_ascendc", _make_impl(lambda *a: _cpu_launch[0](*a), False), "CPU")
        _lib.impl("split_qkv_rmsnorm_rope_ascendc_", _make_impl(lambda *a: _cpu_launch[0](*a), True), "CPU")
        _cpu_registered.append(True)


_cpu_launch: list = [None]
_cpu_registered: list = []


def split_qkv_rmsnorm_rope(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim,
                           eps=1e-6, *, is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0, inplace=False):
    """The Triton op's API on the AscendC kernel: returns ``(q, k, v)``, v always a view of qkv.

    Parameters and semantics are those of ``vllm_ascend_ext.ops.split_qkv_rmsnorm_rope``, within
    the limits :func:`unsupported_reason` names (``ValueError`` beyond them).

    Returns
    -------
    q, k : torch.Tensor
        ``[T, Hq*D]`` and ``[T, Hkv*D]``: new tensors, or views of ``qkv`` when ``inplace``.
    v : torch.Tensor
        ``[T, Hkv*D]`` view of ``qkv`` (never read or written).
    """
    kwargs = dict(is_neox=is_neox, q_bias=q_bias, k_bias=k_bias, weight_offset=weight_offset)
    args = (q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps)
    qd, kd = num_q_heads * head_dim, num_kv_heads * head_dim
    v = qkv[:, qd + kd:qd + 2 * kd]
    if inplace:
        torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope_ascendc_(qkv, *args, **kwargs)
        return qkv[:, :qd], qkv[:, qd:qd + kd], v
    q, k = torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope_ascendc(qkv, *args, **kwargs)
    return q, k, v
