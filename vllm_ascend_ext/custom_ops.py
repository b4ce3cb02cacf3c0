"""The fused prologue as torch custom ops: what a compiled graph calls.

Two ops are registered in the ``vllm_ascend_ext`` namespace, with the schema written out so
that the mutation semantics are explicit:

``torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope`` (functional)::

    split_qkv_rmsnorm_rope(Tensor qkv, Tensor? q_weight, Tensor? k_weight,
                           Tensor cos_sin_cache, Tensor positions, int num_q_heads,
                           int num_kv_heads, int head_dim, float eps=1e-06, *,
                           bool is_neox=True, Tensor? q_bias=None, Tensor? k_bias=None,
                           float weight_offset=0.0) -> (Tensor q, Tensor k)

    Returns new ``q`` ``[T, Hq*D]`` and ``k`` ``[T, Hkv*D]``; nothing is mutated. ``v`` is not
    an output: it is ``qkv[:, (Hq + Hkv) * D:]``, a view the caller slices itself (an op output
    may not alias an input, and copying V would waste a read and a write of it).

``torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope_`` (in place)::

    split_qkv_rmsnorm_rope_(Tensor(a!) qkv, ...same arguments...) -> ()

    Writes the normalised, rotated q and k back into their columns of ``qkv``; V's columns are
    neither read nor written.

Both have a fake (meta) implementation, so they trace under ``torch.compile`` and
FakeTensorMode, and real implementations for the CPU, CUDA and PrivateUse1 (Ascend NPU)
dispatch keys. All three run the Triton kernel of :mod:`vllm_ascend_ext.ops` (through the
interpreter on CPU, when ``TRITON_INTERPRET=1``), or what :mod:`vllm_ascend_ext.impl` selects
when that selector is installed. Nothing here synchronises the host with the device.

Importing this module registers the ops once per process; it imports nothing from vLLM.
"""

from __future__ import annotations

import importlib

import torch

__all__ = ["NAMESPACE", "OP_NAME", "INPLACE_OP_NAME", "functional_op", "inplace_op", "kernel"]

NAMESPACE = "vllm_ascend_ext"
OP_NAME = "split_qkv_rmsnorm_rope"
INPLACE_OP_NAME = OP_NAME + "_"

_ARGS = (
    "Tensor? q_weight, Tensor? k_weight, Tensor cos_sin_cache, Tensor positions, "
    "int num_q_heads, int num_kv_heads, int head_dim, float eps=1e-06, *, bool is_neox=True, "
    "Tensor? q_bias=None, Tensor? k_bias=None, float weight_offset=0.0"
)
FUNCTIONAL_SCHEMA = f"{OP_NAME}(Tensor qkv, {_ARGS}) -> (Tensor, Tensor)"
INPLACE_SCHEMA = f"{INPLACE_OP_NAME}(Tensor(a!) qkv, {_ARGS}) -> ()"

#: Dispatch keys with a real implementation. PrivateUse1 is the key torch_npu's "npu" device uses.
DISPATCH_KEYS = ("CPU", "CUDA", "PrivateUse1")


def kernel():
    """The implementation of the fused prologue the ops call.

    ``vllm_ascend_ext.impl.select_split_qkv_rmsnorm_rope`` (the Triton/AscendC selector, env
    ``VLLM_ASCEND_EXT_IMPL``) when that module exists, else the Triton op
    :func:`vllm_ascend_ext.ops.split_qkv_rmsnorm_rope`. Both share the Python signature of the
    Triton op.
    """
    try:
        impl = importlib.import_module("vllm_ascend_ext.impl")
    except ModuleNotFoundError as exc:
        if exc.name != "vllm_ascend_ext.impl":
            raise
        impl = None
    select = getattr(impl, "select_split_qkv_rmsnorm_rope", None) if impl is not None else None
    if select is not None:
        return select()
    from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope

    return split_qkv_rmsnorm_rope


def _columns(num_q_heads: int, num_kv_heads: int, head_dim: int) -> tuple[int, int]:
    return num_q_heads * head_dim, num_kv_heads * head_dim


def _functional_impl(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads,
                     num_kv_heads, head_dim, eps=1e-6, *, is_neox=True, q_bias=None,
                     k_bias=None, weight_offset=0.0):
    q, k, _ = kernel()(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads,
                       num_kv_heads, head_dim, eps, is_neox=is_neox, q_bias=q_bias,
                       k_bias=k_bias, weight_offset=weight_offset, inplace=False)
    return q, k


def _inplace_impl(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads,
                  num_kv_heads, head_dim, eps=1e-6, *, is_neox=True, q_bias=None,
                  k_bias=None, weight_offset=0.0):
    kernel()(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads,
             head_dim, eps, is_neox=is_neox, q_bias=q_bias, k_bias=k_bias,
             weight_offset=weight_offset, inplace=True)


def _functional_fake(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads,
                     num_kv_heads, head_dim, eps=1e-6, *, is_neox=True, q_bias=None,
                     k_bias=None, weight_offset=0.0):
    q_cols, kv_cols = _columns(num_q_heads, num_kv_heads, head_dim)
    tokens = qkv.shape[0]
    return qkv.new_empty((tokens, q_cols)), qkv.new_empty((tokens, kv_cols))


def _inplace_fake(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads,
                  num_kv_heads, head_dim, eps=1e-6, *, is_neox=True, q_bias=None,
                  k_bias=None, weight_offset=0.0):
    return None


def _register() -> torch.library.Library:
    """Define both ops and their implementations (once per process)."""
    lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    lib.define(FUNCTIONAL_SCHEMA)
    lib.define(INPLACE_SCHEMA)
    for key in DISPATCH_KEYS:
        lib.impl(OP_NAME, _functional_impl, key)
        lib.impl(INPLACE_OP_NAME, _inplace_impl, key)
    torch.library.register_fake(f"{NAMESPACE}::{OP_NAME}", _functional_fake, lib=lib)
    torch.library.register_fake(f"{NAMESPACE}::{INPLACE_OP_NAME}", _inplace_fake, lib=lib)
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
