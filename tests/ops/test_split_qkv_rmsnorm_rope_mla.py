"""Tests of ``vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_mla`` and its q side, ``mla_q_rope_``,
against the float64 reference (``reference.split_qkv_rmsnorm_rope_mla``, ``reference.mla_q_rope``,
``reference.mla_cache_write``).

Each test runs under forced launch plans (:data:`PLANS`): the Ascend plan, the CUDA plan, its
small-batch plan (one token a tile, latent rows held whole, masked; the q side has none:
:data:`Q_PLANS`), and ``small``, 2 tokens a tile, 2 heads a q-side tile, latent rows in chunks of
16 lanes (so the interpreter-sized rows cross chunk boundaries, the last chunk partial) and 3
programs walking the tiles grid-stride. Outputs are allocated full of NaN inside a frame of sentinels (``poisoned``).
Caches are filled with random bits; after a call every element no valid slot of the first ``T``
addresses must keep its bits, and every addressed one must hold ``reference.mla_cache_write``'s
value (the op's own outputs stored: cast, or quantised), bit for bit. Slot mappings mix a run
across a block boundary, random slots, padding (``-1`` and ``-2**31``) and valid slots past ``T``
that must not be read. The exhaustive grid is marked ``full`` (deselected by default:
``pytest -m full`` runs it).
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from op_checks import TOLERANCES, check_sentinels, make_slots, random_bits
from vllm_ascend_ext.ops import reference, settings, tiling, validation_mla
from vllm_ascend_ext.ops import device as device_facts
from vllm_ascend_ext.ops.models import mla_model
from vllm_ascend_ext.ops.reference import make_mla_inputs
from vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_mla import mla_q_rope_, split_qkv_rmsnorm_rope_mla
from vllm_ascend_ext.ops.tiling import MLAPlan, MLAShape, ascend, cuda

pytestmark = pytest.mark.kernel

op_module = importlib.import_module("vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_mla")

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
PLANS = ("ascend", "cuda", "cuda-small", "small")
#: The q side has no small-batch plan of its own.
Q_PLANS = ("ascend", "cuda", "small")
SMALL_PLAN = MLAPlan(block_tokens=2, block_heads=2, q_chunk=16, kv_chunk=16, max_programs=3, num_warps=4)
#: ``SMALL_PLAN`` with a program a tile: past ``max_programs`` tiles its grid still covers them.
ONE_TILE_PLAN = dataclasses.replace(SMALL_PLAN, one_tile=True)
#: (q_lora_rank, kv_lora_rank, rope_dim): interpreter-sized rows (40 = 2.5 chunks of the small plan),
#: the no-q-latent form (V2-Lite) and the no-rope form (Kimi-K3).
SMALL = (40, 24, 16)
NO_Q_LORA = (0, 24, 16)
NO_ROPE = (40, 24, 0)
def plan_of(kind: str, shape: MLAShape, device) -> MLAPlan:
    if kind == "ascend":
        return ascend.mla_plan(shape, device_facts.ascend_facts(None))
    if kind in ("cuda", "cuda-small"):
        facts = device_facts.cuda_facts(torch.cuda.current_device() if device.type == "cuda" else None)
        return (cuda.mla_plan if kind == "cuda" else cuda.mla_small_plan)(shape, facts)
    assert kind in ("small", "one-tile"), kind
    return SMALL_PLAN if kind == "small" else ONE_TILE_PLAN


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32}[t.element_size()])


# --------------------------------------------------------------------------------------------
# Caches.

def make_cache(args: dict, form: str, *, layout: str = "nd", kv_cache_dtype: str = "auto", dtype=None,
               block_size: int = 4, slot_dtype=torch.int64, padding: int = 2, extra: int = 3, generator=None) -> dict:
    """Cache arguments for the call ``args``: caches of random bits (combined, or the split pair in
    ``layout``), slots from :func:`make_slots`, a scale calibrated so a few values saturate."""
    qkv = args["qkv_lora"]
    tokens, lkv, r, device = qkv.shape[0], args["kv_lora_rank"], args["rope_dim"], qkv.device
    num_blocks = max(2, -(-(2 * tokens + extra + 2) // block_size) + 1)
    if dtype is None:
        dtype = {"auto": qkv.dtype, "int8": torch.int8}.get(kv_cache_dtype, torch.uint8)

    def one(lanes, dt):
        if form == "combined":
            shape = (num_blocks, block_size, lanes)
        elif layout == "nd":
            shape = (num_blocks, block_size, 1, lanes)
        else:
            c0 = 32 // torch.empty((), dtype=dt).element_size()
            shape = (num_blocks, lanes // c0, block_size, c0)
        return random_bits(shape, dt, device, generator)

    kv_cache = one(lkv + r, dtype) if form == "combined" else (one(lkv, dtype), one(r, qkv.dtype) if r else None)
    slots, _ = make_slots(tokens, num_blocks, block_size, padding=padding, extra=extra, dtype=slot_dtype,
                          generator=generator)
    scale = None
    if kv_cache_dtype != "auto":
        _, kv_c, k_pe = reference.split_qkv_rmsnorm_rope_mla(**args)
        amax = float(torch.cat([kv_c, k_pe], dim=1).abs().max()) if tokens else 1.0
        qmax = 127.0 if kv_cache_dtype == "int8" else 448.0
        scale = torch.tensor([0.8 * max(amax, 1e-3) / qmax], dtype=torch.float32, device=device)
    return dict(kv_cache=kv_cache, slot_mapping=slots.to(device), kv_cache_dtype=kv_cache_dtype, k_scale=scale,
                cache_layout=layout)


def _clone_cache(kv_cache):
    if isinstance(kv_cache, tuple):
        return tuple(None if c is None else c.clone() for c in kv_cache)
    return kv_cache.clone()


def _pairs(a, b):
    return zip(a, b) if isinstance(a, tuple) else ((a, b),)


# --------------------------------------------------------------------------------------------
# Running the op and checking everything it wrote and did not write.

def run_and_check(args: dict, plan: str | None = None, cache: dict | None = None, q_heads: int = 0,
                  spelling: str = "padded", generator=None):
    """Run the op (under ``plan``) and check the outputs against the reference, qkv_lora (and its
    row padding) unchanged, the sentinels, and the cache bit for bit against the reference write
    of the op's own outputs. With ``q_heads`` (no q latent) the op also gets a view of q of that
    many heads of 24 + R lanes (:func:`q_view`'s ``spelling``): its rotary lanes must match
    ``reference.mla_q_rope`` and nothing else of the backing tensor change."""
    cache = cache or {}
    qkv = args["qkv_lora"]
    rows = qkv.as_strided((qkv.shape[0], qkv.stride(0)), (qkv.stride(0), 1)) if qkv.shape[0] else qkv
    rows_before = rows.clone()
    before = _clone_cache(cache["kv_cache"]) if cache else None
    q_args = {}
    if q_heads:
        r = args["rope_dim"]
        q, backing, mask, q_mask = q_view(qkv.shape[0], q_heads, 24 + r, spelling, qkv.dtype, qkv.device, generator)
        q_args, q_before, backing_before = {"q": q}, q.clone(), backing.clone()
    shape = validation_mla.split_qkv_rmsnorm_rope_mla(**args, **cache, **q_args).shape
    forced = tiling.forced(plan=plan_of(plan, shape, qkv.device)) if plan else tiling.forced()
    with forced:
        q_c, kv_c, k_pe = split_qkv_rmsnorm_rope_mla(**args, **cache, **q_args)
    expected = reference.split_qkv_rmsnorm_rope_mla(**args)
    if q_heads:
        want_q = reference.mla_q_rope(q_before, args["cos_sin_cache"], args["positions"], r, is_neox=args["is_neox"])
        check_rotated(q, want_q, 24, backing, backing_before, mask, q_mask)
    tokens = qkv.shape[0]
    assert q_c.shape == (tokens, args["q_lora_rank"]) and kv_c.shape == (tokens, args["kv_lora_rank"])
    assert k_pe.shape == (tokens, args["rope_dim"])
    tol = TOLERANCES[qkv.dtype]
    for got, want in zip((q_c, kv_c, k_pe), expected):
        assert got.dtype == qkv.dtype
        torch.testing.assert_close(got.double().cpu(), want.cpu(), **tol)
    assert torch.equal(rows, rows_before), "qkv_lora changed"
    check_sentinels()
    if cache:
        want = reference.mla_cache_write(before, kv_c, k_pe, cache["slot_mapping"],
                                         kv_cache_dtype=cache["kv_cache_dtype"], k_scale=cache["k_scale"],
                                         cache_layout=cache["cache_layout"])
        for got_cache, want_cache in _pairs(cache["kv_cache"], want):
            if got_cache is None:
                continue
            assert torch.equal(bits(got_cache).cpu(), bits(want_cache).cpu()), "cache differs from the reference"
    return q_c, kv_c, k_pe


def looping_tokens(dims, plan: str, device, q_heads: int = 0) -> list[int]:
    """0, 1, 3, a token block, one past it, two and one past, and (where the interpreter affords it)
    enough tiles that programs loop (with ``q_heads`` heads of q rotated in the prologue)."""
    args = make_mla_inputs(*dims, 1, device=device)
    q = {"q": args["qkv_lora"].new_empty(1, q_heads, 24 + dims[2])} if q_heads else {}
    shape = validation_mla.split_qkv_rmsnorm_rope_mla(**args, **q).shape
    p = plan_of(plan, shape, device)
    bt = p.block_tokens
    counts = {0, 1, 3, bt, bt + 1, 2 * bt + 1}
    looping = bt * -(-(p.max_programs + 1) // p.head_blocks(shape)) + 1
    if looping <= 100:
        counts.add(looping)
    return sorted(counts)


@pytest.mark.parametrize("plan", PLANS + ("one-tile",))
@pytest.mark.parametrize("dims,q_heads", [(SMALL, 0), (NO_Q_LORA, 0), (NO_Q_LORA, 5), (NO_ROPE, 0)],
                         ids=["small", "no-q-lora", "no-q-lora-with-q", "no-rope"])
def test_tile_boundaries(device, poisoned, plan, dims, q_heads):
    """Every token count around the plan's tile and across its grid-stride loop (or, a program a
    tile, past its ``max_programs``), with vLLM's combined cache (random bits, padding slots, slots
    past T); without a q latent also with q rotated in the same launch (5 heads: q blocks of 2,
    the last partial)."""
    g = torch.Generator().manual_seed(1)
    for tokens in looping_tokens(dims, plan, device, q_heads):
        args = make_mla_inputs(*dims, tokens, device=device, generator=g)
        run_and_check(args, plan, make_cache(args, "combined", generator=g), q_heads=q_heads, generator=g)


@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
@pytest.mark.parametrize("dtype,cos_dtype", [(BF16, FP32), (FP16, BF16), (FP32, FP32)], ids=str)
def test_rope_styles_and_dtypes(device, poisoned, is_neox, dtype, cos_dtype):
    g = torch.Generator().manual_seed(2)
    args = make_mla_inputs(*SMALL, 7, device=device, dtype=dtype, cache_dtype=cos_dtype, is_neox=is_neox,
                           positions_dtype=torch.int32, row_padding=8, generator=g)
    run_and_check(args, "small")


#: (form, layout, kv_cache_dtype, cache dtype or None for the default): every cache form served.
CACHE_FORMS = [
    ("combined", "nd", "auto", None),
    ("combined", "nd", "auto", FP32),
    ("combined", "nd", "fp8", torch.uint8),
    ("combined", "nd", "fp8_e4m3", torch.float8_e4m3fn),
    ("split", "nd", "auto", None),
    ("split", "nz", "auto", None),
    ("split", "nd", "int8", None),
    ("split", "nz", "int8", None),
]


@pytest.mark.parametrize("plan", ["ascend", "small"])
@pytest.mark.parametrize("form,layout,kv_cache_dtype,dtype", CACHE_FORMS,
                         ids=[f"{f}-{lay}-{k}-{str(d).split('.')[-1]}" for f, lay, k, d in CACHE_FORMS])
def test_cache_forms(device, poisoned, plan, form, layout, kv_cache_dtype, dtype):
    """Each cache form, dtype and quantisation, bit for bit, untouched elements kept. The NZ rows
    are 32 and 16 lanes, whole fractal columns of a bf16 / int8 cache."""
    g = torch.Generator().manual_seed(3)
    args = make_mla_inputs(40, 64, 16, 9, device=device, generator=g)
    run_and_check(args, plan, make_cache(args, form, layout=layout, kv_cache_dtype=kv_cache_dtype, dtype=dtype,
                                         slot_dtype=torch.int32, generator=g))


@pytest.mark.parametrize("form,layout,kv_cache_dtype", [("combined", "nd", "auto"), ("split", "nz", "int8"),
                                                        ("split", "nd", "auto")])
def test_no_rope_and_no_q_lora_caches(device, poisoned, form, layout, kv_cache_dtype):
    g = torch.Generator().manual_seed(4)
    for dims in ((0, 32, 16), (40, 32, 0)):
        args = make_mla_inputs(*dims, 5, device=device, generator=g)
        if dims[2] == 0:
            args.update(cos_sin_cache=None, positions=None)
        run_and_check(args, "small", make_cache(args, form, layout=layout, kv_cache_dtype=kv_cache_dtype,
                                                generator=g))


@pytest.mark.parametrize("name", ["DeepSeek-V3", "DeepSeek-V2-Lite"])
def test_model_dims(device, poisoned, name):
    """The real latent widths (q_c's 1536 lanes in the Ascend plan's 3 chunks of 512), vLLM's fp8
    cache and vllm-ascend's NZ pair with an int8 latent."""
    spec = mla_model(name)
    g = torch.Generator().manual_seed(5)
    args = make_mla_inputs(spec.q_lora_rank, spec.kv_lora_rank, spec.rope_dim, 3, device=device, eps=spec.eps,
                           generator=g)
    run_and_check(args, "ascend", make_cache(args, "combined", kv_cache_dtype="fp8", block_size=16, generator=g))
    run_and_check(args, "cuda", make_cache(args, "split", layout="nz", kv_cache_dtype="int8", block_size=16,
                                           generator=g))
    if not spec.q_lora_rank:  # q_proj's output rotated in the same launch, all 16 heads of the rank
        run_and_check(args, "cuda-small", make_cache(args, "combined", block_size=16, generator=g),
                      q_heads=spec.heads_at(1), generator=g)


def test_fp8_saturates(device, poisoned):
    """Quotients past 448 (saturated, no wrap), of both signs, and across binades: the cache holds
    torch's round-to-nearest-even cast of the saturated fp32 quotient, bit for bit. (Exact ties are
    checked on the shared store helper by the GQA cache write's tests.)"""
    tokens, lkv = 4, 32
    args = make_mla_inputs(0, lkv, 0, tokens, device=device, dtype=FP32)
    # kv_a_weight = 1, eps = 0: y = x / rms(x); the scale puts the largest at 500 (saturated).
    grid = torch.tensor([1.0625, 1.1875, 17.0, 19.0, 300.0, 464.0, 500.0, -1.0625], dtype=torch.float64)
    x = grid.repeat(lkv // grid.numel())
    x = x / x.pow(2).mean().sqrt()
    args["qkv_lora"] = x.float().repeat(tokens, 1).to(device)
    args["kv_a_weight"] = torch.ones(lkv, device=device)
    args["eps"] = 0.0
    cache = make_cache(args, "combined", kv_cache_dtype="fp8", dtype=torch.float8_e4m3fn)
    cache["k_scale"] = torch.tensor([float(x.abs().max()) / 500.0], dtype=torch.float32, device=device)
    run_and_check(args, "small", cache)


def test_slots_and_block_sizes(device, poisoned):
    """Block sizes 1, 3 and 16, int32 and int64 slots, every slot padding but one."""
    g = torch.Generator().manual_seed(6)
    for block_size, slot_dtype, padding in ((1, torch.int64, 2), (3, torch.int32, 2), (16, torch.int64, 6)):
        args = make_mla_inputs(*SMALL, 7, device=device, generator=g)
        run_and_check(args, "small", make_cache(args, "split", layout="nd", block_size=block_size,
                                                slot_dtype=slot_dtype, padding=padding, generator=g))


def test_repeated_calls_are_bit_identical(device):
    g = torch.Generator().manual_seed(7)
    args = make_mla_inputs(*SMALL, 9, device=device, generator=g)
    first = split_qkv_rmsnorm_rope_mla(**args)
    second = split_qkv_rmsnorm_rope_mla(**args)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_outputs_are_new_contiguous_tensors(device):
    args = make_mla_inputs(*SMALL, 5, device=device, row_padding=16)
    for out in split_qkv_rmsnorm_rope_mla(**args):
        assert out.is_contiguous()
        assert out.untyped_storage().data_ptr() != args["qkv_lora"].untyped_storage().data_ptr()


@pytest.mark.full
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
@pytest.mark.parametrize("dims", [SMALL, NO_Q_LORA, NO_ROPE, (16, 48, 32)], ids=str)
@pytest.mark.parametrize("form,layout,kv_cache_dtype,dtype", CACHE_FORMS,
                         ids=[f"{f}-{lay}-{k}-{str(d).split('.')[-1]}" for f, lay, k, d in CACHE_FORMS])
def test_full_grid(device, poisoned, plan, is_neox, dims, form, layout, kv_cache_dtype, dtype):
    """Every plan x rotary style x row form x cache form, across the plan's tile boundaries."""
    g = torch.Generator().manual_seed(8)
    for tokens in looping_tokens(dims, plan, device)[1:]:
        args = make_mla_inputs(*dims, tokens, device=device, is_neox=is_neox, generator=g)
        if layout == "nz" and (dims[1] % 32 or dims[2] % 16):
            continue
        run_and_check(args, plan, make_cache(args, form, layout=layout, kv_cache_dtype=kv_cache_dtype, dtype=dtype,
                                             generator=g), q_heads=3 if dims[0] == 0 and dims[2] else 0, generator=g)


# --------------------------------------------------------------------------------------------
# The q side: mla_q_rope_.

def q_view(tokens: int, heads: int, head_dim: int, spelling: str, dtype, device, generator) -> tuple:
    """``q`` ``[T, H, D]`` as a view of a larger backing tensor, and the mask of the backing's
    elements that are q's: ``contiguous`` (8 elements of the backing before q, 8 after);
    ``padded`` (each head followed by 8 lanes and each token by 16, so the strides are no product
    of the shape); ``heads-outer`` (``[H, T, D]`` transposed: token stride ``D``, head stride
    ``T*D``). Returns ``(q, backing, q_mask)`` with ``q_mask[...]`` a view of the mask shaped as q."""
    if spelling == "contiguous":
        size = (tokens * heads * head_dim + 16,)
    elif spelling == "padded":
        size = (tokens, heads * (head_dim + 8) + 16)
    else:
        assert spelling == "heads-outer", spelling
        size = (heads, tokens, head_dim)
    backing = torch.randn(*size, generator=generator).to(device=device, dtype=dtype)
    mask = torch.zeros(size, dtype=torch.bool, device=device)

    def view(t):
        if spelling == "contiguous":
            return t[8:8 + tokens * heads * head_dim].view(tokens, heads, head_dim)
        if spelling == "padded":
            return t[:, :heads * (head_dim + 8)].view(tokens, heads, head_dim + 8)[..., :head_dim]
        return t.transpose(0, 1)

    return view(backing), backing, mask, view(mask)


def check_rotated(q, want, nope: int, backing, backing_before, mask, q_mask) -> None:
    """q's rotary lanes (from lane ``nope``) against the reference's ``want``, and every other
    element of :func:`q_view`'s backing tensor (q_nope, the lanes around q) bit for bit as
    ``backing_before``."""
    torch.testing.assert_close(q[..., nope:].double().cpu(), want[..., nope:].cpu(), **TOLERANCES[q.dtype])
    q_mask[..., nope:] = True  # the only elements the call may write
    assert torch.equal(bits(backing[~mask]), bits(backing_before[~mask])), "wrote outside q's rotary lanes"


def run_q_and_check(device, tokens: int, heads: int, head_dim: int, rope_dim: int, *, plan: str | None,
                    spelling: str, dtype=BF16, is_neox=False, cos_dtype=FP32, generator=None):
    """Rotate a view of q in place (under ``plan``) and check: the rotary lanes against the
    reference, q_nope and every element of the backing tensor beside q's rotary lanes bit for bit
    unchanged, q returned."""
    q, backing, mask, q_mask = q_view(tokens, heads, head_dim, spelling, dtype, device, generator)
    rope = make_mla_inputs(0, 8, rope_dim, tokens, device=device, dtype=dtype, cache_dtype=cos_dtype,
                           generator=generator)
    cos, positions = rope["cos_sin_cache"], rope["positions"]
    before, backing_before = q.clone(), backing.clone()
    want = reference.mla_q_rope(before, cos, positions, rope_dim, is_neox=is_neox)
    shape = validation_mla.mla_q_rope_(q, cos, positions, rope_dim, is_neox=is_neox).shape
    forced = tiling.forced(plan=plan_of(plan, shape, device)) if plan else tiling.forced()
    with forced:
        out = mla_q_rope_(q, cos, positions, rope_dim, is_neox=is_neox)
    assert out is q
    check_rotated(q, want, head_dim - rope_dim, backing, backing_before, mask, q_mask)


@pytest.mark.parametrize("plan", Q_PLANS)
@pytest.mark.parametrize("spelling", ["contiguous", "padded", "heads-outer"])
def test_q_rope_tile_boundaries(device, plan, spelling):
    """Token counts across the plan's tiles, head counts across its head blocks (5 heads in blocks
    of 2, 4, ...), q's strided views; q_nope and everything beside q untouched."""
    g = torch.Generator().manual_seed(9)
    for tokens, heads in ((1, 5), (3, 1), (5, 3), (9, 5)):
        run_q_and_check(device, tokens, heads, 24, 16, plan=plan, spelling=spelling, generator=g)


@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
@pytest.mark.parametrize("dtype,cos_dtype", [(BF16, FP32), (FP16, FP16), (FP32, BF16)], ids=str)
def test_q_rope_styles_and_dtypes(device, is_neox, dtype, cos_dtype):
    g = torch.Generator().manual_seed(10)
    run_q_and_check(device, 6, 3, 40, 24, plan="small", spelling="padded", dtype=dtype, is_neox=is_neox,
                    cos_dtype=cos_dtype, generator=g)
    run_q_and_check(device, 4, 2, 16, 16, plan="ascend", spelling="contiguous", dtype=dtype, is_neox=is_neox,
                    cos_dtype=cos_dtype, generator=g)


def test_q_rope_deepseek_heads(device):
    """DeepSeek-V3's q at TP 16: 8 heads of 192 lanes, the last 64 rotated (GPT-J)."""
    spec = mla_model("DeepSeek-V3")
    run_q_and_check(device, 3, spec.heads_at(16), spec.q_head_dim, spec.rope_dim, plan=None, spelling="contiguous",
                    generator=torch.Generator().manual_seed(11))


def test_q_rope_zero_tokens(device):
    q = torch.zeros(0, 4, 24, device=device)
    rope = make_mla_inputs(0, 8, 16, 0, device=device)
    assert mla_q_rope_(q, rope["cos_sin_cache"], rope["positions"], 16) is q


# --------------------------------------------------------------------------------------------
# One compiled kernel for every batch size.

def test_call_and_constexprs_do_not_depend_on_the_token_count(device):
    """The validated call (no token count), the plan and the kernel's compile-time arguments are
    the same for every batch size; the token count is a run-time argument not specialised on."""
    g = torch.Generator().manual_seed(12)
    calls = []
    for tokens in (1, 2, 17, 64):
        args = make_mla_inputs(*SMALL, tokens, device=device, generator=g)
        calls.append(validation_mla.split_qkv_rmsnorm_rope_mla(**args, **make_cache(args, "combined", generator=g)))
    assert all(c == calls[0] for c in calls) and len({hash(c) for c in calls}) == 1
    plan = tiling.mla_plan_for(device, calls[0].shape)
    assert op_module.constexprs(calls[0], plan) == op_module.constexprs(calls[-1], plan)
    listed = _do_not_specialize()
    if listed is not None:  # (triton-ascend 3.2's interpreter keeps no decorator arguments)
        assert {"num_tokens", "max_position"} <= listed


def _do_not_specialize() -> set | None:
    """The kernel's arguments Triton does not specialise on (compiled: the JIT function's list;
    interpreted: the decorator's keyword arguments, where the interpreter keeps them; else None)."""
    kernel = op_module.mla_kernel
    if hasattr(kernel, "do_not_specialize"):
        listed = kernel.do_not_specialize
    elif hasattr(kernel, "kwargs"):
        listed = kernel.kwargs["do_not_specialize"]
    else:
        return None
    return {kernel.arg_names[i] if isinstance(i, int) else i for i in listed}


COMPILED = torch.cuda.is_available() and not settings.triton_interpret()


@pytest.mark.skipif(not COMPILED, reason="needs a GPU without the interpreter")
def test_no_recompile_per_batch_size(device):
    kernel = op_module.mla_kernel

    def compiled() -> int:
        caches = getattr(kernel, "device_caches", None)
        if caches is not None:
            return sum(len(entry[0]) for entry in caches.values())
        return sum(len(entry) for entry in kernel.cache.values())

    for tokens in (1, 4096):  # the small-batch plan's kernel and the large one's
        split_qkv_rmsnorm_rope_mla(**make_mla_inputs(*SMALL, tokens, device=device))
    count = compiled()
    for tokens in (2, 17, 64, 1000, 3000):
        split_qkv_rmsnorm_rope_mla(**make_mla_inputs(*SMALL, tokens, device=device))
    assert compiled() == count


@pytest.mark.skipif(not COMPILED, reason="needs a GPU without the interpreter")
@pytest.mark.parametrize("tokens", [3, 4097], ids=["small-plan", "large-plan"])
@pytest.mark.parametrize("dims", [SMALL, NO_Q_LORA], ids=["q-latent", "no-q-lora"])
def test_cuda_graph_replays_new_inputs(device, dims, tokens):
    """The MLA step's launches captured in a CUDA graph (the prologue writing the cache, then the q
    side; without a q latent the prologue given q), replayed after new contents were copied into the
    same buffers (rows, weights, cos/sin, positions, slots, cache, q): every output, the cache and q
    bit for bit as eager calls on those contents. Nothing of an input is read on the host or kept
    in the graph."""
    g = torch.Generator().manual_seed(tokens + dims[0])

    def inputs() -> list:
        args = make_mla_inputs(*dims, tokens, device=device, generator=g)
        cache = make_cache(args, "combined", generator=g)
        q = torch.randn(tokens, 3, 24 + dims[2], generator=g).to(device=device, dtype=args["qkv_lora"].dtype)
        return [args, cache, q]

    def run(args: dict, cache: dict, q: torch.Tensor) -> tuple:
        if dims[0]:
            outputs = split_qkv_rmsnorm_rope_mla(**args, **cache)
            mla_q_rope_(q, args["cos_sin_cache"], args["positions"], args["rope_dim"], is_neox=args["is_neox"])
            return outputs
        return split_qkv_rmsnorm_rope_mla(**args, **cache, q=q)

    def tensors(case: list) -> list:
        args, cache, q = case
        return [t for t in (*args.values(), cache["kv_cache"], cache["slot_mapping"], q) if torch.is_tensor(t)]

    captured, new = inputs(), inputs()
    before = run(*captured)  # the first call (validation, plan, compile) outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = run(*captured)
    for buffer, value in zip(tensors(captured), tensors(new)):
        buffer.copy_(value)
    expected = run(*new)
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip((*outputs, captured[1]["kv_cache"], captured[2]), (*expected, new[1]["kv_cache"], new[2])):
        assert torch.equal(bits(got), bits(want))
    assert not torch.equal(bits(outputs[1]), bits(before[1])), "the replay wrote what the old inputs give"


# --------------------------------------------------------------------------------------------
# Bad inputs: ValueError naming the argument, nothing written.

def _base(device, form="combined", layout="nd", kv_cache_dtype="auto"):
    g = torch.Generator().manual_seed(13)
    args = make_mla_inputs(*SMALL, 5, device=device, generator=g)
    return args, make_cache(args, form, layout=layout, kv_cache_dtype=kv_cache_dtype, generator=g)


BAD_INPUTS = [
    ("qkv_lora", lambda a, c: (dict(a, qkv_lora=a["qkv_lora"][:, :-2]), c)),
    ("qkv_lora", lambda a, c: (dict(a, qkv_lora=a["qkv_lora"].int()), c)),
    ("qkv_lora", lambda a, c: (dict(a, qkv_lora=a["qkv_lora"][0]), c)),
    ("qkv_lora", lambda a, c: (dict(a, qkv_lora=a["qkv_lora"].t().contiguous().t()), c)),
    ("q_lora_rank", lambda a, c: (dict(a, q_lora_rank=-1), c)),
    ("q_lora_rank", lambda a, c: (dict(a, q_lora_rank=40.0), c)),
    ("kv_lora_rank", lambda a, c: (dict(a, kv_lora_rank=0), c)),
    ("rope_dim", lambda a, c: (dict(a, rope_dim=15), c)),
    ("rope_dim", lambda a, c: (dict(a, rope_dim=True), c)),
    ("q_a_weight", lambda a, c: (dict(a, q_a_weight=None), c)),
    ("q_a_weight", lambda a, c: (dict(a, q_a_weight=a["q_a_weight"][:-1]), c)),
    ("q_a_weight", lambda a, c: (dict(a, q_a_weight=a["q_a_weight"].int()), c)),
    ("q_a_weight", lambda a, c: (dict(a, qkv_lora=a["qkv_lora"][:, 40:], q_lora_rank=0), c)),
    ("kv_a_weight", lambda a, c: (dict(a, kv_a_weight=None), c)),
    ("kv_a_weight", lambda a, c: (dict(a, kv_a_weight=a["kv_a_weight"].repeat(2)[::2]), c)),
    ("cos_sin_cache", lambda a, c: (dict(a, cos_sin_cache=None), c)),
    ("cos_sin_cache", lambda a, c: (dict(a, cos_sin_cache=a["cos_sin_cache"][:, :8]), c)),
    ("cos_sin_cache", lambda a, c: (dict(a, cos_sin_cache=a["cos_sin_cache"].double()), c)),
    ("positions", lambda a, c: (dict(a, positions=None), c)),
    ("positions", lambda a, c: (dict(a, positions=a["positions"][:-1]), c)),
    ("positions", lambda a, c: (dict(a, positions=a["positions"].float()), c)),
    ("eps", lambda a, c: (dict(a, eps=float("nan")), c)),
    ("eps", lambda a, c: (dict(a, eps=-1.0), c)),
    ("is_neox", lambda a, c: (dict(a, is_neox="false"), c)),
    ("kv_cache_dtype", lambda a, c: (a, dict(c, kv_cache_dtype="fp8_ds_mla"))),
    ("kv_cache_dtype", lambda a, c: (a, dict(c, kv_cache_dtype="bf16"))),
    ("kv_cache", lambda a, c: (a, dict(c, kv_cache=c["kv_cache"][:, :, :-1]))),
    ("kv_cache", lambda a, c: (a, dict(c, kv_cache=c["kv_cache"].int()))),
    ("kv_cache", lambda a, c: (a, dict(c, kv_cache=(c["kv_cache"],)))),
    ("kv_cache", lambda a, c: (a, dict(c, kv_cache_dtype="fp8", k_scale=torch.ones(1)))),
    ("kv_cache_dtype='int8'", lambda a, c: (a, dict(c, kv_cache_dtype="int8", k_scale=torch.ones(1)))),
    ("cache_layout", lambda a, c: (a, dict(c, cache_layout="nz"))),
    ("cache_layout", lambda a, c: (a, dict(c, cache_layout="NHD"))),
    ("slot_mapping", lambda a, c: (a, dict(c, slot_mapping=None))),
    ("slot_mapping", lambda a, c: (a, dict(c, slot_mapping=c["slot_mapping"][:3]))),
    ("slot_mapping", lambda a, c: (a, dict(c, slot_mapping=c["slot_mapping"].float()))),
    ("slot_mapping", lambda a, c: (a, dict(c, slot_mapping=c["slot_mapping"].repeat_interleave(2)[::2]))),
    ("slot_mapping", lambda a, c: (a, dict(c, kv_cache=None, k_scale=None))),
    ("k_scale", lambda a, c: (a, dict(c, k_scale=torch.ones(1)))),
    ("k_scale", lambda a, c: (a, dict(c, kv_cache=None, slot_mapping=None, k_scale=torch.ones(1)))),
]


@pytest.mark.parametrize("name,change", BAD_INPUTS, ids=[f"{n.split()[0]}-{i}" for i, (n, _) in enumerate(BAD_INPUTS)])
def test_bad_inputs_name_the_argument(device, name, change):
    args, cache = _base(device)
    cache = dict(cache, k_scale=None if cache["k_scale"] is None else cache["k_scale"])
    call, call_cache = change(args, cache)
    if isinstance(call_cache.get("k_scale"), torch.Tensor):
        call_cache = dict(call_cache, k_scale=call_cache["k_scale"].to(device))
    before = _clone_cache(cache["kv_cache"])
    with pytest.raises(ValueError, match=name):
        split_qkv_rmsnorm_rope_mla(**call, **call_cache)
    for got, want in _pairs(cache["kv_cache"], before):
        assert torch.equal(bits(got), bits(want))


def _with_q(device, dims=NO_Q_LORA, tokens: int = 5):
    g = torch.Generator().manual_seed(14)
    args = make_mla_inputs(*dims, tokens, device=device, generator=g)
    if not dims[2]:
        args.update(cos_sin_cache=None, positions=None)
    return args, torch.randn(tokens, 3, 40, generator=g).to(device=device, dtype=args["qkv_lora"].dtype)


#: The prologue's ``q`` (no q latent only): (message, change of (args, q) on NO_Q_LORA).
PROLOGUE_Q_BAD = [
    ("q is rotated in the prologue only without a q latent", lambda a, q, d: (_with_q(d, SMALL)[0], q)),
    ("nothing of q to rotate", lambda a, q, d: (_with_q(d, (0, 24, 0))[0], q)),
    ("q must be \\[T, H, D\\] with T = 5", lambda a, q, d: (a, q[:-1])),
    ("q must have qkv_lora's dtype", lambda a, q, d: (a, q.float() if q.dtype != FP32 else q.half())),
    ("q must be a 3-D", lambda a, q, d: (a, q[:, 0])),
    ("q must have a contiguous last dim", lambda a, q, d: (a, q.reshape(5, 40, 3).transpose(1, 2))),
    ("q's rows must not overlap", lambda a, q, d: (a, q.as_strided(q.shape, (40, 8, 1)))),
    ("rope_dim must be at most q's head size", lambda a, q, d: (a, q[..., :8])),
]


@pytest.mark.parametrize("name,change", PROLOGUE_Q_BAD, ids=[f"prologue-q-{i}" for i in range(len(PROLOGUE_Q_BAD))])
def test_prologue_q_bad_inputs_name_the_argument(device, name, change):
    args, q = _with_q(device)
    call, call_q = change(args, q, device)
    before = call_q.clone()
    with pytest.raises(ValueError, match=name):
        split_qkv_rmsnorm_rope_mla(**call, q=call_q)
    assert torch.equal(bits(call_q), bits(before))


SPLIT_BAD = [
    ("kv_cache\\[0\\]", "nd", lambda c: dict(c, kv_cache=(c["kv_cache"][0][..., :-1], c["kv_cache"][1]))),
    ("kv_cache\\[1\\]", "nd", lambda c: dict(c, kv_cache=(c["kv_cache"][0], c["kv_cache"][1][:1]))),
    ("kv_cache\\[1\\]", "nz", lambda c: dict(c, kv_cache=(c["kv_cache"][0], c["kv_cache"][1].float()))),
    ("kv_cache\\[0\\]", "nz", lambda c: dict(c, kv_cache=(c["kv_cache"][0].float(), c["kv_cache"][1]))),
    ("kv_cache\\[0\\]", "nz", lambda c: dict(c, kv_cache_dtype="int8", k_scale=torch.ones(1))),
    ("kv_cache_dtype='fp8'", "nd", lambda c: dict(c, kv_cache_dtype="fp8", k_scale=torch.ones(1))),
]


@pytest.mark.parametrize("name,layout,change", SPLIT_BAD, ids=[f"split-{i}" for i in range(len(SPLIT_BAD))])
def test_bad_split_caches_name_the_argument(device, name, layout, change):
    g = torch.Generator().manual_seed(14)
    args = make_mla_inputs(40, 64, 16, 5, device=device, generator=g)
    cache = change(make_cache(args, "split", layout=layout, generator=g))
    if isinstance(cache.get("k_scale"), torch.Tensor):
        cache["k_scale"] = cache["k_scale"].to(device)
    with pytest.raises(ValueError, match=name):
        split_qkv_rmsnorm_rope_mla(**args, **cache)


def test_nz_needs_whole_fractal_columns(device):
    """A latent of 24 lanes is no whole number of an int8 cache's 32-lane NZ columns: refused,
    naming the cache and kv_lora_rank."""
    args = make_mla_inputs(40, 24, 16, 3, device=device)
    nope = torch.zeros(4, 1, 4, 32, dtype=torch.int8, device=device)
    rope = torch.zeros(4, 1, 4, 16, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match=r"kv_cache\[0\]: cache_layout='nz' needs kv_lora_rank"):
        split_qkv_rmsnorm_rope_mla(**args, kv_cache=(nope, rope), slot_mapping=torch.zeros(3, dtype=torch.long,
                                                                                            device=device),
                                   kv_cache_dtype="int8", k_scale=torch.ones(1, device=device), cache_layout="nz")


def test_grad_is_refused(device):
    args = make_mla_inputs(*SMALL, 3, device=device, dtype=FP32)
    with pytest.raises(ValueError, match="kv_a_weight requires grad"):
        split_qkv_rmsnorm_rope_mla(**dict(args, kv_a_weight=args["kv_a_weight"].requires_grad_()))


Q_BAD = [
    ("q must be a 3-D", lambda q, c, p: (q[0], c, p, 16)),
    ("q must be bf16", lambda q, c, p: (q.int(), c, p, 16)),
    ("q must have a contiguous last dim", lambda q, c, p: (q.transpose(1, 2), c, p, 2)),
    ("q's rows must not overlap", lambda q, c, p: (q.as_strided(q.shape, (24, 8, 1)), c, p, 16)),
    ("rope_dim", lambda q, c, p: (q, c, p, 0)),
    ("rope_dim", lambda q, c, p: (q, c, p, 32)),
    ("rope_dim", lambda q, c, p: (q, c, p, 15)),
    ("cos_sin_cache", lambda q, c, p: (q, c[:, :8], p, 16)),
    ("cos_sin_cache", lambda q, c, p: (q, None, p, 16)),
    ("positions", lambda q, c, p: (q, c, p[:-1], 16)),
    ("positions", lambda q, c, p: (q, c, p.float(), 16)),
]


@pytest.mark.parametrize("name,change", Q_BAD, ids=[f"q-{i}" for i in range(len(Q_BAD))])
def test_q_rope_bad_inputs_name_the_argument(device, name, change):
    q = torch.randn(5, 3, 24, device=device)
    rope = make_mla_inputs(0, 8, 16, 5, device=device)
    before = q.clone()
    with pytest.raises(ValueError, match=name):
        mla_q_rope_(*change(q, rope["cos_sin_cache"], rope["positions"]))
    assert torch.equal(q, before)


# --------------------------------------------------------------------------------------------
# Plans.

def replace_q(shape: MLAShape, heads: int = 0) -> MLAShape:
    return dataclasses.replace(shape, num_heads=heads, head_dim=shape.head_dim if heads else 0)


@pytest.mark.parametrize("heads", [1, 3, 16, 128])
def test_prologue_q_arms_hold_as_many_heads_as_the_widest_chunk(heads):
    """Without a q latent and with q given, each plan's q tiles take the most heads (a power of
    two, within the backend's cap) whose rotary lanes fit the widest latent chunk (on Ascend, fewer
    where that pads the heads past ``MAX_HEAD_WASTE``), and the prologue has one tile a token block
    per such block of heads after its kv arm; without q, none."""
    shape = MLAShape(0, 512, 64, 2, 4, kv_cache=True, num_heads=heads, head_dim=192)
    assert shape.q_arms and not shape.q_rope
    cuda_facts = device_facts.cuda_facts(None)
    for plan, cap in ((cuda.mla_plan(shape, cuda_facts), cuda.MAX_BLOCK_HEADS),
                      (cuda.mla_small_plan(shape, cuda_facts), cuda.MAX_BLOCK_HEADS),
                      (ascend.mla_plan(shape, device_facts.ascend_facts(None)), ascend.MAX_BLOCK_HEADS)):
        want = min(tiling.next_pow2(heads), cap, max(plan.q_chunk, plan.kv_chunk) // 64)
        blocks = -(-heads // plan.block_heads)
        if cap == cuda.MAX_BLOCK_HEADS:
            assert plan.block_heads == want
        else:
            assert plan.block_heads <= want and (plan.block_heads == 1 or
                                                 blocks * plan.block_heads / heads <= ascend.MAX_HEAD_WASTE)
        assert plan.head_blocks(shape) == 1 + blocks
        assert plan.head_blocks(replace_q(shape)) == 1

def test_every_mla_plan_fits_the_ub_budget_and_chunks_q_c_exactly():
    """Every MLA table row's prologue (each cache form's shape) and q side at every TP size gets an
    Ascend plan within the UB budget; DeepSeek-V3's q_c goes in 3 chunks of 512 (no padding), its
    kv_c whole."""
    from vllm_ascend_ext.ops.models import MLA_MODELS

    facts = device_facts.ascend_facts(None)
    budget = ascend.ub_budget(facts)
    for spec in MLA_MODELS:
        for kv_cache in (False, True):
            shape = MLAShape(spec.q_lora_rank, spec.kv_lora_rank, spec.rope_dim, 2, 4, kv_cache=kv_cache)
            plan = ascend.mla_plan(shape, facts)
            assert plan.ub_bytes <= budget and plan.block_tokens >= ascend.MIN_BLOCK_TOKENS
        for tp in spec.tp_sizes:
            shape = MLAShape(0, 0, spec.rope_dim, 2, 4, num_heads=spec.heads_at(tp), head_dim=spec.q_head_dim)
            assert ascend.mla_plan(shape, facts).ub_bytes <= budget
            if not spec.q_lora_rank:  # the prologue rotating q too
                shape = MLAShape(0, spec.kv_lora_rank, spec.rope_dim, 2, 4, kv_cache=True,
                                 num_heads=spec.heads_at(tp), head_dim=spec.q_head_dim)
                plan = ascend.mla_plan(shape, facts)
                assert plan.ub_bytes <= budget and plan.block_tokens >= ascend.MIN_BLOCK_TOKENS
                assert any(buf.name.startswith("q's rotary lanes") for buf in plan.ub_buffers)
    v3 = ascend.mla_plan(MLAShape(1536, 512, 64, 2, 4), facts)
    assert (v3.q_chunk, v3.q_chunks(MLAShape(1536, 512, 64, 2, 4)), v3.kv_chunk) == (512, 3, 512)
    assert ascend.mla_row_chunk(640) == 128 and ascend.mla_row_chunk(24) == 32
