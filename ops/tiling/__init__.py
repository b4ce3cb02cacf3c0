"""Launch plans: every launch knob of every backend, computed by pure functions.

``ascend.py`` sizes tiles for the Unified Buffer and a grid of vector cores, ``cuda.py`` for
SMs. Both return frozen plan dataclasses with the same launch-facing surface
(``block_tokens``, ``block_heads``, ``max_programs``, ``launch_options``, :meth:`grid`), so the
op file only asks for a plan and launches it.

:func:`plan_for` picks the family from the tensor's device: CUDA -> CUDA plan, NPU -> Ascend
plan, CPU (the Triton interpreter) -> the Ascend plan for the default SoC, since the CPU is where
Ascend behaviour is emulated. :func:`forced` overrides the choice (tests, tuning sweeps).
"""

from __future__ import annotations

import contextlib

import torch

from .. import device as _device
from .base import KernelShape, MLAPlan, MLAShape, PlanBase, SumsPlan, next_pow2, prev_pow2

__all__ = ["KernelShape", "MLAPlan", "MLAShape", "PlanBase", "SumsPlan", "forced", "mla_plan_for",
           "mla_warm_up_token_counts", "next_pow2", "plan_for", "prev_pow2", "sums_plan_for", "warm_up_token_counts"]


_forced_backend: str | None = None
_forced_plan: PlanBase | MLAPlan | None = None


@contextlib.contextmanager
def forced(backend: str | None = None, plan: PlanBase | None = None):
    """Within the block, plan with ``backend`` (``"ascend"`` or ``"cuda"``) or use ``plan``.

    For tests (the CUDA plan's tile boundaries through the CPU interpreter) and tuning sweeps.
    """
    global _forced_backend, _forced_plan
    if backend not in (None, "ascend", "cuda"):
        raise ValueError(f"backend must be 'ascend' or 'cuda', got {backend!r}")
    from .. import launch_cache  # prepared calls keep the plans they were given: drop them

    saved = _forced_backend, _forced_plan
    _forced_backend, _forced_plan = backend, plan
    launch_cache.clear()
    try:
        yield
    finally:
        _forced_backend, _forced_plan = saved
        launch_cache.clear()


def plan_for(device: torch.device, shape: KernelShape, num_tokens: int | None = None) -> PlanBase:
    """The launch plan for ``shape`` on ``device`` (plans are cached pure functions of facts).

    CUDA has a small-batch plan beside the large one (``cuda.plan_for_tokens``): ``num_tokens``
    picks between them; ``None`` means the large plan. Ascend has one plan for every batch size.
    """
    from . import ascend, cuda

    if _forced_plan is not None:
        return _forced_plan
    facts = _cuda_facts_for(device)
    if facts is not None:
        if num_tokens is None:
            return cuda.plan(shape, facts)
        return cuda.plan_for_tokens(shape, facts, num_tokens)
    native = _device.device_kind(device)
    index = (device.index or 0) if native == "ascend" else None
    return ascend.plan(shape, _device.ascend_facts(index))


def mla_plan_for(device: torch.device, shape: MLAShape, num_tokens: int | None = None) -> MLAPlan:
    """The MLA kernel's plan for ``shape`` on ``device`` (the backend chosen as :func:`plan_for`
    chooses it; a plan forced with :func:`forced` is used when it is an :class:`MLAPlan`): with
    ``num_tokens`` on CUDA, the small-batch plan where it serves (``cuda.mla_plan_for_tokens``);
    on Ascend one plan for every batch size."""
    from . import ascend, cuda

    if isinstance(_forced_plan, MLAPlan):
        return _forced_plan
    facts = _cuda_facts_for(device)
    if facts is not None:
        if num_tokens is None:
            return cuda.mla_plan(shape, facts)
        return cuda.mla_plan_for_tokens(shape, facts, num_tokens)
    native = _device.device_kind(device)
    index = (device.index or 0) if native == "ascend" else None
    return ascend.mla_plan(shape, _device.ascend_facts(index))


def sums_plan_for(device: torch.device, shape: KernelShape) -> SumsPlan:
    """The plan of the sums-of-squares kernel of ``split_qkv_tp_rmsnorm_rope`` for ``shape`` on
    ``device`` (the backend chosen as :func:`plan_for` chooses it; one plan for every batch size)."""
    from . import ascend, cuda

    facts = _cuda_facts_for(device)
    if facts is not None:
        return cuda.sums_plan(shape, facts)
    native = _device.device_kind(device)
    index = (device.index or 0) if native == "ascend" else None
    return ascend.sums_plan(shape, _device.ascend_facts(index))


def warm_up_token_counts(device: torch.device, shape: KernelShape) -> tuple[int, ...]:
    """One token count per plan :func:`plan_for` can pick on ``device`` (to compile each ahead of
    time): CUDA's small-batch and large plans, or Ascend's one plan."""
    from . import cuda

    facts = None if _forced_plan is not None else _cuda_facts_for(device)
    if facts is None:
        return (1,)
    return 1, cuda.small_batch_max_tokens(shape, facts) + 1


def mla_warm_up_token_counts(device: torch.device, shape: MLAShape) -> tuple[int, ...]:
    """One token count per plan :func:`mla_plan_for` can pick for ``shape`` on ``device`` (to
    compile each ahead of time): CUDA's small-batch and large prologue plans, else one."""
    from . import cuda

    facts = None if _forced_plan is not None else _cuda_facts_for(device)
    if facts is None or shape.q_rope:
        return (1,)
    return 1, cuda.mla_small_max_tokens(shape, facts) + 1


def _cuda_facts_for(device: torch.device) -> _device.CudaFacts | None:
    """The GPU facts :func:`plan_for` plans ``device`` with when it picks a CUDA plan (a CUDA
    device, or any device under ``forced("cuda")``); ``None`` when it picks the Ascend plan."""
    native = _device.device_kind(device)
    if (_forced_backend or ("cuda" if native == "cuda" else "ascend")) != "cuda":
        return None
    index = None
    if native == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
    return _device.cuda_facts(index)
