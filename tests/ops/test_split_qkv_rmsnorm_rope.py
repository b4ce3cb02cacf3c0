"""Tests of ``vllm_ascend_ext.ops.split_qkv_rmsnorm_rope`` against an independent float64 reference.

On CPU the kernel runs through the Triton interpreter (small sizes); on a GPU the same tests run
compiled, plus the large sizes marked ``gpu``. Each test runs under every launch plan (Ascend, and
CUDA's large and small-batch plans), forced, so tile and grid boundaries of each are crossed
wherever the kernel runs; the variants of issue 10 (mRoPE, the gated q, v-norm, q-only layers) also
under a forced plan of tiny tiles that cuts every arm's heads into several blocks. Grids of cases x
plans are rotated in the default tier (each case one plan, every plan run) and run whole in the
full tier (``tiers.py``).

Out-of-place outputs are allocated full of NaN inside a frame of sentinels (``poisoned``,
``conftest.py``; the plans, tolerances and sentinels are ``op_checks.py``'s), and
:func:`run_and_check` checks every output against the float64 reference, the sentinels, and that
no column of ``qkv`` (nor its row padding) changed except those the call writes.
"""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
import torch

from vllm_ascend_ext.ops import reference, split_qkv_rmsnorm_rope
from vllm_ascend_ext.ops import tiling
from vllm_ascend_ext.ops.models import MODELS, AttentionGeometry, model
from vllm_ascend_ext.ops.reference import make_inputs
from vllm_ascend_ext.ops import settings
from vllm_ascend_ext.ops.tiling import KernelShape
from vllm_ascend_ext.ops.tiling.cuda import CudaPlan

from tiers import rotated

from op_checks import (COMPILED, PLAN_KINDS, PLANS, TOLERANCES, check_sentinels, forced, gpu, plan_of, shape_of,
                       whole_rows)

#: The op's kernel runs in these tests (what the triton-ascend suite reruns: ``-m kernel``).
pytestmark = pytest.mark.kernel

# The package re-exports the function under the module's name; the module itself, for its seams.
op_module = importlib.import_module("vllm_ascend_ext.ops.split_qkv_rmsnorm_rope")


def written_columns(shape: KernelShape, row_width: int, inplace: bool) -> torch.Tensor:
    """A mask of the columns of a padded qkv row the op may write: none out of place; q's, k's
    (and v's with ``v_norm``) in place."""
    written = torch.zeros(row_width, dtype=torch.bool)
    if inplace:
        d, k_col = shape.head_dim, shape.num_q_heads * shape.q_head_stride
        written[:shape.num_q_heads * d] = True  # in place is refused with a gate: q is contiguous
        written[k_col:k_col + (2 if shape.v_norm else 1) * shape.num_kv_heads * d] = True
    return written


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def run_and_check(args: dict, plan_kind: str | None = None, inplace: bool = False) -> tuple:
    """Run the op (optionally under a forced plan) and check every output against the reference.

    q and k (and v with ``v_norm``) to the dtype's tolerance, v without ``v_norm`` and the gate
    bit for bit; where each output lives (views of qkv in place, v a view of qkv unless
    normalised, new tensors otherwise); qkv's columns the call does not write, and its row
    padding, unchanged bit for bit; the sentinels around out-of-place outputs. Returns the
    outputs: ``(q, k, v)``, and the gate with ``q_gate``.
    """
    qkv = args["qkv"]
    shape = shape_of(args)
    rows = whole_rows(qkv)
    rows_before = rows.clone()
    before = qkv.clone()
    with forced(plan_kind, args):
        outputs = split_qkv_rmsnorm_rope(**args, inplace=inplace)
    expected = reference.split_qkv_rmsnorm_rope(**dict(args, qkv=before))
    assert len(outputs) == len(expected) == (4 if shape.q_gate else 3)
    q, k, v = outputs[:3]
    tokens, d = qkv.shape[0], shape.head_dim
    q_cols, kv_cols = shape.num_q_heads * d, shape.num_kv_heads * d
    assert q.shape == (tokens, q_cols) and k.shape == v.shape == (tokens, kv_cols)
    tol = TOLERANCES[qkv.dtype]
    torch.testing.assert_close(q.double().cpu(), expected[0].cpu(), **tol)
    torch.testing.assert_close(k.double().cpu(), expected[1].cpu(), **tol)
    if shape.v_norm:
        torch.testing.assert_close(v.double().cpu(), expected[2].cpu(), **tol)
    else:
        assert torch.equal(v.double(), expected[2]), "v is not qkv's v columns"
    if shape.q_gate:
        gate = outputs[3]
        assert gate.shape == (tokens, q_cols)
        assert torch.equal(gate.double(), expected[3]), "the gate is not a copy of qkv's gate columns"
    k_col = shape.num_q_heads * shape.q_head_stride
    views = {q: inplace, k: inplace, v: inplace or not shape.v_norm}
    if shape.q_gate:
        views[outputs[3]] = False
    columns = {q: 0, k: k_col, v: k_col + kv_cols}
    for output, is_view in views.items():
        if output.numel() == 0:  # an empty tensor has no address (k and v of a q-only layer, T = 0)
            continue
        if is_view:
            assert output.data_ptr() == qkv.data_ptr() + columns[output] * qkv.element_size()
        else:
            assert not _shares_memory(output, qkv)
    kept = ~written_columns(shape, rows.shape[1], inplace).to(rows.device)
    assert torch.equal(rows[:, kept], rows_before[:, kept]), "wrote a column of qkv the call does not write"
    check_sentinels()
    return outputs


#: Token counts the interpreter runs in a few seconds; larger looping cases are GPU-only.
INTERPRETER_MAX_TOKENS = 512


def tile_boundary_tokens(geometry: AttentionGeometry, plan_kind: str, device) -> list[int]:
    """1, odd, a full tile, just past a tile, and enough tiles that programs loop (grid-stride).

    The looping count is skipped in the interpreter when the plan's grid is large (the CUDA plan
    has SMs x 8 programs); ``test_grid_stride_loop`` covers looping there with a small plan.
    """
    shape = KernelShape.of(geometry, 2, 4)
    plan = plan_of(plan_kind, shape, device)
    bt = plan.block_tokens
    looping = bt * -(-(plan.max_programs + 1) // plan.head_blocks(shape)) + 1
    counts = {1, 3, bt, bt + 1, 2 * bt + 1}
    if device.type != "cpu" or looping <= INTERPRETER_MAX_TOKENS:
        counts.add(looping)
    return sorted(counts)


SMALL = model("Qwen3-30B-A3B").shard(4)  # 8/1/128: cheap in the interpreter, q and k blocks


@pytest.mark.parametrize("geometry,plan_kind",
                         rotated([SMALL, model("GLM-4-9B").shard(8), model("Phi-2").shard(8)], PLAN_KINDS))
def test_tile_boundaries(device, poisoned, plan_kind, geometry):
    for tokens in tile_boundary_tokens(geometry, plan_kind, device):
        run_and_check(make_inputs(geometry, tokens, device=device), plan_kind)


@pytest.mark.parametrize("spec,plan_kind", rotated(
    [pytest.param(m, id=m.name) for m in MODELS if not m.qk_norm_across_heads], PLAN_KINDS))
def test_model_table(device, poisoned, spec, plan_kind):
    """Every model of the table, sharded as far as vLLM runs it (small per-rank sizes), every plan
    (each model one plan in the default tier). (MiniMax-M2's norm across heads is another op's:
    ``test_split_qkv_tp_rmsnorm_rope.py``.)"""
    geometry = spec.shard(max(spec.tp_sizes))
    run_and_check(make_inputs(geometry, 19, device=device), plan_kind)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_dtypes(device, poisoned, dtype, cache_dtype):
    args = make_inputs(SMALL, 21, device=device, dtype=dtype, cache_dtype=cache_dtype,
                       positions_dtype=torch.int32)
    run_and_check(args, "ascend")


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 64), (80, 32), (96, 96), (128, 64), (192, 64),
                                                 (256, 256), (512, 128), (2, 2), (6, 4)])
def test_head_and_rotary_dims(device, poisoned, is_neox, head_dim, rotary_dim):
    geometry = AttentionGeometry(3, 1, head_dim, rotary_dim, is_neox=is_neox, weight_offset=0.5)
    run_and_check(make_inputs(geometry, 9, device=device, dtype=torch.float32), "cuda-large")


@pytest.mark.parametrize("which", ["both", "q only", "k only", "none"])
def test_optional_weights_and_bias(device, poisoned, which):
    args = make_inputs(SMALL, 13, device=device, bias=True)
    if which in ("k only", "none"):
        args.update(q_weight=None, q_bias=None)
    if which in ("q only", "none"):
        args.update(k_weight=None, k_bias=None)
    run_and_check(args, "ascend")


def test_gemma_offset_and_bias(device, poisoned):
    geometry = model("Gemma-3-12B").shard(4)
    run_and_check(make_inputs(geometry, 7, device=device, bias=True), "cuda-large")


@pytest.mark.parametrize("plan_kind", PLAN_KINDS)
@pytest.mark.parametrize("row_padding", [32, 24], ids=["aligned-view", "misaligned-view"])
def test_inplace_matches_out_of_place(device, poisoned, plan_kind, row_padding):
    """In place equals out of place, and writes nothing outside q's and k's columns."""
    check_in_place(make_inputs(SMALL, 29, device=device, row_padding=row_padding), plan_kind, device)


def check_in_place(args: dict, plan_kind: str, device) -> None:
    """In place equals out of place (``run_and_check`` checks each against the reference, and that
    only q's and k's columns, and v's with ``v_norm``, change in place).

    Bit-equal when qkv's row stride is a multiple of 16 elements like the outputs': then both
    calls compile to the same kernel. With a misaligned row stride the compiler specialises the
    in-place stores differently (narrower vectors, another reduction order: seen on the H200),
    so there the two agree to the dtype's tolerance; the interpreter is always bit-equal.
    """
    out_of_place = run_and_check(args, plan_kind)
    qkv = whole_rows(args["qkv"]).clone()[:, :args["qkv"].shape[1]]
    in_place = run_and_check(dict(args, qkv=qkv), plan_kind, inplace=True)
    for got, want in zip(in_place, out_of_place):
        if device.type == "cpu" or qkv.stride(0) % 16 == 0:
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, **TOLERANCES[want.dtype])


def test_grid_stride_loop(device, poisoned):
    """A plan with far fewer programs than tiles: every program walks many tiles."""
    plan = CudaPlan(block_tokens=2, block_heads=2, kv_block_heads=1, max_programs=3, num_warps=4)
    args = make_inputs(model("Qwen3-8B").shard(8), 23, device=device)
    with tiling.forced(plan=plan):
        run_and_check(args)


@pytest.mark.parametrize("plan_kind", PLAN_KINDS)
def test_repeated_calls_are_bit_identical(device, plan_kind):
    args = make_inputs(SMALL, 37, device=device)
    with forced(plan_kind, args):
        first = split_qkv_rmsnorm_rope(**args)
        second = split_qkv_rmsnorm_rope(**args)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_zero_tokens(device):
    args = make_inputs(SMALL, 0, device=device)
    q, k, v = split_qkv_rmsnorm_rope(**args)
    assert q.shape == (0, 8 * 128) and k.shape == (0, 128) and v.shape == (0, 128)
    q, k, v = split_qkv_rmsnorm_rope(**args, inplace=True)
    assert q.shape == (0, 8 * 128) and k.shape == (0, 128)


# --------------------------------------------------------------------------------------------
# The variants of issue 10: mRoPE ([3, T] positions, contiguous or interleaved sections), the
# gated q (gate copied out), v-norm, q-only layers (num_kv_heads=0), and their combinations.

def _case(label: str, geometry: AttentionGeometry, **inputs):
    """One feature case: a geometry and the ``make_inputs`` options it is drawn with."""
    return pytest.param(geometry, inputs, id=label)


BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
#: Every variant at once (also the position-layout, dtype and output-layout tests' layer).
ALL_FEATURES = AttentionGeometry(5, 3, 48, 32, is_neox=False, weight_offset=1.0, q_gate=True, v_norm=True,
                                 mrope_section=(6, 6, 4), mrope_interleaved=True)
#: Interpreter-sized layers of every variant and combination. Head counts are cut into several
#: blocks in every arm (q, k, gate, v) by the small-tiles plan, and by CUDA's 8-head blocks in the
#: last case; sections include zero parts and R/2 not a multiple of 3; the cases share out qkv
#: dtypes, int32/int64 positions, biases and padded (aligned and misaligned) qkv rows.
FEATURE_CASES = [
    _case("mrope 5/3/32 (6,5,5)", AttentionGeometry(5, 3, 32, 32, mrope_section=(6, 5, 5)), dtype=BF16),
    _case("mrope-i 5/3/32 (8,5,3)",
          AttentionGeometry(5, 3, 32, 32, mrope_section=(8, 5, 3), mrope_interleaved=True),
          dtype=FP16, positions_dtype=torch.int32),
    _case("mrope 3/1/48 R24 gptj (6,0,6)",
          AttentionGeometry(3, 1, 48, 24, is_neox=False, mrope_section=(6, 0, 6)), dtype=FP32, row_padding=24),
    _case("mrope-i 3/2/32 R28 (8,6,0)",
          AttentionGeometry(3, 2, 32, 28, weight_offset=0.5, mrope_section=(8, 6, 0), mrope_interleaved=True),
          dtype=BF16, bias=True),
    _case("mrope-i 2/1/32 R20 nonorm (0,5,5)",
          AttentionGeometry(2, 1, 32, 20, qk_norm=False, mrope_section=(0, 5, 5), mrope_interleaved=True),
          dtype=FP16),
    # Qwen3-Next's full-attention layer (16/2/256 R64, (1 + w) norm, gated q), scaled down.
    _case("gate 5/2/64 R16 w+1", AttentionGeometry(5, 2, 64, 16, weight_offset=1.0, q_gate=True),
          dtype=BF16, positions_dtype=torch.int32, row_padding=16),
    _case("vnorm 4/3/32", AttentionGeometry(4, 3, 32, 32, v_norm=True), dtype=FP16, row_padding=16),
    _case("vnorm 4/3/40 R16 gptj nonorm",
          AttentionGeometry(4, 3, 40, 16, is_neox=False, qk_norm=False, v_norm=True), dtype=FP32),
    _case("q-only 5/0/32", AttentionGeometry(5, 0, 32, 32), dtype=BF16, bias=True),
    _case("q-only 5/0/32 R8 gate w+1", AttentionGeometry(5, 0, 32, 8, weight_offset=1.0, q_gate=True),
          dtype=FP16, row_padding=8),
    _case("q-only 3/0/64 mrope-i (12,10,10)",
          AttentionGeometry(3, 0, 64, 64, mrope_section=(12, 10, 10), mrope_interleaved=True),
          dtype=FP32, positions_dtype=torch.int32),
    _case("all 5/3/48 R32 gptj w+1 gate vnorm mrope-i (6,6,4)", ALL_FEATURES,
          dtype=BF16, bias=True, positions_dtype=torch.int32, row_padding=16),
    _case("all 3/2/32 R16 nonorm gate vnorm mrope (3,3,2)",
          AttentionGeometry(3, 2, 32, 16, qk_norm=False, q_gate=True, v_norm=True, mrope_section=(3, 3, 2)),
          dtype=FP16, row_padding=8),
    _case("all 10/9/16 R8 gate vnorm mrope (2,1,1)",
          AttentionGeometry(10, 9, 16, 8, q_gate=True, v_norm=True, mrope_section=(2, 1, 1)), dtype=FP32),
]
IN_PLACE_CASES = [case for case in FEATURE_CASES if not case.values[0].q_gate]
MROPE_CASES = [case for case in FEATURE_CASES if case.values[0].mrope_section is not None]


def block_tokens(plan: str, args: dict) -> int:
    return plan_of(plan, shape_of(args), args["qkv"].device).block_tokens


@pytest.mark.parametrize("geometry,inputs,plan", rotated(FEATURE_CASES, PLANS))
def test_features(device, poisoned, plan, geometry, inputs):
    """Each variant against the reference: one token, and one past the plan's token block (every
    plan; each variant one plan in the default tier)."""
    crossing = block_tokens(plan, make_inputs(geometry, 1, device=device, **inputs)) + 1
    for tokens in (1, crossing):
        run_and_check(make_inputs(geometry, tokens, device=device, **inputs), plan)


@pytest.mark.parametrize("geometry,inputs,plan", rotated(IN_PLACE_CASES, PLANS))
def test_features_in_place(device, poisoned, plan, geometry, inputs):
    """In place: q's and k's columns (and v's with v-norm) written, equal to out of place; every
    other column of qkv (v's without v-norm, the row padding) untouched."""
    tokens = block_tokens(plan, make_inputs(geometry, 1, device=device, **inputs)) + 1
    check_in_place(make_inputs(geometry, tokens, device=device, **inputs), plan, device)


def test_gate_refuses_in_place(device):
    """A gated q cannot be written in place (its heads sit 2*D apart): refused, qkv untouched."""
    args = make_inputs(ALL_FEATURES, 5, device=device)
    before = args["qkv"].clone()
    with pytest.raises(ValueError, match="inplace=True cannot be combined with q_gate=True"):
        split_qkv_rmsnorm_rope(**args, inplace=True)
    assert torch.equal(args["qkv"], before)


@pytest.mark.parametrize("geometry,inputs", MROPE_CASES)
def test_text_only_positions_are_plain_rope(device, poisoned, geometry, inputs):
    """``[T]`` positions with a section (a text-only batch) are plain RoPE, bit for bit; so are
    ``[3, T]`` positions whose three axes are equal (a stride-0 view here), to the bit in the
    interpreter and to the dtype's tolerance compiled (another kernel variant, which the compiler
    may contract differently)."""
    args = make_inputs(geometry, 7, device=device, text_positions=True, **inputs)
    assert args["positions"].dim() == 1
    plan = "cuda-large"  # one plan: what is compared here is the math, not the tiling
    run_and_check(args, plan)
    with forced(plan, args):
        text = split_qkv_rmsnorm_rope(**args)
        plain = split_qkv_rmsnorm_rope(**dict(args, mrope_section=None, mrope_interleaved=False))
        equal_axes = split_qkv_rmsnorm_rope(**dict(args, positions=args["positions"].expand(3, -1)))
    assert len(text) == len(plain) == len(equal_axes)
    for got, want in zip(text, plain):
        assert torch.equal(got, want)
    for got, want in zip(equal_axes, plain):
        if device.type == "cpu":
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, **TOLERANCES[want.dtype])


@pytest.mark.parametrize("positions_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_mrope_position_layouts(device, poisoned, positions_dtype, layout):
    """``[3, T]`` positions as a contiguous tensor, as a ``[T, 3]`` tensor transposed (strides
    ``(1, 3)``), and as a strided slice of a wider tensor; two token blocks of the plan."""
    args = make_inputs(ALL_FEATURES, 9, device=device, positions_dtype=positions_dtype)
    positions = args["positions"]
    if layout == "transposed":
        positions = positions.T.contiguous().T
    elif layout == "strided":
        wide = torch.zeros(4, 2 * positions.shape[1], dtype=positions_dtype, device=device)
        wide[1:, ::2] = positions
        positions = wide[1:, ::2]
    assert positions.shape == (3, 9) and positions.is_contiguous() == (layout == "contiguous")
    assert block_tokens("cuda-large", args) < 9
    run_and_check(dict(args, positions=positions), "cuda-large")


@pytest.mark.parametrize("dtype,cache_dtype", [(BF16, FP32), (FP16, FP16), (FP32, BF16)], ids=str)
def test_feature_dtypes(device, poisoned, dtype, cache_dtype):
    args = make_inputs(ALL_FEATURES, 11, device=device, dtype=dtype, cache_dtype=cache_dtype, bias=True)
    run_and_check(args, "ascend")


@pytest.mark.parametrize("geometry,inputs", FEATURE_CASES)
def test_features_zero_tokens(device, poisoned, geometry, inputs):
    args = make_inputs(geometry, 0, device=device, **inputs)
    run_and_check(args)
    if not geometry.q_gate:
        run_and_check(args, inplace=True)


def test_written_outputs_are_contiguous(device):
    """Out of place, q, k, the normalised v and the gate are new contiguous tensors (the launcher's
    own allocation, not the tests' framed one)."""
    args = make_inputs(ALL_FEATURES, 6, device=device, row_padding=16)
    outputs = split_qkv_rmsnorm_rope(**args)
    assert len(outputs) == 4
    for output in outputs:
        assert output.is_contiguous() and not _shares_memory(output, args["qkv"])


def _bad(args, **changes):
    return dict(args, **changes)


BAD_INPUTS = [
    ("qkv", lambda a, d: _bad(a, qkv=a["qkv"][:, :-2])),
    ("qkv", lambda a, d: _bad(a, qkv=a["qkv"].to(torch.int32))),
    ("qkv", lambda a, d: _bad(a, qkv=a["qkv"].t().contiguous().t())),
    ("qkv", lambda a, d: _bad(a, qkv=a["qkv"][0])),
    ("num_q_heads", lambda a, d: _bad(a, num_q_heads=0)),
    ("num_kv_heads", lambda a, d: _bad(a, num_kv_heads=1.0)),
    ("head_dim", lambda a, d: _bad(a, head_dim=127)),
    ("head_dim", lambda a, d: _bad(a, head_dim=514, num_q_heads=1, num_kv_heads=1,
                                   qkv=torch.zeros(3, 3 * 514, device=d))),
    ("q_weight", lambda a, d: _bad(a, q_weight=a["q_weight"][:-1])),
    ("k_weight", lambda a, d: _bad(a, k_weight=a["k_weight"].to(torch.int64))),
    ("q_bias", lambda a, d: _bad(a, q_weight=None, q_bias=a["q_weight"])),
    ("k_bias", lambda a, d: _bad(a, k_bias=torch.zeros(5, device=d))),
    ("cos_sin_cache", lambda a, d: _bad(a, cos_sin_cache=a["cos_sin_cache"][:, :-1])),
    ("cos_sin_cache", lambda a, d: _bad(a, cos_sin_cache=torch.zeros(4, 130, device=d))),
    ("cos_sin_cache", lambda a, d: _bad(a, cos_sin_cache=a["cos_sin_cache"].to(torch.float64))),
    ("cos_sin_cache", lambda a, d: _bad(a, cos_sin_cache=torch.zeros(0, 128, device=d))),
    ("positions", lambda a, d: _bad(a, positions=a["positions"][:-1])),
    ("positions", lambda a, d: _bad(a, positions=a["positions"].float())),
    ("eps", lambda a, d: _bad(a, eps=-1.0)),
    ("eps", lambda a, d: _bad(a, eps=math.nan)),
    ("weight_offset", lambda a, d: _bad(a, weight_offset=math.inf)),
    # Flags must be real bools: a string such as "false" is truthy and once meant NeoX / in place.
    ("is_neox", lambda a, d: _bad(a, is_neox="false")),
    ("inplace", lambda a, d: _bad(a, inplace="no")),
    ("is_neox", lambda a, d: _bad(a, is_neox=1)),
    # Scalars must stay finite as the kernel's fp32 arguments (10**400 once raised OverflowError,
    # 1e39 became inf in the kernel).
    ("eps", lambda a, d: _bad(a, eps=10**400)),
    ("eps", lambda a, d: _bad(a, eps=1e39)),
    ("weight_offset", lambda a, d: _bad(a, weight_offset=-1e39)),
    ("eps", lambda a, d: _bad(a, eps="1e-6")),
    ("num_q_heads", lambda a, d: _bad(a, num_q_heads=np.float64(8))),
    ("head_dim", lambda a, d: _bad(a, head_dim=True)),
]


@pytest.mark.parametrize("name,change", BAD_INPUTS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD_INPUTS)])
def test_bad_inputs_name_the_argument(device, name, change):
    args = change(make_inputs(SMALL, 5, device=device), device)
    with pytest.raises(ValueError, match=name):
        split_qkv_rmsnorm_rope(**args)


#: A gated mRoPE layer (R/2 = 16) and a q-only one: the bases of the feature arguments' bad inputs.
GATED_MROPE = AttentionGeometry(4, 2, 32, 32, q_gate=True, mrope_section=(6, 5, 5))
Q_ONLY = AttentionGeometry(4, 0, 32, 32)


def _q_only(d, **changes):
    return dict(make_inputs(Q_ONLY, 5, device=d), **changes)


def _vector(d, value=0.0):
    return torch.full((32,), value, dtype=torch.bfloat16, device=d)


#: (pattern the message must match, change): each names the argument it rejects.
FEATURE_BAD_INPUTS = [
    ("mrope_section", lambda a, d: _bad(a, mrope_section=(6, 5, 4))),  # sums to 15, R/2 = 16
    ("mrope_section", lambda a, d: _bad(a, mrope_section=(6, 5, 5, 0))),
    ("mrope_section", lambda a, d: _bad(a, mrope_section=(8, 8))),
    ("mrope_section", lambda a, d: _bad(a, mrope_section=(-1, 9, 8))),
    ("mrope_section", lambda a, d: _bad(a, mrope_section=(6.0, 5, 5))),
    ("mrope_section", lambda a, d: _bad(a, mrope_section=(True, 7, 8))),
    ("mrope_section", lambda a, d: _bad(a, mrope_section="655")),
    ("mrope_section", lambda a, d: _bad(a, mrope_section=6)),
    ("mrope_section", lambda a, d: _bad(a, mrope_section=None)),  # [3, T] positions without sections
    ("positions", lambda a, d: _bad(a, positions=a["positions"][:2])),  # [2, T]
    ("positions", lambda a, d: _bad(a, positions=torch.cat([a["positions"], a["positions"][:, :1]], 1))),
    ("positions", lambda a, d: _bad(a, positions=a["positions"][None])),  # [1, 3, T]
    ("positions", lambda a, d: _bad(a, positions=a["positions"].float())),
    ("mrope_interleaved", lambda a, d: _bad(a, mrope_section=None, mrope_interleaved=True,
                                            positions=a["positions"][0])),
    ("mrope_interleaved", lambda a, d: _bad(a, mrope_interleaved="true")),
    ("inplace=True cannot be combined with q_gate", lambda a, d: _bad(a, inplace=True)),
    ("q_gate", lambda a, d: _bad(a, q_gate=1)),
    ("v_norm", lambda a, d: _bad(a, v_norm="false")),
    ("qkv", lambda a, d: _bad(a, q_gate=False)),  # a gated qkv is wider than an ungated layer's
    ("qkv", lambda a, d: _bad(a, qkv=a["qkv"][:, :(4 + 2 * 2) * 32])),  # ungated width, q_gate=True
    ("v_norm", lambda a, d: _q_only(d, v_norm=True)),
    ("k_weight", lambda a, d: _q_only(d, k_weight=_vector(d, 1.0))),
    ("k_weight", lambda a, d: _q_only(d, k_weight=_vector(d, 1.0), k_bias=_vector(d))),
    ("k_bias", lambda a, d: _q_only(d, k_bias=_vector(d))),
    ("qkv", lambda a, d: _q_only(d, qkv=torch.zeros(5, 6 * 32, dtype=torch.bfloat16, device=d))),
    ("num_kv_heads", lambda a, d: _q_only(d, num_kv_heads=-1)),
]


@pytest.mark.parametrize("name,change", FEATURE_BAD_INPUTS,
                         ids=[f"{n.split()[0]}-{i}" for i, (n, _) in enumerate(FEATURE_BAD_INPUTS)])
def test_bad_feature_inputs_name_the_argument(device, name, change):
    """Bad mRoPE sections and positions, bad flags, a gate in place, v-norm or k's weights in a
    q-only layer, qkv of the wrong width: ``ValueError`` naming the argument, qkv untouched."""
    args = change(make_inputs(GATED_MROPE, 5, device=device), device)
    before = args["qkv"].clone()
    with pytest.raises(ValueError, match=name):
        split_qkv_rmsnorm_rope(**args)
    assert torch.equal(args["qkv"], before)


def test_numpy_integers_are_head_counts(device, poisoned):
    args = make_inputs(SMALL, 7, device=device)
    run_and_check(dict(args, num_q_heads=np.int64(args["num_q_heads"]), num_kv_heads=np.int32(1),
                       head_dim=np.int64(args["head_dim"])))


def test_cpu_tensors_without_the_interpreter_say_so(monkeypatch):
    """Without TRITON_INTERPRET the op refuses CPU tensors by name (Triton's own message was a bare
    "0 active drivers")."""
    args = make_inputs(SMALL, 3, device="cpu")
    monkeypatch.setenv(settings.TRITON_INTERPRET, "0")
    with pytest.raises(ValueError, match="qkv is on the CPU.*TRITON_INTERPRET=1"):
        split_qkv_rmsnorm_rope(**args)


def test_device_mismatch_names_the_argument(device):
    if device.type == "cpu":
        pytest.skip("needs a second device type")
    args = make_inputs(SMALL, 5, device=device)
    with pytest.raises(ValueError, match="positions"):
        split_qkv_rmsnorm_rope(**dict(args, positions=args["positions"].cpu()))


# --------------------------------------------------------------------------------------------
# Compiled-kernel properties and large sizes: GPU only (the interpreter neither compiles nor
# runs large sizes in reasonable time).



def _compiled_variants() -> int:
    kernel = op_module.split_qkv_rmsnorm_rope_kernel
    caches = getattr(kernel, "device_caches", None)
    if caches is not None:  # Triton >= 3.3
        return sum(len(entry[0]) for entry in caches.values())
    return sum(len(entry) for entry in kernel.cache.values())


@gpu
@pytest.mark.parametrize("geometry", [SMALL, ALL_FEATURES], ids=lambda g: g.label)
def test_no_recompile_per_batch_size(device, geometry):
    """One kernel for small batches and one for large ones, compiled once each."""
    split_qkv_rmsnorm_rope(**make_inputs(geometry, 1, device=device))
    split_qkv_rmsnorm_rope(**make_inputs(geometry, 8192, device=device))
    compiled = _compiled_variants()
    for tokens in (2, 16, 17, 63, 64, 1000, 4096, 8191):
        split_qkv_rmsnorm_rope(**make_inputs(geometry, tokens, device=device))
    assert _compiled_variants() == compiled


@gpu
def test_cuda_graph_dependent_calls(device):
    """Twenty in-place calls captured in one graph, each reading the q and k the one before wrote
    (what dependent launch must order: the kernel waits for the grid before it), replay as they
    run one by one."""
    args = make_inputs(SMALL, 4097, device=device)
    qkv = args.pop("qkv")
    eager, captured = qkv.clone(), qkv.clone()
    for _ in range(20):
        split_qkv_rmsnorm_rope(eager, **args, inplace=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(20):
            split_qkv_rmsnorm_rope(captured, **args, inplace=True)
    captured.copy_(qkv)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


@gpu
@pytest.mark.parametrize("geometry", [SMALL, ALL_FEATURES], ids=lambda g: g.label)
def test_cuda_graph_capture(device, geometry):
    args = make_inputs(geometry, 64, device=device)
    expected = split_qkv_rmsnorm_rope(**args)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = split_qkv_rmsnorm_rope(**args)
    graph.replay()
    torch.cuda.synchronize()
    assert len(captured) == len(expected)
    assert all(torch.equal(got, want) for got, want in zip(captured, expected))


@gpu
@pytest.mark.parametrize("plan_kind", PLAN_KINDS)
@pytest.mark.parametrize("name,tp", [("Qwen3-8B", 1), ("Qwen3-235B-A22B", 1), ("Qwen3-32B", 8),
                                     ("Qwen3-Next-80B-A3B", 1), ("GLM-4-9B", 1), ("Phi-3-mini", 1)])
@pytest.mark.parametrize("tokens", [4097, 16384 + 3])
def test_large(device, poisoned, plan_kind, name, tp, tokens):
    run_and_check(make_inputs(model(name).shard(tp), tokens, device=device), plan_kind)


def _large(name: str, tp: int):
    return pytest.param(model(name).shard(tp), id=f"{name}-tp{tp}")


#: Issue 10's layers at model sizes: rows of the geometry table (Qwen3-VL interleaved mRoPE,
#: Qwen2.5-VL contiguous mRoPE, Qwen3-Next's and Qwen3.5's gated q with (1 + w) and partial
#: rotary, Gemma-4's v-norm layers of both head sizes and its q-only KV-shared layers), and two
#: made-up layers: a 512-wide v-norm layer with partial rotary (its tail is cut into chunks by the
#: CUDA plan, in the v arm too) and everything at once, crossing CUDA's 8-head blocks in every arm.
LARGE_FEATURES = [
    _large("Qwen3-VL-8B", 1),
    _large("Qwen2.5-VL-7B", 1),
    _large("Qwen3-Next-80B-A3B", 1),
    _large("Qwen3.5-35B-A3B", 1),
    _large("Gemma-4-26B-A4B:sliding", 1),
    _large("Gemma-4-31B:full", 1),
    _large("Gemma-4-E2B:sliding-kv-shared", 1),
    _large("Gemma-4-E2B:full-kv-shared", 1),
    pytest.param(AttentionGeometry(16, 4, 512, 128, v_norm=True), id="16/4/512 R128 vnorm"),
    pytest.param(AttentionGeometry(12, 10, 128, 64, is_neox=False, weight_offset=1.0, q_gate=True, v_norm=True,
                                   mrope_section=(12, 10, 10), mrope_interleaved=True), id="all"),
]
#: Compiled on a GPU: past a large tile count, and ~16k tokens, under every plan. In the
#: interpreter the same cases run reduced (a few tokens, one plan), so that the test itself is
#: exercised wherever the suite runs; the feature tests above cover the plans there.
LARGE_TOKENS = (4097, 16384 + 3) if COMPILED else (3,)
LARGE_PLAN_KINDS = PLAN_KINDS if COMPILED else ("cuda-large",)


@pytest.mark.parametrize("plan_kind", LARGE_PLAN_KINDS)
@pytest.mark.parametrize("geometry", LARGE_FEATURES)
@pytest.mark.parametrize("tokens", LARGE_TOKENS)
def test_large_features(device, poisoned, plan_kind, geometry, tokens):
    """The variants at model sizes, out of place and (where allowed) in place, every plan."""
    args = make_inputs(geometry, tokens, device=device, max_position=4099)
    if geometry.q_gate:
        run_and_check(args, plan_kind)
    else:
        check_in_place(args, plan_kind, device)
