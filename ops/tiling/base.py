"""The plan's shared types (leaf: imports nothing of ``tiling``): the kernel's shapes, the plan
base classes and the power-of-two helpers, which ``ascend.py``, ``cuda.py`` and the package's
plan pickers (``tiling/__init__.py``) all build on."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KernelShape", "MLAPlan", "MLAShape", "PlanBase", "SumsPlan", "launch_options", "next_pow2",
           "prev_pow2"]


def next_pow2(n: int) -> int:
    """Smallest power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def prev_pow2(n: int) -> int:
    """Largest power of two <= ``n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (n.bit_length() - 1)


def launch_options(num_warps: int | None, max_registers: int = 0, pdl: bool = False) -> dict:
    """A plan's keyword arguments of a Triton launch: ``num_warps`` (``None``: Triton's default),
    ``maxnreg`` where registers are capped, ``launch_pdl`` with programmatic dependent launch."""
    options = {} if num_warps is None else {"num_warps": num_warps}
    if max_registers:
        options["maxnreg"] = max_registers
    if pdl:
        options["launch_pdl"] = True
    return options


@dataclass(frozen=True)
class KernelShape:
    """What a plan depends on: the geometry of one layer on one rank, and element sizes."""

    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    elem_bytes: int  # qkv / output element size
    cache_bytes: int  # cos_sin_cache element size
    is_neox: bool = True
    #: q's columns hold, per head, D values of q then D of the gate; the gate is copied out.
    q_gate: bool = False
    #: v's heads are RMS-normalised (weightless) and written.
    v_norm: bool = False
    #: positions are ``[3, T]`` (mRoPE): each frequency lane reads the row of its axis.
    mrope: bool = False
    #: k and v are written into the paged KV cache (v's heads are tiled even when not normalised).
    kv_cache: bool = False
    #: q and k are normalised over all their heads from a ``[T, 2]`` fp32 tensor of sums of
    #: squares (``split_qkv_tp_rmsnorm_rope``'s second kernel): the weights are ``H*D`` values, so
    #: a tile holds ``[BLOCK_H, D]`` of them rather than ``[D]``, and no per-head sum is taken.
    norm_across_heads: bool = False
    #: q or k is RMS-normalised (the kernel takes which from the call; only a CUDA plan rule
    #: reads this: ``cuda.MROPE_WARPS``).
    qk_norm: bool = True

    @classmethod
    def of(cls, geometry, elem_bytes: int, cache_bytes: int) -> KernelShape:
        """The shape of an ``ops.models.AttentionGeometry`` with these element sizes (an mRoPE
        geometry is planned for ``[3, T]`` positions)."""
        return cls(num_q_heads=geometry.num_q_heads, num_kv_heads=geometry.num_kv_heads,
                   head_dim=geometry.head_dim, rotary_dim=geometry.rotary_dim,
                   elem_bytes=elem_bytes, cache_bytes=cache_bytes, is_neox=geometry.is_neox,
                   q_gate=geometry.q_gate, v_norm=geometry.v_norm,
                   mrope=geometry.mrope_section is not None,
                   norm_across_heads=geometry.qk_norm_across_heads, qk_norm=geometry.qk_norm)

    @property
    def num_heads(self) -> int:
        """q and k heads together: the heads that are normalised and rotated."""
        return self.num_q_heads + self.num_kv_heads

    @property
    def tiled_heads(self) -> int:
        """Heads the kernel's tiles cover: q and k, plus the gate's and v's when written."""
        return self.num_q_heads * (2 if self.q_gate else 1) + self.num_kv_heads * (2 if self.writes_v else 1)

    @property
    def writes_v(self) -> bool:
        """v's heads are tiled: normalised, or written into the KV cache."""
        return self.v_norm or self.kv_cache

    @property
    def q_head_stride(self) -> int:
        """Columns from one q head of qkv to the next: ``2*D`` with the gate beside it, else ``D``."""
        return (2 if self.q_gate else 1) * self.head_dim

    @property
    def qkv_width(self) -> int:
        """Columns of qkv: q's heads (with their gates), then k's and v's."""
        return self.num_q_heads * self.q_head_stride + 2 * self.num_kv_heads * self.head_dim

    def head_blocks(self, block_heads: int, block_heads_k: int | None = None, v_with_k: bool = False) -> int:
        """Blocks covering q's heads (``block_heads`` each), then k's (``block_heads_k``, default
        the same), then the gate's (as q's) and v's (as k's) when they are written, unless
        ``v_with_k`` (each k block moves the same heads of v too); a block holds one tensor's
        heads."""
        block_heads_k = block_heads_k or block_heads
        q_blocks, k_blocks = -(-self.num_q_heads // block_heads), -(-self.num_kv_heads // block_heads_k)
        return q_blocks * (2 if self.q_gate else 1) + k_blocks * (2 if self.writes_v and not v_with_k else 1)

    @property
    def half(self) -> int:
        """Rotary pairs per head, ``R/2``."""
        return self.rotary_dim // 2

    @property
    def half_pad(self) -> int:
        """``R/2`` padded to a power of two (Triton block dims must be)."""
        return next_pow2(self.half)

    @property
    def pass_dim(self) -> int:
        """Dims past the rotary part, ``D - R``."""
        return self.head_dim - self.rotary_dim

    @property
    def pass_pad(self) -> int:
        """``D - R`` padded to a power of two (1 when there are none)."""
        return next_pow2(self.pass_dim)

    @property
    def padded_head_dim(self) -> int:
        """Elements a head occupies in a tile: two rotary halves plus the tail, all padded."""
        return 2 * self.half_pad + (self.pass_pad if self.pass_dim else 0)


@dataclass(frozen=True)
class PlanBase:
    """What every backend's plan gives the launcher.

    ``block_heads`` is the heads of q per tile; :attr:`block_heads_k` those of k (the same
    unless a backend says otherwise).
    """

    block_tokens: int
    block_heads: int
    max_programs: int

    @property
    def block_heads_k(self) -> int:
        return self.block_heads

    def head_blocks(self, shape: KernelShape) -> int:
        """Head blocks per token block: q's blocks of ``block_heads``, then k's (and the gate's and
        v's, as :meth:`KernelShape.head_blocks` says)."""
        return shape.head_blocks(self.block_heads, self.block_heads_k, self.v_with_k)

    @property
    def launch_options(self) -> dict:
        """Backend-specific keyword arguments of the launch (``num_warps`` ...)."""
        return {}

    @property
    def rows_after_data(self) -> bool:
        """Gather a tile's cos/sin rows after its q/k loads are issued (in each branch arm)
        rather than before the branch; off unless a backend measured it better."""
        return False

    @property
    def positions_ahead(self) -> bool:
        """Load the positions of a program's next tile while it works on the current one (the
        kernel's ``POS_AHEAD``), so the cos/sin gather waits on no load after the first tile;
        off unless a backend measured it better."""
        return False

    @property
    def positions_at_gather(self) -> bool:
        """Where the rows are gathered in the arms (:attr:`rows_after_data` or :attr:`whole_row`)
        and not loaded ahead, the head block loads the positions itself at the gather (the
        kernel's ``POS_PTRS``) rather than the arm before it; off unless a backend measured it
        better."""
        return False

    @property
    def dependent_launch(self) -> bool:
        """Launch with programmatic dependent launch (the kernel's ``PDL``: it waits for the grid
        before it, then lets the next one launch); off unless a backend has it and measured it."""
        return False

    @property
    def whole_row(self) -> bool:
        """Hold each q and k head as one contiguous row, loading each rotary lane's pair element a
        second time (the kernel's ``WHOLE_ROW``), rather than as rotary halves and tail pieces; off
        unless a backend measured it better."""
        return False

    @property
    def v_with_k(self) -> bool:
        """Move v's heads (when written: normalised, or into the KV cache) in the tile of the same
        k heads, after k's, rather than in head blocks of their own; off unless a backend measured
        it better (a tile would hold k's and v's buffers)."""
        return False

    def tail_width(self, shape: KernelShape) -> int:
        """Lanes of one chunk of the pass-through tail: by default the whole tail, padded."""
        return shape.pass_pad

    def tail_width2(self, shape: KernelShape) -> int:
        """Lanes of the tail's second piece when the tail is held whole as two pieces (a power of
        two of :meth:`tail_width` lanes, then the rest padded); 0: one piece or chunks."""
        return 0

    def tail_chunks(self, shape: KernelShape) -> int:
        """Chunks of :meth:`tail_width` lanes covering the tail (1 when there is no tail, and
        when it is held as two pieces)."""
        if self.tail_width2(shape):
            return 1
        return max(1, -(-shape.pass_dim // self.tail_width(shape)))

    def num_tiles(self, shape: KernelShape, num_tokens: int) -> int:
        """Tiles covering ``num_tokens`` tokens (the kernel computes the same at run time)."""
        return -(-num_tokens // self.block_tokens) * self.head_blocks(shape)

    def grid(self, shape: KernelShape, num_tokens: int) -> int:
        """Programs to launch: one per tile, at most ``max_programs`` (they loop grid-stride).

        A capped grid is kept off multiples of the head-block count: programs step through the
        tiles by the grid size, so with a multiple each program would meet the same head block
        (say, always a small k block) on every tile it walks, and q's programs would do all the
        work (8/1/128 ran at 1.58x the floor so, docs/performance.md, v3).
        """
        tiles = self.num_tiles(shape, num_tokens)
        if tiles <= self.max_programs:
            return max(1, tiles)
        programs = self.max_programs
        if programs % self.head_blocks(shape) == 0:
            programs -= 1
        return programs


@dataclass(frozen=True)
class SumsPlan:
    """A launch of ``split_qkv_tp_rmsnorm_rope``'s first kernel (each token's sums of squares of
    its q and k columns): ``block_tokens`` tokens per tile, q's columns walked in chunks of
    ``block_cols_q``, k's in chunks of ``block_cols_k``, at most ``max_programs`` programs
    (grid-stride over the token blocks). ``ub_buffers`` is the Ascend UB model (empty for CUDA)."""

    block_tokens: int
    block_cols_q: int
    block_cols_k: int
    max_programs: int
    num_warps: int | None = None
    ub_buffers: tuple = ()
    ub_capacity: int = 0

    @property
    def ub_bytes(self) -> int:
        return sum(buf.nbytes for buf in self.ub_buffers)

    def ub_bytes_from(self, source: str) -> int:
        return sum(buf.nbytes for buf in self.ub_buffers if buf.source == source)

    @property
    def launch_options(self) -> dict:
        return launch_options(self.num_warps)

    def grid(self, num_tokens: int) -> int:
        """Programs to launch: one per token block, at most ``max_programs``."""
        return max(1, min(-(-num_tokens // self.block_tokens), self.max_programs))


@dataclass(frozen=True)
class MLAShape:
    """What an MLA plan (``split_qkv_rmsnorm_rope_mla`` and its q side, ``mla_q_rope_``) depends on.

    The prologue (``kv_lora_rank > 0``) normalises q_c's row of ``q_lora_rank`` lanes (none when 0)
    and kv_c's of ``kv_lora_rank``, and rotates k_pe's ``rope_dim`` lanes (none when 0); without a
    q latent it may also rotate q (``num_heads > 0``: q comes from ``q_proj``, no GEMM between).
    The q side (``kv_lora_rank == 0``, ``num_heads > 0``) rotates the last ``rope_dim`` lanes of
    each of ``num_heads`` heads of ``head_dim`` lanes, in place, and has no norm.
    """

    q_lora_rank: int
    kv_lora_rank: int
    rope_dim: int
    elem_bytes: int  # qkv_lora / q / output element size
    cache_bytes: int  # cos_sin_cache element size (the plan's model takes it as is when rope_dim is 0)
    is_neox: bool = False
    #: The cache write (combined or split form; its layout and dtype are the call's, not the plan's).
    kv_cache: bool = False
    num_heads: int = 0
    head_dim: int = 0

    @property
    def q_rope(self) -> bool:
        """The q side's variant: RoPE of ``q[..., head_dim - rope_dim:]`` in place, no norm."""
        return self.num_heads > 0 and self.kv_lora_rank == 0

    @property
    def q_arms(self) -> bool:
        """The prologue also rotates q in place (no q latent: ``q_proj``'s output is there before
        the prologue), in tiles of heads after its kv arm."""
        return self.num_heads > 0 and self.kv_lora_rank > 0

    @property
    def half(self) -> int:
        """Rotary pairs, ``R/2``."""
        return self.rope_dim // 2

    @property
    def half_pad(self) -> int:
        """``R/2`` padded to a power of two (1 without rope)."""
        return next_pow2(self.half)

    @property
    def row_arms(self) -> int:
        """Tiles per token block in the prologue: q_c's norm (when ``q_lora_rank``) and the kv arm
        (kv_c's norm, k_pe's rotation, the cache write)."""
        return (1 if self.q_lora_rank else 0) + 1


def q_arm_heads(shape: MLAShape, lanes: int, max_heads: int) -> int:
    """Heads of q a tile of the prologue's q arms takes (:attr:`MLAShape.q_arms`): the most, a power
    of two up to ``max_heads``, whose rotary lanes fit in ``lanes`` (the widest latent chunk: a q
    arm's tile is no larger than the latent arms', which set the launch's warps); 1 without q arms."""
    if not shape.q_arms:
        return 1
    return max(1, min(next_pow2(shape.num_heads), max_heads, prev_pow2(max(1, lanes // (2 * shape.half_pad)))))


@dataclass(frozen=True)
class MLAPlan:
    """A launch of the MLA kernel: ``block_tokens`` tokens a tile; the prologue cuts q_c's row in
    chunks of ``q_chunk`` lanes and kv_c's in chunks of ``kv_chunk`` (powers of two; one chunk is the
    row held whole, more are summed in a first pass and loaded again to be scaled in a second); the
    q side takes ``block_heads`` heads a tile. ``ub_buffers`` is the Ascend UB model (empty for CUDA)."""

    block_tokens: int
    block_heads: int
    q_chunk: int
    kv_chunk: int
    max_programs: int
    num_warps: int | None = None
    ub_buffers: tuple = ()
    ub_capacity: int = 0
    pdl: bool = False  # the kernel's PDL, launched with programmatic dependent launch (CUDA plans)
    max_registers: int = 0  # ptxas's cap on registers a thread (Triton's maxnreg, CUDA plans); 0: no cap
    one_tile: bool = False  # a program a tile whatever max_programs says, the kernel's loop of one trip

    @staticmethod
    def chunks(width: int, chunk: int) -> int:
        """Chunks of ``chunk`` lanes covering a row of ``width`` (at least 1)."""
        return max(1, -(-width // chunk))

    def q_chunks(self, shape: MLAShape) -> int:
        return self.chunks(shape.q_lora_rank, self.q_chunk)

    def kv_chunks(self, shape: MLAShape) -> int:
        return self.chunks(shape.kv_lora_rank, self.kv_chunk)

    def head_blocks(self, shape: MLAShape) -> int:
        """Tiles per token block: the q side's head blocks, or the prologue's arms (and its q
        head blocks, :attr:`MLAShape.q_arms`)."""
        q_blocks = -(-shape.num_heads // self.block_heads)
        if shape.q_rope:
            return q_blocks
        return shape.row_arms + (q_blocks if shape.q_arms else 0)

    @property
    def ub_bytes(self) -> int:
        return sum(buf.nbytes for buf in self.ub_buffers)

    def ub_bytes_from(self, source: str) -> int:
        return sum(buf.nbytes for buf in self.ub_buffers if buf.source == source)

    @property
    def dependent_launch(self) -> bool:
        return self.pdl

    @property
    def launch_options(self) -> dict:
        return launch_options(self.num_warps, self.max_registers, self.pdl)

    def num_tiles(self, shape: MLAShape, num_tokens: int) -> int:
        return -(-num_tokens // self.block_tokens) * self.head_blocks(shape)

    def grid(self, shape: MLAShape, num_tokens: int) -> int:
        """Programs to launch: one per tile, at most ``max_programs`` (grid-stride), a capped grid
        kept off multiples of the tiles per token block (as :meth:`PlanBase.grid`, so that a
        program does not meet the same arm on every tile it walks); with ``one_tile`` one per tile."""
        tiles = self.num_tiles(shape, num_tokens)
        if tiles <= self.max_programs or self.one_tile:
            return max(1, tiles)
        programs = self.max_programs
        if programs % self.head_blocks(shape) == 0:
            programs -= 1
        return programs
