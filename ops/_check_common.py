"""What the two compile checks (``ascend_lowering``, ``cuda_compile``) share."""

from __future__ import annotations

import os
import sys

from . import settings

_KERNEL_MODULE = "vllm_ascend_ext.ops.split_qkv_rmsnorm_rope"


def refuse_interpreted_kernel() -> bool:
    """Turn the Triton interpreter off for this process; if the kernel was already imported under
    it, say so on stderr and return True (the caller exits 2).

    The interpreter replaces the kernel with a Python object that cannot be compiled; a compile
    check must see the kernel before Triton's interpreter flag does.
    """
    interpreted = settings.triton_interpret()
    os.environ.pop(settings.TRITON_INTERPRET, None)
    if interpreted and _KERNEL_MODULE in sys.modules:
        print("the kernel was imported under TRITON_INTERPRET=1; run this check without it", file=sys.stderr)
        return True
    return False


def first_error(exc: Exception) -> str:
    """The first line that says something: a crashed tool's own message, else the exception's."""
    stderr = getattr(exc, "stderr", None)
    if isinstance(stderr, bytes):
        for line in stderr.decode(errors="replace").splitlines():
            if line.strip() and not line.lstrip().startswith("#") and "Stack dump" not in line:
                return line.strip()
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
