"""The fusion pass dressed as a vLLM ``VllmInductorPass`` (imported only inside vLLM workers).

vLLM's pass managers (``PostGradPassManager``, vllm-ascend's ``GraphFusionPassManager``) accept
only ``InductorPass``/``VllmInductorPass`` instances, and Inductor's ``post_grad_custom_post_pass``
(vLLM-CPU's stock-Inductor path) accepts any ``CustomGraphPass``: the class below is both. It
delegates to :class:`vllm_ascend_ext.fusion.QKNormRoPEFusionPass` and, when another pass held
the same config key before, runs that one first.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from vllm.compilation.passes.vllm_inductor_pass import VllmInductorPass

from .fusion import QKNormRoPEFusionPass

__all__ = ["VllmQKNormRoPEFusionPass", "make_vllm_pass"]


class VllmQKNormRoPEFusionPass(VllmInductorPass):
    """vLLM-facing wrapper of :class:`~vllm_ascend_ext.fusion.QKNormRoPEFusionPass`."""

    is_vllm_ascend_ext_pass = True

    def __init__(self, vllm_config, geometries: Callable, previous=None, counted: Callable | None = None):
        super().__init__(vllm_config)
        dtype = vllm_config.model_config.dtype if vllm_config.model_config else torch.bfloat16
        self.fusion = QKNormRoPEFusionPass(geometries, dtypes=(dtype,), counted=counted)
        self.previous = previous

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.previous is not None:
            self.previous(graph)
        self.fusion(graph)

    def uuid(self) -> str:
        parts = [self.fusion.uuid()]
        if self.previous is not None and hasattr(self.previous, "uuid"):
            parts.append(str(self.previous.uuid()))
        return VllmInductorPass.hash_dict({"parts": parts})


def make_vllm_pass(vllm_config, geometries: Callable, previous=None,
                   counted: Callable | None = None) -> VllmQKNormRoPEFusionPass:
    """Build the pass for ``vllm_config``.

    Parameters
    ----------
    vllm_config : VllmConfig
        The engine's config (its model dtype seeds the patterns).
    geometries : callable
        Returns the geometries to fuse; read when the graph compiles.
    previous : callable, optional
        A pass that held the same config key before; it runs first.
    counted : callable, optional
        Returns the geometries whose prologues the ``fused N/M`` line counts (default:
        ``geometries``).

    Returns
    -------
    VllmQKNormRoPEFusionPass
    """
    return VllmQKNormRoPEFusionPass(vllm_config, geometries, previous, counted)
