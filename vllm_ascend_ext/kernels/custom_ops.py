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
an op name from it (the AscendC ops of :mod:`vllm_ascend_ext.kernels.ascendc` use it too).

Every op has a fake implementation, so they trace under ``torch.compile`` and FakeTensorMode;
it runs the op's one validator (:func:`vllm_ascend_ext.ops.validation.split_qkv_rmsnorm_rope`,
through :func:`validate_fake` for symbolic sizes) first, so a call the real op rejects is
rejected while tracing too, with the same ``ValueError`` naming the argument (the KV-cache
op: :func:`validate_kv_cache_fake`). The real implementations, for the CPU, CUDA and
PrivateUse1 (Ascend NPU) dispatch keys, hand their ``locals()`` to :func:`vllm_ascend_ext.kernels.impl.run`
with ``functional=True``: the route cached per launch-cache key (the Triton op or the AscendC
kernel, as ``VLLM_ASCEND_EXT_IMPL`` selects; the cache write too: AscendC serves ``nhd``/``nz``
caches of qkv's dtype or int8) returns the schema's outputs itself, ``[T, 0]`` tensors shared per
token count where nothing is returned, no view of qkv made. Nothing here synchronises the host
with the device.

Importing this module registers the ops once per process; it imports nothing from vLLM.
"""

from __future__ import annotations

import sys

import torch

from . import impl
from ..ops import validation
from .schema import (ARGS_SCHEMA, DISPATCH_KEYS, FEATURES, FUNCTIONAL_SCHEMA, INPLACE_OP_NAME, INPLACE_SCHEMA,
                     KV_CACHE_OP_NAME, KV_CACHE_SCHEMA, NAMESPACE, ONE_TENSOR_LAYOUTS, OP_NAME, TP_NORM_OP_NAME,
                     TP_NORM_SCHEMA, fake_outputs, schemas, traced_example, validate_fake, validate_kv_cache_fake,
                     value_cache_of)

# The schema and fake-side names are re-exported (vllm_ascend_ext.kernels.schema holds them).
__all__ = [
    "ARGS_SCHEMA",
    "FEATURES",
    "fake_outputs",
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
    "already_defined",
]

# The real implementations take the Python API's arguments in its order (``inplace`` too, which
# the schemas leave out), so that their ``locals()`` is the call's arguments by name, keyed as the
# API's (one route per key, whichever way the call came); ``impl.run`` is looked up per call
# (instrumentation, tests/integration/run_tiny.py, may wrap it).
def _functional_impl(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim,
                     eps=1e-6, *, is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0, inplace=False,
                     mrope_section=None, mrope_interleaved=False, q_gate=False, v_norm=False):
    return impl.run(OP_NAME, locals(), functional=True)


def _inplace_impl(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim,
                  eps=1e-6, *, is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0, inplace=True,
                  mrope_section=None, mrope_interleaved=False, q_gate=False, v_norm=False):
    impl.run(OP_NAME, locals(), functional=True)


def _kv_cache_impl(qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache, slot_mapping,
                   num_q_heads, num_kv_heads, head_dim, eps=1e-6, *, cache_layout="nhd", k_scale=None, v_scale=None,
                   return_kv=False, is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0, inplace=False,
                   mrope_section=None, mrope_interleaved=False, q_gate=False, v_norm=False):
    value_cache = value_cache_of(key_cache, value_cache, cache_layout)
    return impl.run(KV_CACHE_OP_NAME, locals(), functional=True)


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
    args = dict(qkv=qkv, q_weight=q_weight, k_weight=k_weight, cos_sin_cache=cos_sin_cache, positions=positions,
                num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, eps=eps, tp_size=tp_size,
                all_reduce=tp_all_reduce(tp_size), is_neox=is_neox)
    return impl.run(TP_NORM_OP_NAME, args, functional=True)[:2]


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
    ex = traced_example
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


def already_defined(name: str) -> bool:
    return hasattr(getattr(torch.ops, NAMESPACE), name)


# Module import happens once per process; the guard keeps an importlib.reload (or a second copy
# of the package on sys.path) from redefining the schema.
_LIBRARY = None if already_defined(OP_NAME) else _register()


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
