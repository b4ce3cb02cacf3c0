"""STAND-INS for vllm-ascend's ops, so their graph form can be tested where torch_npu cannot load.

vllm-ascend's attention prologue reaches the compiler as::

    torch.ops.npu.npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)
    torch.ops.vllm.npu_rotary_embedding(Tensor positions, Tensor query, Tensor key,
        Tensor cos_sin_cache, int head_size, int rotary_dim, bool is_neox_style,
        Tensor? offsets=None) -> (Tensor, Tensor)

``npu_rms_norm`` comes from torch_npu and ``npu_rotary_embedding`` from vllm-ascend; neither
loads without CANN. This module defines ops with **the same schemas** in a namespace that says
what they are, ``vllm_ascend_ext_standin``, with plain PyTorch CPU bodies (RMSNorm returning
``(y, rstd)``; RoPE NeoX/GPT-J over the first ``rotary_dim`` dims). They exist only so that
tests can build graphs in vllm-ascend's form and check that the fusion pass
(:func:`vllm_ascend_ext.fusion.npu_forms`) rewrites them. Test-only, so it lives under
``tests/vllm/`` and is not part of the installed package.
"""

from __future__ import annotations

import torch

__all__ = ["NAMESPACE", "npu_rms_norm", "npu_rotary_embedding"]

NAMESPACE = "vllm_ascend_ext_standin"

_RMS_SCHEMA = "npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)"
_ROPE_SCHEMA = (
    "npu_rotary_embedding(Tensor positions, Tensor query, Tensor key, Tensor cos_sin_cache, "
    "int head_size, int rotary_dim, bool is_neox_style, Tensor? offsets=None) -> (Tensor, Tensor)"
)


def _rms_norm(x, gamma, epsilon=1e-6):
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    return (xf * rstd * gamma.float()).to(x.dtype), rstd


def _rms_norm_fake(x, gamma, epsilon=1e-6):
    return torch.empty_like(x), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)


def _rotate(x, cos, sin, is_neox):
    if is_neox:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def _rope(positions, query, key, cos_sin_cache, head_size, rotary_dim, is_neox_style, offsets=None):
    tokens = positions.shape[0]
    cos, sin = cos_sin_cache.float()[positions.long()].chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    outs = []
    for x in (query, key):
        xh = x.reshape(tokens, -1, head_size).float()
        rot = _rotate(xh[..., :rotary_dim], cos, sin, is_neox_style)
        outs.append(torch.cat((rot, xh[..., rotary_dim:]), dim=-1).to(x.dtype).reshape(x.shape))
    return outs[0], outs[1]


def _rope_fake(positions, query, key, cos_sin_cache, head_size, rotary_dim, is_neox_style,
               offsets=None):
    return torch.empty_like(query), torch.empty_like(key)


def _register():
    lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    lib.define(_RMS_SCHEMA)
    lib.define(_ROPE_SCHEMA)
    lib.impl("npu_rms_norm", _rms_norm, "CPU")
    lib.impl("npu_rotary_embedding", _rope, "CPU")
    torch.library.register_fake(f"{NAMESPACE}::npu_rms_norm", _rms_norm_fake, lib=lib)
    torch.library.register_fake(f"{NAMESPACE}::npu_rotary_embedding", _rope_fake, lib=lib)
    return lib


_LIBRARY = None if hasattr(getattr(torch.ops, NAMESPACE), "npu_rms_norm") else _register()

#: ``torch.ops.vllm_ascend_ext_standin.npu_rms_norm.default`` (stand-in for torch_npu's op).
npu_rms_norm = getattr(torch.ops, NAMESPACE).npu_rms_norm.default
#: ``torch.ops.vllm_ascend_ext_standin.npu_rotary_embedding.default`` (stand-in for vllm-ascend's).
npu_rotary_embedding = getattr(torch.ops, NAMESPACE).npu_rotary_embedding.default
