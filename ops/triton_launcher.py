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


def _unit(source) -> tuple[int, int]:
    """A pointer argument's source as ``(index, column)`` (an index alone is column 0)."""
    return (source, 0) if isinstance(source, int) else tuple(source)


class _Direct:
    """The compiled kernel and the argument template of :class:`BoundKernel`'s direct path.

    Per call only the addresses (one per distinct source and column) and the run-time integers
    change; everything else is the template. :attr:`launch` is a function written for this
    template (:func:`_launch_function`): it reads each source's address once, checks the
    alignment the kernel was specialised for and calls the launcher with every argument in
    place, with no list built or copied per call."""

    __slots__ = ("aligned", "device", "function", "launch", "packed", "ptr_slots", "run", "runtime_slots",
                 "stream", "template", "units")

    def __init__(self, kernel, tensors: dict, kwargs: dict, grid: int, runtime: tuple[str, ...], sources: tuple):
        from triton.runtime import driver

        compiled = kernel.warmup(grid=(grid,), **kwargs)
        compiled._init_handles()
        names = list(kernel.arg_names)
        self.template = [kwargs[name] for name in names]
        units = sorted({_unit(source) for source in tensors.values()})
        # (source index, byte offset) per distinct address; the column's bytes from the source's dtype.
        self.units = tuple((i, column * sources[i].element_size()) for i, column in units)
        self.ptr_slots = tuple((names.index(name), units.index(_unit(source))) for name, source in tensors.items())
        self.runtime_slots = tuple(names.index(name) for name in runtime)
        # The addresses the kernel was specialised as 16-byte aligned: a later call must match.
        self.aligned = tuple(j for j, (i, offset) in enumerate(self.units)
                             if not (sources[i].data_ptr() + offset) & 15)
        self.run = compiled.run
        self.function = compiled.function
        self.packed = compiled.packed_metadata
        self.device = driver.active.get_current_device()
        self.stream = driver.active.get_current_stream
        self.launch = _launch_function(self)


def _launch_function(d: _Direct):
    """``launch(grid, sources, runtime_values) -> bool``: one direct launch of ``d``'s kernel,
    ``False`` (nothing launched) when an address the kernel was specialised as 16-byte aligned is
    not. Written out for ``d``'s template (as Triton writes its own launchers): the template's
    constants are names in the function's globals, the addresses ``sN + offset``."""
    sources = sorted({i for i, _ in d.units})
    address = [f"s{i}" if not offset else f"(s{i} + {offset})" for i, offset in d.units]
    args = [f"c{pos}" for pos in range(len(d.template))]
    for pos, j in d.ptr_slots:
        args[pos] = address[j]
    for n, pos in enumerate(d.runtime_slots):
        args[pos] = f"runtime_values[{n}]"
    lines = ["def launch(grid, sources, runtime_values):"]
    lines += [f"    s{i} = sources[{i}].data_ptr()" for i in sources]
    if d.aligned:
        lines.append(f"    if ({' | '.join(address[j] for j in d.aligned)}) & 15:")
        lines.append("        return False")
    lines.append("    run(grid, 1, 1, stream(device), function, packed, None, None, None, " + ", ".join(args) + ")")
    lines.append("    return True")
    namespace = {"run": d.run, "stream": d.stream, "device": d.device, "function": d.function, "packed": d.packed}
    namespace.update((f"c{pos}", value) for pos, value in enumerate(d.template))
    exec(compile("\n".join(lines), f"<direct launch of {len(d.template)} arguments>", "exec"), namespace)
    return namespace["launch"]


class BoundKernel:
    """One ``@triton.jit`` kernel at one set of constexprs and launch options, for many calls.

    Parameters
    ----------
    kernel : triton.runtime.JITFunction
        The kernel.
    tensors : dict of str to int or (int, int)
        Each pointer argument's source: an index into ``sources``, or ``(index, column)`` for the
        address ``column`` elements into that 2-D source's rows (``source[:, column:]``, which the
        direct path never makes: it adds the bytes to the source's address).
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

    def __init__(self, kernel, tensors: dict, scalars: dict, sources: tuple, runtime: tuple[str, ...], grid: int):
        self._kernel = kernel
        self._tensors = {name: _unit(source) for name, source in tensors.items()}
        self._template = dict(scalars)
        self._runtime = runtime
        self.direct_reason = direct_unavailable_reason(kernel)
        self._direct = None
        if self.direct_reason is None:
            self._direct = _Direct(kernel, tensors, dict(scalars, **self._views(sources)), grid, runtime, sources)

    @property
    def direct(self) -> bool:
        """Whether calls go straight to the compiled kernel's launcher."""
        return self._direct is not None

    def _views(self, sources: tuple) -> dict:
        """The pointer arguments as tensors (the plain path's, and the first call's for the compile)."""
        return {name: sources[i] if column == 0 else sources[i][:, column:]
                for name, (i, column) in self._tensors.items()}

    def __call__(self, grid: int, sources: tuple, runtime_values: tuple) -> None:
        """Launch on ``grid`` programs with this call's ``sources`` and run-time integers."""
        d = self._direct
        if d is None or launch_hooked() or not d.launch(grid, sources, runtime_values):
            self._kernel[(grid,)](**self.kwargs(sources, runtime_values))

    def replay(self, grid: int, sources: tuple, runtime_values: tuple):
        """A callable that launches this call again with every argument fixed: the compiled
        kernel's launcher alone (its stream query included), what one launch costs the host below
        the op's Python (``vllm-ascend-ext bench --host``'s ``launch``); ``None`` off the direct
        path."""
        d = self._direct
        if d is None:
            return None
        args = d.template.copy()
        ptrs = [sources[i].data_ptr() + offset for i, offset in d.units]
        for pos, j in d.ptr_slots:
            args[pos] = ptrs[j]
        for pos, value in zip(d.runtime_slots, runtime_values):
            args[pos] = value
        run, function, packed, stream, device = d.run, d.function, d.packed, d.stream, d.device
        return lambda: run(grid, 1, 1, stream(device), function, packed, None, None, None, *args)

    def kwargs(self, sources: tuple, runtime_values: tuple) -> dict:
        """The kernel's keyword arguments for one call (tensors, scalars, constexprs and launch
        options), as ``kernel[grid](**kwargs)`` takes them."""
        kwargs = self._template.copy()
        kwargs.update(self._views(sources))
        kwargs.update(zip(self._runtime, runtime_values))
        return kwargs
