"""Launching one compiled Triton kernel cheaply, across the Triton versions we run on.

``kernel[grid](**kwargs)`` (``JITFunction.run``) binds and specialises every argument on every
call (~40 here) before it finds the compiled kernel: a third of our host time per call. A
:class:`BoundKernel` is made once per launch-cache entry and plan: it compiles the kernel for
the entry's constexprs and specialisation, keeps the argument list as a template, and per call
fills in the tensors' addresses and the run-time integers, then calls the compiled kernel's
launcher directly (``CompiledKernel.run``: grid, stream, function, metadata, hooks, arguments in
the kernel's order, constexprs included).

That direct path exists where :func:`direct_unavailable_reason` says so:

* Triton 3.6 and 3.7 on CUDA (``triton.knobs``, ``JITFunction.warmup`` returning the compiled
  kernel, whose launcher takes every argument in order): direct.
* Triton's interpreter (CPU tests): the plain path, ``kernel[grid](**kwargs)``.
* triton-ascend 3.2 (Triton 3.2's runtime: no ``knobs``, a launcher that takes only the
  non-constexpr arguments, and an NPU launcher we cannot run here): the plain path. The same
  design would apply there; it is not verified on an NPU, so it is not taken.
* A launch hook installed (``triton.knobs.runtime.launch_enter_hook``, profilers such as proton):
  the plain path for that call, so the hook sees every launch.

Either way the op's validation, plans and keys are cached (:mod:`.launch_cache`); only the last
step differs. A call whose tensors are less aligned than the ones the kernel was specialised for
(Triton assumes 16-byte alignment where it saw it) takes the plain path, which compiles that
specialisation.
"""

from __future__ import annotations

import importlib.metadata

import triton

__all__ = ["BoundKernel", "direct_unavailable_reason", "interpreted", "launch_hooked"]

_PLAIN_REASON: str | None = None
_runtime_knobs = None  # triton.knobs.runtime where it exists (Triton 3.4+)


def launch_hooked() -> bool:
    """Whether a launch hook is installed (``knobs.runtime.launch_enter_hook``: ``None`` or an
    empty ``HookChain`` when none is; Triton 3.6 always has the chain)."""
    hook = _runtime_knobs.launch_enter_hook
    return hook is not None and getattr(hook, "calls", True) != []


def interpreted(kernel) -> bool:
    """Whether ``kernel`` runs through Triton's interpreter (chosen by Triton when the kernel
    was defined, from ``TRITON_INTERPRET`` as it was then)."""
    return type(kernel).__name__ == "InterpretedFunction"


def _runtime_reason() -> str | None:
    try:
        importlib.metadata.distribution("triton-ascend")
        return "triton-ascend (Triton 3.2's launcher, not verified on an NPU)"
    except importlib.metadata.PackageNotFoundError:
        pass
    knobs = getattr(triton, "knobs", None)
    if knobs is None or not hasattr(knobs, "runtime"):
        return f"Triton {triton.__version__} has no triton.knobs (the direct launch needs Triton 3.6 or 3.7)"
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime.jit import JITFunction

    if not hasattr(JITFunction, "warmup") or not hasattr(CompiledKernel, "_init_handles"):
        return f"Triton {triton.__version__}'s JITFunction/CompiledKernel lack warmup/_init_handles"
    return None


def direct_unavailable_reason(kernel=None) -> str | None:
    """Why a kernel is launched through ``kernel[grid](...)`` rather than directly (``None``:
    direct). ``kernel``: the ``@triton.jit`` function, to tell the interpreter."""
    global _PLAIN_REASON, _runtime_knobs
    if kernel is not None and interpreted(kernel):
        return "Triton's interpreter runs the kernel"
    if _PLAIN_REASON is None:
        _PLAIN_REASON = _runtime_reason() or ""
        if not _PLAIN_REASON:
            _runtime_knobs = triton.knobs.runtime
    return _PLAIN_REASON or None


class _Direct:
    """The compiled kernel and the argument template of :class:`BoundKernel`'s direct path."""

    __slots__ = ("aligned", "device", "function", "packed", "ptr_slots", "run", "runtime_slots", "stream",
                 "template", "used")

    def __init__(self, kernel, tensors: dict[str, int], kwargs: dict, grid: int, runtime: tuple[str, ...],
                 sources: tuple):
        from triton.runtime import driver

        compiled = kernel.warmup(grid=(grid,), **kwargs)
        compiled._init_handles()
        names = list(kernel.arg_names)
        self.template = [kwargs[name] for name in names]
        self.ptr_slots = tuple((names.index(name), index) for name, index in tensors.items())
        self.runtime_slots = tuple(names.index(name) for name in runtime)
        self.used = tuple(sorted(set(tensors.values())))
        # The sources the kernel was specialised as 16-byte aligned: a later call must match.
        self.aligned = tuple(i for i in self.used if not sources[i].data_ptr() & 15)
        self.run = compiled.run
        self.function = compiled.function
        self.packed = compiled.packed_metadata
        self.device = driver.active.get_current_device()
        self.stream = driver.active.get_current_stream


class BoundKernel:
    """One ``@triton.jit`` kernel at one set of constexprs and launch options, for many calls.

    Parameters
    ----------
    kernel : triton.runtime.JITFunction
        The kernel.
    tensors : dict of str to int
        Each pointer argument's source: an index into ``sources``.
    scalars : dict
        Every other argument by name (integers, floats, constexprs) and the launch options
        (``num_warps``...), as the first call has them.
    sources : tuple of torch.Tensor or None
        The first call's tensors, in the op's order; later calls pass theirs in the same order.
    runtime : tuple of str
        Names of the integer arguments that change from call to call (the token count...).
    grid : int
        The first call's grid (programs along axis 0).
    """

    def __init__(self, kernel, tensors: dict[str, int], scalars: dict, sources: tuple, runtime: tuple[str, ...],
                 grid: int):
        self._kernel = kernel
        self._tensors = tensors
        self._template = dict(scalars)
        self._runtime = runtime
        self.direct_reason = direct_unavailable_reason(kernel)
        self._direct = None
        if self.direct_reason is None:
            kwargs = dict(scalars)
            kwargs.update((name, sources[i]) for name, i in tensors.items())
            self._direct = _Direct(kernel, tensors, kwargs, grid, runtime, sources)

    @property
    def direct(self) -> bool:
        """Whether calls go straight to the compiled kernel's launcher."""
        return self._direct is not None

    def __call__(self, grid: int, sources: tuple, runtime_values: tuple) -> None:
        """Launch on ``grid`` programs with this call's ``sources`` and run-time integers."""
        d = self._direct
        if d is not None and not launch_hooked():
            ptrs = [0] * len(sources)
            for i in d.used:
                ptrs[i] = sources[i].data_ptr()
            misaligned = 0
            for i in d.aligned:
                misaligned |= ptrs[i]
            if not misaligned & 15:
                args = d.template.copy()
                for pos, i in d.ptr_slots:
                    args[pos] = ptrs[i]
                for pos, value in zip(d.runtime_slots, runtime_values):
                    args[pos] = value
                d.run(grid, 1, 1, d.stream(d.device), d.function, d.packed, None, None, None, *args)
                return
        kwargs = self._template.copy()
        for name, i in self._tensors.items():
            kwargs[name] = sources[i]
        kwargs.update(zip(self._runtime, runtime_values))
        self._kernel[(grid,)](**kwargs)
