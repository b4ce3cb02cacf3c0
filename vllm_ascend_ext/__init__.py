"""vllm-ascend-ext: Ascend-tuned fused kernels for vLLM.

``vllm_ascend_ext.ops`` holds the Triton kernels (importable without vLLM). This module imports
nothing from vLLM, vllm-ascend or torch_npu at import time.
"""

__version__ = "0.1.0"
