"""The fusion pass dressed as a vLLM ``VllmInductorPass`` (imported only inside vLLM workers).

vLLM's pass managers (``PostGradPassManager``, vllm-ascend's ``GraphFusionPassManager``) accept
only ``InductorPass``/``VllmInductorPass`` instances, and Inductor's ``post_grad_custom_post_pass``
(vLLM-CPU's stock-Inductor path) accepts any ``CustomGraphPass``: the class below is both. It
delegates to :class:`vllm_ascend_ext.passes.fusion.QKNormRoPEFusionPass` and, when another pass held
the same config key before, runs that one first. After the attention-prologue pass, the MLA step
(:class:`vllm_ascend_ext.passes.mla_fusion.MLAFusion`, attribute ``mla``, set by the worker hook) runs on
the same graph and logs its own ``fused N/M MLA prologues`` line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from vllm.compilation.passes.vllm_inductor_pass import VllmInductorPass

from .fusion import QKNormRoPEFusionPass

logger = logging.getLogger(__name__)

__all__ = ["VllmQKNormRoPEFusionPass", "make_vllm_pass"]


class VllmQKNormRoPEFusionPass(VllmInductorPass):
    """vLLM-facing wrapper of :class:`~vllm_ascend_ext.passes.fusion.QKNormRoPEFusionPass`."""

    is_vllm_ascend_ext_pass = True

    def __init__(self, vllm_config, geometries: Callable, previous=None, counted: Callable | None = None):
        super().__init__(vllm_config)
        dtype = vllm_config.model_config.dtype if vllm_config.model_config else torch.bfloat16
        self.fusion = QKNormRoPEFusionPass(geometries, dtypes=(dtype,), counted=counted)
        self.previous = previous
        #: The MLA step (:class:`vllm_ascend_ext.passes.mla_fusion.MLAFusion`), or ``None``.
        self.mla = None

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.previous is not None:
            self.previous(graph)
        self.fusion(graph)
        if self.mla is not None:
            self._mla_step(graph)

    def _mla_step(self, graph: torch.fx.Graph) -> None:
        try:
            counts = self.mla.apply(graph)
        except Exception as exc:  # noqa: BLE001 - never break the user's compile
            logger.warning("vllm_ascend_ext: MLA fusion skipped this graph: %s: %s", type(exc).__name__, exc)
            return
        if counts.total or counts.fused:
            self.mla.log(counts)

    def uuid(self) -> str:
        parts = [self.fusion.uuid()]
        if self.mla is not None:
            parts.append(self.mla.uuid_part())
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
