"""vllm-ascend's opt-in cache update (``vllm_ascend_ext.hook.ascend_kv_update``), with stand-ins.

vllm-ascend cannot be imported here (torch_npu / CANN), so its pieces are stand-ins of the same
class, method and argument names, written from ``vllm_ascend/attention/attention_v1.py`` and
``vllm_ascend/ascend_forward_context.py`` (vllm-ascend ``182b75ea84ff``): ``AscendAttentionBackend``
(ND ``get_kv_cache_shape``), a 310P backend (NZ shape), ``AscendAttentionBackendImpl`` whose
``forward`` calls ``reshape_and_cache(query, key, value, kv_cache, attn_metadata, output)`` (writes
``key[:num_actual_tokens]`` at ``slot_mapping[:num_actual_tokens]``, nothing for a KV-sharing layer)
and whose ``do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)`` writes at every slot
``>= 0``; a C8 subclass overriding ``forward``; ``set_ascend_forward_context`` calling the module's
``set_forward_context`` with keyword arguments and no slot mapping, as vllm-ascend's does. The ND
write stands in for ``npu_scatter_pa_kv_cache`` (not checked against torch_npu).

Checked: setting off -> nothing changes; on -> the backend's flag is off, the in-forward write is
skipped for decoder layers that own their cache and kept (original method) for KV-sharing,
non-decoder and overriding (C8) impls, ``do_kv_cache_update`` still writes; the forward context
gets each layer's slot mapping, padded with -1 to ``num_tokens`` in a buffer whose address does not
change between steps; refused engines keep everything with the reason logged; idempotent, one INFO
line; the seam finds the modules in ``sys.modules``; the per-layer layout (ND -> nhd, 310P fp16 NZ
-> nz, C8 and the rest refused), also through ``hook.steps.kv_cache_layout``; and at graph
level, the pass folds a stand-in ``unified_kv_cache_update`` that calls the stand-in impl's
``do_kv_cache_update`` into the glue op with ``cache_layout="nhd"``: outputs and both ND caches
equal the eager module's.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from vllm_ascend_ext.hook import ascend_kv_update
from vllm_ascend_ext.passes import kv_fusion
from vllm_ascend_ext.hook.ascend_kv_update import AscendAttention
from vllm_ascend_ext.ops import settings

ATTN = ascend_kv_update.ATTENTION_MODULE
FWD = ascend_kv_update.FORWARD_CONTEXT_MODULE
NB, BS, HKV, D = 4, 16, 2, 32
SENTINEL = 7.0


def _nd_scatter(key, value, key_cache, value_cache, slots):
    """The ND write (``npu_scatter_pa_kv_cache`` with ``cache_mode="Norm"``): slot s -> block s // BS,
    offset s % BS; negative slots skipped."""
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            key_cache[slot // key_cache.shape[1], slot % key_cache.shape[1]] = key[t]
            value_cache[slot // value_cache.shape[1], slot % value_cache.shape[1]] = value[t]


def _standins():
    """Fresh stand-in modules (the switch patches their classes)."""
    attention = types.ModuleType(ATTN)

    class AscendAttentionBackend:
        accept_output_buffer = True
        forward_includes_kv_cache_update = True

        @staticmethod
        def get_name():
            return "CUSTOM"

        @staticmethod
        def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str=""):
            return (2, num_blocks, block_size, num_kv_heads, head_size)

    class AscendAttentionBackend310(AscendAttentionBackend):
        @staticmethod
        def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str=""):
            return (2, num_blocks, (num_kv_heads * head_size) // 16, block_size, 16)

    class AscendAttentionBackendImpl:
        def __init__(self, num_heads=4, head_size=D, scale=1.0, num_kv_heads=HKV, alibi_slopes=None,
                     sliding_window=None, kv_cache_dtype="auto", logits_soft_cap=None, attn_type="decoder",
                     kv_sharing_target_layer_name=None, **kwargs):
            self.attn_type = attn_type
            self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
            self.key_cache = self.value_cache = None
            self.in_forward_writes = 0

        def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
            if self.attn_type == "encoder_only":
                return
            if self.key_cache is None:
                self.key_cache, self.value_cache = kv_cache[0], kv_cache[1]
            _nd_scatter(key, value, self.key_cache, self.value_cache, slot_mapping)

        def reshape_and_cache(self, query, key, value, kv_cache, attn_metadata, output):
            if len(kv_cache) > 1:
                if self.key_cache is None:
                    self.key_cache, self.value_cache = kv_cache[0], kv_cache[1]
                if self.kv_sharing_target_layer_name is not None:
                    return query, key, value, output
                n = attn_metadata.num_actual_tokens
                _nd_scatter(key[:n], value[:n], self.key_cache, self.value_cache, attn_metadata.slot_mapping[:n])
                self.in_forward_writes += 1
            return query, key, value, output

        def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None, output_scale=None,
                    output_block_scale=None):
            if self.key_cache is None and kv_cache is not None:
                self.key_cache, self.value_cache = kv_cache[0], kv_cache[1]
            if key is not None and value is not None:
                query, key, value, output = self.reshape_and_cache(query, key, value, kv_cache, attn_metadata,
                                                                   output)
            return output

    class AscendC8AttentionBackendImpl(AscendAttentionBackendImpl):
        def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None, output_scale=None,
                    output_block_scale=None):
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output)

    for cls in (AscendAttentionBackend, AscendAttentionBackend310, AscendAttentionBackendImpl,
                AscendC8AttentionBackendImpl):
        cls.__module__ = ATTN
        setattr(attention, cls.__name__, cls)

    forward_context = types.ModuleType(FWD)
    forward_context.contexts = []

    @contextlib.contextmanager
    def set_forward_context(attn_metadata, vllm_config, num_tokens=None, num_tokens_across_dp=None,
                            cudagraph_runtime_mode=None, batch_descriptor=None, ubatch_slices=None,
                            slot_mapping=None, skip_compiled=False, is_padding=None):
        forward_context.contexts.append(SimpleNamespace(attn_metadata=attn_metadata, slot_mapping=slot_mapping or {}))
        yield

    @contextlib.contextmanager
    def set_ascend_forward_context(attn_metadata, vllm_config, num_tokens=0, **kwargs):
        # vllm-ascend's: keyword arguments, no slot mapping (module global looked up at call time).
        with forward_context.set_forward_context(attn_metadata=attn_metadata, vllm_config=vllm_config,
                                                 num_tokens=num_tokens):
            yield

    forward_context.set_forward_context = set_forward_context
    forward_context.set_ascend_forward_context = set_ascend_forward_context
    return attention, forward_context


def _config(**over):
    config = SimpleNamespace(
        model_config=SimpleNamespace(use_mla=False, is_encoder_decoder=False, dtype=torch.bfloat16),
        kv_transfer_config=None, quant_config=None, cache_config=SimpleNamespace(cache_dtype="auto", block_size=BS),
        parallel_config=SimpleNamespace(prefill_context_parallel_size=1, decode_context_parallel_size=1),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=32))
    for path, value in over.items():
        obj = config
        *parents, leaf = path.split(".")
        for name in parents:
            obj = getattr(obj, name)
        setattr(obj, leaf, value)
    return config


@pytest.fixture
def modules(monkeypatch):
    ascend_kv_update._logged.clear()
    attention, forward_context = _standins()
    yield attention, forward_context, AscendAttention(attention.AscendAttentionBackend,
                                                      attention.AscendAttentionBackendImpl, forward_context)
    ascend_kv_update._logged.clear()


@pytest.fixture
def on(monkeypatch):
    monkeypatch.setenv(settings.ASCEND_KV_UPDATE, "1")


def _caches():
    return torch.full((2, NB, BS, HKV, D), SENTINEL)


def _step(tokens=9, actual=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    key, value = torch.randn(tokens, HKV, D, generator=g), torch.randn(tokens, HKV, D, generator=g)
    slots = torch.randperm(NB * BS, generator=g)[:actual]
    slots[2] = -1
    return key, value, SimpleNamespace(num_actual_tokens=actual, slot_mapping=slots)


def _messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "vllm_ascend_ext"]


# ---- the switch --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "0", "off"])
def test_setting_off_changes_nothing(modules, monkeypatch, caplog, value):
    attention, forward_context, mods = modules
    if value is None:
        monkeypatch.delenv(settings.ASCEND_KV_UPDATE, raising=False)
    else:
        monkeypatch.setenv(settings.ASCEND_KV_UPDATE, value)
    before = (attention.AscendAttentionBackendImpl.reshape_and_cache, forward_context.set_forward_context)
    with caplog.at_level(logging.INFO, logger="vllm_ascend_ext"):
        assert ascend_kv_update.switch(_config(), mods) is False
    assert attention.AscendAttentionBackend.forward_includes_kv_cache_update is True
    assert (attention.AscendAttentionBackendImpl.reshape_and_cache, forward_context.set_forward_context) == before
    assert _messages(caplog) == []
    impl, caches = attention.AscendAttentionBackendImpl(), _caches()
    key, value, md = _step()
    impl.forward(None, key, key, value, caches, md, key)
    assert impl.in_forward_writes == 1 and (caches != SENTINEL).any()


def test_bad_value_raises(modules, monkeypatch):
    monkeypatch.setenv(settings.ASCEND_KV_UPDATE, "maybe")
    with pytest.raises(settings.SettingError, match=settings.ASCEND_KV_UPDATE):
        ascend_kv_update.switch(_config(), modules[2])


def test_on_moves_the_write_to_do_kv_cache_update(modules, on, caplog):
    attention, _, mods = modules
    with caplog.at_level(logging.INFO, logger="vllm_ascend_ext"):
        assert ascend_kv_update.switch(_config(), mods) is True
    assert attention.AscendAttentionBackend.forward_includes_kv_cache_update is False
    assert attention.AscendAttentionBackend310.forward_includes_kv_cache_update is False  # inherited
    lines = _messages(caplog)
    assert len(lines) == 1 and "forward_includes_kv_cache_update = False" in lines[0]
    assert settings.ASCEND_KV_UPDATE in lines[0]

    impl, caches = attention.AscendAttentionBackendImpl(), _caches()
    key, value, md = _step()
    query, out = torch.randn(9, 4, D), torch.empty(9, 4, D)
    returned = impl.reshape_and_cache(query, key, value, caches, md, out)
    assert returned[0] is query and returned[1] is key and returned[2] is value and returned[3] is out
    impl.forward(None, query, key, value, caches, md, out)
    assert impl.in_forward_writes == 0 and (caches == SENTINEL).all()  # nothing written in forward
    assert impl.key_cache is not None  # forward still binds the caches
    # What vLLM's unified_kv_cache_update then calls: the backend's own do_kv_cache_update, with the
    # step's slot mapping padded with -1 to the key's rows.
    padded = torch.cat((md.slot_mapping, md.slot_mapping.new_full((2,), -1)))
    impl.do_kv_cache_update(None, key, value, caches, padded)
    want = _caches()
    _nd_scatter(key[:7], value[:7], want[0], want[1], md.slot_mapping)
    assert torch.equal(caches, want) and (caches != SENTINEL).any()


def test_idempotent(modules, on, caplog):
    attention, forward_context, mods = modules
    with caplog.at_level(logging.INFO, logger="vllm_ascend_ext"):
        assert ascend_kv_update.switch(_config(), mods)
        patched = (attention.AscendAttentionBackendImpl.reshape_and_cache, forward_context.set_forward_context)
        assert ascend_kv_update.switch(_config(), mods)
    assert (attention.AscendAttentionBackendImpl.reshape_and_cache, forward_context.set_forward_context) == patched
    assert len(_messages(caplog)) == 1


@pytest.mark.parametrize("kind", ["kv-sharing", "encoder", "c8-forward"])
def test_layers_that_keep_their_in_forward_write(modules, on, caplog, kind):
    attention, _, mods = modules
    ascend_kv_update.switch(_config(), mods)
    if kind == "kv-sharing":
        impl = attention.AscendAttentionBackendImpl(kv_sharing_target_layer_name="model.layers.0.self_attn.attn")
    elif kind == "encoder":
        impl = attention.AscendAttentionBackendImpl(attn_type="encoder")
    else:
        impl = attention.AscendC8AttentionBackendImpl()
    caches = _caches()
    key, value, md = _step()
    with caplog.at_level(logging.INFO, logger="vllm_ascend_ext"):
        impl.forward(None, key, key, value, caches, md, key)
        impl.forward(None, key, key, value, caches, md, key)
    expected = {"kv-sharing": "KV-sharing", "encoder": "'encoder'", "c8-forward": "overrides forward"}[kind]
    kept = [m for m in _messages(caplog) if "keeps its in-forward KV-cache write" in m]
    assert len(kept) == 1 and expected in kept[0]  # once, with the reason
    if kind == "kv-sharing":
        assert impl.in_forward_writes == 0 and (caches == SENTINEL).all()  # the original: no write
    else:
        assert impl.in_forward_writes == 2 and (caches != SENTINEL).any()


@pytest.mark.parametrize("over,reason", [
    ({"model_config.use_mla": True}, "MLA"),
    ({"model_config.is_encoder_decoder": True}, "encoder-decoder"),
    ({"kv_transfer_config": SimpleNamespace(is_kv_producer=True)}, "KV transfer"),
    ({"quant_config": SimpleNamespace(enable_c8_quant=True)}, "C8"),
    ({"cache_config.cache_dtype": "int8"}, "'int8'"),
    ({"parallel_config.prefill_context_parallel_size": 2}, "prefill_context_parallel_size"),
    ({"parallel_config.decode_context_parallel_size": 2}, "decode_context_parallel_size"),
], ids=["mla", "encoder-decoder", "kv-transfer", "c8", "int8-cache", "pcp", "dcp"])
def test_refused_engines_keep_everything(modules, on, caplog, over, reason):
    attention, forward_context, mods = modules
    before = (attention.AscendAttentionBackendImpl.reshape_and_cache, forward_context.set_forward_context)
    with caplog.at_level(logging.INFO, logger="vllm_ascend_ext"):
        assert ascend_kv_update.switch(_config(**over), mods) is False
    assert attention.AscendAttentionBackend.forward_includes_kv_cache_update is True
    assert (attention.AscendAttentionBackendImpl.reshape_and_cache, forward_context.set_forward_context) == before
    lines = _messages(caplog)
    assert len(lines) == 1 and "keeps its KV-cache write inside attention" in lines[0] and reason in lines[0]


def test_seam_finds_the_modules_and_logs_when_absent(modules, on, monkeypatch, caplog):
    attention, forward_context, _ = modules
    monkeypatch.setitem(sys.modules, ATTN, None)  # an import of it raises
    with caplog.at_level(logging.INFO, logger="vllm_ascend_ext"):
        assert ascend_kv_update.ascend_attention() is None
        assert ascend_kv_update.switch(_config()) is False
    assert "cannot be imported" in _messages(caplog)[0]
    monkeypatch.setitem(sys.modules, ATTN, attention)
    monkeypatch.setitem(sys.modules, FWD, forward_context)
    found = ascend_kv_update.ascend_attention()
    assert found.backend is attention.AscendAttentionBackend and found.impl is attention.AscendAttentionBackendImpl
    assert found.forward_context is forward_context
    assert ascend_kv_update.switch(_config()) is True  # through the seam
    assert attention.AscendAttentionBackend.forward_includes_kv_cache_update is False


def test_forward_context_gets_padded_slot_mappings_at_a_stable_address(modules, on):
    _, forward_context, mods = modules
    ascend_kv_update.switch(_config(), mods)
    _, _, md = _step(actual=7)
    other = SimpleNamespace(num_actual_tokens=5, slot_mapping=torch.arange(5, dtype=torch.int32))
    metadata = {"a": md, "b": md, "c": other, "no_slots": SimpleNamespace()}
    with forward_context.set_ascend_forward_context(metadata, _config(), num_tokens=9):
        pass
    first = forward_context.contexts[-1].slot_mapping
    assert set(first) == {"a", "b", "c"} and first["a"] is first["b"]
    assert first["a"].shape == (9,) and torch.equal(first["a"][:7], md.slot_mapping)
    assert (first["a"][7:] == -1).all()
    assert first["c"].dtype == torch.int32 and torch.equal(first["c"], torch.tensor([0, 1, 2, 3, 4, -1, -1, -1, -1],
                                                                                    dtype=torch.int32))
    # The next step, fewer tokens: same buffer (a captured graph reads the same address), stale
    # entries overwritten with -1.
    md.slot_mapping[:3] = torch.tensor([5, 6, 7])
    md2 = SimpleNamespace(num_actual_tokens=3, slot_mapping=md.slot_mapping[:3])
    with forward_context.set_ascend_forward_context({"a": md2}, _config(), num_tokens=9):
        pass
    second = forward_context.contexts[-1].slot_mapping["a"]
    assert second.data_ptr() == first["a"].data_ptr()
    assert second.tolist() == [5, 6, 7] + [-1] * 6
    # A caller that passes its own slot mapping keeps it.
    own = {"a": torch.zeros(9, dtype=torch.int64)}
    with forward_context.set_forward_context(attn_metadata=metadata, vllm_config=_config(), num_tokens=9,
                                             slot_mapping=own):
        pass
    assert forward_context.contexts[-1].slot_mapping is own


# ---- the per-layer layout ----------------------------------------------------------------------


def _layer(attention, backend="AscendAttentionBackend", impl="AscendAttentionBackendImpl", kv_cache_dtype="auto"):
    return SimpleNamespace(attn_backend=getattr(attention, backend), impl=getattr(attention, impl)(),
                           kv_cache_dtype=kv_cache_dtype, head_size=D)


def test_layout_per_layer(modules, on):
    attention, _, mods = modules
    nd = _layer(attention)
    assert ascend_kv_update.layer_layout(nd, torch.bfloat16)[0] is None  # not switched: no update in the graph
    assert "inside attention" in ascend_kv_update.layer_layout(nd, torch.bfloat16)[1]
    ascend_kv_update.switch(_config(), mods)
    assert ascend_kv_update.layer_layout(nd, torch.bfloat16) == ("nhd", "")
    assert ascend_kv_update.layer_layout(nd, torch.float16) == ("nhd", "")
    nz = _layer(attention, backend="AscendAttentionBackend310")
    assert ascend_kv_update.layer_layout(nz, torch.float16) == ("nz", "")
    refused = {
        "fp32": ascend_kv_update.layer_layout(nd, torch.float32),
        "nz-bf16": ascend_kv_update.layer_layout(nz, torch.bfloat16),
        "c8": ascend_kv_update.layer_layout(_layer(attention, impl="AscendC8AttentionBackendImpl"), torch.bfloat16),
        "int8": ascend_kv_update.layer_layout(_layer(attention, kv_cache_dtype="int8"), torch.bfloat16),
    }
    assert all(layout is None and reason for layout, reason in refused.values())
    assert "C8" in refused["c8"][1] and "'int8'" in refused["int8"][1] and "NZ" in refused["nz-bf16"][1]
    assert ascend_kv_update.is_ascend_backend(attention.AscendAttentionBackend)
    assert not ascend_kv_update.is_ascend_backend(SimpleNamespace)


def test_kv_cache_layout_routes_ascend_layers(modules, on):
    from vllm_ascend_ext.hook.vllm_integration import kv_cache_layout

    attention, _, mods = modules
    ascend_kv_update.switch(_config(), mods)
    layers = {"nd": _layer(attention), "nz": _layer(attention, backend="AscendAttentionBackend310"),
              "c8": _layer(attention, impl="AscendC8AttentionBackendImpl")}
    config = SimpleNamespace(compilation_config=SimpleNamespace(static_forward_context=layers),
                             model_config=SimpleNamespace(dtype=torch.float16),
                             cache_config=SimpleNamespace(block_size=BS))
    layout = kv_cache_layout(config)
    assert layout("nd") == ("nhd", "") and layout("nz") == ("nz", "")
    assert layout("c8")[0] is None and "C8" in layout("c8")[1]


def test_glue_op_resolves_ascend_caches():
    k_cache, v_cache = torch.zeros(NB, BS, HKV, D), torch.ones(NB, BS, HKV, D)
    for layout in ("nhd", "nz"):
        got = kv_fusion.layer_caches((k_cache, v_cache), layout)
        assert got[0] is k_cache and got[1] is v_cache
    stacked = torch.zeros(2, NB, BS, HKV, D)
    got = kv_fusion.layer_caches(stacked, "nhd")
    assert got[0].data_ptr() == stacked.data_ptr() and got[1].data_ptr() == stacked[1].data_ptr()


# ---- graph level: the pass folds the update into the glue op with cache_layout "nhd" ------------


def test_pass_fuses_the_ascend_update_with_nhd(modules, on, monkeypatch):
    import test_kv_fusion as kvt  # the stand-in layer-name type and the prologue module

    from vllm_ascend_ext.passes.fusion import QKNormRoPEFusionPass
    from vllm_ascend_ext.passes.kv_fusion import KVCacheFusion

    attention, _, mods = modules
    ascend_kv_update.switch(_config(), mods)
    geo, tokens, layer_name = kvt.QWEN, 13, "model.layers.0.self_attn.attn"
    context: dict = {}

    def update(key, value, name):  # vLLM's unified_kv_cache_update: the layer's do_kv_cache_update
        layer, kv_cache, slots = context[name.value]
        if slots is not None:
            layer.impl.do_kv_cache_update(layer, key, value, kv_cache, slots)
        return key.new_empty(0)

    def attend(query, name, kv_cache_dummy_dep=None):  # reads the ND caches back at the step's slots
        _, (k_cache, v_cache), slots = context[name.value]
        rows = [torch.cat((k_cache[max(s, 0) // BS, max(s, 0) % BS].flatten(),
                           v_cache[max(s, 0) // BS, max(s, 0) % BS].flatten())) for s in slots.tolist()]
        return torch.cat((query.flatten(1), torch.stack(rows)), dim=1)

    lib = kvt.define_standin_ops("ascend_kv_standin", update, attend, 2 * HKV * D)  # noqa: F841 (kept alive)
    update_op = torch.ops.ascend_kv_standin.unified_kv_cache_update.default

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.prologue = kvt.Prologue(geo, torch.float32)

        def forward(self, qkv, positions):
            q, k, v, _ = self.prologue.prologue(qkv, positions)
            name = kvt.StandinLayerName(layer_name)
            k = k.view(-1, HKV, D)
            dummy = torch.ops.ascend_kv_standin.unified_kv_cache_update(k, v.view(-1, HKV, D), name)
            return torch.ops.ascend_kv_standin.attention(q.view(-1, geo.num_q_heads, D), name,
                                                         kv_cache_dummy_dep=dummy)

    def fresh(slots):
        caches = _caches()
        layer = SimpleNamespace(impl=attention.AscendAttentionBackendImpl(),
                                attn_backend=attention.AscendAttentionBackend)
        context[layer_name] = (layer, (caches[0], caches[1]), slots)
        return caches

    torch.manual_seed(0)
    torch._dynamo.reset()
    monkeypatch.setattr(kv_fusion, "attention_context", lambda name: context[name])
    module, qkv = Layer(), torch.randn(tokens, geo.qkv_width)
    positions = kvt.make_positions(geo, tokens)
    slots = torch.randperm(NB * BS)[:tokens]
    slots[3] = -1
    layouts = []

    def layout(name):
        layouts.append(name)
        return "nhd", ""

    step = KVCacheFusion(layout=layout, update_ops=(update_op,))
    pass_ = QKNormRoPEFusionPass([geo], dtypes=(torch.float32,), kv_cache=step)
    seen = []

    def spy(graph):
        pass_(graph)
        seen.extend((n.target, dict(n.kwargs)) for n in graph.nodes if n.op == "call_function")

    with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=True):
        want_caches = fresh(slots)
        want = module(qkv, positions)
        got_caches = fresh(slots)
        got = torch.compile(module, backend="inductor", dynamic=False,
                            options={"post_grad_custom_post_pass": spy})(qkv, positions)
    torch._dynamo.reset()
    glue = kv_fusion.glue_op(kvt.NAME_TYPE)
    assert update_op not in [t for t, _ in seen]
    assert [kw["cache_layout"] for t, kw in seen if t is glue] == ["nhd"]
    assert layouts == [layer_name] and pass_.last_kv.fused == 1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_caches, want_caches, rtol=1e-5, atol=1e-5)
    assert (got_caches == SENTINEL).sum() == (want_caches == SENTINEL).sum() > 0  # padding slot, other slots
