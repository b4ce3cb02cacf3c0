"""The AscendC kernel's description, host side and pure: what it serves, its plan, UB and tiling.

No library is loaded and no torch op registered here (that is :mod:`vllm_ascend_ext.kernels.ascendc`).
:func:`plan` takes the Triton op's Ascend plan (``vllm_ascend_ext.ops.tiling.ascend``, the one
source of tile sizes) and keeps its ``block_heads`` and ``max_programs``; :class:`AscendCPlan` is
an ``ops.tiling.PlanBase``, so tile count and grid follow the Triton plan's rules (the kernel
walks the tiles grid-stride as the Triton kernel does). :func:`ub_buffers` lists, by name and
bytes, exactly the buffers the kernel's ``TPipe::InitBuffer`` calls allocate, and
``block_tokens`` is halved until they fit the same UB budget as the Triton model. :func:`tiling`
packs the :class:`Tiling` struct (a ctypes mirror of ``split_qkv_rmsnorm_rope_tiling.h``) that
every vector core reads, taking the KV-cache layout's strides from the validated
``Call.kv_cache`` (``ops/kv_cache.py``'s descriptors). :func:`unsupported_reason` names what the
kernel does not serve (the variants beyond :data:`SERVED_FEATURES`, layouts beyond
:data:`KV_LAYOUTS`, dtypes, ``head_dim`` past :data:`MAX_HEAD_DIM`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from dataclasses import dataclass

import torch

from ..ops import validation
from ..ops.tiling import PlanBase

__all__ = [
    "AscendCPlan",
    "CACHE_DTYPES",
    "FEATURE_NAMES",
    "KV_CACHE_DTYPES",
    "KV_LAYOUTS",
    "MAX_HEAD_DIM",
    "SERVED_FEATURES",
    "SUPPORTED_DTYPES",
    "Tiling",
    "forced",
    "forced_plan",
    "padded_head_dim",
    "plan",
    "tiling",
    "ub_buffers",
    "unsupported_reason",
]

#: Largest head the kernel handles: ReduceSum's scratch is sized for 256 fp32 per row.
MAX_HEAD_DIM = 256
#: qkv (and weight/bias) dtypes the kernel is built for; the cache may also be fp32.
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
CACHE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# --- mirror of split_qkv_rmsnorm_rope_tiling.h -------------------------------------------------
FLAG_NEOX = 1 << 0
FLAG_Q_WEIGHT = 1 << 1
FLAG_K_WEIGHT = 1 << 2
FLAG_Q_BIAS = 1 << 3
FLAG_K_BIAS = 1 << 4
FLAG_POS_INT64 = 1 << 5
FLAG_MROPE = 1 << 6
FLAG_MROPE_INTERLEAVED = 1 << 7
FLAG_Q_GATE = 1 << 8
FLAG_V_NORM = 1 << 9
FLAG_KV_CACHE = 1 << 10
FLAG_KV_NZ = 1 << 11
FLAG_KV_INT8 = 1 << 12
FLAG_KV_PER_CHANNEL = 1 << 13
FLAG_KV_OUT = 1 << 14
FLAG_SLOT_INT64 = 1 << 15
DTYPE_CODES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}

# Kernel constants (split_qkv_rmsnorm_rope_kernel.cpp, namespace sqrr).
BUFFER_NUM = 2
SUM_STRIDE = 8
WORK_FLOATS = 8
CONST_FLOATS = 16
AXES = 3
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
        ("positionAxisStride", ctypes.c_uint64),
        ("gateOutRowStride", ctypes.c_uint64),
        ("vOutRowStride", ctypes.c_uint64),
        ("kCacheBlockStride", ctypes.c_uint64),
        ("kCacheSlotStride", ctypes.c_uint64),
        ("kCacheHeadStride", ctypes.c_uint64),
        ("kCacheOffset", ctypes.c_uint64),
        ("vCacheBlockStride", ctypes.c_uint64),
        ("vCacheSlotStride", ctypes.c_uint64),
        ("vCacheHeadStride", ctypes.c_uint64),
        ("vCacheOffset", ctypes.c_uint64),
        ("kvChunkStride", ctypes.c_uint64),
        ("kCacheElems", ctypes.c_uint64),
        ("vCacheElems", ctypes.c_uint64),
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
        ("mropeSectionT", ctypes.c_uint32),
        ("mropeSectionH", ctypes.c_uint32),
        ("mropeSectionW", ctypes.c_uint32),
        ("ubBytes", ctypes.c_uint32),
        ("kvBlockSize", ctypes.c_uint32),
        ("kvChunkWidth", ctypes.c_uint32),
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
class AscendCPlan(PlanBase):
    """The AscendC launch: the Triton plan's head blocking and grid, tokens fitted to this UB list.

    A :class:`~vllm_ascend_ext.ops.tiling.PlanBase`: ``num_tiles``, ``head_blocks`` and ``grid``
    are the Triton plan's. They apply unchanged because the kernel cuts tiles as the Triton kernel
    does (tile = token block x head blocks + head block, q's heads then k's) and block ``b`` walks
    tiles ``b, b + GetBlockNum(), ...``: a capped grid is kept off multiples of the head-block
    count for the same reason.

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

    triton_block_tokens: int
    ub_buffers: tuple[tuple[str, int], ...]
    ub_budget: int
    ub_capacity: int

    @property
    def ub_bytes(self) -> int:
        """Bytes the kernel allocates per vector core."""
        return sum(size for _, size in self.ub_buffers)


def ub_buffers(
    head_dim: int, rotary_dim: int, block_tokens: int, block_heads: int, elem_bytes: int, cache_bytes: int,
    *, q_weight: bool, k_weight: bool, q_bias: bool, k_bias: bool, v_norm: bool = False, mrope: bool = False,
    kv_int8: bool = False, kv_per_channel: bool = False,
) -> tuple[tuple[str, int], ...]:
    """The UB the AscendC kernel allocates per vector core, as ``(name, bytes)`` in allocation order.

    Mirrors ``SplitQkvRmsnormRope::Init`` buffer for buffer (each rounded up to 32 bytes, as
    ``TPipe::InitBuffer`` does); the host-sim tests check the sum equals what the kernel
    allocated. ``Dp`` is :func:`padded_head_dim`, a tile row holds ``block_heads * Dp`` elements.
    ``v_norm`` needs the norm's buffers even without a q/k weight; ``mrope`` copies three cache
    rows per token (one per position axis), stages them in fp32 and gathers each token's row
    through one more offset table. The gated q needs no buffer of its own (its gate tiles reuse
    the q/k tile buffers). The KV-cache write of a cache in qkv's dtype needs none either (the
    y-out tile is what is stored); an int8 cache (``kv_int8``) adds the int8 tile (double
    buffered, a head every ``align32(D)`` bytes so each head's copy-out starts 32-byte aligned),
    its fp16 staging (fp32 -> fp16 -> int8, each exact on the clamped integers) and one fp32 scale
    row of ``block_heads`` heads (``kv_per_channel``: a copy-in queue of the tile's heads'
    scales; per tensor: the scale duplicated). Slots are read by the scalar unit from GM: no UB.
    """
    dp = padded_head_dim(head_dim)
    pitch = block_heads * dp
    cache_pitch = _align(rotary_dim * cache_bytes, UB_ALIGN)
    r_pad = _align(rotary_dim, 8)
    csx = 2 * r_pad + CONST_FLOATS
    sums = block_tokens * block_heads * SUM_STRIDE * FP32
    axes = AXES if mrope else 1
    items = [
        ("x in (dtype) x2", BUFFER_NUM, block_tokens * pitch * elem_bytes),
        (f"cos/sin rows in (cache dtype{', 3 axes' if mrope else ''}) x2", BUFFER_NUM,
         block_tokens * axes * cache_pitch),
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
    if mrope:
        items += [
            ("mRoPE axis rows fp32", 1, block_tokens * AXES * r_pad * FP32),
            ("mRoPE lane offsets u32", 1, r_pad * 4),
        ]
    if q_weight or k_weight or v_norm:
        items += [
            ("row sums of squares fp32", 1, sums),
            ("ones fp32", 1, sums),
            ("ReduceSum scratch fp32", 1, WORK_FLOATS * FP32),
        ]
    if kv_int8:
        items += [
            ("KV int8 tile out x2", BUFFER_NUM, block_tokens * block_heads * _align(head_dim, UB_ALIGN)),
            ("KV int8 fp16 staging", 1, block_tokens * pitch * 2),
            (f"KV scale row fp32 ({'per channel, copied in' if kv_per_channel else 'per tensor'})", 1,
             pitch * FP32),
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
    is_neox: bool = True, q_gate: bool = False, v_norm: bool = False, mrope: bool = False,
    kv_cache: bool = False, kv_int8: bool = False, kv_per_channel: bool = False,
    device_index: int | None = None,
) -> AscendCPlan:
    """The AscendC plan for one layer geometry, derived from the Triton op's Ascend plan.

    ``block_heads`` and the grid come unchanged from ``vllm_ascend_ext.ops.tiling.ascend.plan``
    for the same :class:`~vllm_ascend_ext.ops.tiling.KernelShape` (its ``q_gate`` and ``v_norm``
    add head blocks: the gate's as q's, v's as k's; so does ``kv_cache``, the cache write of
    ``split_qkv_rmsnorm_rope_kv_cache``, whose v tiles are copied or normalised into the value
    cache; ``mrope`` is ``[3, T]`` positions; ``kv_int8`` and ``kv_per_channel`` add the int8
    cache's buffers);
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
    shape = KernelShape(num_q_heads, num_kv_heads, head_dim, rotary_dim, elem_bytes, cache_bytes, is_neox,
                        q_gate=q_gate, v_norm=v_norm, mrope=mrope, kv_cache=kv_cache)
    base = ascend_tiling.plan(shape, facts)
    budget = ascend_tiling.ub_budget(facts)
    flags = dict(q_weight=q_weight, k_weight=k_weight, q_bias=q_bias, k_bias=k_bias, v_norm=v_norm, mrope=mrope,
                 kv_int8=kv_cache and kv_int8, kv_per_channel=kv_cache and kv_int8 and kv_per_channel)

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


def forced_plan() -> AscendCPlan | None:
    """The plan :func:`forced` forces now, or ``None`` (then each launch's own plan is used)."""
    return _forced_plan[0]


#: The op's optional variants (``validation.Call.features``) the kernel serves: mRoPE (``[3, T]``
#: positions, contiguous or interleaved sections), the gated q (gate copied out), v-norm, q-only
#: layers (``num_kv_heads == 0``) and the paged KV-cache write (``"kv_cache"``, the op
#: ``split_qkv_rmsnorm_rope_kv_cache``) in the layouts :data:`KV_LAYOUTS` with the cache dtypes
#: :data:`KV_CACHE_DTYPES` says (:func:`unsupported_reason` names any other). Not the norm across
#: heads and TP ranks (``"tp_norm"``, ``split_qkv_tp_rmsnorm_rope``): only the Triton op serves
#: it, and a forced AscendC call is refused naming it.
SERVED_FEATURES = frozenset({"mrope", "q_gate", "v_norm", "q_only", "kv_cache"})
#: The KV-cache layouts the kernel writes (``ops/kv_cache.py``): vllm-ascend's ND and fractal NZ.
#: ``hnd`` and ``cpu_vec`` stay with the Triton op.
KV_LAYOUTS = ("nhd", "nz")
#: KV-cache dtypes the kernel writes besides qkv's own dtype: int8 (per tensor or per channel).
#: fp8 caches stay with the Triton op (and are CUDA-only there).
KV_CACHE_DTYPES = (torch.int8,)
#: How a refusal names each variant.
FEATURE_NAMES = {"mrope": "mRoPE ([3, T] positions)", "q_gate": "q_gate (the gated q)",
                 "v_norm": "v_norm (Gemma-4's v-norm)", "q_only": "q-only layers (num_kv_heads=0)",
                 "kv_cache": "kv_cache (the paged KV-cache write)",
                 "tp_norm": "tp_norm (the q/k norm across heads and TP ranks)"}


def unsupported_reason(
    dtype: torch.dtype, head_dim: int, *, weight_dtypes: tuple[torch.dtype, ...] = (),
    cache_dtype: torch.dtype | None = None, features: frozenset[str] = frozenset(),
    kv_cache: validation.KVCacheWrite | None = None, kv_dtype: torch.dtype | None = None,
) -> str | None:
    """Why the AscendC kernel cannot serve a call (``None`` when it can).

    The kernel serves bf16/fp16 qkv, NeoX and GPT-J, partial rotary, bias, no-norm, any head
    counts and even ``head_dim <= 256``, and the variants :data:`SERVED_FEATURES` (``features``
    is the call's ``validation.Call.features``; any other variant is refused by name); weights
    and biases must have qkv's dtype, the cache may be bf16, fp16 or fp32. The Triton op also
    takes fp32 qkv, weights of another dtype and ``head_dim`` up to 512. With the KV-cache write
    (``kv_cache``, the validated ``Call.kv_cache``, and ``kv_dtype``, the caches' dtype) the
    layout must be one of :data:`KV_LAYOUTS` and the cache qkv's dtype or int8: the Triton op also
    writes ``hnd``, ``cpu_vec``, fp32/mixed float caches and fp8. A caller naming ``"kv_cache"``
    among ``features`` passes them (``impl`` and ``ascendc`` always do); without them only the
    variant's name is checked.
    """
    unserved = sorted(set(features) - SERVED_FEATURES)
    if unserved:
        names = ", ".join(FEATURE_NAMES.get(name, name) for name in unserved)
        return f"the AscendC kernel does not serve {names}; the Triton op does"
    if dtype not in SUPPORTED_DTYPES:
        return f"the AscendC kernel supports bf16/fp16 qkv, not {dtype}"
    if head_dim > MAX_HEAD_DIM:
        return f"the AscendC kernel supports head_dim <= {MAX_HEAD_DIM}, not {head_dim}"
    for wd in weight_dtypes:
        if wd != dtype:
            return f"the AscendC kernel needs weights/biases in qkv's dtype {dtype}, got {wd}"
    if cache_dtype is not None and cache_dtype not in CACHE_DTYPES:
        return f"the AscendC kernel supports a bf16/fp16/fp32 cos_sin_cache, not {cache_dtype}"
    if kv_cache is not None:
        if kv_cache.layout not in KV_LAYOUTS:
            return (f"the AscendC kernel does not write cache_layout={kv_cache.layout!r} (it writes "
                    f"{', '.join(KV_LAYOUTS)}); the Triton op does")
        if kv_dtype is not None and kv_dtype != dtype and kv_dtype not in KV_CACHE_DTYPES:
            return (f"the AscendC kernel does not write a {kv_dtype} KV cache (it writes qkv's dtype {dtype} "
                    f"and int8); the Triton op does")
    return None



def _span(t: torch.Tensor) -> int:
    """Elements from a view's first to its last, inclusive (its ``GlobalTensor`` size)."""
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))


def _kv_fields(kv: validation.KVCacheWrite | None, key_cache, value_cache, slot_mapping) -> tuple[int, dict]:
    """The tiling's KV-cache flags and fields, from the validator's ``Call.kv_cache`` (its
    ``ops/kv_cache.py`` descriptors, never re-derived here); zeros without the cache write."""
    if kv is None:
        return 0, {}
    from ..ops import kv_cache as kv_layouts

    ks, vs = kv.key_strides, kv.value_strides
    flags = FLAG_KV_CACHE | (FLAG_KV_NZ if ks.chunk_width else 0) | (FLAG_KV_OUT if kv.return_kv else 0)
    if kv.quant == kv_layouts.QUANT_INT8:
        flags |= FLAG_KV_INT8 | (FLAG_KV_PER_CHANNEL if kv.per_channel else 0)
    flags |= FLAG_SLOT_INT64 if slot_mapping.dtype == torch.int64 else 0
    return flags, dict(
        kCacheBlockStride=ks.block, kCacheSlotStride=ks.slot, kCacheHeadStride=ks.head, kCacheOffset=ks.offset,
        vCacheBlockStride=vs.block, vCacheSlotStride=vs.slot, vCacheHeadStride=vs.head, vCacheOffset=vs.offset,
        kvChunkStride=ks.chunk, kCacheElems=_span(key_cache), vCacheElems=_span(value_cache),
        kvBlockSize=ks.block_size, kvChunkWidth=ks.chunk_width)


def tiling(
    call: validation.Call, qkv: torch.Tensor, q_out: torch.Tensor, k_out: torch.Tensor | None,
    cos_sin_cache: torch.Tensor, positions: torch.Tensor, *, v_out: torch.Tensor | None = None,
    gate_out: torch.Tensor | None = None, key_cache: torch.Tensor | None = None,
    value_cache: torch.Tensor | None = None, slot_mapping: torch.Tensor | None = None,
    plan_override: AscendCPlan | None = None, device_index: int | None = None, num_tokens: int | None = None,
) -> tuple[Tiling, int, AscendCPlan]:
    """The tiling struct and block count for one launch (host-side only: no device access).

    Parameters
    ----------
    call : vllm_ascend_ext.ops.validation.Call
        The validated call (geometry, features, ``eps``, ``weight_offset``).
    qkv, q_out, k_out, cos_sin_cache, positions : torch.Tensor
        The launch's tensors (their strides go into the struct); ``k_out`` is ``None`` when k is
        not written (the cache write without ``return_kv``).
    v_out, gate_out : torch.Tensor, optional
        The v output (``call.v_norm``, and with the cache write ``return_kv``) and the gate
        output (``call.q_gate``); their row strides go into the struct.
    key_cache, value_cache, slot_mapping : torch.Tensor, optional
        The cache write's tensors (``call.kv_cache``): the caches' spans and the slots' dtype go
        into the struct, the layout's strides come from ``call.kv_cache``.
    plan_override : AscendCPlan, optional
        A plan to use instead of :func:`plan`'s (tests force tile shapes with it, as does
        :func:`forced`).
    device_index : int, optional
        The NPU whose facts size the plan (``None``: the default SoC's).
    num_tokens : int, optional
        The launch's token count (default ``call.num_tokens``: a cached call is validated on its
        first token count and launched on each call's own).

    Returns
    -------
    tiling : Tiling
        What every vector core reads.
    block_dim : int
        Vector cores to launch.
    plan : AscendCPlan
        The plan it came from.
    """
    shape, kv = call.shape, call.kv_cache
    tokens = call.num_tokens if num_tokens is None else num_tokens
    kv_flags, kv_fields = _kv_fields(kv, key_cache, value_cache, slot_mapping)
    p = plan_override or _forced_plan[0] or plan(
        shape.num_q_heads, shape.num_kv_heads, shape.head_dim, shape.rotary_dim, shape.elem_bytes,
        shape.cache_bytes, q_weight=call.q_norm, k_weight=call.k_norm, q_bias=call.q_bias, k_bias=call.k_bias,
        is_neox=shape.is_neox, q_gate=shape.q_gate, v_norm=shape.v_norm, mrope=shape.mrope,
        kv_cache=kv is not None, kv_int8=bool(kv_flags & FLAG_KV_INT8),
        kv_per_channel=bool(kv_flags & FLAG_KV_PER_CHANNEL), device_index=device_index,
    )
    flags = (FLAG_NEOX if shape.is_neox else 0) | (FLAG_Q_WEIGHT if call.q_norm else 0)
    flags |= (FLAG_K_WEIGHT if call.k_norm else 0) | (FLAG_Q_BIAS if call.q_bias else 0)
    flags |= (FLAG_K_BIAS if call.k_bias else 0) | (FLAG_POS_INT64 if positions.dtype == torch.int64 else 0)
    flags |= (FLAG_MROPE if shape.mrope else 0) | (FLAG_MROPE_INTERLEAVED if call.mrope_interleaved else 0)
    flags |= (FLAG_Q_GATE if shape.q_gate else 0) | (FLAG_V_NORM if shape.v_norm else 0) | kv_flags
    section = call.mrope_section if shape.mrope else (0, 0, 0)
    t = Tiling(
        qkvRowStride=qkv.stride(0), qOutRowStride=q_out.stride(0),
        kOutRowStride=k_out.stride(0) if k_out is not None else 0,
        cacheRowStride=cos_sin_cache.stride(0), positionStride=positions.stride(-1),
        positionAxisStride=positions.stride(0) if shape.mrope else 0,
        gateOutRowStride=gate_out.stride(0) if shape.q_gate else 0,
        vOutRowStride=v_out.stride(0) if v_out is not None else 0,
        numTokens=tokens, numQHeads=shape.num_q_heads, numKvHeads=shape.num_kv_heads,
        headDim=shape.head_dim, headDimPadded=padded_head_dim(shape.head_dim), rotaryDim=shape.rotary_dim,
        maxPosition=cos_sin_cache.shape[0], blockTokens=p.block_tokens, blockHeads=p.block_heads,
        numTiles=p.num_tiles(shape, tokens), flags=flags,
        dtype=DTYPE_CODES[qkv.dtype], cacheDtype=DTYPE_CODES[cos_sin_cache.dtype],
        eps=call.eps, weightOffset=call.weight_offset, mropeSectionT=section[0], mropeSectionH=section[1],
        mropeSectionW=section[2], ubBytes=p.ub_capacity, reserved=0, **kv_fields,
    )
    return t, p.grid(shape, tokens), p


