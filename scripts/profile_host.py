"""Where a call's host time goes: cProfile of the op at T = 1, and the primitives it is made of.

    python -P scripts/profile_host.py [--model Qwen3-8B] [--calls 2000] [--top 25] [--compiled]

Prints the primitives' cost per call (tensor allocation, a view, ``data_ptr``, the stream query,
a launch-cache key) and the profile of ``split_qkv_rmsnorm_rope`` called directly, sorted by own
time: the probe behind the host-path decisions in docs/performance.md. ``--compiled``: instead,
a ``torch.compile``\\ d function calling the custom op (as ``bench --host`` times it), profiled. Needs the package
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
    parser.add_argument("--compiled", action="store_true", help="profile a compiled function calling the custom op")
    args = parser.parse_args()

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
