"""The fusion pass's step for q/k norms across all heads and TP ranks (MiniMax-M2, issue 12).

MiniMax-M2 / M2.5 normalise q and k over their whole hidden size (vLLM 0.32's
``MiniMaxText01RMSNormTP``, ``vllm/model_executor/layers/minimax_rms_norm/rms_norm_tp.py``), and
``MiniMaxM2Attention.forward`` reaches Inductor in one of two spellings, chosen by the TP size:

``TP = 1`` (``forward_qkv`` -> ``forward_qk``, plain torch, inlined)::

    q, k, v = qkv.split([Hq*D, Hkv*D, Hkv*D], -1)
    q = q.float();  q = q * rsqrt(q.pow(2).mean(-1, keepdim=True) + eps) * q_weight;  q = q.to(dtype)
    k likewise with k_weight                                   # q_weight [Hq*D], k_weight [Hkv*D]
    q, k = native RoPE of q.view(T, -1, D), k.view(T, -1, D)   # partial rotary, NeoX

``TP > 1`` (one opaque op; the all-reduce of the partial sums is inside it)::

    q, k = torch.ops.vllm.minimax_qk_norm_fusion(qkv, q_weight, k_weight, Hq*D, Hkv*D,
                                                 tp_rank, tp_world, eps, None)
    _, _, v = qkv.split([Hq*D, Hkv*D, Hkv*D], -1)
    q, k = native RoPE as above

``tp_rank`` is a literal baked into each rank's graph (0 on rank 0, 1 on rank 1, ...): the
pattern takes it, and ``tp_world``, as pattern arguments (the matcher's ``scalar_workaround``),
so one pattern serves every rank and TP size; ``tp_world`` becomes the op's ``tp_size``. Both
spellings are replaced by ``torch.ops.vllm_ascend_ext.split_qkv_tp_rmsnorm_rope`` (``tp_size``
1 or ``tp_world``; its real implementation sums the partial sums over vLLM's TP group, see
:func:`vllm_ascend_ext.kernels.custom_ops.tp_all_reduce`); ``v`` stays qkv's slice. The RoPE is the
fusion pass's ``native`` form (:data:`vllm_ascend_ext.passes.fusion.NATIVE_ROPE`), traced the way that
pass traces its patterns (:func:`vllm_ascend_ext.passes.forms.trace`), one pattern per geometry
(:class:`~vllm_ascend_ext.ops.models.AttentionGeometry` with ``qk_norm_across_heads``: the
rank's head counts, D, R, eps, style) and activation dtype. Literal arguments (split sizes,
``Hq*D``/``Hkv*D``, eps) are checked exactly when a candidate is found, as in the fusion pass.

Not matched: vLLM's CUDA Lamport path passes a workspace tensor instead of ``None`` (vLLM's own
one-kernel fused all-reduce + norm, T <= 2048; left to vLLM). vllm-ascend replaces
``MiniMaxM2Attention.forward`` with a model patch that calls its own
``torch.ops.vllm.split_qkv_tp_rmsnorm_rope``: that op is left alone and counted in the pass's
log line as already fused (:func:`vllm_ascend_ext.passes.fusion.ascend_ops`).

Imports nothing from vLLM.
"""

from __future__ import annotations

import logging

import torch
import torch._inductor.pattern_matcher as pm

from ..kernels import custom_ops
from ..ops.models import AttentionGeometry

__all__ = ["TP_FORMAT", "TPNormFusion", "minimax_forward_qk", "minimax_qk_norm_op"]

logger = logging.getLogger(__name__)

#: Appended to the fusion pass's ``fused N/M`` line: T of the N fused prologues are this step's.
TP_FORMAT = ", %d with the q/k norm across TP ranks"

#: Example values of the pattern's integer arguments ``tp_rank`` and ``tp_world``: the matcher
#: turns every literal equal to one of them into that argument, so they must be values no other
#: literal of the pattern takes (sizes, dims, eps are far from these).
_EXAMPLE_TP_RANK = 7919
_EXAMPLE_TP_WORLD = 7907

#: Lookup sentinel: the op is looked up in ``torch.ops`` at first use.
_LOOKUP = object()


def minimax_forward_qk(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``MiniMaxText01RMSNormTP.forward_qk`` as vLLM 0.32 writes it (TP = 1): each of q and k
    divided by its RMS over the whole row (all heads), times its ``[H*D]`` weight, in fp32."""
    orig_dtype = q.dtype
    q = q.to(torch.float32)
    k = k.to(torch.float32)
    q_var = q.pow(2).mean(dim=-1, keepdim=True)
    k_var = k.pow(2).mean(dim=-1, keepdim=True)
    q = q * torch.rsqrt(q_var + eps) * q_weight
    k = k * torch.rsqrt(k_var + eps) * k_weight
    return q.to(orig_dtype), k.to(orig_dtype)


def minimax_qk_norm_op():
    """``torch.ops.vllm.minimax_qk_norm_fusion.default`` when vLLM's MiniMax norm module is
    loaded in this process, else ``None``."""
    from .forms import lookup_op as _op

    return _op("vllm", "minimax_qk_norm_fusion")


def _pattern_fns(geo: AttentionGeometry, qk_norm_op=None):
    """Search and replacement functions for ``geo``: the TP = 1 spelling, or with ``qk_norm_op``
    (vLLM's ``minimax_qk_norm_fusion`` or a stand-in of its schema) the TP > 1 one."""
    from .forms import NATIVE_ROPE

    d, hq, hkv, eps = geo.head_dim, geo.num_q_heads, geo.num_kv_heads, geo.eps
    sizes = [hq * d, hkv * d, hkv * d]
    fused = custom_ops.tp_norm_op()

    def rope(positions, q, k, cos_sin_cache):
        # vLLM's RotaryEmbedding views q and k by the token count, then rotates per head.
        return NATIVE_ROPE.apply(positions, q.view(q.shape[0], -1, d), k.view(k.shape[0], -1, d),
                                 cos_sin_cache, geo)

    def replace_body(qkv, positions, cos_sin_cache, q_weight, k_weight, tp_size):
        q, k = fused(qkv, q_weight, k_weight, cos_sin_cache, positions, hq, hkv, d, eps, tp_size, geo.is_neox)
        return q.view(-1, hq, d), k.view(-1, hkv, d), qkv.split(sizes, dim=-1)[2]

    if qk_norm_op is None:

        def search(qkv, positions, cos_sin_cache, q_weight, k_weight):
            q, k, v = qkv.split(sizes, dim=-1)
            q, k = minimax_forward_qk(q, k, q_weight, k_weight, eps)
            q, k = rope(positions, q, k, cos_sin_cache)
            return q, k, v

        def replace(qkv, positions, cos_sin_cache, q_weight, k_weight):
            return replace_body(qkv, positions, cos_sin_cache, q_weight, k_weight, 1)

        return search, replace

    def search_tp(qkv, positions, cos_sin_cache, q_weight, k_weight, tp_rank, tp_world):
        q, k = qk_norm_op(qkv, q_weight, k_weight, sizes[0], sizes[1], tp_rank, tp_world, eps, None)
        _, _, v = qkv.split(sizes, dim=-1)
        q, k = rope(positions, q, k, cos_sin_cache)
        return q, k, v

    def replace_tp(qkv, positions, cos_sin_cache, q_weight, k_weight, tp_rank, tp_world):
        return replace_body(qkv, positions, cos_sin_cache, q_weight, k_weight, tp_world)

    return search_tp, replace_tp


def _example_inputs(geo: AttentionGeometry, dtype: torch.dtype) -> list[torch.Tensor]:
    """The fusion pass's example qkv, positions and cache, and weights of ``H*D`` values."""
    from .forms import example_inputs as prologue_inputs

    d = geo.head_dim
    return [*prologue_inputs(geo, False, dtype), torch.empty(geo.num_q_heads * d, dtype=dtype),
            torch.empty(geo.num_kv_heads * d, dtype=dtype)]


class TPNormFusion:
    """The step of :class:`~vllm_ascend_ext.passes.fusion.QKNormRoPEFusionPass` that fuses MiniMax-M2's
    q/k norm across heads (both spellings, see the module docstring) with its RoPE.

    Parameters
    ----------
    geometries : iterable of AttentionGeometry, or callable returning one
        Read when the step first runs; only those with ``qk_norm_across_heads`` are fused here
        (the per-head geometries are the fusion pass's).
    dtypes : sequence of torch.dtype
        Activation dtypes to trace the patterns with.
    qk_norm_op : OpOverload or None, optional
        The TP > 1 op to match (default: :func:`minimax_qk_norm_op` at first use; ``None``: the
        TP = 1 spelling only). Tests pass a stand-in of vLLM's schema.
    """

    def __init__(self, geometries, dtypes=(torch.bfloat16,), qk_norm_op=_LOOKUP):
        self._geometries_src = geometries
        self._dtypes = tuple(dtypes)
        self._qk_norm_op = qk_norm_op
        self._patterns: pm.PatternMatcherPass | None = None
        self._built_for: tuple | None = None

    def geometries(self) -> tuple[AttentionGeometry, ...]:
        """The distinct across-heads geometries, in a stable order."""
        src = self._geometries_src() if callable(self._geometries_src) else self._geometries_src
        unique = {g: None for g in (src or ()) if g.qk_norm_across_heads}
        return tuple(sorted(unique, key=repr))

    def qk_norm_op(self):
        """The TP > 1 op the step matches (``None``: none loaded)."""
        if self._qk_norm_op is _LOOKUP:
            self._qk_norm_op = minimax_qk_norm_op()
        return self._qk_norm_op

    def _build(self, geometries) -> pm.PatternMatcherPass:
        from .forms import fake_mode as _fake_mode, trace as _trace

        op = self.qk_norm_op()
        key = (geometries, str(op), self._dtypes)
        if self._patterns is not None and self._built_for == key:
            return self._patterns
        patterns = pm.PatternMatcherPass(pass_name="vllm_ascend_ext_tp_qk_norm_rope_fusion")
        with _fake_mode():
            for geo in geometries:
                for dtype in self._dtypes:
                    inputs = _example_inputs(geo, dtype)
                    search, replace = _pattern_fns(geo)
                    pm.register_replacement(search, replace, inputs, _trace, patterns, skip_duplicates=True)
                    if op is not None:
                        search, replace = _pattern_fns(geo, op)
                        pm.register_replacement(
                            search, replace, inputs, _trace, patterns, skip_duplicates=True,
                            scalar_workaround=dict(tp_rank=_EXAMPLE_TP_RANK, tp_world=_EXAMPLE_TP_WORLD))
        self._patterns, self._built_for = patterns, key
        return patterns

    def apply(self, graph: torch.fx.Graph) -> int:
        """Fuse every match in ``graph`` in place; return how many were fused (0 without
        across-heads geometries: nothing is traced then)."""
        geometries = self.geometries()
        if not geometries:
            return 0
        return self._build(geometries).apply(graph)

    def uuid_part(self) -> str:
        """This step's part of the pass's cache key: its geometries, op and dtypes."""
        op = self._qk_norm_op if self._qk_norm_op is not _LOOKUP else "lookup"
        return repr((self.geometries(), str(op), self._dtypes))

