"""The TorchInductor pass that rewrites the attention prologue into one fused op.

What it matches
---------------
vLLM's attention prologue as it reaches Inductor's post-grad custom pass::

    q, k, v = qkv.split([Hq*D, Hkv*D, Hkv*D], -1)
    q, k    = per-head RMSNorm of q and k (eps, weight)           # Qwen3; absent for Llama/Qwen2
    q, k    = rotary embedding of q and k (positions, cos_sin_cache, R, NeoX or GPT-J)

and its variants (issue 10), each an option of the op:

* **mRoPE** (Qwen2.5-VL, Qwen3-VL, Qwen3.5): ``MRotaryEmbedding`` on ``[3, T]`` positions, the
  cos/sin lanes taken per axis in contiguous sections or interleaved (``mrope_section``,
  ``mrope_interleaved``);
* **gated q** (Qwen3-Next, Qwen3.5): ``qkv.split([2*Hq*D, Hkv*D, Hkv*D])``, the q part viewed
  ``[T, Hq, 2D]`` and chunked into q and the gate, both reshaped ``[T, Hq*D]``; the gate is an
  output (``q_gate``);
* **v-norm** (Gemma-4): v's heads RMS-normalised without a weight (``v_norm``);
* **q-only** layers (Gemma-4's KV-shared layers): the input is ``q_proj``'s output, q alone is
  normalised and rotated (``rotary_emb(positions, q, None)``; ``num_kv_heads=0``);

and replaces it with ``torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope`` (``v`` stays the
slice of ``qkv`` it was, unless it is normalised). One pattern set is registered per distinct
geometry (:class:`~vllm_ascend_ext.ops.models.AttentionGeometry`: heads, D, R, eps, style,
weight offset and the variants above) and per *form* the graph can take, because each piece
reaches the graph in one of several spellings:

=================  ==========================================================================
norm form          graph spelling
=================  ==========================================================================
``native``         vLLM's ``rms_norm`` native implementation, decomposed (fp32 cast, pow, mean,
                   add eps, rsqrt, mul, cast, mul weight). vLLM-CPU emits this. Without a
                   weight (``RMSNorm(has_weight=False)``, Gemma-4's v-norm) it ends at the cast.
``native_gemma``   ``GemmaRMSNorm`` (Gemma-3, Qwen3-Next, Qwen3.5 q/k norms): the same with the
                   weight ``w.float() + 1.0`` (product in fp32, one cast). The op gets
                   ``weight_offset=1.0``; only geometries with ``weight_offset == 1.0`` use it.
``vllm_ir``        ``torch.ops.vllm_ir.rms_norm(x, w, eps, None)`` (vLLM IR op, torch-wrapped;
                   vLLM's CUDA default, lowered after this pass; ``w`` None for the v-norm);
                   ``vllm_ir_gemma`` with ``w.float() + 1.0`` as the weight.
``npu``            ``torch.ops.npu.npu_rms_norm(x, w, eps) -> (y, rstd)`` (torch_npu,
                   ``AscendRMSNorm``). ``w`` is whatever tensor the graph passes, so vllm-ascend's
                   A5/310P Gemma norm ``npu_rms_norm(x, 1.0 + w, eps)`` is this form too (the op
                   gets the graph's ``1 + w``). Not for the v-norm: ``AscendRMSNorm`` passes its
                   ``torch.ones`` weight, a graph input the pass cannot prove all ones.
``npu_gemma``      ``torch.ops._C_ascend.npu_gemma_rms_norm(x, w, eps) -> (y, rstd)``
                   (``AscendGemmaRMSNorm`` on A2/A3); ``weight_offset=1.0``.
``None``           no q/k norm (Llama, Qwen2, Qwen2.5-VL, GLM-4): split + RoPE only, the op
                   runs with weights None.
=================  ==========================================================================

=================  ==========================================================================
rope form          graph spelling
=================  ==========================================================================
``native``         ``RotaryEmbedding.forward_static`` decomposed (index cache by positions,
                   chunk cos/sin, rotate halves or pairs, cat), on ``[T, H, D]`` views; key
                   None for a q-only layer.
``native_mrope``   ``MRotaryEmbedding.forward_native`` on ``[3, T]`` positions: ``cache[positions]``,
                   chunk, then per-axis lanes by ``cos.split(section)`` + ``cat`` (contiguous) or
                   ``apply_interleaved_rope``'s ``arange``/``where`` (interleaved), then the same
                   rotation.
``vllm_c``         ``torch.ops._C.rotary_embedding(positions, q, k, D, cache, is_neox)``: vLLM's
                   in-place custom op (``+rotary_embedding``), auto-functionalised in the graph.
                   Not registered at present: the plain trace of an in-place op does not keep
                   it (see :func:`_reads_every_input`).
``npu``            ``torch.ops.vllm.npu_rotary_embedding(positions, q, k, cache, D, R, is_neox)
                   -> (q, k)`` (vllm-ascend's functional custom op, ``AscendRotaryEmbedding``).
``npu_mrope``      ``torch.ops.npu.npu_mrope(positions, q, k, cache, D, mrope_section=[t, h, w],
                   rotary_mode='half'|'interleave') -> (q, k)`` on ``[3, T]`` positions
                   (``AscendMRotaryEmbedding`` for section ``[16, 24, 24]``; contiguous sections).
=================  ==========================================================================

vllm-ascend's ops are looked up through one seam, :func:`ascend_ops` (an :class:`AscendOps`
resolved lazily from ``torch.ops``; tests pass stand-ins of the same schemas, see
``tests/integration/ascend_standins.py``). Forms whose ops are not loaded in this process are skipped,
so importing and running the pass needs only torch. Where vllm-ascend's own model patch has
already put its fused op into the graph (``torch.ops.vllm.triton_split_qkv_rmsnorm_mrope``:
Qwen3-VL's and Qwen3.5's attention on vllm-ascend; ``qkv_rmsnorm_rope``), the pass leaves it
and says so in its log line.

Each pattern's literal arguments (split sizes, head counts, eps, R, sections) are checked exactly
by the pattern matcher when a candidate is found (it re-traces the pattern on the candidate's own
inputs), so a near miss (another eps, another head count, other sections) is left alone. Pattern
traces get the graph-level treatment the graph got before the pass (Inductor's joint-graph
passes, ``view -> reshape``, :func:`canonicalize_reshapes`), and the graph's repeated
split/view/slice nodes are merged first (:func:`merge_duplicate_views`).

Every call logs, once, at INFO: ``vllm_ascend_ext: fused N/M attention prologues``, where M
counts the prologues in the graph of the geometries the pass was told to count (qkv splits of
their widths, and for q-only geometries the per-head view of q that feeds a norm), including
those of geometries it does not fuse, and N those rewritten. With the KV-cache step
(:class:`~vllm_ascend_ext.kv_fusion.KVCacheFusion`, ``kv_cache=``) the line goes on
``, K/N with the KV-cache write``: K of the N fused prologues now also write their layer's
cache (a q-only layer has no cache write of its own; a layer whose cache layout is refused
keeps vLLM's, and one more INFO line gives the reason and the count). MiniMax-M2's q/k norm
across all heads (geometries with ``qk_norm_across_heads``: no per-head pattern is registered for
them) is fused first by :class:`~vllm_ascend_ext.tp_fusion.TPNormFusion` into
``split_qkv_tp_rmsnorm_rope``; those count in N, and the line goes on ``, T with the q/k norm
across TP ranks`` (the KV-cache step's ``K/N`` then counts the per-head op's prologues only).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import torch
import torch._inductor.pattern_matcher as pm
from torch._inductor.custom_graph_pass import CustomGraphPass

from . import custom_ops
from .ops.models import AttentionGeometry

__all__ = [
    "ASCEND_FUSED_FORMAT",
    "KV_FORMAT",
    "KV_OFF_FORMAT",
    "KV_REFUSED_FORMAT",
    "LOG_FORMAT",
    "AscendOps",
    "NormForm",
    "QKNormRoPEFusionPass",
    "RopeForm",
    "ascend_ops",
    "available_forms",
    "canonicalize_reshapes",
    "count_already_fused",
    "count_prologue_candidates",
    "merge_duplicate_views",
    "native_gemma_rms_norm",
    "native_mrope",
    "native_rms_norm",
    "native_rope",
    "npu_forms",
]

logger = logging.getLogger(__name__)

LOG_FORMAT = "vllm_ascend_ext: fused %d/%d attention prologues"
#: Appended to :data:`LOG_FORMAT` when the KV-cache step runs: K of the N fused prologues.
KV_FORMAT = ", %d/%d with the KV-cache write"
#: Appended instead when the KV-cache step is switched off.
KV_OFF_FORMAT = ", KV-cache write not fused (%s=0)"
#: One INFO line per reason a fused prologue's cache write was left to vLLM.
KV_REFUSED_FORMAT = "vllm_ascend_ext: %d KV-cache write%s left to vLLM: %s"
#: Appended to :data:`LOG_FORMAT` when vllm-ascend's model patches already fused some prologues.
ASCEND_FUSED_FORMAT = "; %d already fused by vllm-ascend's model patch (%s), left as they are"

#: Tokens of the example inputs the patterns are traced with (any value > 1 works).
_EXAMPLE_TOKENS = 5
#: Rows of the example cos/sin cache.
_EXAMPLE_POSITIONS = 64


# --------------------------------------------------------------------------------------------
# The native spellings, written as vLLM 0.32 writes them (vllm/ir/ops/layernorm.py rms_norm,
# vllm/model_executor/layers/rotary_embedding RotaryEmbedding.forward_static / ApplyRotaryEmb,
# mrope.py MRotaryEmbedding.forward_native / apply_interleaved_rope), so that their traces
# decompose to the same aten graph.
# --------------------------------------------------------------------------------------------


def native_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """vLLM's native RMSNorm: fp32 statistics, cast to the weight's dtype, times the weight
    (``weight=None``: ``RMSNorm(has_weight=False)``, straight back to x's dtype)."""
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    if weight is not None:
        x = x.to(weight.dtype) * weight
    return x.to(orig_dtype)


def native_gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """vLLM's native ``GemmaRMSNorm``: the weight as ``1 + w`` in fp32, then :func:`native_rms_norm`.

    With an fp32 weight the product is taken in fp32 and rounded to the activation dtype once
    (the plain norm rounds the normalised x to the weight's dtype first).
    """
    return native_rms_norm(x, weight.float() + 1.0, eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
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


def _rotate_heads(x: torch.Tensor, cos, sin, rotary_dim: int, is_neox: bool, literal: bool = False) -> torch.Tensor:
    """Rotate dims ``[0, R)`` of each head of ``x`` ``[T, H, D]``; the rest pass through.

    When ``rotary_dim == head_dim`` the pass-through slice is empty and Inductor drops it (and
    the cat with it), so it is not spelled here either, unless ``literal`` (the graph plain
    ``aot_autograd`` builds keeps both, and the full slice ``x[..., :D]`` as an alias).
    """
    if literal or rotary_dim < x.shape[-1]:
        return torch.cat((_rotate(x[..., :rotary_dim], cos, sin, is_neox), x[..., rotary_dim:]), dim=-1)
    return _rotate(x, cos, sin, is_neox)


def native_rope(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
                cos_sin_cache: torch.Tensor, head_dim: int, rotary_dim: int,
                is_neox: bool, literal: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """vLLM's native rotary embedding on ``[T, H, D]`` q and k (returned in that shape).

    ``key`` None is a q-only layer (Gemma-4's KV-shared layers): only q is rotated. ``literal``:
    the pass-through cat spelled even when empty (see :func:`_rotate_heads`).
    """
    positions = positions.flatten()
    cos_sin = cos_sin_cache.index_select(0, positions)
    cos, sin = cos_sin.chunk(2, dim=-1)
    query = _rotate_heads(query, cos, sin, rotary_dim, is_neox, literal)
    if key is not None:
        key = _rotate_heads(key, cos, sin, rotary_dim, is_neox, literal)
    return query, key


def _interleaved_lanes(x: torch.Tensor, section) -> torch.Tensor:
    """vLLM's ``apply_interleaved_rope``: lane i from axis H if ``i % 3 == 1 and i < 3h``, W if
    ``i % 3 == 2 and i < 3w``, else T (``x``: ``[3, T, R/2]``)."""
    channels = torch.arange(x.shape[-1], device=x.device)
    is_height = (channels % 3 == 1) & (channels < section[1] * 3)
    is_width = (channels % 3 == 2) & (channels < section[2] * 3)
    result = torch.where(is_height, x[1], x[0])
    return torch.where(is_width, x[2], result)


def _contiguous_lanes(x: torch.Tensor, section) -> torch.Tensor:
    """``MRotaryEmbedding``'s contiguous sections: section j of the lanes from axis j."""
    return torch.cat([m[i] for i, m in enumerate(x.split(list(section), dim=-1))], dim=-1)


def native_mrope(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                 cos_sin_cache: torch.Tensor, head_dim: int, rotary_dim: int, is_neox: bool,
                 mrope_section, mrope_interleaved: bool, literal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's ``MRotaryEmbedding.forward_native`` on ``[3, T]`` positions and ``[T, H, D]`` q, k
    (``literal``: see :func:`_rotate_heads`)."""
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)
    lanes = _interleaved_lanes if mrope_interleaved else _contiguous_lanes
    cos, sin = lanes(cos, mrope_section), lanes(sin, mrope_section)
    return (_rotate_heads(query, cos, sin, rotary_dim, is_neox, literal),
            _rotate_heads(key, cos, sin, rotary_dim, is_neox, literal))


# --------------------------------------------------------------------------------------------
# Forms
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NormForm:
    """One spelling of the per-head RMSNorm: ``apply(x, weight, eps) -> y`` (same shape).

    ``weight_offset`` is what the op is given (1.0: the spelling adds 1 to the weight, Gemma's
    ``x * (1 + w)``). ``serves`` are the geometries' weight offsets the form is matched for
    (default: ``weight_offset`` alone; the ``npu`` form, which multiplies by whatever tensor the
    graph passes, serves both). ``weightless(x, eps)`` spells the same norm without a weight
    (Gemma-4's v-norm); ``None`` when the form's v-norm cannot be matched.
    """

    name: str
    apply: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    weight_offset: float = 0.0
    serves: tuple[float, ...] | None = None
    weightless: Callable[[torch.Tensor, float], torch.Tensor] | None = None

    def serves_offset(self, offset: float) -> bool:
        """Whether the form is matched for geometries with this ``weight_offset``."""
        return offset in (self.serves if self.serves is not None else (self.weight_offset,))


@dataclass(frozen=True)
class RopeForm:
    """One spelling of the rotary embedding.

    ``apply(positions, q, k, cos_sin_cache, geometry) -> (q, k)``. A ``native`` form takes and
    returns ``[T, H, D]`` tensors (and a keyword ``literal``, see :func:`_rotate_heads`); the
    custom-op forms take and return ``[T, H*D]``. ``mrope``
    forms serve mRoPE geometries (``[3, T]`` positions), the others plain ones; ``q_only``
    forms can spell a layer without k (``k`` None). ``accepts(geometry)`` narrows further
    (``npu_mrope``: contiguous sections only).
    """

    name: str
    apply: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
    native: bool = False
    mrope: bool = False
    q_only: bool = False
    accepts: Callable[[AttentionGeometry], bool] | None = None

    def serves(self, geo: AttentionGeometry) -> bool:
        """Whether the form is matched for ``geo``."""
        if self.mrope != (geo.mrope_section is not None):
            return False
        if geo.num_kv_heads == 0 and not self.q_only:
            return False
        return self.accepts is None or self.accepts(geo)


def _op(namespace: str, name: str):
    """``torch.ops.<namespace>.<name>.default`` when that op is loaded, else ``None``."""
    try:
        return getattr(getattr(torch.ops, namespace), name).default
    except (AttributeError, RuntimeError):
        return None


def _native_weightless(x, eps):
    return native_rms_norm(x, None, eps)


def vllm_ir_norm_forms() -> list[NormForm]:
    """``torch.ops.vllm_ir.rms_norm`` (present once vLLM is imported), plain and Gemma's.

    ``GemmaRMSNorm.forward_native`` calls the same IR op with the weight ``w.float() + 1.0``;
    ``RMSNorm(has_weight=False)`` with the weight None.
    """
    op = _op("vllm_ir", "rms_norm")
    if op is None:
        return []

    def weightless(x, eps):
        return op(x, None, eps, None)

    return [NormForm("vllm_ir", lambda x, w, eps: op(x, w, eps, None), weightless=weightless),
            NormForm("vllm_ir_gemma", lambda x, w, eps: op(x, w.float() + 1.0, eps, None),
                     weight_offset=1.0, weightless=weightless)]


def vllm_c_rope_form() -> RopeForm | None:
    """``torch.ops._C.rotary_embedding`` (vLLM's compiled ops, in place on q and k)."""
    op = _op("_C", "rotary_embedding")
    if op is None:
        return None

    def apply(positions, q, k, cache, geo):
        op(positions, q, k, geo.head_dim, cache, geo.is_neox)
        return q, k

    return RopeForm("vllm_c", apply)


@dataclass(frozen=True)
class AscendOps:
    """vllm-ascend's (and torch_npu's) ops as the pass matches them: the one seam to them.

    Attributes
    ----------
    rms_norm : OpOverload or None
        ``torch.ops.npu.npu_rms_norm`` (``AscendRMSNorm``).
    gemma_rms_norm : OpOverload or None
        ``torch.ops._C_ascend.npu_gemma_rms_norm`` (``AscendGemmaRMSNorm`` on A2/A3).
    rotary_embedding : OpOverload or None
        ``torch.ops.vllm.npu_rotary_embedding`` (``AscendRotaryEmbedding``).
    mrope : OpOverload or None
        ``torch.ops.npu.npu_mrope`` (``AscendMRotaryEmbedding``, contiguous sections).
    fused : tuple of OpOverload
        vllm-ascend's own fused prologue ops, which its model patches put into the graph
        (``vllm.triton_split_qkv_rmsnorm_mrope``: Qwen3-VL, Qwen3.5; ``vllm.qkv_rmsnorm_rope``
        and ``_simt``; ``vllm.split_qkv_tp_rmsnorm_rope``: MiniMax-M2): left alone, counted in
        the log line.
    """

    rms_norm: object = None
    gemma_rms_norm: object = None
    rotary_embedding: object = None
    mrope: object = None
    fused: tuple = ()


def ascend_ops() -> AscendOps:
    """vllm-ascend's ops loaded in this process (each ``None`` when not: no torch_npu / vllm-ascend).

    Looked up lazily, when the pass first runs: importing this module needs only torch.
    """
    fused = tuple(op for op in (_op("vllm", "triton_split_qkv_rmsnorm_mrope"), _op("vllm", "qkv_rmsnorm_rope"),
                                _op("vllm", "qkv_rmsnorm_rope_simt"), _op("vllm", "split_qkv_tp_rmsnorm_rope"))
                  if op is not None)
    return AscendOps(rms_norm=_op("npu", "npu_rms_norm"), gemma_rms_norm=_op("_C_ascend", "npu_gemma_rms_norm"),
                     rotary_embedding=_op("vllm", "npu_rotary_embedding"), mrope=_op("npu", "npu_mrope"),
                     fused=fused)


def npu_forms(ops: AscendOps | None = None) -> tuple[list[NormForm], list[RopeForm]]:
    """vllm-ascend's spellings of the norm and the rotary embedding whose ops are loaded.

    Parameters
    ----------
    ops : AscendOps, optional
        Default :func:`ascend_ops`. Tests pass the stand-ins of ``tests/integration/ascend_standins.py``.

    Returns
    -------
    (list of NormForm, list of RopeForm)
        ``npu`` / ``npu_gemma`` norms and ``npu`` / ``npu_mrope`` ropes, as far as loaded.
    """
    ops = ascend_ops() if ops is None else ops
    norms, ropes = [], []
    if (norm_op := ops.rms_norm) is not None:
        norms.append(NormForm("npu", lambda x, w, eps: norm_op(x, w, eps)[0], serves=(0.0, 1.0)))
    if (gemma_op := ops.gemma_rms_norm) is not None:
        norms.append(NormForm("npu_gemma", lambda x, w, eps: gemma_op(x, w, eps)[0], weight_offset=1.0))
    if (rot_op := ops.rotary_embedding) is not None:
        ropes.append(RopeForm("npu", lambda positions, q, k, cache, g: tuple(
            rot_op(positions, q, k, cache, g.head_dim, g.rotary_dim, g.is_neox))))
    if (mrope_op := ops.mrope) is not None:
        # AscendMRotaryEmbedding.forward_oot makes every input contiguous: q and k straight from
        # the split (no q/k norm: Qwen2.5-VL) are copied first, and the pattern says so.
        ropes.append(RopeForm(
            "npu_mrope", lambda positions, q, k, cache, g: tuple(mrope_op(
                positions.contiguous(), q.contiguous(), k.contiguous(), cache.contiguous(), g.head_dim,
                mrope_section=list(g.mrope_section), rotary_mode="half" if g.is_neox else "interleave")),
            mrope=True, accepts=lambda g: not g.mrope_interleaved))
    return norms, ropes


NATIVE_NORM = NormForm("native", native_rms_norm, weightless=_native_weightless)
NATIVE_GEMMA_NORM = NormForm("native_gemma", native_gemma_rms_norm, weight_offset=1.0,
                             weightless=_native_weightless)
NATIVE_ROPE = RopeForm(
    "native", lambda positions, q, k, cache, g, literal=False: native_rope(
        positions, q, k, cache, g.head_dim, g.rotary_dim, g.is_neox, literal),
    native=True, q_only=True)
NATIVE_MROPE = RopeForm(
    "native_mrope", lambda positions, q, k, cache, g, literal=False: native_mrope(
        positions, q, k, cache, g.head_dim, g.rotary_dim, g.is_neox, g.mrope_section, g.mrope_interleaved,
        literal),
    native=True, mrope=True)


def available_forms(ascend: AscendOps | None = None) -> list[tuple[NormForm | None, RopeForm]]:
    """Every (norm, rope) spelling whose ops are loaded in this process.

    The native forms always; vLLM's custom-op forms once vLLM's ops are loaded; vllm-ascend's
    (:func:`npu_forms`) when torch_npu and vllm-ascend are: their norms with their ropes and
    with the native ones (vllm-ascend keeps vLLM's native RoPE for the classes it does not
    replace, such as ``Gemma4RotaryEmbedding``, and for mRoPE sections other than
    ``[16, 24, 24]``). ``None`` as the norm means the no-norm prologue.
    """
    norms: list[NormForm | None] = [NATIVE_NORM, NATIVE_GEMMA_NORM, *vllm_ir_norm_forms()]
    ropes: list[RopeForm] = [NATIVE_ROPE, NATIVE_MROPE]
    if (form := vllm_c_rope_form()) is not None:
        ropes.append(form)
    combos: list[tuple[NormForm | None, RopeForm]] = [(n, r) for r in ropes for n in [*norms, None]]
    npu_norms, npu_ropes = npu_forms(ascend)
    combos += [(n, r) for r in [*npu_ropes, NATIVE_ROPE, NATIVE_MROPE] for n in npu_norms]
    combos += [(None, r) for r in npu_ropes]
    return combos


# --------------------------------------------------------------------------------------------
# Patterns
# --------------------------------------------------------------------------------------------


def _pattern_fns(geo: AttentionGeometry, norm: NormForm | None, rope: RopeForm, v_norm: bool,
                 literal: bool = False):
    """The search and replacement functions of one (geometry, form).

    ``v_norm``: the pattern includes the v-norm (with ``geo.v_norm``; False spells v as the raw
    slice, so a v-norm the form cannot prove stays in the graph after the fused op).
    ``literal``: a native RoPE spelled for the plain ``aot_autograd`` graph (:func:`_trace_aot`).
    """
    d, hq, hkv = geo.head_dim, geo.num_q_heads, geo.num_kv_heads
    q_part, kv_size = hq * d * (2 if geo.q_gate else 1), hkv * d
    eps = geo.eps
    offset = norm.weight_offset if norm is not None else 0.0
    weightless = norm.weightless if norm is not None and norm.weightless is not None else _native_weightless
    fused = custom_ops.functional_op()
    options = dict(is_neox=geo.is_neox, weight_offset=offset, q_gate=geo.q_gate, v_norm=v_norm,
                   mrope_section=list(geo.mrope_section) if geo.mrope_section else None,
                   mrope_interleaved=geo.mrope_interleaved)

    def split(qkv):
        """``(q, k, v, gate)`` [T, H*D] each as the model splits its projection."""
        if hkv == 0:
            return qkv, None, None, None
        try:
            q, k, v = qkv.split([q_part, kv_size, kv_size], dim=-1)
        except (ValueError, RuntimeError) as exc:  # the matcher reads RuntimeError as "no match"
            raise RuntimeError(str(exc)) from exc
        if not geo.q_gate:
            return q, k, v, None
        q_gate = q.view(*q.shape[:-1], hq, -1)  # Qwen3NextAttention._project_qkv_gate
        q, gate = torch.chunk(q_gate, 2, dim=-1)
        return q.reshape(*q.shape[:-2], -1), k, v, gate.reshape(*gate.shape[:-2], -1)

    def by_head(x):
        return x.view(*x.shape[:-1], x.shape[-1] // d, d)

    def search_body(qkv, positions, cos_sin_cache, weights):
        q, k, v, gate = split(qkv)
        if norm is not None:
            q = norm.apply(by_head(q), weights[0], eps).view(q.shape)
            if k is not None:
                k = norm.apply(by_head(k), weights[1], eps).view(k.shape)
        if rope.native:  # vLLM views by positions' length, the same symbol as qkv's rows
            q = q.view(q.shape[0], -1, d)
            k = k.view(k.shape[0], -1, d) if k is not None else None
        if rope.native:
            q, k = rope.apply(positions, q, k, cos_sin_cache, geo, literal=literal)
        else:
            q, k = rope.apply(positions, q, k, cos_sin_cache, geo)
        if k is None:
            return (q,)
        if v_norm:  # ends per head: the flatten after it folds into the consumer's view
            v = weightless(by_head(v), eps)
        return (q, k, v, gate) if geo.q_gate else (q, k, v)

    def replace_body(qkv, positions, cos_sin_cache, weights):
        q_weight = weights[0] if weights else None
        k_weight = weights[1] if len(weights) > 1 else None
        q, k, v, gate = fused(qkv, q_weight, k_weight, cos_sin_cache, positions, hq, hkv, d,
                              eps if weights or v_norm else 0.0, **options)
        if rope.native:
            q = q.view(-1, hq, d)
        if hkv == 0:
            return (q,)
        if rope.native:
            k = k.view(-1, hkv, d)
        v = v.view(-1, hkv, d) if v_norm else split(qkv)[2]
        return (q, k, v, gate) if geo.q_gate else (q, k, v)

    # The matcher names a pattern's inputs by the function's parameters: spell them out.
    if norm is None:

        def search(qkv, positions, cos_sin_cache):
            return search_body(qkv, positions, cos_sin_cache, ())

        def replace(qkv, positions, cos_sin_cache):
            return replace_body(qkv, positions, cos_sin_cache, ())

    elif hkv == 0:

        def search(qkv, positions, cos_sin_cache, q_weight):
            return search_body(qkv, positions, cos_sin_cache, (q_weight,))

        def replace(qkv, positions, cos_sin_cache, q_weight):
            return replace_body(qkv, positions, cos_sin_cache, (q_weight,))

    else:

        def search(qkv, positions, cos_sin_cache, q_weight, k_weight):
            return search_body(qkv, positions, cos_sin_cache, (q_weight, k_weight))

        def replace(qkv, positions, cos_sin_cache, q_weight, k_weight):
            return replace_body(qkv, positions, cos_sin_cache, (q_weight, k_weight))

    return search, replace


def _example_inputs(geo: AttentionGeometry, with_norm: bool, dtype: torch.dtype) -> list[torch.Tensor]:
    t, d = _EXAMPLE_TOKENS, geo.head_dim
    positions = (3, t) if geo.mrope_section is not None else (t,)
    inputs = [
        torch.empty(t, geo.qkv_width, dtype=dtype),
        torch.empty(*positions, dtype=torch.int64),
        torch.empty(_EXAMPLE_POSITIONS, geo.rotary_dim, dtype=dtype),
    ]
    if with_norm:
        inputs += [torch.empty(d, dtype=dtype) for _ in range(2 if geo.num_kv_heads else 1)]
    return inputs


#: Targets that start a per-head RMSNorm (after an optional fp32 cast): how a q-only layer's
#: per-head view of q is told from other per-head views.
def _norm_starts() -> set:
    starts = {torch.ops.aten.pow.Tensor_Scalar}
    for namespace, name in (("vllm_ir", "rms_norm"), ("npu", "npu_rms_norm"), ("_C_ascend", "npu_gemma_rms_norm")):
        if (op := _op(namespace, name)) is not None:
            starts.add(op)
    return starts


def _feeds_norm(node: torch.fx.Node, starts: set, extra: Sequence = ()) -> bool:
    for user in node.users:
        target = user.target
        if target in starts or target in extra:
            return True
        if target is torch.ops.prims.convert_element_type.default and any(
                u.target in starts for u in user.users):
            return True
    return False


def _is_split_part(node: torch.fx.Node) -> bool:
    """Whether ``node`` is one part of a split (a q, k or v slice; a gated q's chunk)."""
    return (node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node)
            and node.args[0].target in (torch.ops.aten.split_with_sizes.default, torch.ops.aten.split.Tensor))


def count_prologue_candidates(graph: torch.fx.Graph, geometries: Iterable[AttentionGeometry] = (),
                              norm_ops: Sequence = ()) -> int:
    """Attention prologues in ``graph``.

    A layer with k and v is a 2-D split into three parts, the last two equal; with
    ``geometries``, only splits of one of their widths ``[Hq*D, Hkv*D, Hkv*D]`` (``2*Hq*D``
    first with a gated q) count. A q-only geometry's layer (no split: its input is q alone) is
    a reshape of a 2-D tensor that is not a split's part (q_proj's output) to ``[.., Hq, D]``
    feeding an RMSNorm (a ``pow``, after an optional fp32 cast, or one of ``norm_ops``).
    """
    geometries = list(geometries)
    widths = {(g.num_q_heads * g.head_dim * (2 if g.q_gate else 1), g.num_kv_heads * g.head_dim)
              for g in geometries if g.num_kv_heads}
    q_only = {(g.num_q_heads, g.head_dim) for g in geometries if not g.num_kv_heads}
    starts = _norm_starts() if q_only else set()
    count = 0
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is torch.ops.aten.split_with_sizes.default:
            sizes = node.args[1]
            if not isinstance(sizes, (list, tuple)) or len(sizes) != 3 or not all(
                    isinstance(s, int) for s in sizes):
                continue
            source = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
            if isinstance(source, torch.Tensor) and source.dim() != 2:
                continue  # a cos/sin split of mRoPE sections, not a projection
            if sizes[1] != sizes[2]:
                continue
            if geometries and (sizes[0], sizes[1]) not in widths:
                continue
            count += 1
        elif q_only and node.target in _RESHAPE_OPS:
            val = node.meta.get("val")
            source = node.args[0]
            if not isinstance(val, torch.Tensor) or val.dim() != 3 or not isinstance(source, torch.fx.Node):
                continue
            if (val.shape[-2], val.shape[-1]) not in q_only or _is_split_part(source):
                continue
            src_val = source.meta.get("val")
            if isinstance(src_val, torch.Tensor) and src_val.dim() == 2 and _feeds_norm(node, starts, norm_ops):
                count += 1
    return count


def count_already_fused(graph: torch.fx.Graph, fused_ops: Sequence) -> dict[str, int]:
    """Calls of vllm-ascend's own fused prologue ops in ``graph``, by op name."""
    counts: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "call_function" and node.target in fused_ops:
            name = str(getattr(node.target, "_name", node.target))
            counts[name] = counts.get(name, 0) + 1
    return counts


#: Pure, cheap ops that :func:`merge_duplicate_views` may merge when repeated verbatim.
_VIEW_OPS = (
    torch.ops.aten.split_with_sizes.default,
    torch.ops.aten.split.Tensor,
    torch.ops.aten.reshape.default,
    torch.ops.aten.view.default,
    torch.ops.aten.slice.Tensor,
)
# (not unsqueeze: vLLM's RoPE unsqueezes cos/sin once for q and once for k, and the patterns
# spell it that way. slice: GPT-J takes x[..., :R] once and its even and odd columns from it;
# fp32 graphs on vLLM-CPU repeat that slice per consumer, like the split.)


def _freeze(value):
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def merge_duplicate_views(graph: torch.fx.Graph) -> int:
    """Merge repeated identical split/view/slice/getitem nodes (same target, same arguments).

    Inductor can leave one copy of the qkv split (and of the per-head reshape and the rotary
    halves) per consumer: seen in fp32 graphs on vLLM-CPU, three splits of one projection each
    feeding one of q, k, v. A prologue pattern needs each piece once. Only side-effect-free view
    ops and ``getitem`` of their results are merged, so semantics are unchanged.

    Returns
    -------
    int
        Nodes removed.
    """
    seen: dict = {}
    merged = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            if not (isinstance(node.args[0], torch.fx.Node) and node.args[0].target in _VIEW_OPS):
                continue
        elif node.target not in _VIEW_OPS:
            continue
        key = (node.target, _freeze(node.args), _freeze(node.kwargs))
        try:
            hash(key)
        except TypeError:
            continue
        if key in seen:
            node.replace_all_uses_with(seen[key])
            graph.erase_node(node)
            merged += 1
        else:
            seen[key] = node
    return merged


#: The ops whose size argument :func:`canonicalize_reshapes` respells.
_RESHAPE_OPS = (torch.ops.aten.reshape.default, torch.ops.aten.view.default)


def canonicalize_reshapes(graph: torch.fx.Graph) -> int:
    """Spell every reshape/view's size from its output shape: ints, the one symbolic dim as -1.

    The same reshape reaches the graph in several spellings: ``[s0, 4, 32]`` (sizes read off a
    tensor: Qwen3's ``view(*x.shape[:-1], H, D)``, Gemma-3's ``unflatten``), ``[-1, 4, 32]``
    (Qwen3-Next's ``view(-1, H, D)``), ``[s0, -1, 32]`` (vLLM's RoPE ``view(num_tokens, -1, D)``),
    and the token count ``s0`` may be any of several graph inputs that carry the same symbol
    (GPT-J's ``stack(...).flatten(-2)`` sizes its result by the cos/sin rows, i.e. by a second
    SymInt placeholder of the same value). A pattern re-traced on a candidate spells the sizes
    its own way and names one symbol node, so an uncanonical spelling is a miss. Rewriting both
    the graph and every pattern trace to ``[-1, 4, 32]`` (``[.., ..]`` all ints when static)
    removes that difference. The result shape is unchanged, so semantics are too. Nodes with
    more than one symbolic output dim, a zero-sized static dim next to a symbolic one, or no
    ``meta["val"]`` are left as they are.

    Returns
    -------
    int
        Nodes rewritten.
    """
    changed = 0
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in _RESHAPE_OPS or len(node.args) != 2:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        shape = tuple(val.shape)
        symbolic = [i for i, size in enumerate(shape) if not isinstance(size, int)]
        if len(symbolic) > 1 or (symbolic and 0 in shape):
            continue
        sizes = [-1 if i in symbolic else size for i, size in enumerate(shape)]
        current = node.args[1]
        if isinstance(current, (list, tuple)) and list(current) == sizes and all(
                isinstance(s, int) for s in current):
            continue
        node.args = (node.args[0], sizes)
        changed += 1
    return changed


def _joint_graph_treatment(gm: torch.fx.GraphModule) -> None:
    """Inductor's joint-graph passes (no-op removal, view folding, ...), which every graph got
    before the post-grad custom pass: a pattern must be spelled as they left the graph (a
    gated q's ``reshape -> view`` pair folds to the copy alone)."""
    from torch._inductor import config
    from torch._inductor.fx_passes.joint_graph import joint_graph_passes

    # Inductor's own passes only: a user's joint-graph passes are not for pattern traces.
    with config.patch(joint_custom_pre_pass=None, joint_custom_post_pass=None):
        joint_graph_passes(gm)


def _trace_views(fn, args, *extra, **kwargs) -> torch.fx.GraphModule:
    """``fwd_only`` with canonical reshape sizes (the graph as an aot_autograd backend sees it)."""
    gm = pm.fwd_only(fn, args, *extra, **kwargs)
    canonicalize_reshapes(gm.graph)
    gm.recompile()
    return gm


def _trace(fn, args, *extra, **kwargs) -> torch.fx.GraphModule:
    """``fwd_only``, then the joint-graph passes and the view -> reshape rewrite Inductor applies
    before custom passes, with canonical reshape sizes."""
    from torch._inductor.fx_passes.post_grad import view_to_reshape

    gm = pm.fwd_only(fn, args, *extra, **kwargs)
    _joint_graph_treatment(gm)
    view_to_reshape(gm)
    canonicalize_reshapes(gm.graph)
    gm.recompile()
    return gm


def _trace_aot(fn, args, *extra, **kwargs) -> torch.fx.GraphModule:
    """``fwd_only`` without Inductor's decompositions, with canonical reshape sizes: the forward
    graph plain ``aot_autograd`` hands vllm-ascend's pass manager (no decomposition table, no
    joint-graph passes, views kept as views)."""
    kwargs["get_decomp_fn"] = dict  # the matcher passes Inductor's table; aot_autograd uses none
    kwargs["run_functional_passes"] = False  # nor does it remove no-op views and slices
    gm = pm.fwd_only(fn, args, *extra, **kwargs)
    gm.graph.eliminate_dead_code()
    canonicalize_reshapes(gm.graph)
    gm.recompile()
    return gm


def _traces(rope: RopeForm, ascend: bool) -> tuple:
    """The traces a form is registered with. Inductor rewrites view -> reshape and runs its
    joint-graph passes before custom passes (:func:`_trace`); vllm-ascend's own compiler
    (plain ``aot_autograd`` + its pass manager) does neither: in a process with vllm-ascend's
    ops (``ascend``) every form is also registered as that graph has it (:func:`_trace_aot`),
    and vLLM's own custom-op RoPE as an aot_autograd graph without Inductor's passes would
    (:func:`_trace_views`)."""
    if ascend:
        return (_trace, _trace_aot)
    return (_trace,) if rope.native else (_trace, _trace_views)


def _reads_every_input(search, example_inputs, trace) -> bool:
    """Whether ``search``, traced by ``trace``, reads every one of its inputs.

    A trace that drops an input is not the prologue: ``_C.rotary_embedding`` (the ``vllm_c``
    form) writes q and k in place and returns nothing: the outputs of the plain trace do not
    depend on the op, nor on positions or the cache, and the pattern built from them (the
    outputs' ancestors) is "any qkv split". The matcher finds it
    at every split that no other pattern took (a layer whose geometry is not fused), cannot
    bind the unused inputs and raises, which ends the pass for the whole graph. Such a form is
    not registered.
    """
    gm = trace(search, example_inputs)
    read, stack = set(), [node for node in gm.graph.nodes if node.op == "output"]
    while stack:  # the nodes the outputs depend on: all the pattern keeps of the trace
        node = stack.pop()
        if node not in read:
            read.add(node)
            stack.extend(node.all_input_nodes)
    return all(node in read for node in gm.graph.nodes if node.op == "placeholder")


def _fake_mode():
    """A fresh FakeTensorMode for tracing patterns, outside any ambient fake mode or tracing."""
    from torch._guards import tracing
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

    class _Ctx:
        def __enter__(self):
            self._stack = [unset_fake_temporarily(), tracing(None), FakeTensorMode()]
            for ctx in self._stack:
                ctx.__enter__()

        def __exit__(self, *exc):
            for ctx in reversed(self._stack):
                ctx.__exit__(*exc)
            return False

    return _Ctx()


def _variants(geo: AttentionGeometry, forms):
    """``(norm, rope, v_norm, key)`` of every pattern ``geo`` registers, in matching order: the
    v-norm patterns first, then the same without it (q and k fused, v's norm left in the graph)."""
    if geo.qk_norm_across_heads:
        return  # MiniMax-M2's norm across heads: the TP step's (vllm_ascend_ext.tp_fusion)
    for with_v_norm in ((True, False) if geo.v_norm and geo.num_kv_heads else (False,)):
        for norm, rope in forms:
            if not rope.serves(geo):
                continue
            if norm is None:
                if geo.qk_norm or geo.num_kv_heads == 0:
                    continue  # a q-only layer always has its q norm (Gemma-4)
            elif not geo.qk_norm or not norm.serves_offset(geo.weight_offset):
                continue  # a (1 + w) norm only for (1 + w) geometries, and back
            if with_v_norm and norm is not None and norm.weightless is None:
                continue  # this form's v-norm cannot be matched (npu: its ones weight)
            # A pattern depends on the weight offset only through its norm form (the ``npu`` form
            # serves both offsets with one pattern), and without a norm not on eps either
            # (unless v is normalised).
            key_geo = replace(geo, v_norm=with_v_norm, weight_offset=norm.weight_offset if norm else 0.0)
            if norm is None and not with_v_norm:
                key_geo = replace(key_geo, eps=0.0)
            yield norm, rope, with_v_norm, (key_geo, norm.name if norm else None, rope.name)


class QKNormRoPEFusionPass(CustomGraphPass):
    """Post-grad pass: split -> q/k RMSNorm -> RoPE  =>  ``vllm_ascend_ext.split_qkv_rmsnorm_rope``.

    Parameters
    ----------
    geometries : iterable of AttentionGeometry, or callable returning one
        The attention geometries of the model as sharded on this rank: one pattern set per
        distinct geometry. A callable is read when the pass first runs (vLLM integration: the
        model's layers are only known once it is loaded, after the pass has been handed to the
        compiler).
    forms : sequence of (NormForm or None, RopeForm), optional
        Spellings to match; default :func:`available_forms` at first run.
    dtypes : sequence of torch.dtype
        Activation dtypes to trace the patterns with (the matcher re-checks the dtype of every
        candidate, so these only seed the search).
    counted : iterable of AttentionGeometry, or callable returning one, optional
        The geometries whose prologues M of the ``fused N/M`` line counts (read like
        ``geometries``); default ``geometries``. The vLLM worker hook passes every geometry of
        the model, so one left unfused (its Triton compile failed) shows as ``N < M``.
    ascend : AscendOps, optional
        vllm-ascend's ops (the forms' default and the already-fused ops the log line counts);
        default :func:`ascend_ops` at first run.
    kv_cache : KVCacheFusion, optional
        The KV-cache-write step (:mod:`vllm_ascend_ext.kv_fusion`), run after the prologues are
        fused; ``None``: no such step, the log line as before. May be set after construction
        (attribute ``kv_cache``; the vLLM worker hook does).

    Notes
    -----
    Usable directly as Inductor's ``post_grad_custom_post_pass``; :meth:`uuid` keys Inductor's
    cache on this file's source, the geometries and the forms. Calling the pass returns the
    number of prologues fused and logs the ``fused N/M`` line once.
    """

    def __init__(self, geometries, forms: Sequence[tuple[NormForm | None, RopeForm]] | None = None,
                 dtypes: Sequence[torch.dtype] = (torch.bfloat16,), counted=None,
                 ascend: AscendOps | None = None, kv_cache=None):
        self.kv_cache = kv_cache
        self.last_kv = None
        self._geometries_src = geometries
        self._counted_src = counted
        self._forms = list(forms) if forms is not None else None
        self._dtypes = tuple(dtypes)
        self._ascend = ascend
        self._patterns: pm.PatternMatcherPass | None = None
        self._built_for: tuple | None = None
        self.last_counts: tuple[int, int] | None = None
        self.last_already_fused: dict[str, int] = {}
        from .tp_fusion import TPNormFusion

        #: The q/k-norm-across-heads step (MiniMax-M2; :mod:`vllm_ascend_ext.tp_fusion`), run
        #: first; its count is part of N and of the log line's TP suffix.
        self.tp_norm = TPNormFusion(self.geometries, dtypes=self._dtypes)
        self.last_tp = 0

    # ---- configuration ---------------------------------------------------------------------
    def geometries(self) -> tuple[AttentionGeometry, ...]:
        """The distinct geometries the pass fuses, in a stable order."""
        src = self._geometries_src() if callable(self._geometries_src) else self._geometries_src
        unique = {g: None for g in (src or ())}
        return tuple(sorted(unique, key=repr))

    def counted_geometries(self) -> tuple[AttentionGeometry, ...]:
        """The geometries whose prologues the ``fused N/M`` line counts (default: :meth:`geometries`)."""
        if self._counted_src is None:
            return self.geometries()
        src = self._counted_src() if callable(self._counted_src) else self._counted_src
        return tuple(src or ())

    def ascend(self) -> AscendOps:
        """vllm-ascend's ops the pass knows (looked up at first use)."""
        if self._ascend is None:
            self._ascend = ascend_ops()
        return self._ascend

    def forms(self) -> list[tuple[NormForm | None, RopeForm]]:
        """The (norm, rope) spellings the pass matches."""
        if self._forms is None:
            self._forms = available_forms(self.ascend())
        return self._forms

    def _build(self) -> pm.PatternMatcherPass:
        geometries, forms = self.geometries(), self.forms()
        key = (geometries, tuple((n.name if n else None, r.name) for n, r in forms), self._dtypes)
        if self._patterns is not None and self._built_for == key:
            return self._patterns
        patterns = pm.PatternMatcherPass(pass_name="vllm_ascend_ext_qk_norm_rope_fusion")
        seen = set()
        whole: dict[tuple, bool] = {}  # per form and trace: does its search read every input?
        ascend = self.ascend()
        in_ascend = any(op is not None for op in (ascend.rms_norm, ascend.gemma_rms_norm, ascend.rotary_embedding,
                                                  ascend.mrope)) or bool(ascend.fused)
        with _fake_mode():
            for geo in geometries:
                for norm, rope, v_norm, variant in _variants(geo, forms):
                    if variant in seen:
                        continue
                    seen.add(variant)
                    for dtype in self._dtypes:
                        inputs = _example_inputs(geo, norm is not None, dtype)
                        for trace in _traces(rope, in_ascend):
                            search, replace_fn = _pattern_fns(geo, norm, rope, v_norm,
                                                              literal=trace is _trace_aot)
                            form = (norm.name if norm else None, rope.name, trace.__name__)
                            if form not in whole:
                                whole[form] = _reads_every_input(search, inputs, trace)
                                if not whole[form]:
                                    logger.debug("vllm_ascend_ext: form %s not matched: its trace "
                                                 "drops an input", form)
                            if not whole[form]:
                                continue
                            pm.register_replacement(search, replace_fn, inputs, trace, patterns,
                                                    skip_duplicates=True)
        self._patterns, self._built_for = patterns, key
        return patterns

    # ---- CustomGraphPass -------------------------------------------------------------------
    def __call__(self, graph: torch.fx.Graph) -> int:
        """Fuse every matching prologue of ``graph`` in place; return how many were fused."""
        geometries = self.geometries()
        ascend = self.ascend()
        canonicalize_reshapes(graph)
        merge_duplicate_views(graph)
        norm_ops = [op for op in (ascend.rms_norm, ascend.gemma_rms_norm) if op is not None]
        total = count_prologue_candidates(graph, self.counted_geometries(), norm_ops)
        already = count_already_fused(graph, ascend.fused)
        tp = self._tp_step(graph)
        try:
            fused = self._build().apply(graph) if geometries else 0
        except Exception as exc:  # noqa: BLE001 - never break the user's compile
            logger.warning("vllm_ascend_ext: fusion pass skipped this graph: %s: %s",
                           type(exc).__name__, exc)
            fused = 0
        if fused or tp:
            # The matcher inserts each op before the first output of its match; an input bound
            # to a node defined later (a weight computed in the graph, such as ``w + 1``) is then
            # used before its definition. Inductor sorts right after this pass; we need it before
            # dead-code elimination, which lints the graph.
            pm.stable_topological_sort(graph)
            graph.eliminate_dead_code()
        kv = self._kv_step(graph)
        self.last_counts = (fused + tp, total)
        self.last_already_fused = already
        self.last_kv = kv
        self.last_tp = tp
        line, args = LOG_FORMAT, [fused + tp, total]
        if tp:
            from .tp_fusion import TP_FORMAT

            line, args = line + TP_FORMAT, [*args, tp]
        if kv is not None and not self.kv_cache.enabled:
            from .ops.settings import KV_CACHE_FUSION

            line, args = line + KV_OFF_FORMAT, [*args, KV_CACHE_FUSION]
        elif kv is not None:
            line, args = line + KV_FORMAT, [*args, kv.fused, fused]
        if already:
            line, args = line + ASCEND_FUSED_FORMAT, [*args, sum(already.values()), ", ".join(sorted(already))]
        logger.info(line, *args)
        for reason, count in sorted((kv.refused if kv is not None else {}).items()):
            logger.info(KV_REFUSED_FORMAT, count, "" if count == 1 else "s", reason)
        return fused + tp

    def _tp_step(self, graph: torch.fx.Graph) -> int:
        """Run the q/k-norm-across-heads step on ``graph``; how many it fused."""
        try:
            return self.tp_norm.apply(graph)
        except Exception as exc:  # noqa: BLE001 - never break the user's compile
            logger.warning("vllm_ascend_ext: TP q/k norm fusion skipped this graph: %s: %s",
                           type(exc).__name__, exc)
            return 0

    def _kv_step(self, graph: torch.fx.Graph):
        """Run the KV-cache step (if any) on ``graph``; its counts, or ``None`` without one."""
        if self.kv_cache is None:
            return None
        from .kv_fusion import KVCounts

        try:
            return self.kv_cache.apply(graph)
        except Exception as exc:  # noqa: BLE001 - never break the user's compile
            logger.warning("vllm_ascend_ext: KV-cache write fusion skipped this graph: %s: %s",
                           type(exc).__name__, exc)
            return KVCounts()

    def uuid(self) -> str:
        """Cache key: this module's source, the geometries and the forms."""
        return _uuid(repr(self.geometries()),
                     repr([(n.name if n else None, r.name) for n, r in self.forms()]),
                     repr(self._dtypes), self.kv_cache.uuid_part() if self.kv_cache is not None else "",
                     self.tp_norm.uuid_part())


@functools.lru_cache(maxsize=1)
def _source_hash() -> str:
    import inspect
    import sys

    from . import kv_fusion, tp_fusion

    module = sys.modules[__name__]
    text = (inspect.getsource(module) + inspect.getsource(custom_ops) + inspect.getsource(kv_fusion)
            + inspect.getsource(tp_fusion))
    return hashlib.sha256(text.encode()).hexdigest()


def _uuid(*parts: str) -> str:
    digest = hashlib.sha256(_source_hash().encode())
    for part in parts:
        digest.update(part.encode())
    return digest.hexdigest()
