"""The AscendC kernel, built for the host against csrc/ascendc_host_sim, against a float64 reference.

What passing means: the kernel's algorithm, tiling and indexing are right for every case below
(the variants mRoPE, gated q, v-norm and q-only layers included, alone and combined with what
existed), and it keeps the rules the host layer enforces (UB capacity, 32-byte alignment, queue
pairing, pipe synchronisation, GM bounds, every block index run). It does not mean CANN compiles
it or says anything about NPU speed or NPU correctness (docs/ascendc.md).
"""

from __future__ import annotations

import ctypes
import dataclasses

import numpy as np
import pytest
import torch

from ascendc_cases import MAX_POSITION, Case, assert_close, make_inputs
from host_sim import SimViolation, byte_mask, poison_new_outputs
from vllm_ascend_ext.kernels import ascendc, ascendc_plan
from vllm_ascend_ext.ops import reference
from vllm_ascend_ext.ops.device import ascend_facts
from vllm_ascend_ext.ops.models import AttentionGeometry
from vllm_ascend_ext.ops.tiling import KernelShape
from vllm_ascend_ext.ops.tiling import ascend as ascend_tiling

CASES = [
    Case(),
    Case(dtype=torch.float16, cache_dtype=torch.float16),
    Case(cache_dtype=torch.bfloat16, pos_dtype=torch.int32),
    Case(dtype=torch.float16, cache_dtype=torch.bfloat16),
    Case(neox=False, r=64, tokens=9),  # GLM-4 style: partial GPT-J
    Case(neox=False, dtype=torch.float16),
    Case(d=64, hq=8, hkv=1),
    Case(d=80, r=32, hq=3, hkv=3, q_norm=False, k_norm=False),  # Phi-2 style
    Case(d=96, hq=5, hkv=5, q_norm=False, k_norm=False, dtype=torch.float16),  # Phi-3 style
    Case(d=192, r=64, hq=4, hkv=1),  # MiMo style
    Case(d=256, r=64, hq=2, hkv=1, weight_offset=1.0),  # Qwen3-Next style
    Case(d=256, hq=3, hkv=2, weight_offset=1.0, neox=False),
    Case(bias=True),
    Case(bias=True, q_norm=True, k_norm=False, dtype=torch.float16),
    Case(q_norm=False, k_norm=True),
    Case(d=72, r=40, hq=3, hkv=1, bias=True),  # D not a multiple of 16: padded UB rows
    Case(d=2 * 7, r=2, hq=1, hkv=1),  # tiny head, R = 2
    Case(tokens=1, hq=1, hkv=1),
    Case(tokens=1, hq=64, hkv=4, d=128),
    Case(tokens=33, hq=12, hkv=2, row_pad=64, cache_pad=8),
    Case(tokens=11, out_of_range=True),
    Case(tokens=6, inplace=True, row_pad=32),
    Case(tokens=5, inplace=True, neox=False, r=64, bias=True, dtype=torch.float16),
]

#: The variants (issue 10), alone and with what existed.
VARIANT_CASES = [
    # mRoPE, contiguous sections: Qwen2-VL / Qwen2.5-VL (no q/k norm), partial rotary, GPT-J
    Case(mrope=(16, 24, 24), q_norm=False, k_norm=False),
    Case(mrope=(16, 24, 24), dtype=torch.float16, cache_dtype=torch.float16, pos_dtype=torch.int32),
    Case(mrope=(8, 12, 12), r=64, neox=False, tokens=9),
    Case(mrope=(32, 0, 0), d=64, hq=8, hkv=1),  # one section: only the t rows are read
    Case(mrope=(0, 10, 6), d=64, r=32, cache_dtype=torch.bfloat16),  # no t lanes
    Case(mrope=(16, 24, 24), bias=True, weight_offset=1.0, tokens=11, out_of_range=True),
    Case(mrope=(16, 24, 24), tokens=33, hq=12, hkv=2, row_pad=64, cache_pad=8),
    Case(mrope=(16, 24, 24), inplace=True, row_pad=32, tokens=5),
    # mRoPE, interleaved: Qwen3-VL, odd and short sections, partial rotary
    Case(mrope=(24, 20, 20), interleaved=True),
    Case(mrope=(24, 20, 20), interleaved=True, dtype=torch.float16, cache_dtype=torch.bfloat16, neox=False),
    Case(mrope=(5, 6, 5), interleaved=True, d=72, r=32, hq=3, hkv=1, bias=True),
    Case(mrope=(1, 0, 1), interleaved=True, d=14, r=4, hq=1, hkv=1),  # w's lane is past R/2: t takes it
    Case(mrope=(24, 20, 20), interleaved=True, tokens=11, out_of_range=True, pos_dtype=torch.int32),
    Case(mrope=(12, 10, 10), interleaved=True, r=64, inplace=True, neox=False, dtype=torch.float16),
    # gated q: Qwen3-Next / Qwen3.5 (partial rotary, 1 + w), GPT-J, no norm, bias, fp16, padded rows
    Case(q_gate=True, d=256, r=64, hq=4, hkv=1, weight_offset=1.0),
    Case(q_gate=True, neox=False, r=64, tokens=9),
    Case(q_gate=True, q_norm=False, k_norm=False, d=80, r=32, hq=3, hkv=3),
    Case(q_gate=True, bias=True, dtype=torch.float16, cache_dtype=torch.float16),
    Case(q_gate=True, d=72, r=40, hq=3, hkv=1, tokens=33, row_pad=48, cache_pad=8),
    Case(q_gate=True, tokens=11, out_of_range=True, pos_dtype=torch.int32),
    Case(q_gate=True, mrope=(24, 20, 20), interleaved=True, weight_offset=1.0),
    Case(q_gate=True, mrope=(8, 12, 12), r=64, hq=16, hkv=2, tokens=3),
    # v-norm: Gemma-4 style, in place, with the other variants
    Case(v_norm=True, d=256, hq=8, hkv=1, weight_offset=1.0),
    Case(v_norm=True, dtype=torch.float16, neox=False, r=64),
    Case(v_norm=True, q_norm=False, k_norm=False, tokens=9),
    Case(v_norm=True, inplace=True, row_pad=32, bias=True),
    Case(v_norm=True, inplace=True, mrope=(16, 24, 24), dtype=torch.float16),
    Case(v_norm=True, q_gate=True, mrope=(24, 20, 20), interleaved=True, row_pad=16, tokens=10),
    # q-only layers (Gemma-4's KV-shared layers): q alone, gated, in place, no norm, mRoPE
    Case(hkv=0, d=256, hq=8, weight_offset=1.0),
    Case(hkv=0, q_norm=False, k_norm=False, neox=False, r=64, dtype=torch.float16),
    Case(hkv=0, inplace=True, row_pad=32, bias=True),
    Case(hkv=0, q_gate=True, mrope=(5, 6, 5), interleaved=True, d=64, r=32, hq=3),
]


@pytest.fixture(autouse=True)
def _poisoned_outputs(monkeypatch):
    """Every new output the AscendC ops allocate starts as NaN: an element the kernel does not
    write fails the comparison with the reference."""
    poison_new_outputs(monkeypatch, "_outputs")


def run_case(case: Case, host_sim, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    kwargs = make_inputs(case, gen)
    qkv = kwargs["qkv"]
    before = qkv.clone()
    ref = reference.split_qkv_rmsnorm_rope(**kwargs)
    out = ascendc.split_qkv_rmsnorm_rope(**{**kwargs, "inplace": case.inplace})
    assert len(out) == (4 if case.q_gate else 3)
    res = dict(qkv=qkv, before=before, cache=kwargs["cos_sin_cache"], positions=kwargs["positions"], q=out[0],
               k=out[1], v=out[2], ref_q=ref[0], ref_k=ref[1], ref_v=ref[2], kwargs=kwargs)
    if case.q_gate:
        res.update(gate=out[3], ref_gate=ref[3])
    return res


def check_outputs(case: Case, res) -> None:
    """q, k (and v with v-norm) within an ulp of the reference; the gate bit-exact; v otherwise
    the untouched view of qkv; qkv written only in place, and there only q, k (and v)."""
    assert_close(res["q"], res["ref_q"], case.dtype)
    assert_close(res["k"], res["ref_k"], case.dtype)
    assert res["k"].shape == (case.tokens, case.hkv * case.d)
    q_cols, kv_cols = case.hq * case.d, case.hkv * case.d
    k_col = (2 if case.q_gate else 1) * q_cols
    v_cols = slice(k_col + kv_cols, k_col + 2 * kv_cols)
    if case.v_norm:
        assert_close(res["v"], res["ref_v"], case.dtype)
        assert (res["v"].data_ptr() == res["qkv"][:, v_cols].data_ptr()) == case.inplace
    else:
        assert res["v"].data_ptr() == res["qkv"][:, v_cols].data_ptr() and res["v"].shape == (case.tokens, kv_cols)
        assert torch.equal(res["qkv"][:, v_cols], res["before"][:, v_cols])
    if case.q_gate:
        assert res["gate"].shape == (case.tokens, q_cols) and res["gate"].is_contiguous()
        assert torch.equal(res["gate"].double(), res["ref_gate"])
    if case.inplace:
        assert res["q"].data_ptr() == res["qkv"].data_ptr()
    else:
        assert torch.equal(res["qkv"], res["before"])


def check_memory(case: Case, host_sim, res):
    """What the kernel read and wrote in GM, byte by byte: the row padding of qkv is the sentinel
    between its rows, never read or written."""
    qkv = res["qkv"]
    qkv_region = host_sim.regions["qkv"]
    q_cols, kv_cols = case.hq * case.d, case.hkv * case.d
    k_col = (2 if case.q_gate else 1) * q_cols
    v_bytes = byte_mask(qkv[:, k_col + kv_cols:], qkv_region)
    qk_bytes = byte_mask(qkv[:, :k_col + kv_cols], qkv_region)
    row_bytes = qk_bytes | v_bytes
    if case.v_norm:
        assert (qkv_region.read & v_bytes).sum() == v_bytes.sum(), "some v input was not read"
    else:
        assert not (qkv_region.read & v_bytes).any(), "v was read"
        assert not (qkv_region.written & v_bytes).any(), "v was written"
    assert (qkv_region.read & qk_bytes).sum() == qk_bytes.sum(), "some q/gate/k input was not read"
    assert not (qkv_region.read & ~row_bytes).any(), "row padding was read"
    if case.inplace:
        written = qk_bytes | (v_bytes if case.v_norm else False)
        assert (qkv_region.written == written).all(), "in place must write exactly q and k (and v with v_norm)"
    else:
        assert not qkv_region.written.any(), "out of place wrote into qkv"
        outputs = ["q_out"] + (["k_out"] if case.hkv else []) + (["v_out"] if case.v_norm else [])
        for name in outputs:
            assert host_sim.regions[name].written.all(), f"{name} not fully written"
    if case.q_gate:
        assert host_sim.regions["gate_out"].written.all(), "gate_out not fully written"
        assert not host_sim.regions["gate_out"].read.any(), "gate_out was read"
    cache_region = host_sim.regions["cos_sin_cache"]
    rows = np.zeros_like(cache_region.read)
    for p in _rows_read(case, res["positions"], res["cache"].shape[0]):
        rows |= byte_mask(res["cache"][p], cache_region)
    assert (cache_region.read == rows).all(), "cache read outside the tokens' (clamped) rows"


def _rows_read(case: Case, positions: torch.Tensor, max_position: int) -> list[int]:
    """The cache rows a kernel must read: each token's clamped position, with mRoPE on the axes
    some frequency lane takes (``reference._lane_axes``, the definition)."""
    pos = positions.long().clamp(0, max_position - 1)
    if case.mrope_positions:
        axes = reference._lane_axes(case.rot // 2, case.mrope, case.interleaved).unique()
        pos = pos[axes]
    return pos.unique().tolist()


# --- the host layer itself --------------------------------------------------------------------
SCENARIOS = {
    "ub_fits": None,
    "ub_overflow": "UB overflow",
    "datacopy_aligned": None,
    "datacopy_unaligned_length": "not a multiple of 32 (use DataCopyPad)",
    "datacopypad_unaligned_length": None,
    "datacopy_unaligned_ub_address": "not 32-byte aligned",
    "vector_unaligned_ub_address": "not 32-byte aligned",
    "queue_ok": None,
    "deque_empty": "DeQue: queue is empty",
    "enque_beyond_depth": "EnQue beyond depth",
    "alloc_exhausted": "every buffer of the queue is in use",
    "leaked_buffer": "not freed",
    "left_in_queue": "still enqueued",
    "double_free": "freed twice",
    "use_while_queued": "sits in a queue",
    "vector_reads_copy_in_without_deque": "MTE2 may still be writing",
    "missing_pipe_barrier": "without PipeBarrier<PIPE_V>",
    "with_pipe_barrier": None,
    "missing_v_s_flag": "V_S",
    "with_v_s_flag": None,
    "missing_s_v_flag": "S_V",
    "wait_without_set": "WaitFlag without a matching SetFlag",
    "copy_out_without_sync": "copy-out of UB the vector unit wrote",
    "gm_past_declared_size": "outside the declared GM buffer",
    "gm_write_read_only": "read-only GM tensor",
    "cast_half_int8_nan": "NaN source (not modelled)",
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_host_layer_enforces_hardware_rules(selftest_lib, scenario):
    err = ctypes.create_string_buffer(512)
    rc = selftest_lib.selftest_run(scenario.encode(), err, len(err))
    expected = SCENARIOS[scenario]
    if expected is None:
        assert rc == 0, err.value.decode()
    else:
        assert rc == -1 and expected in err.value.decode(), err.value.decode()


def test_host_layer_runs_every_block_index(selftest_lib):
    out = (ctypes.c_int32 * 10)(*([-1] * 10))
    assert selftest_lib.selftest_blocks(out, 5) == 5
    assert list(out) == [0, 5, 1, 5, 2, 5, 3, 5, 4, 5]


def test_tiling_struct_layout_matches_c(host_sim):
    offsets = [getattr(ascendc_plan.Tiling, name).offset for name, _ in ascendc_plan.Tiling._fields_]
    assert host_sim.tiling_layout() == [ctypes.sizeof(ascendc_plan.Tiling)] + offsets


# --- the kernel ---------------------------------------------------------------------------------
def _case_id(c: Case) -> str:
    return ",".join(f"{f.name}={getattr(c, f.name)}" for f in dataclasses.fields(c)
                    if getattr(c, f.name) != f.default) or "default"


@pytest.mark.parametrize("case", CASES + VARIANT_CASES, ids=_case_id)
def test_matches_float64_reference(host_sim, case):
    res = run_case(case, host_sim)
    check_outputs(case, res)
    check_memory(case, host_sim, res)
    plan = case.plan(res["cache"].element_size())
    assert host_sim.ub_peak == plan.ub_bytes <= plan.ub_budget, "UB model differs from the kernel's allocation"
    shape = case.shape(res["cache"].element_size())
    assert host_sim.blocks_run == host_sim.block_dim == plan.grid(shape, case.tokens)
    assert host_sim.tiling.numTiles == plan.num_tiles(shape, case.tokens)


@pytest.mark.parametrize("case", [
    Case(mrope=(16, 24, 24)),
    Case(mrope=(12, 10, 10), interleaved=True, q_gate=True, neox=False, r=64),
    Case(mrope=(8, 12, 12), r=64, hkv=0, dtype=torch.float16),
], ids=_case_id)
def test_text_only_positions_are_plain_rope(host_sim, case):
    """``[T]`` positions with a section (a text-only batch, every axis equal): the kernel is told
    plain RoPE, and its outputs are bit-identical to a call without a section."""
    text = dataclasses.replace(case, text_positions=True)
    kwargs = make_inputs(text, torch.Generator().manual_seed(8))
    assert kwargs["positions"].dim() == 1 and kwargs["mrope_section"] == case.mrope
    with_section = ascendc.split_qkv_rmsnorm_rope(**kwargs)
    assert not host_sim.tiling.flags & (ascendc_plan.FLAG_MROPE | ascendc_plan.FLAG_MROPE_INTERLEAVED)
    plain = ascendc.split_qkv_rmsnorm_rope(**{**kwargs, "mrope_section": None, "mrope_interleaved": False})
    for a, b in zip(with_section, plain, strict=True):
        assert torch.equal(a, b)
    ref = reference.split_qkv_rmsnorm_rope(**kwargs)
    assert_close(with_section[0], ref[0], case.dtype)
    # the same positions on all three axes of [3, T] give the same numbers too
    axes = ascendc.split_qkv_rmsnorm_rope(**{**kwargs, "positions": kwargs["positions"].expand(3, -1)})
    assert host_sim.tiling.flags & ascendc_plan.FLAG_MROPE and host_sim.tiling.positionAxisStride == 0
    for a, b in zip(axes, plain, strict=True):
        assert torch.equal(a, b)


def test_mrope_axes_are_read_from_their_own_rows(host_sim):
    """Each axis moved alone changes exactly the lanes of that axis (contiguous sections): a lane
    read from the wrong axis would change with another axis's position."""
    case = Case(mrope=(4, 6, 6), d=32, hq=1, hkv=1, q_norm=False, k_norm=False, tokens=3)
    kwargs = make_inputs(case, torch.Generator().manual_seed(2))
    q0 = ascendc.split_qkv_rmsnorm_rope(**kwargs)[0].double()
    half = case.rot // 2
    lanes_of_axis = [range(0, 4), range(4, 10), range(10, 16)]
    for axis, lanes in enumerate(lanes_of_axis):
        moved = kwargs["positions"].clone()
        moved[axis] = (moved[axis] + 17) % MAX_POSITION
        q = ascendc.split_qkv_rmsnorm_rope(**{**kwargs, "positions": moved})[0].double()
        changed = (q != q0).any(dim=0)  # per column of q (one head)
        pairs = changed[:half] | changed[half:]
        assert pairs[list(lanes)].all() and not pairs[[i for i in range(half) if i not in lanes]].any()


def test_mrope_positions_as_a_strided_view(host_sim):
    """``[3, T]`` positions that are the transpose of a ``[T, 3]`` tensor (axis stride 1)."""
    case = Case(mrope=(24, 20, 20), interleaved=True, tokens=9)
    kwargs = make_inputs(case, torch.Generator().manual_seed(4))
    kwargs["positions"] = kwargs["positions"].T.contiguous().T
    assert kwargs["positions"].stride() == (1, 3)
    ref = reference.split_qkv_rmsnorm_rope(**kwargs)
    q, k, _ = ascendc.split_qkv_rmsnorm_rope(**kwargs)
    assert host_sim.tiling.positionAxisStride == 1 and host_sim.tiling.positionStride == 3
    assert_close(q, ref[0], case.dtype)
    assert_close(k, ref[1], case.dtype)


def small_plan(case: Case, block_tokens: int, block_heads: int, max_programs: int) -> ascendc_plan.AscendCPlan:
    buffers = ascendc_plan.ub_buffers(case.d, case.rot, block_tokens, block_heads, case.dtype.itemsize, 4,
                                      q_weight=case.q_norm, k_weight=case.k_norm and case.hkv > 0, q_bias=False,
                                      k_bias=False, v_norm=case.v_norm, mrope=case.mrope_positions)
    return ascendc_plan.AscendCPlan(block_tokens, block_heads, max_programs, block_tokens, buffers, 192 * 1024,
                                    192 * 1024)


TILE_SHAPES = [
    (2, 3, 4, 5),    # just past a token tile; head tiles of 3 over 7 q and 3 k heads
    (4, 2, 3, 4),    # exactly one token tile
    (4, 2, 3, 9),    # just past two
    (1, 1, 40, 13),  # one (token, head) per tile, more tiles than blocks
    (3, 8, 64, 7),   # more blocks allowed than tiles
]
TILE_VARIANTS = {
    "plain": {},
    "mrope": dict(mrope=(4, 6, 6)),
    "mrope-interleaved+gate": dict(mrope=(6, 5, 5), interleaved=True, q_gate=True),
    "gate+vnorm": dict(q_gate=True, v_norm=True),
    "q-only gate": dict(hkv=0, q_gate=True),
}


@pytest.mark.parametrize("variant", TILE_VARIANTS, ids=TILE_VARIANTS.keys())
@pytest.mark.parametrize("block_tokens,block_heads,max_programs,tokens", TILE_SHAPES)
def test_tile_boundaries(host_sim, block_tokens, block_heads, max_programs, tokens, variant):
    case = dataclasses.replace(Case(tokens=tokens, hq=7, hkv=3, d=64, r=32, neox=False), **TILE_VARIANTS[variant])
    plan = small_plan(case, block_tokens, block_heads, max_programs)
    with ascendc_plan.forced(plan):
        res = run_case(case, host_sim, seed=tokens)
    check_outputs(case, res)
    check_memory(case, host_sim, res)
    assert host_sim.ub_peak == plan.ub_bytes
    assert host_sim.blocks_run == plan.grid(case.shape(), tokens)
    assert host_sim.tiling.numTiles == plan.num_tiles(case.shape(), tokens)


def test_capped_grid_is_kept_off_multiples_of_the_head_blocks(host_sim):
    # 7 q heads in blocks of 4 and 3 k heads: 3 head blocks; 5 token blocks make 15 tiles, more
    # than the 6 cores, and 6 is a multiple of 3: every core would meet one head block only.
    case = Case(tokens=9, hq=7, hkv=3, d=64, r=32, neox=False)
    plan = small_plan(case, block_tokens=2, block_heads=4, max_programs=6)
    shape = case.shape()
    assert plan.head_blocks(shape) == 3 and plan.num_tiles(shape, case.tokens) == 15
    assert plan.grid(shape, case.tokens) == 5
    with ascendc_plan.forced(plan):
        res = run_case(case, host_sim, seed=4)
    assert host_sim.blocks_run == host_sim.block_dim == 5
    check_outputs(case, res)
    check_memory(case, host_sim, res)


def test_gate_and_v_blocks_count_in_the_grid(host_sim):
    # 7 gated q heads in blocks of 4 and 3 k heads with v-norm: q 2 + k 1 + gate 2 + v 1 = 6 head
    # blocks; 5 token blocks make 30 tiles on 12 cores, a multiple of 6: the grid is 11.
    case = Case(tokens=9, hq=7, hkv=3, d=64, r=32, q_gate=True, v_norm=True, mrope=(6, 5, 5), interleaved=True)
    plan = small_plan(case, block_tokens=2, block_heads=4, max_programs=12)
    shape = case.shape()
    assert plan.head_blocks(shape) == 6 and plan.num_tiles(shape, case.tokens) == 30
    assert plan.grid(shape, case.tokens) == 11
    with ascendc_plan.forced(plan):
        res = run_case(case, host_sim, seed=5)
    assert host_sim.blocks_run == host_sim.block_dim == 11
    check_outputs(case, res)
    check_memory(case, host_sim, res)


def test_planned_grid_is_the_triton_plans(host_sim):
    # 8/1/128 on the default SoC: 5 head blocks and 40 vector cores; 10 token blocks, 50 tiles.
    case = Case(hq=8, hkv=1, d=128)
    plan = ascendc_plan.plan(case.hq, case.hkv, case.d, case.rot, 2, 4)
    shape = case.shape()
    triton = ascend_tiling.plan(shape, ascend_facts(None))
    tokens = 9 * plan.block_tokens + 1
    assert plan.num_tiles(shape, tokens) > plan.max_programs and plan.max_programs % plan.head_blocks(shape) == 0
    assert plan.grid(shape, tokens) == triton.grid(shape, tokens) == plan.max_programs - 1
    res = run_case(dataclasses.replace(case, tokens=tokens), host_sim, seed=6)
    assert host_sim.blocks_run == plan.max_programs - 1
    assert_close(res["q"], res["ref_q"], case.dtype)
    assert_close(res["k"], res["ref_k"], case.dtype)


def _variant_model_rows() -> list[AttentionGeometry]:
    """The geometry table's rows with a variant (mRoPE, gated q, v-norm, q-only) the kernel can
    take (``head_dim <= 256``), each once."""
    from vllm_ascend_ext.ops.models import geometry_table

    rows = {g for _, _, g in geometry_table() if g.head_dim <= ascendc_plan.MAX_HEAD_DIM
            and (g.q_gate or g.v_norm or g.mrope_section is not None or g.num_kv_heads == 0)}
    return sorted(rows, key=lambda g: g.label)


@pytest.mark.parametrize("geometry", _variant_model_rows(), ids=lambda g: g.label)
def test_variant_model_rows_match_the_reference(host_sim, geometry):
    """Every model row of issue 10 the kernel serves, at its planned tiles, one token past the
    first token tile."""
    plan = ascendc_plan.plan(geometry.num_q_heads, geometry.num_kv_heads, geometry.head_dim, geometry.rotary_dim, 2, 4,
                             q_weight=geometry.qk_norm, k_weight=geometry.qk_norm and geometry.num_kv_heads > 0,
                             is_neox=geometry.is_neox, q_gate=geometry.q_gate, v_norm=geometry.v_norm,
                             mrope=geometry.mrope_section is not None)
    tokens = plan.block_tokens + 1
    kwargs = reference.make_inputs(geometry, tokens, generator=torch.Generator().manual_seed(tokens))
    ref = reference.split_qkv_rmsnorm_rope(**kwargs)
    out = ascendc.split_qkv_rmsnorm_rope(**kwargs)
    assert len(out) == len(ref)
    for got, want in zip(out, ref, strict=True):
        assert_close(got, want, torch.bfloat16)
    assert host_sim.ub_peak == plan.ub_bytes
    shape = KernelShape.of(geometry, 2, 4)
    assert host_sim.blocks_run == plan.grid(shape, tokens) and host_sim.tiling.numTiles == plan.num_tiles(shape, tokens)


def test_first_token_past_a_planned_tile(host_sim):
    case = Case(hq=8, hkv=1, d=128)
    plan = ascendc_plan.plan(case.hq, case.hkv, case.d, case.rot, 2, 4)
    res = run_case(dataclasses.replace(case, tokens=plan.block_tokens + 1), host_sim, seed=3)
    assert_close(res["q"], res["ref_q"], case.dtype)
    assert_close(res["k"], res["ref_k"], case.dtype)


def test_kernel_fails_loudly_when_ub_is_too_small(host_sim):
    case = Case(tokens=3)
    plan = ascendc_plan.plan(case.hq, case.hkv, case.d, case.rot, 2, 4)
    host_sim.ub_bytes = plan.ub_bytes - 32
    try:
        with pytest.raises(SimViolation, match="UB overflow"):
            run_case(case, host_sim)
    finally:
        host_sim.ub_bytes = None


def test_repeated_calls_are_bit_identical(host_sim):
    case = Case(tokens=9, bias=True)
    first, second = run_case(case, host_sim, seed=5), run_case(case, host_sim, seed=5)
    assert torch.equal(first["q"], second["q"]) and torch.equal(first["k"], second["k"])


@pytest.mark.parametrize("variant", [{}, dict(v_norm=True), dict(mrope=(16, 8, 24)), dict(hkv=0)],
                         ids=["plain", "vnorm", "mrope", "q-only"])
def test_inplace_equals_out_of_place(host_sim, variant):
    case = dataclasses.replace(Case(tokens=10, hq=6, hkv=2, neox=False, r=96), **variant)
    a = run_case(case, host_sim, seed=9)
    b = run_case(dataclasses.replace(case, inplace=True), host_sim, seed=9)
    for name in ("q", "k", "v"):
        assert torch.equal(a[name], b[name])


def test_gated_q_equals_the_ungated_call_on_the_q_columns(host_sim):
    """The gate beside each q head changes nothing of q, k (the kernel reads q 2*D apart)."""
    case = Case(tokens=6, q_gate=True, bias=True)
    kwargs = make_inputs(case, torch.Generator().manual_seed(3))
    q, k, v, gate = ascendc.split_qkv_rmsnorm_rope(**kwargs)
    hq, d = case.hq, case.d
    heads = kwargs["qkv"][:, :2 * hq * d].reshape(case.tokens, hq, 2 * d)
    ungated = torch.cat([heads[..., :d].reshape(case.tokens, hq * d), kwargs["qkv"][:, 2 * hq * d:]], dim=1)
    q2, k2, v2 = ascendc.split_qkv_rmsnorm_rope(**{**kwargs, "qkv": ungated, "q_gate": False})
    assert torch.equal(q, q2) and torch.equal(k, k2) and torch.equal(v, v2)
    assert torch.equal(gate, heads[..., d:].reshape(case.tokens, hq * d))


def test_zero_tokens(host_sim):
    qkv = torch.empty(0, 8 * 64, dtype=torch.bfloat16)
    cache = torch.randn(4, 64)
    q, k, v = ascendc.split_qkv_rmsnorm_rope(qkv, None, None, cache, torch.empty(0, dtype=torch.int64), 4, 2, 64)
    assert q.shape == (0, 256) and k.shape == (0, 128) and v.shape == (0, 128)
    gated = torch.empty(0, 12 * 64, dtype=torch.bfloat16)
    q, k, v, gate = ascendc.split_qkv_rmsnorm_rope(gated, None, None, cache, torch.empty(3, 0, dtype=torch.int64),
                                                   4, 2, 64, q_gate=True, v_norm=True, mrope_section=(8, 12, 12))
    assert q.shape == gate.shape == (0, 256) and k.shape == v.shape == (0, 128)


@pytest.mark.parametrize("bad,match", [
    (dict(dtype=torch.float32), "bf16/fp16"),
    (dict(head_dim=320), "head_dim <= 256"),
    (dict(weight_dtype=torch.float32), "weights/biases in qkv's dtype"),
    (dict(bias_without_weight=True), "q_bias is only allowed together with a weight"),
    (dict(rotary_dim=3), "rotary_dim"),
    (dict(positions=torch.zeros(2, dtype=torch.int64)), "positions"),
    (dict(is_neox="false"), "is_neox must be a bool"),
    (dict(inplace="no"), "inplace must be a bool"),
    (dict(eps=float("nan")), "eps"),
])
def test_bad_arguments(host_sim, bad, match):
    d = bad.get("head_dim", 64)
    dtype = bad.get("dtype", torch.bfloat16)
    qkv = torch.randn(3, 4 * d).to(dtype)
    w = torch.ones(d, dtype=bad.get("weight_dtype", dtype))
    cache = torch.randn(8, bad.get("rotary_dim", d))
    positions = bad.get("positions", torch.zeros(3, dtype=torch.int64))
    qw = None if bad.get("bias_without_weight") else w
    qb = torch.zeros(d, dtype=dtype) if bad.get("bias_without_weight") else None
    flags = {name: bad[name] for name in ("is_neox", "inplace") if name in bad}
    with pytest.raises(ValueError, match=match):
        ascendc.split_qkv_rmsnorm_rope(qkv, qw, w, cache, positions, 2, 1, d, bad.get("eps", 1e-6), q_bias=qb,
                                       **flags)


@pytest.mark.parametrize("bad,match", [
    (dict(positions3=True), "mrope_section is not given"),
    (dict(positions3=True, mrope_section=(10, 10, 10)), "must sum to rotary_dim/2 = 32"),
    (dict(positions3=True, mrope_section=(16, 16)), "three ints"),
    (dict(mrope_interleaved=True), "mrope_interleaved=True needs mrope_section"),
    (dict(positions3=True, mrope_section=(16, 8, 8), mrope_interleaved="yes"), "mrope_interleaved must be a bool"),
    (dict(q_gate=True, inplace=True), "inplace=True cannot be combined with q_gate=True"),
    (dict(q_gate=True, width=4), "qkv has 256 columns"),
    (dict(q_gate="no"), "q_gate must be a bool"),
    (dict(v_norm=1), "v_norm must be a bool"),
    (dict(num_kv_heads=0, v_norm=True), "v_norm needs v"),
    (dict(num_kv_heads=0, k_weight=True), "k_weight must be None in a q-only layer"),
])
def test_bad_variant_arguments(host_sim, bad, match):
    d, hq = 64, 2
    hkv = bad.get("num_kv_heads", 1)
    width = bad.get("width", (2 * hq if bad.get("q_gate") is True else hq) + 2 * hkv)
    qkv = torch.randn(3, width * d).bfloat16()
    before = qkv.clone()
    w = torch.ones(d, dtype=torch.bfloat16)
    positions = torch.zeros(3, 3, dtype=torch.int64) if bad.get("positions3") else torch.zeros(3, dtype=torch.int64)
    kw = w if hkv or bad.get("k_weight") else None
    options = {name: bad[name] for name in ("mrope_section", "mrope_interleaved", "q_gate", "v_norm", "inplace")
               if name in bad}
    with pytest.raises(ValueError, match=match):
        ascendc.split_qkv_rmsnorm_rope(qkv, w, kw, torch.randn(8, d), positions, hq, hkv, d, **options)
    assert torch.equal(qkv, before)


OPCHECK_VARIANTS = {
    "plain": {},
    "mrope": dict(mrope_section=[8, 12, 12], mrope_interleaved=True),
    "vnorm": dict(v_norm=True),
    "gate": dict(q_gate=True, mrope_section=[16, 8, 8]),
}


@pytest.mark.parametrize("inplace,variant", [
    (inplace, variant) for inplace in (False, True) for variant in OPCHECK_VARIANTS
    if not (inplace and OPCHECK_VARIANTS[variant].get("q_gate"))  # refused in place: test_bad_variant_arguments
])
def test_opcheck(host_sim, inplace, variant):
    options = OPCHECK_VARIANTS[variant]
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(5, (12 if options.get("q_gate") else 8) * 64, generator=gen).bfloat16()
    w = torch.randn(64, generator=gen).bfloat16()
    cache = torch.randn(16, 64, generator=gen)
    positions = torch.randint(0, 16, (3, 5) if "mrope_section" in options else (5,), generator=gen)
    op = torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope_ascendc_ if inplace else \
        torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope_ascendc
    torch.library.opcheck(op, (qkv, w, w, cache, positions, 4, 2, 64, 1e-6), {"is_neox": False, **options},
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_plan_fits_every_model_geometry():
    from vllm_ascend_ext.ops.models import geometry_table

    for _, _, g in geometry_table():
        if g.head_dim > ascendc_plan.MAX_HEAD_DIM or g.qk_norm_across_heads:  # (AscendC serves neither)
            continue
        for cache_bytes in (2, 4):
            p = ascendc_plan.plan(g.num_q_heads, g.num_kv_heads, g.head_dim, g.rotary_dim, 2, cache_bytes,
                                  q_weight=g.qk_norm, k_weight=g.qk_norm and g.num_kv_heads > 0, is_neox=g.is_neox,
                                  q_gate=g.q_gate, v_norm=g.v_norm, mrope=g.mrope_section is not None)
            triton = ascend_tiling.plan(KernelShape.of(g, 2, cache_bytes), ascend_facts(None))
            assert p.ub_bytes <= p.ub_budget
            assert (p.block_heads, p.max_programs) == (triton.block_heads, triton.max_programs)
            assert 1 <= p.block_tokens <= triton.block_tokens
