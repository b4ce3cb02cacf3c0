"""Triton kernels of vllm-ascend-ext, one op a file; importable without vLLM.

The ops are imported on first use, so ``vllm_ascend_ext.ops.tiling``, ``.device`` and
``.models`` work where Triton is absent (an NPU served by the AscendC fallback, say).
"""

__all__ = ["split_qkv_rmsnorm_rope"]


def __getattr__(name):
    if name == "split_qkv_rmsnorm_rope":
        from .split_qkv_rmsnorm_rope import split_qkv_rmsnorm_rope as op

        # Importing the submodule bound its name on this package to the module: bind the op.
        globals()[name] = op
        return op
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
