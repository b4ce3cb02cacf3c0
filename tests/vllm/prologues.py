"""Attention prologues written the way vLLM 0.32's models write them, for graph-level tests.

``Prologue`` mirrors ``Qwen3Attention.forward`` up to the attention call (split -> per-head
``RMSNorm`` -> ``rotary_emb``) and ``LlamaAttention.forward`` when ``qk_norm`` is False, with
vLLM's native RMSNorm and RoPE spelled as vLLM spells them (:mod:`vllm_ascend_ext.fusion`'s
``native_rms_norm`` / ``native_rope`` copy that code). With ``is_neox=False`` and no q/k norm it
is ``Glm4Attention.forward`` (GPT-J pairs, partial rotary). With ``weight_offset=1.0`` the q/k
norm is ``GemmaRMSNorm``'s native math (:func:`gemma_rms_norm`, written out here, not taken from
the pass), and ``view_style`` picks how the model splits heads around it: Qwen3's
``view(*shape[:-1], H, D)`` / ``view(shape)``, Gemma-3's ``unflatten`` / ``flatten`` or
Qwen3-Next's ``view(-1, H, D)`` / ``view(-1, H * D)``. ``AscendPrologue`` is vllm-ascend's form
with the stand-in ops. No vLLM import.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext.fusion import native_rms_norm, native_rope
from vllm_ascend_ext.ops.models import AttentionGeometry

import ascend_standins

MAX_POSITION = 64
VIEW_STYLES = ("qwen3", "gemma3", "qwen3_next")


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """vLLM 0.32 ``GemmaRMSNorm.forward_native``: ``1 + w`` in fp32, fp32 statistics and product,
    one cast to x's dtype at the end."""
    weight = weight.float() + 1.0
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x.to(weight.dtype) * weight).to(orig_dtype)


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


class Prologue(torch.nn.Module):
    """split -> (q/k RMSNorm) -> RoPE -> a consumer of q, k, v (stands for the attention op)."""

    def __init__(self, geo: AttentionGeometry, dtype: torch.dtype, view_style: str = "qwen3"):
        super().__init__()
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

    def prologue(self, qkv: torch.Tensor, positions: torch.Tensor):
        g = self.geo
        d = g.head_dim
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if g.qk_norm:
            norm = gemma_rms_norm if g.weight_offset == 1.0 else native_rms_norm
            style = self.view_style
            q = _unheads(norm(_heads(q, g.num_q_heads, d, style), self.q_weight, self.eps), q, style)
            k = _unheads(norm(_heads(k, g.num_kv_heads, d, style), self.k_weight, self.eps), k, style)
        tokens = positions.flatten().shape[0]
        q3, k3 = native_rope(positions, q.view(tokens, -1, d), k.view(tokens, -1, d),
                             self.cos_sin_cache, d, g.rotary_dim, g.is_neox)
        return q3.reshape(q.shape), k3.reshape(k.shape), v

    def forward(self, qkv, positions):
        q, k, v = self.prologue(qkv, positions)
        g = self.geo
        # The attention op views q/k/v per head; a cheap consumer keeps all three alive.
        return (q.view(-1, g.num_q_heads, g.head_dim) * 2,
                k.view(-1, g.num_kv_heads, g.head_dim) * 3,
                v.view(-1, g.num_kv_heads, g.head_dim) + 1)


class TwoLayers(torch.nn.Module):
    """Two prologues of (possibly) different geometries fed from one input projection."""

    def __init__(self, first: AttentionGeometry, second: AttentionGeometry, dtype: torch.dtype):
        super().__init__()
        self.a, self.b = Prologue(first, dtype), Prologue(second, dtype)

    def forward(self, qkv_a, qkv_b, positions):
        return (*self.a(qkv_a, positions), *self.b(qkv_b, positions))


class AscendPrologue(Prologue):
    """vllm-ascend's form: ``npu_rms_norm`` + ``npu_rotary_embedding`` (stand-in ops)."""

    def prologue(self, qkv, positions):
        g = self.geo
        d = g.head_dim
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if g.qk_norm:
            q_by_head = q.view(*q.shape[:-1], q.shape[-1] // d, d)
            q_by_head, _ = ascend_standins.npu_rms_norm(q_by_head, self.q_weight, self.eps)
            q = q_by_head.view(q.shape)
            k_by_head = k.view(*k.shape[:-1], k.shape[-1] // d, d)
            k_by_head, _ = ascend_standins.npu_rms_norm(k_by_head, self.k_weight, self.eps)
            k = k_by_head.view(k.shape)
        q, k = ascend_standins.npu_rotary_embedding(positions, q, k, self.cos_sin_cache, d,
                                                    g.rotary_dim, g.is_neox)
        return q, k, v
