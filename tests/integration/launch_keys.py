"""What a kernel launch makes Triton compile, recorded where our ops bind their kernels.

A helper module (``import launch_keys``; ``run_tiny`` imports it as ``tests.integration.launch_keys``).
:func:`recording` wraps the ``BoundKernel`` an op module binds its kernel with and records one
**compile key** per binding: the constexprs and launch options, each pointer's dtype and 16-byte
alignment, each other integer's Triton specialisation (``1``, a multiple of 16, or neither; the
kernel's ``do_not_specialize`` arguments left out) and each float's type. Two launches with one
key run the same compiled kernel (Triton's own cache key is finer only in what the device and
Triton's version add, which one process does not change).
"""

from __future__ import annotations

import contextlib

#: ``mla_kernel``'s ``@triton.jit(do_not_specialize=...)`` (the interpreter does not keep it).
MLA_DO_NOT_SPECIALIZE = ("num_tokens", "max_position")


def compile_key(tensors: dict, scalars: dict, sources: tuple, do_not_specialize=()) -> str:
    """The compile key (module notes) of a ``BoundKernel(kernel, tensors, scalars, sources, ...)``."""
    parts = []
    for name, index in sorted(tensors.items()):
        t = sources[index]
        parts.append(f"{name}:{t.dtype}:{'a16' if t.data_ptr() % 16 == 0 else 'a'}")
    for name, value in sorted(scalars.items()):
        if name in do_not_specialize:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or name.isupper() or name.startswith("num_"):
            parts.append(f"{name}={value!r}")  # constexprs and launch options
        elif isinstance(value, int):
            parts.append(f"{name}:{'1' if value == 1 else 'd16' if value % 16 == 0 else 'i'}")
        else:
            parts.append(f"{name}:f")
    return ",".join(parts)


@contextlib.contextmanager
def recording(module, keys: list, do_not_specialize=()):
    """Record into ``keys`` the compile key of every kernel ``module`` binds while inside."""
    original = module.BoundKernel

    def bound(kernel, tensors, scalars, sources, runtime, grid):
        keys.append(compile_key(tensors, scalars, sources, do_not_specialize))
        return original(kernel, tensors, scalars, sources, runtime=runtime, grid=grid)

    module.BoundKernel = bound
    try:
        yield keys
    finally:
        module.BoundKernel = original
