"""Read the attention geometries of a loaded model: what the fusion pass and the worker hook plan for.

A model's layers are found by duck typing, so any vLLM model built from the usual parts is
covered: a module with an ``attn`` (``num_heads``, ``num_kv_heads``, ``head_size``: the counts
*on this rank*, after tensor-parallel sharding) and a ``rotary_emb`` (``rotary_dim``,
``is_neox_style``), and optionally ``q_norm``/``k_norm`` RMSNorms (their ``variance_epsilon``).
The issue-10 variants are read from the same modules, as vLLM 0.32 names them:

* mRoPE: ``rotary_emb.mrope_section`` (three sections summing to ``rotary_dim / 2``) and
  ``rotary_emb.mrope_interleaved`` (``MRotaryEmbedding``: Qwen2.5-VL, Qwen3-VL, Qwen3.5);
* gated q: ``attn_output_gate`` (``Qwen3NextAttention``: Qwen3-Next, Qwen3.5);
* v-norm: a ``v_norm`` RMSNorm without a weight (``has_weight=False``) and the q norm's eps
  (``Gemma4Attention``); a v-norm with a weight or another eps is left to the graph (the q/k
  prologue is still fused);
* q-only: ``is_kv_shared_layer`` (``Gemma4Attention``'s KV-shared layers project q alone): the
  geometry has ``num_kv_heads == 0``;
* q/k norm across all heads (``qk_norm_across_heads``; MiniMax-M2 / M2.5, ``qk_norm_type
  "per_layer"``): ``MiniMaxM2Attention``'s ``q_norm`` is a ``MiniMaxText01RMSNormTP`` whose weight
  holds the rank's ``Hq*D`` values (per-head norms hold ``D``).

A module that vLLM itself serves with its fused gated kernel (``use_fused_qk_norm_rope_gate``,
CUDA/XPU only) is not ours to fuse and is skipped. Layers may differ: every distinct geometry
is returned once.

Imports nothing from vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..ops.models import AttentionGeometry

__all__ = ["model_geometries", "module_geometry"]

#: eps recorded for prologues without q/k norm (the op ignores it there).
NO_NORM_EPS = 1e-6


def _eps(norm) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", NO_NORM_EPS)))


def _mrope(rope, rotary_dim: int):
    """``(section, interleaved)`` of an mRoPE module, ``(None, False)`` without sections, or
    ``None`` when it has sections the op cannot serve (not three, or not summing to R/2)."""
    section = getattr(rope, "mrope_section", None)
    if not section:
        return None, False
    try:
        section = tuple(int(s) for s in section)
    except (TypeError, ValueError):
        return None
    if len(section) != 3 or sum(section) != rotary_dim // 2:
        return None
    return section, bool(getattr(rope, "mrope_interleaved", False))


def _across_heads(q_norm, num_q_heads: int, head_dim: int) -> bool:
    """Whether ``q_norm`` normalises the rank's whole q (all heads) rather than each head:
    vLLM's ``MiniMaxText01RMSNormTP``, or any norm whose weight holds ``Hq*D`` values (Hq > 1)."""
    if type(q_norm).__name__ == "MiniMaxText01RMSNormTP":
        return True
    weight = getattr(q_norm, "weight", None)
    return isinstance(weight, torch.Tensor) and num_q_heads > 1 and weight.numel() == num_q_heads * head_dim


def module_geometry(module: torch.nn.Module) -> AttentionGeometry | None:
    """The prologue geometry of one attention module, or ``None`` if it is not one we fuse."""
    attn = getattr(module, "attn", None)
    rope = getattr(module, "rotary_emb", None)
    if attn is None or rope is None:
        return None
    try:
        hq, hkv, d = int(attn.num_heads), int(attn.num_kv_heads), int(attn.head_size)
        r, neox = int(rope.rotary_dim), bool(rope.is_neox_style)
    except (AttributeError, TypeError, ValueError):
        return None
    if getattr(rope, "head_size", d) != d:
        return None
    if getattr(module, "use_fused_qk_norm_rope_gate", False):
        return None  # vLLM's own fused gated kernel serves it (CUDA/XPU)
    mrope = _mrope(rope, r)
    if mrope is None:
        return None
    section, interleaved = mrope
    options = dict(is_neox=neox, mrope_section=section, mrope_interleaved=interleaved,
                   q_gate=bool(getattr(module, "attn_output_gate", False)))
    q_norm, k_norm = getattr(module, "q_norm", None), getattr(module, "k_norm", None)
    if getattr(module, "is_kv_shared_layer", False):  # q_proj only: K/V come from another layer
        if q_norm is None:
            return None  # a q-only layer without a q norm has no prologue to fuse
        hkv, k_norm = 0, q_norm
    if q_norm is None or k_norm is None:
        return AttentionGeometry(hq, hkv, d, r, qk_norm=False, eps=NO_NORM_EPS, **options)
    eps = _eps(q_norm)
    if _across_heads(q_norm, hq, d):
        return AttentionGeometry(hq, hkv, d, r, qk_norm=True, eps=eps, qk_norm_across_heads=True, **options)
    offset = 1.0 if "gemma" in type(q_norm).__name__.lower() else 0.0
    v_norm = getattr(module, "v_norm", None)
    weightless_v = (hkv > 0 and v_norm is not None and not getattr(v_norm, "has_weight", True)
                    and _eps(v_norm) == eps)
    return AttentionGeometry(hq, hkv, d, r, qk_norm=True, weight_offset=offset, eps=eps, v_norm=weightless_v,
                             **options)


def model_geometries(model: torch.nn.Module | Iterable[torch.nn.Module]) -> tuple[AttentionGeometry, ...]:
    """Distinct attention geometries of ``model``'s layers, in first-seen order."""
    modules = model.modules() if isinstance(model, torch.nn.Module) else model
    seen: dict[AttentionGeometry, None] = {}
    for module in modules:
        geo = module_geometry(module)
        if geo is not None:
            seen.setdefault(geo, None)
    return tuple(seen)
