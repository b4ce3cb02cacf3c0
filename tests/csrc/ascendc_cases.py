"""What the AscendC host-build tests share: the case description, its inputs and the ulp bound.

A helper module (``tests/csrc/test_*.py`` import it), not a test module.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from vllm_ascend_ext.kernels import ascendc_plan
from vllm_ascend_ext.ops import reference
from vllm_ascend_ext.ops.models import AttentionGeometry
from vllm_ascend_ext.ops.tiling import KernelShape

#: Output error bound, in units of one ulp of the output dtype at the reference's magnitude
#: (the kernel rounds once from fp32; its fp32 arithmetic differs from float64 far below that).
ULP_BOUND = {torch.bfloat16: 1.0, torch.float16: 1.0}
MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10}
MIN_EXP = {torch.bfloat16: -126, torch.float16: -14}


def assert_close(out, ref, dtype):
    """``out`` within ULP_BOUND ulps of ``dtype`` of the float64 ``ref``, element by element."""
    assert out.dtype == dtype
    mag = ref.abs().clamp_min(2.0 ** MIN_EXP[dtype])
    ulp = torch.exp2(torch.floor(torch.log2(mag)) - MANTISSA_BITS[dtype])
    err = (out.double() - ref).abs() / ulp
    worst = err.max().item() if err.numel() else 0.0
    assert worst <= ULP_BOUND[dtype], f"max error {worst:.3f} ulp at {np.unravel_index(err.argmax(), err.shape)}"


# --- cases ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Case:
    tokens: int = 7
    hq: int = 4
    hkv: int = 2  # 0: a q-only layer
    d: int = 128
    r: int | None = None  # None: r = d
    dtype: torch.dtype = torch.bfloat16
    cache_dtype: torch.dtype = torch.float32
    neox: bool = True
    q_norm: bool = True
    k_norm: bool = True
    bias: bool = False
    weight_offset: float = 0.0
    pos_dtype: torch.dtype = torch.int64
    row_pad: int = 0  # extra elements per qkv row (a strided view)
    cache_pad: int = 0  # extra elements per cache row
    out_of_range: bool = False
    inplace: bool = False
    q_gate: bool = False
    v_norm: bool = False
    mrope: tuple[int, int, int] | None = None  # mRoPE's (t, h, w) lanes
    interleaved: bool = False
    text_positions: bool = False  # with mrope: [T] positions (a text-only batch)

    @property
    def rot(self) -> int:
        return self.d if self.r is None else self.r

    @property
    def geometry(self) -> AttentionGeometry:
        """The layer geometry (one norm flag: a q-only or k-only norm drops a weight afterwards)."""
        return AttentionGeometry(self.hq, self.hkv, self.d, self.rot, is_neox=self.neox,
                                 qk_norm=self.q_norm or self.k_norm, weight_offset=self.weight_offset,
                                 q_gate=self.q_gate, v_norm=self.v_norm, mrope_section=self.mrope,
                                 mrope_interleaved=self.interleaved)

    @property
    def mrope_positions(self) -> bool:
        """Positions are ``[3, T]`` (what the kernel is told: a text-only batch is plain RoPE)."""
        return self.mrope is not None and not self.text_positions

    def shape(self, cache_bytes: int = 4) -> KernelShape:
        shape = KernelShape.of(self.geometry, self.dtype.itemsize, cache_bytes)
        return dataclasses.replace(shape, mrope=self.mrope_positions)

    def plan(self, cache_bytes: int) -> ascendc_plan.AscendCPlan:
        """The plan the op launches this case with."""
        q_w, k_w = self.q_norm, self.k_norm and self.hkv > 0
        return ascendc_plan.plan(self.hq, self.hkv, self.d, self.rot, self.dtype.itemsize, cache_bytes,
                                 q_weight=q_w, k_weight=k_w, q_bias=self.bias and q_w, k_bias=self.bias and k_w,
                                 is_neox=self.neox, q_gate=self.q_gate, v_norm=self.v_norm, mrope=self.mrope_positions)


#: Rows of the cos/sin cache, and the positions of the out-of-range case: below 0, the first and
#: last rows, just past the end, far past it, int32's largest.
MAX_POSITION = 50
SPECIAL_POSITIONS = [-5, 0, MAX_POSITION - 1, MAX_POSITION, 10 * MAX_POSITION, 3, -1, 7, 2**31 - 1, 49, 1]


def make_inputs(case: Case, gen: torch.Generator) -> dict:
    """Fresh random op arguments for ``case`` (``ops.reference.make_inputs``; qkv possibly a view)."""
    kwargs = reference.make_inputs(
        case.geometry, case.tokens, dtype=case.dtype, cache_dtype=case.cache_dtype, positions_dtype=case.pos_dtype,
        bias=case.bias, row_padding=case.row_pad, cache_row_padding=case.cache_pad, max_position=MAX_POSITION,
        out_of_range=False, text_positions=case.text_positions, generator=gen)
    for tensor, normed in (("q", case.q_norm), ("k", case.k_norm)):
        if not normed:
            kwargs[f"{tensor}_weight"] = kwargs[f"{tensor}_bias"] = None
    if case.out_of_range:
        special = torch.tensor(SPECIAL_POSITIONS[:case.tokens], dtype=case.pos_dtype)
        # mRoPE: each axis its own order of the special positions
        kwargs["positions"] = torch.stack([special.roll(a) for a in range(3)]) if case.mrope_positions else special
    return kwargs
