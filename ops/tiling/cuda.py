"""CUDA launch plans: tiles sized for registers, a grid sized for SMs.

Every constant carries the reason or the measurement behind it (``docs/perf-notes.md`` has the
runs). The plan does not depend on the token count: one compiled kernel per layer geometry.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from . import KernelShape, PlanBase, block_heads_for, prev_pow2
from ..device import CudaFacts

__all__ = ["CudaPlan", "plan"]

#: Padded head elements per tile. 4096 fp32 values over 4 warps is 32 live values per thread
#: per tensor (a, b, rotated a, b: ~128 registers), under the 255 limit without spills, and a
#: tile of 8 KiB of bf16 in flight per program.
TILE_ELEMENTS = 4096
#: Heads per tile at most, and how much head padding is tolerated (see block_heads_for).
MAX_BLOCK_HEADS = 16
MAX_HEAD_WASTE = 1.125
#: Warps per program (4: the Triton default; 128 threads per 4096-element tile).
NUM_WARPS = 4
#: Resident programs per SM the grid is capped at: the persistent loop takes the rest.
PROGRAMS_PER_SM = 8


@dataclass(frozen=True)
class CudaPlan(PlanBase):
    """A CUDA launch: ``block_tokens`` x ``block_heads`` tiles, ``num_warps`` per program."""

    num_warps: int

    @property
    def launch_options(self) -> dict:
        return {"num_warps": self.num_warps}


@functools.lru_cache(maxsize=None)
def plan(shape: KernelShape, facts: CudaFacts) -> CudaPlan:
    """The CUDA plan for one layer geometry on one GPU (pure: same inputs, same plan)."""
    block_heads = block_heads_for(shape, MAX_BLOCK_HEADS, MAX_HEAD_WASTE)
    rows = max(1, TILE_ELEMENTS // shape.padded_head_dim)
    block_tokens = prev_pow2(rows // block_heads)
    return CudaPlan(block_tokens=block_tokens, block_heads=block_heads,
                    max_programs=facts.num_sms * PROGRAMS_PER_SM, num_warps=NUM_WARPS)
