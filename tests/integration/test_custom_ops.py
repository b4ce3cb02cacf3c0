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

from vllm_ascend_ext.kernels import custom_ops
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
    for name in (custom_ops.OP_NAME, custom_ops.INPLACE_OP_NAME, custom_ops.KV_CACHE_OP_NAME):
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


def _op(inplace: bool):
    return custom_ops.inplace_op() if inplace else custom_ops.functional_op()


@pytest.mark.parametrize("inplace", [False, True], ids=["functional", "inplace"])
@pytest.mark.parametrize("name", BAD)
def test_fake_rejects_what_the_real_op_rejects(inplace, name):
    _check_real_and_fake_reject(_op(inplace), name, *_bad(name))


def _check_real_and_fake_reject(op, name: str, args, kwargs) -> None:
    """The real op and its fake implementation both raise a ValueError naming ``name``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

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
    _check_real_and_fake_reject(_op(inplace), name, *_bad_variant(name))


def _parsed(schema: str) -> str:
    return str(torch._C.parse_schema(f"{custom_ops.NAMESPACE}::{schema}"))


def test_schema_is_spelled_once():
    from vllm_ascend_ext.kernels import ascendc

    functional, inplace = custom_ops.schemas(ascendc.OP_NAME)
    for name, schema in ((ascendc.OP_NAME, functional), (ascendc.INPLACE_OP_NAME, inplace)):
        assert str(getattr(torch.ops.vllm_ascend_ext, name).default._schema) == _parsed(schema)
    assert str(custom_ops.functional_op()._schema) == _parsed(custom_ops.FUNCTIONAL_SCHEMA)
    assert str(custom_ops.inplace_op()._schema) == _parsed(custom_ops.INPLACE_SCHEMA)
    assert str(custom_ops.kv_cache_op()._schema) == _parsed(custom_ops.KV_CACHE_SCHEMA)


# --------------------------------------------------------------------------------------------
# split_qkv_rmsnorm_rope_kv_cache (issue 11): the prologue writing the paged KV cache.

#: name: (geometry, cache_layout, cache dtype, per-channel scales, return_kv). Tiny layers,
#: block_size 4 so T = 9 tokens cross blocks; int8 NZ needs D a multiple of 32.
KV_CASES = {
    "nhd": (AttentionGeometry(HQ, HKV, D, R), "nhd", torch.bfloat16, False, False),
    "hnd return_kv": (AttentionGeometry(HQ, HKV, D, R, is_neox=False), "hnd", torch.bfloat16, False, True),
    "nz int8 per-channel": (AttentionGeometry(HQ, HKV, D, R), "nz", torch.int8, True, False),
    "nhd fp8 all return_kv": (VARIANTS["all"], "nhd", torch.float8_e4m3fn, False, True),
    "cpu_vec": (AttentionGeometry(HQ, HKV, D, R), "cpu_vec", torch.bfloat16, False, False),
    "cpu_vec fp32 vnorm return_kv": (VARIANTS["vnorm"], "cpu_vec", torch.float32, False, True),
}
KV_POSITIONAL = POSITIONAL[:5] + ("key_cache", "value_cache", "slot_mapping") + POSITIONAL[5:]


def _kv_case(name: str, tokens: int = T, seed: int = 0) -> tuple[list, dict]:
    """Fresh inputs of KV case ``name`` as the custom op takes them (a ``cpu_vec`` cache as
    ``key_cache`` alone, ``value_cache=None``): positional, then keywords."""
    geometry, layout, dtype, per_channel, return_kv = KV_CASES[name]
    gen = torch.Generator().manual_seed(seed)
    kwargs = reference.make_inputs(geometry, tokens, dtype=torch.float32 if dtype == torch.float32 else
                                   torch.bfloat16, bias=True, generator=gen)
    kwargs.update(reference.make_kv_cache(geometry, tokens, cache_layout=layout, dtype=dtype, block_size=4,
                                          per_channel=per_channel, generator=gen), return_kv=return_kv)
    if layout in custom_ops.ONE_TENSOR_LAYOUTS:
        kwargs["key_cache"], kwargs["value_cache"] = kwargs["key_cache"].clone(), None
    return [kwargs.pop(key) for key in KV_POSITIONAL], kwargs


def _caches(args: list) -> list:
    """The cache tensors a call writes (one for a one-tensor layout)."""
    return [t for t in args[5:7] if t is not None]


def _kv_expected(args: list, kwargs: dict) -> tuple[tuple, list]:
    """What the Python op returns and writes into copies of the caches."""
    from vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_kv_cache import split_qkv_rmsnorm_rope_kv_cache

    call = list(args)
    call[5] = args[5].clone()
    call[6] = call[5] if args[6] is None else args[6].clone()  # the ops-level API: one tensor twice
    return split_qkv_rmsnorm_rope_kv_cache(*call, **kwargs), [call[5]] if args[6] is None else call[5:7]


def _kv_shapes(name: str, tokens) -> list[tuple]:
    """The KV-cache op's ``(q, k, v, gate)`` shapes for case ``name``."""
    geometry, *_, return_kv = KV_CASES[name]
    q_cols, kv_cols = geometry.num_q_heads * geometry.head_dim, geometry.num_kv_heads * geometry.head_dim
    return [(tokens, q_cols), (tokens, kv_cols if return_kv else 0),
            (tokens, kv_cols if return_kv and geometry.v_norm else 0), (tokens, q_cols if geometry.q_gate else 0)]


def _check_kv_call(name: str, args: list, kwargs: dict, outputs, want, want_caches, before_caches) -> None:
    """Outputs (shapes, and bit for bit what the Python op returns) and caches (bit for bit the
    Python op's, and written)."""
    geometry, *_, return_kv = KV_CASES[name]
    assert [tuple(o.shape) for o in outputs] == _kv_shapes(name, args[0].shape[0])
    assert torch.equal(outputs[0], want[0])
    if return_kv:
        assert torch.equal(outputs[1], want[1])
    if return_kv and geometry.v_norm:
        assert torch.equal(outputs[2], want[2])
    if geometry.q_gate:
        assert torch.equal(outputs[3], want[3])
    for got, expected, before in zip(_caches(args), want_caches, before_caches, strict=True):
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))
        assert not torch.equal(got.view(torch.uint8), before.view(torch.uint8))


def test_kv_cache_schema_declares_the_cache_writes():
    schema = custom_ops.kv_cache_op()._schema
    mutated = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert mutated == ["key_cache", "value_cache"]
    sets = [a.alias_info.before_set for a in schema.arguments if a.alias_info is not None]
    assert len(set(map(frozenset, sets))) == 2  # two alias sets: the caches are never one tensor twice


@pytest.mark.parametrize("name", KV_CASES)
def test_opcheck_kv_cache(name):
    args, kwargs = _kv_case(name)
    utils = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    if args[5].dtype == torch.float8_e4m3fn:  # SchemaCheckMode compares with allclose: no fp8 on CPU
        utils = utils[1:]
    opcheck(custom_ops.kv_cache_op(), tuple(args), kwargs, test_utils=utils)


@pytest.mark.parametrize("name", KV_CASES)
def test_kv_cache_op_equals_the_python_op(name):
    """q (k, v, gate where returned) and the caches are the Python op's, bit for bit; qkv is left
    alone."""
    args, kwargs = _kv_case(name)
    before_qkv, before_caches = args[0].clone(), [c.clone() for c in _caches(args)]
    want, want_caches = _kv_expected(args, kwargs)
    outputs = custom_ops.kv_cache_op()(*args, **kwargs)
    _check_kv_call(name, args, kwargs, outputs, want, want_caches, before_caches)
    assert torch.equal(args[0], before_qkv)


def _bad_kv(name: str) -> tuple[list, dict]:
    """KV-cache op arguments the real op rejects, each naming ``name``."""
    case = {"k_scale": "nz int8 per-channel", "value_cache": "cpu_vec"}.get(name, "nhd")
    args, kwargs = _kv_case(case)
    if name == "slot_mapping":
        args[7] = args[7].float()
    elif name == "key_cache":
        args[5] = args[5][..., :D // 2]
    elif name == "k_scale":
        kwargs["k_scale"] = None
    elif name == "cache_layout":
        kwargs["cache_layout"] = "nd"
    elif name == "value_cache":  # cpu_vec's one tensor passed twice
        args[6] = args[5]
    elif name == "value_cache=None":  # a layout of two caches without its value cache
        args[6] = None
    else:
        assert name == "num_kv_heads"
        args[0], args[9] = args[0][:, :HQ * D], 0  # a q-only layer has nothing to cache
    return args, kwargs


BAD_KV = ["slot_mapping", "key_cache", "k_scale", "cache_layout", "value_cache", "value_cache=None", "num_kv_heads"]


@pytest.mark.parametrize("name", BAD_KV)
def test_kv_cache_fake_rejects_what_the_real_op_rejects(name):
    args, kwargs = _bad_kv(name)
    before = [c.clone() for c in _caches(args)]
    _check_real_and_fake_reject(custom_ops.kv_cache_op(), name.split("=")[0], args, kwargs)
    assert all(torch.equal(c, b) for c, b in zip(_caches(args), before, strict=True))


@pytest.mark.parametrize("name", ["nhd", "cpu_vec"])
def test_kv_cache_compile_serves_every_token_count_with_one_graph(name):
    """Compiled with dynamic shapes and functionalized (aot_eager), one graph serves 9, 5 and 3
    tokens (no recompile per batch size) and writes the caches the eager op writes."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lambda *a, **k: custom_ops.kv_cache_op()(*a, **k), backend=counter,
                             fullgraph=True, dynamic=True)
    frames = None
    for tokens in (9, 5, 3):
        args, kwargs = _kv_case(name, tokens=tokens, seed=tokens)
        before_caches = [c.clone() for c in _caches(args)]
        want, want_caches = _kv_expected(args, kwargs)
        with torch._dynamo.config.patch(error_on_recompile=frames is not None):
            _check_kv_call(name, args, kwargs, compiled(*args, **kwargs), want, want_caches, before_caches)
        frames = frames or counter.frame_count  # the first trace may restart once (float scalars)
        assert counter.frame_count == frames


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_custom_ops_never_sync_the_host(device):
    """On a GPU, after the first call of a key, the functional, in-place and KV-cache ops through
    ``torch.ops`` give the first call's results and never sync the host (CUDA's sync debug mode
    raises on a sync): async scheduling relies on it."""
    if device.type != "cuda":
        pytest.skip("the kernels run through the interpreter here")
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in _args()]
    kv_args, kv_kwargs = _kv_case("nhd")
    kv_args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in kv_args]
    kv_kwargs = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kv_kwargs.items()}

    def calls():
        qkv = args[0].clone()
        custom_ops.inplace_op()(qkv, *args[1:])
        return [*custom_ops.functional_op()(*args), qkv, *custom_ops.kv_cache_op()(*kv_args, **kv_kwargs),
                kv_args[5].clone()]

    first = calls()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = calls()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)
