"""The argument checks every validator shares (``ops/validation.py``, ``ops/validation_mla.py``):
counts, flags, finite scalars, tensors on the call's device, weight vectors, quantisation scales.
Each raises ``ValueError`` naming the argument. A leaf: torch only."""

from __future__ import annotations

import math
import numbers
import operator

import torch

#: Activation and weight dtypes the ops serve.
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Position dtypes.
POSITION_DTYPES = (torch.int32, torch.int64)
#: The kernel takes ``eps`` and ``weight_offset`` as fp32: larger magnitudes would become inf.
FP32_MAX = float(torch.finfo(torch.float32).max)


def count_arg(name: str, value, least: int = 1) -> int:
    """An integer of at least ``least`` (Python or numpy integers; not bools, not floats)."""
    what = "a positive int" if least == 1 else f"an int >= {least}"
    if type(value) is int and value >= least:  # the common case, without the ABC checks below
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    value = operator.index(value)
    if value < least:
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return value


def flag_arg(name: str, value) -> bool:
    """A real boolean (``bool`` or numpy's ``bool_``): a string such as ``"false"`` is refused."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise ValueError(f"{name} must be a bool, got {value!r}")


def finite_arg(name: str, value, *, non_negative: bool = False) -> float:
    """A real number that stays finite as the kernel's fp32 argument."""
    if type(value) is not float and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise ValueError(f"{name} must be a finite float, got {value!r}")
    try:
        result = float(value)
    except OverflowError:
        result = math.inf
    if not math.isfinite(result) or abs(result) > FP32_MAX:
        raise ValueError(f"{name} must be a finite float within fp32's range, got {value!r}")
    if non_negative and result < 0:
        raise ValueError(f"{name} must be a finite non-negative float, got {value!r}")
    return result


def tensor_arg(name: str, tensor, device) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(tensor).__name__}")
    if device is not None and tensor.device != device:
        raise ValueError(f"{name} is on {tensor.device}, qkv on {device}")
    if tensor.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{name} requires grad, and split_qkv_rmsnorm_rope has no backward: call it "
                         f"under torch.no_grad() or torch.inference_mode(), or pass {name}.detach()")
    return tensor


def vector_arg(name: str, tensor, length: int, device) -> None:
    tensor_arg(name, tensor, device)
    if tensor.dim() != 1 or tensor.shape[0] != length:
        raise ValueError(f"{name} must have shape [{length}], got {list(tensor.shape)}")
    if tensor.dtype not in DTYPES:
        raise ValueError(f"{name} must be bf16, fp16 or fp32, got {tensor.dtype}")
    if tensor.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous")


def scale_arg(name: str, scale, device, per_channel_len: int | None) -> bool:
    """One fp32 value, or (``per_channel_len``) one per channel; returns whether per channel."""
    tensor_arg(name, scale, device)
    if scale.dtype != torch.float32:
        raise ValueError(f"{name} must be fp32, got {scale.dtype}")
    if scale.numel() == 1:
        return False
    if per_channel_len is not None and scale.dim() == 1 and scale.shape[0] == per_channel_len:
        if scale.stride(0) != 1:
            raise ValueError(f"{name} must be contiguous")
        return True
    per = f" or [{per_channel_len}] (num_kv_heads*head_dim, per channel)" if per_channel_len else ""
    raise ValueError(f"{name} must hold one value{per}, got shape {list(scale.shape)}")

