"""``torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope`` (functional) and ``..._`` (in place).

The functional op returns ``(q, k, v, gate)``: v ``[T, Hkv*D]`` when normalised (``v_norm``),
else ``[T, 0]`` (the caller slices v from qkv), the gate ``[T, Hq*D]`` with ``q_gate``, else
``[T, 0]``. The in-place op returns nothing (schema ``-> ()``). Each variant of issue 10 (mRoPE,
gated q, v-norm, q-only, combined) is checked with ``opcheck``, through symbolic tracing, and
against the Python op.
"""

from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

from vllm_ascend_ext import custom_ops
from vllm_ascend_ext.ops import reference, split_qkv_rmsnorm_rope
from vllm_ascend_ext.ops.models import AttentionGeometry

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
    q, k, v, gate = custom_ops.functional_op()(*args, is_neox=True)
    want_q, want_k, _ = split_qkv_rmsnorm_rope(*args, is_neox=True)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    assert v.shape == gate.shape == (T, 0)
    assert torch.equal(args[0], before)


def test_inplace_writes_q_and_k_columns_only():
    args = _args()
    qkv = args[0]
    before = qkv.clone()
    want_q, want_k, _ = split_qkv_rmsnorm_rope(before.clone(), *args[1:])
    assert custom_ops.inplace_op()(*args) is None
    assert torch.equal(qkv[:, :HQ * D], want_q)
    assert torch.equal(qkv[:, HQ * D:(HQ + HKV) * D], want_k)
    assert torch.equal(qkv[:, (HQ + HKV) * D:], before[:, (HQ + HKV) * D:])


def test_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        args = _args()
        q, k, v, gate = custom_ops.functional_op()(*args)
    assert q.shape == (T, HQ * D) and k.shape == (T, HKV * D) and v.shape == gate.shape == (T, 0)


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
    _check_real_and_fake_reject(inplace, name, *_bad(name))


def _check_real_and_fake_reject(inplace: bool, name: str, args, kwargs) -> None:
    """The real op and its fake implementation both raise a ValueError naming ``name``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = custom_ops.inplace_op() if inplace else custom_ops.functional_op()
    with pytest.raises(ValueError, match=name):
        op(*args, **kwargs)
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake_kwargs = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
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
    if inplace:
        assert out is None
    else:
        assert [o.shape for o in out] == [(T, HQ * D), (T, HKV * D), (T, 0), (T, 0)]


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
    q, k, *_ = compiled(*args)
    want_q, want_k, *_ = custom_ops.functional_op()(*args)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    short = list(_args())
    short[0], short[4] = short[0][:5], short[4][:5]
    assert compiled(*short)[0].shape == (5, HQ * D)
    # Mismatched token counts: refused by the fake when Dynamo retraces, else by the real op.
    short[4] = short[4][:4]
    with pytest.raises(Exception, match="positions has 4 tokens, qkv has 5"):
        compiled(*short)


# --------------------------------------------------------------------------------------------
# The variants of issue 10, through both custom ops.

#: Small layers of each variant (R/2 = 8 where sections are given).
VARIANTS = {
    "mrope": AttentionGeometry(HQ, HKV, D, R, mrope_section=(4, 2, 2)),
    "mrope-i": AttentionGeometry(HQ, HKV, D, R, mrope_section=(4, 3, 1), mrope_interleaved=True),
    "gate": AttentionGeometry(HQ, HKV, D, R, weight_offset=1.0, q_gate=True),
    "vnorm": AttentionGeometry(HQ, HKV, D, D, is_neox=False, v_norm=True),
    "q-only": AttentionGeometry(HQ, 0, D, D),
    "q-only gate mrope-i": AttentionGeometry(HQ, 0, D, R, q_gate=True, mrope_section=(4, 3, 1),
                                             mrope_interleaved=True),
    "all": AttentionGeometry(HQ, HKV, D, R, is_neox=False, weight_offset=1.0, q_gate=True, v_norm=True,
                             mrope_section=(3, 3, 2), mrope_interleaved=True),
}
IN_PLACE_VARIANTS = [name for name, g in VARIANTS.items() if not g.q_gate]
POSITIONAL = ("qkv", "q_weight", "k_weight", "cos_sin_cache", "positions", "num_q_heads", "num_kv_heads",
              "head_dim", "eps")


def _variant(name: str, tokens: int = T, **options) -> tuple[tuple, dict]:
    """Fresh inputs of variant ``name`` as the custom ops take them: positional, then keywords."""
    kwargs = reference.make_inputs(VARIANTS[name], tokens, **options)
    args = tuple(kwargs.pop(key) for key in POSITIONAL)
    return args, kwargs


def _expected_shapes(name: str, tokens) -> list[tuple]:
    """The functional op's ``(q, k, v, gate)`` shapes for variant ``name``."""
    g = VARIANTS[name]
    q_cols, kv_cols = g.num_q_heads * g.head_dim, g.num_kv_heads * g.head_dim
    return [(tokens, q_cols), (tokens, kv_cols), (tokens, kv_cols if g.v_norm else 0),
            (tokens, q_cols if g.q_gate else 0)]


@pytest.mark.parametrize("name", VARIANTS)
def test_opcheck_functional_variants(name):
    args, kwargs = _variant(name, bias=True)
    opcheck(custom_ops.functional_op(), args, kwargs)


@pytest.mark.parametrize("name", IN_PLACE_VARIANTS)
def test_opcheck_inplace_variants(name):
    args, kwargs = _variant(name)
    opcheck(custom_ops.inplace_op(), args, kwargs)


@pytest.mark.parametrize("name", VARIANTS)
def test_functional_variants_equal_the_python_op(name):
    """q and k (and v with v-norm, the gate with q_gate) are the Python op's, bit for bit; v and
    gate are ``[T, 0]`` where the op does not write them; qkv is left alone."""
    args, kwargs = _variant(name, bias=True, row_padding=8)
    before = args[0].clone()
    outputs = custom_ops.functional_op()(*args, **kwargs)
    want = split_qkv_rmsnorm_rope(*args, **kwargs)
    g = VARIANTS[name]
    assert [tuple(o.shape) for o in outputs] == _expected_shapes(name, T)
    assert torch.equal(outputs[0], want[0]) and torch.equal(outputs[1], want[1])
    if g.v_norm:
        assert torch.equal(outputs[2], want[2])
    if g.q_gate:
        assert torch.equal(outputs[3], want[3])
    assert torch.equal(args[0], before)


@pytest.mark.parametrize("name", IN_PLACE_VARIANTS)
def test_inplace_variants_equal_the_python_op(name):
    """The in-place op writes what the Python op writes in place (q, k, and v with v-norm), and
    nothing else of qkv."""
    args, kwargs = _variant(name, row_padding=8)
    qkv = args[0]
    width = qkv.shape[1]
    rows = qkv.as_strided((qkv.shape[0], qkv.stride(0)), (qkv.stride(0), 1))
    want_rows = rows.clone()
    split_qkv_rmsnorm_rope(want_rows[:, :width], *args[1:], **kwargs, inplace=True)
    assert not torch.equal(want_rows, rows)
    assert custom_ops.inplace_op()(*args, **kwargs) is None
    assert torch.equal(rows, want_rows)


def test_inplace_op_refuses_the_gate():
    args, kwargs = _variant("gate")
    before = args[0].clone()
    with pytest.raises(ValueError, match="inplace=True cannot be combined with q_gate"):
        custom_ops.inplace_op()(*args, **kwargs)
    assert torch.equal(args[0], before)


@pytest.mark.parametrize("name", VARIANTS)
def test_fake_shapes_follow_symbolic_tokens(name):
    """Traced with symbolic sizes, every output's token dim is qkv's token symbol (no
    specialisation), and the other dims are the variant's."""
    from torch.fx.experimental.proxy_tensor import make_fx

    args, kwargs = _variant(name, tokens=7)
    traced = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]  # every tensor is an input

    def run(*tensors):
        call = list(args)
        for i, tensor in zip(traced, tensors):
            call[i] = tensor
        return custom_ops.functional_op()(*call, **kwargs)

    graph = make_fx(run, tracing_mode="symbolic")(*(args[i] for i in traced))
    placeholders = [node.meta["val"] for node in graph.graph.nodes if node.op == "placeholder"]
    tokens = placeholders[0].shape[0]
    assert isinstance(tokens, torch.SymInt) and isinstance(placeholders[-1].shape[-1], torch.SymInt)
    outputs = [node.meta["val"] for node in graph.graph.find_nodes(op="output")[0].args[0]]
    # Compared as text: a SymInt == int comparison would specialise instead of failing.
    assert [tuple(map(str, o.shape)) for o in outputs] == [tuple(map(str, e)) for e in _expected_shapes(name, tokens)]


@pytest.mark.parametrize("name", ["mrope-i", "q-only", "all"])
def test_compile_dynamic_variants(name):
    """Compiled with dynamic shapes, a variant serves other token counts without retracing a
    bad call, and equals the eager op."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a, **k: custom_ops.functional_op()(*a, **k), backend="eager",
                             fullgraph=True, dynamic=True)
    for tokens in (9, 5):
        args, kwargs = _variant(name, tokens=tokens)
        got = compiled(*args, **kwargs)
        want = custom_ops.functional_op()(*args, **kwargs)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        assert [tuple(o.shape) for o in got] == _expected_shapes(name, tokens)


def _bad_variant(name):
    """A variant's arguments the real op rejects, each naming ``name``."""
    if name == "mrope_section":
        args, kwargs = _variant("mrope")
        kwargs["mrope_section"] = [4, 2, 1]  # sums to 7, R/2 = 8
    elif name == "positions":
        args, kwargs = _variant("mrope")
        args = (*args[:4], args[4][:2], *args[5:])  # [2, T]
    elif name == "v_norm":
        args, kwargs = _variant("q-only")
        kwargs["v_norm"] = True
    elif name == "k_weight":
        args, kwargs = _variant("q-only")
        args = (args[0], args[1], args[1], *args[3:])
    else:
        assert name == "qkv"
        args, kwargs = _variant("gate")
        kwargs["q_gate"] = False  # a gated qkv is wider than an ungated layer's
    return args, kwargs


BAD_VARIANTS = ["mrope_section", "positions", "v_norm", "k_weight", "qkv"]


@pytest.mark.parametrize("inplace", [False, True], ids=["functional", "inplace"])
@pytest.mark.parametrize("name", BAD_VARIANTS)
def test_fake_rejects_bad_variants_as_the_real_op_does(inplace, name):
    _check_real_and_fake_reject(inplace, name, *_bad_variant(name))


def _parsed(schema: str) -> str:
    return str(torch._C.parse_schema(f"{custom_ops.NAMESPACE}::{schema}"))


def test_schema_is_spelled_once():
    from vllm_ascend_ext import ascendc

    functional, inplace = custom_ops.schemas(ascendc.OP_NAME)
    for name, schema in ((ascendc.OP_NAME, functional), (ascendc.INPLACE_OP_NAME, inplace)):
        assert str(getattr(torch.ops.vllm_ascend_ext, name).default._schema) == _parsed(schema)
    assert str(custom_ops.functional_op()._schema) == _parsed(custom_ops.FUNCTIONAL_SCHEMA)
    assert str(custom_ops.inplace_op()._schema) == _parsed(custom_ops.INPLACE_SCHEMA)
