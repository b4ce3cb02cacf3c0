"""Tests of ``split_qkv_tp_rmsnorm_rope`` (q/k RMSNorm across all heads and TP ranks, MiniMax-M2)
against the float64 single-process reference of the FULL layer (``reference.split_qkv_tp_rmsnorm_rope_full``),
each rank's outputs compared with the reference's columns of its heads (``reference.shard_minimax``).

Every test runs on the device under test (``tests/conftest.py``: the interpreter on CPU, or a
GPU under ``scripts/gpu_tests.sh``). Single-process tests run ``tp_size=1`` (and a callable
all-reduce that stands for ranks holding the same shard); the multi-process tests spawn 2 and 4
real processes in a gloo group (on a GPU, the ranks share it and gloo sums CUDA tensors), each
sharding the same full layer as vLLM does (kv heads replicated when fewer than the ranks) and
summing through the group (the ``ProcessGroup`` and a callable around ``dist.all_reduce``), with
T = 0, padding tokens (rows of zeros at out-of-range positions) and tokens crossing tiles.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import tempfile
from dataclasses import replace

import pytest
import torch
import torch.multiprocessing as mp

from vllm_ascend_ext.ops import reference, tiling, validation
from vllm_ascend_ext.ops.models import AttentionGeometry, model
from vllm_ascend_ext.ops.tiling import SumsPlan
from vllm_ascend_ext.ops.tiling.cuda import CudaPlan

#: The op's kernel runs in these tests (what the triton-ascend suite reruns: ``-m kernel``).
pytestmark = pytest.mark.kernel

#: The kernel against float64, by output dtype (one ulp of the output, and an absolute floor).
TOLERANCES = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.bfloat16: dict(rtol=2.0**-7, atol=2e-3),
}
#: Full layers small enough for the interpreter: 4 q / 2 kv heads of 32, partial rotary 16, shard
#: at TP 2 (kv split) and TP 4 (kv replicated x2: 2 kv heads over 4 ranks); the GPT-J one at TP 2.
TINY = AttentionGeometry(4, 2, 32, 16, qk_norm_across_heads=True)
TINY_GPTJ = AttentionGeometry(4, 2, 32, 16, is_neox=False, eps=1e-5, qk_norm_across_heads=True)
#: Plans: the op's own (the Ascend plan on CPU), and tiny tiles for both kernels (2 tokens, 2
#: heads and 4-lane tail chunks for kernel 2; 2 tokens and 16-column chunks for kernel 1, 3
#: programs walking the tiles), so a few tokens cross every block; ``whole-row`` the same with kernel
#: 2 holding q's and k's heads as whole rows (the kernel's WHOLE_ROW, which reads the sums too).
PLANS = ("own", "small-tiles", "whole-row")


def _op_module():
    return importlib.import_module("vllm_ascend_ext.ops.split_qkv_tp_rmsnorm_rope")


@contextlib.contextmanager
def _plans(kind: str, monkeypatch):
    if kind == "own":
        yield
        return
    small = SumsPlan(block_tokens=2, block_cols_q=16, block_cols_k=16, max_programs=3)
    monkeypatch.setattr(_op_module(), "sums_plan_for", lambda device, shape: small)
    whole = kind == "whole-row"
    with tiling.forced(plan=CudaPlan(block_tokens=2, block_heads=2, kv_block_heads=2, max_programs=5,
                                     num_warps=4, tail_lanes=0 if whole else 4, late_rows=False,
                                     whole_rows=whole)):
        yield


@pytest.fixture
def poisoned(monkeypatch):
    """Out-of-place outputs start as NaN: an element the kernel does not write fails the check."""
    prologue = importlib.import_module("vllm_ascend_ext.ops.split_qkv_rmsnorm_rope")
    monkeypatch.setattr(prologue, "_new_output",
                        lambda qkv, n, cols: torch.full((n, cols), float("nan"), dtype=qkv.dtype, device=qkv.device))


def _check(outputs, expected, dtype, qkv=None):
    for name, got, want in zip("qkv", outputs, expected):
        assert got.shape == want.shape, name
        torch.testing.assert_close(got.double(), want.to(got.device), **TOLERANCES[dtype], msg=name)
    if qkv is not None:
        assert outputs[2].data_ptr() == qkv[:, qkv.shape[1] - outputs[2].shape[1]:].data_ptr()  # v: a view


def _on(args: dict, device) -> dict:
    """``args`` with its tensors moved to ``device``."""
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


def _run_rank(full: dict, tp: int, rank: int, all_reduce, device="cpu"):
    """One rank: shard the full layer, run the op with ``all_reduce``, compare with the reference's
    columns of the rank's heads."""
    from vllm_ascend_ext.ops import split_qkv_tp_rmsnorm_rope

    args = reference.shard_minimax(full, tp, rank)
    qkv_before = args["qkv"].clone()
    outputs = split_qkv_tp_rmsnorm_rope(**_on(args, device), all_reduce=all_reduce)
    expected = reference.shard_minimax_outputs(reference.split_qkv_tp_rmsnorm_rope_full(**full),
                                               full["num_q_heads"], full["num_kv_heads"], full["head_dim"], tp, rank)
    _check(outputs, expected, full["qkv"].dtype)
    assert torch.equal(args["qkv"], qkv_before)


# ---------------------------------------------------------------------------------------------
# One process


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("geometry", [TINY, TINY_GPTJ], ids=lambda g: g.label)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_tp1_matches_full_reference(device, poisoned, monkeypatch, plan, geometry, dtype):
    for tokens, padding in ((1, 0), (7, 2)):
        full = reference.make_tp_inputs(geometry, tokens, padding=padding, dtype=dtype)
        with _plans(plan, monkeypatch):
            _run_rank(full, 1, 0, None, device)


def test_minimax_m2_full_layer_tp1(device, poisoned):
    """MiniMax-M2's whole layer (48 q / 8 kv heads of 128, R 64) in one process, tp_size=1."""
    spec = model("MiniMax-M2")
    assert spec.qk_norm_across_heads and spec.shard(16).num_kv_heads == 1
    _run_rank(reference.make_tp_inputs(spec, 3, padding=1), 1, 0, None, device)


@pytest.mark.parametrize("tp", [2, 4])
def test_callable_all_reduce_of_identical_ranks(device, poisoned, tp):
    """A callable all-reduce standing for ``tp`` ranks that hold the same shard (it multiplies the
    sums by ``tp``): the result is the full reference of the layer made of ``tp`` copies of the
    shard (q heads and kv heads repeated: the replicated-kv case). Called once, with the
    ``[T, 2]`` fp32 sums."""
    from vllm_ascend_ext.ops import split_qkv_tp_rmsnorm_rope

    shard = reference.make_tp_inputs(AttentionGeometry(2, 1, 32, 16), 5, padding=1)
    calls = []

    def all_reduce(sums):
        calls.append((tuple(sums.shape), sums.dtype))
        return sums * tp

    d = 32
    q, k, v = shard["qkv"][:, :2 * d], shard["qkv"][:, 2 * d:3 * d], shard["qkv"][:, 3 * d:]
    full = dict(shard, qkv=torch.cat([q] * tp + [k] * tp + [v] * tp, dim=1), num_q_heads=2 * tp,
                num_kv_heads=tp, q_weight=shard["q_weight"].repeat(tp), k_weight=shard["k_weight"].repeat(tp))
    expected = reference.split_qkv_tp_rmsnorm_rope_full(**full)
    out = split_qkv_tp_rmsnorm_rope(**_on(shard, device), tp_size=tp, all_reduce=all_reduce)
    assert calls == [((5, 2), torch.float32)]
    _check(out, (expected[0][:, :2 * d], expected[1][:, :d], expected[2][:, :d]), torch.bfloat16)


def test_no_collective_at_tp1_or_without_tokens(device, poisoned):
    from vllm_ascend_ext.ops import split_qkv_tp_rmsnorm_rope

    def refuse(sums):
        raise AssertionError("the all-reduce was called")

    args = reference.shard_minimax(reference.make_tp_inputs(TINY, 3), 1, 0)
    split_qkv_tp_rmsnorm_rope(**_on(args, device), all_reduce=refuse)  # tp_size 1: a sum over one rank
    empty = reference.shard_minimax(reference.make_tp_inputs(TINY, 0), 2, 1)
    q, k, v = split_qkv_tp_rmsnorm_rope(**_on(empty, device), all_reduce=refuse)
    assert q.shape == (0, 2 * 32) and k.shape == v.shape == (0, 32)


def test_partial_sums_kernel(device, monkeypatch):
    """Kernel 1 alone: each token's fp32 sums of squares of its q and k columns, crossing token
    tiles, column chunks (16 columns: 64 of q, 32 of k) and the grid-stride loop."""
    op = _op_module()
    args = _on(reference.shard_minimax(reference.make_tp_inputs(TINY, 11, dtype=torch.float32), 1, 0), device)
    with _plans("small-tiles", monkeypatch):
        call = validation.split_qkv_tp_rmsnorm_rope(**args)
        sums = op.partial_sums(call, args["qkv"])
    x = args["qkv"].double()
    want = torch.stack([(x[:, :128] ** 2).sum(1), (x[:, 128:192] ** 2).sum(1)], dim=1)
    assert sums.dtype == torch.float32
    torch.testing.assert_close(sums.double(), want, rtol=1e-6, atol=1e-6)
    assert sums.device.type == device.type


def test_row_stride_view(device, poisoned):
    """qkv as a view of a wider buffer (row stride > width): rows are found by their stride."""
    full = reference.make_tp_inputs(TINY, 5)
    args = reference.shard_minimax(full, 2, 0)
    wide = torch.zeros(5, args["qkv"].shape[1] + 24, dtype=args["qkv"].dtype, device=device)
    wide[:, :args["qkv"].shape[1]] = args["qkv"]
    from vllm_ascend_ext.ops import split_qkv_tp_rmsnorm_rope

    out = split_qkv_tp_rmsnorm_rope(**dict(_on(args, device), qkv=wide[:, :args["qkv"].shape[1]], tp_size=1))
    # tp_size=1 on rank 0's shard: the reference is the layer made of that shard alone.
    shard_full = dict(args, qkv=args["qkv"])
    shard_full.pop("tp_size")
    _check(out, reference.split_qkv_tp_rmsnorm_rope_full(**shard_full), torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# Bad inputs


def _bad_cases(args):
    d = args["head_dim"]
    yield "tp_size", dict(tp_size=0)
    yield "tp_size", dict(tp_size=True)
    yield "all_reduce", dict(tp_size=2)
    yield "all_reduce", dict(tp_size=2, all_reduce="sum")
    yield "q_weight", dict(q_weight=args["q_weight"][:d])  # [D]: the per-head op's weight
    yield "k_weight", dict(k_weight=torch.ones(args["num_kv_heads"] * d + 1, dtype=args["k_weight"].dtype))
    yield "q_weight", dict(q_weight=None)
    yield "num_kv_heads", dict(num_kv_heads=0, k_weight=None,
                               qkv=args["qkv"][:, :args["num_q_heads"] * d].contiguous())
    yield "positions", dict(positions=torch.zeros(3, args["qkv"].shape[0], dtype=torch.long))
    yield "head_dim", dict(head_dim=31)
    yield "eps", dict(eps=float("inf"))


@pytest.mark.parametrize("case", range(11))
def test_bad_inputs_raise_naming_the_argument(case):
    from vllm_ascend_ext.ops import split_qkv_tp_rmsnorm_rope

    args = reference.shard_minimax(reference.make_tp_inputs(TINY, 3), 1, 0)
    name, change = list(_bad_cases(args))[case]
    with pytest.raises(ValueError, match=name):
        split_qkv_tp_rmsnorm_rope(**(args | change))


@pytest.mark.parametrize("option", ["mrope_section", "q_gate", "v_norm", "q_bias", "inplace", "weight_offset"])
def test_validator_refuses_prologue_options_by_name(option):
    args = reference.shard_minimax(reference.make_tp_inputs(TINY, 3), 1, 0)
    value = {"mrope_section": (4, 2, 2), "q_bias": torch.zeros(64), "weight_offset": 1.0}.get(option, True)
    with pytest.raises(ValueError, match=option):
        validation.split_qkv_tp_rmsnorm_rope(**args, **{option: value})
    call = validation.split_qkv_tp_rmsnorm_rope(**args, **{option: {"mrope_section": None, "q_bias": None,
                                                                      "weight_offset": 0.0}.get(option, False)})
    assert "tp_norm" in call.features and call.shape.norm_across_heads and call.tp_size == 1


def test_validator_checks_the_group_size():
    """A ProcessGroup of the wrong size is refused naming tp_size (a one-rank gloo group)."""
    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=0, world_size=1)
        try:
            args = reference.shard_minimax(reference.make_tp_inputs(TINY, 2), 2, 0)
            with pytest.raises(ValueError, match="tp_size"):
                validation.split_qkv_tp_rmsnorm_rope(**args, all_reduce=dist.group.WORLD)
            assert validation.split_qkv_tp_rmsnorm_rope(**(args | dict(tp_size=1)), all_reduce=dist.group.WORLD)
        finally:
            dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# Real ranks: spawned processes in a gloo group


def _rank_main(rank: int, world: int, rendezvous: str, cases: list, device: str) -> None:
    """A spawned rank on ``device`` (on CPU the interpreter on, before the op is imported), a gloo
    group, then each case (``(full args, how)``) through the group's ProcessGroup or a callable
    around it."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    torch.set_num_threads(1)
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        for full, how in cases:
            if how == "group":
                all_reduce = dist.group.WORLD
            else:
                def all_reduce(sums):
                    dist.all_reduce(sums)
                    return sums
            _run_rank(full, world, rank, all_reduce, device)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_ranks_match_the_full_reference(device, world):
    """``world`` processes, each its shard of the same full layers (at TP 4 TINY's 2 kv heads are
    replicated x2), against the single-process float64 reference: T = 0, padding tokens (zero
    rows at out-of-range positions), bf16 and fp32, NeoX and GPT-J, the ProcessGroup and a
    callable."""
    gen = torch.Generator().manual_seed(world)
    cases = [
        (reference.make_tp_inputs(TINY, 0, generator=gen), "group"),
        (reference.make_tp_inputs(TINY, 6, padding=2, generator=gen), "group"),
        (reference.make_tp_inputs(TINY, 9, padding=3, dtype=torch.float32, generator=gen), "callable"),
        (reference.make_tp_inputs(replace(TINY_GPTJ, num_q_heads=8), 4, padding=1, generator=gen), "callable"),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank_main, args=(world, f"{tmp}/rendezvous", cases, device.type), nprocs=world, join=True)
