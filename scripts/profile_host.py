"""Where a call's host time goes: cProfile of the op at T = 1, and the primitives it is made of.

    python -P scripts/profile_host.py [--model Qwen3-8B] [--calls 2000] [--top 25]

Prints the primitives' cost per call (tensor allocation, a view, ``data_ptr``, the stream query,
a launch-cache key) and the profile of ``split_qkv_rmsnorm_rope`` called directly, sorted by own
time: the probe behind the host-path decisions in docs/performance.md. Needs the package
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
    args = parser.parse_args()

    from vllm_ascend_ext.bench.cases import make_inputs
    from vllm_ascend_ext.bench.host import per_call
    from vllm_ascend_ext.ops import launch_cache, split_qkv_rmsnorm_rope
    from vllm_ascend_ext.ops.models import model

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kwargs = make_inputs(model(args.model), 1, device)
    qkv = kwargs["qkv"]
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
        op = lambda: split_qkv_rmsnorm_rope(**kwargs)  # noqa: E731
        print(f"{'split_qkv_rmsnorm_rope (direct)':34s} {per_call(op, args.calls, 3, device):7.2f} us")
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.calls):
            op()
        profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
