"""Build script: the package ``vllm_ascend_ext`` with ``ops/`` installed as ``vllm_ascend_ext.ops``."""

from setuptools import setup

setup(
    name="vllm-ascend-ext",
    version="0.1.0",
    description="Fused split-QKV + q/k RMSNorm + RoPE for vLLM on Ascend NPUs (and CUDA)",
    python_requires=">=3.9",
    packages=["vllm_ascend_ext", "vllm_ascend_ext.ops", "vllm_ascend_ext.ops.tiling"],
    package_dir={
        "vllm_ascend_ext": "vllm_ascend_ext",
        "vllm_ascend_ext.ops": "ops",
        "vllm_ascend_ext.ops.tiling": "ops/tiling",
    },
    install_requires=["torch>=2.5", "numpy"],
)
