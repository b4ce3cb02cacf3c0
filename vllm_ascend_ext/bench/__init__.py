"""Benchmark of the fused prologue against the unfused eager and ``torch.compile`` paths.

For each geometry of ``ops.models.BENCH_GEOMETRIES`` and each token count it times three
providers on the detected device:

* ``eager``: the unfused prologue as vLLM runs it natively (split, view, RMSNorm in fp32 cast
  back, view, RoPE by ``index_select`` of the cache);
* ``compile``: ``torch.compile`` of that same code;
* ``ours``: ``vllm_ascend_ext.ops.split_qkv_rmsnorm_rope`` (out of place).

On CUDA each call is captured in a CUDA graph and its replays are timed with
``triton.testing.do_bench`` (median, L2 flushed between replays). The floor is the fewest bytes
the prologue must move (read q and k, write q and k, read one cos/sin row per token) over the
device-to-device copy bandwidth measured in the same run; the launch floor is an empty Triton
kernel replayed from a CUDA graph. Beside the floor each row has a reference: a plain Triton copy
kernel moving the same number of bytes, timed the same way (launch included), which is what any
kernel moving the prologue's bytes could reach as measured here. Before timing, every
provider's output is checked against the float64 reference of ``ops.reference`` on inputs from
its generator (``ops.reference.make_inputs``).

The second op, ``split_qkv_rmsnorm_rope_kv_cache`` (issue 11: the prologue writing k and v into
the paged KV cache), has a run of its own (:func:`run_kv_cache`, or :func:`run` with
``op=KV_OP``): per geometry and token count, a bf16 ``nhd`` cache of blocks of 16 with room for
twice the tokens, one random distinct slot a token, and four providers:

* ``ours_kv``: ``split_qkv_rmsnorm_rope_kv_cache`` (``return_kv=False``);
* ``ours+scatter``: the prologue op followed by :func:`scatter_kv`, a plain Triton scatter of k
  and v into the cache (the unfused baseline; both captured together);
* ``ours``: the prologue op alone;
* ``copy_kv``: a plain Triton copy of the fused op's fewest bytes (``bytes_moved(...,
  kv_cache=True)``: read q, k and v, write q and the cache lines), launch included.

Each is timed two ways on CUDA: one call per captured graph (as above), and ``AMORTISED_CALLS``
calls captured in one graph, divided by their number (what a layer pays inside a captured decode
step). ``ours_kv`` and ``ours+scatter`` are checked against the float64 reference and
``ops.reference.kv_cache_write`` (the whole cache: nothing else written).

On CPU the kernel runs through the Triton interpreter: the sizes are small and the timings
mean nothing for NPU or GPU speed; the run is a correctness and plumbing check.

The third op, ``split_qkv_tp_rmsnorm_rope`` (issue 12: q/k norm across all heads and TP ranks),
has a multi-rank mode (:func:`run_tp_ranks`, one spawned process per rank; :func:`run_tp` is one
rank's part): ``ours_tp`` (the op, all-reduce on the group), ``unfused_tp`` (:func:`unfused_tp`,
vLLM's PyTorch path) and ``copy+allreduce`` (the same-bytes copy plus a bare all-reduce of the
``[T, 2]`` fp32 sums), each rank checked against the float64 reference of its shard; on CUDA the
collective is captured in the CUDA graph (:class:`_TPTimer`). The command is
``scripts/bench_split_qkv_tp_rmsnorm_rope.py``.

This is a library: :func:`run` measures (reporting progress through a callback),
:func:`format_table`, :func:`bar_verdict`, :func:`check_rows` and :func:`write_outputs` present.
The command is ``vllm-ascend-ext bench`` (:mod:`vllm_ascend_ext.cli.bench`); this module never
imports the command line.
"""

from __future__ import annotations

import csv
import functools
import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

PROVIDERS = ("eager", "compile", "ours")
GPU_TOKENS = (1, 8, 64, 256, 1024, 4096, 16384)
CPU_TOKENS = (1, 8, 64)
#: The bar of issue 2, checked at the end of a CUDA run.
BAR_FLOOR_RATIO = 1.3  # ours <= 1.3 x floor for T >= BAR_LARGE_TOKENS
BAR_LAUNCH_RATIO = 1.3  # ours <= 1.3 x empty-kernel replay for T <= BAR_SMALL_TOKENS
BAR_LARGE_TOKENS = 4096
BAR_SMALL_TOKENS = 64
#: The bar of issue 10, against the same-bytes copy of the same run: ours <= 1.10 x the copy for
#: T >= BAR_LARGE_TOKENS and <= 1.25 x for T <= COPY_BAR_SMALL_TOKENS.
COPY_BAR_LARGE = 1.10
COPY_BAR_SMALL = 1.25
COPY_BAR_SMALL_TOKENS = 256
#: The ops the benchmark times and each one's providers (every provider, in table order).
OP = "split_qkv_rmsnorm_rope"
KV_OP = "split_qkv_rmsnorm_rope_kv_cache"
KV_PROVIDERS = ("ours_kv", "ours+scatter", "ours", "copy_kv")
MLA_OP = "split_qkv_rmsnorm_rope_mla"  # issue 30: its run is vllm_ascend_ext.bench_mla.run_mla
MLA_PROVIDERS = ("ours", "vllm", "copy")
OPS = {OP: PROVIDERS, KV_OP: KV_PROVIDERS, MLA_OP: MLA_PROVIDERS}
#: Providers whose outputs are checked against the float64 reference (``check_rows``).
CHECKED_PROVIDERS = ("ours", "ours_kv", "ours+scatter", "ours_tp")
#: The KV-cache run: block size of its ``nhd`` bf16 caches, and calls captured in one graph for
#: the amortised timing (``CPU_AMORTISED_CALLS`` through the interpreter).
KV_BLOCK_SIZE = 16
AMORTISED_CALLS = 20
CPU_AMORTISED_CALLS = 2
#: The bar of issue 11, both timing modes: at T <= BAR_SMALL_TOKENS ours_kv <= 1.15 x ours (the
#: prologue alone) and <= 0.8 x ours+scatter; at T >= BAR_LARGE_TOKENS ours_kv <= 1.15 x copy_kv.
KV_BAR_PROLOGUE = 1.15
KV_BAR_UNFUSED = 0.8
KV_BAR_COPY = 1.15
#: Elements of k (and of v) one program of :func:`scatter_kv` stores, at most.
SCATTER_TILE = 2048
CPU_DISCLAIMER = ("CPU run: the kernel ran through the Triton interpreter; these timings mean "
                  "nothing for NPU or GPU speed.")
TOLERANCE = {torch.bfloat16: 2.0**-6, torch.float16: 2.0**-9, torch.float32: 1e-5}


@dataclass
class Row:
    """One (geometry, token count, provider) measurement."""

    model: str
    tp: int
    geometry: str
    tokens: int
    provider: str
    us: float
    max_rel_err: float
    bytes: int
    floor_us: float
    launch_us: float
    copy_us: float  # the same bytes moved by a plain copy kernel, timed the same way

    @property
    def gbps(self) -> float:
        return self.bytes / self.us / 1e3 if self.us > 0 else float("nan")


@dataclass
class KVRow:
    """One (geometry, token count, provider) measurement of the KV-cache run."""

    model: str
    tp: int
    geometry: str
    tokens: int
    provider: str
    us: float  # one call per captured graph
    us_amortised: float  # ``calls`` calls captured in one graph, per call
    calls: int
    max_rel_err: float  # NaN for copy_kv (nothing to check)
    bytes: int  # the fused op's fewest bytes, the same for every provider of a (geometry, T)

    @property
    def gbps(self) -> float:
        return self.bytes / self.us / 1e3 if self.us > 0 else float("nan")

    @property
    def gbps_amortised(self) -> float:
        return self.bytes / self.us_amortised / 1e3 if self.us_amortised > 0 else float("nan")


def detect_device() -> torch.device:
    """The device the op would run on here, as ``vllm-ascend-ext doctor`` decides it.

    Returns
    -------
    torch.device
        An NPU, else a CUDA GPU, else the CPU (through the interpreter), as
        :func:`vllm_ascend_ext.backends.detect_backend` finds them.
    """
    from ..backends import detect_backend

    return torch.device(detect_backend().device)


def default_providers(device_type: str, op: str = OP) -> tuple[str, ...]:
    """The providers a run times by default on a device type.

    Parameters
    ----------
    device_type : str
        ``"cuda"``, ``"npu"`` or ``"cpu"``.
    op : str
        A key of :data:`OPS`.

    Returns
    -------
    tuple of str
        For :data:`OP`, all of :data:`PROVIDERS` on an accelerator; on ``"cpu"`` eager and ours
        (Inductor's CPU compile of every shape would take minutes and time nothing that matters).
        For any other op (:data:`KV_OP`, :data:`MLA_OP`), all of its providers everywhere.
    """
    if op != OP:
        return OPS[op]
    return ("eager", "ours") if device_type == "cpu" else PROVIDERS


def unfused_prologue(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads,
                     head_dim, eps, is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0,
                     mrope_section=None, mrope_interleaved=False, q_gate=False, v_norm=False):
    """The prologue as vLLM runs it unfused: split -> view -> RMSNorm -> view -> RoPE.

    The ``eager`` provider (and, compiled, ``compile``); it rounds to qkv's dtype after the norm
    as vLLM does, so it is a provider, not the reference (``ops.reference`` is). Positions must
    lie in the cache (``index_select`` does not clamp). The gated q is split with
    ``view(T, Hq, 2*D).chunk(2, -1)`` and both halves reshaped (a copy each), v normalised by
    ``RMSNorm(has_weight=False)``'s math, mRoPE's rows selected per section as
    ``MRotaryEmbedding.forward_native`` does: the spellings of vLLM 0.32's models.
    """
    q_size, kv_size = num_q_heads * head_dim, num_kv_heads * head_dim
    gate = None
    if q_gate:
        q_gate_cols, k, v = qkv.split([2 * q_size, kv_size, kv_size], dim=-1)
        q, gate = q_gate_cols.reshape(qkv.shape[0], num_q_heads, 2 * head_dim).chunk(2, dim=-1)
        q, gate = q.reshape(qkv.shape[0], q_size), gate.reshape(qkv.shape[0], q_size)
    else:
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)

    def rms_norm(x, weight, bias, offset=weight_offset):
        heads = x.view(*x.shape[:-1], x.shape[-1] // head_dim, head_dim)
        compute = torch.promote_types(x.dtype, torch.float32)
        xf = heads.to(compute)
        out = (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)
        if weight is not None:
            out = out * (offset + weight.to(compute)).to(x.dtype)
        if bias is not None:
            out = out + bias
        return out.reshape(x.shape)

    if q_weight is not None:
        q = rms_norm(q, q_weight, q_bias)
    if k_weight is not None:
        k = rms_norm(k, k_weight, k_bias)
    if v_norm:
        v = rms_norm(v, None, None)
    rotary_dim = cos_sin_cache.shape[1]
    cos, sin = cos_sin_cache.index_select(0, positions.flatten()).view(
        *positions.shape, rotary_dim).chunk(2, dim=-1)
    if positions.dim() == 2:  # [3, T, R/2] -> [T, R/2], each lane from its axis
        if mrope_interleaved:
            def pick(x):
                out = x[0].clone()
                out[..., 1:mrope_section[1] * 3:3] = x[1, ..., 1:mrope_section[1] * 3:3]
                out[..., 2:mrope_section[2] * 3:3] = x[2, ..., 2:mrope_section[2] * 3:3]
                return out
        else:
            def pick(x):
                return torch.cat([part[i] for i, part in enumerate(x.split(list(mrope_section), dim=-1))], dim=-1)
        cos, sin = pick(cos), pick(sin)
    cos, sin = cos.unsqueeze(-2).to(qkv.dtype), sin.unsqueeze(-2).to(qkv.dtype)
    return (_native_rope(q, cos, sin, head_dim, is_neox), _native_rope(k, cos, sin, head_dim, is_neox),
            v) + ((gate,) if q_gate else ())


def _native_rope(x, cos, sin, head_dim: int, is_neox: bool):
    """vLLM's native RoPE of ``x`` (``[T, H*D]``) with ``cos``/``sin`` of ``[T, 1, R/2]`` (x's dtype):
    the first ``R`` dims of each head rotated (NeoX halves or GPT-J pairs), the rest passed through."""
    rotary_dim = 2 * cos.shape[-1]
    heads = x.reshape(x.shape[0], -1, head_dim)
    rot, tail = heads[..., :rotary_dim], heads[..., rotary_dim:]
    if is_neox:
        x1, x2 = rot.chunk(2, dim=-1)
        rot = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = rot[..., ::2], rot[..., 1::2]
        rot = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return torch.cat((rot, tail), dim=-1).reshape(x.shape)


#: Rows of the benchmark's cos/sin cache (positions are drawn inside it).
MAX_POSITION = 4096


def make_inputs(geometry, tokens: int, device, dtype=torch.bfloat16, seed: int = 0) -> dict:
    """The benchmark's arguments of one call: ``ops.reference.make_inputs`` with a seeded generator.

    Parameters
    ----------
    geometry : AttentionGeometry
        One rank's layer geometry.
    tokens : int
        ``T``.
    device : torch.device or str
        Where the tensors live.
    dtype : torch.dtype
        qkv's (and the weights') dtype; the cache is fp32.
    seed : int
        Seed of the CPU generator the draws come from (the same seed gives the same inputs).

    Returns
    -------
    dict
        The op's keyword arguments. Positions stay inside the cache, as the unfused providers
        need.
    """
    from ..ops.reference import make_inputs as reference_inputs

    generator = torch.Generator(device="cpu").manual_seed(seed)
    return reference_inputs(geometry, tokens, device=device, dtype=dtype, cache_dtype=torch.float32,
                            max_position=MAX_POSITION, out_of_range=False, generator=generator)


def bytes_moved(geometry, tokens: int, elem_bytes: int = 2, cache_bytes: int = 4, kv_cache: bool = False) -> int:
    """The fewest bytes the prologue moves: q and k read and written (and the gate and v where
    they are written), one cos/sin row a token (three with mRoPE).

    Parameters
    ----------
    geometry : AttentionGeometry
        One rank's layer geometry.
    tokens : int
        ``T``.
    elem_bytes, cache_bytes : int
        Element sizes of qkv (and of a KV cache of its dtype) and of the cos/sin cache.
    kv_cache : bool
        The bytes of ``split_qkv_rmsnorm_rope_kv_cache``: v is always read and written (into
        the value cache), k written into the key cache, a cache line per token and kv head, of
        qkv's dtype.

    Returns
    -------
    int
    """
    heads = geometry.num_q_heads * (2 if geometry.q_gate else 1) + geometry.num_kv_heads * (
        2 if geometry.v_norm or kv_cache else 1)
    rows = 1 if geometry.mrope_section is None else 3
    return tokens * (2 * heads * geometry.head_dim * elem_bytes + rows * geometry.rotary_dim * cache_bytes)


def max_rel_err(outputs, reference) -> float:
    err = 0.0
    for out, ref in zip(outputs, reference):
        scale = ref.abs().max().item() or 1.0
        err = max(err, (out.double() - ref).abs().max().item() / scale)
    return err


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
               timer(functools.partial(_triton_copy, src, dst, 8192, 8)))
    return 2 * src.numel() * src.element_size() / (best * 1e-6)


#: (block, warps) of the copy kernel for :func:`copy_replay`; the faster one counts.
COPY_CONFIGS = ((2048, 4), (8192, 8))
#: Timings of every other provider in a row, the best counting: as many as the copy has
#: configurations, so both sides of a ratio to the copy are a best of two (with one timing of ours
#: against the copy's best of two, a v12 run read the gated layer at T = 8 1.31 against a copy
#: 0.4 us under the same run's copy at T = 1: docs/performance.md, v12).
TIMINGS_PER_ROW = len(COPY_CONFIGS)


def copy_replay(device: torch.device, timer: Timer, nbytes: int, calls: int = 1) -> float:
    """Microseconds of a plain Triton copy of ``nbytes`` (half read, half written), timed like
    every provider: launch, ramp-up and tail included, so a row can be held against what a
    kernel moving the same bytes reaches (CUDA/NPU; NaN on CPU); ``calls`` as :class:`Timer`'s."""
    if device.type == "cpu":
        return float("nan")
    n = max(1, nbytes // 4)  # int16 elements: n read and n written
    src = torch.zeros(n, dtype=torch.int16, device=device)
    dst = torch.empty_like(src)
    return min(timer(functools.partial(_triton_copy, src, dst, block, warps), calls)
               for block, warps in COPY_CONFIGS)


def _triton_copy(src: torch.Tensor, dst: torch.Tensor, block: int, warps: int) -> None:
    """``dst.copy_(src)`` through the plain Triton copy kernel, ``block`` elements a program."""
    import triton

    n = src.numel()
    _jit_helpers()[1][(triton.cdiv(n, block),)](src, dst, n, BLOCK=block, num_warps=warps)


def launch_floor(device: torch.device, timer: Timer) -> float:
    """Microseconds of an empty Triton kernel, timed like every provider (graph replay on CUDA)."""
    if device.type == "cpu":
        return float("nan")
    buf = torch.empty(1, device=device)
    empty_kernel = _jit_helpers()[0]
    return timer(lambda: empty_kernel[(1,)](buf))


@functools.lru_cache(maxsize=None)
def _jit_helpers():
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

    @triton.jit
    def scatter_kernel(k_ptr, v_ptr, key_cache_ptr, value_cache_ptr, slot_ptr, k_row_stride, v_row_stride,
                       block_size, block_stride, slot_stride, head_stride, num_kv_heads,
                       HEAD_DIM: tl.constexpr, HEADS: tl.constexpr, BLOCK_D: tl.constexpr):
        # One program per (token, block of HEADS kv heads): load its k and v rows, store them at
        # the token's slot; a negative slot stores nothing.
        token = tl.program_id(0).to(tl.int64)
        heads = tl.program_id(1) * HEADS + tl.arange(0, HEADS)[:, None]
        lanes = tl.arange(0, BLOCK_D)[None, :]
        slot = tl.load(slot_ptr + token).to(tl.int64)
        mask = (heads < num_kv_heads) & (lanes < HEAD_DIM) & (slot >= 0)
        slot = tl.maximum(slot, 0)
        src = heads * HEAD_DIM + lanes
        dst = (slot // block_size) * block_stride + (slot % block_size) * slot_stride + heads * head_stride + lanes
        k = tl.load(k_ptr + token * k_row_stride + src, mask=mask)
        tl.store(key_cache_ptr + dst, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
        v = tl.load(v_ptr + token * v_row_stride + src, mask=mask)
        tl.store(value_cache_ptr + dst, v.to(value_cache_ptr.dtype.element_ty), mask=mask)

    return empty_kernel, copy_kernel, scatter_kernel


def scatter_kv(k: torch.Tensor, v: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               slot_mapping: torch.Tensor) -> None:
    """Write each token's k and v into the paged ``nhd`` caches at its slot: the benchmark's
    separate cache-write kernel (``ours+scatter``), a plain Triton scatter.

    One program per (token, block of kv heads of at most :data:`SCATTER_TILE` elements; a warp
    per 256 of them, 1 to 8), one masked load and store of k and of v each; a negative slot
    writes nothing. No host sync.

    Parameters
    ----------
    k, v : torch.Tensor
        ``[T, Hkv*D]``, unit stride in the last dimension (rows may be strided, as views of qkv).
    key_cache, value_cache : torch.Tensor
        ``[num_blocks, block_size, Hkv, D]``, same shape and strides, unit lane stride, bf16,
        fp16 or fp32 (the values are cast to it).
    slot_mapping : torch.Tensor
        ``[T]`` or longer (the first ``T`` are read), int32 or int64, contiguous. Slot ``s`` is
        block ``s // block_size``, row ``s % block_size``.

    Raises
    ------
    ValueError
        Naming the argument whose shape, strides, dtype or device do not fit.
    """
    import triton

    if key_cache.dim() != 4 or key_cache.stride(-1) != 1 or key_cache.dtype not in (
            torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"key_cache must be a [num_blocks, block_size, Hkv, D] bf16/fp16/fp32 cache with unit "
                         f"lane stride, got {tuple(key_cache.shape)} {key_cache.dtype} strides {key_cache.stride()}")
    if (value_cache.shape, value_cache.stride(), value_cache.dtype) != (
            key_cache.shape, key_cache.stride(), key_cache.dtype):
        raise ValueError("value_cache must have key_cache's shape, strides and dtype")
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    tokens = k.shape[0] if k.dim() == 2 else -1
    for name, t in (("k", k), ("v", v)):
        if t.dim() != 2 or t.shape != (tokens, num_kv_heads * head_dim) or (t.numel() and t.stride(-1) != 1):
            raise ValueError(f"{name} must be [T, Hkv*D] = [T, {num_kv_heads * head_dim}] with unit last stride "
                             f"(and v as many rows as k), got {tuple(t.shape)}")
    if (slot_mapping.dim() != 1 or slot_mapping.dtype not in (torch.int32, torch.int64)
            or slot_mapping.numel() < tokens or not slot_mapping.is_contiguous()):
        raise ValueError(f"slot_mapping must be a contiguous int32/int64 [T] tensor with T >= {tokens}, got "
                         f"{tuple(slot_mapping.shape)} {slot_mapping.dtype}")
    if len({t.device for t in (k, v, key_cache, value_cache, slot_mapping)}) != 1:
        raise ValueError("k, v, key_cache, value_cache and slot_mapping must be on one device")
    if tokens == 0:
        return
    block_d = triton.next_power_of_2(head_dim)
    heads = max(1, min(triton.next_power_of_2(num_kv_heads), SCATTER_TILE // block_d))
    grid = (tokens, triton.cdiv(num_kv_heads, heads))
    _jit_helpers()[2][grid](k, v, key_cache, value_cache, slot_mapping, k.stride(0), v.stride(0), block_size,
                            key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), num_kv_heads,
                            HEAD_DIM=head_dim, HEADS=heads, BLOCK_D=block_d,
                            num_warps=max(1, min(8, heads * block_d // 256)))


def _providers(names, compiled):
    from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope

    table = {"eager": unfused_prologue, "compile": compiled, "ours": split_qkv_rmsnorm_rope}
    return {name: table[name] for name in names}


def checked_tokens(tokens, is_cpu: bool) -> tuple[int, ...]:
    tokens = tuple(tokens or (CPU_TOKENS if is_cpu else GPU_TOKENS))
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in tokens):
        raise ValueError(f"tokens must be positive ints, got {tokens!r}")
    return tokens


def checked_providers(providers, known: tuple[str, ...]) -> tuple[str, ...]:
    providers = tuple(known if providers is None else providers)
    if not providers or any(p not in known for p in providers):
        raise ValueError(f"providers must be a non-empty subset of {known}, got {providers!r}")
    return providers


def run_meta(device: torch.device, op: str) -> dict:
    from vllm_ascend_ext.ops import settings

    return {"op": op, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
            "torch": torch.__version__, "triton": triton_version(), "python": platform.python_version(),
            "interpreter": settings.triton_interpret()}


def run(device: torch.device, tokens=None, providers=None, geometries=None,
        progress: Callable[[str], None] | None = None, reps: int | None = None, op: str = OP,
        calls: int | None = None) -> dict:
    """Check and time every (geometry, token count, provider).

    Parameters
    ----------
    device : torch.device
        Where to run (CUDA, NPU or CPU through the Triton interpreter).
    tokens : sequence of int, optional
        Token counts (default: ``GPU_TOKENS`` on an accelerator, ``CPU_TOKENS`` on CPU).
    providers : sequence of str, optional
        Any of the op's providers (``OPS[op]``; default all of them).
    geometries : sequence of (model name, tp), optional
        Default ``ops.models.BENCH_GEOMETRIES``.
    progress : callable, optional
        Called with a short label before each measurement; the run is over when this returns.
    reps : int, optional
        Repetitions per timing where the device has no graph replay (NPU, CPU).
    op : str
        :data:`OP`, or :data:`KV_OP` for :func:`run_kv_cache` (which takes ``calls``).
    calls : int, optional
        :data:`KV_OP` only: calls per amortised timing.

    Returns
    -------
    dict
        ``{"rows": [Row, ...], "meta": {...}}``; ``meta`` holds the op, the device, the copy
        bandwidth, the launch floor and the versions. With :data:`KV_OP`, what
        :func:`run_kv_cache` returns.

    Raises
    ------
    ValueError
        Naming ``op``, ``tokens``, ``providers`` or ``calls`` when one is not an op / not a
        positive int / not a provider of the op.
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {tuple(OPS)}, got {op!r}")
    if op == KV_OP:
        return run_kv_cache(device, tokens, providers, geometries, progress, reps, calls)
    if calls is not None:
        raise ValueError(f"calls is for op={KV_OP!r} only")
    from vllm_ascend_ext.ops.models import BENCH_GEOMETRIES, model
    from vllm_ascend_ext.ops.reference import split_qkv_rmsnorm_rope as reference

    is_cpu = device.type == "cpu"
    tokens = checked_tokens(tokens, is_cpu)
    providers = checked_providers(providers, PROVIDERS)
    geometries = tuple(geometries or BENCH_GEOMETRIES)
    timer = Timer(device, reps or (3 if is_cpu else 50))
    if "compile" in providers:
        import torch._dynamo as dynamo

        # One static graph per (geometry, token count): raise the recompile limit so none of
        # them silently falls back to eager.
        dynamo.config.cache_size_limit = 4096
        if hasattr(dynamo.config, "accumulated_cache_size_limit"):
            dynamo.config.accumulated_cache_size_limit = 4096
    compiled = torch.compile(unfused_prologue, dynamic=False) if "compile" in providers else None
    fns = _providers(providers, compiled)
    bandwidth = copy_bandwidth(device, timer)
    launch = launch_floor(device, timer)
    rows = []
    for name, tp in geometries:
        geometry = model(name).shard(tp)
        for count in tokens:
            args = make_inputs(geometry, count, device, seed=count)
            ref = reference(**args)
            nbytes = bytes_moved(geometry, count)
            floor = nbytes / bandwidth * 1e6 if bandwidth == bandwidth else float("nan")
            copy_us = copy_replay(device, timer, nbytes)
            for provider, fn in fns.items():
                if progress:
                    progress(f"{name} tp{tp} T={count} {provider}")
                err = max_rel_err(fn(**args), ref)
                us = min(timer(lambda: fn(**args)) for _ in range(TIMINGS_PER_ROW))
                rows.append(Row(name, tp, geometry.label, count, provider, us, err, nbytes, floor, launch,
                                copy_us))
    meta = run_meta(device, OP) | {"copy_bandwidth_GBps": bandwidth / 1e9, "launch_floor_us": launch}
    return {"rows": rows, "meta": meta}


def make_kv_inputs(geometry, tokens: int, device, seed: int = 0) -> tuple[dict, dict]:
    """The KV-cache run's arguments of one call: the prologue's (:func:`make_inputs`) and the cache's.

    Parameters
    ----------
    geometry : AttentionGeometry
        One rank's layer geometry.
    tokens : int
        ``T``.
    device : torch.device or str
        Where the tensors live.
    seed : int
        Seed of the CPU generators the draws come from.

    Returns
    -------
    args : dict
        The prologue op's keyword arguments (bf16 qkv).
    cache : dict
        ``key_cache, value_cache, slot_mapping, cache_layout`` from ``ops.reference.make_kv_cache``:
        bf16 ``nhd`` caches of :data:`KV_BLOCK_SIZE`-row blocks, sentinel-filled, with room for
        twice the tokens, and one random distinct slot a token (no padding).
    """
    from ..ops.reference import make_kv_cache

    cache = make_kv_cache(geometry, tokens, cache_layout="nhd", dtype=torch.bfloat16, block_size=KV_BLOCK_SIZE,
                          padding=0, device=device, generator=torch.Generator(device="cpu").manual_seed(seed))
    return make_inputs(geometry, tokens, device, seed=seed), {
        name: cache[name] for name in ("key_cache", "value_cache", "slot_mapping", "cache_layout")}


def _kv_providers(names, args: dict, cache: dict, device: torch.device, nbytes: int) -> dict:
    """Each provider of the KV-cache run as a list of zero-argument callables (the fastest counts):
    the copy's configurations, and each other provider as many times (:data:`TIMINGS_PER_ROW`)."""
    from ..ops.split_qkv_rmsnorm_rope import split_qkv_rmsnorm_rope as prologue
    from ..ops.split_qkv_rmsnorm_rope_kv_cache import split_qkv_rmsnorm_rope_kv_cache as fused

    def ours_kv():
        return fused(**args, **cache)

    def ours_scatter():
        out = prologue(**args)
        scatter_kv(out[1], out[2], cache["key_cache"], cache["value_cache"], cache["slot_mapping"])
        return out

    def ours():
        return prologue(**args)

    table = {"ours_kv": [ours_kv] * TIMINGS_PER_ROW, "ours+scatter": [ours_scatter] * TIMINGS_PER_ROW,
             "ours": [ours] * TIMINGS_PER_ROW}
    if "copy_kv" in names:
        n = max(1, nbytes // 4)  # int16 elements: n read and n written
        src = torch.zeros(n, dtype=torch.int16, device=device)
        dst = torch.empty_like(src)
        table["copy_kv"] = [functools.partial(_triton_copy, src, dst, block, warps) for block, warps in COPY_CONFIGS]
    return {name: table[name] for name in names}


def _kv_error(provider: str, out, ref, cache: dict, expected) -> float:
    """Largest error of a provider's outputs and of the caches it left, relative to each one's scale
    (k's and v's for the caches: a sentinel overwritten by anything shows as a large error)."""
    if provider == "ours":
        return max_rel_err(out, ref)
    pairs = list(zip(out, ref)) if provider == "ours+scatter" else [(out[0], ref[0])] + list(zip(out[3:], ref[3:]))
    err = max_rel_err(*zip(*pairs))
    for name, want, y in (("key_cache", expected[0], ref[1]), ("value_cache", expected[1], ref[2])):
        scale = y.abs().max().item() or 1.0
        err = max(err, (cache[name].cpu().double() - want).abs().max().item() / scale)
    return err


def run_kv_cache(device: torch.device, tokens=None, providers=None, geometries=None,
                 progress: Callable[[str], None] | None = None, reps: int | None = None,
                 calls: int | None = None) -> dict:
    """Check and time ``split_qkv_rmsnorm_rope_kv_cache`` against the unfused pair, the prologue
    alone and the same-bytes copy, per (geometry, token count, provider), both timing modes.

    Parameters
    ----------
    device : torch.device
        Where to run (CUDA, NPU or CPU through the Triton interpreter).
    tokens : sequence of int, optional
        Token counts (default: ``GPU_TOKENS`` on an accelerator, ``CPU_TOKENS`` on CPU).
    providers : sequence of str, optional
        Any of :data:`KV_PROVIDERS` (default all).
    geometries : sequence of (model name, tp), optional
        Default ``ops.models.BENCH_GEOMETRIES``.
    progress : callable, optional
        Called with a short label before each provider's check and timings.
    reps : int, optional
        Repetitions per timing where the device has no graph replay (NPU, CPU).
    calls : int, optional
        Calls per amortised timing (captured in one graph on CUDA); default
        :data:`AMORTISED_CALLS`, :data:`CPU_AMORTISED_CALLS` on CPU.

    Returns
    -------
    dict
        ``{"rows": [KVRow, ...], "meta": {...}}``; ``meta`` holds ``op`` (:data:`KV_OP`), the
        device, the launch floor, the amortised call count, the cache's layout, dtype and block
        size, and the versions.

    Raises
    ------
    ValueError
        Naming ``tokens``, ``providers`` or ``calls``.
    """
    from vllm_ascend_ext.ops import reference
    from vllm_ascend_ext.ops.models import BENCH_GEOMETRIES, model

    is_cpu = device.type == "cpu"
    tokens = checked_tokens(tokens, is_cpu)
    providers = checked_providers(providers, KV_PROVIDERS)
    calls = calls if calls is not None else (CPU_AMORTISED_CALLS if is_cpu else AMORTISED_CALLS)
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls must be a positive int, got {calls!r}")
    geometries = tuple(geometries or BENCH_GEOMETRIES)
    timer = Timer(device, reps or (3 if is_cpu else 50))
    launch = launch_floor(device, timer)
    rows = []
    for name, tp in geometries:
        geometry = model(name).shard(tp)
        for count in tokens:
            args, cache = make_kv_inputs(geometry, count, device, seed=count)
            nbytes = bytes_moved(geometry, count, kv_cache=True)
            ref = reference.split_qkv_rmsnorm_rope(**args)
            initial = cache["key_cache"].clone(), cache["value_cache"].clone()
            expected = None
            if {"ours_kv", "ours+scatter"} & set(providers):
                expected = reference.kv_cache_write(
                    initial[0].cpu(), initial[1].cpu(), ref[1].cpu(), ref[2].cpu(), cache["slot_mapping"].cpu(),
                    geometry.num_kv_heads, geometry.head_dim, cache_layout="nhd")
            for provider, fns in _kv_providers(providers, args, cache, device, nbytes).items():
                if progress:
                    progress(f"{name} tp{tp} T={count} {provider}")
                err = float("nan")
                if provider != "copy_kv":
                    cache["key_cache"].copy_(initial[0])
                    cache["value_cache"].copy_(initial[1])
                    err = _kv_error(provider, fns[0](), ref, cache, expected)
                us = min(timer(fn) for fn in fns)
                us_amortised = min(timer(fn, calls) for fn in fns)
                rows.append(KVRow(name, tp, geometry.label, count, provider, us, us_amortised, calls, err, nbytes))
    meta = run_meta(device, KV_OP) | {"launch_floor_us": launch, "amortised_calls": calls, "cache_layout": "nhd",
                                   "cache_dtype": "bf16", "block_size": KV_BLOCK_SIZE}
    return {"rows": rows, "meta": meta}


def triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return "absent"


def check_rows(rows) -> list[str]:
    """The rows of our ops (``CHECKED_PROVIDERS``) further from the float64 reference than bf16 allows.

    Parameters
    ----------
    rows : list of Row, KVRow or TPRow
        A run's rows.

    Returns
    -------
    list of str
        One line per failing row (empty when every check passed).
    """
    limit = TOLERANCE[torch.bfloat16]
    return [f"{r.model} tp{r.tp} T={r.tokens}{f' rank {r.rank}' if isinstance(r, TPRow) else ''} {r.provider}: "
            f"rel err {r.max_rel_err:.2e} > {limit:.1e}"
            for r in rows if r.provider in CHECKED_PROVIDERS and not r.max_rel_err <= limit]


def format_table(result: dict) -> str:
    """A run as a text table.

    Parameters
    ----------
    result : dict
        What :func:`run` returned.

    Returns
    -------
    str
        A device line, then per (geometry, T): µs per provider, our GB/s, the floor, ours/floor,
        ours/launch floor, the same-bytes copy and ours/copy, compile/ours, our error. For
        :data:`KV_OP`, :func:`format_kv_table`'s.
    """
    if result["meta"].get("op") == KV_OP:
        return format_kv_table(result)
    rows, meta = result["rows"], result["meta"]
    by_key = _cells(rows)
    providers = [p for p in PROVIDERS if any(p in v for v in by_key.values())]
    head = f"{'geometry':24} {'T':>6} " + " ".join(f"{p + ' us':>11}" for p in providers)
    head += (f" {'ours GB/s':>10} {'floor us':>9} {'ours/floor':>10} {'ours/launch':>11}"
             f" {'copy us':>8} {'ours/copy':>9} {'compile/ours':>12} {'err':>8}")
    lines = [f"device {meta['device']}: copy {meta['copy_bandwidth_GBps']:.0f} GB/s, "
             f"empty-kernel replay {meta['launch_floor_us']:.2f} us", head]
    for (model_name, tp, label, count), cells in by_key.items():
        ours = cells.get("ours")
        line = f"{label:24} {count:6d} " + " ".join(f"{cells[p].us:11.2f}" for p in providers)
        if ours:
            compile_ratio = cells["compile"].us / ours.us if "compile" in cells else float("nan")
            line += (f" {ours.gbps:10.1f} {ours.floor_us:9.2f} {ours.us / ours.floor_us:10.2f}"
                     f" {ours.us / ours.launch_us:11.2f} {ours.copy_us:8.2f} {ours.us / ours.copy_us:9.2f}"
                     f" {compile_ratio:12.2f} {ours.max_rel_err:8.1e}")
        lines.append(line)
    return "\n".join(lines)


def _kv_ratio(cells: dict, provider: str, attr: str) -> float:
    if "ours_kv" not in cells or provider not in cells:
        return float("nan")
    return getattr(cells["ours_kv"], attr) / getattr(cells[provider], attr)


def _cells(rows) -> dict:
    """Rows by (model, TP, geometry, T), then by provider."""
    by_key: dict = {}
    for r in rows:
        by_key.setdefault((r.model, r.tp, r.geometry, r.tokens), {})[r.provider] = r
    return by_key


def format_kv_table(result: dict) -> str:
    """A KV-cache run (:func:`run_kv_cache`) as text: two tables, one per timing mode.

    Parameters
    ----------
    result : dict
        What :func:`run_kv_cache` returned.

    Returns
    -------
    str
        A device line; then for one call per captured graph, and for the amortised calls: per
        (geometry, T) µs per provider, ``ours_kv`` over ``ours``, over ``ours+scatter`` and over
        ``copy_kv``; the first table ends with the largest error of ``ours_kv`` and
        ``ours+scatter``.
    """
    rows, meta = result["rows"], result["meta"]
    by_key = _cells(rows)
    providers = [p for p in KV_PROVIDERS if any(p in v for v in by_key.values())]
    lines = [f"device {meta['device']}: empty-kernel replay {meta['launch_floor_us']:.2f} us; "
             f"{meta['cache_dtype']} {meta['cache_layout']} cache, block {meta['block_size']}, one random slot a token"]
    amortised = f"amortised: {meta['amortised_calls']} calls a timing (one captured graph on CUDA), per call"
    for title, attr in (("one call a timing (a captured graph on CUDA)", "us"), (amortised, "us_amortised")):
        lines.append(f"{KV_OP}, {title}:")
        head = f"{'geometry':24} {'T':>6} " + " ".join(f"{p + ' us':>15}" for p in providers)
        head += f" {'kv/ours':>8} {'kv/(ours+scatter)':>17} {'kv/copy':>8}" + (f" {'err':>8}" if attr == "us" else "")
        lines.append(head)
        for (_, _, label, count), cells in by_key.items():
            line = f"{label:24} {count:6d} " + " ".join(
                f"{getattr(cells[p], attr):15.2f}" if p in cells else f"{'-':>15}" for p in providers)
            line += (f" {_kv_ratio(cells, 'ours', attr):8.2f} {_kv_ratio(cells, 'ours+scatter', attr):17.2f}"
                     f" {_kv_ratio(cells, 'copy_kv', attr):8.2f}")
            if attr == "us":
                errs = [cells[p].max_rel_err for p in ("ours_kv", "ours+scatter") if p in cells]
                line += f" {max(errs):8.1e}" if errs else f" {'-':>8}"
            lines.append(line)
    return "\n".join(lines)


def kv_bar_verdict(result: dict) -> list[str]:
    """Issue 11's bar, line by line, in both timing modes: at T <= BAR_SMALL_TOKENS ours_kv over
    the prologue alone (<= :data:`KV_BAR_PROLOGUE`) and over the unfused pair (<=
    :data:`KV_BAR_UNFUSED`); at T >= BAR_LARGE_TOKENS ours_kv over the same-bytes copy (<=
    :data:`KV_BAR_COPY`). Each row over the bar is listed.

    Parameters
    ----------
    result : dict
        What :func:`run_kv_cache` returned.

    Returns
    -------
    list of str
        Nothing for a comparison whose providers were not run.
    """
    by_key = _cells(result["rows"])
    calls = result["meta"].get("amortised_calls", AMORTISED_CALLS)
    out = []
    for mode, attr in (("graph", "us"), (f"amortised x{calls}", "us_amortised")):
        for name, small, other, bar in (
                (f"T<={BAR_SMALL_TOKENS} {mode}: ours_kv/ours", True, "ours", KV_BAR_PROLOGUE),
                (f"T<={BAR_SMALL_TOKENS} {mode}: ours_kv/(ours+scatter)", True, "ours+scatter", KV_BAR_UNFUSED),
                (f"T>={BAR_LARGE_TOKENS} {mode}: ours_kv/copy_kv", False, "copy_kv", KV_BAR_COPY)):
            picked = [(key, _kv_ratio(cells, other, attr)) for key, cells in by_key.items()
                      if (key[3] <= BAR_SMALL_TOKENS if small else key[3] >= BAR_LARGE_TOKENS)
                      and "ours_kv" in cells and other in cells]
            if not picked:
                continue
            worst = max(ratio for _, ratio in picked)
            out.append(f"{name} worst {worst:.2f} ({'PASS' if worst <= bar else 'FAIL'} <= {bar}; issue 11)")
            out.extend(f"  over: {key[2]} T={key[3]} {ratio:.2f}" for key, ratio in picked if not ratio <= bar)
    return out


def bar_verdict(result: dict) -> list[str]:
    """Issue 2's bar, line by line (CUDA runs): floor ratio, launch ratio, ours vs compile; then
    issue 10's: ours against the same-bytes copy at large and at small token counts. For a
    :data:`KV_OP` run, issue 11's (:func:`kv_bar_verdict`).

    Each failing row is listed with what the same-bytes copy reached: where the copy itself is
    over the bar, no kernel that moves those bytes meets it as measured.

    Parameters
    ----------
    result : dict
        What :func:`run` returned.

    Returns
    -------
    list of str
    """
    if result.get("meta", {}).get("op") == KV_OP:
        return kv_bar_verdict(result)
    rows = [r for r in result["rows"] if r.provider == "ours"]
    compile_us = {(r.model, r.tp, r.tokens): r.us for r in result["rows"] if r.provider == "compile"}
    slower = [f"{r.geometry} T={r.tokens}" for r in rows
              if (r.model, r.tp, r.tokens) in compile_us and r.us >= compile_us[(r.model, r.tp, r.tokens)]]
    out = []
    for name, picked, ratio_of, bar in (
            (f"T>={BAR_LARGE_TOKENS}: ours/floor", [r for r in rows if r.tokens >= BAR_LARGE_TOKENS],
             lambda r, us: us / r.floor_us, BAR_FLOOR_RATIO),
            (f"T<={BAR_SMALL_TOKENS}: ours/launch", [r for r in rows if r.tokens <= BAR_SMALL_TOKENS],
             lambda r, us: us / r.launch_us, BAR_LAUNCH_RATIO)):
        if not picked:
            continue
        worst = max(ratio_of(r, r.us) for r in picked)
        out.append(f"{name} worst {worst:.2f} ({'PASS' if worst <= bar else 'FAIL'} <= {bar})")
        for r in picked:
            if ratio_of(r, r.us) > bar:
                copy = ratio_of(r, r.copy_us)
                note = "the copy is over the bar too" if copy > bar else "the copy is within it"
                out.append(f"  over: {r.geometry} T={r.tokens} {ratio_of(r, r.us):.2f} "
                           f"(same-bytes copy {copy:.2f}: {note})")
    if compile_us:
        out.append("ours faster than torch.compile at every T: "
                   + ("PASS" if not slower else "FAIL (" + ", ".join(slower) + ")"))
    for name, picked, bar in (
            (f"T>={BAR_LARGE_TOKENS}: ours/copy", [r for r in rows if r.tokens >= BAR_LARGE_TOKENS], COPY_BAR_LARGE),
            (f"T<={COPY_BAR_SMALL_TOKENS}: ours/copy", [r for r in rows if r.tokens <= COPY_BAR_SMALL_TOKENS],
             COPY_BAR_SMALL)):
        if not picked:
            continue
        worst = max(r.us / r.copy_us for r in picked)
        out.append(f"{name} worst {worst:.2f} ({'PASS' if worst <= bar else 'FAIL'} <= {bar}; issue 10)")
        out.extend(f"  over: {r.geometry} T={r.tokens} {r.us / r.copy_us:.2f}" for r in picked
                   if r.us / r.copy_us > bar)
    return out


def write_outputs(result: dict, out_dir: Path, text: str | None = None) -> list[Path]:
    """CSV and JSON of every row, the text shown (if given), and for :data:`OP` a PNG (bandwidth
    vs tokens per provider, with the floor); the files are named ``bench_<op>.*``.

    Parameters
    ----------
    result : dict
        What :func:`run` returned.
    out_dir : Path
        The folder (created if missing); nothing is written outside it.
    text : str, optional
        Written as ``bench_<op>.txt`` (the table and bar lines as printed).

    Returns
    -------
    list of Path
        The files written (no PNG without matplotlib, none for :data:`KV_OP`).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    op = result["meta"].get("op", OP)
    rows = result["rows"]

    def record(r):
        return asdict(r) | {"gbps": r.gbps} | ({"gbps_amortised": r.gbps_amortised} if isinstance(r, KVRow) else {})

    fields = list(record(rows[0])) if rows else []
    csv_path, json_path = out_dir / f"bench_{op}.csv", out_dir / f"bench_{op}.json"
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for r in rows:
            writer.writerow(record(r))
    json_path.write_text(json.dumps({"meta": result["meta"], "rows": [record(r) for r in rows]}, indent=1))
    paths = [csv_path, json_path]
    if text is not None:
        paths.append(out_dir / f"bench_{op}.txt")
        paths[-1].write_text(text if text.endswith("\n") else text + "\n")
    png = plot(result, out_dir / f"bench_{op}.png") if op == OP else None
    if png:
        paths.append(png)
    return paths


def plot(result: dict, path: Path) -> Path | None:
    """Bandwidth (GB/s) vs tokens, one panel per geometry, one line per provider, and the copy
    bandwidth as the ceiling.

    Parameters
    ----------
    result : dict
        What :func:`run` returned.
    path : Path
        The PNG to write.

    Returns
    -------
    Path or None
        ``path``, or ``None`` when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = result["rows"]
    labels = list(dict.fromkeys(r.geometry for r in rows))
    fig, axes = plt.subplots(1, len(labels), figsize=(4.2 * len(labels), 3.6), squeeze=False)
    for ax, label in zip(axes[0], labels):
        for provider in PROVIDERS:
            pts = [(r.tokens, r.gbps) for r in rows if r.geometry == label and r.provider == provider]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=provider)
        ceiling = result["meta"]["copy_bandwidth_GBps"]
        if ceiling == ceiling:
            ax.axhline(ceiling, color="gray", linestyle="--", label="copy bandwidth (floor)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(label)
        ax.set_xlabel("tokens")
        ax.set_ylabel("GB/s (min bytes / time)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"split_qkv_rmsnorm_rope on {result['meta']['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------
# Multi-rank mode: split_qkv_tp_rmsnorm_rope (issue 12), one spawned process per rank


#: The TP op and its providers (table order).
TP_OP = "split_qkv_tp_rmsnorm_rope"
TP_PROVIDERS = ("ours_tp", "unfused_tp", "copy+allreduce")
#: The model whose layer the multi-rank run times by default (sharded over the ranks).
TP_MODEL = "MiniMax-M2"
#: Token counts of a CPU multi-rank run (the interpreter: a smoke run).
TP_CPU_TOKENS = (1, 5)
#: The bar of issue 12, per rank: at T <= BAR_SMALL_TOKENS ours_tp <= 0.7 x unfused_tp; at
#: T >= BAR_LARGE_TOKENS ours_tp <= 1.2 x copy+allreduce.
TP_BAR_UNFUSED = 0.7
TP_BAR_COPY = 1.2
#: CUDA timing of the multi-rank run: replays (or eager calls) timed one by one after warm-up
#: ones, the same count on every rank (a collective in each), the L2 flushed before each.
TP_REPLAYS = 100
TP_WARMUP = 10
L2_FLUSH_BYTES = 256 << 20


@dataclass
class TPRow:
    """One (geometry, token count, rank, provider) measurement of the multi-rank run."""

    model: str
    tp: int
    rank: int
    geometry: str  # the rank's local geometry
    tokens: int
    provider: str
    us: float
    max_rel_err: float  # NaN for copy+allreduce (nothing to check)
    bytes: int  # the op's fewest bytes on this rank (bytes_moved of the local geometry)
    timing: str  # "graph" (CUDA graph replays), "events" (eager calls: capture failed), "wall" (CPU)

    @property
    def gbps(self) -> float:
        return self.bytes / self.us / 1e3 if self.us > 0 else float("nan")


def _reduce_sum(tensor: torch.Tensor, all_reduce) -> torch.Tensor:
    """Sum ``tensor`` over the group: in place on a ``ProcessGroup``, or ``all_reduce(tensor)``."""
    import torch.distributed as dist

    if isinstance(all_reduce, dist.ProcessGroup):
        dist.all_reduce(tensor, group=all_reduce)
        return tensor
    return all_reduce(tensor)


def unfused_tp(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps=1e-6,
               *, tp_size=1, all_reduce=None, is_neox=True):
    """The unfused TP path as vLLM 0.32 runs it without its fused kernels: split -> local mean of
    squares -> all-reduce of the ``[T, 2]`` fp32 means -> norm with the weight shard -> RoPE.

    vLLM's ``_minimax_qk_norm_tp_eager`` (``MiniMaxText01RMSNormTP``, the pure-PyTorch path:
    fp32 means over the rank's columns, ``cat``, an all-reduce of the flattened ``[T, 2]``
    tensor divided by ``tp_size``, ``x * rsqrt(var + eps) * w`` rounded to qkv's dtype), then
    the native RoPE of :func:`unfused_prologue` (``index_select`` of the cache, cos/sin in
    qkv's dtype). The ``unfused_tp`` provider; the arguments are ``split_qkv_tp_rmsnorm_rope``'s
    (``all_reduce``: a ``ProcessGroup`` or a callable). Positions must lie in the cache.

    Returns
    -------
    tuple of torch.Tensor
        ``q`` ``[T, Hq*D]``, ``k`` ``[T, Hkv*D]`` (qkv's dtype), ``v`` a view of qkv.
    """
    q_size, kv_size = num_q_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    dtype = q.dtype
    q, k = q.to(torch.float32), k.to(torch.float32)
    qk_var = torch.cat([q.pow(2).mean(dim=-1, keepdim=True), k.pow(2).mean(dim=-1, keepdim=True)], dim=-1)
    if tp_size > 1:
        qk_var = _reduce_sum(qk_var.flatten(), all_reduce).view_as(qk_var) / tp_size
    q_var, k_var = qk_var.chunk(2, dim=-1)
    q = (q * torch.rsqrt(q_var + eps) * q_weight).to(dtype)
    k = (k * torch.rsqrt(k_var + eps) * k_weight).to(dtype)
    cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(-2).to(dtype), sin.unsqueeze(-2).to(dtype)
    return _native_rope(q, cos, sin, head_dim, is_neox), _native_rope(k, cos, sin, head_dim, is_neox), v


def tp_local_geometry(full, tp: int):
    """The geometry one rank of ``tp`` sees of the full layer ``full`` as vLLM shards MiniMax-M2:
    ``Hq/tp`` q heads, ``max(1, Hkv/tp)`` kv heads (replicated when fewer than the ranks)."""
    from dataclasses import fields, replace

    from ..ops.models import AttentionGeometry

    local = {f.name: getattr(full, f.name) for f in fields(AttentionGeometry)}
    return replace(AttentionGeometry(**local), num_q_heads=full.num_q_heads // tp,
                   num_kv_heads=max(1, full.num_kv_heads // tp))


def make_tp_inputs(full, tokens: int, tp: int, rank: int, device, seed: int = 0) -> tuple[dict, tuple]:
    """One rank's arguments of ``split_qkv_tp_rmsnorm_rope`` and the float64 reference of its outputs.

    Every rank draws the same full layer (``ops.reference.make_tp_inputs``, bf16, a seeded CPU
    generator, positions clamped into a :data:`MAX_POSITION`-row cache as the unfused path
    needs), computes the single-process float64 reference of the whole layer
    (``reference.split_qkv_tp_rmsnorm_rope_full``) and keeps its shard (``shard_minimax``,
    ``shard_minimax_outputs``: vLLM's sharding, replicated kv heads included).

    Parameters
    ----------
    full : AttentionGeometry
        The unsharded layer.
    tokens : int
        ``T``.
    tp, rank : int
        The group's size and this rank.
    device : torch.device or str
        Where the tensors live (the reference is computed there).
    seed : int
        Seed of the CPU generator (the same on every rank).

    Returns
    -------
    args : dict
        The op's keyword arguments but ``all_reduce`` (``tp_size`` included).
    reference : tuple of torch.Tensor
        float64 ``q``, ``k``, ``v`` of this rank's heads.
    """
    from ..ops import reference

    generator = torch.Generator(device="cpu").manual_seed(seed)
    layer = reference.make_tp_inputs(full, tokens, device=device, dtype=torch.bfloat16, max_position=MAX_POSITION,
                                     generator=generator)
    layer["positions"].clamp_(0, MAX_POSITION - 1)
    ref = reference.shard_minimax_outputs(reference.split_qkv_tp_rmsnorm_rope_full(**layer), full.num_q_heads,
                                          full.num_kv_heads, full.head_dim, tp, rank)
    return reference.shard_minimax(layer, tp, rank), tuple(t.clone() for t in ref)


class _TPTimer:
    """Times one zero-argument callable that calls a collective, the same way on every rank.

    CUDA: the call captured in a CUDA graph (the collective with it) and its replays timed one
    by one with events, the L2 flushed before each, :data:`TP_REPLAYS` of them after
    :data:`TP_WARMUP` (a fixed count: every rank must run as many collectives, which
    ``triton.testing.do_bench``'s own estimate of the count would not guarantee); the median.
    When the capture fails on any rank (the ranks agree through the group) every rank times
    eager calls the same way instead and the reason is kept. CPU: wall clock, the median of
    ``reps`` calls.
    """

    def __init__(self, device: torch.device, group, reps: int):
        self.device, self.group, self.reps = device, group, reps
        self.fallbacks: list[str] = []
        self._flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device) if device.type == "cuda" else None

    def _capture(self, fn: Callable[[], object]) -> tuple[Callable[[], object], str]:
        import torch.distributed as dist

        graph, why = torch.cuda.CUDAGraph(), ""
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                fn()
        except Exception as exc:  # noqa: BLE001 - any capture failure falls back to eager calls
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        torch.cuda.synchronize()
        ok = torch.tensor([0 if why else 1], dtype=torch.int32, device=self.device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=self.group)
        if int(ok.item()):
            return graph.replay, ""
        return fn, why or "the capture failed on another rank"

    def __call__(self, fn: Callable[[], object], label: str = "") -> tuple[float, str]:
        """Microseconds per call of ``fn`` (median) and how it was timed: ``"graph"``,
        ``"events"`` or ``"wall"``."""
        import torch.distributed as dist

        fn()  # compile / warm up (and, on the first call, create the communicator) outside any graph
        if self.device.type != "cuda":
            times = []
            for _ in range(self.reps):
                start = time.perf_counter()
                fn()
                times.append(1e6 * (time.perf_counter() - start))
            return statistics.median(times), "wall"
        torch.cuda.synchronize()
        run, why = self._capture(fn)
        if why:
            self.fallbacks.append(f"{label}: CUDA graph capture failed ({why}); timed eager calls with events")
        for _ in range(TP_WARMUP):
            run()
        sync = torch.zeros(1, device=self.device)
        dist.all_reduce(sync, group=self.group)
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(TP_REPLAYS)]
        for start, end in events:
            self._flush.zero_()
            start.record()
            run()
            end.record()
        torch.cuda.synchronize()
        return 1e3 * statistics.median(start.elapsed_time(end) for start, end in events), (
            "events" if why else "graph")


def _tp_providers(names, args: dict, group, device: torch.device, tokens: int, nbytes: int) -> dict:
    """Each provider of the multi-rank run as a list of zero-argument callables (the fastest counts)."""
    from ..ops.split_qkv_tp_rmsnorm_rope import split_qkv_tp_rmsnorm_rope

    table = {"ours_tp": [functools.partial(split_qkv_tp_rmsnorm_rope, **args, all_reduce=group)],
             "unfused_tp": [functools.partial(unfused_tp, **args, all_reduce=group)]}
    if "copy+allreduce" in names:
        n = max(1, nbytes // 4)  # int16 elements: n read and n written
        src = torch.zeros(n, dtype=torch.int16, device=device)
        dst = torch.empty_like(src)
        sums = torch.zeros(tokens, 2, dtype=torch.float32, device=device)

        def copy_allreduce(block, warps):
            if device.type == "cpu":
                dst.copy_(src)  # no Triton copy kernel through the interpreter's loops
            else:
                _triton_copy(src, dst, block, warps)
            _reduce_sum(sums, group)

        configs = COPY_CONFIGS if device.type != "cpu" else COPY_CONFIGS[:1]
        table["copy+allreduce"] = [functools.partial(copy_allreduce, block, warps) for block, warps in configs]
    return {name: table[name] for name in names}


def run_tp(device: torch.device, group, tokens=None, providers=None, geometries=None,
           progress: Callable[[str], None] | None = None, reps: int | None = None) -> dict:
    """One rank's part of the multi-rank run: check, then time, every (layer, T, provider).

    Called on every rank of ``group`` with the same arguments (each provider calls the group's
    collective, in the same order everywhere). Providers: ``ours_tp``
    (``split_qkv_tp_rmsnorm_rope`` with ``all_reduce=group``), ``unfused_tp`` (:func:`unfused_tp`
    on the group) and ``copy+allreduce`` (a plain copy of the op's fewest bytes on this rank,
    :func:`bytes_moved` of its geometry, plus a bare all-reduce of a ``[T, 2]`` fp32 tensor).
    ``ours_tp`` and ``unfused_tp`` are checked against the float64 reference of this rank's
    shard (:func:`make_tp_inputs`) before they are timed (:class:`_TPTimer`).

    Parameters
    ----------
    device : torch.device
        This rank's device (a CUDA GPU, or the CPU through the Triton interpreter).
    group : torch.distributed.ProcessGroup
        The TP group (its size is ``tp``).
    tokens : sequence of int, optional
        Default :data:`GPU_TOKENS` on CUDA, :data:`TP_CPU_TOKENS` on CPU.
    providers : sequence of str, optional
        Any of :data:`TP_PROVIDERS` (default all).
    geometries : sequence of (name, AttentionGeometry), optional
        The FULL (unsharded) layers; default :data:`TP_MODEL`'s row of ``ops.models``.
    progress : callable, optional
        Called with each row's line once it is measured.
    reps : int, optional
        CPU: calls per timing (default 3).

    Returns
    -------
    dict
        ``{"rows": [TPRow, ...], "meta": {...}}`` of this rank; ``meta`` holds ``op``
        (:data:`TP_OP`), ``tp``, the device, the collective backend, the timing modes, any
        capture fallbacks and the versions.
    """
    import torch.distributed as dist

    from ..ops.models import model

    is_cpu = device.type == "cpu"
    tokens = tuple(tokens or (TP_CPU_TOKENS if is_cpu else GPU_TOKENS))
    checked_tokens(tokens, is_cpu)
    providers = checked_providers(providers, TP_PROVIDERS)
    geometries = tuple(geometries or ((TP_MODEL, model(TP_MODEL)),))
    tp, rank = dist.get_world_size(group), dist.get_rank(group)
    timer = _TPTimer(device, group, reps or 3)
    rows = []
    for name, full in geometries:
        local = tp_local_geometry(full, tp)
        for count in tokens:
            args, ref = make_tp_inputs(full, count, tp, rank, device, seed=count)
            nbytes = bytes_moved(local, count)
            for provider, fns in _tp_providers(providers, args, group, device, count, nbytes).items():
                err = float("nan") if provider == "copy+allreduce" else max_rel_err(fns[0](), ref)
                timed = [timer(fn, f"{name} tp{tp} T={count} {provider} rank {rank}") for fn in fns]
                us, how = min(timed)
                row = TPRow(name, tp, rank, local.label, count, provider, us, err, nbytes, how)
                rows.append(row)
                if progress:
                    progress(f"[rank {rank}] {name} tp{tp} {local.label} T={count} {provider}: {us:.2f} us "
                             f"({how}), err {err:.1e}")
            del args, ref
    meta = run_meta(device, TP_OP) | {"tp": tp, "collective": dist.get_backend(group),
                                   "timing": sorted({r.timing for r in rows}), "capture_fallbacks": timer.fallbacks}
    if device.type == "cuda":
        meta["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return {"rows": rows, "meta": meta}


def format_tp_table(result: dict) -> str:
    """A multi-rank run as text: per (layer, T, rank) µs per provider, ``ours_tp`` over
    ``unfused_tp`` and over ``copy+allreduce``, the errors of both checked providers, the timing.

    Parameters
    ----------
    result : dict
        :func:`run_tp`'s result, or the ranks' rows merged (:func:`run_tp_ranks`).

    Returns
    -------
    str
    """
    rows, meta = result["rows"], result["meta"]
    by_key: dict = {}
    for r in rows:
        by_key.setdefault((r.model, r.tp, r.geometry, r.tokens, r.rank), {})[r.provider] = r
    providers = [p for p in TP_PROVIDERS if any(p in v for v in by_key.values())]
    lines = [f"{TP_OP}: {meta['tp']} ranks ({meta['collective']}) on {meta['device']}, timing "
             f"{'/'.join(meta['timing'])} (graph: one call per CUDA-graph replay, collective captured; events: "
             f"eager calls; wall: CPU wall clock)"]
    lines += [f"capture fallback: {line}" for line in meta.get("capture_fallbacks", [])]
    lines.append(f"{'model':12} {'geometry':18} {'T':>6} {'rank':>4} " + " ".join(f"{p + ' us':>18}" for p in providers)
                 + f" {'ours/unfused':>12} {'ours/(copy+ar)':>14} {'err ours':>9} {'err unfused':>11}")
    for (name, _, label, count, rank), cells in by_key.items():
        line = f"{name:12} {label:18} {count:6d} {rank:4d} " + " ".join(
            f"{cells[p].us:18.2f}" if p in cells else f"{'-':>18}" for p in providers)
        line += f" {_tp_ratio(cells, 'unfused_tp'):12.2f} {_tp_ratio(cells, 'copy+allreduce'):14.2f}"
        line += "".join(f" {cells[p].max_rel_err:{w}.1e}" if p in cells else f" {'-':>{w}}"
                        for p, w in (("ours_tp", 9), ("unfused_tp", 11)))
        lines.append(line)
    return "\n".join(lines)


def _tp_ratio(cells: dict, other: str) -> float:
    if "ours_tp" not in cells or other not in cells:
        return float("nan")
    return cells["ours_tp"].us / cells[other].us


def tp_bar_verdict(result: dict) -> list[str]:
    """Issue 12's bar, over every rank's rows: at T <= BAR_SMALL_TOKENS ``ours_tp/unfused_tp`` <=
    :data:`TP_BAR_UNFUSED`; at T >= BAR_LARGE_TOKENS ``ours_tp/(copy+allreduce)`` <=
    :data:`TP_BAR_COPY`. The worst ratio over ranks and token counts decides; each (T, rank)
    over the bar is listed.

    Parameters
    ----------
    result : dict
        The ranks' rows merged (:func:`run_tp_ranks`), or one rank's :func:`run_tp`.

    Returns
    -------
    list of str
        Nothing for a comparison whose providers or token counts were not run.
    """
    by_key: dict = {}
    for r in result["rows"]:
        by_key.setdefault((r.model, r.geometry, r.tokens, r.rank), {})[r.provider] = r
    out = []
    for name, small, other, bar in (
            (f"T<={BAR_SMALL_TOKENS}: ours_tp/unfused_tp", True, "unfused_tp", TP_BAR_UNFUSED),
            (f"T>={BAR_LARGE_TOKENS}: ours_tp/(copy+allreduce)", False, "copy+allreduce", TP_BAR_COPY)):
        picked = [(key, _tp_ratio(cells, other)) for key, cells in by_key.items()
                  if (key[2] <= BAR_SMALL_TOKENS if small else key[2] >= BAR_LARGE_TOKENS)
                  and "ours_tp" in cells and other in cells]
        if not picked:
            continue
        worst = max(ratio for _, ratio in picked)
        out.append(f"{name} worst {worst:.2f} over {len(picked)} (T, rank) rows "
                   f"({'PASS' if worst <= bar else 'FAIL'} <= {bar}; issue 12)")
        out.extend(f"  over: {key[0]} {key[1]} T={key[2]} rank {key[3]} {ratio:.2f}" for key, ratio in picked
                   if not ratio <= bar)
    return out


def tp_report(result: dict) -> tuple[str, list[str]]:
    """The text a multi-rank run prints and writes, and its failed checks.

    Returns
    -------
    text : str
        :func:`format_tp_table`, then on CUDA the bar lines (:func:`tp_bar_verdict`, prefixed
        ``bar:``), on CPU :data:`CPU_DISCLAIMER`, then ``CHECK FAILED:`` lines.
    failures : list of str
        :func:`check_rows`' lines.
    """
    lines = [format_tp_table(result)]
    if result["meta"]["device"] == "cpu":
        lines.append(CPU_DISCLAIMER)
    else:
        lines += ["bar: " + line for line in tp_bar_verdict(result)]
    failures = check_rows(result["rows"])
    lines += ["CHECK FAILED: " + line for line in failures]
    return "\n".join(lines), failures


def _tp_rank_main(rank: int, world: int, rendezvous: str, backend: str, options: dict) -> None:
    """A spawned rank of :func:`run_tp_ranks`: the interpreter on CPU (before any kernel module is
    imported), one GPU per rank on CUDA, the group (NCCL / gloo), :func:`run_tp`; rank 0 gathers
    every rank's rows, prints the table and the bar, writes the files and saves the merged result
    for the parent."""
    import os

    if backend == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        torch.set_num_threads(1)
    import torch.distributed as dist

    if backend == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if backend == "cuda" else "gloo", init_method=f"file://{rendezvous}",
                            rank=rank, world_size=world)
    try:
        group = dist.group.WORLD
        result = run_tp(device, group, options["tokens"], options["providers"], options["geometries"],
                        progress=lambda line: print(line, flush=True), reps=options["reps"])
        gathered = [None] * world
        dist.all_gather_object(gathered, result)
        if rank == 0:
            merged = {"rows": [r for part in gathered for r in part["rows"]],
                      "meta": result["meta"] | {
                          "capture_fallbacks": [f for part in gathered for f in part["meta"]["capture_fallbacks"]],
                          "timing": sorted({t for part in gathered for t in part["meta"]["timing"]})}}
            text, _ = tp_report(merged)
            print(text, flush=True)
            paths = write_outputs(merged, Path(options["out"]), text=text) if options["out"] else []
            if paths:
                print("wrote " + ", ".join(str(p) for p in paths), flush=True)
            torch.save(merged, Path(rendezvous).with_name("result.pt"))
        sync = torch.zeros(1, device=device)
        dist.all_reduce(sync)  # no rank leaves before rank 0 is done with the group
    finally:
        dist.destroy_process_group()


def run_tp_ranks(ranks: int, backend: str | None = None, tokens=None, providers=None, geometries=None,
                 out: Path | None = None, reps: int | None = None) -> dict:
    """The multi-rank run: spawn ``ranks`` processes (``torch.multiprocessing``), one per rank,
    each running :func:`run_tp` in one group; rank 0 prints and writes the merged result.

    Parameters
    ----------
    ranks : int
        Processes (the TP size); on CUDA at most the visible GPUs (one each).
    backend : str, optional
        ``"cuda"`` (NCCL) or ``"cpu"`` (gloo, the kernels through the Triton interpreter);
        default CUDA when a GPU is visible.
    tokens, providers, geometries, reps
        As :func:`run_tp`.
    out : Path, optional
        Folder of ``bench_split_qkv_tp_rmsnorm_rope.{txt,csv,json}`` (rank 0 writes them).

    Returns
    -------
    dict
        Every rank's rows and rank 0's meta (capture fallbacks of all ranks).

    Raises
    ------
    ValueError
        Naming ``ranks`` or ``backend``.
    """
    import os
    import tempfile

    import torch.multiprocessing as mp

    backend = backend or ("cuda" if torch.cuda.is_available() else "cpu")
    if backend not in ("cuda", "cpu"):
        raise ValueError(f"backend must be 'cuda' or 'cpu', got {backend!r}")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise ValueError(f"ranks must be an int >= 2, got {ranks!r}")
    if backend == "cuda" and ranks > torch.cuda.device_count():
        raise ValueError(f"ranks={ranks} but {torch.cuda.device_count()} CUDA devices are visible (one per rank)")
    checked_providers(providers, TP_PROVIDERS)
    if backend == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # inherited by the spawned ranks
    options = dict(tokens=tuple(tokens) if tokens else None, providers=providers, geometries=geometries,
                   out=str(out) if out is not None else None, reps=reps)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_tp_rank_main, args=(ranks, f"{tmp}/rendezvous", backend, options), nprocs=ranks, join=True)
        return torch.load(f"{tmp}/result.pt", weights_only=False)
