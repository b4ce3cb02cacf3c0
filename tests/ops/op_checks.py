"""What the op tests share: tolerances, the launch plans they force, poisoned outputs framed by
sentinels, and whether kernels run compiled (a GPU) or through the interpreter.

A helper module, not a test module: ``tests/ops/test_*.py`` import it (``import op_checks``), the
``poisoned`` fixture (``conftest.py``) allocates through :data:`FRAMES`.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from vllm_ascend_ext.ops import device as device_facts
from vllm_ascend_ext.ops import settings, tiling, validation
from vllm_ascend_ext.ops.tiling import KernelShape, ascend, cuda
from vllm_ascend_ext.ops.tiling.cuda import CudaPlan

#: Kernels run compiled (a CUDA GPU, no interpreter): the large sizes and graph tests run only then.
COMPILED = torch.cuda.is_available() and not settings.triton_interpret()
gpu = pytest.mark.skipif(not COMPILED, reason="needs a GPU without the interpreter")

#: Allowed error of the kernel against the float64 reference, by output dtype: one ulp of the
#: output (the interpreter truncates on the final cast, a GPU rounds to nearest: half an ulp),
#: plus an absolute floor for values near zero where fp32 cancellation in the rotation shows.
TOLERANCES = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=2.0**-10, atol=1e-4),
    torch.bfloat16: dict(rtol=2.0**-7, atol=1e-3),
}
POISON = {torch.float32: float("nan"), torch.float16: float("nan"), torch.bfloat16: float("nan")}
#: Launch plans every plan-sensitive test runs under: the Ascend plan, and CUDA's plan for large
#: batches and for small ones (which the op picks by token count on a GPU).
PLAN_KINDS = ("ascend", "cuda-large", "cuda-small")
#: The feature tests' plans: :data:`PLAN_KINDS` and ``small-tiles``, a forced plan of 2 tokens x 2
#: heads per tile (q, k, gate and v heads alike), the pass-through tail cut into 4-lane chunks and
#: 5 programs walking the tiles grid-stride (loading the next tile's positions ahead), so small
#: sizes cross every block of every arm.
#: ``two-piece`` holds a tail that is no power of two as two pieces (what the CUDA small-batch plan
#: does for wide tails; 16 tokens x 2 heads a tile so the plan's per-thread rule lets it), moves v
#: (when written) in k's tiles. ``whole-row`` holds q's and k's heads as whole rows (what the CUDA
#: small-batch plan does where D is a power of two and the tail is not), 2 tokens x 2 q heads x
#: 1 k head a tile, 5 programs loading positions ahead.
PLANS = PLAN_KINDS + ("small-tiles", "two-piece", "whole-row")

#: The ``poisoned`` fixture frames each out-of-place output with this value: a row before it, a
#: row after it and ``GUARD_COLUMNS`` after each of its rows (16, so the output's row stride keeps
#: the divisibility the GPU compiler specialises on). Exact in every dtype.
SENTINEL = -7.25
GUARD_COLUMNS = 16
FRAMES: list[tuple[torch.Tensor, int]] = []


def check_sentinels() -> None:
    """Every frame the ``poisoned`` fixture allocated still holds its sentinels (then forget them)."""
    frames = list(FRAMES)
    FRAMES.clear()
    for frame, columns in frames:
        guard = torch.ones(frame.shape, dtype=torch.bool, device=frame.device)
        guard[1:-1, :columns] = False
        assert bool((frame[guard] == SENTINEL).all()), f"wrote outside a [{frame.shape[0] - 2}, {columns}] output"


def plan_of(kind: str, shape: KernelShape, device) -> tiling.PlanBase:
    """The plan of one of :data:`PLANS` for ``shape`` (GPU facts when the device is a GPU)."""
    if kind == "ascend":
        return ascend.plan(shape, device_facts.ascend_facts(None))
    if kind == "small-tiles":
        return CudaPlan(block_tokens=2, block_heads=2, kv_block_heads=2, max_programs=5, num_warps=4,
                        tail_lanes=4 if shape.pass_dim else 0, late_rows=False, pos_ahead=True)
    if kind == "two-piece":
        plan = CudaPlan(block_tokens=16, block_heads=2, kv_block_heads=2, max_programs=5, num_warps=1,
                        two_piece_tail=True, v_in_k_tiles=True)
        if shape.pass_dim & (shape.pass_dim - 1):  # no power of two: the plan must split it
            assert plan.tail_width2(shape) > 0 and plan.tail_chunks(shape) == 1
        return plan
    if kind == "whole-row":
        return CudaPlan(block_tokens=2, block_heads=2, kv_block_heads=1, max_programs=5, num_warps=2,
                        whole_rows=True, pos_ahead=True)
    facts = device_facts.cuda_facts(torch.cuda.current_device() if device.type == "cuda" else None)
    if kind == "cuda-large":
        return cuda.plan(shape, facts)
    assert kind == "cuda-small", kind
    return cuda.small_batch_plan(shape, facts)


def shape_of(args: dict) -> KernelShape:
    """The kernel shape of a call (features included), as the op's validator computes it."""
    return validation.split_qkv_rmsnorm_rope(**args).shape


def forced(kind: str | None, args: dict):
    """Run under plan ``kind`` (one of :data:`PLANS`), or the op's own choice for ``None``."""
    if kind is None:
        return contextlib.nullcontext()
    return tiling.forced(plan=plan_of(kind, shape_of(args), args["qkv"].device))


def whole_rows(qkv: torch.Tensor) -> torch.Tensor:
    """``qkv``'s rows with their padding (every element from a row's start to the next row's)."""
    if qkv.shape[0] == 0:
        return qkv
    return qkv.as_strided((qkv.shape[0], qkv.stride(0)), (qkv.stride(0), 1))


def random_bits(shape, dtype, device, generator=None) -> torch.Tensor:
    """A tensor of ``shape`` holding random bit patterns (NaNs and infinities included)."""
    size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(-128, 128, (size,), dtype=torch.int8, generator=generator)
    return raw.view(dtype).reshape(shape).to(device)


def make_slots(tokens: int, num_blocks: int, block_size: int, *, padding: int, extra: int, dtype,
               generator=None) -> tuple[torch.Tensor, int]:
    """Distinct slots for ``tokens`` tokens: a run of consecutive slots crossing a block boundary,
    then random ones; ``padding`` of them (when ``tokens >= 3``) negative, alternately -1 and
    -2**31; then ``extra`` valid slots past ``T`` that no token uses. Returns the slots and how
    many of the first ``T`` are valid."""
    total = num_blocks * block_size
    run = min(tokens, 3)
    block = int(torch.randint(0, num_blocks - 1, (1,), generator=generator))
    start = min(block * block_size + block_size - 1, total - run)  # the last row of a block, then the next's
    chosen = list(range(start, start + run))
    pool = [s for s in torch.randperm(total, generator=generator).tolist() if s not in chosen]
    chosen += pool[:tokens - run + extra]
    assert len(chosen) == tokens + extra and max(chosen, default=0) < total, "not enough slots"
    padded = min(padding, tokens) if tokens >= 3 else 0
    for i, t in enumerate(torch.randperm(tokens, generator=generator)[:padded].tolist()):
        chosen[t] = (-1, -(2**31))[i % 2]
    return torch.tensor(chosen, dtype=dtype), tokens - padded
