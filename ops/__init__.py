"""Triton kernels of vllm-ascend-ext, one op a file; importable without vLLM."""

from .split_qkv_rmsnorm_rope import split_qkv_rmsnorm_rope

__all__ = ["split_qkv_rmsnorm_rope"]
