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
(:class:`~vllm_ascend_ext.passes.kv_fusion.KVCacheFusion`, ``kv_cache=``) the line goes on
``, K/N with the KV-cache write``: K of the N fused prologues now also write their layer's
cache (a q-only layer has no cache write of its own; a layer whose cache layout is refused
keeps vLLM's, and one more INFO line gives the reason and the count). MiniMax-M2's q/k norm
across all heads (geometries with ``qk_norm_across_heads``: no per-head pattern is registered for
them) is fused first by :class:`~vllm_ascend_ext.passes.tp_fusion.TPNormFusion` into
``split_qkv_tp_rmsnorm_rope``; those count in N, and the line goes on ``, T with the q/k norm
across TP ranks`` (the KV-cache step's ``K/N`` then counts the per-head op's prologues only).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import operator
from collections.abc import Iterable, Sequence
from dataclasses import replace

import torch
import torch._inductor.pattern_matcher as pm
from torch._inductor.custom_graph_pass import CustomGraphPass

from ..kernels import custom_ops
from .forms import (NATIVE_GEMMA_NORM, NATIVE_MROPE, NATIVE_NORM, NATIVE_ROPE, RESHAPE_OPS, AscendOps, NormForm,
                    RopeForm, ascend_ops, available_forms, canonicalize_reshapes,
                    example_inputs, fake_mode, lookup_op, merge_duplicate_views, native_gemma_rms_norm, native_mrope,
                    native_rms_norm, native_rope, native_weightless, npu_forms, trace, trace_aot, trace_views)
from ..ops.models import AttentionGeometry

__all__ = [
    "ASCEND_FUSED_FORMAT",
    "KV_FORMAT",
    "KV_OFF_FORMAT",
    "KV_REFUSED_FORMAT",
    "LOG_FORMAT",
    "NATIVE_GEMMA_NORM",
    "NATIVE_MROPE",
    "NATIVE_NORM",
    "NATIVE_ROPE",
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

def _pattern_fns(geo: AttentionGeometry, norm: NormForm | None, rope: RopeForm, v_norm: bool,
                 literal: bool = False):
    """The search and replacement functions of one (geometry, form).

    ``v_norm``: the pattern includes the v-norm (with ``geo.v_norm``; False spells v as the raw
    slice, so a v-norm the form cannot prove stays in the graph after the fused op).
    ``literal``: a native RoPE spelled for the plain ``aot_autograd`` graph (:func:`trace_aot`).
    """
    d, hq, hkv = geo.head_dim, geo.num_q_heads, geo.num_kv_heads
    q_part, kv_size = hq * d * (2 if geo.q_gate else 1), hkv * d
    eps = geo.eps
    offset = norm.weight_offset if norm is not None else 0.0
    weightless = norm.weightless if norm is not None and norm.weightless is not None else native_weightless
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


def _norm_starts() -> set:
    starts = {torch.ops.aten.pow.Tensor_Scalar}
    for namespace, name in (("vllm_ir", "rms_norm"), ("npu", "npu_rms_norm"), ("_C_ascend", "npu_gemma_rms_norm")):
        if (op := lookup_op(namespace, name)) is not None:
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
        elif q_only and node.target in RESHAPE_OPS:
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
def _traces(rope: RopeForm, ascend: bool) -> tuple:
    """The traces a form is registered with. Inductor rewrites view -> reshape and runs its
    joint-graph passes before custom passes (:func:`trace`); vllm-ascend's own compiler
    (plain ``aot_autograd`` + its pass manager) does neither: in a process with vllm-ascend's
    ops (``ascend``) every form is also registered as that graph has it (:func:`trace_aot`),
    and vLLM's own custom-op RoPE as an aot_autograd graph without Inductor's passes would
    (:func:`trace_views`)."""
    if ascend:
        return (trace, trace_aot)
    return (trace,) if rope.native else (trace, trace_views)


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


def _variants(geo: AttentionGeometry, forms):
    """``(norm, rope, v_norm, key)`` of every pattern ``geo`` registers, in matching order: the
    v-norm patterns first, then the same without it (q and k fused, v's norm left in the graph)."""
    if geo.qk_norm_across_heads:
        return  # MiniMax-M2's norm across heads: the TP step's (vllm_ascend_ext.passes.tp_fusion)
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
        The KV-cache-write step (:mod:`vllm_ascend_ext.passes.kv_fusion`), run after the prologues are
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

        #: The q/k-norm-across-heads step (MiniMax-M2; :mod:`vllm_ascend_ext.passes.tp_fusion`), run
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
        with fake_mode():
            for geo in geometries:
                for norm, rope, v_norm, variant in _variants(geo, forms):
                    if variant in seen:
                        continue
                    seen.add(variant)
                    for dtype in self._dtypes:
                        inputs = example_inputs(geo, norm is not None, dtype)
                        for trace in _traces(rope, in_ascend):
                            search, replace_fn = _pattern_fns(geo, norm, rope, v_norm,
                                                              literal=trace is trace_aot)
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
            from ..ops.settings import KV_CACHE_FUSION

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

    from ..kernels import mla_ops
    from . import kv_fusion, mla_fusion, tp_fusion

    module = sys.modules[__name__]
    text = "".join(inspect.getsource(m) for m in (module, custom_ops, kv_fusion, tp_fusion, mla_fusion, mla_ops))
    return hashlib.sha256(text.encode()).hexdigest()


def _uuid(*parts: str) -> str:
    digest = hashlib.sha256(_source_hash().encode())
    for part in parts:
        digest.update(part.encode())
    return digest.hexdigest()
