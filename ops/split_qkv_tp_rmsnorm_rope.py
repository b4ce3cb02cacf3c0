"""Split-QKV + q/k RMSNorm across ALL heads under tensor parallelism + rotary embedding (MiniMax-M2).

MiniMax-M2 / M2.5 normalise q and k over their whole hidden size (every head together), not per
head (vLLM's ``MiniMaxText01RMSNormTP``). Under tensor parallelism a rank holds only some heads,
so each token's sum of squares is a sum over ranks.

Math (per token ``t`` on one rank of ``tp``; fp32, one rounding to the output dtype at the end)
------------------------------------------------------------------------------------------------
::

    sq_q[t] = sum over the rank's Hq*D q columns of x**2;   sq_k[t] likewise over its Hkv*D k columns
    SQ = all_reduce_sum([sq_q, sq_k])                          # [T, 2] fp32, over the TP group
    q:  y = x * rsqrt(SQ_q[t] / (Hq*D*tp) + eps) * q_weight[h*D + d]
    k:  y = x * rsqrt(SQ_k[t] / (Hkv*D*tp) + eps) * k_weight[h*D + d]
    then RoPE exactly as split_qkv_rmsnorm_rope (partial rotary, NeoX or GPT-J, clamped positions)

``Hq``/``Hkv`` are the rank's head counts and the weights the rank's shards. With replicated kv
heads (fewer kv heads than ranks) every kv head is held by the same number of ranks, so
``SQ_k / (Hkv*D*tp)`` is still the exact mean over the model's k columns: vLLM's formula (not a
division by the model's ``Hkv_total*D``).

Launches
--------
Two kernels around one collective: kernel 1 (:func:`sums_kernel`, here) writes the ``[T, 2]``
fp32 sums of squares; the all-reduce sums them over the group (a ``ProcessGroup``:
``dist.all_reduce(sums, group=...)`` in place; a callable: ``sums = f(sums)``); kernel 2 is the
prologue's kernel (``ops/split_qkv_rmsnorm_rope.py``) compiled with ``NORM_SUMS`` (rstd from the
sums) and ``ELEM_W`` (weights of ``H*D`` values). No host sync; the token count is a run-time
argument of both kernels (one compile per layer geometry); the collective is whatever the group
gives (capturable in a CUDA graph when the group's is).

With ``tp_size == 1`` there is no collective, but it is still two launches: the prologue's tiles
cut a token's heads into blocks (the Ascend UB holds 2 tokens of at most 32 of MiniMax-M2's 48 q
heads of 128 lanes with their fp32 temporaries, not a whole row), so the norm over all heads needs
every head's squares before any tile scales one. One launch would need whole-row tiles (which do
not fit the UB at TP 1) or each tile re-reading its tokens' whole q row (Hq / BLOCK_H times the
reads); neither was done.

``T == 0`` launches nothing and skips the collective: every rank of a TP group runs the same
batch (vLLM's TP ranks see the same token count), so all of them skip it together.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import launch_cache, validation
from .split_qkv_rmsnorm_rope import Prepared, launch
from .tiling import KernelShape, SumsPlan, sums_plan_for
from .triton_launcher import BoundKernel

__all__ = ["PreparedTP", "partial_sums", "split_qkv_tp_rmsnorm_rope"]


@triton.jit
def _sum_squares(row_ptr, tok_ok, cols, COLS: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr):
    """Each token's sum of ``x**2`` over ``COLS`` columns from ``row_ptr`` ([BLOCK_T, 1] row
    starts), walked in chunks of ``BLOCK_C`` (``cols`` = ``arange(BLOCK_C)``); fp32 [BLOCK_T]."""
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for start in range(0, COLS, BLOCK_C):
        c = start + cols
        x = tl.load(row_ptr + c[None, :], mask=tok_ok[:, None] & (c < COLS)[None, :], other=0.0).to(tl.float32)
        acc += x * x
    return tl.sum(acc, axis=1)


@triton.jit(do_not_specialize=["num_tokens"])
def sums_kernel(qkv_ptr, sums_ptr, num_tokens, qkv_stride,
                 Q_COLS: tl.constexpr, K_COLS: tl.constexpr, BLOCK_T: tl.constexpr,
                 BLOCK_CQ: tl.constexpr, BLOCK_CK: tl.constexpr):
    """``sums[t] = (sum of x**2 over q's Q_COLS columns, over k's K_COLS columns)`` in fp32, for
    tokens ``t < num_tokens``; token blocks walked grid-stride. Stored as one ``[BLOCK_T, 2]``
    block per tile (contiguous: no stride-2 stores)."""
    num_tiles = tl.cdiv(num_tokens, BLOCK_T)
    for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        tok = tile * BLOCK_T + tl.arange(0, BLOCK_T)
        tok_ok = tok < num_tokens
        rows = qkv_ptr + (tok.to(tl.int64) * qkv_stride)[:, None]
        sq_q = _sum_squares(rows, tok_ok, tl.arange(0, BLOCK_CQ), Q_COLS, BLOCK_CQ, BLOCK_T)
        sq_k = _sum_squares(rows + Q_COLS, tok_ok, tl.arange(0, BLOCK_CK), K_COLS, BLOCK_CK, BLOCK_T)
        which = tl.arange(0, 2)
        both = tl.where((which == 0)[None, :], sq_q[:, None], sq_k[:, None])
        tl.store(sums_ptr + tok.to(tl.int64)[:, None] * 2 + which[None, :], both, mask=tok_ok[:, None])


def sums_constexprs(shape: KernelShape, plan: SumsPlan) -> dict:
    """Kernel 1's compile-time arguments for one rank's geometry and plan."""
    return dict(Q_COLS=shape.num_q_heads * shape.head_dim, K_COLS=shape.num_kv_heads * shape.head_dim,
                BLOCK_T=plan.block_tokens, BLOCK_CQ=plan.block_cols_q, BLOCK_CK=plan.block_cols_k)


def sums_signature(dtype: str) -> dict:
    """Kernel 1's run-time argument types (Triton's spelling of qkv's dtype), for compiling ahead
    of time (the lowering and compile checks)."""
    return {"qkv_ptr": f"*{dtype}", "sums_ptr": "*fp32", "num_tokens": "i32", "qkv_stride": "i32"}


def partial_sums(call: validation.Call, qkv: torch.Tensor) -> torch.Tensor:
    """Kernel 1: this rank's ``[T, 2]`` fp32 sums of squares of q's and k's columns for a call
    :func:`.validation.split_qkv_tp_rmsnorm_rope` has passed (nothing is launched at ``T == 0``)."""
    return PreparedTP(call, {"qkv": qkv}).sums(qkv)


def _all_reduce(sums: torch.Tensor, all_reduce) -> torch.Tensor:
    """Sum ``sums`` over the TP group: in place on a ``ProcessGroup``, or through the callable."""
    if validation.is_process_group(all_reduce):
        torch.distributed.all_reduce(sums, group=all_reduce)
        return sums
    return all_reduce(sums)


def split_qkv_tp_rmsnorm_rope(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads,
                              head_dim, eps=1e-6, *, tp_size=1, all_reduce=None, is_neox=True):
    """Split one rank's qkv shard, RMS-normalise q and k over ALL heads of every rank, apply RoPE.

    Parameters
    ----------
    qkv : torch.Tensor
        This rank's ``[T, (Hq + 2*Hkv) * D]`` (bf16, fp16 or fp32; contiguous last dim, any row
        stride of at least the width).
    q_weight, k_weight : torch.Tensor
        This rank's shards of the norms' weights, ``[Hq*D]`` and ``[Hkv*D]`` (vLLM's
        ``MiniMaxText01RMSNormTP`` weights; with replicated kv heads, the shard of the kv head
        this rank holds).
    cos_sin_cache : torch.Tensor
        ``[max_position, R]``: row ``p`` is ``cos`` (``R/2``) then ``sin`` (``R/2``); ``R``
        even, ``2 <= R <= D``.
    positions : torch.Tensor
        ``[T]``, int32 or int64; values outside the cache are clamped into it.
    num_q_heads, num_kv_heads, head_dim : int
        The rank's LOCAL head counts (``Hq >= 1``, ``Hkv >= 1``) and the even head size ``D``.
    eps : float
        RMSNorm epsilon.
    tp_size : int
        Ranks of the TP group (the norm divides by ``H*D*tp_size``).
    all_reduce : torch.distributed.ProcessGroup or callable or None
        How the ``[T, 2]`` fp32 sums are summed over the group: a ``ProcessGroup``
        (``torch.distributed.all_reduce`` in place, ``SUM``), or ``f(tensor) -> summed tensor``
        (vLLM's ``get_tp_group().all_reduce``). ``None`` only with ``tp_size == 1``. Nothing here
        initialises or destroys a group. With ``tp_size == 1`` no collective is called.
    is_neox : bool
        NeoX (rotate halves) or GPT-J (adjacent pairs) rotary.

    Returns
    -------
    q : torch.Tensor
        ``[T, Hq*D]`` in qkv's dtype.
    k : torch.Tensor
        ``[T, Hkv*D]`` in qkv's dtype.
    v : torch.Tensor
        ``[T, Hkv*D]``: a view of ``qkv``.

    Raises
    ------
    ValueError
        On a bad argument, naming it (:func:`.validation.split_qkv_tp_rmsnorm_rope`), and on CPU
        tensors without Triton's interpreter.
    """
    return launch(_CACHE, locals(), validation.split_qkv_tp_rmsnorm_rope, PreparedTP)


_CACHE = launch_cache.LaunchCache("split_qkv_tp_rmsnorm_rope")


class PreparedTP:
    """A validated call of ``split_qkv_tp_rmsnorm_rope`` for every token count (the launch
    cache's entry): the sums kernel bound once, the all-reduce, the prologue's
    :class:`~.split_qkv_rmsnorm_rope.Prepared` with ``NORM_SUMS``."""

    def __init__(self, call: validation.Call, args: dict):
        self.call = call
        self.prologue = Prepared(call, args)
        self.tokens_agree = self.prologue.tokens_agree
        self._plan = sums_plan_for(self.prologue.device, call.shape)
        self._bound = None

    def sums(self, qkv: torch.Tensor) -> torch.Tensor:
        """Kernel 1 on ``qkv``: its ``[T, 2]`` fp32 sums (unlaunched at ``T == 0`` or on meta)."""
        num_tokens = qkv.shape[0]
        sums = qkv.new_empty(num_tokens, 2, dtype=torch.float32)
        if num_tokens == 0 or not self.prologue.launches:
            return sums
        grid = self._plan.grid(num_tokens)
        if self._bound is None:
            self._bound = BoundKernel(sums_kernel, dict(qkv_ptr=0, sums_ptr=1),
                                      dict(qkv_stride=qkv.stride(0), num_tokens=num_tokens,
                                           **sums_constexprs(self.call.shape, self._plan),
                                           **self._plan.launch_options),
                                      (qkv, sums), runtime=("num_tokens",), grid=grid)
        self._bound(grid, (qkv, sums), (num_tokens,))
        return sums

    def run(self, args: dict, functional: bool = False):
        """The sums, their all-reduce over the group (``tp_size > 1``), the prologue: ``(q, k, v)``
        (``functional``: ``(q, k, v, gate)`` as :meth:`.Prepared.run` gives them, v and gate ``[T, 0]``)."""
        sums = self.sums(args["qkv"])
        if self.call.tp_size > 1 and sums.shape[0] > 0:
            sums = _all_reduce(sums, args["all_reduce"])
        return self.prologue.run(args, norm_sums=sums, functional=functional)
