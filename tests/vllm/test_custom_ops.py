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


def _bad(name):
    """Arguments the real op rejects, each naming ``name``."""
    args = list(_args())
    kwargs = {}
    if name == "positions":
        args[4] = args[4][:-1]
    elif name == "head_dim":
        args[7] = D + 1
    elif name == "q_weight":
        args[1] = args[1][:-2]
    elif name == "eps":
        args[8] = float("nan")
    elif name == "q_bias":
        args[1] = None
        kwargs["q_bias"] = torch.zeros(D, dtype=torch.bfloat16)
    return args, kwargs


BAD = ["positions", "head_dim", "q_weight", "eps", "q_bias"]


@pytest.mark.parametrize("inplace", [False, True], ids=["functional", "inplace"])
@pytest.mark.parametrize("name", BAD)
def test_fake_rejects_what_the_real_op_rejects(inplace, name):
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = custom_ops.inplace_op() if inplace else custom_ops.functional_op()
    args, kwargs = _bad(name)
    with pytest.raises(ValueError, match=name):
        op(*args, **kwargs)
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake_kwargs = {k: mode.from_tensor(v) for k, v in kwargs.items()}
        with pytest.raises(ValueError, match=name):
            op(*fake_args, **fake_kwargs)


@pytest.mark.parametrize("inplace", [False, True], ids=["functional", "inplace"])
def test_meta_tensors_are_validated_too(inplace):
    op = custom_ops.inplace_op() if inplace else custom_ops.functional_op()
    args, _ = _bad("positions")
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(ValueError, match="positions"):
        op(*meta)
    good = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in _args()]
    out = op(*good)
    if not inplace:
        assert out[0].shape == (T, HQ * D) and out[1].shape == (T, HKV * D)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compile_refuses_a_bad_call_while_tracing(dynamic):
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: custom_ops.functional_op()(*a), backend="eager", fullgraph=True,
                             dynamic=dynamic)
    args, _ = _bad("head_dim")
    # Dynamo wraps what the fake raised; the real op never runs (tracing failed).
    with pytest.raises(Exception, match=r"fake tensors.*ValueError\('head_dim must be even"):
        compiled(*args)


def test_compile_with_dynamic_shapes_validates_the_example():
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: custom_ops.functional_op()(*a), backend="eager", fullgraph=True,
                             dynamic=True)
    args = _args()
    q, k = compiled(*args)
    want_q, want_k, *_ = custom_ops.functional_op()(*args)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    short = list(_args())
    short[0], short[4] = short[0][:5], short[4][:5]
    assert compiled(*short)[0].shape == (5, HQ * D)
    # Mismatched token counts: refused by the fake when Dynamo retraces, else by the real op.
    short[4] = short[4][:4]
    with pytest.raises(Exception, match="positions has 4 entries, qkv has 5 tokens"):
        compiled(*short)


def _parsed(schema: str) -> str:
    return str(torch._C.parse_schema(f"{custom_ops.NAMESPACE}::{schema}"))


def test_schema_is_spelled_once():
    from vllm_ascend_ext import ascendc

    functional, inplace = custom_ops.schemas(ascendc.OP_NAME)
    for name, schema in ((ascendc.OP_NAME, functional), (ascendc.INPLACE_OP_NAME, inplace)):
        assert str(getattr(torch.ops.vllm_ascend_ext, name).default._schema) == _parsed(schema)
    assert str(custom_ops.functional_op()._schema) == _parsed(custom_ops.FUNCTIONAL_SCHEMA)
    assert str(custom_ops.inplace_op()._schema) == _parsed(custom_ops.INPLACE_SCHEMA)
