"""``torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope_mla`` and ``mla_q_rope_`` (issue 30).

``opcheck`` on both (the prologue without a cache, with vLLM's combined cache, with
vllm-ascend's (nope, rope) pair, and with q rotated in the same launch: mutated arguments), the
schemas' mutation declarations, and each custom op against the Python op it wraps (bit-equal: the
same kernel) and the float64 reference, with the fake implementation refusing what the validator refuses.
"""

from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

from vllm_ascend_ext.kernels import custom_ops, mla_ops
from vllm_ascend_ext.ops import mla_q_rope_, reference, split_qkv_rmsnorm_rope_mla

LQ, LKV, R, H, NOPE, T = 24, 16, 8, 3, 8, 5
BLOCKS, BLOCK = 3, 4


def _inputs(q_lora=True, dtype=torch.bfloat16):
    lq = LQ if q_lora else 0
    qkv = torch.randn(T, lq + LKV + R, dtype=dtype)
    q_w = (1 + 0.1 * torch.randn(lq, dtype=dtype)) if q_lora else None
    kv_w = 1 + 0.1 * torch.randn(LKV, dtype=dtype)
    cache = torch.randn(32, R, dtype=torch.float32)
    positions = torch.randint(0, 32, (T,), dtype=torch.int64)
    return [qkv, q_w, kv_w, cache, positions, lq, LKV, R, 1e-6]


def _slots():
    slots = torch.randperm(BLOCKS * BLOCK)[:T].to(torch.int64)
    slots[1] = -1  # padding: nothing written
    return slots


@pytest.mark.parametrize("q_lora", [True, False], ids=["q_lora", "no_q_lora"])
def test_opcheck_mla_no_cache(q_lora):
    opcheck(mla_ops.mla_op(), _inputs(q_lora))


def test_opcheck_mla_combined_cache():
    kv_cache = torch.randn(BLOCKS, BLOCK, LKV + R).to(torch.bfloat16)
    opcheck(mla_ops.mla_op(), _inputs(), {"kv_cache": kv_cache, "slot_mapping": _slots()})


def test_opcheck_mla_split_cache():
    nope = torch.randn(BLOCKS, BLOCK, 1, LKV).to(torch.bfloat16)
    rope = torch.randn(BLOCKS, BLOCK, 1, R).to(torch.bfloat16)
    opcheck(mla_ops.mla_op(), _inputs(), {"kv_cache": nope, "rope_cache": rope, "slot_mapping": _slots(),
                                          "split_cache": True})


def test_opcheck_mla_with_q():
    """Without a q latent the prologue rotates q (a mutated argument) in the same launch."""
    q = torch.randn(T, H, NOPE + R, dtype=torch.bfloat16)
    kv_cache = torch.randn(BLOCKS, BLOCK, LKV + R).to(torch.bfloat16)
    opcheck(mla_ops.mla_op(), _inputs(q_lora=False), {"q": q, "kv_cache": kv_cache, "slot_mapping": _slots()})


def test_mla_op_with_q_rotates_it_like_the_q_side():
    args = _inputs(q_lora=False)
    q = torch.randn(T, H, NOPE + R, dtype=torch.bfloat16)
    want_q = mla_q_rope_(q.clone(), args[3], args[4], R)
    outputs = mla_ops.mla_op()(*args, q=q)
    assert torch.equal(q, want_q)
    for got, ref in zip(outputs, split_qkv_rmsnorm_rope_mla(*args)):
        assert torch.equal(got, ref)


def test_opcheck_q_rope():
    q = torch.randn(T, H, NOPE + R, dtype=torch.bfloat16)
    opcheck(mla_ops.q_rope_op(), (q, torch.randn(32, R), torch.randint(0, 32, (T,)), R))


def test_schemas_declare_mutation():
    args = {a.name: a for a in mla_ops.mla_op()._schema.arguments}
    assert all(args[name].alias_info.is_write for name in ("q", "kv_cache", "rope_cache"))
    assert not any(a.alias_info is not None and a.alias_info.is_write for name, a in args.items()
                   if name not in ("q", "kv_cache", "rope_cache"))
    q = mla_ops.q_rope_op()._schema.arguments[0]
    assert q.name == "q" and q.alias_info.is_write


@pytest.mark.parametrize("key", custom_ops.DISPATCH_KEYS)
def test_dispatch_keys_have_kernels(key):
    for name in (mla_ops.MLA_OP_NAME, mla_ops.Q_ROPE_OP_NAME):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{custom_ops.NAMESPACE}::{name}", key)


def test_mla_op_equals_the_triton_op_and_writes_the_cache():
    args = _inputs()
    slots = _slots()
    kv_cache = torch.randn(BLOCKS, BLOCK, LKV + R).to(torch.bfloat16)
    before = kv_cache.clone()
    q_c, kv_c, k_pe = mla_ops.mla_op()(*args, kv_cache=kv_cache, slot_mapping=slots)
    want = split_qkv_rmsnorm_rope_mla(*args)
    for got, ref in zip((q_c, kv_c, k_pe), want):
        assert torch.equal(got, ref)
    assert torch.equal(kv_cache, reference.mla_cache_write(before, kv_c, k_pe, slots))
    assert not torch.equal(kv_cache, before)


def test_q_rope_op_rotates_in_place_like_the_triton_op():
    q = torch.randn(T, H, NOPE + R, dtype=torch.bfloat16)
    cache, positions = torch.randn(32, R), torch.randint(0, 32, (T,))
    want = mla_q_rope_(q.clone(), cache, positions, R)
    result = mla_ops.q_rope_op()(q, cache, positions, R)
    assert result is None and torch.equal(q, want)


def test_fake_refuses_what_the_validator_refuses():
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = _inputs()
    args[2] = args[2][:-1]  # kv_a_weight one short
    with FakeTensorMode() as mode, pytest.raises(ValueError, match="kv_a_weight"):
        mla_ops.mla_op()(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])


def test_rope_cache_without_split_form_is_refused():
    with pytest.raises(ValueError, match="rope_cache"):
        mla_ops.cache_argument(torch.empty(1), torch.empty(1), False)
    with pytest.raises(ValueError, match="kv_cache"):
        mla_ops.cache_argument(None, None, True)
