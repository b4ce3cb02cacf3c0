"""Read the attention geometries of a loaded model: what the fusion pass and the worker hook plan for.

A model's layers are found by duck typing, so any vLLM model built from the usual parts is
covered: a module with an ``attn`` (``num_heads``, ``num_kv_heads``, ``head_size``: the counts
*on this rank*, after tensor-parallel sharding) and a ``rotary_emb`` (``rotary_dim``,
``is_neox_style``), and optionally ``q_norm``/``k_norm`` RMSNorms (their ``variance_epsilon``).
Layers may differ: every distinct geometry is returned once.

Imports nothing from vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .ops.models import AttentionGeometry

__all__ = ["model_geometries", "module_geometry"]

#: eps recorded for prologues without q/k norm (the op ignores it there).
NO_NORM_EPS = 1e-6


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
    q_norm, k_norm = getattr(module, "q_norm", None), getattr(module, "k_norm", None)
    if q_norm is not None and k_norm is not None:
        eps = float(getattr(q_norm, "variance_epsilon", getattr(q_norm, "eps", NO_NORM_EPS)))
        offset = 1.0 if "gemma" in type(q_norm).__name__.lower() else 0.0
        return AttentionGeometry(hq, hkv, d, r, is_neox=neox, qk_norm=True, weight_offset=offset,
                                 eps=eps)
    return AttentionGeometry(hq, hkv, d, r, is_neox=neox, qk_norm=False, eps=NO_NORM_EPS)


def model_geometries(model: torch.nn.Module | Iterable[torch.nn.Module]) -> tuple[AttentionGeometry, ...]:
    """Distinct attention geometries of ``model``'s layers, in first-seen order."""
    modules = model.modules() if isinstance(model, torch.nn.Module) else model
    seen: dict[AttentionGeometry, None] = {}
    for module in modules:
        geo = module_geometry(module)
        if geo is not None:
            seen.setdefault(geo, None)
    return tuple(seen)
