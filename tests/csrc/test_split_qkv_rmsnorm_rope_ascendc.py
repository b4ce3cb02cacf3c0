"""The AscendC kernel, built for the host against csrc/ascendc_host_sim, against a float64 reference.

What passing means: the kernel's algorithm, tiling and indexing are right for every case below,
and it keeps the rules the host layer enforces (UB capacity, 32-byte alignment, queue pairing,
pipe synchronisation, GM bounds, every block index run). It does not mean CANN compiles it or
says anything about NPU speed (docs/ascendc.md).
"""

from __future__ import annotations

import ctypes
import dataclasses

import numpy as np
import pytest
import torch

from host_sim import SimViolation, byte_mask
from vllm_ascend_ext import ascendc
from vllm_ascend_ext.ops import reference
from vllm_ascend_ext.ops.device import ascend_facts
from vllm_ascend_ext.ops.models import AttentionGeometry
from vllm_ascend_ext.ops.tiling import KernelShape
from vllm_ascend_ext.ops.tiling import ascend as ascend_tiling

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


# --- cases ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Case:
    tokens: int = 7
    hq: int = 4
    hkv: int = 2
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

    @property
    def rot(self) -> int:
        return self.d if self.r is None else self.r

    @property
    def geometry(self) -> AttentionGeometry:
        """The layer geometry (one norm flag: a q-only or k-only norm drops a weight afterwards)."""
        return AttentionGeometry(self.hq, self.hkv, self.d, self.rot, is_neox=self.neox,
                                 qk_norm=self.q_norm or self.k_norm, weight_offset=self.weight_offset)

    def shape(self, cache_bytes: int = 4) -> KernelShape:
        return KernelShape.of(self.geometry, self.dtype.itemsize, cache_bytes)


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


#: Rows of the cos/sin cache, and the positions of the out-of-range case: below 0, the first and
#: last rows, just past the end, far past it, int32's largest.
MAX_POSITION = 50
SPECIAL_POSITIONS = [-5, 0, MAX_POSITION - 1, MAX_POSITION, 10 * MAX_POSITION, 3, -1, 7, 2**31 - 1, 49, 1]


def make_inputs(case: Case, gen: torch.Generator) -> dict:
    """Fresh random op arguments for ``case`` (``ops.reference.make_inputs``; qkv possibly a view)."""
    kwargs = reference.make_inputs(
        case.geometry, case.tokens, dtype=case.dtype, cache_dtype=case.cache_dtype, positions_dtype=case.pos_dtype,
        bias=case.bias, row_padding=case.row_pad, cache_row_padding=case.cache_pad, max_position=MAX_POSITION,
        out_of_range=False, generator=gen)
    for tensor, normed in (("q", case.q_norm), ("k", case.k_norm)):
        if not normed:
            kwargs[f"{tensor}_weight"] = kwargs[f"{tensor}_bias"] = None
    if case.out_of_range:
        kwargs["positions"] = torch.tensor(SPECIAL_POSITIONS[:case.tokens], dtype=case.pos_dtype)
    return kwargs


def run_case(case: Case, host_sim, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    kwargs = make_inputs(case, gen)
    qkv = kwargs["qkv"]
    before = qkv.clone()
    ref_q, ref_k, *_ = reference.split_qkv_rmsnorm_rope(**kwargs)
    q, k, v = ascendc.split_qkv_rmsnorm_rope(**kwargs, inplace=case.inplace)
    return dict(qkv=qkv, before=before, cache=kwargs["cos_sin_cache"], positions=kwargs["positions"], q=q, k=k,
                v=v, ref_q=ref_q, ref_k=ref_k)


def check_memory(case: Case, host_sim, res):
    """What the kernel read and wrote in GM, byte by byte."""
    qkv = res["qkv"]
    qkv_region = host_sim.regions["qkv"]
    qd, kd = case.hq * case.d, case.hkv * case.d
    v_bytes = byte_mask(qkv[:, qd + kd:], qkv_region)
    qk_bytes = byte_mask(qkv[:, : qd + kd], qkv_region)
    assert not (qkv_region.read & v_bytes).any(), "v was read"
    assert not (qkv_region.written & v_bytes).any(), "v was written"
    assert (qkv_region.read & qk_bytes).sum() == qk_bytes.sum(), "some q/k input was not read"
    assert not (qkv_region.read & ~(qk_bytes | v_bytes)).any(), "row padding was read"
    if case.inplace:
        assert (qkv_region.written == qk_bytes).all(), "in place must write exactly q and k"
    else:
        assert not qkv_region.written.any(), "out of place wrote into qkv"
        for name in ("q_out", "k_out"):
            assert host_sim.regions[name].written.all(), f"{name} not fully written"
    cache_region = host_sim.regions["cos_sin_cache"]
    rows = np.zeros_like(cache_region.read)
    for p in res["positions"].long().clamp(0, res["cache"].shape[0] - 1).unique().tolist():
        rows |= byte_mask(res["cache"][p], cache_region)
    assert (cache_region.read == rows).all(), "cache read outside the tokens' (clamped) rows"


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
    offsets = [getattr(ascendc.Tiling, name).offset for name, _ in ascendc.Tiling._fields_]
    assert host_sim.tiling_layout() == [ctypes.sizeof(ascendc.Tiling)] + offsets


# --- the kernel ---------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(
    f"{f.name}={getattr(c, f.name)}" for f in dataclasses.fields(c) if getattr(c, f.name) != f.default) or "default")
def test_matches_float64_reference(host_sim, case):
    res = run_case(case, host_sim)
    assert_close(res["q"], res["ref_q"], case.dtype)
    assert_close(res["k"], res["ref_k"], case.dtype)
    qd, kd = case.hq * case.d, case.hkv * case.d
    assert res["v"].data_ptr() == res["qkv"][:, qd + kd:].data_ptr() and res["v"].shape == (case.tokens, kd)
    assert torch.equal(res["qkv"][:, qd + kd:], res["before"][:, qd + kd:])
    if case.inplace:
        assert res["q"].data_ptr() == res["qkv"].data_ptr()
    else:
        assert torch.equal(res["qkv"], res["before"])
    check_memory(case, host_sim, res)
    plan = ascendc.plan(case.hq, case.hkv, case.d, case.rot, case.dtype.itemsize, res["cache"].element_size(),
                        q_weight=case.q_norm, k_weight=case.k_norm, q_bias=case.bias and case.q_norm,
                        k_bias=case.bias and case.k_norm, is_neox=case.neox)
    assert host_sim.ub_peak == plan.ub_bytes <= plan.ub_budget, "UB model differs from the kernel's allocation"
    shape = case.shape(res["cache"].element_size())
    assert host_sim.blocks_run == host_sim.block_dim == plan.grid(shape, case.tokens)


def small_plan(case: Case, block_tokens: int, block_heads: int, max_programs: int) -> ascendc.AscendCPlan:
    buffers = ascendc.ub_buffers(case.d, case.rot, block_tokens, block_heads, case.dtype.itemsize, 4,
                                 q_weight=case.q_norm, k_weight=case.k_norm, q_bias=False, k_bias=False)
    return ascendc.AscendCPlan(block_tokens, block_heads, max_programs, block_tokens, buffers, 192 * 1024, 192 * 1024)


@pytest.mark.parametrize("block_tokens,block_heads,max_programs,tokens", [
    (2, 3, 4, 5),    # just past a token tile; head tiles of 3 over 7 q and 3 k heads
    (4, 2, 3, 4),    # exactly one token tile
    (4, 2, 3, 9),    # just past two
    (1, 1, 40, 13),  # one (token, head) per tile, more tiles than blocks
    (3, 8, 64, 7),   # more blocks allowed than tiles
])
def test_tile_boundaries(host_sim, block_tokens, block_heads, max_programs, tokens):
    case = Case(tokens=tokens, hq=7, hkv=3, d=64, r=32, neox=False)
    plan = small_plan(case, block_tokens, block_heads, max_programs)
    with ascendc.forced(plan):
        res = run_case(case, host_sim, seed=tokens)
    assert_close(res["q"], res["ref_q"], case.dtype)
    assert_close(res["k"], res["ref_k"], case.dtype)
    check_memory(case, host_sim, res)
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
    with ascendc.forced(plan):
        res = run_case(case, host_sim, seed=4)
    assert host_sim.blocks_run == host_sim.block_dim == 5
    assert_close(res["q"], res["ref_q"], case.dtype)
    assert_close(res["k"], res["ref_k"], case.dtype)
    check_memory(case, host_sim, res)


def test_planned_grid_is_the_triton_plans(host_sim):
    # 8/1/128 on the default SoC: 5 head blocks and 40 vector cores; 10 token blocks, 50 tiles.
    case = Case(hq=8, hkv=1, d=128)
    plan = ascendc.plan(case.hq, case.hkv, case.d, case.rot, 2, 4)
    shape = case.shape()
    triton = ascend_tiling.plan(shape, ascend_facts(None))
    tokens = 9 * plan.block_tokens + 1
    assert plan.num_tiles(shape, tokens) > plan.max_programs and plan.max_programs % plan.head_blocks(shape) == 0
    assert plan.grid(shape, tokens) == triton.grid(shape, tokens) == plan.max_programs - 1
    res = run_case(dataclasses.replace(case, tokens=tokens), host_sim, seed=6)
    assert host_sim.blocks_run == plan.max_programs - 1
    assert_close(res["q"], res["ref_q"], case.dtype)
    assert_close(res["k"], res["ref_k"], case.dtype)


def test_first_token_past_a_planned_tile(host_sim):
    case = Case(hq=8, hkv=1, d=128)
    plan = ascendc.plan(case.hq, case.hkv, case.d, case.rot, 2, 4)
    res = run_case(dataclasses.replace(case, tokens=plan.block_tokens + 1), host_sim, seed=3)
    assert_close(res["q"], res["ref_q"], case.dtype)
    assert_close(res["k"], res["ref_k"], case.dtype)


def test_kernel_fails_loudly_when_ub_is_too_small(host_sim):
    case = Case(tokens=3)
    plan = ascendc.plan(case.hq, case.hkv, case.d, case.rot, 2, 4)
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


def test_inplace_equals_out_of_place(host_sim):
    case = Case(tokens=10, hq=6, hkv=2, neox=False, r=96)
    a = run_case(case, host_sim, seed=9)
    b = run_case(dataclasses.replace(case, inplace=True), host_sim, seed=9)
    assert torch.equal(a["q"], b["q"]) and torch.equal(a["k"], b["k"])


def test_zero_tokens(host_sim):
    qkv = torch.empty(0, 8 * 64, dtype=torch.bfloat16)
    cache = torch.randn(4, 64)
    q, k, v = ascendc.split_qkv_rmsnorm_rope(qkv, None, None, cache, torch.empty(0, dtype=torch.int64), 4, 2, 64)
    assert q.shape == (0, 256) and k.shape == (0, 128) and v.shape == (0, 128)


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


@pytest.mark.parametrize("inplace", [False, True])
def test_opcheck(host_sim, inplace):
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(5, 8 * 64, generator=gen).bfloat16()
    w = torch.randn(64, generator=gen).bfloat16()
    cache = torch.randn(16, 64, generator=gen)
    positions = torch.randint(0, 16, (5,), generator=gen)
    op = torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope_ascendc_ if inplace else \
        torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope_ascendc
    torch.library.opcheck(op, (qkv, w, w, cache, positions, 4, 2, 64, 1e-6), {"is_neox": False},
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_plan_fits_every_model_geometry():
    from vllm_ascend_ext.ops.models import geometry_table

    for _, _, g in geometry_table():
        if g.head_dim > ascendc.MAX_HEAD_DIM:
            continue
        for cache_bytes in (2, 4):
            p = ascendc.plan(g.num_q_heads, g.num_kv_heads, g.head_dim, g.rotary_dim, 2, cache_bytes,
                             q_weight=g.qk_norm, k_weight=g.qk_norm, is_neox=g.is_neox)
            triton = ascend_tiling.plan(KernelShape.of(g, 2, cache_bytes), ascend_facts(None))
            assert p.ub_bytes <= p.ub_budget
            assert (p.block_heads, p.max_programs) == (triton.block_heads, triton.max_programs)
            assert 1 <= p.block_tokens <= triton.block_tokens
