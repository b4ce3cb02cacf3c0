"""STAND-INS for vllm-ascend's ops, so their graph form can be tested where torch_npu cannot load.

vllm-ascend's attention prologue reaches the compiler as (schemas as of vllm-ascend's main,
torch_npu's ``op_plugin_functions.yaml``)::

    torch.ops.npu.npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)
    torch.ops._C_ascend.npu_gemma_rms_norm(Tensor x, Tensor gamma, float epsilon=1e-06)
        -> (Tensor y, Tensor rstd)                                     # AscendGemmaRMSNorm
    torch.ops.vllm.npu_rotary_embedding(Tensor positions, Tensor query, Tensor key,
        Tensor cos_sin_cache, int head_size, int rotary_dim, bool is_neox_style,
        Tensor? offsets=None) -> (Tensor, Tensor)                      # AscendRotaryEmbedding
    torch.ops.npu.npu_mrope(Tensor positions, Tensor query, Tensor key, Tensor cos_sin_cache,
        int head_size, *, int[]? mrope_section=None, str? rotary_mode='half',
        str? cache_mode='default') -> (Tensor, Tensor)                 # AscendMRotaryEmbedding
    torch.ops.vllm.triton_split_qkv_rmsnorm_mrope(Tensor qkv, Tensor q_weight, Tensor k_weight,
        Tensor cos_sin, int num_q_heads, int num_kv_heads, int head_size, float eps,
        int[] mrope_section, bool is_interleaved, int? rope_dim=None, Tensor? q_bias=None,
        Tensor? k_bias=None, bool has_gate=False) -> (Tensor, Tensor, Tensor, Tensor)
                                                # vllm-ascend's Qwen3-VL / Qwen3.5 model patches

``npu_rms_norm`` and ``npu_mrope`` come from torch_npu, the others from vllm-ascend; none loads
without CANN. This module defines ops with **the same schemas** in a namespace that says what
they are, ``vllm_ascend_ext_standin``, with plain PyTorch CPU bodies written from the ops'
documented semantics (RMSNorm returning ``(y, rstd)``; RoPE NeoX/GPT-J over the first
``rotary_dim`` dims; ``npu_mrope``'s contiguous sections; the fused op's split, norm and mRoPE).
They exist only so that tests can build graphs in vllm-ascend's form and check that the fusion
pass (:class:`vllm_ascend_ext.passes.fusion.AscendOps`) rewrites them, or leaves the fused op alone.
Test-only, so it lives under ``tests/integration/`` and is not part of the installed package.
"""

from __future__ import annotations

import torch

__all__ = ["NAMESPACE", "ascend_ops", "npu_gemma_rms_norm", "npu_mrope", "npu_rms_norm", "npu_rotary_embedding",
           "triton_split_qkv_rmsnorm_mrope"]

NAMESPACE = "vllm_ascend_ext_standin"

_RMS_SCHEMA = "npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)"
_GEMMA_RMS_SCHEMA = "npu_gemma_rms_norm(Tensor x, Tensor gamma, float epsilon=1e-06) -> (Tensor y, Tensor rstd)"
_ROPE_SCHEMA = (
    "npu_rotary_embedding(Tensor positions, Tensor query, Tensor key, Tensor cos_sin_cache, "
    "int head_size, int rotary_dim, bool is_neox_style, Tensor? offsets=None) -> (Tensor, Tensor)"
)
_MROPE_SCHEMA = (
    "npu_mrope(Tensor positions, Tensor query, Tensor key, Tensor cos_sin_cache, int head_size, *, "
    "int[]? mrope_section=None, str? rotary_mode='half', str? cache_mode='default') -> (Tensor, Tensor)"
)
_FUSED_MROPE_SCHEMA = (
    "triton_split_qkv_rmsnorm_mrope(Tensor qkv, Tensor q_weight, Tensor k_weight, Tensor cos_sin, "
    "int num_q_heads, int num_kv_heads, int head_size, float eps, int[] mrope_section, bool is_interleaved, "
    "int? rope_dim=None, Tensor? q_bias=None, Tensor? k_bias=None, bool has_gate=False) "
    "-> (Tensor, Tensor, Tensor, Tensor)"
)


def _rms_norm(x, gamma, epsilon=1e-6):
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    return (xf * rstd * gamma.float()).to(x.dtype), rstd


def _gemma_rms_norm(x, gamma, epsilon=1e-6):
    return _rms_norm(x, gamma.float() + 1.0, epsilon)


def _rms_norm_fake(x, gamma, epsilon=1e-6):
    return torch.empty_like(x), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)


def _rotate(x, cos, sin, is_neox):
    if is_neox:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def _rotate_rows(x, cos, sin, head_size, is_neox):
    """Rotate the first ``2 * cos.shape[-1]`` dims of each head of ``x`` ``[T, H*D]``; cos/sin ``[T, R/2]``."""
    rotary_dim = 2 * cos.shape[-1]
    xh = x.reshape(x.shape[0], -1, head_size).float()
    rot = _rotate(xh[..., :rotary_dim], cos.float()[:, None, :], sin.float()[:, None, :], is_neox)
    return torch.cat((rot, xh[..., rotary_dim:]), dim=-1).to(x.dtype).reshape(x.shape)


def _rope(positions, query, key, cos_sin_cache, head_size, rotary_dim, is_neox_style, offsets=None):
    cos, sin = cos_sin_cache[positions.long()].chunk(2, dim=-1)
    return (_rotate_rows(query, cos, sin, head_size, is_neox_style),
            _rotate_rows(key, cos, sin, head_size, is_neox_style))


def _rope_fake(positions, query, key, cos_sin_cache, head_size, rotary_dim, is_neox_style,
               offsets=None):
    return torch.empty_like(query), torch.empty_like(key)


def _section_rows(cos_sin, section, interleaved):
    """cos and sin ``[T, R/2]`` from per-axis rows ``[3, T, R]``: contiguous sections (``npu_mrope``
    cache_mode 'default') or interleaved (vllm-ascend's fused op ``is_interleaved``)."""
    cos, sin = cos_sin.chunk(2, dim=-1)
    lanes = torch.arange(cos.shape[-1])
    if interleaved:
        axis = torch.where((lanes % 3 == 1) & (lanes < 3 * section[1]), 1,
                           torch.where((lanes % 3 == 2) & (lanes < 3 * section[2]), 2, 0))
    else:
        axis = (lanes >= section[0]).long() + (lanes >= section[0] + section[1]).long()
    pick = axis[None, None, :].expand(1, *cos.shape[1:])
    return cos.gather(0, pick)[0], sin.gather(0, pick)[0]


def _mrope(positions, query, key, cos_sin_cache, head_size, *, mrope_section=None, rotary_mode="half",
           cache_mode="default"):
    if cache_mode != "default":
        raise NotImplementedError("stand-in: cache_mode 'default' only")
    cos_sin = cos_sin_cache[positions.long()]
    if positions.ndim == 2:
        cos, sin = _section_rows(cos_sin, mrope_section, interleaved=False)
    else:
        cos, sin = cos_sin.chunk(2, dim=-1)
    is_neox = rotary_mode == "half"
    return (_rotate_rows(query, cos, sin, head_size, is_neox),
            _rotate_rows(key, cos, sin, head_size, is_neox))


def _mrope_fake(positions, query, key, cos_sin_cache, head_size, *, mrope_section=None, rotary_mode="half",
                cache_mode="default"):
    return torch.empty_like(query), torch.empty_like(key)


def _fused_mrope(qkv, q_weight, k_weight, cos_sin, num_q_heads, num_kv_heads, head_size, eps, mrope_section,
                 is_interleaved, rope_dim=None, q_bias=None, k_bias=None, has_gate=False):
    q_size, kv_size = num_q_heads * head_size, num_kv_heads * head_size
    q_part, k, v = qkv.split([q_size * (2 if has_gate else 1), kv_size, kv_size], dim=-1)
    if has_gate:
        q, gate = q_part.reshape(qkv.shape[0], num_q_heads, 2 * head_size).chunk(2, dim=-1)
        q, gate = q.reshape(qkv.shape[0], q_size), gate.reshape(qkv.shape[0], q_size)
    else:
        q, gate = q_part, qkv.new_empty((qkv.shape[0], 0))
    cos, sin = _section_rows(cos_sin, mrope_section, is_interleaved)
    outs = []
    for x, weight, heads in ((q, q_weight, num_q_heads), (k, k_weight, num_kv_heads)):
        normed = _rms_norm(x.reshape(x.shape[0], heads, head_size), weight, eps)[0].reshape(x.shape)
        outs.append(_rotate_rows(normed, cos, sin, head_size, True))
    return outs[0], outs[1], v.clone(), gate.contiguous()


def _fused_mrope_fake(qkv, q_weight, k_weight, cos_sin, num_q_heads, num_kv_heads, head_size, eps,
                      mrope_section, is_interleaved, rope_dim=None, q_bias=None, k_bias=None, has_gate=False):
    tokens, q_size, kv_size = qkv.shape[0], num_q_heads * head_size, num_kv_heads * head_size
    return (qkv.new_empty((tokens, q_size)), qkv.new_empty((tokens, kv_size)), qkv.new_empty((tokens, kv_size)),
            qkv.new_empty((tokens, q_size if has_gate else 0)))


_OPS = {
    "npu_rms_norm": (_RMS_SCHEMA, _rms_norm, _rms_norm_fake),
    "npu_gemma_rms_norm": (_GEMMA_RMS_SCHEMA, _gemma_rms_norm, _rms_norm_fake),
    "npu_rotary_embedding": (_ROPE_SCHEMA, _rope, _rope_fake),
    "npu_mrope": (_MROPE_SCHEMA, _mrope, _mrope_fake),
    "triton_split_qkv_rmsnorm_mrope": (_FUSED_MROPE_SCHEMA, _fused_mrope, _fused_mrope_fake),
}


def _register():
    lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    for name, (schema, body, fake) in _OPS.items():
        lib.define(schema)
        lib.impl(name, body, "CPU")
        torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=lib)
    return lib


_LIBRARY = None if hasattr(getattr(torch.ops, NAMESPACE), "npu_rms_norm") else _register()

_ns = getattr(torch.ops, NAMESPACE)
#: Stand-in of ``torch.ops.npu.npu_rms_norm.default`` (torch_npu).
npu_rms_norm = _ns.npu_rms_norm.default
#: Stand-in of ``torch.ops._C_ascend.npu_gemma_rms_norm.default`` (vllm-ascend).
npu_gemma_rms_norm = _ns.npu_gemma_rms_norm.default
#: Stand-in of ``torch.ops.vllm.npu_rotary_embedding.default`` (vllm-ascend).
npu_rotary_embedding = _ns.npu_rotary_embedding.default
#: Stand-in of ``torch.ops.npu.npu_mrope.default`` (torch_npu).
npu_mrope = _ns.npu_mrope.default
#: Stand-in of ``torch.ops.vllm.triton_split_qkv_rmsnorm_mrope.default`` (vllm-ascend).
triton_split_qkv_rmsnorm_mrope = _ns.triton_split_qkv_rmsnorm_mrope.default


def ascend_ops():
    """The stand-ins as the pass's seam takes vllm-ascend's ops (:class:`~vllm_ascend_ext.passes.fusion.AscendOps`)."""
    from vllm_ascend_ext.passes.fusion import AscendOps

    return AscendOps(rms_norm=npu_rms_norm, gemma_rms_norm=npu_gemma_rms_norm,
                     rotary_embedding=npu_rotary_embedding, mrope=npu_mrope,
                     fused=(triton_split_qkv_rmsnorm_mrope,))
