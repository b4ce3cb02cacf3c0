"""How the benchmark times: :class:`Timer` (CUDA-graph replays on CUDA), the launch floor (an empty
kernel), the copy bandwidth, and the same-bytes copy every row is held against.

On CUDA each call is captured in a CUDA graph and its replays are timed with
``triton.testing.do_bench`` (median, L2 flushed between replays); on an NPU with events, on the
CPU with the wall clock (the median of ``reps`` timings). The same-bytes copy is a plain Triton
copy kernel moving a row's bytes, timed the same way, launch included: what any kernel moving
those bytes could reach as measured here. Triton is imported when a kernel is first made.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Callable

import torch

__all__ = ["COPY_CONFIGS", "TIMINGS_PER_ROW", "Timer", "copy_bandwidth", "copy_calls", "copy_replay",
           "launch_floor", "triton_copy"]

#: (block, warps) of the copy kernel for :func:`copy_replay`; the faster one counts.
COPY_CONFIGS = ((2048, 4), (8192, 8))
#: Timings of every other provider in a row, the best counting: as many as the copy has
#: configurations, so both sides of a ratio to the copy are a best of two (with one timing of ours
#: against the copy's best of two, a v12 run read the gated layer at T = 8 1.31 against a copy
#: 0.4 us under the same run's copy at T = 1: docs/performance.md, v12).
TIMINGS_PER_ROW = len(COPY_CONFIGS)


class Timer:
    """Times one zero-argument callable on a device: microseconds per call."""

    def __init__(self, device: torch.device, reps: int):
        self.device = device
        self.reps = reps

    def __call__(self, fn: Callable[[], object], calls: int = 1) -> float:
        """Microseconds per call of ``fn``; ``calls`` calls run back to back per timing (on CUDA
        captured in one graph), the time divided by ``calls``."""
        if self.device.type == "cuda":
            import triton.testing

            fn()  # compile / warm up outside the graph
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(calls):
                    fn()
            return 1e3 * triton.testing.do_bench(graph.replay, warmup=25, rep=100, return_mode="median") / calls
        if self.device.type == "npu":  # pragma: no cover - needs an NPU
            fn()
            torch.npu.synchronize()
            times = []
            for _ in range(self.reps):
                start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
                start.record()
                for _ in range(calls):
                    fn()
                end.record()
                end.synchronize()
                times.append(1e3 * start.elapsed_time(end) / calls)
            return statistics.median(times)
        fn()
        times = []
        for _ in range(self.reps):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append(1e6 * (time.perf_counter() - start) / calls)
        return statistics.median(times)


def copy_bandwidth(device: torch.device, timer: Timer) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write) of a 1 GiB buffer (CUDA/NPU).

    The better of ``Tensor.copy_`` and a plain Triton copy kernel: on the H200 a captured
    ``copy_`` becomes a copy-engine memcpy that reached 2.7 TB/s where SM loads and stores reach
    4.2 (docs/performance.md, v1), and the floor must be what the SMs can do.
    """
    if device.type == "cpu":
        return float("nan")
    src = torch.empty(1 << 29, dtype=torch.int16, device=device).random_()
    dst = torch.empty_like(src)
    best = min(timer(lambda: dst.copy_(src)),
               timer(functools.partial(triton_copy, src, dst, 8192, 8)))
    return 2 * src.numel() * src.element_size() / (best * 1e-6)


def copy_calls(device: torch.device, nbytes: int) -> list[Callable[[], None]]:
    """The same-bytes copy as zero-argument callables, one per :data:`COPY_CONFIGS`: a plain Triton
    copy of ``nbytes`` (half read, half written) between two fresh int16 buffers on ``device``."""
    n = max(1, nbytes // 4)  # int16 elements: n read and n written
    src = torch.zeros(n, dtype=torch.int16, device=device)
    dst = torch.empty_like(src)
    return [functools.partial(triton_copy, src, dst, block, warps) for block, warps in COPY_CONFIGS]


def copy_replay(device: torch.device, timer: Timer, nbytes: int, calls: int = 1) -> float:
    """Microseconds of a plain Triton copy of ``nbytes`` (half read, half written), timed like
    every provider: launch, ramp-up and tail included, so a row can be held against what a
    kernel moving the same bytes reaches (CUDA/NPU; NaN on CPU); ``calls`` as :class:`Timer`'s."""
    if device.type == "cpu":
        return float("nan")
    return min(timer(fn, calls) for fn in copy_calls(device, nbytes))


def triton_copy(src: torch.Tensor, dst: torch.Tensor, block: int, warps: int) -> None:
    """``dst.copy_(src)`` through the plain Triton copy kernel, ``block`` elements a program."""
    import triton

    n = src.numel()
    _kernels()[1][(triton.cdiv(n, block),)](src, dst, n, BLOCK=block, num_warps=warps)


def launch_floor(device: torch.device, timer: Timer) -> float:
    """Microseconds of an empty Triton kernel, timed like every provider (graph replay on CUDA)."""
    if device.type == "cpu":
        return float("nan")
    buf = torch.empty(1, device=device)
    empty_kernel = _kernels()[0]
    return timer(lambda: empty_kernel[(1,)](buf))


@functools.lru_cache(maxsize=None)
def _kernels():
    """The empty and copy kernels, defined on first use (Triton is imported lazily)."""
    import triton
    import triton.language as tl

    @triton.jit
    def empty_kernel(ptr):
        pass

    @triton.jit
    def copy_kernel(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)

    return empty_kernel, copy_kernel
