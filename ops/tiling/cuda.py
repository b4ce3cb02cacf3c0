"""CUDA launch plans: tiles sized for registers and 16-byte accesses, a grid sized for SMs.

Every constant carries the measurement behind it (``docs/perf-notes.md``; the sweep is
``scripts/tune_cuda_plan.py``). The plan does not depend on the token count: one compiled
kernel per layer geometry.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from . import KernelShape, PlanBase, next_pow2, prev_pow2
from ..device import CudaFacts

__all__ = ["CudaPlan", "plan"]

#: Padded head elements per q tile (both rotary halves and the tail): 4096 was best or within
#: 3% of the best at T >= 4096 on every 128-dim geometry (perf-notes v3 sweep).
TILE_ELEMENTS = 4096
#: Elements of the widest sub-tile (a rotary half, or the pass-through tail) each thread holds.
#: Fewer per thread (more warps) split the loads into 2- and 4-byte accesses: 8 warps on a
#: 4096-element tile ran 1.8-2.2x slower than 2 warps (perf-notes v1); v3 found 32 best.
ELEMENTS_PER_THREAD = 32
MIN_WARPS, MAX_WARPS = 1, 8
#: Heads per tile at most: 8 beat "all of q's heads" by 5-10% at T >= 4096 (perf-notes v3).
MAX_BLOCK_HEADS = 8
#: Resident programs per SM the grid is capped at; the persistent loop takes the rest. 16 beat
#: 4 at every T >= 4096 in perf-notes v3.
PROGRAMS_PER_SM = 16


@dataclass(frozen=True)
class CudaPlan(PlanBase):
    """A CUDA launch: ``block_tokens`` x (``block_heads`` q | ``kv_block_heads`` k) tiles."""

    kv_block_heads: int
    num_warps: int

    @property
    def block_heads_k(self) -> int:
        return self.kv_block_heads

    @property
    def launch_options(self) -> dict:
        return {"num_warps": self.num_warps}


@functools.lru_cache(maxsize=None)
def plan(shape: KernelShape, facts: CudaFacts, *, tile_elements: int = TILE_ELEMENTS,
         elements_per_thread: int = ELEMENTS_PER_THREAD, programs_per_sm: int = PROGRAMS_PER_SM,
         max_block_heads: int = MAX_BLOCK_HEADS) -> CudaPlan:
    """The CUDA plan for one layer geometry on one GPU (pure: same inputs, same plan).

    q's heads of a token go in as few blocks as ``max_block_heads`` allows, k's likewise (so
    cos/sin rows are read a few times per token at most); tokens per tile fill
    ``tile_elements``; warps give each thread ``elements_per_thread`` of the widest sub-tile
    (a rotary half, or the tail when it is wider). The keyword arguments exist for the sweep;
    the defaults are the plan.
    """
    q_heads = min(next_pow2(shape.num_q_heads), max_block_heads)
    k_heads = min(next_pow2(shape.num_kv_heads), max_block_heads)
    tokens = prev_pow2(max(1, tile_elements // (q_heads * shape.padded_head_dim)))
    widest = tokens * q_heads * max(shape.half_pad, shape.pass_pad if shape.pass_dim else 0)
    warps = max(MIN_WARPS, min(MAX_WARPS, prev_pow2(widest // (32 * elements_per_thread))))
    return CudaPlan(block_tokens=tokens, block_heads=q_heads, kv_block_heads=k_heads,
                    max_programs=facts.num_sms * programs_per_sm, num_warps=warps)
