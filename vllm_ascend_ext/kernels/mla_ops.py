"""The MLA prologue as torch custom ops (DeepSeek-V2/V3, Kimi-K2; issue 30): what a compiled graph calls.

Two ops are registered in the ``vllm_ascend_ext`` namespace, beside those of
:mod:`vllm_ascend_ext.kernels.custom_ops`, with the schema written out once (:data:`MLA_SCHEMA`,
:data:`Q_ROPE_SCHEMA`):

``torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope_mla`` (functional, except for the cache)::

    split_qkv_rmsnorm_rope_mla(Tensor qkv_lora, Tensor? q_a_weight, Tensor kv_a_weight,
                               Tensor? cos_sin_cache, Tensor? positions, int q_lora_rank,
                               int kv_lora_rank, int rope_dim, float eps=1e-06, *,
                               bool is_neox=False, Tensor(c!)? q=None, Tensor(a!)? kv_cache=None,
                               Tensor(b!)? rope_cache=None, Tensor? slot_mapping=None,
                               str kv_cache_dtype="auto", Tensor? k_scale=None,
                               str cache_layout="nd", bool split_cache=False)
                               -> (Tensor q_c, Tensor kv_c_normed, Tensor k_pe)

    :func:`vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_mla`: new ``q_c [T, q_lora_rank]``,
    ``kv_c_normed [T, kv_lora_rank]``, ``k_pe [T, rope_dim]``. With ``kv_cache`` the cache rows of
    ``slot_mapping`` are written; with ``q`` (no q latent only) its rotary lanes are rotated in
    place, as ``mla_q_rope_`` would (the implementation bumps its version counter, as
    ``mla_q_rope_``'s does); nothing else is mutated. vLLM's combined cache ``[num_blocks,
    block_size, kv_lora_rank + rope_dim]`` is ``kv_cache`` alone (``split_cache=False``);
    vllm-ascend's pair is ``kv_cache`` (the latent, "nope" cache) and ``rope_cache``
    (``split_cache=True``; ``rope_cache`` ``None`` only with ``rope_dim == 0``), in
    ``cache_layout`` ``"nd"`` or ``"nz"``. Two tensors, two mutable arguments: one tensor passed as
    both would be functionalised as two and one write lost (see
    :func:`vllm_ascend_ext.kernels.custom_ops.value_cache_of`).

``torch.ops.vllm_ascend_ext.mla_q_rope_`` (in place on q)::

    mla_q_rope_(Tensor(a!) q, Tensor cos_sin_cache, Tensor positions, int rope_dim, *,
                bool is_neox=False) -> ()

    :func:`vllm_ascend_ext.ops.mla_q_rope_`: ``q [T, H, D]`` after ``q_b_proj``, its last
    ``rope_dim`` lanes of every head rotated in place; ``q[..., :D - rope_dim]`` untouched. The
    implementation bumps ``q``'s autograd version counter (the dispatcher does not for a custom
    ``(a!)`` op), as the GQA in-place op does.

Each op has a fake implementation that runs the op's one validator
(:func:`vllm_ascend_ext.ops.validation_mla.split_qkv_rmsnorm_rope_mla`,
:func:`~vllm_ascend_ext.ops.validation_mla.mla_q_rope_`) on the traced example's sizes (symbolic sizes
through :func:`vllm_ascend_ext.kernels.schema.traced_example`), so a call the real op refuses is
refused while tracing, with the same ``ValueError``. The real implementations (CPU, CUDA,
PrivateUse1) call the Triton ops; nothing here synchronises the host.

Importing this module registers the ops once per process; it imports nothing from vLLM.
"""

from __future__ import annotations

import torch

from . import custom_ops, schema
from ..ops import validation_mla

__all__ = ["MLA_OP_NAME", "MLA_SCHEMA", "Q_ROPE_OP_NAME", "Q_ROPE_SCHEMA", "cache_argument", "mla_op",
           "q_rope_op"]

MLA_OP_NAME = "split_qkv_rmsnorm_rope_mla"
Q_ROPE_OP_NAME = "mla_q_rope_"

#: The MLA prologue's schema (written once; the glue op of :mod:`vllm_ascend_ext.passes.mla_fusion` reuses
#: its argument list).
MLA_ARGS_SCHEMA = (
    "Tensor qkv_lora, Tensor? q_a_weight, Tensor kv_a_weight, Tensor? cos_sin_cache, Tensor? positions, "
    "int q_lora_rank, int kv_lora_rank, int rope_dim, float eps=1e-06, *, bool is_neox=False, Tensor(c!)? q=None")
MLA_CACHE_SCHEMA = (
    "Tensor(a!)? kv_cache=None, Tensor(b!)? rope_cache=None, Tensor? slot_mapping=None, "
    "str kv_cache_dtype=\"auto\", Tensor? k_scale=None, str cache_layout=\"nd\", bool split_cache=False")
MLA_SCHEMA = f"{MLA_OP_NAME}({MLA_ARGS_SCHEMA}, {MLA_CACHE_SCHEMA}) -> (Tensor, Tensor, Tensor)"
Q_ROPE_SCHEMA = (f"{Q_ROPE_OP_NAME}(Tensor(a!) q, Tensor cos_sin_cache, Tensor positions, int rope_dim, *, "
                 "bool is_neox=False) -> ()")


def cache_argument(kv_cache, rope_cache, split_cache: bool):
    """The op's ``kv_cache`` argument from the custom op's two: ``kv_cache`` (vLLM's combined
    cache, ``split_cache=False``), the pair ``(kv_cache, rope_cache)`` (``split_cache=True``), or
    ``None`` without a cache.

    Raises
    ------
    ValueError
        Naming ``rope_cache`` when it is given for the combined form, or ``kv_cache`` when a rope
        cache or ``split_cache`` comes without it.
    """
    if kv_cache is None:
        if rope_cache is not None or split_cache:
            raise ValueError("kv_cache is required with rope_cache or split_cache=True")
        return None
    if not split_cache:
        if rope_cache is not None:
            raise ValueError("rope_cache is only used with split_cache=True (vllm-ascend's (nope, rope) pair); "
                             "vLLM's combined cache is kv_cache alone")
        return kv_cache
    return (kv_cache, rope_cache)


def _mla_impl(qkv_lora, q_a_weight, kv_a_weight, cos_sin_cache, positions, q_lora_rank, kv_lora_rank, rope_dim,
              eps=1e-6, *, is_neox=False, q=None, kv_cache=None, rope_cache=None, slot_mapping=None,
              kv_cache_dtype="auto", k_scale=None, cache_layout="nd", split_cache=False):
    from ..ops import split_qkv_rmsnorm_rope_mla  # Triton is imported at the first call, not here

    outputs = split_qkv_rmsnorm_rope_mla(
        qkv_lora, q_a_weight, kv_a_weight, cos_sin_cache, positions, q_lora_rank, kv_lora_rank, rope_dim, eps,
        is_neox=is_neox, kv_cache=cache_argument(kv_cache, rope_cache, split_cache), slot_mapping=slot_mapping,
        kv_cache_dtype=kv_cache_dtype, k_scale=k_scale, cache_layout=cache_layout, q=q)
    if q is not None and q.shape[0] and not q.is_inference():
        torch.autograd.graph.increment_version(q)
    return outputs


def validate_mla_fake(qkv_lora, q_a_weight, kv_a_weight, cos_sin_cache, positions, q_lora_rank, kv_lora_rank,
                      rope_dim, eps=1e-6, *, is_neox=False, q=None, kv_cache=None, rope_cache=None,
                      slot_mapping=None, kv_cache_dtype="auto", k_scale=None, cache_layout="nd",
                      split_cache=False) -> validation_mla.MLACall:
    """The op's one validator as the fake implementation runs it (tensors of symbolic sizes
    through stand-ins of the traced example's sizes).

    Raises
    ------
    ValueError
        As the validator does, naming the argument.
    """
    ex = schema.traced_example
    cache = cache_argument(ex(kv_cache), ex(rope_cache), split_cache)
    return validation_mla.split_qkv_rmsnorm_rope_mla(
        ex(qkv_lora), ex(q_a_weight), ex(kv_a_weight), ex(cos_sin_cache), ex(positions), q_lora_rank, kv_lora_rank,
        rope_dim, eps, is_neox=is_neox, kv_cache=cache, slot_mapping=ex(slot_mapping),
        kv_cache_dtype=kv_cache_dtype, k_scale=ex(k_scale), cache_layout=cache_layout, q=ex(q))


def mla_fake(qkv_lora, q_a_weight, kv_a_weight, cos_sin_cache, positions, q_lora_rank, kv_lora_rank, rope_dim,
              eps=1e-6, **keywords):
    shape = validate_mla_fake(qkv_lora, q_a_weight, kv_a_weight, cos_sin_cache, positions, q_lora_rank,
                              kv_lora_rank, rope_dim, eps, **keywords).shape
    tokens = qkv_lora.shape[0]
    return (qkv_lora.new_empty((tokens, shape.q_lora_rank)), qkv_lora.new_empty((tokens, shape.kv_lora_rank)),
            qkv_lora.new_empty((tokens, shape.rope_dim)))


def _q_rope_impl(q, cos_sin_cache, positions, rope_dim, *, is_neox=False):
    from ..ops import mla_q_rope_

    mla_q_rope_(q, cos_sin_cache, positions, rope_dim, is_neox=is_neox)
    if q.shape[0] and not q.is_inference():
        torch.autograd.graph.increment_version(q)


def _q_rope_fake(q, cos_sin_cache, positions, rope_dim, *, is_neox=False):
    ex = schema.traced_example
    validation_mla.mla_q_rope_(ex(q), ex(cos_sin_cache), ex(positions), rope_dim, is_neox=is_neox)


def _register() -> torch.library.Library:
    lib = torch.library.Library(custom_ops.NAMESPACE, "FRAGMENT")
    for name, op_schema, real, fake in ((MLA_OP_NAME, MLA_SCHEMA, _mla_impl, mla_fake),
                                     (Q_ROPE_OP_NAME, Q_ROPE_SCHEMA, _q_rope_impl, _q_rope_fake)):
        lib.define(op_schema)
        for key in custom_ops.DISPATCH_KEYS:
            lib.impl(name, real, key)
        torch.library.register_fake(f"{custom_ops.NAMESPACE}::{name}", fake, lib=lib)
    return lib


# Once per process (a reload or a second copy of the package must not redefine the schemas).
_LIBRARY = None if custom_ops.already_defined(MLA_OP_NAME) else _register()


def mla_op():
    """``torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope_mla.default``."""
    return getattr(torch.ops, custom_ops.NAMESPACE).split_qkv_rmsnorm_rope_mla.default


def q_rope_op():
    """``torch.ops.vllm_ascend_ext.mla_q_rope_.default``."""
    return getattr(torch.ops, custom_ops.NAMESPACE).mla_q_rope_.default
