"""The fused prologue as torch custom ops: what a compiled graph calls.

Four ops are registered in the ``vllm_ascend_ext`` namespace, with the schema written out so
that the mutation semantics are explicit:

``torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope`` (functional)::

    split_qkv_rmsnorm_rope(Tensor qkv, Tensor? q_weight, Tensor? k_weight,
                           Tensor cos_sin_cache, Tensor positions, int num_q_heads,
                           int num_kv_heads, int head_dim, float eps=1e-06, *,
                           bool is_neox=True, Tensor? q_bias=None, Tensor? k_bias=None,
                           float weight_offset=0.0, int[]? mrope_section=None,
                           bool mrope_interleaved=False, bool q_gate=False,
                           bool v_norm=False) -> (Tensor q, Tensor k, Tensor v, Tensor gate)

    Returns new ``q`` ``[T, Hq*D]`` and ``k`` ``[T, Hkv*D]``; nothing is mutated. ``v`` is
    ``[T, Hkv*D]`` normalised with ``v_norm``, and ``[T, 0]`` otherwise: then v is qkv's last
    ``Hkv*D`` columns, a view the caller slices itself (an op output may not alias an input,
    and copying V would waste a read and a write of it). ``gate`` is ``[T, Hq*D]`` with
    ``q_gate``, else ``[T, 0]``.

``torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope_`` (in place)::

    split_qkv_rmsnorm_rope_(Tensor(a!) qkv, ...same arguments...) -> ()

    Writes the normalised, rotated q and k (and with ``v_norm`` the normalised v) back into
    their columns of ``qkv``; otherwise V's columns are neither read nor written. ``q_gate``
    is refused here (the validator's rule: a gated q written in place is no ``[T, Hq*D]``).
    The dispatcher does not bump ``qkv``'s autograd version counter for a custom ``(a!)`` op;
    the implementation does, so a graph that saved ``qkv`` refuses to
    backpropagate after the write instead of computing a wrong gradient.

``torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope_kv_cache`` (writes the paged KV cache)::

    split_qkv_rmsnorm_rope_kv_cache(Tensor qkv, Tensor? q_weight, Tensor? k_weight,
                                    Tensor cos_sin_cache, Tensor positions,
                                    Tensor(a!) key_cache, Tensor(b!)? value_cache,
                                    Tensor slot_mapping, int num_q_heads, int num_kv_heads,
                                    int head_dim, float eps=1e-06, *, str cache_layout="nhd",
                                    Tensor? k_scale=None, Tensor? v_scale=None,
                                    bool return_kv=False, ...the prologue's keywords...)
                                    -> (Tensor q, Tensor k, Tensor v, Tensor gate)

    :func:`vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_kv_cache`: writes k and v into the slots
    of ``slot_mapping`` of the caches (nothing else of them) and returns a new ``q``; ``k`` is
    ``[T, Hkv*D]`` with ``return_kv``, else ``[T, 0]``; ``v`` is ``[T, Hkv*D]`` only with
    ``return_kv`` and ``v_norm`` (else the caller slices it from qkv, as above), ``gate`` as
    above. ``value_cache`` is ``None`` exactly for ``cache_layout="cpu_vec"``, whose one tensor
    holds k and v and is passed as ``key_cache`` alone (:func:`value_cache_of`): one tensor as
    both ``(a!)`` and ``(b!)`` would contradict the schema, and ``auto_functionalized`` v1 (the
    form vLLM 0.32 compiles with) would clone the two apart and lose one half's write.

``torch.ops.vllm_ascend_ext.split_qkv_tp_rmsnorm_rope`` (q/k norm across all heads and TP ranks)::

    split_qkv_tp_rmsnorm_rope(Tensor qkv, Tensor q_weight, Tensor k_weight, Tensor cos_sin_cache,
                              Tensor positions, int num_q_heads, int num_kv_heads, int head_dim,
                              float eps, int tp_size, bool is_neox) -> (Tensor q, Tensor k)

    :func:`vllm_ascend_ext.ops.split_qkv_tp_rmsnorm_rope` (MiniMax-M2): new ``q`` and ``k``; ``v``
    is qkv's last ``Hkv*D`` columns, which the caller slices. The head counts and weights are
    this rank's. The ``[T, 2]`` sums go through :func:`tp_all_reduce`: vLLM's TP group when it is
    initialised with ``tp_size`` ranks, else torch.distributed's default group of that size.

The argument list is spelled once, :data:`ARGS_SCHEMA`, from pieces the KV-cache op's schema
reuses; :func:`schemas` builds both schemas of
an op name from it (the AscendC ops of :mod:`vllm_ascend_ext.ascendc` use it too).

Every op has a fake implementation, so they trace under ``torch.compile`` and FakeTensorMode;
it runs the op's one validator (:func:`vllm_ascend_ext.ops.validation.split_qkv_rmsnorm_rope`,
through :func:`validate_fake` for symbolic sizes) first, so a call the real op rejects is
rejected while tracing too, with the same ``ValueError`` naming the argument (the KV-cache
op: :func:`validate_kv_cache_fake`). The real implementations, for the CPU, CUDA and
PrivateUse1 (Ascend NPU) dispatch keys, call :func:`vllm_ascend_ext.impl.split_qkv_rmsnorm_rope`
(or ``..._kv_cache``): the Triton op or the AscendC kernel, as ``VLLM_ASCEND_EXT_IMPL`` selects
(the cache write too: AscendC serves ``nhd``/``nz`` caches of qkv's dtype or int8). Nothing here
synchronises the host with the device.

Importing this module registers the ops once per process; it imports nothing from vLLM.
"""

from __future__ import annotations

import sys

import torch

from . import impl
from .ops import validation

__all__ = [
    "ARGS_SCHEMA",
    "DISPATCH_KEYS",
    "FUNCTIONAL_SCHEMA",
    "INPLACE_OP_NAME",
    "INPLACE_SCHEMA",
    "KV_CACHE_OP_NAME",
    "KV_CACHE_SCHEMA",
    "ONE_TENSOR_LAYOUTS",
    "NAMESPACE",
    "OP_NAME",
    "TP_NORM_OP_NAME",
    "TP_NORM_SCHEMA",
    "functional_op",
    "inplace_op",
    "kv_cache_op",
    "schemas",
    "tp_all_reduce",
    "tp_norm_op",
    "validate_fake",
    "validate_kv_cache_fake",
    "value_cache_of",
]

NAMESPACE = "vllm_ascend_ext"
OP_NAME = "split_qkv_rmsnorm_rope"
INPLACE_OP_NAME = OP_NAME + "_"

# The pieces of the argument list: the prologue's tensors, its geometry, its keyword arguments.
_TENSORS_SCHEMA = "Tensor? q_weight, Tensor? k_weight, Tensor cos_sin_cache, Tensor positions"
_GEOMETRY_SCHEMA = "int num_q_heads, int num_kv_heads, int head_dim, float eps=1e-06"
_KEYWORDS_SCHEMA = (
    "bool is_neox=True, Tensor? q_bias=None, Tensor? k_bias=None, float weight_offset=0.0, "
    "int[]? mrope_section=None, bool mrope_interleaved=False, bool q_gate=False, bool v_norm=False"
)

#: The arguments after ``qkv`` of every op of this family (functional, in place, AscendC).
ARGS_SCHEMA = f"{_TENSORS_SCHEMA}, {_GEOMETRY_SCHEMA}, *, {_KEYWORDS_SCHEMA}"

#: The keyword arguments after ``weight_offset``: the optional variants (issue 10), passed through
#: as they are to the one validator and the implementations.
FEATURES = ("mrope_section", "mrope_interleaved", "q_gate", "v_norm")


def schemas(name: str) -> tuple[str, str]:
    """The functional and in-place schemas of op ``name`` (the in-place one is ``name + "_"``).

    Parameters
    ----------
    name : str
        The functional op's name, without namespace.

    Returns
    -------
    functional, inplace : str
        ``name(Tensor qkv, ARGS) -> (Tensor, Tensor, Tensor, Tensor)`` (q, k, v, gate) and
        ``name_(Tensor(a!) qkv, ARGS) -> ()``, with :data:`ARGS_SCHEMA` as ``ARGS``.
    """
    return (f"{name}(Tensor qkv, {ARGS_SCHEMA}) -> (Tensor, Tensor, Tensor, Tensor)",
            f"{name}_(Tensor(a!) qkv, {ARGS_SCHEMA}) -> ()")


FUNCTIONAL_SCHEMA, INPLACE_SCHEMA = schemas(OP_NAME)

KV_CACHE_OP_NAME = "split_qkv_rmsnorm_rope_kv_cache"
#: The layout whose one cache tensor holds both k and v: the custom op takes it as ``key_cache``
#: alone (``value_cache=None``), so no tensor is passed as two mutable arguments.
ONE_TENSOR_LAYOUTS = ("cpu_vec",)
#: The prologue fused with the paged KV-cache write: the prologue's arguments, with the caches
#: and slots after its tensors and the cache keywords before its keywords.
KV_CACHE_SCHEMA = (
    f"{KV_CACHE_OP_NAME}(Tensor qkv, {_TENSORS_SCHEMA}, Tensor(a!) key_cache, Tensor(b!)? value_cache, "
    f"Tensor slot_mapping, {_GEOMETRY_SCHEMA}, *, str cache_layout=\"nhd\", Tensor? k_scale=None, "
    f"Tensor? v_scale=None, bool return_kv=False, {_KEYWORDS_SCHEMA}) -> (Tensor, Tensor, Tensor, Tensor)"
)

TP_NORM_OP_NAME = "split_qkv_tp_rmsnorm_rope"
#: MiniMax-M2's q/k norm across all heads and TP ranks, then RoPE: q and k out, v left to the caller.
TP_NORM_SCHEMA = (
    f"{TP_NORM_OP_NAME}(Tensor qkv, Tensor q_weight, Tensor k_weight, Tensor cos_sin_cache, Tensor positions, "
    "int num_q_heads, int num_kv_heads, int head_dim, float eps, int tp_size, bool is_neox) -> (Tensor, Tensor)"
)

#: Dispatch keys with a real implementation. PrivateUse1 is the key torch_npu's "npu" device uses.
DISPATCH_KEYS = ("CPU", "CUDA", "PrivateUse1")


def _functional_impl(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads,
                     num_kv_heads, head_dim, eps=1e-6, *, is_neox=True, q_bias=None,
                     k_bias=None, weight_offset=0.0, **features):
    # Looked up on the module per call: instrumentation (tests/integration/run_tiny.py) may wrap it.
    outputs = impl.split_qkv_rmsnorm_rope(
        qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps,
        is_neox=is_neox, q_bias=q_bias, k_bias=k_bias, weight_offset=weight_offset, inplace=False,
        **features)
    v_norm, q_gate = features.get("v_norm", False), features.get("q_gate", False)
    tokens = qkv.shape[0]
    return (outputs[0], outputs[1], outputs[2] if v_norm else qkv.new_empty((tokens, 0)),
            outputs[3] if q_gate else qkv.new_empty((tokens, 0)))


def _inplace_impl(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads,
                  num_kv_heads, head_dim, eps=1e-6, *, is_neox=True, q_bias=None,
                  k_bias=None, weight_offset=0.0, **features):
    impl.split_qkv_rmsnorm_rope(
        qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps,
        is_neox=is_neox, q_bias=q_bias, k_bias=k_bias, weight_offset=weight_offset, inplace=True,
        **features)


def value_cache_of(key_cache, value_cache, cache_layout):
    """The value cache the op writes: ``value_cache``, or for a one-tensor layout
    (:data:`ONE_TENSOR_LAYOUTS`, where the custom op takes ``value_cache=None``) ``key_cache``.

    A tensor passed as two mutable arguments (``Tensor(a!) key_cache, Tensor(b!) value_cache``)
    is not what the schema declares, and functionalization treats the two as independent:
    ``auto_functionalized`` v1 (vLLM 0.32 sets inductor's ``enable_auto_functionalized_v2`` to
    False) clones each, runs the op on the clones and copies both back, so the second copy
    overwrites the first's write. Hence one argument, and a rule on arguments (not on storage,
    which fake tensors cannot compare), the same for the real and the fake implementation.

    Raises
    ------
    ValueError
        Naming ``value_cache``: ``None`` for a layout of two caches, or a tensor for a one-tensor
        layout.
    """
    one_tensor = cache_layout in ONE_TENSOR_LAYOUTS
    if value_cache is None:
        if not one_tensor:
            raise ValueError(f"value_cache is required for cache_layout={cache_layout!r} (None is for "
                             f"{', '.join(ONE_TENSOR_LAYOUTS)}, whose one tensor is key_cache)")
        return key_cache
    if one_tensor:
        raise ValueError(f"value_cache must be None for cache_layout={cache_layout!r}: its one cache tensor is "
                         "passed as key_cache alone (one tensor as two mutable arguments would be "
                         "functionalized as two, and one half's write lost)")
    return value_cache


def _kv_cache_impl(qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache, slot_mapping,
                   num_q_heads, num_kv_heads, head_dim, eps=1e-6, *, cache_layout="nhd", k_scale=None,
                   v_scale=None, return_kv=False, **prologue):
    value_cache = value_cache_of(key_cache, value_cache, cache_layout)
    outputs = impl.split_qkv_rmsnorm_rope_kv_cache(
        qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache, slot_mapping, num_q_heads,
        num_kv_heads, head_dim, eps, cache_layout=cache_layout, k_scale=k_scale, v_scale=v_scale,
        return_kv=return_kv, inplace=False, **prologue)
    v_norm, q_gate = prologue.get("v_norm", False), prologue.get("q_gate", False)
    tokens = qkv.shape[0]
    # Fresh empties where nothing is returned: the op's [T, 0] k and v are one tensor, and an
    # output may not alias another (nor an input: v without v-norm is a view of qkv).
    return (outputs[0], outputs[1] if return_kv else qkv.new_empty((tokens, 0)),
            outputs[2] if return_kv and v_norm else qkv.new_empty((tokens, 0)),
            outputs[3] if q_gate else qkv.new_empty((tokens, 0)))


def tp_all_reduce(tp_size: int):
    """The all-reduce ``split_qkv_tp_rmsnorm_rope`` sums its ``[T, 2]`` partial sums with.

    ``None`` at ``tp_size == 1`` (no collective); else vLLM's ``get_tp_group().all_reduce`` when
    vLLM's TP group is initialised (read from ``sys.modules``: vLLM is never imported here) with
    ``tp_size`` ranks; else ``torch.distributed``'s default group when it is initialised with
    ``tp_size`` ranks. Nothing here initialises a group.

    Raises
    ------
    ValueError
        Naming ``tp_size``, when it is above 1 and no such group exists.
    """
    if tp_size == 1:
        return None
    parallel_state = sys.modules.get("vllm.distributed.parallel_state")
    group = getattr(parallel_state, "_TP", None)
    if group is not None and getattr(group, "world_size", None) == tp_size:
        return group.all_reduce
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() == tp_size:
        return dist.group.WORLD
    sizes = []
    if group is not None:
        sizes.append(f"vLLM's TP group has {getattr(group, 'world_size', '?')} ranks")
    if dist.is_available() and dist.is_initialized():
        sizes.append(f"torch.distributed's default group has {dist.get_world_size()}")
    raise ValueError(f"tp_size={tp_size} but no process group of that size is initialised"
                     + (f" ({'; '.join(sizes)})" if sizes else " (neither vLLM's TP group nor torch.distributed's)"))


def _tp_norm_impl(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps,
                  tp_size, is_neox):
    q, k, _ = impl.split_qkv_tp_rmsnorm_rope(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads,
                                             num_kv_heads, head_dim, eps, tp_size=tp_size,
                                             all_reduce=tp_all_reduce(tp_size), is_neox=is_neox)
    return q, k


def _hint(value) -> int:
    """A size or stride as an int: a symbolic one's example value (read, no guard added)."""
    if isinstance(value, torch.SymInt):
        hint = value.node.hint
        if hint is None:  # unbacked: no example value to validate with
            raise ValueError(f"split_qkv_rmsnorm_rope: a data-dependent size ({value}) cannot be validated")
        return int(hint)
    return value


def _traced_example(tensor):
    """``tensor``, or where its sizes or strides are symbolic a same-device stand-in of the traced
    example's sizes (the validator reads sizes as ints; the real implementation still validates
    every call at run time)."""
    if not isinstance(tensor, torch.Tensor):
        return tensor
    sizes, strides = tuple(tensor.shape), tensor.stride()
    if not any(isinstance(v, torch.SymInt) for v in (*sizes, *strides)):
        return tensor
    stand_in = tensor.new_empty_strided([_hint(v) for v in sizes], [_hint(v) for v in strides])
    return stand_in.requires_grad_() if tensor.requires_grad else stand_in


def validate_fake(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim,
                  eps=1e-6, *, is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0,
                  inplace=False, **features) -> validation.Call:
    """The op's one validator as a fake implementation runs it.

    :func:`vllm_ascend_ext.ops.validation.split_qkv_rmsnorm_rope` on the same arguments, except
    that a tensor with symbolic sizes (``torch.compile`` with dynamic shapes) is validated through
    a stand-in of the traced example's sizes: the validator reads sizes as ints, and validating
    the example adds no guard to the graph. Calls are validated again when they run.

    Returns
    -------
    vllm_ascend_ext.ops.validation.Call
        Its ``num_tokens`` is the example's; a fake output takes ``qkv.shape[0]`` instead.

    Raises
    ------
    ValueError
        As the validator does, naming the argument.
    """
    ex = _traced_example
    return validation.split_qkv_rmsnorm_rope(
        ex(qkv), ex(q_weight), ex(k_weight), ex(cos_sin_cache), ex(positions), num_q_heads, num_kv_heads,
        head_dim, eps, is_neox=is_neox, q_bias=ex(q_bias), k_bias=ex(k_bias), weight_offset=weight_offset,
        inplace=inplace, **features)


def validate_kv_cache_fake(qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache,
                           slot_mapping, num_q_heads, num_kv_heads, head_dim, eps=1e-6, *, cache_layout="nhd",
                           k_scale=None, v_scale=None, return_kv=False, **prologue) -> validation.Call:
    """:func:`validate_fake` for the custom op ``split_qkv_rmsnorm_rope_kv_cache``:
    :func:`value_cache_of`, then the op's one validator
    (:func:`vllm_ascend_ext.ops.validation.split_qkv_rmsnorm_rope_kv_cache`), tensors of symbolic
    sizes validated through stand-ins of the traced example's sizes (one stand-in for a one-tensor
    layout's cache, passed as both caches).

    Raises
    ------
    ValueError
        As the validator does, naming the argument.
    """
    value_cache = value_cache_of(key_cache, value_cache, cache_layout)
    stand_ins: dict[int, object] = {}

    def ex(tensor):
        if id(tensor) not in stand_ins:
            stand_ins[id(tensor)] = _traced_example(tensor)
        return stand_ins[id(tensor)]

    prologue = {name: ex(value) for name, value in prologue.items()}
    return validation.split_qkv_rmsnorm_rope_kv_cache(
        ex(qkv), ex(q_weight), ex(k_weight), ex(cos_sin_cache), ex(positions), ex(key_cache), ex(value_cache),
        ex(slot_mapping), num_q_heads, num_kv_heads, head_dim, eps, cache_layout=cache_layout, k_scale=ex(k_scale),
        v_scale=ex(v_scale), return_kv=return_kv, **prologue)


def fake_outputs(qkv: torch.Tensor, shape, *, return_kv: bool = True) -> tuple:
    """Empty ``(q, k, v, gate)`` of the functional op's sizes for ``shape`` (a ``KernelShape``):
    what every fake implementation of the family returns (``return_kv=False``: the KV-cache op's
    k and v, ``[T, 0]``)."""
    tokens = qkv.shape[0]
    q_cols, kv_cols = shape.num_q_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    return (qkv.new_empty((tokens, q_cols)), qkv.new_empty((tokens, kv_cols if return_kv else 0)),
            qkv.new_empty((tokens, kv_cols if return_kv and shape.v_norm else 0)),
            qkv.new_empty((tokens, q_cols if shape.q_gate else 0)))


def _functional_fake(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads,
                     num_kv_heads, head_dim, eps=1e-6, *, is_neox=True, q_bias=None,
                     k_bias=None, weight_offset=0.0, **features):
    shape = validate_fake(
        qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps,
        is_neox=is_neox, q_bias=q_bias, k_bias=k_bias, weight_offset=weight_offset, inplace=False,
        **features).shape
    return fake_outputs(qkv, shape)


def _inplace_fake(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads,
                  num_kv_heads, head_dim, eps=1e-6, *, is_neox=True, q_bias=None,
                  k_bias=None, weight_offset=0.0, **features):
    validate_fake(
        qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps,
        is_neox=is_neox, q_bias=q_bias, k_bias=k_bias, weight_offset=weight_offset, inplace=True,
        **features)
    return None


def _kv_cache_fake(qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache, slot_mapping,
                   num_q_heads, num_kv_heads, head_dim, eps=1e-6, *, cache_layout="nhd", k_scale=None,
                   v_scale=None, return_kv=False, **prologue):
    shape = validate_kv_cache_fake(
        qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache, slot_mapping, num_q_heads,
        num_kv_heads, head_dim, eps, cache_layout=cache_layout, k_scale=k_scale, v_scale=v_scale,
        return_kv=return_kv, inplace=False, **prologue).shape
    return fake_outputs(qkv, shape, return_kv=return_kv)


def _tp_norm_fake(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps,
                  tp_size, is_neox):
    # The one validator, on the traced example's sizes; the group is the real call's to find, so
    # a stand-in callable satisfies the validator's "all_reduce required above TP 1".
    ex = _traced_example
    shape = validation.split_qkv_tp_rmsnorm_rope(
        ex(qkv), ex(q_weight), ex(k_weight), ex(cos_sin_cache), ex(positions), num_q_heads, num_kv_heads, head_dim,
        eps, tp_size=tp_size, all_reduce=None if tp_size == 1 else _no_collective, is_neox=is_neox).shape
    tokens = qkv.shape[0]
    return (qkv.new_empty((tokens, shape.num_q_heads * shape.head_dim)),
            qkv.new_empty((tokens, shape.num_kv_heads * shape.head_dim)))


def _no_collective(tensor):  # pragma: no cover - never called: it only satisfies the validator
    return tensor


def _register() -> torch.library.Library:
    """Define the ops and their implementations (once per process)."""
    lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    ops = ((OP_NAME, FUNCTIONAL_SCHEMA, _functional_impl, _functional_fake),
           (INPLACE_OP_NAME, INPLACE_SCHEMA, _inplace_impl, _inplace_fake),
           (KV_CACHE_OP_NAME, KV_CACHE_SCHEMA, _kv_cache_impl, _kv_cache_fake),
           (TP_NORM_OP_NAME, TP_NORM_SCHEMA, _tp_norm_impl, _tp_norm_fake))
    for name, schema, real, fake in ops:
        lib.define(schema)
        for key in DISPATCH_KEYS:
            lib.impl(name, real, key)
        torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=lib)
    return lib


def _already_defined(name: str) -> bool:
    return hasattr(getattr(torch.ops, NAMESPACE), name)


# Module import happens once per process; the guard keeps an importlib.reload (or a second copy
# of the package on sys.path) from redefining the schema.
_LIBRARY = None if _already_defined(OP_NAME) else _register()


def functional_op():
    """``torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope.default``."""
    return getattr(torch.ops, NAMESPACE).split_qkv_rmsnorm_rope.default


def inplace_op():
    """``torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope_.default``."""
    return getattr(torch.ops, NAMESPACE).split_qkv_rmsnorm_rope_.default


def kv_cache_op():
    """``torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope_kv_cache.default``."""
    return getattr(torch.ops, NAMESPACE).split_qkv_rmsnorm_rope_kv_cache.default


def tp_norm_op():
    """``torch.ops.vllm_ascend_ext.split_qkv_tp_rmsnorm_rope.default``."""
    return getattr(torch.ops, NAMESPACE).split_qkv_tp_rmsnorm_rope.default
