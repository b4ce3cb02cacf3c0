"""``torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope`` (functional) and ``..._`` (in place)."""

from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

from vllm_ascend_ext import custom_ops
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope

HQ, HKV, D, R, T = 4, 2, 32, 16, 9


def _args(dtype=torch.bfloat16, norm=True):
    qkv = torch.randn(T, (HQ + 2 * HKV) * D, dtype=dtype)
    weight = (1 + 0.1 * torch.randn(D, dtype=dtype)) if norm else None
    cache = torch.randn(40, R, dtype=torch.float32)
    positions = torch.randint(0, 40, (T,), dtype=torch.int64)
    return qkv, weight, weight, cache, positions, HQ, HKV, D, 1e-6


@pytest.mark.parametrize("norm", [True, False], ids=["norm", "nonorm"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_opcheck_functional(norm, is_neox):
    opcheck(custom_ops.functional_op(), _args(norm=norm), {"is_neox": is_neox})


@pytest.mark.parametrize("norm", [True, False], ids=["norm", "nonorm"])
def test_opcheck_inplace(norm):
    opcheck(custom_ops.inplace_op(), _args(norm=norm))


def test_schemas_declare_mutation():
    assert not custom_ops.functional_op()._schema.is_mutable
    inplace = custom_ops.inplace_op()._schema
    assert inplace.is_mutable and inplace.arguments[0].alias_info.is_write


@pytest.mark.parametrize("key", custom_ops.DISPATCH_KEYS)
def test_dispatch_keys_have_kernels(key):
    for name in (custom_ops.OP_NAME, custom_ops.INPLACE_OP_NAME):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{custom_ops.NAMESPACE}::{name}", key)


def test_functional_equals_the_triton_op_and_leaves_qkv_alone():
    args = _args()
    before = args[0].clone()
    q, k = custom_ops.functional_op()(*args, is_neox=True)
    want_q, want_k, _ = split_qkv_rmsnorm_rope(*args, is_neox=True)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    assert torch.equal(args[0], before)


def test_inplace_writes_q_and_k_columns_only():
    args = _args()
    qkv = args[0]
    before = qkv.clone()
    want_q, want_k, _ = split_qkv_rmsnorm_rope(before.clone(), *args[1:])
    custom_ops.inplace_op()(*args)
    assert torch.equal(qkv[:, :HQ * D], want_q)
    assert torch.equal(qkv[:, HQ * D:(HQ + HKV) * D], want_k)
    assert torch.equal(qkv[:, (HQ + HKV) * D:], before[:, (HQ + HKV) * D:])


def test_fake_shapes_follow_symbolic_tokens():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        args = _args()
        q, k = custom_ops.functional_op()(*args)
    assert q.shape == (T, HQ * D) and k.shape == (T, HKV * D)


def test_bad_argument_names_it():
    args = list(_args())
    args[4] = args[4][:-1]  # positions of the wrong length
    with pytest.raises(ValueError, match="positions"):
        custom_ops.functional_op()(*args)
