"""The AscendC fallback of ``split_qkv_rmsnorm_rope`` and ``split_qkv_rmsnorm_rope_kv_cache``: their
plan, tiling, UB model and torch ops.

The kernel class lives in ``csrc/split_qkv_rmsnorm_rope/``; the KV-cache op's entries, launch and
binding in ``csrc/split_qkv_rmsnorm_rope_kv_cache/`` (the same class with the SQRR_FLAG_KV_* flags).
Everything it is told comes from here:
:func:`plan` takes the Triton op's Ascend plan (``vllm_ascend_ext.ops.tiling.ascend``, the one
source of tile sizes) and keeps its ``block_heads`` and ``max_programs``; :class:`AscendCPlan` is
an ``ops.tiling.PlanBase``, so tile count and grid follow the Triton plan's rules (the kernel
walks the tiles grid-stride as the Triton kernel does). :func:`ub_buffers` lists, by name and
bytes, exactly the buffers the kernel's ``TPipe::InitBuffer`` calls allocate, and
``block_tokens`` is halved until they fit the same UB budget as the Triton model. :func:`tiling`
packs the :class:`Tiling` struct (a ctypes mirror of ``split_qkv_rmsnorm_rope_tiling.h``) that
every vector core reads.

Torch ops (namespace ``vllm_ascend_ext``; schemas from :func:`vllm_ascend_ext.kernels.schema.schemas`,
the one spelling of the argument list):

* ``split_qkv_rmsnorm_rope_ascendc(qkv, q_weight, k_weight, cos_sin_cache, positions,
  num_q_heads, num_kv_heads, head_dim, eps=1e-6, *, is_neox=True, q_bias=None, k_bias=None,
  weight_offset=0.0, mrope_section=None, mrope_interleaved=False, q_gate=False, v_norm=False)
  -> (q, k, v, gate)``: new q ``[T, Hq*D]`` and k ``[T, Hkv*D]``; v ``[T, Hkv*D]`` with
  ``v_norm`` and ``[T, 0]`` otherwise, gate ``[T, Hq*D]`` with ``q_gate`` and ``[T, 0]``
  otherwise (the custom op's outputs, sized by ``schema.fake_outputs``);
* ``split_qkv_rmsnorm_rope_ascendc_(qkv!, ...) -> ()``: the same, written into ``qkv`` (and
  ``qkv``'s autograd version counter bumped, as the Triton op does).

Every implementation validates with the op's one validator
(:func:`vllm_ascend_ext.ops.validation.split_qkv_rmsnorm_rope`) and then the kernel's own limits
(:func:`unsupported_reason`), ``ValueError`` naming the argument either way: the fakes on every
call, the real ones once per launch-cache key (:class:`Prepared`, the validated call object, made
by the launch cache or handed over by the caller that already holds it). Both ops have a fake
implementation always and a PrivateUse1 (NPU) one only when the CANN-built library
``libvllm_ascend_ext_ascendc.so`` loads (:func:`load_npu_library`; :func:`library_status` says
whether one is there, without loading it). :func:`make_impl` builds an implementation around
any launch callable: the tests register the host build of the kernel on the CPU key with it
(``tests/csrc/host_sim.py``). :func:`split_qkv_rmsnorm_rope` is the Python API of the Triton
op (``inplace`` flag; returns ``(q, k, v)``, and the gate after them with ``q_gate``).

The KV-cache write: ``split_qkv_rmsnorm_rope_kv_cache_ascendc`` (the custom op's schema,
``schema.KV_CACHE_SCHEMA``) and ``..._ascendc_`` (in place), built by :func:`make_kv_impl`,
validated by ``validation.split_qkv_rmsnorm_rope_kv_cache`` then :func:`unsupported_reason`
(layouts :data:`KV_LAYOUTS`, a cache of qkv's dtype or int8); :func:`split_qkv_rmsnorm_rope_kv_cache`
is the Python API of the Triton op ``ops.split_qkv_rmsnorm_rope_kv_cache``. :func:`tiling` takes
the layout's strides from the validated ``Call.kv_cache`` (``ops/kv_cache.py``'s descriptors).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from . import schema
from ..ops import launch_cache, settings, validation
from ..ops.tiling import PlanBase

__all__ = [
    "AscendCPlan",
    "INPLACE_OP_NAME",
    "KV_CACHE_DTYPES",
    "KV_INPLACE_OP_NAME",
    "KV_LAYOUTS",
    "KV_OP_NAME",
    "MAX_HEAD_DIM",
    "OP_NAME",
    "Prepared",
    "SERVED_FEATURES",
    "SUPPORTED_DTYPES",
    "Tiling",
    "forced",
    "library_path",
    "library_status",
    "load_npu_library",
    "kv_schemas",
    "make_impl",
    "make_kv_impl",
    "plan",
    "split_qkv_rmsnorm_rope",
    "split_qkv_rmsnorm_rope_kv_cache",
    "tiling",
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

OP_NAME = "split_qkv_rmsnorm_rope_ascendc"
INPLACE_OP_NAME = OP_NAME + "_"
#: The AscendC twin of ``split_qkv_rmsnorm_rope_kv_cache`` (functional, and ``_`` in place).
KV_OP_NAME = "split_qkv_rmsnorm_rope_kv_cache_ascendc"
KV_INPLACE_OP_NAME = KV_OP_NAME + "_"

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
    among ``features`` passes them (``impl`` and this module always do); without them only the
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


def _validate(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps,
              *, is_neox, q_bias, k_bias, weight_offset, inplace, mrope_section=None, mrope_interleaved=False,
              q_gate=False, v_norm=False, fake: bool = False) -> validation.Call:
    """The op's one validator (``schema.validate_fake``'s form in fakes), then the kernel's limits.

    ``ValueError`` naming the argument either way; a variant the kernel does not serve (its
    :attr:`~vllm_ascend_ext.ops.validation.Call.features`) is refused by name.
    """
    validate = schema.validate_fake if fake else validation.split_qkv_rmsnorm_rope
    call = validate(
        qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps,
        is_neox=is_neox, q_bias=q_bias, k_bias=k_bias, weight_offset=weight_offset, inplace=inplace,
        mrope_section=mrope_section, mrope_interleaved=mrope_interleaved, q_gate=q_gate, v_norm=v_norm)
    weights = tuple(t.dtype for t in (q_weight, k_weight, q_bias, k_bias) if t is not None)
    reason = unsupported_reason(qkv.dtype, call.shape.head_dim, weight_dtypes=weights,
                                cache_dtype=cos_sin_cache.dtype, features=call.features)
    if reason is not None:
        raise ValueError(reason)
    return call


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


# --- torch ops ------------------------------------------------------------------------------------
_lib = torch.library.Library(schema.NAMESPACE, "FRAGMENT")
for _schema in schema.schemas(OP_NAME):
    _lib.define(_schema)


def _outputs(qkv: torch.Tensor, call: validation.Call) -> tuple[torch.Tensor, ...]:
    """What the kernel writes, ``(q, k, v, gate)``, as the functional op returns them.

    q and k are new ``[T, Hq*D]`` / ``[T, Hkv*D]`` tensors, or their columns of ``qkv`` in place;
    v is ``[T, Hkv*D]`` with ``v_norm`` (new, or its columns of ``qkv`` in place) and ``[T, 0]``
    otherwise; the gate is a new ``[T, Hq*D]`` with ``q_gate`` (never in place: the validator
    refuses it) and ``[T, 0]`` otherwise.
    """
    if not call.inplace:
        return schema.fake_outputs(qkv, call.shape)
    shape = call.shape
    q_cols, kv_cols = shape.num_q_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    tokens = qkv.shape[0]
    v = qkv[:, q_cols + kv_cols:q_cols + 2 * kv_cols] if shape.v_norm else qkv.new_empty((tokens, 0))
    return qkv[:, :q_cols], qkv[:, q_cols:q_cols + kv_cols], v, qkv.new_empty((tokens, 0))


@torch.library.register_fake(f"{schema.NAMESPACE}::{OP_NAME}", lib=_lib)
def _fake(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps=1e-6, *,
          is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0, **features):
    call = _validate(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps,
                     is_neox=is_neox, q_bias=q_bias, k_bias=k_bias, weight_offset=weight_offset, inplace=False,
                     fake=True, **features)
    return schema.fake_outputs(qkv, call.shape)


@torch.library.register_fake(f"{schema.NAMESPACE}::{INPLACE_OP_NAME}", lib=_lib)
def _fake_inplace(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps=1e-6,
                  *, is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0, **features):
    _validate(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps,
              is_neox=is_neox, q_bias=q_bias, k_bias=k_bias, weight_offset=weight_offset, inplace=True, fake=True,
              **features)
    return None

#: The launch caches of the AscendC ops (the prologue and the KV-cache write; functional and in
#: place share them: ``inplace`` is in the key).
_CACHE = launch_cache.LaunchCache("ascendc.split_qkv_rmsnorm_rope")
_KV_CACHE = launch_cache.LaunchCache("ascendc.split_qkv_rmsnorm_rope_kv_cache")
#: The entry a :meth:`Prepared.run` hands to the op implementation it dispatches to (this thread).
_handoff = threading.local()


def _entry(cache: launch_cache.LaunchCache, args: dict, validate) -> Prepared:
    """The call object of an op implementation's call: the one :meth:`Prepared.run` handed over
    for this very ``qkv``, else the launch cache's (validated once per key)."""
    entry = getattr(_handoff, "entry", None)
    if entry is not None and _handoff.qkv is args["qkv"]:
        return entry
    return launch_cache.prepared(cache, args, validate, Prepared, launch_cache.TOKEN_KEYS)


class Prepared:
    """A validated call of the AscendC kernel (prologue, or with ``call.kv_cache`` the KV-cache
    write), for every token count: the call object its route, its Python API and its torch ops
    pass around.

    Made once per launch-cache key from the op's validated :class:`~vllm_ascend_ext.ops.validation.Call`
    (the Triton route's object, or this module's cache's); refuses what the kernel does not serve
    (:func:`unsupported_reason`, ``ValueError``). Keeps the :class:`Tiling` and block count per
    token count (none while :func:`forced` forces a plan). :meth:`run` dispatches the AscendC
    torch op of the device with this entry handed over (no second validation), :meth:`launch` is
    what that op runs.

    Parameters
    ----------
    call : vllm_ascend_ext.ops.validation.Call
        The validated call.
    args : dict
        The call's arguments by name, as the Python API takes them (``inplace`` among them).
    """

    #: Token counts whose tiling is kept (a bound on the per-count dict).
    MAX_TOKEN_COUNTS = 4096

    tokens_agree = staticmethod(launch_cache.tokens_agree)

    def __init__(self, call: validation.Call, args: dict):
        qkv, kv = args["qkv"], call.kv_cache
        weights = tuple(args[n].dtype for n in ("q_weight", "k_weight", "q_bias", "k_bias") if args[n] is not None)
        reason = unsupported_reason(qkv.dtype, call.shape.head_dim, weight_dtypes=weights,
                                    cache_dtype=args["cos_sin_cache"].dtype, features=call.features, kv_cache=kv,
                                    kv_dtype=None if kv is None else args["key_cache"].dtype)
        if reason is not None:
            raise ValueError(reason)
        self.call, self.kv = call, kv is not None
        shape = call.shape
        self.q_cols, self.kv_cols = shape.num_q_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
        self.k_col = shape.num_q_heads * shape.q_head_stride
        self.int8 = self.kv and args["key_cache"].dtype == torch.int8
        self.device_index = None if qkv.device.type == "cpu" else qkv.device.index
        name = (KV_OP_NAME if self.kv else OP_NAME) + ("_" if call.inplace else "")
        self._op = getattr(getattr(torch.ops, schema.NAMESPACE), name).default
        self._tilings: dict[int, tuple[Tiling, int]] = {}

    def run(self, args: dict):
        """The Python API's call on ``args``: the AscendC op dispatched (per device) with this entry
        handed over; ``(q, k, v)``, and the gate with ``q_gate`` (see :func:`split_qkv_rmsnorm_rope`)."""
        call, qkv = self.call, args["qkv"]
        op_args = dict(args)
        del op_args["inplace"]
        _handoff.entry, _handoff.qkv, _handoff.outputs = self, qkv, None
        try:
            self._op(**op_args)
            q, k, v, gate = _handoff.outputs
        finally:
            _handoff.entry = _handoff.qkv = _handoff.outputs = None
        v_view = None if call.v_norm and not call.inplace else qkv[:, self.k_col + self.kv_cols:
                                                                     self.k_col + 2 * self.kv_cols]
        if self.kv:
            if call.inplace:
                k = qkv[:, self.k_col:self.k_col + self.kv_cols]
            v = v if v_view is None else v_view
            if not call.kv_cache.return_kv:
                k = v = qkv.new_empty((qkv.shape[0], 0))
            return (q, k, v) + ((gate,) if call.q_gate and not call.inplace else ())
        return (q, k, v if v_view is None else v_view) + ((gate,) if call.q_gate else ())

    def launch(self, args: dict, launch) -> tuple[torch.Tensor, ...]:
        """Allocate the op's outputs ``(q, k, v, gate)`` (:func:`_outputs`, :func:`_kv_outputs`), run
        ``launch`` (:func:`make_impl`'s or :func:`make_kv_impl`'s) on them, return them."""
        call, qkv = self.call, args["qkv"]
        if self.kv:
            q, k, v, gate = _kv_outputs(qkv, call)
            return_kv = call.kv_cache.return_kv
            k_out, v_out = (k if return_kv else None), (v if return_kv and call.v_norm else None)
        else:
            q, k, v, gate = _outputs(qkv, call)
            k_out, v_out = k, (v if call.v_norm else None)
        gate_out = gate if call.q_gate else None
        tokens = qkv.shape[0]
        if tokens > 0:
            t, block_dim = self._tiling(tokens, args, q, k_out, v_out, gate_out)
            weights = (args["q_weight"], args["k_weight"], args["q_bias"], args["k_bias"])
            if self.kv:
                launch(qkv, q, k_out, v_out, gate_out, args["cos_sin_cache"], args["positions"], *weights,
                       args["key_cache"], args["value_cache"], args["slot_mapping"],
                       args["k_scale"] if self.int8 else None, args["v_scale"] if self.int8 else None, block_dim, t)
            else:
                launch(qkv, q, k_out, v_out, gate_out, args["cos_sin_cache"], args["positions"], *weights,
                       block_dim, t)
            call.mark_written(qkv)
        outputs = (q, k, v, gate)
        if getattr(_handoff, "entry", None) is self:
            _handoff.outputs = outputs
        return outputs

    def _tiling(self, tokens: int, args: dict, q, k_out, v_out, gate_out) -> tuple[Tiling, int]:
        """:func:`tiling` for ``tokens``, kept per token count (every other input is the key's)."""
        kept = self._tilings.get(tokens)
        if kept is not None and _forced_plan[0] is None:
            return kept
        t, block_dim, _ = tiling(self.call, args["qkv"], q, k_out, args["cos_sin_cache"], args["positions"],
                                 v_out=v_out, gate_out=gate_out, key_cache=args.get("key_cache"),
                                 value_cache=args.get("value_cache"), slot_mapping=args.get("slot_mapping"),
                                 device_index=self.device_index, num_tokens=tokens)
        if _forced_plan[0] is None:
            if len(self._tilings) >= self.MAX_TOKEN_COUNTS:
                self._tilings.clear()
            self._tilings[tokens] = t, block_dim
        return t, block_dim


def make_impl(launch, inplace: bool):
    """A backend implementation of the functional (or in-place) AscendC op around ``launch``.

    Parameters
    ----------
    launch : callable
        ``launch(qkv, q, k, v, gate, cos_sin_cache, positions, q_weight, k_weight, q_bias, k_bias,
        block_dim, tiling)``: runs the kernel on ``block_dim`` vector cores with the
        :class:`Tiling` ``tiling`` (the NPU library's launch op, or the tests' host build);
        ``v`` and ``gate`` are ``None`` unless the call writes them (``v_norm``, ``q_gate``).
    inplace : bool
        Build the implementation of ``split_qkv_rmsnorm_rope_ascendc_`` (q and k written into
        ``qkv``, whose autograd version counter is then bumped unless it is an inference
        tensor) rather than of the functional op.

    Returns
    -------
    callable
        The implementation, with the op's schema as its signature (the variants' keyword
        arguments :data:`vllm_ascend_ext.kernels.schema.FEATURES` included), to register with
        ``torch.library.Library.impl`` under :data:`OP_NAME` or :data:`INPLACE_OP_NAME`. The
        functional one returns ``(q, k, v, gate)`` as ``schema.fake_outputs`` sizes them.
    """

    def impl(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps=1e-6, *,
             is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0, mrope_section=None, mrope_interleaved=False,
             q_gate=False, v_norm=False):
        args = dict(qkv=qkv, q_weight=q_weight, k_weight=k_weight, cos_sin_cache=cos_sin_cache, positions=positions,
                    num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, eps=eps, is_neox=is_neox,
                    q_bias=q_bias, k_bias=k_bias, weight_offset=weight_offset, inplace=inplace,
                    mrope_section=mrope_section, mrope_interleaved=mrope_interleaved, q_gate=q_gate, v_norm=v_norm)
        outputs = _entry(_CACHE, args, validation.split_qkv_rmsnorm_rope).launch(args, launch)
        return None if inplace else outputs

    return impl


# --- split_qkv_rmsnorm_rope_kv_cache --------------------------------------------------------------
def kv_schemas() -> tuple[str, str]:
    """The AscendC KV-cache ops' schemas: the custom op's (``schema.KV_CACHE_SCHEMA``, the one
    spelling) under :data:`KV_OP_NAME`, and in place (``qkv`` mutable, nothing returned) under
    :data:`KV_INPLACE_OP_NAME`."""
    base = schema.KV_CACHE_SCHEMA
    prefix = f"{schema.KV_CACHE_OP_NAME}(Tensor qkv"
    assert base.startswith(prefix)
    functional = KV_OP_NAME + base[len(schema.KV_CACHE_OP_NAME):]
    inplace = f"{KV_INPLACE_OP_NAME}(Tensor(c!) qkv" + base[len(prefix):].rsplit(" -> ", 1)[0] + " -> ()"
    return functional, inplace


for _schema in kv_schemas():
    _lib.define(_schema)


def _validate_kv(qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache, slot_mapping,
                 num_q_heads, num_kv_heads, head_dim, eps, *, cache_layout, k_scale, v_scale, return_kv,
                 fake: bool = False, **prologue) -> validation.Call:
    """The KV-cache op's one validator (``schema.validate_kv_cache_fake``'s form in fakes, which
    takes ``value_cache=None`` for a one-tensor layout), then the kernel's limits by name: the
    layout, the cache dtype and the variants."""
    if fake:
        call = schema.validate_kv_cache_fake(
            qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache, slot_mapping, num_q_heads,
            num_kv_heads, head_dim, eps, cache_layout=cache_layout, k_scale=k_scale, v_scale=v_scale,
            return_kv=return_kv, **prologue)
    else:
        call = validation.split_qkv_rmsnorm_rope_kv_cache(
            qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache, slot_mapping, num_q_heads,
            num_kv_heads, head_dim, eps, cache_layout=cache_layout, k_scale=k_scale, v_scale=v_scale,
            return_kv=return_kv, **prologue)
    weights = tuple(t.dtype for t in (q_weight, k_weight, prologue.get("q_bias"), prologue.get("k_bias"))
                    if t is not None)
    reason = unsupported_reason(qkv.dtype, call.shape.head_dim, weight_dtypes=weights,
                                cache_dtype=cos_sin_cache.dtype, features=call.features, kv_cache=call.kv_cache,
                                kv_dtype=key_cache.dtype)
    if reason is not None:
        raise ValueError(reason)
    return call


def _kv_outputs(qkv: torch.Tensor, call: validation.Call) -> tuple[torch.Tensor, ...]:
    """What the KV-cache kernel writes besides the caches, ``(q, k, v, gate)``: as
    ``schema.fake_outputs(..., return_kv=...)`` sizes them (k ``[T, Hkv*D]`` only with
    ``return_kv``, v only with ``return_kv`` and ``v_norm``), new or (in place) qkv's columns."""
    return_kv = call.kv_cache.return_kv
    if not call.inplace:
        return schema.fake_outputs(qkv, call.shape, return_kv=return_kv)
    shape, tokens = call.shape, qkv.shape[0]
    q_cols, kv_cols = shape.num_q_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    empty = qkv.new_empty((tokens, 0))
    k = qkv[:, q_cols:q_cols + kv_cols] if return_kv else empty
    v = qkv[:, q_cols + kv_cols:q_cols + 2 * kv_cols] if return_kv and shape.v_norm else empty
    return qkv[:, :q_cols], k, v, qkv.new_empty((tokens, 0))


def _kv_fake(inplace: bool):
    def fake(qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache, slot_mapping, num_q_heads,
             num_kv_heads, head_dim, eps=1e-6, *, cache_layout="nhd", k_scale=None, v_scale=None, return_kv=False,
             **prologue):
        call = _validate_kv(qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache,
                            slot_mapping, num_q_heads, num_kv_heads, head_dim, eps, cache_layout=cache_layout,
                            k_scale=k_scale, v_scale=v_scale, return_kv=return_kv, inplace=inplace, fake=True,
                            **prologue)
        return None if inplace else schema.fake_outputs(qkv, call.shape, return_kv=return_kv)

    return fake


torch.library.register_fake(f"{schema.NAMESPACE}::{KV_OP_NAME}", _kv_fake(False), lib=_lib)
torch.library.register_fake(f"{schema.NAMESPACE}::{KV_INPLACE_OP_NAME}", _kv_fake(True), lib=_lib)


def make_kv_impl(launch, inplace: bool):
    """A backend implementation of the functional (or in-place) AscendC KV-cache op around ``launch``.

    Parameters
    ----------
    launch : callable
        ``launch(qkv, q, k, v, gate, cos_sin_cache, positions, q_weight, k_weight, q_bias, k_bias,
        key_cache, value_cache, slot_mapping, k_scale, v_scale, block_dim, tiling)``: runs the
        kernel with the cache write on ``block_dim`` vector cores (the NPU library's launch op,
        or the tests' host build); ``k``, ``v`` and ``gate`` are ``None`` where the call does not
        write them, ``k_scale``/``v_scale`` where the cache is not int8.
    inplace : bool
        Build :data:`KV_INPLACE_OP_NAME`'s implementation (q, and k and v with ``return_kv``,
        written into ``qkv``) rather than :data:`KV_OP_NAME`'s.

    Returns
    -------
    callable
        The implementation, with the KV-cache op's schema as its signature; the functional one
        returns ``(q, k, v, gate)`` as ``schema.fake_outputs(..., return_kv=return_kv)``
        sizes them.
    """

    def impl(qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache, slot_mapping, num_q_heads,
             num_kv_heads, head_dim, eps=1e-6, *, cache_layout="nhd", k_scale=None, v_scale=None, return_kv=False,
             is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0, mrope_section=None, mrope_interleaved=False,
             q_gate=False, v_norm=False):
        value_cache = schema.value_cache_of(key_cache, value_cache, cache_layout)
        args = dict(qkv=qkv, q_weight=q_weight, k_weight=k_weight, cos_sin_cache=cos_sin_cache, positions=positions,
                    key_cache=key_cache, value_cache=value_cache, slot_mapping=slot_mapping, num_q_heads=num_q_heads,
                    num_kv_heads=num_kv_heads, head_dim=head_dim, eps=eps, cache_layout=cache_layout,
                    k_scale=k_scale, v_scale=v_scale, return_kv=return_kv, is_neox=is_neox, q_bias=q_bias,
                    k_bias=k_bias, weight_offset=weight_offset, inplace=inplace, mrope_section=mrope_section,
                    mrope_interleaved=mrope_interleaved, q_gate=q_gate, v_norm=v_norm)
        outputs = _entry(_KV_CACHE, args, validation.split_qkv_rmsnorm_rope_kv_cache).launch(args, launch)
        return None if inplace else outputs

    return impl


def split_qkv_rmsnorm_rope_kv_cache(qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache,
                                    slot_mapping, num_q_heads, num_kv_heads, head_dim, eps=1e-6, *,
                                    cache_layout="nhd", k_scale=None, v_scale=None, return_kv=False,
                                    is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0,
                                    inplace=False, mrope_section=None, mrope_interleaved=False,
                                    q_gate=False, v_norm=False):
    """The AscendC twin of ``vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_kv_cache``: same signature,
    same results, the same one validator.

    Serves the layouts :data:`KV_LAYOUTS` (``nhd``, ``nz``) with a cache of qkv's dtype (bf16,
    fp16) or int8 (per tensor or per channel), with every prologue variant the kernel serves and
    with or without ``return_kv``; anything else is refused naming it (:func:`unsupported_reason`).

    Returns
    -------
    tuple of torch.Tensor
        ``(q, k, v)``, and the gate with ``q_gate``: k and v ``[T, 0]`` unless ``return_kv``; with
        it k is new (or qkv's columns in place) and v is the normalised v with ``v_norm``, else a
        view of qkv's v columns (never read or written but to copy them into the cache).

    Raises
    ------
    ValueError
        On a bad argument (the op's validator) or one beyond the kernel's limits, naming it.
    """
    args = locals()
    return launch_cache.prepared(_KV_CACHE, args, validation.split_qkv_rmsnorm_rope_kv_cache, Prepared,
                                 launch_cache.TOKEN_KEYS).run(args)



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
    path = override if override is not None else Path(__file__).resolve().parent.parent / LIBRARY_NAME
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

    def launch(qkv, q, k, v, gate, cache, positions, qw, kw, qb, kb, block_dim, t):  # pragma: no cover
        launch_op(qkv, q, k, v, gate, cache, positions, qw, kw, qb, kb, block_dim, t.words())

    _lib.impl(OP_NAME, make_impl(launch, False), "PrivateUse1")  # pragma: no cover
    _lib.impl(INPLACE_OP_NAME, make_impl(launch, True), "PrivateUse1")  # pragma: no cover
    kv_launch_op = torch.ops.vllm_ascend_ext._split_qkv_rmsnorm_rope_kv_cache_ascendc_launch  # pragma: no cover

    def kv_launch(qkv, q, k, v, gate, cache, positions, qw, kw, qb, kb, kc, vc, slots, ks, vs, block_dim,
                  t):  # pragma: no cover
        kv_launch_op(qkv, q, k, v, gate, cache, positions, qw, kw, qb, kb, kc, vc, slots, ks, vs, block_dim,
                     t.words())

    _lib.impl(KV_OP_NAME, make_kv_impl(kv_launch, False), "PrivateUse1")  # pragma: no cover
    _lib.impl(KV_INPLACE_OP_NAME, make_kv_impl(kv_launch, True), "PrivateUse1")  # pragma: no cover
    return True  # pragma: no cover


def split_qkv_rmsnorm_rope(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim,
                           eps=1e-6, *, is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0, inplace=False,
                           mrope_section=None, mrope_interleaved=False, q_gate=False, v_norm=False):
    """The Triton op's API on the AscendC kernel: returns ``(q, k, v)``, and the gate with ``q_gate``.

    Parameters and semantics are those of ``vllm_ascend_ext.ops.split_qkv_rmsnorm_rope``, within
    the limits :func:`unsupported_reason` names.

    Returns
    -------
    q, k : torch.Tensor
        ``[T, Hq*D]`` and ``[T, Hkv*D]``: new tensors, or views of ``qkv`` when ``inplace``.
    v : torch.Tensor
        ``[T, Hkv*D]``: a view of ``qkv`` (never read or written), or with ``v_norm`` the
        normalised v (a new tensor, or its columns of ``qkv`` when ``inplace``).
    gate : torch.Tensor
        Only with ``q_gate``: a new ``[T, Hq*D]`` tensor, the gate copied out of ``qkv``.

    Raises
    ------
    ValueError
        On a bad argument (the op's validator) or one beyond the kernel's limits, naming it.
    """
    args = locals()
    return launch_cache.prepared(_CACHE, args, validation.split_qkv_rmsnorm_rope, Prepared,
                                 launch_cache.TOKEN_KEYS).run(args)
