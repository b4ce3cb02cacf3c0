"""Tests of ``vllm_ascend_ext.ops.split_qkv_rmsnorm_rope`` against an independent float64 reference.

On CPU the kernel runs through the Triton interpreter (small sizes); on a GPU the same tests run
compiled, plus the large sizes marked ``gpu``. Each test runs under every launch plan (Ascend, and
CUDA's large and small-batch plans), forced, so tile and grid boundaries of each are crossed
wherever the kernel runs.
"""

from __future__ import annotations

import contextlib
import importlib
import math

import numpy as np
import pytest
import torch

from vllm_ascend_ext.ops import reference, split_qkv_rmsnorm_rope
from vllm_ascend_ext.ops import tiling
from vllm_ascend_ext.ops.models import MODELS, AttentionGeometry, model
from vllm_ascend_ext.ops.reference import make_inputs
from vllm_ascend_ext.ops import device as device_facts
from vllm_ascend_ext.ops import settings
from vllm_ascend_ext.ops.tiling import KernelShape, ascend, cuda
from vllm_ascend_ext.ops.tiling.cuda import CudaPlan

# The package re-exports the function under the module's name; the module itself, for its seams.
op_module = importlib.import_module("vllm_ascend_ext.ops.split_qkv_rmsnorm_rope")

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
BACKENDS = ("ascend", "cuda-large", "cuda-small")


@pytest.fixture
def poisoned(monkeypatch):
    """Out-of-place outputs are allocated full of NaN, so an unwritten element fails the check."""
    def _new_output(qkv, num_tokens, columns):
        return torch.full((num_tokens, columns), POISON[qkv.dtype], dtype=qkv.dtype, device=qkv.device)

    monkeypatch.setattr(op_module, "_new_output", _new_output)


def plan_of(kind: str, shape: KernelShape, device) -> tiling.PlanBase:
    """The plan of one of :data:`BACKENDS` for ``shape`` (GPU facts when the device is a GPU)."""
    if kind == "ascend":
        return ascend.plan(shape, device_facts.ascend_facts(None))
    facts = device_facts.cuda_facts(torch.cuda.current_device() if device.type == "cuda" else None)
    if kind == "cuda-large":
        return cuda.plan(shape, facts)
    assert kind == "cuda-small", kind
    return cuda.small_batch_plan(shape, facts)


def shape_of(args: dict) -> KernelShape:
    return KernelShape(num_q_heads=args["num_q_heads"], num_kv_heads=args["num_kv_heads"],
                       head_dim=args["head_dim"], rotary_dim=args["cos_sin_cache"].shape[1],
                       elem_bytes=args["qkv"].element_size(),
                       cache_bytes=args["cos_sin_cache"].element_size(), is_neox=args["is_neox"])


def forced(kind: str | None, args: dict):
    """Run under plan ``kind`` (one of :data:`BACKENDS`), or the op's own choice for ``None``."""
    if kind is None:
        return contextlib.nullcontext()
    return tiling.forced(plan=plan_of(kind, shape_of(args), args["qkv"].device))


def run_and_check(args: dict, backend: str | None = None, inplace: bool = False):
    """Run the op (optionally under a forced plan), compare with the reference, return q, k."""
    qkv = args["qkv"]
    before = qkv.clone()
    with forced(backend, args):
        q, k, v = split_qkv_rmsnorm_rope(**args, inplace=inplace)
    ref_q, ref_k, *_ = reference.split_qkv_rmsnorm_rope(**dict(args, qkv=before))
    tol = TOLERANCES[qkv.dtype]
    torch.testing.assert_close(q.double().cpu(), ref_q.cpu(), **tol)
    torch.testing.assert_close(k.double().cpu(), ref_k.cpu(), **tol)
    q_cols = args["num_q_heads"] * args["head_dim"]
    kv_cols = args["num_kv_heads"] * args["head_dim"]
    assert v.data_ptr() == qkv.data_ptr() + (q_cols + kv_cols) * qkv.element_size()
    assert torch.equal(v, before[:, q_cols + kv_cols:])
    if inplace:
        assert q.data_ptr() == qkv.data_ptr() and k.data_ptr() == qkv.data_ptr() + q_cols * qkv.element_size()
    else:
        assert torch.equal(qkv, before), "out-of-place call modified qkv"
    return q, k


#: Token counts the interpreter runs in a few seconds; larger looping cases are GPU-only.
INTERPRETER_MAX_TOKENS = 512


def tile_boundary_tokens(geometry: AttentionGeometry, backend: str, device) -> list[int]:
    """1, odd, a full tile, just past a tile, and enough tiles that programs loop (grid-stride).

    The looping count is skipped in the interpreter when the plan's grid is large (the CUDA plan
    has SMs x 8 programs); ``test_grid_stride_loop`` covers looping there with a small plan.
    """
    shape = KernelShape.of(geometry, 2, 4)
    plan = plan_of(backend, shape, device)
    bt = plan.block_tokens
    looping = bt * -(-(plan.max_programs + 1) // plan.head_blocks(shape)) + 1
    counts = {1, 3, bt, bt + 1, 2 * bt + 1}
    if device.type != "cpu" or looping <= INTERPRETER_MAX_TOKENS:
        counts.add(looping)
    return sorted(counts)


SMALL = model("Qwen3-30B-A3B").shard(4)  # 8/1/128: cheap in the interpreter, q and k blocks


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("geometry", [SMALL, model("GLM-4-9B").shard(8), model("Phi-2").shard(8)],
                         ids=lambda g: g.label)
def test_tile_boundaries(device, poisoned, backend, geometry):
    for tokens in tile_boundary_tokens(geometry, backend, device):
        run_and_check(make_inputs(geometry, tokens, device=device), backend)


@pytest.mark.parametrize("spec", MODELS, ids=lambda m: m.name)
def test_model_table(device, poisoned, spec):
    """Every model of the table, sharded as far as it goes (small per-rank sizes), both plans."""
    geometry = spec.shard(8)
    for backend in BACKENDS:
        run_and_check(make_inputs(geometry, 19, device=device), backend)


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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("row_padding", [32, 24], ids=["aligned-view", "misaligned-view"])
def test_inplace_matches_out_of_place(device, poisoned, backend, row_padding):
    """In place equals out of place, and writes nothing outside q's and k's columns.

    Bit-equal when qkv's row stride is a multiple of 16 elements like the outputs': then both
    calls compile to the same kernel. With a misaligned row stride the compiler specialises the
    in-place stores differently (narrower vectors, another reduction order: seen on the H200),
    so there the two agree to the dtype's tolerance; the interpreter is always bit-equal.
    """
    args = make_inputs(SMALL, 29, device=device, row_padding=row_padding)
    q, k = run_and_check(args, backend)
    wide = args["qkv"]
    base = wide.as_strided((wide.shape[0], wide.stride(0)), (wide.stride(0), 1)).clone()
    qkv = base[:, :wide.shape[1]]
    padding = base[:, wide.shape[1]:].clone()
    q_in, k_in = run_and_check(dict(args, qkv=qkv), backend, inplace=True)
    if device.type == "cpu" or qkv.stride(0) % 16 == 0:
        assert torch.equal(q_in, q) and torch.equal(k_in, k)
    else:
        torch.testing.assert_close(q_in, q, **TOLERANCES[q.dtype])
        torch.testing.assert_close(k_in, k, **TOLERANCES[k.dtype])
    assert torch.equal(base[:, wide.shape[1]:], padding), "wrote outside qkv's columns"


def test_grid_stride_loop(device, poisoned):
    """A plan with far fewer programs than tiles: every program walks many tiles."""
    plan = CudaPlan(block_tokens=2, block_heads=2, kv_block_heads=1, max_programs=3, num_warps=4)
    args = make_inputs(model("Qwen3-8B").shard(8), 23, device=device)
    with tiling.forced(plan=plan):
        run_and_check(args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_repeated_calls_are_bit_identical(device, backend):
    args = make_inputs(SMALL, 37, device=device)
    with forced(backend, args):
        first = split_qkv_rmsnorm_rope(**args)
        second = split_qkv_rmsnorm_rope(**args)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_zero_tokens(device):
    args = make_inputs(SMALL, 0, device=device)
    q, k, v = split_qkv_rmsnorm_rope(**args)
    assert q.shape == (0, 8 * 128) and k.shape == (0, 128) and v.shape == (0, 128)
    q, k, v = split_qkv_rmsnorm_rope(**args, inplace=True)
    assert q.shape == (0, 8 * 128) and k.shape == (0, 128)


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

gpu = pytest.mark.skipif(not torch.cuda.is_available() or settings.triton_interpret(),
                         reason="needs a GPU without the interpreter")


def _compiled_variants() -> int:
    kernel = op_module._split_qkv_rmsnorm_rope_kernel
    caches = getattr(kernel, "device_caches", None)
    if caches is not None:  # Triton >= 3.3
        return sum(len(entry[0]) for entry in caches.values())
    return sum(len(entry) for entry in kernel.cache.values())


@gpu
def test_no_recompile_per_batch_size(device):
    """One kernel for small batches and one for large ones, compiled once each."""
    split_qkv_rmsnorm_rope(**make_inputs(SMALL, 1, device=device))
    split_qkv_rmsnorm_rope(**make_inputs(SMALL, 8192, device=device))
    compiled = _compiled_variants()
    for tokens in (2, 16, 17, 63, 64, 1000, 4096, 8191):
        split_qkv_rmsnorm_rope(**make_inputs(SMALL, tokens, device=device))
    assert _compiled_variants() == compiled


def test_small_batches_get_the_small_batch_plan():
    """The CUDA planner switches plans by tile count, not by anything compiled per batch size."""
    facts = device_facts.CudaFacts(name="test", num_sms=132, source="test")
    shape = KernelShape.of(SMALL, 2, 4)
    large, small = cuda.plan(shape, facts), cuda.small_batch_plan(shape, facts)
    assert cuda.plan_for_tokens(shape, facts, 1) == small
    limit = cuda.SMALL_BATCH_TILES_PER_SM * facts.num_sms
    tokens = [t for t in range(1, 100_000, 7) if large.num_tiles(shape, t) > limit]
    assert cuda.plan_for_tokens(shape, facts, tokens[0]) == large
    assert cuda.plan_for_tokens(shape, facts, tokens[0] - 7) == small
    # The warm-up compiles one batch of each plan from this boundary.
    most = cuda.small_batch_max_tokens(shape, facts)
    assert cuda.plan_for_tokens(shape, facts, most) == small
    assert cuda.plan_for_tokens(shape, facts, most + 1) == large
    assert large.num_tiles(shape, most) <= limit < large.num_tiles(shape, most + 1)


@gpu
def test_cuda_graph_capture(device):
    args = make_inputs(SMALL, 64, device=device)
    expected = split_qkv_rmsnorm_rope(**args)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = split_qkv_rmsnorm_rope(**args)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[0], expected[0]) and torch.equal(captured[1], expected[1])


@gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,tp", [("Qwen3-8B", 1), ("Qwen3-235B-A22B", 1), ("Qwen3-32B", 8),
                                     ("Qwen3-Next-80B-A3B", 1), ("GLM-4-9B", 1), ("Phi-3-mini", 1)])
@pytest.mark.parametrize("tokens", [4097, 16384 + 3])
def test_large(device, poisoned, backend, name, tp, tokens):
    run_and_check(make_inputs(model(name).shard(tp), tokens, device=device), backend)
