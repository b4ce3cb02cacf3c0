"""The CUDA launch plans' rules (``vllm_ascend_ext.ops.tiling.cuda``), pure: no kernel runs.

Which plan a batch gets (small-batch or large, switched by tile count, never compiled per batch
size), and what each plan holds for the layers of the geometry table: warps, register caps,
programs per SM, whole rows, tokens per tile, positions loaded ahead or at the gather, dependent
launch. The numbers behind each rule are in ``ops/tiling/cuda.py``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vllm_ascend_ext.ops import device as device_facts
from vllm_ascend_ext.ops.models import AttentionGeometry, model
from vllm_ascend_ext.ops.reference import make_inputs
from vllm_ascend_ext.ops import tiling
from vllm_ascend_ext.ops.tiling import KernelShape, MLAShape, ascend, cuda, next_pow2

from op_checks import shape_of

SMALL = model("Qwen3-30B-A3B").shard(4)  # 8/1/128


@pytest.mark.parametrize("geometry, per_sm", [
    (SMALL, cuda.SMALL_BATCH_TILES_PER_SM),
    # A chunked tail (192 lanes) and mRoPE hand over later.
    (AttentionGeometry(16, 2, 256, 64), cuda.SMALL_BATCH_TILES_PER_SM_CHUNKED_OR_MROPE),
    (AttentionGeometry(32, 8, 128, 128, mrope_section=(24, 20, 20), mrope_interleaved=True),
     cuda.SMALL_BATCH_TILES_PER_SM_CHUNKED_OR_MROPE),
], ids=lambda x: x.label if hasattr(x, "label") else str(x))
def test_small_batches_get_the_small_batch_plan(geometry, per_sm):
    """The CUDA planner switches plans by tile count, not by anything compiled per batch size."""
    facts = device_facts.CudaFacts(name="test", num_sms=132, source="test")
    shape = KernelShape.of(geometry, 2, 4)
    large, small = cuda.plan(shape, facts), cuda.small_batch_plan(shape, facts)
    assert cuda.plan_for_tokens(shape, facts, 1) == small
    limit = per_sm * facts.num_sms
    tokens = [t for t in range(1, 100_000, 7) if large.num_tiles(shape, t) > limit]
    assert cuda.plan_for_tokens(shape, facts, tokens[0]) == large
    assert cuda.plan_for_tokens(shape, facts, tokens[0] - 7) == small
    # The warm-up compiles one batch of each plan from this boundary.
    most = cuda.small_batch_max_tokens(shape, facts)
    assert cuda.plan_for_tokens(shape, facts, most) == small
    assert cuda.plan_for_tokens(shape, facts, most + 1) == large
    assert large.num_tiles(shape, most) <= limit < large.num_tiles(shape, most + 1)


#: The CUDA large plan's kinds (docs/performance.md, v9, v10): (warps at least, register cap, programs per
#: SM) of the prologue and of the cache write.
_V8 = ((cuda.MIN_WARPS, 0, cuda.PROGRAMS_PER_SM),
       (cuda.MIN_WARPS, cuda.KV_MAX_REGISTERS, cuda.KV_PROGRAMS_PER_SM))
_FEW = (_V8[0], (cuda.MIN_WARPS, cuda.KV_MAX_REGISTERS, cuda.POS_AHEAD_KV_PROGRAMS_PER_SM))
_MROPE = (cuda.MROPE_WARPS, cuda.MROPE_MAX_REGISTERS, cuda.MROPE_PROGRAMS_PER_SM)
_CHUNKED = (cuda.CHUNKED_WARPS, cuda.CHUNKED_MAX_REGISTERS, cuda.CHUNKED_PROGRAMS_PER_SM)
_CHUNKED_KV = (cuda.MIN_WARPS, cuda.KV_MAX_REGISTERS, cuda.CHUNKED_KV_PROGRAMS_PER_SM)


@pytest.mark.parametrize("geometry, prologue, write, ahead", [
    # The mRoPE plan: positions ahead in the prologue, and in the write where v moves with k.
    (model("Qwen3-VL-8B").shard(1), _MROPE, _MROPE, (True, False)),
    (model("Qwen3-VL-30B-A3B").shard(1), _MROPE, _MROPE, (True, True)),
    # mRoPE without q/k norm on four blocks of q heads: as before.
    (model("Qwen2.5-VL-7B").shard(1), *_V8, (False, False)),
    # A chunked tail: with mRoPE the 2-warp prologue at its own programs an SM; without, its own
    # prologue plan; the write at its own programs an SM either way.
    (model("Qwen3.5-35B-A3B").shard(1), (cuda.MIN_WARPS, 0, cuda.CHUNKED_MROPE_PROGRAMS_PER_SM), _CHUNKED_KV,
     (False, False)),
    (model("Qwen3-Next-80B-A3B").shard(1), _CHUNKED, _CHUNKED_KV, (False, False)),
    (model("MiMo-V2-Flash-qk").shard(8), _CHUNKED, _CHUNKED_KV, (False, False)),
    (model("Qwen3-8B").shard(1), *_V8, (False, False)),
    # One or two blocks of q heads with k: positions ahead, the write at 8 programs an SM.
    (model("Qwen3-32B").shard(8), *_FEW, (True, True)),
    (model("Qwen3-32B").shard(4), *_FEW, (True, True)),
    (model("Qwen3-VL-8B").shard(8), *_FEW, (True, True)),
    (model("Qwen2.5-VL-7B").shard(4), *_FEW, (True, True)),
    # ... an mRoPE prologue there only where k's block holds one head.
    (model("Qwen3-VL-8B").shard(4), *_FEW, (False, True)),
    (model("Qwen3-VL-8B").shard(2), *_FEW, (False, True)),
    # ... not a q-only layer (not measured).
    (model("Gemma-4-E2B:sliding-kv-shared").shard(1), *_V8, (False, False)),
], ids=lambda x: x.label if hasattr(x, "label") else str(x))
def test_cuda_large_plan_rules(geometry, prologue, write, ahead):
    """Which layers take the 4-warp, register-capped large plans and which load positions ahead,
    and that the call's shape (the norm weights present or not) picks the same plan as the
    geometry's (so the worker's warm-up compiles what the calls launch)."""
    facts = device_facts.CudaFacts(name="test", num_sms=132, source="test")
    shape = KernelShape.of(geometry, 2, 4)
    for kv, want, want_ahead in ((False, prologue, ahead[0]), (True, write, ahead[1])):
        p = cuda.plan(dataclasses.replace(shape, kv_cache=kv), facts)
        assert p.num_warps >= want[0] and (p.max_registers, p.max_programs) == (want[1], want[2] * 132)
        assert p.positions_ahead is want_ahead
    args = make_inputs(geometry, 3, device="cpu")
    assert shape_of(args) == shape
    if prologue == _MROPE:  # the same layer called without norm weights: the mRoPE rule is off
        no_norm = shape_of(dict(args, q_weight=None, k_weight=None))
        assert not no_norm.qk_norm and cuda.plan(no_norm, facts).max_registers == 0


@pytest.mark.parametrize("name, tp, whole", [
    # Head dim a power of two, the tail not (192 lanes): whole rows, 2 warps.
    ("Qwen3-Next-80B-A3B", 1, True), ("Qwen3-Next-80B-A3B", 8, True), ("Qwen3.5-35B-A3B", 1, True),
    # The tail a power of two (GLM-4, MiMo), the head dim not (Phi-2, MiMo), full rotary: as before.
    ("GLM-4-9B", 1, False), ("MiMo-V2-Flash-qk", 1, False), ("Phi-2", 1, False), ("Qwen3-8B", 1, False),
    ("Gemma-4-31B:sliding", 1, False),
])
def test_cuda_small_plan_whole_rows(name, tp, whole):
    """Which small-batch plans hold each head as one row (and with how many warps); the large
    plans never do. Every small-batch plan runs up to ``SMALL_PROGRAMS_PER_SM`` programs an SM."""
    facts = device_facts.CudaFacts(name="test", num_sms=132, source="test")
    for kv in (False, True):
        shape = dataclasses.replace(KernelShape.of(model(name).shard(tp), 2, 4), kv_cache=kv)
        small = cuda.small_batch_plan(shape, facts)
        assert small.whole_row is whole and not cuda.plan(shape, facts).whole_row
        assert small.num_warps == (cuda.SMALL_WHOLE_ROW_WARPS if whole else cuda.SMALL_WARPS)
        assert not (whole and small.tail_width2(shape))
        assert small.max_programs == cuda.SMALL_PROGRAMS_PER_SM * 132


@pytest.mark.parametrize("name, tp, tokens, v_with_k", [
    # One token's row of 8 heads of 128 lanes (or fewer, narrower heads; 4 of 256): 2 tokens a tile,
    # and the write's v in k's tiles where k's block holds at most half of q's heads.
    ("Qwen3-8B", 1, 2, False), ("Qwen3-235B-A22B", 1, 2, True), ("Qwen3-32B", 8, 2, True),
    ("MiniMax-M2", 8, 2, True), ("Phi-2", 1, 2, False), ("Gemma-4-31B:sliding", 8, 2, True),
    # A row of 2048 elements, 512-lane heads, whole rows: one token.
    ("Gemma-4-31B:sliding", 1, 1, False), ("Gemma-4-E2B:full", 4, 1, False), ("Qwen3-Next-80B-A3B", 1, 1, False),
    # mRoPE's own 2 tokens, and narrower rows that take 2 anyway.
    ("Qwen3-VL-8B", 1, 2, False), ("Qwen3-8B", 8, 2, False),
])
def test_cuda_small_plan_tokens(name, tp, tokens, v_with_k):
    """The small-batch plans take 2 tokens a tile where one token's row of up to 8 heads of at most
    256 lanes, in halves, fits the tile; there the write moves v in k's tiles where k's block is small,
    and nothing else of its plan differs from the prologue's."""
    facts = device_facts.CudaFacts(name="test", num_sms=132, source="test", dependent_launch=True)
    shape = KernelShape.of(model(name).shard(tp), 2, 4)
    prologue = cuda.small_batch_plan(shape, facts)
    write = cuda.small_batch_plan(dataclasses.replace(shape, kv_cache=True), facts)
    assert (prologue.block_tokens, write.block_tokens, write.v_with_k) == (tokens, tokens, v_with_k)
    assert dataclasses.replace(write, v_in_k_tiles=False) == prologue and not prologue.v_with_k


@pytest.mark.parametrize("name, tp, small, large", [
    # Not mRoPE: wherever the rows are gathered after the data and the positions are not loaded ahead
    # (Qwen3-Next's large plan chunks its tail, so gathers first; Qwen3-32B TP 8's loads them ahead).
    ("Qwen3-8B", 1, True, True), ("Qwen3-Next-80B-A3B", 1, True, False), ("Gemma-4-31B:sliding", 1, True, True),
    ("Qwen3-32B", 8, True, False),
    # mRoPE: only small-batch plans of rotary halves (not Qwen3.5's whole rows), never a large plan.
    ("Qwen3-VL-8B", 1, True, False), ("Qwen3-VL-30B-A3B", 1, True, False), ("Qwen2.5-VL-7B", 1, True, False),
    ("Qwen3.5-27B", 1, False, False), ("Qwen3.5-35B-A3B", 1, False, False),
])
def test_cuda_positions_at_gather(name, tp, small, large):
    """Which plans have the head block load the positions at the gather (the kernel's
    ``POS_PTRS``), in both ops; never where the positions are loaded ahead or gathered before the
    arms, and never on Ascend."""
    facts = device_facts.CudaFacts(name="test", num_sms=132, source="test")
    for kv in (False, True):
        shape = dataclasses.replace(KernelShape.of(model(name).shard(tp), 2, 4), kv_cache=kv)
        got_small, got_large = cuda.small_batch_plan(shape, facts), cuda.plan(shape, facts)
        assert got_small.positions_at_gather is small
        assert got_large.positions_at_gather is large
        for p in (got_small, got_large):
            early = dataclasses.replace(p, late_rows=False, whole_rows=False)
            assert not early.positions_at_gather and not dataclasses.replace(p, pos_ahead=True).positions_at_gather
        assert not ascend.plan(shape, device_facts.ascend_facts()).positions_at_gather


@pytest.mark.parametrize("name,tp,at_gather", [
    # The write's large plan loads the positions ahead on all of these; under dependent launch it
    # loads them at the gather where k's block is one head beside 8 of q's.
    ("Qwen3-32B", 8, True), ("Qwen3-235B-A22B", 4, True), ("Gemma-4-E2B:sliding", 1, True),
    ("Qwen3-8B", 8, False), ("Qwen3-8B", 4, False), ("Qwen3-VL-8B", 8, False),
])
def test_cuda_dependent_launch(name, tp, at_gather):
    """Every CUDA plan asks Triton for dependent launch exactly where the GPU's facts allow it,
    never on Ascend; under it only the write's large plans named above change otherwise (positions
    at the gather instead of ahead)."""
    off = device_facts.CudaFacts(name="test", num_sms=132, source="test")
    on = dataclasses.replace(off, dependent_launch=True)
    for kv in (False, True):
        shape = dataclasses.replace(KernelShape.of(model(name).shard(tp), 2, 4), kv_cache=kv)
        assert cuda.plan(shape, off).pos_ahead
        for make in (cuda.small_batch_plan, cuda.plan):
            plain, dependent = make(shape, off), make(shape, on)
            assert not plain.dependent_launch and "launch_pdl" not in plain.launch_options
            assert dependent.dependent_launch and dependent.launch_options["launch_pdl"] is True
            changed = kv and make is cuda.plan and at_gather
            assert dependent.pos_ahead is (plain.pos_ahead and not changed)
            assert dataclasses.replace(dependent, pdl=False, pos_ahead=plain.pos_ahead) == plain
        assert not ascend.plan(shape, device_facts.ascend_facts()).dependent_launch


@pytest.mark.parametrize("shape", [
    MLAShape(1536, 512, 64, 2, 4, kv_cache=True),  # DeepSeek-V3's prologue with the cache write
    MLAShape(0, 512, 64, 2, 4),  # DeepSeek-V2-Lite's (no q latent), no write
    MLAShape(0, 0, 64, 2, 4, num_heads=16, head_dim=192),  # the q side at 16 heads
])
def test_cuda_mla_dependent_launch(shape):
    """Both MLA launches ask for dependent launch exactly where the GPU's facts allow it (nothing
    else of the plan changes), never on Ascend."""
    off = device_facts.CudaFacts(name="test", num_sms=132, source="test")
    plain, dependent = cuda.mla_plan(shape, off), cuda.mla_plan(shape, dataclasses.replace(off, dependent_launch=True))
    assert not plain.dependent_launch and "launch_pdl" not in plain.launch_options
    assert dependent.dependent_launch and dependent.launch_options["launch_pdl"] is True
    assert dataclasses.replace(dependent, pdl=False) == plain
    assert not ascend.mla_plan(shape, device_facts.ascend_facts()).dependent_launch


@pytest.mark.parametrize("shape", [
    MLAShape(1536, 512, 64, 2, 4, kv_cache=True),  # DeepSeek-V3's prologue with the cache write
    MLAShape(0, 512, 64, 2, 4),  # DeepSeek-V2-Lite's (no q latent)
    MLAShape(0, 0, 64, 2, 4, num_heads=16, head_dim=192),  # the q side: no small-batch plan
])
def test_cuda_mla_small_batch_plan(shape):
    """The prologue's small-batch plan (one token a tile, latent rows held whole, a warp for each
    MLA_SMALL_LANES_PER_WARP lanes of the widest: 2 with q_c's 1536, 1 with kv_c's 512 alone)
    serves exactly up to MLA_SMALL_TOKENS_PER_SM tokens an SM;
    the q side keeps its one plan; Ascend has one plan for every batch size."""
    facts = device_facts.CudaFacts(name="test", num_sms=132, source="test")
    large, small = cuda.mla_plan(shape, facts), cuda.mla_small_plan(shape, facts)
    if shape.q_rope:
        assert small == large
        assert cuda.mla_plan_for_tokens(shape, facts, 1) == large
        return
    assert (small.block_tokens, small.num_warps) == (1, 2 if shape.q_lora_rank else 1)
    for rank, chunk, small_chunk in ((shape.q_lora_rank, large.q_chunk, small.q_chunk),
                                     (shape.kv_lora_rank, large.kv_chunk, small.kv_chunk)):
        assert small_chunk == (next_pow2(rank) if rank else chunk) and small_chunk >= rank
    last = cuda.MLA_SMALL_TOKENS_PER_SM * 132
    # A program a tile, and the cap would have given the same grid wherever the plan serves.
    assert small.one_tile and not large.one_tile
    assert small.grid(shape, last) == small.num_tiles(shape, last) <= small.max_programs
    assert cuda.mla_plan_for_tokens(shape, facts, 1) == small
    assert cuda.mla_plan_for_tokens(shape, facts, last) == small
    assert cuda.mla_plan_for_tokens(shape, facts, last + 1) == large
    assert tiling.mla_plan_for(torch.device("cpu"), shape, 1) == tiling.mla_plan_for(torch.device("cpu"), shape)


def test_mla_warm_up_token_counts_reach_every_plan():
    """The worker hook's MLA warm-up compiles each plan the op can pick: on CUDA the prologue's
    small-batch and large plans (one token count each), the q side's one; on Ascend one."""
    cpu = torch.device("cpu")
    prologue, q_side = MLAShape(1536, 512, 64, 2, 4, kv_cache=True), MLAShape(0, 0, 64, 2, 4, num_heads=16,
                                                                                 head_dim=192)
    assert tiling.mla_warm_up_token_counts(cpu, prologue) == (1,)
    with tiling.forced("cuda"):
        small, large = tiling.mla_warm_up_token_counts(cpu, prologue)
        assert tiling.mla_plan_for(cpu, prologue, small) != tiling.mla_plan_for(cpu, prologue, large)
        assert tiling.mla_plan_for(cpu, prologue, large) == tiling.mla_plan_for(cpu, prologue)
        assert tiling.mla_warm_up_token_counts(cpu, q_side) == (1,)
