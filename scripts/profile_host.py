"""Where a call's host time goes: cProfile of the op at T = 1, and the primitives it is made of.

    python -P scripts/profile_host.py [--model Qwen3-8B] [--calls 2000] [--top 25] [--compiled | --stub-launch]

Prints the primitives' cost per call (tensor allocation, a view, ``data_ptr``, the stream query,
a launch-cache key) and the profile of ``split_qkv_rmsnorm_rope`` called directly, sorted by own
time: the probe behind the host-path decisions in docs/performance.md. ``--compiled``: instead,
a ``torch.compile``\\ d function calling the custom op (as ``bench --host`` times it), profiled.
``--stub-launch`` (CPU, no GPU needed): Triton's compiled launcher replaced by a no-op, so that
every ``bench --host`` case's direct call runs our whole direct path (key, lookup, outputs, the
bound kernel's launch) around nothing: µs per call of each, then the profile; it first checks that
each launch passes the launcher what the bound template filled in one by one would. Needs the package
importable (``pip install -e .``, or ``PYTHONPATH`` on the layout ``scripts/gpu_tests.sh`` builds).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen3-8B")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--top", type=int, default=25)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--compiled", action="store_true", help="profile a compiled function calling the custom op")
    mode.add_argument("--stub-launch", action="store_true",
                      help="CPU: the direct path around a no-op launcher, every bench --host case")
    args = parser.parse_args()
    if args.stub_launch:
        _stub_launch(args.calls, args.top)
        return

    from vllm_ascend_ext.bench.cases import make_inputs
    from vllm_ascend_ext.bench.host import per_call
    from vllm_ascend_ext.ops import launch_cache, split_qkv_rmsnorm_rope
    from vllm_ascend_ext.ops.models import model

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kwargs = make_inputs(model(args.model), 1, device)
    qkv = kwargs["qkv"]
    if args.compiled:
        _profile(_compiled_call(kwargs), "compiled function with the custom op", args.calls, args.top, device)
        return
    with torch.inference_mode():
        primitives = {
            "qkv.new_empty((1, 4096))": lambda: qkv.new_empty((1, 4096)),
            "torch.empty(...)": lambda: torch.empty((1, 4096), dtype=qkv.dtype, device=device),
            "qkv[:, a:b]": lambda: qkv[:, 4096:5120],
            "qkv.narrow(1, a, n)": lambda: qkv.narrow(1, 4096, 1024),
            "qkv.data_ptr()": qkv.data_ptr,
            "tensor_key(qkv)": lambda: launch_cache.tensor_key(qkv),
            "torch.is_grad_enabled()": torch.is_grad_enabled,
        }
        if device.type == "cuda":
            from triton.runtime import driver

            stream = driver.active.get_current_stream
            primitives["driver get_current_stream(0)"] = lambda: stream(0)
            primitives["torch.cuda.current_stream()"] = torch.cuda.current_stream
        for name, fn in primitives.items():
            print(f"{name:34s} {per_call(fn, args.calls, 3, device):7.2f} us")
    _profile(lambda: split_qkv_rmsnorm_rope(**kwargs), "split_qkv_rmsnorm_rope (direct)", args.calls, args.top,
             device)


def _compiled_call(kwargs: dict):
    """A compiled function (no CUDA graph) calling the custom op on ``kwargs``, as a callable."""
    from vllm_ascend_ext.kernels import custom_ops  # noqa: F401  (registers the op)

    names = ("qkv", "q_weight", "k_weight", "cos_sin_cache", "positions", "num_q_heads", "num_kv_heads", "head_dim",
             "eps")
    positional = [kwargs[n] for n in names]
    keywords = {k: v for k, v in kwargs.items() if k not in names}

    def with_op(*positional):
        q, k, v, gate = torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope(*positional, **keywords)
        return positional[0] * 2, q

    compiled = torch.compile(with_op, dynamic=False)
    return lambda: compiled(*positional)


class _NoLaunch:
    """A compiled kernel whose launcher does nothing but keep its last arguments (``--stub-launch``)."""

    function, packed_metadata = 0, None
    last = None

    def _init_handles(self):
        pass

    def run(self, *args):
        _NoLaunch.last = args


def _same_arguments(direct) -> bool:
    """Whether each launch of one ``direct()`` call passes the launcher what the bound kernel's
    template filled in one by one passes it (``BoundKernel.replay``: the template, its addresses
    and run-time integers set in a loop)."""
    from vllm_ascend_ext.bench.host import each_launch

    same = []

    def compare(bound, grid, sources, runtime_values, launch):
        bound.replay(grid, sources, runtime_values)()
        expected = _NoLaunch.last
        launch(bound, grid, sources, runtime_values)
        same.append(_NoLaunch.last == expected)

    each_launch(direct, compare)
    return bool(same) and all(same)


def _stub_launch(calls: int, top: int) -> None:
    """Time and profile every ``bench --host`` case's direct call on CPU tensors with the direct
    launch taken and Triton's launcher a no-op (the kernels are never compiled or run)."""
    import importlib
    import os
    import types

    if torch.cuda.is_available():
        raise SystemExit("profile_host.py: --stub-launch is for a machine without a GPU")
    os.environ["TRITON_INTERPRET"] = "1"  # CPU tensors pass the ops' device check
    import triton.runtime

    from vllm_ascend_ext.ops import triton_launcher

    triton_launcher.direct_unavailable_reason = lambda kernel=None: None
    triton_launcher._runtime_knobs = triton.knobs.runtime
    triton.runtime.driver = types.SimpleNamespace(active=types.SimpleNamespace(
        get_current_device=lambda: 0, get_current_stream=lambda device: 0))
    for module, kernel in (("split_qkv_rmsnorm_rope", "split_qkv_rmsnorm_rope_kernel"),
                           ("split_qkv_rmsnorm_rope_mla", "mla_kernel"), ("split_qkv_tp_rmsnorm_rope", "sums_kernel")):
        getattr(importlib.import_module(f"vllm_ascend_ext.ops.{module}"), kernel).warmup = \
            lambda grid, **kwargs: _NoLaunch()
    from vllm_ascend_ext.bench import host

    device = torch.device("cpu")
    first = None
    with torch.inference_mode():
        for label, model, variant in host.CASES:
            direct = host._case(model, variant, device)[0]
            direct()
            first = first or direct
            if not _same_arguments(direct):
                raise SystemExit(f"profile_host.py: {label} {variant}: the direct launch's arguments differ from the "
                                 "template's")
            print(f"{label:24s} {host.OP_OF[variant]:34s} {host.per_call(direct, calls, 3, device):7.2f} us")
    _profile(first, "split_qkv_rmsnorm_rope (stubbed launch)", calls, top, device)


def _profile(op, label: str, calls: int, top: int, device: torch.device) -> None:
    """Print ``op``'s µs per call, then its cProfile over ``calls`` calls by own time."""
    from vllm_ascend_ext.bench.host import per_call

    with torch.inference_mode():
        print(f"{label:34s} {per_call(op, calls, 3, device):7.2f} us")
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(calls):
            op()
        profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(top)


if __name__ == "__main__":
    main()
