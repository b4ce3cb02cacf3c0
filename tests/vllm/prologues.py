"""Attention prologues written the way vLLM 0.32's models write them, for graph-level tests.

``Prologue`` mirrors ``Qwen3Attention.forward`` up to the attention call (split -> per-head
``RMSNorm`` -> ``rotary_emb``) and ``LlamaAttention.forward`` when ``qk_norm`` is False, with
vLLM's native RMSNorm and RoPE spelled as vLLM spells them (:mod:`vllm_ascend_ext.fusion`'s
``native_rms_norm`` / ``native_rope`` copy that code). ``AscendPrologue`` is vllm-ascend's form
with the stand-in ops. No vLLM import.
"""

from __future__ import annotations

import torch

from vllm_ascend_ext import ascend_standins
from vllm_ascend_ext.fusion import native_rms_norm, native_rope
from vllm_ascend_ext.ops.models import AttentionGeometry

MAX_POSITION = 64


class Prologue(torch.nn.Module):
    """split -> (q/k RMSNorm) -> RoPE -> a consumer of q, k, v (stands for the attention op)."""

    def __init__(self, geo: AttentionGeometry, dtype: torch.dtype):
        super().__init__()
        self.geo = geo
        self.q_size = geo.num_q_heads * geo.head_dim
        self.kv_size = geo.num_kv_heads * geo.head_dim
        self.eps = geo.eps
        self.q_weight = torch.nn.Parameter(1 + 0.1 * torch.randn(geo.head_dim, dtype=dtype))
        self.k_weight = torch.nn.Parameter(1 + 0.1 * torch.randn(geo.head_dim, dtype=dtype))
        angle = torch.rand(MAX_POSITION, geo.rotary_dim // 2, dtype=torch.float64) * 6.3
        cache = torch.cat((angle.cos(), angle.sin()), dim=-1).to(dtype)
        self.register_buffer("cos_sin_cache", cache)

    def prologue(self, qkv: torch.Tensor, positions: torch.Tensor):
        g = self.geo
        d = g.head_dim
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if g.qk_norm:
            q_by_head = q.view(*q.shape[:-1], q.shape[-1] // d, d)
            q_by_head = native_rms_norm(q_by_head, self.q_weight, self.eps)
            q = q_by_head.view(q.shape)
            k_by_head = k.view(*k.shape[:-1], k.shape[-1] // d, d)
            k_by_head = native_rms_norm(k_by_head, self.k_weight, self.eps)
            k = k_by_head.view(k.shape)
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
