"""The KV-cache run: ``split_qkv_rmsnorm_rope_kv_cache`` (issue 11: the prologue writing k and v into
the paged KV cache) against the unfused pair, the prologue alone and the same-bytes copy.

Per geometry of ``ops.models.BENCH_GEOMETRIES`` and token count, a bf16 ``nhd`` cache of blocks of
``KV_BLOCK_SIZE`` with room for twice the tokens, one random distinct slot a token
(``cases.make_kv_inputs``), and four providers:

* ``ours_kv``: ``split_qkv_rmsnorm_rope_kv_cache`` (``return_kv=False``);
* ``ours+scatter``: the prologue op followed by :func:`scatter_kv`, a plain Triton scatter of k
  and v into the cache (the unfused baseline; both captured together);
* ``ours``: the prologue op alone;
* ``copy_kv``: a plain Triton copy of the fused op's fewest bytes (``bytes_moved(...,
  kv_cache=True)``: read q, k and v, write q and the cache lines), launch included.

Each is timed two ways on CUDA: one call per captured graph, and ``AMORTISED_CALLS`` calls
captured in one graph, divided by their number (what a layer pays inside a captured decode step).
``ours_kv`` and ``ours+scatter`` are checked against the float64 reference and
``ops.reference.kv_cache_write`` (the whole cache: nothing else written). :func:`run_kv_cache`
measures (through ``harness.measure``), :func:`format_kv_table` and :func:`kv_bar_verdict` present.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from .cases import bytes_moved, make_kv_inputs
from .catalog import AMORTISED_CALLS, BAR_LARGE_TOKENS, BAR_SMALL_TOKENS, KV_BLOCK_SIZE, KV_OP, KV_PROVIDERS
from .harness import (Case, KVRow, Timed, checked_calls, checked_providers, checked_tokens, max_rel_err, measure,
                      run_meta)
from .report import cells, ratio
from .timing import TIMINGS_PER_ROW, Timer, copy_calls, launch_floor

__all__ = ["KV_BAR_COPY", "KV_BAR_PROLOGUE", "KV_BAR_UNFUSED", "SCATTER_TILE", "format_kv_table", "kv_bar_verdict",
           "run_kv_cache", "scatter_kv"]

#: The bar of issue 11, both timing modes: at T <= BAR_SMALL_TOKENS ours_kv <= 1.15 x ours (the
#: prologue alone) and <= 0.8 x ours+scatter; at T >= BAR_LARGE_TOKENS ours_kv <= 1.15 x copy_kv.
KV_BAR_PROLOGUE = 1.15
KV_BAR_UNFUSED = 0.8
KV_BAR_COPY = 1.15
#: Elements of k (and of v) one program of :func:`scatter_kv` stores, at most.
SCATTER_TILE = 2048


@functools.lru_cache(maxsize=None)
def _scatter_kernel():
    """The scatter kernel of :func:`scatter_kv`, defined on first use (Triton is imported lazily)."""
    import triton
    import triton.language as tl

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

    return scatter_kernel


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
    _scatter_kernel()[grid](k, v, key_cache, value_cache, slot_mapping, k.stride(0), v.stride(0), block_size,
                            key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), num_kv_heads,
                            HEAD_DIM=head_dim, HEADS=heads, BLOCK_D=block_d,
                            num_warps=max(1, min(8, heads * block_d // 256)))


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
    from ..ops import reference
    from ..ops.models import BENCH_GEOMETRIES, model
    from ..ops.split_qkv_rmsnorm_rope import split_qkv_rmsnorm_rope as prologue
    from ..ops.split_qkv_rmsnorm_rope_kv_cache import split_qkv_rmsnorm_rope_kv_cache as fused

    is_cpu = device.type == "cpu"
    tokens = checked_tokens(tokens, is_cpu)
    providers = checked_providers(providers, KV_PROVIDERS)
    calls = checked_calls(calls, is_cpu)
    geometries = tuple(geometries or BENCH_GEOMETRIES)
    timer = Timer(device, reps or (3 if is_cpu else 50))
    launch = launch_floor(device, timer)

    def make_case(layer, count: int) -> Case:
        name, tp = layer
        geometry = model(name).shard(tp)
        args, cache = make_kv_inputs(geometry, count, device, seed=count)
        nbytes = bytes_moved(geometry, count, kv_cache=True)
        ref = reference.split_qkv_rmsnorm_rope(**args)
        initial = cache["key_cache"].clone(), cache["value_cache"].clone()
        expected = None
        if {"ours_kv", "ours+scatter"} & set(providers):
            expected = reference.kv_cache_write(
                initial[0].cpu(), initial[1].cpu(), ref[1].cpu(), ref[2].cpu(), cache["slot_mapping"].cpu(),
                geometry.num_kv_heads, geometry.head_dim, cache_layout="nhd")

        def ours_kv():
            return fused(**args, **cache)

        def ours_scatter():
            out = prologue(**args)
            scatter_kv(out[1], out[2], cache["key_cache"], cache["value_cache"], cache["slot_mapping"])
            return out

        def ours():
            return prologue(**args)

        def check(provider: str, fn) -> float:  # from the initial caches
            cache["key_cache"].copy_(initial[0])
            cache["value_cache"].copy_(initial[1])
            return _kv_error(provider, fn(), ref, cache, expected)

        table = {provider: Timed([fn] * TIMINGS_PER_ROW, check=functools.partial(check, provider, fn))
                 for provider, fn in (("ours_kv", ours_kv), ("ours+scatter", ours_scatter), ("ours", ours))}
        if "copy_kv" in providers:
            table["copy_kv"] = Timed(copy_calls(device, nbytes))

        def row(provider: str, timed: Timed, err: float) -> KVRow:
            return KVRow(name, tp, geometry.label, count, provider, timed.best(timer), timed.best(timer, calls), calls,
                         err, nbytes)

        return Case(f"{name} tp{tp} T={count}", {p: table[p] for p in providers}, row)

    rows = measure(geometries, tokens, make_case, progress)
    meta = run_meta(device, KV_OP) | {"launch_floor_us": launch, "amortised_calls": calls, "cache_layout": "nhd",
                                   "cache_dtype": "bf16", "block_size": KV_BLOCK_SIZE}
    return {"rows": rows, "meta": meta}


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
    by_key = cells(rows)
    providers = [p for p in KV_PROVIDERS if any(p in v for v in by_key.values())]
    lines = [f"device {meta['device']}: empty-kernel replay {meta['launch_floor_us']:.2f} us; "
             f"{meta['cache_dtype']} {meta['cache_layout']} cache, block {meta['block_size']}, one random slot a token"]
    amortised = f"amortised: {meta['amortised_calls']} calls a timing (one captured graph on CUDA), per call"
    for title, attr in (("one call a timing (a captured graph on CUDA)", "us"), (amortised, "us_amortised")):
        lines.append(f"{KV_OP}, {title}:")
        head = f"{'geometry':24} {'T':>6} " + " ".join(f"{p + ' us':>15}" for p in providers)
        head += f" {'kv/ours':>8} {'kv/(ours+scatter)':>17} {'kv/copy':>8}" + (f" {'err':>8}" if attr == "us" else "")
        lines.append(head)
        for (_, _, label, count), row in by_key.items():
            line = f"{label:24} {count:6d} " + " ".join(
                f"{getattr(row[p], attr):15.2f}" if p in row else f"{'-':>15}" for p in providers)
            line += (f" {ratio(row, 'ours_kv', 'ours', attr):8.2f} {ratio(row, 'ours_kv', 'ours+scatter', attr):17.2f}"
                     f" {ratio(row, 'ours_kv', 'copy_kv', attr):8.2f}")
            if attr == "us":
                errs = [row[p].max_rel_err for p in ("ours_kv", "ours+scatter") if p in row]
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
    by_key = cells(result["rows"])
    calls = result["meta"].get("amortised_calls", AMORTISED_CALLS)
    out = []
    for mode, attr in (("graph", "us"), (f"amortised x{calls}", "us_amortised")):
        for name, small, other, bar in (
                (f"T<={BAR_SMALL_TOKENS} {mode}: ours_kv/ours", True, "ours", KV_BAR_PROLOGUE),
                (f"T<={BAR_SMALL_TOKENS} {mode}: ours_kv/(ours+scatter)", True, "ours+scatter", KV_BAR_UNFUSED),
                (f"T>={BAR_LARGE_TOKENS} {mode}: ours_kv/copy_kv", False, "copy_kv", KV_BAR_COPY)):
            picked = [(key, ratio(row, "ours_kv", other, attr)) for key, row in by_key.items()
                      if (key[3] <= BAR_SMALL_TOKENS if small else key[3] >= BAR_LARGE_TOKENS)
                      and "ours_kv" in row and other in row]
            if not picked:
                continue
            worst = max(value for _, value in picked)
            out.append(f"{name} worst {worst:.2f} ({'PASS' if worst <= bar else 'FAIL'} <= {bar}; issue 11)")
            out.extend(f"  over: {key[2]} T={key[3]} {value:.2f}" for key, value in picked if not value <= bar)
    return out
