"""Triton kernels of vllm-ascend-ext, one op a file; importable without vLLM.

The ops are imported on first use, so ``vllm_ascend_ext.ops.tiling``, ``.device`` and
``.models`` work where Triton is absent (an NPU served by the AscendC fallback, say).

Each op is named as its module (``ops/<op>.py`` holds ``<op>``). Python binds a submodule's name
on its package when the submodule is imported, which would shadow the op with its module (the
KV-cache op's module imports the prologue's); the package keeps each op's name bound to the op
function instead, so ``from vllm_ascend_ext.ops import <op>`` is always the function. The
modules themselves are ``sys.modules["vllm_ascend_ext.ops.<op>"]`` (``importlib.import_module``).
"""

import importlib
import sys
import types

__all__ = ["mla_q_rope_", "split_qkv_rmsnorm_rope", "split_qkv_rmsnorm_rope_kv_cache", "split_qkv_rmsnorm_rope_mla",
           "split_qkv_tp_rmsnorm_rope"]

#: Ops that live in another op's module (the variant of its kernel): name -> module.
_HOME = {"mla_q_rope_": "split_qkv_rmsnorm_rope_mla"}


class _OpsPackage(types.ModuleType):
    def __setattr__(self, name, value):
        if name in __all__ and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)
        for op, home in _HOME.items():  # bound with their module's op
            if name == home:
                super().__setattr__(op, getattr(sys.modules[f"{__name__}.{home}"], op))


sys.modules[__name__].__class__ = _OpsPackage


def __getattr__(name):
    if name in __all__:
        importlib.import_module(f".{_HOME.get(name, name)}", __name__)  # binds the op's name (see the class above)
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
