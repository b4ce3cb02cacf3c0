"""The AscendC kernel's paged KV-cache write (``split_qkv_rmsnorm_rope_kv_cache``), host build.

The kernel class of ``split_qkv_rmsnorm_rope`` with its SQRR_FLAG_KV_* flags, built for the host
against csrc/ascendc_host_sim and driven through ``ascendc.split_qkv_rmsnorm_rope_kv_cache``. Each
case checks, against the float64 reference (``reference.split_qkv_rmsnorm_rope`` and
``reference.kv_cache_write``): q (and the gate), k and v with ``return_kv``, and both caches; the
host layer's byte maps then say exactly what was read and written: the caches' bytes written are
exactly the valid slots' cache lines (caches filled with random bits, views of one tensor, never
read), the slots read are the first T, qkv is written only in place. int8 caches are also
compared with the Triton op under its interpreter, bit for bit where that is exact (away from a
rounding tie of the fp32 arithmetic; everywhere for a copied v). Served: layouts nhd and nz, a
cache of qkv's dtype (bf16/fp16) or int8 per tensor or per channel, with mRoPE, the gated q, v-norm
and ``return_kv``; ``hnd``, ``cpu_vec``, fp8 and other float caches are refused by name.

What passing means is what docs/ascendc.md says of the host build: the algorithm, tiling,
indexing and the AscendC rules the host layer models, never NPU behaviour or speed.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from ascendc_cases import Case, assert_close, make_inputs
from host_sim import byte_mask, poison_new_outputs
from vllm_ascend_ext.kernels import ascendc, ascendc_plan, custom_ops, impl
from vllm_ascend_ext.ops import reference, validation
from vllm_ascend_ext.ops.tiling import KernelShape

INT8 = torch.int8
#: The fp32 kernel and the float64 reference may round ``y / scale`` apart only this close to a
#: .5 tie (the int8 grid's step is 1).
TIE_WINDOW = 1e-3


@dataclasses.dataclass(frozen=True)
class KV:
    """A cache write: layout, dtype (``None``: qkv's), scales, block size, slots, views."""

    layout: str = "nhd"
    int8: bool = False
    per_channel: bool = False
    block_size: int = 16
    return_kv: bool = False
    slot_dtype: torch.dtype = torch.int64
    spelling: str = "2"  # "2": halves of [2, ...]; "blocks2": of [num_blocks, 2, ...]; "padded": last dim + 16
    padding: int = 2  # tokens with a negative slot
    extra_slots: int = 3  # valid slots past T, never to be read


def _id(value) -> str:
    return ",".join(f"{f.name}={getattr(value, f.name)}" for f in dataclasses.fields(value)
                    if getattr(value, f.name) != f.default) or "default"


def cache_shape(layout: str, num_blocks: int, block_size: int, hkv: int, d: int, dtype) -> tuple:
    if layout == "nhd":
        return (num_blocks, block_size, hkv, d)
    c0 = 32 // torch.empty((), dtype=dtype).element_size()
    return (num_blocks, hkv * d // c0, block_size, c0)


def random_bits(shape, dtype, gen) -> torch.Tensor:
    """Random bit patterns (NaNs and infinities included): a sentinel in every element."""
    raw = torch.randint(-128, 128, (math.prod(shape) * torch.empty((), dtype=dtype).element_size(),),
                        dtype=torch.int8, generator=gen)
    return raw.view(dtype).reshape(shape)


def make_slots(tokens: int, num_blocks: int, block_size: int, kv: KV, gen) -> torch.Tensor:
    """Distinct slots: a run across a block boundary, random ones, ``kv.padding`` negative ones
    (-1 and -2**31), then ``kv.extra_slots`` valid slots past T."""
    total = num_blocks * block_size
    run = min(tokens, 3)
    block = int(torch.randint(0, num_blocks - 1, (1,), generator=gen))
    start = min(block * block_size + block_size - 1, total - run)
    chosen = list(range(start, start + run))
    chosen += [s for s in torch.randperm(total, generator=gen).tolist() if s not in chosen][:tokens - run
                                                                                             + kv.extra_slots]
    for i, t in enumerate(torch.randperm(tokens, generator=gen)[:min(kv.padding, tokens)].tolist()):
        chosen[t] = (-1, -(2**31))[i % 2]
    return torch.tensor(chosen, dtype=kv.slot_dtype)


def make_call(case: Case, kv: KV, seed: int = 0) -> tuple[dict, torch.Tensor]:
    """Fresh op arguments and the caches' backing tensor (random bits)."""
    gen = torch.Generator().manual_seed(seed)
    args = make_inputs(case, gen)
    dtype = INT8 if kv.int8 else case.dtype
    num_blocks = max(2, -(-(2 * case.tokens + kv.extra_slots + 2) // kv.block_size) + 1)
    shape = cache_shape(kv.layout, num_blocks, kv.block_size, case.hkv, case.d, dtype)
    if kv.spelling == "2":
        backing = random_bits((2, *shape), dtype, gen)
        key, value = backing[0], backing[1]
    elif kv.spelling == "blocks2":
        backing = random_bits((num_blocks, 2, *shape[1:]), dtype, gen)
        key, value = backing[:, 0], backing[:, 1]
    else:
        backing = random_bits((2, *shape[:-1], shape[-1] + 16), dtype, gen)
        key, value = backing[0, ..., :shape[-1]], backing[1, ..., :shape[-1]]
    args.update(key_cache=key, value_cache=value, cache_layout=kv.layout, return_kv=kv.return_kv,
                slot_mapping=make_slots(case.tokens, num_blocks, kv.block_size, kv, gen), k_scale=None, v_scale=None)
    if kv.int8:  # scales about the data's largest value: most values in range, a few saturated
        ref = reference.split_qkv_rmsnorm_rope(**{n: a for n, a in args.items() if n in _PROLOGUE})
        for name, y in (("k_scale", ref[1]), ("v_scale", ref[2])):
            amax = (y.abs().amax(dim=0) if kv.per_channel else y.abs().amax()).clamp(min=1e-3)
            jitter = 0.75 + 0.5 * torch.rand(amax.shape, generator=gen, dtype=torch.float64)
            scale = (amax * jitter / 127.0).float()
            args[name] = scale if kv.per_channel else scale.reshape(1)
    return args, backing


_PROLOGUE = ("qkv", "q_weight", "k_weight", "cos_sin_cache", "positions", "num_q_heads", "num_kv_heads", "head_dim",
             "eps", "is_neox", "q_bias", "k_bias", "weight_offset", "mrope_section", "mrope_interleaved", "q_gate",
             "v_norm")


@pytest.fixture(autouse=True)
def _poisoned_outputs(monkeypatch):
    """New outputs start as NaN: an element the kernel does not write fails the comparison."""
    poison_new_outputs(monkeypatch, "_kv_outputs")


def near_tie(y: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Where the float64 ``y / scale`` ([T, Hkv*D]) lies within TIE_WINDOW of a .5 (unsaturated)."""
    ratio = (y / scale.double().reshape(-1).expand(y.shape[1])).abs().clamp(max=127.0)
    return (ratio - ratio.floor() - 0.5).abs() < TIE_WINDOW


def scatter(args: dict, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference scatter (``reference.kv_cache_write``) of ``k``/``v`` ([T, Hkv*D], float64)
    into zero caches like the call's, as float64; an int8 cache with unit scales (pass integers)."""
    unit = torch.ones(1) if args["key_cache"].dtype == INT8 else None
    return reference.kv_cache_write(torch.zeros_like(args["key_cache"]), torch.zeros_like(args["value_cache"]), k, v,
                                    args["slot_mapping"], args["num_kv_heads"], args["head_dim"],
                                    cache_layout=args["cache_layout"], k_scale=unit, v_scale=unit)


def masks(args: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The key and value cache elements the first T tokens' valid slots address."""
    ones = torch.ones(args["qkv"].shape[0], args["num_kv_heads"] * args["head_dim"], dtype=torch.float64)
    key, value = scatter(args, ones, ones)
    return key != 0, value != 0


def run_and_check(case: Case, kv: KV, host_sim, seed: int = 0, *, plan: ascendc_plan.AscendCPlan | None = None):
    """Run the AscendC op on one case and check everything it wrote and did not write."""
    args, backing = make_call(case, kv, seed)
    qkv = args["qkv"]
    before_qkv, before_cache = qkv.clone(), backing.clone()
    ref = reference.split_qkv_rmsnorm_rope(**{n: a for n, a in args.items() if n in _PROLOGUE})
    call = {**args, "inplace": case.inplace}
    if plan is not None:
        with ascendc_plan.forced(plan):
            out = ascendc.split_qkv_rmsnorm_rope_kv_cache(**call)
    else:
        out = ascendc.split_qkv_rmsnorm_rope_kv_cache(**call)
    tokens, hkv, d = case.tokens, case.hkv, case.d
    q_cols, kv_cols = case.hq * d, hkv * d
    k_col = (2 if case.q_gate else 1) * q_cols
    v_cols = slice(k_col + kv_cols, k_col + 2 * kv_cols)

    # Outputs: q (and the gate), k and v only with return_kv.
    assert len(out) == (4 if case.q_gate else 3)
    assert_close(out[0], ref[0], case.dtype)
    if case.q_gate:
        assert torch.equal(out[3].double(), ref[3])
    if kv.return_kv:
        assert_close(out[1], ref[1], case.dtype)
        if case.v_norm:
            assert_close(out[2], ref[2], case.dtype)
        else:
            assert out[2].data_ptr() == qkv[:, v_cols].data_ptr() and out[2].shape == (tokens, kv_cols)
    else:
        assert out[1].shape == out[2].shape == (tokens, 0)

    # Caches: the valid slots' lines hold the reference's k and v; nothing else changed.
    key, value = args["key_cache"], args["value_cache"]
    mask_k, mask_v = masks(args)
    valid = int((args["slot_mapping"][:tokens] >= 0).sum())
    assert int(mask_k.sum()) == int(mask_v.sum()) == valid * kv_cols
    union = torch.zeros(backing.shape, dtype=torch.bool)
    for cache, mask in ((key, mask_k), (value, mask_v)):
        union.as_strided(cache.shape, cache.stride(), cache.storage_offset())[mask] = True
    bits = {1: torch.int8, 2: torch.int16}[backing.element_size()]
    assert torch.equal(backing.view(bits)[~union], before_cache.view(bits)[~union]), "wrote outside the slots"
    if kv.int8:
        for i, (name, cache, mask, y) in enumerate((("k", key, mask_k, ref[1]), ("v", value, mask_v, ref[2]))):
            scale = args[f"{name}_scale"]
            quantised = (y / scale.double().reshape(-1)).clamp(-128, 127).round()  # round: half to even
            want = scatter(args, quantised, quantised)[i][mask]
            tie = near_tie(y, scale).double()
            tie = scatter(args, tie, tie)[i][mask] == 1
            diff = (cache[mask].double() - want).abs()
            assert bool(((diff == 0) | ((diff == 1) & tie)).all()), f"{name}: int8 off the reference away from a tie"
            if name == "v" and not case.v_norm:  # a copied v: fp32 x / scale, no rounding to argue about
                assert torch.equal(diff, torch.zeros_like(diff))
    else:
        assert key.dtype == case.dtype
        want_k, want_v = scatter(args, ref[1], ref[2])
        assert_close(key[mask_k], want_k[mask_k], case.dtype)
        assert_close(value[mask_v], want_v[mask_v], case.dtype)
        if not case.v_norm:  # v copied: bit for bit qkv's
            x = before_qkv[:, v_cols].double()
            assert torch.equal(value[mask_v].double(), scatter(args, x, x)[1][mask_v])
        if kv.return_kv:  # the cache holds the returned k (and v) bit for bit: one rounding
            stored = scatter(args, out[1].double(), out[2].double())
            assert torch.equal(key[mask_k].double(), stored[0][mask_k])
            assert torch.equal(value[mask_v].double(), stored[1][mask_v])

    # qkv: written only in place (q, and k and a normalised v with return_kv).
    if case.inplace:
        assert out[0].data_ptr() == qkv.data_ptr()
        if not kv.return_kv:
            assert torch.equal(qkv[:, q_cols:], before_qkv[:, q_cols:])
    else:
        assert torch.equal(qkv, before_qkv)
    check_memory(case, kv, host_sim, args, backing, union)
    return args, out, ref


def check_memory(case: Case, kv: KV, host_sim, args: dict, backing: torch.Tensor, union: torch.Tensor) -> None:
    """The host layer's byte maps: the caches' written bytes are exactly the slots' lines and are
    never read; the first T slots are read and no slot past them; qkv's row padding untouched;
    every output fully written; the scales read (all of a per-channel scale)."""
    region = host_sim.regions["key_cache"]
    assert "value_cache" not in host_sim.regions  # one backing tensor: one region
    lines = np.zeros(region.nbytes, dtype=bool)
    flat = torch.nonzero(union.reshape(-1)).flatten().numpy()
    size = backing.element_size()
    offsets = torch.as_strided(torch.arange(backing.untyped_storage().nbytes() // size), backing.shape,
                               backing.stride(), backing.storage_offset()).reshape(-1).numpy()[flat]
    for b in range(size):
        lines[offsets * size + b] = True
    assert (region.written == lines).all(), "cache bytes written are not exactly the valid slots' lines"
    assert not region.read.any(), "the caches were read"
    slots = host_sim.regions["slot_mapping"]
    first = byte_mask(args["slot_mapping"][:case.tokens], slots)
    assert (slots.read == first).all(), "slot_mapping read other than its first T entries"
    for name in ("k_scale", "v_scale"):
        if kv.int8:
            assert host_sim.regions[name].read.all(), f"{name} not read"
        else:
            assert name not in host_sim.regions
    qkv_region = host_sim.regions["qkv"]
    rows = byte_mask(args["qkv"], qkv_region)
    assert (qkv_region.read == rows).all(), "qkv read other than its rows (or a row not read)"
    if not case.inplace:
        assert not qkv_region.written.any()
        outputs = ["q_out"] + (["k_out"] if kv.return_kv else []) + (["v_out"] if kv.return_kv and case.v_norm
                                                                       else [])
        for name in outputs:
            assert host_sim.regions[name].written.all(), f"{name} not fully written"
        for name in ("k_out", "v_out"):
            if name not in outputs:
                assert name not in host_sim.regions
    if case.q_gate:
        assert host_sim.regions["gate_out"].written.all()


def kv_plan(case: Case, kv: KV) -> ascendc_plan.AscendCPlan:
    q_w, k_w = case.q_norm, case.k_norm
    return ascendc_plan.plan(case.hq, case.hkv, case.d, case.rot, case.dtype.itemsize, case.cache_dtype.itemsize,
                             q_weight=q_w, k_weight=k_w, q_bias=case.bias and q_w, k_bias=case.bias and k_w,
                             is_neox=case.neox, q_gate=case.q_gate, v_norm=case.v_norm, mrope=case.mrope_positions,
                             kv_cache=True, kv_int8=kv.int8, kv_per_channel=kv.per_channel)


def kv_shape(case: Case) -> KernelShape:
    return dataclasses.replace(case.shape(case.cache_dtype.itemsize), kv_cache=True)


BF16, FP16 = torch.bfloat16, torch.float16
CASES = [
    # (1) ND, a cache of qkv's dtype
    (Case(), KV()),
    (Case(dtype=FP16, cache_dtype=FP16), KV(return_kv=True)),
    (Case(tokens=33, hq=12, hkv=2, row_pad=64, cache_pad=8), KV(block_size=128)),
    (Case(d=80, r=32, hq=3, hkv=3, q_norm=False, k_norm=False), KV(spelling="padded", return_kv=True)),
    (Case(d=72, r=40, hq=3, hkv=1, bias=True, dtype=FP16, cache_dtype=BF16), KV(spelling="blocks2")),
    (Case(neox=False, r=64, tokens=9, out_of_range=True), KV(slot_dtype=torch.int32, block_size=16)),
    (Case(tokens=1, hq=1, hkv=1, d=64), KV(padding=0)),
    (Case(tokens=4), KV(padding=4)),  # every slot padding: nothing written
    # (2) int8, per tensor and per channel (D = 80: a head's int8 row padded to 96 bytes in UB)
    (Case(d=64, hq=8, hkv=1), KV(int8=True)),
    (Case(d=80, r=32, hq=3, hkv=3, q_norm=False, k_norm=False), KV(int8=True, per_channel=True, return_kv=True)),
    (Case(dtype=FP16, cache_dtype=FP16, tokens=33, hq=12, hkv=2), KV(int8=True, per_channel=True,
                                                                       block_size=128)),
    (Case(bias=True, weight_offset=1.0), KV(int8=True, spelling="padded", slot_dtype=torch.int32)),
    # (3) NZ: a block's 32-byte columns, block_size * C0 apart
    (Case(), KV(layout="nz")),
    (Case(d=64, dtype=FP16, cache_dtype=FP16, tokens=20), KV(layout="nz", block_size=128, return_kv=True)),
    (Case(d=128, hq=4, hkv=2), KV(layout="nz", int8=True)),
    (Case(d=64, hq=6, hkv=3, neox=False, r=32), KV(layout="nz", int8=True, per_channel=True, spelling="padded")),
    (Case(d=128, tokens=9), KV(layout="nz", spelling="blocks2", int8=True, return_kv=True)),
    # variants: mRoPE, the gated q, v-norm, in place, combined
    (Case(mrope=(16, 24, 24), q_norm=False, k_norm=False), KV()),
    (Case(mrope=(24, 20, 20), interleaved=True), KV(layout="nz", int8=True, per_channel=True)),
    (Case(q_gate=True, d=256, r=64, hq=4, hkv=1, weight_offset=1.0), KV(int8=True, return_kv=True)),
    (Case(q_gate=True, neox=False, r=64, tokens=9), KV(layout="nz")),
    (Case(v_norm=True, d=256, hq=8, hkv=1, weight_offset=1.0), KV(return_kv=True)),
    (Case(v_norm=True, dtype=FP16, cache_dtype=FP16), KV(int8=True)),
    (Case(v_norm=True, q_gate=True, mrope=(24, 20, 20), interleaved=True, row_pad=16, tokens=10),
     KV(layout="nz", return_kv=True)),
    (Case(inplace=True, row_pad=32), KV()),
    (Case(inplace=True, v_norm=True, row_pad=32), KV(return_kv=True)),
    (Case(inplace=True, mrope=(16, 24, 24), dtype=FP16, cache_dtype=FP16), KV(layout="nz", int8=True,
                                                                             return_kv=True)),
]


@pytest.mark.parametrize("case,kv", CASES, ids=[f"{_id(c)}|{_id(k)}" for c, k in CASES])
def test_cache_write_matches_float64_reference(host_sim, case, kv):
    run_and_check(case, kv, host_sim)
    plan = kv_plan(case, kv)
    assert host_sim.ub_peak == plan.ub_bytes <= plan.ub_budget, "UB model differs from the kernel's allocation"
    shape = kv_shape(case)
    assert host_sim.blocks_run == host_sim.block_dim == plan.grid(shape, case.tokens)
    assert host_sim.tiling.numTiles == plan.num_tiles(shape, case.tokens)
    flags = host_sim.tiling.flags
    assert bool(flags & ascendc_plan.FLAG_KV_CACHE) and bool(flags & ascendc_plan.FLAG_KV_NZ) == (kv.layout == "nz")
    assert bool(flags & ascendc_plan.FLAG_KV_INT8) == kv.int8
    assert bool(flags & ascendc_plan.FLAG_KV_PER_CHANNEL) == kv.per_channel
    assert bool(flags & ascendc_plan.FLAG_KV_OUT) == kv.return_kv


def small_plan(case: Case, kv: KV, block_tokens: int, block_heads: int, max_programs: int) -> ascendc_plan.AscendCPlan:
    buffers = ascendc_plan.ub_buffers(case.d, case.rot, block_tokens, block_heads, case.dtype.itemsize,
                                      case.cache_dtype.itemsize, q_weight=case.q_norm, k_weight=case.k_norm,
                                      q_bias=case.bias, k_bias=case.bias, v_norm=case.v_norm,
                                      mrope=case.mrope_positions, kv_int8=kv.int8, kv_per_channel=kv.per_channel)
    return ascendc_plan.AscendCPlan(block_tokens, block_heads, max_programs, block_tokens, buffers, 192 * 1024,
                                    192 * 1024)


@pytest.mark.parametrize("kv", [KV(), KV(int8=True, per_channel=True, return_kv=True), KV(layout="nz", int8=True),
                                KV(layout="nz", return_kv=True, block_size=128)], ids=_id)
@pytest.mark.parametrize("block_tokens,block_heads,max_programs,tokens", [
    (2, 3, 4, 5),    # just past a token tile; head tiles of 3 over 7 q and 3 k (and v) heads
    (1, 1, 40, 13),  # one (token, head) per tile, more tiles than blocks
    (3, 8, 64, 7),   # more blocks allowed than tiles
])
def test_tile_boundaries(host_sim, kv, block_tokens, block_heads, max_programs, tokens):
    """Forced tile shapes: tokens and heads crossing tiles, v blocks counted in the grid."""
    case = Case(tokens=tokens, hq=7, hkv=3, d=64, r=32, neox=False, v_norm=True)
    plan = small_plan(case, kv, block_tokens, block_heads, max_programs)
    run_and_check(case, kv, host_sim, seed=tokens, plan=plan)
    assert host_sim.ub_peak == plan.ub_bytes
    assert host_sim.blocks_run == plan.grid(kv_shape(case), tokens)
    assert host_sim.tiling.numTiles == plan.num_tiles(kv_shape(case), tokens)


def test_plan_gains_the_int8_buffers_within_the_budget():
    """The int8 write's buffers are listed (the tile, its fp16 staging, the scale row) and the
    plan halves block_tokens when they would not fit; a float cache adds no buffer."""
    base = dict(q_weight=True, k_weight=True, is_neox=True)
    plain = ascendc_plan.plan(32, 8, 128, 128, 2, 4, **base)
    same = ascendc_plan.plan(32, 8, 128, 128, 2, 4, kv_cache=True, **base)
    per_tensor = ascendc_plan.plan(32, 8, 128, 128, 2, 4, kv_cache=True, kv_int8=True, **base)
    per_channel = ascendc_plan.plan(32, 8, 128, 128, 2, 4, kv_cache=True, kv_int8=True, kv_per_channel=True, **base)
    names = [n for n, _ in per_channel.ub_buffers]
    assert [n for n, _ in same.ub_buffers] == [n for n, _ in plain.ub_buffers]
    assert any(n.startswith("KV int8 tile") for n in names) and any(n.startswith("KV scale row") for n in names)
    for p in (same, per_tensor, per_channel):
        assert p.ub_bytes <= p.ub_budget
        assert p.block_tokens <= p.triton_block_tokens
    bt, bh = per_channel.block_tokens, per_channel.block_heads
    int8_tile = dict(per_channel.ub_buffers)["KV int8 tile out x2"]
    assert int8_tile == 2 * bt * bh * 128


def test_triton_op_agrees_bit_for_bit_on_int8(host_sim, monkeypatch):
    """The Triton op (interpreter) and the AscendC kernel write the same int8 cache lines, except
    ±1 where float64 puts y / scale within TIE_WINDOW of a .5 (fp32 arithmetic of two kernels),
    and exactly everywhere for the copied v (both compute fp32(x) / scale, then round)."""
    from vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_kv_cache import split_qkv_rmsnorm_rope_kv_cache

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for seed, (case, kv) in enumerate([(Case(tokens=9, d=64), KV(int8=True)),
                                       (Case(tokens=9, d=64, hq=4, hkv=2), KV(int8=True, per_channel=True)),
                                       (Case(tokens=9, d=64), KV(layout="nz", int8=True, per_channel=True))]):
        args, backing = make_call(case, kv, seed)
        twin = backing.clone()
        twin_key = twin.as_strided(args["key_cache"].shape, args["key_cache"].stride(),
                                   args["key_cache"].storage_offset())
        twin_value = twin.as_strided(args["value_cache"].shape, args["value_cache"].stride(),
                                     args["value_cache"].storage_offset())
        ascendc.split_qkv_rmsnorm_rope_kv_cache(**args)
        split_qkv_rmsnorm_rope_kv_cache(**{**args, "key_cache": twin_key, "value_cache": twin_value})
        ref = reference.split_qkv_rmsnorm_rope(**{n: a for n, a in args.items() if n in _PROLOGUE})
        tie = near_tie(ref[1], args["k_scale"]).double()
        tie_k = scatter(args, tie, tie)[0] == 1
        diff = (args["key_cache"].double() - twin_key.double()).abs()
        assert bool(((diff == 0) | ((diff == 1) & tie_k)).all())
        assert torch.equal(args["value_cache"], twin_value)


def test_int8_rounds_half_to_even_and_saturates(host_sim):
    """Crafted v values (a copied v: y is qkv's v exactly) at ties and beyond the range: the cache
    holds round-half-even and saturated values (-128 and 127, no wrap), per tensor and per channel."""
    case = Case(tokens=8, hq=1, hkv=1, d=64, r=32, dtype=torch.float16, cache_dtype=torch.float16)
    table = [(0.5, 0), (1.5, 2), (2.5, 2), (-0.5, 0), (-1.5, -2), (-2.5, -2), (126.5, 126), (127.5, 127),
             (-127.5, -128), (-128.5, -128), (300.0, 127), (-300.0, -128), (3.25, 3), (-3.75, -4), (0.0, 0),
             (100.0, 100)]
    for per_channel in (False, True):
        kv = KV(int8=True, per_channel=per_channel, padding=0)
        args, _ = make_call(case, kv, seed=3)
        scale = torch.full((64,) if per_channel else (1,), 0.5)
        if per_channel:
            scale[1::2] = 0.25
        args.update(k_scale=scale.clone(), v_scale=scale)
        values = torch.tensor([y for y, _ in table], dtype=torch.float64)
        ys = values.repeat(case.tokens * 64 // len(table))[:case.tokens * 64].reshape(case.tokens, 64)
        v = (ys * scale.double()).to(case.dtype)  # exact in fp16: halves and quarters of small integers
        assert torch.equal(v.double() / scale.double(), ys)
        args["qkv"][:, 2 * 64:3 * 64] = v
        ascendc.split_qkv_rmsnorm_rope_kv_cache(**args)
        expected = dict(table)
        want = ys.clone().apply_(lambda y: expected[y])
        mask = masks(args)[1]
        assert int(mask.sum()) == case.tokens * 64
        assert torch.equal(args["value_cache"][mask].double(), scatter(args, want, want)[1][mask])


def test_zero_tokens_write_nothing(host_sim):
    case = Case(tokens=0)
    args, backing = make_call(dataclasses.replace(case, tokens=3), KV(padding=0))
    before = backing.clone()
    args = {**args, "qkv": args["qkv"][:0], "positions": args["positions"][..., :0]}
    host_sim.tiling = None
    q, k, v = ascendc.split_qkv_rmsnorm_rope_kv_cache(**args)
    assert q.shape == (0, 4 * 128) and k.shape == v.shape == (0, 0)
    assert host_sim.tiling is None and torch.equal(backing.view(torch.int16), before.view(torch.int16))


# --- what is refused ----------------------------------------------------------------------------
def _hnd(args):
    key = args["key_cache"]
    return dict(cache_layout="hnd", key_cache=key.transpose(1, 2), value_cache=args["value_cache"].transpose(1, 2))


def _cpu_vec(args):
    nb, bs, h, d = args["key_cache"].shape
    one = torch.zeros(nb, h, bs, 2 * d, dtype=args["key_cache"].dtype)
    return dict(cache_layout="cpu_vec", key_cache=one, value_cache=one)


def _fp8(args):
    return dict(key_cache=args["key_cache"].to(torch.float8_e4m3fn), value_cache=args["value_cache"].to(
        torch.float8_e4m3fn), k_scale=torch.ones(1), v_scale=torch.ones(1))


def _fp32(args):
    return dict(key_cache=args["key_cache"].float(), value_cache=args["value_cache"].float())


REFUSED = {
    "hnd": (_hnd, r"does not write cache_layout='hnd' \(it writes nhd, nz\); the Triton op does"),
    "cpu_vec": (_cpu_vec, r"does not write cache_layout='cpu_vec' \(it writes nhd, nz\); the Triton op does"),
    "fp8": (_fp8, r"does not write a torch.float8_e4m3fn KV cache \(it writes qkv's dtype torch.bfloat16 and "
                  r"int8\); the Triton op does"),
    "fp32": (_fp32, r"does not write a torch.float32 KV cache"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_unserved_layouts_and_dtypes_are_refused_by_name(host_sim, monkeypatch, name):
    """The AscendC entry raises ValueError naming the layout or dtype; a forced
    VLLM_ASCEND_EXT_IMPL=ascendc call raises RuntimeError naming it, before anything runs; auto
    keeps Triton for it."""
    change, match = REFUSED[name]
    args, _ = make_call(Case(tokens=5, hq=4, hkv=2, d=64), KV(padding=1))
    args.update(change(args))
    saved = args["key_cache"].clone()
    host_sim.tiling = None
    with pytest.raises(ValueError, match=match):
        ascendc.split_qkv_rmsnorm_rope_kv_cache(**args)
    monkeypatch.setenv(impl.ENV_IMPL, "ascendc")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match=r"^VLLM_ASCEND_EXT_IMPL=ascendc, but the AscendC kernel " + match):
        impl.split_qkv_rmsnorm_rope_kv_cache(**args)
    assert host_sim.tiling is None and torch.equal(args["key_cache"].view(torch.uint8), saved.view(torch.uint8))
    monkeypatch.setenv(impl.ENV_IMPL, "auto")
    call = validation.split_qkv_rmsnorm_rope_kv_cache(**args)
    choice = impl.choose_impl(torch.device("cpu"), dtype=torch.bfloat16, head_dim=64, features=call.features,
                              kv_cache=call.kv_cache, kv_dtype=args["key_cache"].dtype)
    assert choice.impl == "triton"


def test_bad_inputs_fail_through_the_validator_before_anything_runs(host_sim):
    args, backing = make_call(Case(tokens=5, hq=4, hkv=2, d=64), KV())
    before = backing.clone()
    host_sim.tiling = None
    for bad, match in ((dict(slot_mapping=args["slot_mapping"].float()), "slot_mapping must be int32 or int64"),
                       (dict(cache_layout="nd"), "cache_layout must be one of"),
                       (dict(return_kv=1), "return_kv must be a bool"),
                       (dict(k_scale=torch.ones(1), v_scale=torch.ones(1)), "k_scale is only used"),
                       (dict(value_cache=args["value_cache"][:1]), "value_cache must have key_cache's shape"),
                       (dict(qkv=args["qkv"][:, :4 * 64], num_kv_heads=0, k_weight=None),  # q-only: no k, no v
                        "num_kv_heads must be >= 1 with a KV-cache write")):
        with pytest.raises(ValueError, match=match):
            ascendc.split_qkv_rmsnorm_rope_kv_cache(**{**args, **bad})
    small, _ = make_call(Case(tokens=5, hq=2, hkv=1, d=16, r=16), KV(padding=0))
    int8 = torch.zeros(2, 4, 1, 16, 32, dtype=torch.int8)
    with pytest.raises(ValueError, match="head_dim to be a multiple of 32"):  # int8 NZ: 32 lanes per column
        ascendc.split_qkv_rmsnorm_rope_kv_cache(**{**small, "cache_layout": "nz", "key_cache": int8[0],
                                                   "value_cache": int8[1], "k_scale": torch.ones(1),
                                                   "v_scale": torch.ones(1)})
    assert host_sim.tiling is None and torch.equal(backing.view(torch.int16), before.view(torch.int16))


def test_fakes_refuse_what_the_kernel_refuses():
    """Tracing (FakeTensorMode) validates as running does: the AscendC KV op's fake names hnd."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    args, _ = make_call(Case(tokens=5, hq=4, hkv=2, d=64), KV(padding=1))
    args.update(_hnd(args))
    op = getattr(torch.ops.vllm_ascend_ext, ascendc.KV_OP_NAME)
    with FakeTensorMode(allow_non_fake_inputs=True):
        with pytest.raises(ValueError, match="does not write cache_layout='hnd'"):
            op(*(args[n] for n in ("qkv", "q_weight", "k_weight", "cos_sin_cache", "positions", "key_cache",
                                   "value_cache", "slot_mapping", "num_q_heads", "num_kv_heads", "head_dim")),
               cache_layout="hnd")


def test_schemas_are_the_custom_ops():
    """The AscendC KV ops' schemas are the custom op's, spelled once (and in place: qkv mutable)."""
    functional, inplace = ascendc.kv_schemas()
    assert functional.split("(", 1)[1] == custom_ops.KV_CACHE_SCHEMA.split("(", 1)[1]
    assert inplace.startswith(ascendc.KV_INPLACE_OP_NAME + "(Tensor(c!) qkv") and inplace.endswith("-> ()")
    for name, schema in ((ascendc.KV_OP_NAME, functional), (ascendc.KV_INPLACE_OP_NAME, inplace)):
        parsed = torch._C.parse_schema(f"vllm_ascend_ext::{schema}")
        assert str(getattr(torch.ops.vllm_ascend_ext, name).default._schema) == str(parsed)


def test_opcheck(host_sim):
    args, _ = make_call(Case(tokens=5, hq=4, hkv=2, d=64), KV(int8=True, per_channel=True))
    op = getattr(torch.ops.vllm_ascend_ext, ascendc.KV_OP_NAME).default
    positional = tuple(args[n] for n in ("qkv", "q_weight", "k_weight", "cos_sin_cache", "positions", "key_cache",
                                         "value_cache", "slot_mapping", "num_q_heads", "num_kv_heads", "head_dim"))
    kwargs = dict(cache_layout="nhd", k_scale=args["k_scale"], v_scale=args["v_scale"], return_kv=True)
    torch.library.opcheck(op, positional, kwargs, test_utils=("test_schema", "test_faketensor"))
    assert np.any(host_sim.regions["key_cache"].written)


# --- the host layer's new calls (Maxs, Mins, Cast half -> int8_t) -------------------------------
ROUND_MODES = {"CAST_NONE": 0, "CAST_RINT": 1, "CAST_FLOOR": 2, "CAST_CEIL": 3, "CAST_ROUND": 4, "CAST_TRUNC": 5}
CHAIN_VALUES = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, -127.5, -128.5, 300.0, -300.0, 3.25, -3.75, 0.0]


def _int8_chain(lib, values, *, clamp: bool, mode: str) -> list[int]:
    import ctypes

    fn = lib.selftest_int8_chain
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(ctypes.c_float), ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_float,
                   ctypes.c_int, ctypes.POINTER(ctypes.c_int8), ctypes.c_char_p, ctypes.c_int]
    src = (ctypes.c_float * len(values))(*values)
    out = (ctypes.c_int8 * len(values))()
    err = ctypes.create_string_buffer(256)
    rc = fn(src, len(values), int(clamp), -128.0, 127.0, ROUND_MODES[mode], out, err, len(err))
    assert rc == 0, err.value.decode()
    return list(out)


@pytest.mark.parametrize("mode", ROUND_MODES)
def test_host_layer_cast_half_to_int8_rounds_by_mode_and_saturates(selftest_lib, mode):
    """Cast half -> int8_t as the API reference says (asc-devkit Cast.md): rounded by the mode
    (CAST_NONE as CAST_RINT when inexact), overflow saturated; Maxs/Mins clamp first, the same
    results (the kernel clamps as the Triton op does, then casts exact integers)."""
    rounding = {"CAST_NONE": round, "CAST_RINT": round, "CAST_FLOOR": math.floor, "CAST_CEIL": math.ceil,
                "CAST_ROUND": lambda y: math.copysign(math.floor(abs(y) + 0.5), y), "CAST_TRUNC": math.trunc}[mode]
    want = [int(max(-128, min(127, rounding(y)))) for y in CHAIN_VALUES]  # Python's round: half to even
    assert _int8_chain(selftest_lib, CHAIN_VALUES, clamp=False, mode=mode) == want
    assert _int8_chain(selftest_lib, CHAIN_VALUES, clamp=True, mode=mode) == want


def test_in_place_bumps_the_version_counter_and_functional_does_not(host_sim):
    """In place, q (and k with return_kv) go into qkv: its autograd version counter is bumped, as
    the Triton op does, so a graph that saved qkv refuses to backpropagate; out of place, not."""
    args, _ = make_call(Case(tokens=5, hq=4, hkv=2, d=64), KV(return_kv=True))
    version = args["qkv"]._version
    ascendc.split_qkv_rmsnorm_rope_kv_cache(**args)
    assert args["qkv"]._version == version
    q, k, v = ascendc.split_qkv_rmsnorm_rope_kv_cache(**args, inplace=True)
    assert args["qkv"]._version > version
    assert q.data_ptr() == args["qkv"].data_ptr() and k.data_ptr() == args["qkv"][:, 4 * 64:].data_ptr()
    with pytest.raises(ValueError, match="grad"):
        ascendc.split_qkv_rmsnorm_rope_kv_cache(**{**args, "qkv": args["qkv"].clone().requires_grad_()})
