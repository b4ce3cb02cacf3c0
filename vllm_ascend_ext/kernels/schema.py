"""The custom ops' schemas and fake-side validation, spelled once (leaf: no implementation here).

:mod:`vllm_ascend_ext.kernels.custom_ops` registers the ops with these schemas and
:mod:`vllm_ascend_ext.kernels.ascendc` its AscendC twins; both validate fake (traced) calls with
:func:`validate_fake` / :func:`validate_kv_cache_fake` and size fake outputs with
:func:`fake_outputs`. The schemas themselves are documented in :mod:`vllm_ascend_ext.kernels.custom_ops`.
"""

from __future__ import annotations

import torch

from ..ops import validation

__all__ = ["ARGS_SCHEMA", "DISPATCH_KEYS", "FEATURES", "FUNCTIONAL_SCHEMA", "INPLACE_OP_NAME", "INPLACE_SCHEMA",
           "KV_CACHE_OP_NAME", "KV_CACHE_SCHEMA", "NAMESPACE", "ONE_TENSOR_LAYOUTS", "OP_NAME", "TP_NORM_OP_NAME",
           "TP_NORM_SCHEMA", "fake_outputs", "hint", "schemas", "traced_example", "validate_fake",
           "validate_kv_cache_fake", "value_cache_of"]

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


def hint(value) -> int:
    """A size or stride as an int: a symbolic one's example value (read, no guard added)."""
    if isinstance(value, torch.SymInt):
        hint = value.node.hint
        if hint is None:  # unbacked: no example value to validate with
            raise ValueError(f"split_qkv_rmsnorm_rope: a data-dependent size ({value}) cannot be validated")
        return int(hint)
    return value


def traced_example(tensor):
    """``tensor``, or where its sizes or strides are symbolic a same-device stand-in of the traced
    example's sizes (the validator reads sizes as ints; the real implementation still validates
    every call at run time)."""
    if not isinstance(tensor, torch.Tensor):
        return tensor
    sizes, strides = tuple(tensor.shape), tensor.stride()
    if not any(isinstance(v, torch.SymInt) for v in (*sizes, *strides)):
        return tensor
    stand_in = tensor.new_empty_strided([hint(v) for v in sizes], [hint(v) for v in strides])
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
    ex = traced_example
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
            stand_ins[id(tensor)] = traced_example(tensor)
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
