"""The unfused graph forms the passes match, and the tracing helpers they share (leaf module).

The native spellings of q/k RMSNorm, RoPE and mRoPE as vLLM 0.32 writes them, vLLM's IR and C
forms and vllm-ascend's NPU forms (:class:`NormForm`, :class:`RopeForm`, :func:`available_forms`),
the example inputs patterns are traced with, and the traces themselves (:func:`trace` as Inductor
sees a graph, :func:`trace_aot` as vllm-ascend's compiler does, :func:`trace_views` for vLLM's
custom-op RoPE) with the graph canonicalisations they apply. :mod:`vllm_ascend_ext.passes.fusion`,
:mod:`vllm_ascend_ext.passes.tp_fusion` and :mod:`vllm_ascend_ext.passes.kv_fusion` build on it; it imports none
of them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch._inductor.pattern_matcher as pm

from ..ops.models import AttentionGeometry

#: Tokens of the example inputs the patterns are traced with (any value > 1 works).
EXAMPLE_TOKENS = 5
#: Rows of the example cos/sin cache.
EXAMPLE_POSITIONS = 64


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


def lookup_op(namespace: str, name: str):
    """``torch.ops.<namespace>.<name>.default`` when that op is loaded, else ``None``."""
    try:
        return getattr(getattr(torch.ops, namespace), name).default
    except (AttributeError, RuntimeError):
        return None


def native_weightless(x, eps):
    return native_rms_norm(x, None, eps)


def vllm_ir_norm_forms() -> list[NormForm]:
    """``torch.ops.vllm_ir.rms_norm`` (present once vLLM is imported), plain and Gemma's.

    ``GemmaRMSNorm.forward_native`` calls the same IR op with the weight ``w.float() + 1.0``;
    ``RMSNorm(has_weight=False)`` with the weight None.
    """
    op = lookup_op("vllm_ir", "rms_norm")
    if op is None:
        return []

    def weightless(x, eps):
        return op(x, None, eps, None)

    return [NormForm("vllm_ir", lambda x, w, eps: op(x, w, eps, None), weightless=weightless),
            NormForm("vllm_ir_gemma", lambda x, w, eps: op(x, w.float() + 1.0, eps, None),
                     weight_offset=1.0, weightless=weightless)]


def vllm_c_rope_form() -> RopeForm | None:
    """``torch.ops._C.rotary_embedding`` (vLLM's compiled ops, in place on q and k)."""
    op = lookup_op("_C", "rotary_embedding")
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
    fused = tuple(op for op in (lookup_op("vllm", "triton_split_qkv_rmsnorm_mrope"),
                                lookup_op("vllm", "qkv_rmsnorm_rope"), lookup_op("vllm", "qkv_rmsnorm_rope_simt"),
                                lookup_op("vllm", "split_qkv_tp_rmsnorm_rope"))
                  if op is not None)
    return AscendOps(rms_norm=lookup_op("npu", "npu_rms_norm"),
                     gemma_rms_norm=lookup_op("_C_ascend", "npu_gemma_rms_norm"),
                     rotary_embedding=lookup_op("vllm", "npu_rotary_embedding"), mrope=lookup_op("npu", "npu_mrope"),
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


NATIVE_NORM = NormForm("native", native_rms_norm, weightless=native_weightless)
NATIVE_GEMMA_NORM = NormForm("native_gemma", native_gemma_rms_norm, weight_offset=1.0,
                             weightless=native_weightless)
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


def example_inputs(geo: AttentionGeometry, with_norm: bool, dtype: torch.dtype) -> list[torch.Tensor]:
    t, d = EXAMPLE_TOKENS, geo.head_dim
    positions = (3, t) if geo.mrope_section is not None else (t,)
    inputs = [
        torch.empty(t, geo.qkv_width, dtype=dtype),
        torch.empty(*positions, dtype=torch.int64),
        torch.empty(EXAMPLE_POSITIONS, geo.rotary_dim, dtype=dtype),
    ]
    if with_norm:
        inputs += [torch.empty(d, dtype=dtype) for _ in range(2 if geo.num_kv_heads else 1)]
    return inputs


#: Targets that start a per-head RMSNorm (after an optional fp32 cast): how a q-only layer's
#: per-head view of q is told from other per-head views.
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
RESHAPE_OPS = (torch.ops.aten.reshape.default, torch.ops.aten.view.default)


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
        if node.op != "call_function" or node.target not in RESHAPE_OPS or len(node.args) != 2:
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


def joint_graph_treatment(gm: torch.fx.GraphModule) -> None:
    """Inductor's joint-graph passes (no-op removal, view folding, ...), which every graph got
    before the post-grad custom pass: a pattern must be spelled as they left the graph (a
    gated q's ``reshape -> view`` pair folds to the copy alone)."""
    from torch._inductor import config
    from torch._inductor.fx_passes.joint_graph import joint_graph_passes

    # Inductor's own passes only: a user's joint-graph passes are not for pattern traces.
    with config.patch(joint_custom_pre_pass=None, joint_custom_post_pass=None):
        joint_graph_passes(gm)


def trace_views(fn, args, *extra, **kwargs) -> torch.fx.GraphModule:
    """``fwd_only`` with canonical reshape sizes (the graph as an aot_autograd backend sees it)."""
    gm = pm.fwd_only(fn, args, *extra, **kwargs)
    canonicalize_reshapes(gm.graph)
    gm.recompile()
    return gm


def trace(fn, args, *extra, **kwargs) -> torch.fx.GraphModule:
    """``fwd_only``, then the joint-graph passes and the view -> reshape rewrite Inductor applies
    before custom passes, with canonical reshape sizes."""
    from torch._inductor.fx_passes.post_grad import view_to_reshape

    gm = pm.fwd_only(fn, args, *extra, **kwargs)
    joint_graph_treatment(gm)
    view_to_reshape(gm)
    canonicalize_reshapes(gm.graph)
    gm.recompile()
    return gm


def trace_aot(fn, args, *extra, **kwargs) -> torch.fx.GraphModule:
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


def fake_mode():
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
