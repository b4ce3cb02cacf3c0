"""Ascend launch plans: tiles sized for the Unified Buffer, a grid of vector cores.

The UB model (:func:`ub_buffers`) lists every buffer a tile keeps live on a vector core, by name
and bytes; ``docs/ascend-ub-model.md`` explains each and ``python -m
vllm_ascend_ext.ops.ascend_lowering`` checks it against what triton-ascend's lowering allocates.
The plan does not depend on the token count: one compiled kernel per layer geometry.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .base import KernelShape, MLAPlan, MLAShape, PlanBase, SumsPlan, next_pow2, prev_pow2, q_arm_heads
from ..device import AscendFacts

__all__ = ["AscendPlan", "UbBuffer", "arm_width", "branch_arms", "mla_plan", "mla_ub_buffers", "plan", "rope_axes",
           "sums_plan", "sums_ub_buffers", "ub_budget", "ub_buffers"]

#: Copies from global memory are multi-buffered by the compiler (triton-ascend's ``multibuffer``,
#: on by default for A2/A3; TQue depth 2 in AscendC) so the next tile's copy-in overlaps this
#: tile's math and the previous tile's copy-out: each such buffer exists twice.
MULTIBUFFER = 2
#: UB kept out of the model for the compiler's own scratch (reduction temporaries, index
#: vectors, alignment padding): 1/8 of the 192 KiB UB of A2/A3.
UB_RESERVE_FRACTION = 0.125
#: Heads per tile at most, and how much head padding is tolerated (see block_heads_for).
MAX_BLOCK_HEADS = 64
MAX_HEAD_WASTE = 1.125
#: Tokens per tile at most: beyond 64 the per-tile fixed cost (one cos/sin gather of BLOCK_T
#: rows, loop control) is amortised, and larger tiles only idle cores at medium token counts.
MAX_BLOCK_TOKENS = 64
#: Tokens per tile at least: with BLOCK_T = 1 the token axis of every block is a size-1 dim
#: that triton-ascend 3.2's pointer analysis rejects ("AddPtrOp produced by unsupported
#: operation", seen lowering 32/32/96), so heads per tile shrink before tokens drop to 1.
MIN_BLOCK_TOKENS = 2
FP32 = 4
POSITION_BYTES = 8
#: Slots are int64 in the kernel (int32 ``slot_mapping`` is widened as it is loaded).
SLOT_BYTES = 8
MASK_BYTES = 1
#: The KV-cache write is modelled at its widest form, whatever cache dtype a call has (the plan,
#: cached per :class:`KernelShape`, knows only ``kv_cache``): an int8 cache quantised per channel
#: (the fp32 quotient, the broadcast scales, the int8 tile multibuffered: 4 + 4 + 2 x 1 bytes per
#: element), which bounds a bf16/fp16 cache (its cast tile, 2 x 2 bytes) and an fp32 one (the
#: fp32 result double-buffered, 2 x 4 bytes). fp8 caches are CUDA-only: triton-ascend 3.2 has no
#: fp8 type.
KV_QUANT_BYTES = 1


def branch_arms(shape: KernelShape) -> tuple[str, ...]:
    """The arms of the kernel's head-block branch that a layer compiles: q, then k (not in a
    q-only layer), the gate's (``q_gate``) and v's (``v_norm``, or a KV-cache write). The linalg output allocates
    each arm's tile buffers separately, and whether bishengir later folds exclusive arms into one
    buffer is not visible without CANN, so the model counts every arm's copies from global
    memory (and one arm's vector buffers: one arm runs at a time)."""
    return ("q",) + (("k",) if shape.num_kv_heads else ()) + (("gate",) if shape.q_gate else ()) \
        + (("v",) if shape.writes_v else ())


def rope_axes(shape: KernelShape) -> int:
    """Position axes whose cos/sin rows a tile gathers: 3 with mRoPE (t, h, w), else 1."""
    return 3 if shape.mrope else 1


def block_heads_for(shape: KernelShape, cap: int, max_waste: float) -> int:
    """Heads per tile: the largest power of two <= ``cap`` whose padding stays within ``max_waste``.

    q's heads and k's are covered separately in blocks of a power of two (a block never holds
    both), the last block of each padded. ``max_waste`` bounds padded heads / real heads: 64 q +
    4 k heads in blocks of 16 pad to 64 + 16 (1.18), in blocks of 4 to 68 (1.0). Falls back to
    1 head, which never pads.
    """
    block = min(next_pow2(max(shape.num_q_heads, shape.num_kv_heads)), cap)
    while block > 1 and shape.head_blocks(block) * block / shape.tiled_heads > max_waste:
        block //= 2
    return block


@dataclass(frozen=True)
class UbBuffer:
    """One buffer a tile keeps live in the UB.

    ``source`` is ``"gm"`` for copies from global memory (what triton-ascend's linalg output
    allocates explicitly, ``memref.alloc``), ``"multibuffer"`` for their second copy, and
    ``"vector"`` for values computed in the UB (bufferized later, by bishengir).
    """

    name: str
    nbytes: int
    source: str
    #: Modelled at the widest form it comes in (the weights at fp32, the scales per channel), not
    #: at what a given variant allocates: the lowering check allows the lowering less of these.
    worst_case: bool = False


@dataclass(frozen=True)
class AscendPlan(PlanBase):
    """An Ascend launch: grid = vector cores, tiles that fit the UB by :func:`ub_buffers`."""

    ub_buffers: tuple[UbBuffer, ...]
    ub_capacity: int

    @property
    def ub_bytes(self) -> int:
        """Bytes the model says a tile keeps live."""
        return sum(buf.nbytes for buf in self.ub_buffers)

    def ub_bytes_from(self, source: str) -> int:
        """Bytes of the buffers of one ``source`` kind."""
        return sum(buf.nbytes for buf in self.ub_buffers if buf.source == source)


def arm_width(shape: KernelShape, arm: str) -> int:
    """Lanes a head occupies in an arm's tile: q and k hold two rotary halves and the tail, each
    padded to a power of two (``shape.padded_head_dim``); the gate and v arms, which do not
    rotate, hold whole rows of ``D`` padded to a power of two (the kernel's ``_row_load``)."""
    return shape.padded_head_dim if arm in ("q", "k") else next_pow2(shape.head_dim)


def ub_buffers(shape: KernelShape, block_tokens: int, block_heads: int) -> tuple[UbBuffer, ...]:
    """The UB a tile of ``block_tokens`` x ``block_heads`` keeps live, buffer by buffer.

    A head occupies :func:`arm_width` lanes in the arm that holds it; the values computed in the
    UB are sized for the widest arm (one arm runs at a time). With ``shape.kv_cache`` the v
    arm's tile, the slots, the per-channel scales and the cache store's buffers are added, at
    the widest cache form (:data:`KV_QUANT_BYTES`). ``docs/ascend-ub-model.md`` gives the reason
    for every line.
    """
    rows = block_tokens * block_heads
    head = shape.padded_head_dim
    rot = 2 * shape.half_pad
    arms = branch_arms(shape)
    widths = {arm: arm_width(shape, arm) for arm in arms}
    widest = max(widths.values())
    axes = rope_axes(shape)
    normed = 2 if shape.num_kv_heads else 1  # q and k carry a weight and a bias, v and the gate none
    axis_names = " (t, h, w axes)" if shape.mrope else ""
    # NeoX halves are two disjoint blocks of the row; GPT-J's pairs are one contiguous block of
    # the rotary lanes, split in registers: either way the row is read once per arm.
    gm = (
        UbBuffer(f"qkv tile ({' + '.join(arms)} arm{'s' if len(arms) > 1 else ''})",
                 sum(widths.values()) * rows * shape.elem_bytes, "gm"),
        UbBuffer("cos/sin rows" + axis_names, axes * block_tokens * rot * shape.cache_bytes, "gm"),
        UbBuffer("positions" + axis_names, axes * block_tokens * POSITION_BYTES, "gm"),
        # q's (and k's) weight and bias, in each arm that uses them; fp32 is the widest they come in.
        # Normalised across heads, the weights are H*D values: a tile loads [block_heads, D] of them
        # (no bias), and each arm loads its tokens' [T, 2] sums of squares.
        (UbBuffer("weights [block_heads, D] (q + k arms)", normed * block_heads * head * FP32, "gm",
                  worst_case=True) if shape.norm_across_heads else
         UbBuffer("weights + biases", 2 * normed * head * FP32, "gm", worst_case=True)),
    )
    # Copied anew for every tile, hence multibuffered: the qkv tile, the cos/sin rows, the
    # positions, and with the cache write the slots (and the sums of squares when normalised
    # across heads).
    per_tile = gm[:3]
    if shape.norm_across_heads:
        sums = UbBuffer("sums of squares (q + k arms)", normed * block_tokens * FP32, "gm")
        gm += (sums,)
        per_tile += (sums,)
    vector_kv: tuple[UbBuffer, ...] = ()
    if shape.kv_cache:
        cache_lanes = widths["k"] + widths["v"]
        kv_gm = (
            # Each arm writing the cache (k, v) loads the tile's slots as a vector of its own.
            UbBuffer("slots (k + v arms)", 2 * block_tokens * SLOT_BYTES, "gm"),
            # Per-channel int8 scales: each cache arm loads [block_heads, lanes] fp32 for its
            # stores (no token axis). Modelled for every cache dtype: per tensor it is a scalar.
            UbBuffer("per-channel scales (k + v arms)", cache_lanes * block_heads * FP32, "gm", worst_case=True),
        )
        gm += kv_gm
        per_tile += kv_gm[:1]
        vector_kv = (
            UbBuffer("cache row offsets (int64)", block_tokens * SLOT_BYTES, "vector"),
            UbBuffer("quantised fp32 (y / scale, saturated, rounded)", rows * widest * FP32, "vector"),
            UbBuffer("per-channel scales broadcast fp32", rows * widest * FP32, "vector"),
            UbBuffer("cache tile (int8, multibuffered)", MULTIBUFFER * rows * widest * KV_QUANT_BYTES, "vector"),
            UbBuffer("cache store masks", rows * widest * MASK_BYTES, "vector"),
        )
    second = tuple(UbBuffer(f"{buf.name} (2nd buffer)", buf.nbytes, "multibuffer")
                   for buf in per_tile for _ in range(MULTIBUFFER - 1))
    # With mRoPE each axis's rows are upcast, then every lane picks its axis's value: three
    # upcast blocks and the selected one.
    cos_sin = (axes + (1 if shape.mrope else 0)) * block_tokens * rot * FP32
    vector = (
        UbBuffer("x fp32", rows * widest * FP32, "vector"),
        UbBuffer("normalised / rotated fp32", rows * widest * FP32, "vector"),
        UbBuffer("out tile (dtype, multibuffered)", MULTIBUFFER * rows * widest * shape.elem_bytes, "vector"),
        UbBuffer("cos/sin fp32" + (" (3 axes + per-lane selection)" if shape.mrope else ""), cos_sin, "vector"),
        UbBuffer("sum of squares, rstd", 2 * rows * FP32, "vector"),
        UbBuffer("masks", rows * widest * MASK_BYTES, "vector"),
    ) + vector_kv
    return gm + second + vector


def ub_budget(facts: AscendFacts) -> int:
    """UB bytes a tile's modelled buffers may take: the capacity less the compiler's reserve."""
    return int(facts.ub_bytes * (1 - UB_RESERVE_FRACTION))


@functools.lru_cache(maxsize=None)
def plan(shape: KernelShape, facts: AscendFacts) -> AscendPlan:
    """The Ascend plan for one layer geometry on one NPU (pure: same inputs, same plan).

    Heads per tile first (as many as pad little), then the most tokens per tile whose buffers
    fit the UB less the reserve; if not even ``MIN_BLOCK_TOKENS`` fit, fewer heads.

    Raises
    ------
    ValueError
        If not even ``MIN_BLOCK_TOKENS`` tokens of one head fit the UB.
    """
    budget = ub_budget(facts)
    block_heads = block_heads_for(shape, MAX_BLOCK_HEADS, MAX_HEAD_WASTE)

    def fits(tokens: int, heads: int) -> bool:
        return sum(buf.nbytes for buf in ub_buffers(shape, tokens, heads)) <= budget

    while block_heads > 1 and not fits(MIN_BLOCK_TOKENS, block_heads):
        block_heads //= 2
    if not fits(MIN_BLOCK_TOKENS, block_heads):
        raise ValueError(f"{MIN_BLOCK_TOKENS} tokens of one head of {shape} do not fit "
                         f"{budget} bytes of UB")
    block_tokens = MIN_BLOCK_TOKENS
    while block_tokens < MAX_BLOCK_TOKENS and fits(2 * block_tokens, block_heads):
        block_tokens *= 2
    return AscendPlan(
        block_tokens=block_tokens, block_heads=block_heads, max_programs=facts.num_vector_cores,
        ub_buffers=ub_buffers(shape, block_tokens, block_heads), ub_capacity=facts.ub_bytes,
    )


#: Columns per chunk of the sums-of-squares kernel at most (q's 6144 columns of MiniMax-M2 at TP 1
#: go in 6 chunks).
MAX_SUMS_COLS = 1024


def sums_ub_buffers(shape: KernelShape, block_tokens: int, cols_q: int, cols_k: int) -> tuple[UbBuffer, ...]:
    """The UB a tile of ``split_qkv_tp_rmsnorm_rope``'s first kernel keeps live: a chunk of q's
    columns and one of k's (each loop's load is its own copy from global memory, multibuffered),
    the fp32 upcast and the running sum of squares of the wider chunk, masks, and the ``[BT, 2]``
    fp32 sums stored (``docs/ascend-ub-model.md``)."""
    widest = max(cols_q, cols_k)
    rows = block_tokens * widest
    gm = (UbBuffer("qkv chunk (q loop)", block_tokens * cols_q * shape.elem_bytes, "gm"),
          UbBuffer("qkv chunk (k loop)", block_tokens * cols_k * shape.elem_bytes, "gm"))
    second = tuple(UbBuffer(f"{buf.name} (2nd buffer)", buf.nbytes, "multibuffer") for buf in gm
                   for _ in range(MULTIBUFFER - 1))
    vector = (
        UbBuffer("x fp32", rows * FP32, "vector"),
        UbBuffer("running x**2 fp32", rows * FP32, "vector"),
        UbBuffer("masks", rows * MASK_BYTES, "vector"),
        UbBuffer("sums [BT, 2] fp32 (multibuffered)", MULTIBUFFER * block_tokens * 2 * FP32, "vector"),
    )
    return gm + second + vector


@functools.lru_cache(maxsize=None)
def sums_plan(shape: KernelShape, facts: AscendFacts) -> SumsPlan:
    """The Ascend plan of the sums-of-squares kernel: q's and k's columns in chunks of at most
    :data:`MAX_SUMS_COLS` (each padded to a power of two), the most tokens per tile (up to
    :data:`MAX_BLOCK_TOKENS`) that fit the UB budget, a grid of vector cores.

    Raises
    ------
    ValueError
        If not even ``MIN_BLOCK_TOKENS`` tokens fit.
    """
    budget = ub_budget(facts)
    cols_q = min(next_pow2(shape.num_q_heads * shape.head_dim), MAX_SUMS_COLS)
    cols_k = min(next_pow2(max(1, shape.num_kv_heads) * shape.head_dim), MAX_SUMS_COLS)

    def fits(tokens: int) -> bool:
        return sum(buf.nbytes for buf in sums_ub_buffers(shape, tokens, cols_q, cols_k)) <= budget

    if not fits(MIN_BLOCK_TOKENS):
        raise ValueError(f"{MIN_BLOCK_TOKENS} tokens of the sums kernel of {shape} do not fit {budget} bytes of UB")
    tokens = MIN_BLOCK_TOKENS
    while tokens < MAX_BLOCK_TOKENS and fits(2 * tokens):
        tokens *= 2
    return SumsPlan(block_tokens=tokens, block_cols_q=cols_q, block_cols_k=cols_k,
                    max_programs=facts.num_vector_cores, ub_buffers=sums_ub_buffers(shape, tokens, cols_q, cols_k),
                    ub_capacity=facts.ub_bytes)


#: Lanes of a latent row the MLA prologue holds at once at most: kv_c's 512 lanes whole, and
#: q_c's 1536 (DeepSeek-V3, Kimi-K2) as three exact chunks of 512 (one chunk would pad it to 2048,
#: 33% more UB for nothing; chunks of 1024 would pad to 2048 too).
MLA_MAX_ROW_CHUNK = 512
#: The MLA cache store is modelled at its widest: fp32 (a bf16/fp16 cache casts to 2 bytes, fp8 and
#: int8 to 1; the quotient of a quantised store is the fp32 buffer beside it).
MLA_CACHE_BYTES = FP32


def mla_row_chunk(width: int) -> int:
    """Lanes per chunk of a latent row of ``width`` lanes: the row padded to a power of two when that
    is at most :data:`MLA_MAX_ROW_CHUNK`, else the largest power of two <= it dividing the row
    into the fewest padded lanes (1536 -> 3 x 512)."""
    if width <= MLA_MAX_ROW_CHUNK:
        return next_pow2(width)
    best = MLA_MAX_ROW_CHUNK
    chunk = MLA_MAX_ROW_CHUNK
    while chunk >= 64:
        if -(-width // chunk) * chunk < -(-width // best) * best:
            best = chunk
        chunk //= 2
    return best


def mla_ub_buffers(shape: MLAShape, block_tokens: int, block_heads: int, q_chunk: int,
                   kv_chunk: int) -> tuple[UbBuffer, ...]:
    """The UB a tile of the MLA kernel keeps live, buffer by buffer (``docs/ascend-ub-model.md``,
    section "The MLA prologue"): the copies from global memory of every arm (the q_c arm's row
    chunks, both passes; the kv arm's chunks, k_pe's rotary lanes, the cos/sin rows, positions and
    slots; without a q latent, q's rotary lanes of ``block_heads`` heads where the prologue rotates
    q too; or the q side's rotary lanes of ``block_heads`` heads), their second buffers, and the
    vector buffers of the widest arm."""
    bt, e, c = block_tokens, shape.elem_bytes, shape.cache_bytes
    rot = 2 * shape.half_pad if shape.rope_dim else 0
    gm: tuple[UbBuffer, ...] = ()
    per_tile: tuple[UbBuffer, ...] = ()
    widths = []

    def row(name: str, width: int, chunk: int) -> None:
        nonlocal gm, per_tile
        chunks = MLAPlan.chunks(width, chunk)
        data = UbBuffer(f"{name} row ({chunks} chunk{'s' if chunks > 1 else ''})", chunks * bt * chunk * e, "gm")
        if chunks > 2:
            # The second pass loads each chunk again, chunk c + 1 before chunk c is stored: the
            # reloads of chunks 0 and 1 come before any store and the lowering keeps the first
            # pass's copies; each later one follows a store and gets a copy of its own (measured:
            # q_c's 3 chunks of DeepSeek-V3 allocate 4 chunk buffers, with and without the cache).
            again = UbBuffer(f"{name} row, second pass ({chunks - 2} chunk{'s' if chunks > 3 else ''} after a "
                             "store)", (chunks - 2) * bt * chunk * e, "gm")
            gm += (again,)
            per_tile += (again,)
        gm += (data, UbBuffer(f"{name} weight", chunks * chunk * FP32, "gm", worst_case=True))
        per_tile += (data,)
        widths.append(chunk)

    rope_rows = 1
    if shape.q_rope:
        rope_rows = block_heads
    else:
        if shape.q_lora_rank:
            row("q_c", shape.q_lora_rank, q_chunk)
        row("kv_c", shape.kv_lora_rank, kv_chunk)
    if shape.rope_dim:
        lanes = UbBuffer("rotary lanes" + (f" [{block_heads} heads]" if shape.q_rope else " (k_pe)"),
                         bt * rope_rows * rot * e, "gm")
        rows = UbBuffer("cos/sin rows", 2 * bt * shape.half_pad * c, "gm")
        positions = UbBuffer("positions", bt * POSITION_BYTES, "gm")
        gm += (lanes, rows, positions)
        per_tile += (lanes, rows, positions)
        widths.append(rope_rows * rot)
        if shape.q_arms:
            # The q arm loads its own positions and cos/sin rows; the lowering keeps a copy of the
            # positions and of one of the two rows for it, sharing the other with the kv arm's
            # (measured: V2-Lite at every TP size, 8 tokens, 1,088 B over the kv arm's buffers).
            q_lanes = UbBuffer(f"q's rotary lanes [{block_heads} heads]", bt * block_heads * rot * e, "gm")
            q_rows = UbBuffer("q arm's positions and one cos/sin row", bt * (POSITION_BYTES + shape.half_pad * c),
                              "gm")
            gm += (q_lanes, q_rows)
            per_tile += (q_lanes, q_rows)
            widths.append(block_heads * rot)
    vector_kv: tuple[UbBuffer, ...] = ()
    widest = max(widths)
    if shape.kv_cache:
        slots = UbBuffer("slots", bt * SLOT_BYTES, "gm")
        gm += (slots,)
        per_tile += (slots,)
        vector_kv = (
            UbBuffer("cache row offsets (int64, latent + rope)", 2 * bt * SLOT_BYTES, "vector"),
            UbBuffer("quantised fp32 (y / k_scale, saturated, rounded)", bt * widest * FP32, "vector"),
            UbBuffer("cache tile (widest: fp32, multibuffered)", MULTIBUFFER * bt * widest * MLA_CACHE_BYTES,
                     "vector"),
            UbBuffer("cache store masks", bt * widest * MASK_BYTES, "vector"),
        )
    second = tuple(UbBuffer(f"{buf.name} (2nd buffer)", buf.nbytes, "multibuffer")
                   for buf in per_tile for _ in range(MULTIBUFFER - 1))
    vector = (
        UbBuffer("x fp32", bt * widest * FP32, "vector"),
        UbBuffer("normalised / rotated fp32", bt * widest * FP32, "vector"),
        UbBuffer("out tile (dtype, multibuffered)", MULTIBUFFER * bt * widest * e, "vector"),
        UbBuffer("cos/sin fp32", 2 * bt * shape.half_pad * FP32 if shape.rope_dim else 0, "vector"),
        UbBuffer("sum of squares, rstd", 2 * bt * FP32, "vector"),
        UbBuffer("masks", bt * widest * MASK_BYTES, "vector"),
    ) + vector_kv
    return gm + second + vector


@functools.lru_cache(maxsize=None)
def mla_plan(shape: MLAShape, facts: AscendFacts) -> MLAPlan:
    """The Ascend plan of the MLA kernel (pure): latent rows in chunks of :func:`mla_row_chunk`;
    the q side's heads per tile as the GQA plan picks them (at most ``MAX_BLOCK_HEADS``, padding
    within ``MAX_HEAD_WASTE``, fewer if not even ``MIN_BLOCK_TOKENS`` fit), the prologue's q arms
    (no q latent) as many as its widest latent chunk holds (:func:`~.base.q_arm_heads`), padding
    within ``MAX_HEAD_WASTE``; then the most tokens per
    tile, ``MIN_BLOCK_TOKENS`` to ``MAX_BLOCK_TOKENS``, whose buffers fit the UB budget; a grid of
    vector cores.

    Raises
    ------
    ValueError
        If not even ``MIN_BLOCK_TOKENS`` tokens fit.
    """
    budget = ub_budget(facts)
    q_chunk = mla_row_chunk(shape.q_lora_rank) if shape.q_lora_rank else 1
    kv_chunk = mla_row_chunk(shape.kv_lora_rank) if shape.kv_lora_rank else 1
    heads = q_arm_heads(shape, max(q_chunk, kv_chunk), MAX_BLOCK_HEADS)
    if shape.q_rope:
        heads = min(next_pow2(shape.num_heads), MAX_BLOCK_HEADS)
    while heads > 1 and -(-shape.num_heads // heads) * heads / shape.num_heads > MAX_HEAD_WASTE:
        heads //= 2

    def fits(tokens: int, block_heads: int) -> bool:
        return sum(b.nbytes for b in mla_ub_buffers(shape, tokens, block_heads, q_chunk, kv_chunk)) <= budget

    while heads > 1 and not fits(MIN_BLOCK_TOKENS, heads):
        heads = prev_pow2(heads - 1)
    if not fits(MIN_BLOCK_TOKENS, heads):
        raise ValueError(f"{MIN_BLOCK_TOKENS} tokens of {shape} do not fit {budget} bytes of UB")
    tokens = MIN_BLOCK_TOKENS
    while tokens < MAX_BLOCK_TOKENS and fits(2 * tokens, heads):
        tokens *= 2
    return MLAPlan(block_tokens=tokens, block_heads=heads, q_chunk=q_chunk, kv_chunk=kv_chunk,
                   max_programs=facts.num_vector_cores,
                   ub_buffers=mla_ub_buffers(shape, tokens, heads, q_chunk, kv_chunk), ub_capacity=facts.ub_bytes)
