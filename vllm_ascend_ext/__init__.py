"""vllm-ascend-ext: Ascend-tuned fused kernels for vLLM.

``vllm_ascend_ext.ops`` holds the Triton kernels (importable without vLLM). This module imports
nothing from vLLM, vllm-ascend or torch_npu at import time.
"""

__version__ = "0.1.0"


def register() -> None:
    """Entry point of the ``vllm.general_plugins`` group: hook the fused prologue into vLLM.

    Idempotent (vLLM loads plugins in every process, possibly more than once). Imports vLLM
    only when called, and nothing from vllm-ascend or torch_npu unless that platform is active.
    Declares our ``VLLM_*`` variables to vLLM; ``VLLM_ASCEND_EXT_FUSION=0`` turns the rest off,
    and a value of it that is not a boolean raises a ``ValueError`` naming it (vLLM then stops).
    See ``docs/vllm-integration.md``.
    """
    from .hook.vllm_integration import register as _register

    _register()
