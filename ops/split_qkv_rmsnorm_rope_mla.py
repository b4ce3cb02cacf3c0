"""The MLA attention prologue (DeepSeek-V2/V3, Kimi-K2): split the fused ``q_a``/``kv_a`` projection,
RMS-normalise the q latent and the kv latent, rotate ``k_pe``, write vLLM's MLA cache; and, after
``q_b_proj``, rotate ``q_pe`` in place. One Triton kernel, two launches; one without a q latent,
where q (``q_proj``'s output) is there before the prologue and is rotated in its launch.

Layout
------
``qkv_lora`` is ``[T, q_lora_rank + kv_lora_rank + rope_dim]`` (columns ``q_c | kv_c | k_pe``) with a
contiguous last dim and any row stride (a view of a wider projection output is fine). Without a q
latent (``q_lora_rank = 0``: DeepSeek-V2-Lite's ``kv_a_proj_with_mqa``) it is ``kv_c | k_pe``. Without
RoPE (``rope_dim = 0``) it is ``q_c | kv_c``. The outputs are new contiguous tensors ``q_c [T, Lq]``,
``kv_c_normed [T, Lkv]``, ``k_pe [T, R]``.

The cache, when given, is vLLM's one tensor ``[num_blocks, block_size, Lkv + R]`` (row = ``kv_c_normed``
then ``k_pe``; any strides but a contiguous last dim), or vllm-ascend's pair ``(nope_cache,
rope_cache)``: ``cache_layout="nd"`` ``[num_blocks, block_size, 1, Lkv]`` and ``[.., 1, R]``, or
``"nz"`` (the fractal NZ of :mod:`.kv_cache`, one head of ``Lkv`` / ``R`` lanes: ``[num_blocks,
Lkv // C0, block_size, C0]`` and ``[num_blocks, R // C0, block_size, C0]``, ``C0`` = 32 bytes of
each cache's dtype; the descriptors are :func:`.kv_cache.strides_of`'s).

Math (per token ``t``, in fp32, one rounding to the output dtype at the end)
----------------------------------------------------------------------------
::

    q_c[t]         = x * rsqrt(mean(x**2) + eps) * q_a_weight     x = qkv_lora[t, :Lq]
    kv_c_normed[t] = x * rsqrt(mean(x**2) + eps) * kv_a_weight    x = qkv_lora[t, Lq:Lq+Lkv]
    p = clamp(positions[t], 0, max_position - 1)
    c, s = cos_sin_cache[p, :R/2], cos_sin_cache[p, R/2:R]
    k_pe[t]: x = qkv_lora[t, Lq+Lkv:]; for each pair (i_a, i_b) -- GPT-J (default): (2i, 2i+1);
             NeoX: (i, i + R/2) -- (y[i_a], y[i_b]) = (x[i_a]*c[i] - x[i_b]*s[i], x[i_b]*c[i] + x[i_a]*s[i])

With a cache and ``s = slot_mapping[t] >= 0`` (negative: padding, nothing written), the row of
slot ``s`` (block ``s // block_size``, row ``s % block_size``) gets ``cat(kv_c_normed[t], k_pe[t])``
-- the rounded outputs, as vLLM caches them -- stored as::

    store(y) = y cast to the cache dtype                               (kv_cache_dtype="auto")
             = fp8_e4m3(round_half_even(clamp(y / k_scale, -448, 448)))  ("fp8": uint8 or float8_e4m3fn storage)
             = clamp(round_half_even(y / k_scale), -128, 127)            ("int8": the split form's latent)

The division is IEEE fp32 (``div_rn``), the e4m3 rounding is done on the fp32 value before the cast
(:func:`~.split_qkv_rmsnorm_rope.store`, shared with the GQA cache write). Nothing else of the cache
is touched.

The q side (:func:`mla_q_rope_`): ``q`` ``[T, H, D]`` (any token and head strides, contiguous
lanes; ``q_b_proj``'s output viewed per head), ``q[t, h, D-R:]`` rotated in place as k_pe is;
``q[..., :D-R]`` (q_nope) is neither read nor written. Without a q latent the prologue takes the
same ``q`` (its keyword ``q``) and rotates it the same way in its own launch.

Tiling
------
The prologue's tiles are ``BLOCK_T`` tokens of one arm: q_c's norm, or the kv arm (kv_c's norm, k_pe's
rotation, the cache stores), so a token block is two tiles and neither mask mixes the two rows.
A row of more than the plan's chunk (q_c's 1536 lanes in chunks of 512) is squared chunk by chunk
in a first pass, the squares summed lane by lane and reduced once, and loaded again to be scaled
and stored in a second (as the GQA kernel's chunked tail). The rotary lanes are held as two
halves: NeoX's two contiguous blocks, or GPT-J's pairs as one contiguous block split in registers
(``[.., R/2, 2]``). Every tile is ``[BLOCK_T, heads, lanes]`` (one head in the prologue), so the
GQA kernel's store helper serves every store. The q side's tiles are ``BLOCK_T`` tokens x
``BLOCK_H`` heads of the rotary lanes; a prologue given q has such tiles too, after its kv arm
(``BLOCK_H`` heads as its widest latent chunk holds). Programs walk the tiles grid-stride (a plan with
``one_tile`` has a program a tile, ``ONE_TILE``) and the token count is a run-time argument: one
compiled kernel per plan serves every batch size. The cos/sin rows are gathered as one 2-D load
addressed by positions loaded as a vector (no scalar read back from a tile in flight). A tile's
loads that wait on nothing (its rows, the positions) come first in the code, then the cos/sin
rows, then the math and the stores: a warp issues in order, and at one token a tile the chain of
trips to memory is the time. Tile sizes, chunks and grid come from ``ops/tiling``
(:func:`~.tiling.mla_plan_for`). With ``PDL`` (a CUDA plan's choice, as the GQA kernel's) each
program waits for the grid before it and lets the next one launch
(:func:`~.split_qkv_rmsnorm_rope.grid_dependency`), so the q side's launch overlaps the end of the
kernel before it.

Not served
----------
``fp8_ds_mla`` (DeepSeek-V3.2's 656-byte cache row: 512 fp8 latent lanes in four 128-lane groups,
each with its own fp32 scale computed from the group's absolute maximum, then the 64 rope lanes in
bf16) does not fit this kernel cheaply: its scales are dynamic (a max-reduction per 128-lane group
before any store, so the latent's chunks would need a third pass, or to be held whole), the row
mixes three element types in one byte row (fp8, fp32, bf16), which needs byte addressing with
bitcasts for every store, and its per-group scale is rounded to a power of two in vLLM's kernel, a
rule we could only match by reading that kernel line by line. It is refused by name
(``kv_cache_dtype``); serving it is a variant of its own. The split form serves the float and
int8-latent caches (CANN's ``npu_kv_rmsnorm_rope_cache`` also has per-channel and rope-quantised
modes, and writes GPT-J input de-interleaved: not served).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import launch_cache, validation, validation_mla
from .split_qkv_rmsnorm_rope import cache_row, cos_sin_rows, grid_dependency, kv_cache_rows, store
from .tiling import mla_plan_for
from .triton_launcher import BoundKernel, interpreted

__all__ = ["PreparedMLA", "mla_q_rope_", "split_qkv_rmsnorm_rope_mla"]


def _new_output(x: torch.Tensor, num_tokens: int, columns: int) -> torch.Tensor:
    """Allocate one output (the tests poison it through this seam); sizes as two integers, as
    :func:`.split_qkv_rmsnorm_rope._new_output` (cheaper to parse than a tuple)."""
    return x.new_empty(num_tokens, columns)


@triton.jit
def _norm_row(src, dst, kv_base, kv_ptr, w_ptr, row_ok, kv_ok, scale_ptr, eps, chunk_stride, WIDTH: tl.constexpr,
              CHUNK: tl.constexpr, CHUNKS: tl.constexpr, KV: tl.constexpr, KV_CHUNK: tl.constexpr,
              KV_QUANT: tl.constexpr):
    """RMS-normalise one row of ``WIDTH`` lanes per token: ``src``/``dst``/``kv_base`` are
    ``[BLOCK_T, 1, 1]`` pointers at each row's lane 0 (the output's, the cache's), ``row_ok`` and
    ``kv_ok`` ``[BLOCK_T, 1, 1]`` masks (a padding slot: ``kv_ok`` off). In ``CHUNKS`` chunks of
    ``CHUNK`` lanes: one is held from load to store; more are squared in a first pass (one
    reduction) and loaded again in the second, chunk ``c + 1`` before chunk ``c`` is stored. With
    ``KV`` each value is also stored into the cache (the output's rounding, then :func:`store`'s
    cast or quantisation)."""
    j = tl.arange(0, CHUNK)
    head = tl.arange(0, 1)
    head_ok = head < 1
    if CHUNKS == 1:
        j_ok = (j < WIDTH)[None, None, :]
        x = tl.load(src + j[None, None, :], mask=row_ok & j_ok, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + j, mask=j < WIDTH, other=0.0).to(tl.float32)
        # x * w before the reduction: with the weight applied after it, ptxas issued q_c's weight
        # loads only once the row was in (SASS of the small plan, Triton 3.7.1), two trips to memory
        # in a row where one will do.
        xw = x * w[None, None, :]
        rstd = tl.rsqrt(tl.sum(x * x, axis=2) / WIDTH + eps)
        y = xw * rstd[:, :, None]
        if KV:
            y = y.to(dst.dtype.element_ty).to(tl.float32)
        store(dst, kv_base, kv_ptr, j, y, row_ok & j_ok, kv_ok & j_ok, scale_ptr, head, head_ok, 1, chunk_stride, True,
               KV, KV_CHUNK, KV_QUANT, False, WIDTH)
    else:
        # The squares summed lane by lane over the chunks, then one reduction: a reduction a chunk
        # (across warps, through shared memory and a barrier) kept each chunk's loads behind the
        # one before's reduction, a trip to memory a chunk (SASS of the large plan, Triton 3.7.1).
        squares = tl.zeros((row_ok.shape[0], 1, CHUNK), dtype=tl.float32)
        for c in tl.static_range(CHUNKS):
            jc = j + c * CHUNK
            xc = tl.load(src + jc[None, None, :], mask=row_ok & (jc < WIDTH)[None, None, :], other=0.0)
            xc = xc.to(tl.float32)
            squares += xc * xc
        rstd = tl.rsqrt(tl.sum(squares, axis=2)[:, :, None] / WIDTH + eps)
        xn = tl.load(src + j[None, None, :], mask=row_ok & (j < WIDTH)[None, None, :], other=0.0)
        wn = tl.load(w_ptr + j, mask=j < WIDTH, other=0.0)
        for c in tl.static_range(CHUNKS):
            jc = j + c * CHUNK
            jc_ok = (jc < WIDTH)[None, None, :]
            xc, wc = xn, wn
            if c + 1 < CHUNKS:
                xn = tl.load(src + (jc + CHUNK)[None, None, :], mask=row_ok & (jc + CHUNK < WIDTH)[None, None, :],
                             other=0.0)
                wn = tl.load(w_ptr + jc + CHUNK, mask=jc + CHUNK < WIDTH, other=0.0)
            y = xc.to(tl.float32) * rstd * wc.to(tl.float32)[None, None, :]
            if KV:
                y = y.to(dst.dtype.element_ty).to(tl.float32)
            store(dst, kv_base, kv_ptr, jc, y, row_ok & jc_ok, kv_ok & jc_ok, scale_ptr, head, head_ok, 1,
                   chunk_stride, True, KV, KV_CHUNK, KV_QUANT, False, WIDTH)


@triton.jit
def _rope_load(src, row_ok, HALF: tl.constexpr, HALF_PAD: tl.constexpr, IS_NEOX: tl.constexpr):
    """The rotary lanes of a ``[BLOCK_T, BLOCK_H]`` block of rows as loaded (``src`` points at each
    row's rotary lane 0, ``[BLOCK_T, BLOCK_H, 1]``): NeoX's two halves, ``[.., HALF_PAD]`` each, or
    GPT-J's pairs as one contiguous block ``[.., 2 * HALF_PAD]`` (returned twice). Loaded apart from
    :func:`_rope_block`'s math so that a caller issues it before any load that waits on another."""
    if IS_NEOX:
        i = tl.arange(0, HALF_PAD)
        i_ok = (i < HALF)[None, None, :]
        a = tl.load(src + i[None, None, :], mask=row_ok & i_ok, other=0.0)
        b = tl.load(src + (i + HALF)[None, None, :], mask=row_ok & i_ok, other=0.0)
    else:
        r = tl.arange(0, 2 * HALF_PAD)
        a = tl.load(src + r[None, None, :], mask=row_ok & (r < 2 * HALF)[None, None, :], other=0.0)
        b = a
    return a, b


@triton.jit
def _rope_block(a, b, dst, kv_base, kv_ptr, row_ok, kv_ok, cos, sin, scale_ptr, chunk_stride, HALF: tl.constexpr,
                HALF_PAD: tl.constexpr, IS_NEOX: tl.constexpr, KV: tl.constexpr, KV_CHUNK: tl.constexpr,
                KV_QUANT: tl.constexpr):
    """Rotate and store the rotary lanes :func:`_rope_load` gave (``a``, ``b``) of a ``[BLOCK_T,
    BLOCK_H]`` block of rows: ``dst`` (may be the source: in place, every load came first) and
    ``kv_base`` point at each row's rotary lane 0 (``[BLOCK_T, BLOCK_H, 1]``), ``cos``/``sin`` are
    ``[BLOCK_T, 1, HALF_PAD]`` fp32. GPT-J's block is viewed as ``[.., HALF_PAD, 2]`` and its pairs
    split in registers. With ``KV`` each value is also stored into the cache, as :func:`_norm_row`
    stores."""
    heads = tl.arange(0, 1)
    heads_ok = heads < 1
    if IS_NEOX:
        i = tl.arange(0, HALF_PAD)
        i_ok = (i < HALF)[None, None, :]
        a = a.to(tl.float32)
        b = b.to(tl.float32)
        ya = a * cos - b * sin
        yb = b * cos + a * sin
        if KV:
            ya = ya.to(dst.dtype.element_ty).to(tl.float32)
            yb = yb.to(dst.dtype.element_ty).to(tl.float32)
        store(dst, kv_base, kv_ptr, i, ya, row_ok & i_ok, kv_ok & i_ok, scale_ptr, heads, heads_ok, 1,
               chunk_stride, True, KV, KV_CHUNK, KV_QUANT, False, 2 * HALF)
        store(dst, kv_base, kv_ptr, i + HALF, yb, row_ok & i_ok, kv_ok & i_ok, scale_ptr, heads, heads_ok, 1,
               chunk_stride, True, KV, KV_CHUNK, KV_QUANT, False, 2 * HALF)
    else:
        r = tl.arange(0, 2 * HALF_PAD)
        r_ok = (r < 2 * HALF)[None, None, :]
        x = tl.reshape(a.to(tl.float32), (a.shape[0], a.shape[1], HALF_PAD, 2))
        second = (tl.arange(0, 2) == 1)[None, None, None, :]
        a = tl.sum(tl.where(second, 0.0, x), axis=3)
        b = tl.sum(tl.where(second, x, 0.0), axis=3)
        y = tl.where(second, (b * cos + a * sin)[:, :, :, None], (a * cos - b * sin)[:, :, :, None])
        y = tl.reshape(y, (y.shape[0], y.shape[1], 2 * HALF_PAD))
        if KV:
            y = y.to(dst.dtype.element_ty).to(tl.float32)
        store(dst, kv_base, kv_ptr, r, y, row_ok & r_ok, kv_ok & r_ok, scale_ptr, heads, heads_ok, 1,
               chunk_stride, True, KV, KV_CHUNK, KV_QUANT, False, 2 * HALF)


@triton.jit
def _cos_sin(cache_ptr, pos, tok_ok, max_position, cache_stride, HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    """The cos and sin rows of the tokens' positions ``pos`` (``[BLOCK_T]``, loaded as a vector,
    clamped into the cache here), ``[BLOCK_T, 1, HALF_PAD]`` fp32 each."""
    i = tl.arange(0, HALF_PAD)
    rows = cache_row(pos, max_position, cache_stride)
    cos, sin = cos_sin_rows(cache_ptr, rows, i, tok_ok[:, None] & (i < HALF)[None, :], HALF)
    return cos[:, None, :], sin[:, None, :]


@triton.jit
def _kv_arm(x_row, kv_c_ptr, k_pe_ptr, kv_w_ptr, cache_ptr, pos_ptr, nope_cache_ptr, rope_cache_ptr, slot_ptr,
            scale_ptr, tok64, tok_ok, max_position, kv_c_stride, k_pe_stride, cache_stride, eps, block_size,
            nope_block_stride, nope_slot_stride, nope_chunk_stride, rope_block_stride, rope_slot_stride,
            rope_chunk_stride, rope_offset, Q_LORA: tl.constexpr, KV_LORA: tl.constexpr, ROPE: tl.constexpr,
            HALF: tl.constexpr, HALF_PAD: tl.constexpr, IS_NEOX: tl.constexpr, KV_CHUNK: tl.constexpr,
            KV_CHUNKS: tl.constexpr, KV_CACHE: tl.constexpr, NOPE_NZ: tl.constexpr, ROPE_NZ: tl.constexpr,
            NOPE_QUANT: tl.constexpr, ROPE_QUANT: tl.constexpr):
    """A token block's kv arm: kv_c's norm, k_pe's rotation, and with ``KV_CACHE`` both stored
    into the cache rows of the tokens' slots (loaded once; negative: padding, nothing stored).
    k_pe's lanes, the positions and the cos/sin rows are loaded before the norm: a warp issues in
    order, so a load placed after the norm's reduction (which waits for kv_c's row) would leave
    only when the row is in, and the longest chain would be three trips to memory (the row, the
    positions, the cos/sin rows) instead of two (SASS of the small-batch plan)."""
    row_ok = tok_ok[:, None, None]
    if KV_CACHE:
        slot = tl.load(slot_ptr + tok64, mask=tok_ok, other=-1)
    else:
        slot = tok64
    if ROPE > 0:
        pe_a, pe_b = _rope_load(x_row + Q_LORA + KV_LORA, row_ok, HALF, HALF_PAD, IS_NEOX)
        pos = tl.load(pos_ptr + tok64, mask=tok_ok, other=0)
        cos, sin = _cos_sin(cache_ptr, pos, tok_ok, max_position, cache_stride, HALF, HALF_PAD)
    nope_rows, kv_tok_ok = kv_cache_rows(slot_ptr, slot, tok64, tok_ok, block_size, nope_block_stride, nope_slot_stride,
                                    0, KV_CACHE, True)
    kv_ok = kv_tok_ok[:, None, None]
    _norm_row(x_row + Q_LORA, kv_c_ptr + (tok64 * kv_c_stride)[:, None, None],
              nope_cache_ptr + nope_rows[:, None, None], nope_cache_ptr, kv_w_ptr, row_ok, kv_ok, scale_ptr, eps,
              nope_chunk_stride, KV_LORA, KV_CHUNK, KV_CHUNKS, KV_CACHE, NOPE_NZ, NOPE_QUANT)
    if ROPE > 0:
        rope_rows, _ = kv_cache_rows(slot_ptr, slot, tok64, tok_ok, block_size, rope_block_stride, rope_slot_stride,
                                rope_offset, KV_CACHE, True)
        _rope_block(pe_a, pe_b, k_pe_ptr + (tok64 * k_pe_stride)[:, None, None],
                    rope_cache_ptr + rope_rows[:, None, None], rope_cache_ptr, row_ok, kv_ok, cos, sin, scale_ptr,
                    rope_chunk_stride, HALF, HALF_PAD, IS_NEOX, KV_CACHE, ROPE_NZ, ROPE_QUANT)


@triton.jit
def _q_arm(q_ptr, tok64, tok_ok, head_block, pos_ptr, cache_ptr, scale_ptr, max_position, q_stride, q_head_stride,
           q_rope_col, cache_stride, NUM_HEADS: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr,
           HALF_PAD: tl.constexpr, IS_NEOX: tl.constexpr):
    """A token block's q heads ``head_block * BLOCK_H ..``: their rotary lanes (from column
    ``q_rope_col``) rotated in place. The lanes are loaded first, then the positions and the
    cos/sin rows that wait on them (the q side's chain: two trips to memory)."""
    head = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    rows_ok = tok_ok[:, None, None] & (head < NUM_HEADS)[None, :, None]
    src = q_ptr + (tok64 * q_stride)[:, None, None] + (head.to(tl.int64) * q_head_stride)[None, :, None] + q_rope_col
    a, b = _rope_load(src, rows_ok, HALF, HALF_PAD, IS_NEOX)
    pos = tl.load(pos_ptr + tok64, mask=tok_ok, other=0)
    cos, sin = _cos_sin(cache_ptr, pos, tok_ok, max_position, cache_stride, HALF, HALF_PAD)
    _rope_block(a, b, src, src, q_ptr, rows_ok, rows_ok, cos, sin, scale_ptr, 0, HALF, HALF_PAD, IS_NEOX, False, 0, 0)


@triton.jit(do_not_specialize=["num_tokens", "max_position"])
def mla_kernel(
    x_ptr, q_ptr, q_c_ptr, kv_c_ptr, k_pe_ptr, q_w_ptr, kv_w_ptr, cache_ptr, pos_ptr,
    nope_cache_ptr, rope_cache_ptr, slot_ptr, scale_ptr,
    num_tokens, max_position, x_stride, q_stride, q_head_stride, q_rope_col, q_c_stride, kv_c_stride, k_pe_stride,
    cache_stride, eps, block_size, nope_block_stride, nope_slot_stride, nope_chunk_stride,
    rope_block_stride, rope_slot_stride, rope_chunk_stride, rope_offset,
    Q_LORA: tl.constexpr, KV_LORA: tl.constexpr, ROPE: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
    IS_NEOX: tl.constexpr, Q_CHUNK: tl.constexpr, Q_CHUNKS: tl.constexpr, KV_CHUNK: tl.constexpr,
    KV_CHUNKS: tl.constexpr, Q_ROPE: tl.constexpr, NUM_HEADS: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr, KV_CACHE: tl.constexpr, NOPE_NZ: tl.constexpr, ROPE_NZ: tl.constexpr,
    NOPE_QUANT: tl.constexpr, ROPE_QUANT: tl.constexpr, PDL: tl.constexpr, ONE_TILE: tl.constexpr,
):
    # The prologue: tile = (token block, arm), the q_c arm first when there is a q latent; without
    # one and with q given (NUM_HEADS > 0), the kv arm then q's blocks of BLOCK_H heads. The q side
    # (Q_ROPE): tile = (token block, block of BLOCK_H heads), q's rotary lanes in place.
    if Q_ROPE:
        HEAD_BLOCKS: tl.constexpr = (NUM_HEADS + BLOCK_H - 1) // BLOCK_H
    else:
        HEAD_BLOCKS: tl.constexpr = (1 if Q_LORA > 0 else 0) + 1 + (NUM_HEADS + BLOCK_H - 1) // BLOCK_H
    num_tiles = tl.cdiv(num_tokens, BLOCK_T) * HEAD_BLOCKS
    if PDL:
        grid_dependency()
    if ONE_TILE:
        # The grid has a program a tile (MLAPlan.grid): a loop of one trip, which leaves LLVM no
        # loop to hoist both arms' address arithmetic out of, ahead of the branch to the arm.
        last, step = tl.minimum(num_tiles, tl.program_id(0) + 1), 1
    else:
        last, step = num_tiles, tl.num_programs(0)
    for tile in range(tl.program_id(0), last, step):
        head_block = tile % HEAD_BLOCKS
        tok = (tile // HEAD_BLOCKS) * BLOCK_T + tl.arange(0, BLOCK_T)
        tok_ok = tok < num_tokens
        tok64 = tok.to(tl.int64)
        x_row = x_ptr + (tok64 * x_stride)[:, None, None]
        if Q_ROPE:
            _q_arm(q_ptr, tok64, tok_ok, head_block, pos_ptr, cache_ptr, scale_ptr, max_position, q_stride,
                   q_head_stride, q_rope_col, cache_stride, NUM_HEADS, BLOCK_H, HALF, HALF_PAD, IS_NEOX)
        elif Q_LORA > 0:
            if head_block == 0:
                _norm_row(x_row, q_c_ptr + (tok64 * q_c_stride)[:, None, None], q_c_ptr, q_c_ptr, q_w_ptr,
                          tok_ok[:, None, None], tok_ok[:, None, None], scale_ptr, eps, 0, Q_LORA, Q_CHUNK, Q_CHUNKS,
                          False, 0, 0)
            else:
                _kv_arm(x_row, kv_c_ptr, k_pe_ptr, kv_w_ptr, cache_ptr, pos_ptr, nope_cache_ptr, rope_cache_ptr,
                        slot_ptr, scale_ptr, tok64, tok_ok, max_position, kv_c_stride, k_pe_stride, cache_stride,
                        eps, block_size, nope_block_stride, nope_slot_stride, nope_chunk_stride, rope_block_stride,
                        rope_slot_stride, rope_chunk_stride, rope_offset, Q_LORA, KV_LORA, ROPE, HALF, HALF_PAD,
                        IS_NEOX, KV_CHUNK, KV_CHUNKS, KV_CACHE, NOPE_NZ, ROPE_NZ, NOPE_QUANT, ROPE_QUANT)
        elif NUM_HEADS > 0:
            # No q latent, so q_proj's output is there already: its rotation rides in this launch.
            if head_block == 0:
                _kv_arm(x_row, kv_c_ptr, k_pe_ptr, kv_w_ptr, cache_ptr, pos_ptr, nope_cache_ptr, rope_cache_ptr,
                        slot_ptr, scale_ptr, tok64, tok_ok, max_position, kv_c_stride, k_pe_stride, cache_stride,
                        eps, block_size, nope_block_stride, nope_slot_stride, nope_chunk_stride, rope_block_stride,
                        rope_slot_stride, rope_chunk_stride, rope_offset, Q_LORA, KV_LORA, ROPE, HALF, HALF_PAD,
                        IS_NEOX, KV_CHUNK, KV_CHUNKS, KV_CACHE, NOPE_NZ, ROPE_NZ, NOPE_QUANT, ROPE_QUANT)
            else:
                _q_arm(q_ptr, tok64, tok_ok, head_block - 1, pos_ptr, cache_ptr, scale_ptr, max_position, q_stride,
                       q_head_stride, q_rope_col, cache_stride, NUM_HEADS, BLOCK_H, HALF, HALF_PAD, IS_NEOX)
        else:
            _kv_arm(x_row, kv_c_ptr, k_pe_ptr, kv_w_ptr, cache_ptr, pos_ptr, nope_cache_ptr, rope_cache_ptr,
                    slot_ptr, scale_ptr, tok64, tok_ok, max_position, kv_c_stride, k_pe_stride, cache_stride,
                    eps, block_size, nope_block_stride, nope_slot_stride, nope_chunk_stride, rope_block_stride,
                    rope_slot_stride, rope_chunk_stride, rope_offset, Q_LORA, KV_LORA, ROPE, HALF, HALF_PAD,
                    IS_NEOX, KV_CHUNK, KV_CHUNKS, KV_CACHE, NOPE_NZ, ROPE_NZ, NOPE_QUANT, ROPE_QUANT)


def split_qkv_rmsnorm_rope_mla(qkv_lora, q_a_weight, kv_a_weight, cos_sin_cache, positions, q_lora_rank,
                               kv_lora_rank, rope_dim, eps=1e-6, *, is_neox=False, kv_cache=None,
                               slot_mapping=None, kv_cache_dtype="auto", k_scale=None, cache_layout="nd", q=None):
    """Split the fused MLA latent projection, RMS-normalise q_c and kv_c, rotate k_pe, optionally
    write the MLA cache and, without a q latent, rotate q in place: one kernel, one launch.

    Parameters
    ----------
    qkv_lora : torch.Tensor
        ``[T, q_lora_rank + kv_lora_rank + rope_dim]`` (``q_c | kv_c | k_pe``), bf16, fp16 or fp32;
        last dim contiguous, row stride may be larger than the width (a view).
    q_a_weight : torch.Tensor or None
        ``[q_lora_rank]``, ``q_a_layernorm``'s weight; ``None`` exactly when ``q_lora_rank == 0``.
    kv_a_weight : torch.Tensor
        ``[kv_lora_rank]``, ``kv_a_layernorm``'s weight.
    cos_sin_cache : torch.Tensor or None
        ``[max_position, rope_dim]`` (cos half, then sin half; DeepSeek's YaRN cache as vLLM builds
        it), fp32, bf16 or fp16; ``None`` allowed with ``rope_dim == 0``.
    positions : torch.Tensor or None
        ``[T]`` int32 or int64, clamped into the cache; ``None`` allowed with ``rope_dim == 0``.
    q_lora_rank, kv_lora_rank, rope_dim : int
        ``Lq >= 0`` (0: no q latent, DeepSeek-V2-Lite), ``Lkv >= 1``, even ``R >= 0`` (0: no RoPE).
    eps : float
        RMSNorm epsilon of both norms.
    is_neox : bool
        ``False`` (DeepSeek): GPT-J pairs ``(2i, 2i+1)``; ``True``: NeoX halves.
    kv_cache : torch.Tensor or tuple of torch.Tensor, optional
        vLLM's ``[num_blocks, block_size, Lkv + R]``, or vllm-ascend's ``(nope_cache, rope_cache)``
        in ``cache_layout`` (module docstring; ``rope_cache`` ``None`` with ``R == 0``).
    slot_mapping : torch.Tensor, optional
        With ``kv_cache``: ``[T]`` or longer (the first ``T`` are read), int32 or int64, contiguous;
        negative = padding, nothing written. Slots must lie below ``num_blocks * block_size`` (not
        checked on the device: that would need a host sync).
    kv_cache_dtype : str
        ``"auto"`` (a float cache: a cast), ``"fp8"``/``"fp8_e4m3"`` (the combined cache, uint8 or
        float8_e4m3fn), ``"int8"`` (the split form's latent; the rope cache stays float).
        ``"fp8_ds_mla"`` is refused (module docstring).
    k_scale : torch.Tensor, optional
        One fp32 value, only with ``"fp8"`` / ``"int8"`` (required there): the cache holds
        ``y / k_scale``.
    cache_layout : str
        ``"nd"`` or ``"nz"`` (the split form only).
    q : torch.Tensor, optional
        Only without a q latent (``q_lora_rank == 0``, DeepSeek-V2-Lite: q is ``q_proj``'s output,
        there before the prologue) and with ``rope_dim > 0``: ``[T, H, D]`` in qkv_lora's dtype, as
        :func:`mla_q_rope_` takes it; ``q[..., D - R:]`` is rotated in place in the same launch
        (``mla_q_rope_`` is then not called). With a q latent ``q_b_proj`` sits between: rotate its
        output with ``mla_q_rope_``.

    Returns
    -------
    q_c, kv_c_normed, k_pe : torch.Tensor
        New contiguous ``[T, Lq]``, ``[T, Lkv]``, ``[T, R]`` in qkv_lora's dtype (``q``, when
        given, is rotated in place).

    Raises
    ------
    ValueError
        On a bad argument, naming it (:func:`.validation_mla.split_qkv_rmsnorm_rope_mla`); on CPU
        tensors without Triton's interpreter.
    """
    return launch_cache.prepared(_CACHE, locals(), validation_mla.split_qkv_rmsnorm_rope_mla, PreparedMLA,
                                 TOKEN_KEYS).run_prologue(locals())


#: The arguments whose sizes include the token count, and their part of the key.
TOKEN_KEYS = {"qkv_lora": launch_cache.rows_key, "positions": launch_cache.positions_key,
              "slot_mapping": launch_cache.slots_key, "q": launch_cache.rows_key}
Q_TOKEN_KEYS = {"q": launch_cache.rows_key, "positions": launch_cache.positions_key}
_CACHE = launch_cache.LaunchCache("split_qkv_rmsnorm_rope_mla")
_Q_CACHE = launch_cache.LaunchCache("mla_q_rope_")

#: Sources of a launch (:class:`~.triton_launcher.BoundKernel`): the call's tensors by index.
X, Q_C, KV_C, K_PE, Q_W, KV_W, COS_SIN, POS, NOPE, ROPE, SLOTS, SCALE, Q = range(13)


class PreparedMLA(launch_cache.PlannedLaunches):
    """A validated call of the MLA kernel (the prologue or the q side) for every token count: the
    launch cache's entry. The plan is picked per token count (:func:`~.tiling.mla_plan_for`: on
    CUDA the prologue's small-batch plan or the large one) and kept with its grid; the kernel is
    bound on the first launch of each plan.

    Parameters
    ----------
    call : vllm_ascend_ext.ops.validation_mla.MLACall
        What the validator returned.
    args : dict
        The first call's arguments by name (``qkv_lora`` or ``q`` gives the device).
    """

    def __init__(self, call: validation_mla.MLACall, args: dict):
        self.call = call
        x = args["qkv_lora"] if "qkv_lora" in args else args["q"]
        self.device = x.device
        self.launches = x.device.type != "meta"
        validation.check_runnable(x.device, interpreted(mla_kernel))
        self._init_launches()
        #: The kernel's arguments (tensors by source index, scalars) of this entry's launch.
        self._arguments = PreparedMLA._q_rope_arguments if call.shape.q_rope else PreparedMLA._prologue_arguments

    def tokens_agree(self, args: dict) -> bool:
        """Whether positions, slot mapping and (with the prologue's) q hold the call's token count
        (the key leaves it out)."""
        x = args["qkv_lora"] if "qkv_lora" in args else args["q"]
        tokens = x.shape[0]
        positions, slots, q = args.get("positions"), args.get("slot_mapping"), args.get("q")
        return ((positions is None or positions.shape[-1] == tokens)
                and (slots is None or slots.shape[0] >= tokens) and (q is None or q.shape[0] == tokens))

    def _plan(self, num_tokens: int):
        return mla_plan_for(self.device, self.call.shape, num_tokens)

    def _bind(self, plan, grid: int, sources: tuple, num_tokens: int) -> BoundKernel:
        tensors, scalars = self._arguments(self, sources)
        return BoundKernel(mla_kernel, tensors, dict(scalars, num_tokens=num_tokens, **constexprs(self.call, plan),
                                                     **plan.launch_options),
                           sources, runtime=("num_tokens",), grid=grid)

    def _launch(self, sources: tuple, tokens: int) -> None:
        """The kernel on ``sources`` for ``tokens`` tokens."""
        launch = self._per_tokens.get(tokens)
        if launch is None:
            launch = self.bound_for(tokens, sources)
        grid, bound = launch
        bound(grid, sources, (tokens,))

    def run_prologue(self, args: dict):
        """``split_qkv_rmsnorm_rope_mla`` on ``args``: ``(q_c, kv_c_normed, k_pe)``."""
        call, x = self.call, args["qkv_lora"]
        shape, cache, tokens = call.shape, call.cache, x.shape[0]
        q_c = _new_output(x, tokens, shape.q_lora_rank)
        kv_c = _new_output(x, tokens, shape.kv_lora_rank)
        k_pe = _new_output(x, tokens, shape.rope_dim)
        if tokens == 0 or not self.launches:
            return q_c, kv_c, k_pe
        kv_cache = args["kv_cache"]
        nope_cache = rope_cache = None
        if cache is not None:
            if cache.form == "combined":
                nope_cache = rope_cache = kv_cache.view(torch.float8_e4m3fn) if cache.uint8_fp8 else kv_cache
            else:
                nope_cache, rope_cache = kv_cache
                rope_cache = nope_cache if rope_cache is None else rope_cache
        cos_sin, positions = args["cos_sin_cache"], args["positions"]
        sources = (x, q_c, kv_c, k_pe, args["q_a_weight"], args["kv_a_weight"], cos_sin, positions, nope_cache,
                   rope_cache, args["slot_mapping"], args["k_scale"], args["q"])
        self._launch(sources, tokens)
        return q_c, kv_c, k_pe

    def run_q_rope(self, args: dict):
        """``mla_q_rope_`` on ``args``: ``q``, rotated in place."""
        q = args["q"]
        tokens = q.shape[0]
        if tokens == 0 or not self.launches:
            return q
        cos_sin, positions = args["cos_sin_cache"], args["positions"]
        sources = (q, None, None, None, None, None, cos_sin, positions, None, None, None, None, None)
        self._launch(sources, tokens)
        return q

    def _prologue_arguments(self, sources: tuple) -> tuple[dict, dict]:
        """The prologue's kernel arguments: tensors by source index, and scalars."""
        call, x, kv_c = self.call, sources[X], sources[KV_C]
        shape, cache, q_c, k_pe, cos_sin = call.shape, call.cache, sources[Q_C], sources[K_PE], sources[COS_SIN]
        nope, rope = (cache.nope, cache.rope) if cache is not None else (None, None)
        q = sources[Q]
        tensors = dict(
            x_ptr=X, q_ptr=Q if shape.q_arms else X, q_c_ptr=Q_C if shape.q_lora_rank else KV_C, kv_c_ptr=KV_C,
            k_pe_ptr=K_PE if shape.rope_dim else KV_C, q_w_ptr=KV_W if sources[Q_W] is None else Q_W,
            kv_w_ptr=KV_W, cache_ptr=COS_SIN if shape.rope_dim else X,
            pos_ptr=POS if shape.rope_dim else SLOTS if cache is not None else KV_W,
            nope_cache_ptr=X if cache is None else NOPE, rope_cache_ptr=X if cache is None else ROPE,
            slot_ptr=KV_W if cache is None else SLOTS, scale_ptr=KV_W if sources[SCALE] is None else SCALE)
        scalars = dict(
            max_position=cos_sin.shape[0] if shape.rope_dim else 1,
            x_stride=x.stride(0), q_stride=q.stride(0) if shape.q_arms else 0,
            q_head_stride=q.stride(1) if shape.q_arms else 0,
            q_rope_col=shape.head_dim - shape.rope_dim if shape.q_arms else 0,
            q_c_stride=q_c.stride(0), kv_c_stride=kv_c.stride(0), k_pe_stride=k_pe.stride(0),
            cache_stride=cos_sin.stride(0) if shape.rope_dim else 0, eps=call.eps,
            block_size=nope.block_size if nope else 1,
            nope_block_stride=nope.block if nope else 0, nope_slot_stride=nope.slot if nope else 0,
            nope_chunk_stride=nope.chunk if nope else 0,
            rope_block_stride=rope.block if rope else 0, rope_slot_stride=rope.slot if rope else 0,
            rope_chunk_stride=rope.chunk if rope else 0, rope_offset=rope.offset if rope else 0)
        return tensors, scalars

    def _q_rope_arguments(self, sources: tuple) -> tuple[dict, dict]:
        """The q side's kernel arguments: tensors by source index, and scalars."""
        q, cos_sin = sources[X], sources[COS_SIN]
        tensors = dict(x_ptr=X, q_ptr=X, q_c_ptr=X, kv_c_ptr=X, k_pe_ptr=X, q_w_ptr=X, kv_w_ptr=X,
                       cache_ptr=COS_SIN, pos_ptr=POS, nope_cache_ptr=X, rope_cache_ptr=X, slot_ptr=POS,
                       scale_ptr=COS_SIN)
        shape = self.call.shape
        scalars = dict(
            max_position=cos_sin.shape[0], x_stride=q.stride(0), q_stride=q.stride(0), q_head_stride=q.stride(1),
            q_rope_col=shape.head_dim - shape.rope_dim, q_c_stride=0, kv_c_stride=0, k_pe_stride=0,
            cache_stride=cos_sin.stride(0), eps=0.0, block_size=1, nope_block_stride=0, nope_slot_stride=0,
            nope_chunk_stride=0, rope_block_stride=0, rope_slot_stride=0, rope_chunk_stride=0, rope_offset=0)
        return tensors, scalars


def mla_q_rope_(q, cos_sin_cache, positions, rope_dim, *, is_neox=False):
    """Rotate ``q[..., D - rope_dim:]`` in place: MLA's q side after ``q_b_proj`` (the MLA kernel's
    ``Q_ROPE`` variant). ``q[..., :D - rope_dim]`` (q_nope) is neither read nor written.

    Parameters
    ----------
    q : torch.Tensor
        ``[T, H, D]``, bf16, fp16 or fp32, lanes contiguous, token and head strides free (rows
        must not overlap): ``q_b_proj``'s output viewed per head, or a strided view of it.
    cos_sin_cache : torch.Tensor
        ``[max_position, rope_dim]``, cos half then sin half.
    positions : torch.Tensor
        ``[T]`` int32 or int64, clamped into the cache.
    rope_dim : int
        Even, ``2 <= rope_dim <= D``.
    is_neox : bool
        ``False`` (DeepSeek): GPT-J pairs; ``True``: NeoX halves.

    Returns
    -------
    torch.Tensor
        ``q`` itself, rotated.

    Raises
    ------
    ValueError
        On a bad argument, naming it (:func:`.validation_mla.mla_q_rope_`).
    """
    return launch_cache.prepared(_Q_CACHE, locals(), validation_mla.mla_q_rope_, PreparedMLA,
                                 Q_TOKEN_KEYS).run_q_rope(locals())


def constexprs(call: validation_mla.MLACall, plan) -> dict:
    """The kernel's compile-time arguments for one validated call and plan."""
    shape, cache = call.shape, call.cache
    return dict(
        Q_LORA=shape.q_lora_rank, KV_LORA=shape.kv_lora_rank, ROPE=shape.rope_dim, HALF=shape.half,
        HALF_PAD=shape.half_pad, IS_NEOX=shape.is_neox, Q_CHUNK=plan.q_chunk, Q_CHUNKS=plan.q_chunks(shape),
        KV_CHUNK=plan.kv_chunk, KV_CHUNKS=plan.kv_chunks(shape), Q_ROPE=shape.q_rope, NUM_HEADS=shape.num_heads,
        BLOCK_T=plan.block_tokens, BLOCK_H=plan.block_heads, KV_CACHE=cache is not None,
        # NZ: lanes of one fractal column of each cache (0: lanes contiguous), compile-time as the
        # GQA cache write's KV_CHUNK.
        NOPE_NZ=cache.nope.chunk_width if cache else 0, ROPE_NZ=cache.rope.chunk_width if cache else 0,
        NOPE_QUANT=cache.nope_quant if cache else 0, ROPE_QUANT=cache.rope_quant if cache else 0,
        PDL=plan.dependent_launch, ONE_TILE=plan.one_tile,
    )


def signature(dtype: str, cos_sin_dtype: str, nope_dtype: str | None = None, rope_dtype: str | None = None) -> dict:
    """The kernel's run-time argument types, for compiling ahead of time (the compile checks):
    ``dtype`` of qkv_lora / q, the outputs and weights, ``cos_sin_dtype`` of the cos/sin cache,
    ``nope_dtype`` / ``rope_dtype`` of the caches (default ``dtype``), in Triton's spelling;
    positions and slots int64, the scale fp32."""
    t = f"*{dtype}"
    return {
        "x_ptr": t, "q_ptr": t, "q_c_ptr": t, "kv_c_ptr": t, "k_pe_ptr": t, "q_w_ptr": t, "kv_w_ptr": t,
        "cache_ptr": f"*{cos_sin_dtype}", "pos_ptr": "*i64", "nope_cache_ptr": f"*{nope_dtype or dtype}",
        "rope_cache_ptr": f"*{rope_dtype or nope_dtype or dtype}", "slot_ptr": "*i64", "scale_ptr": "*fp32",
        "num_tokens": "i32", "max_position": "i32", "x_stride": "i32", "q_stride": "i32", "q_head_stride": "i32",
        "q_rope_col": "i32",
        "q_c_stride": "i32", "kv_c_stride": "i32", "k_pe_stride": "i32", "cache_stride": "i32", "eps": "fp32",
        "block_size": "i32", "nope_block_stride": "i32", "nope_slot_stride": "i32", "nope_chunk_stride": "i32",
        "rope_block_stride": "i32", "rope_slot_stride": "i32", "rope_chunk_stride": "i32", "rope_offset": "i32",
    }
