"""The multi-rank run: ``split_qkv_tp_rmsnorm_rope`` (issue 12: q/k norm across all heads and TP
ranks), one spawned process per rank.

:func:`run_tp_ranks` spawns the ranks; :func:`run_tp` is one rank's part, through
``harness.measure``: per layer and token count, ``ours_tp`` (the op, all-reduce on the group),
``unfused_tp`` (:func:`unfused_tp`, vLLM's PyTorch path) and ``copy+allreduce`` (the same-bytes
copy plus a bare all-reduce of the ``[T, 2]`` fp32 sums), each rank checked against the float64
reference of its shard (``cases.make_tp_inputs``); on CUDA the collective is captured in the CUDA
graph (:class:`_TPTimer`). The command is ``scripts/bench_split_qkv_tp_rmsnorm_rope.py``.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from .cases import bytes_moved, make_tp_inputs, tp_local_geometry
from .catalog import BAR_LARGE_TOKENS, BAR_SMALL_TOKENS, TP_CPU_TOKENS, TP_MODEL, TP_OP, TP_PROVIDERS
from .harness import Case, Timed, TPRow, checked_providers, checked_tokens, max_rel_err, measure, run_meta
from .prologue import native_rope
from .report import cells, ratio, summary, write_outputs
from .timing import COPY_CONFIGS, triton_copy

__all__ = ["L2_FLUSH_BYTES", "TP_BAR_COPY", "TP_BAR_UNFUSED", "TP_REPLAYS", "TP_WARMUP", "format_tp_table",
           "run_tp", "run_tp_ranks", "tp_bar_verdict", "tp_report", "unfused_tp"]

#: The bar of issue 12, per rank: at T <= BAR_SMALL_TOKENS ours_tp <= 0.7 x unfused_tp; at
#: T >= BAR_LARGE_TOKENS ours_tp <= 1.2 x copy+allreduce.
TP_BAR_UNFUSED = 0.7
TP_BAR_COPY = 1.2
#: CUDA timing of the multi-rank run: replays (or eager calls) timed one by one after warm-up
#: ones, the same count on every rank (a collective in each), the L2 flushed before each.
TP_REPLAYS = 100
TP_WARMUP = 10
L2_FLUSH_BYTES = 256 << 20


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
    return native_rope(q, cos, sin, head_dim, is_neox), native_rope(k, cos, sin, head_dim, is_neox), v


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


def _tp_providers(names, args: dict, ref: tuple, group, device: torch.device, tokens: int, nbytes: int) -> dict:
    """Each provider of the multi-rank run: the callables timed (the fastest counts) and the check."""
    from ..ops.split_qkv_tp_rmsnorm_rope import split_qkv_tp_rmsnorm_rope

    ours = functools.partial(split_qkv_tp_rmsnorm_rope, **args, all_reduce=group)
    unfused = functools.partial(unfused_tp, **args, all_reduce=group)
    table = {"ours_tp": Timed([ours], check=lambda: max_rel_err(ours(), ref)),
             "unfused_tp": Timed([unfused], check=lambda: max_rel_err(unfused(), ref))}
    if "copy+allreduce" in names:
        n = max(1, nbytes // 4)  # int16 elements: n read and n written
        src = torch.zeros(n, dtype=torch.int16, device=device)
        dst = torch.empty_like(src)
        sums = torch.zeros(tokens, 2, dtype=torch.float32, device=device)

        def copy_allreduce(block, warps):
            if device.type == "cpu":
                dst.copy_(src)  # no Triton copy kernel through the interpreter's loops
            else:
                triton_copy(src, dst, block, warps)
            _reduce_sum(sums, group)

        configs = COPY_CONFIGS if device.type != "cpu" else COPY_CONFIGS[:1]
        table["copy+allreduce"] = Timed([functools.partial(copy_allreduce, block, warps) for block, warps in configs])
    return {name: table[name] for name in names}


def run_tp(device: torch.device, group, tokens=None, providers=None, geometries=None,
           progress: Callable[[str], None] | None = None, reps: int | None = None) -> dict:
    """One rank's part of the multi-rank run: check, then time, every (layer, T, provider).

    Called on every rank of ``group`` with the same arguments (each provider calls the group's
    collective, in the same order everywhere). Providers: ``ours_tp``
    (``split_qkv_tp_rmsnorm_rope`` with ``all_reduce=group``), ``unfused_tp`` (:func:`unfused_tp`
    on the group) and ``copy+allreduce`` (a plain copy of the op's fewest bytes on this rank,
    ``cases.bytes_moved`` of its geometry, plus a bare all-reduce of a ``[T, 2]`` fp32 tensor).
    ``ours_tp`` and ``unfused_tp`` are checked against the float64 reference of this rank's
    shard (``cases.make_tp_inputs``) before they are timed (:class:`_TPTimer`).

    Parameters
    ----------
    device : torch.device
        This rank's device (a CUDA GPU, or the CPU through the Triton interpreter).
    group : torch.distributed.ProcessGroup
        The TP group (its size is ``tp``).
    tokens : sequence of int, optional
        Default ``catalog.GPU_TOKENS`` on CUDA, ``catalog.TP_CPU_TOKENS`` on CPU.
    providers : sequence of str, optional
        Any of ``catalog.TP_PROVIDERS`` (default all).
    geometries : sequence of (name, AttentionGeometry), optional
        The FULL (unsharded) layers; default ``catalog.TP_MODEL``'s row of ``ops.models``.
    progress : callable, optional
        Called with each row's line once it is measured.
    reps : int, optional
        CPU: calls per timing (default 3).

    Returns
    -------
    dict
        ``{"rows": [TPRow, ...], "meta": {...}}`` of this rank; ``meta`` holds ``op``
        (``catalog.TP_OP``), ``tp``, the device, the collective backend, the timing modes, any
        capture fallbacks and the versions.
    """
    import torch.distributed as dist

    from ..ops.models import model

    is_cpu = device.type == "cpu"
    tokens = checked_tokens(tokens, is_cpu, TP_CPU_TOKENS)
    providers = checked_providers(providers, TP_PROVIDERS)
    geometries = tuple(geometries or ((TP_MODEL, model(TP_MODEL)),))
    tp, rank = dist.get_world_size(group), dist.get_rank(group)
    timer = _TPTimer(device, group, reps or 3)

    def make_case(layer, count: int) -> Case:
        name, full = layer
        local = tp_local_geometry(full, tp)
        args, ref = make_tp_inputs(full, count, tp, rank, device, seed=count)
        nbytes = bytes_moved(local, count)
        label = f"{name} tp{tp} T={count}"

        def row(provider: str, timed: Timed, err: float) -> TPRow:
            us, how = min(timer(fn, f"{label} {provider} rank {rank}") for fn in timed.fns)
            return TPRow(name, tp, rank, local.label, count, provider, us, err, nbytes, how)

        return Case(label, _tp_providers(providers, args, ref, group, device, count, nbytes), row)

    def done(r: TPRow) -> None:
        if progress:
            progress(f"[rank {rank}] {r.model} tp{tp} {r.geometry} T={r.tokens} {r.provider}: {r.us:.2f} us "
                     f"({r.timing}), err {r.max_rel_err:.1e}")

    rows = measure(geometries, tokens, make_case, done=done)
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
    by_key = cells(rows, key=lambda r: (r.model, r.tp, r.geometry, r.tokens, r.rank))
    providers = [p for p in TP_PROVIDERS if any(p in v for v in by_key.values())]
    lines = [f"{TP_OP}: {meta['tp']} ranks ({meta['collective']}) on {meta['device']}, timing "
             f"{'/'.join(meta['timing'])} (graph: one call per CUDA-graph replay, collective captured; events: "
             f"eager calls; wall: CPU wall clock)"]
    lines += [f"capture fallback: {line}" for line in meta.get("capture_fallbacks", [])]
    lines.append(f"{'model':12} {'geometry':18} {'T':>6} {'rank':>4} " + " ".join(f"{p + ' us':>18}" for p in providers)
                 + f" {'ours/unfused':>12} {'ours/(copy+ar)':>14} {'err ours':>9} {'err unfused':>11}")
    for (name, _, label, count, rank), row in by_key.items():
        line = f"{name:12} {label:18} {count:6d} {rank:4d} " + " ".join(
            f"{row[p].us:18.2f}" if p in row else f"{'-':>18}" for p in providers)
        line += f" {ratio(row, 'ours_tp', 'unfused_tp'):12.2f} {ratio(row, 'ours_tp', 'copy+allreduce'):14.2f}"
        line += "".join(f" {row[p].max_rel_err:{w}.1e}" if p in row else f" {'-':>{w}}"
                        for p, w in (("ours_tp", 9), ("unfused_tp", 11)))
        lines.append(line)
    return "\n".join(lines)


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
    by_key = cells(result["rows"], key=lambda r: (r.model, r.geometry, r.tokens, r.rank))
    out = []
    for name, small, other, bar in (
            (f"T<={BAR_SMALL_TOKENS}: ours_tp/unfused_tp", True, "unfused_tp", TP_BAR_UNFUSED),
            (f"T>={BAR_LARGE_TOKENS}: ours_tp/(copy+allreduce)", False, "copy+allreduce", TP_BAR_COPY)):
        picked = [(key, ratio(row, "ours_tp", other)) for key, row in by_key.items()
                  if (key[2] <= BAR_SMALL_TOKENS if small else key[2] >= BAR_LARGE_TOKENS)
                  and "ours_tp" in row and other in row]
        if not picked:
            continue
        worst = max(value for _, value in picked)
        out.append(f"{name} worst {worst:.2f} over {len(picked)} (T, rank) rows "
                   f"({'PASS' if worst <= bar else 'FAIL'} <= {bar}; issue 12)")
        out.extend(f"  over: {key[0]} {key[1]} T={key[2]} rank {key[3]} {value:.2f}" for key, value in picked
                   if not value <= bar)
    return out


def tp_report(result: dict) -> tuple[str, list[str]]:
    """The text a multi-rank run prints and writes, and its failed checks (``report.summary``).

    Returns
    -------
    text : str
        :func:`format_tp_table`, then off the CPU the bar lines (:func:`tp_bar_verdict`, prefixed
        ``bar:``), on CPU ``report.CPU_DISCLAIMER``, then ``CHECK FAILED:`` lines.
    failures : list of str
        ``harness.check_rows``' lines.
    """
    return summary(result, format_tp_table(result), tp_bar_verdict(result))


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
    # A rank whose work is done leaves without the interpreter's shutdown: there, a gloo rank
    # aborted ("terminate called without an active exception", SIGABRT) in 2 of 10 runs on the
    # 2-core machine (torch 2.13 CPU), failing the run after its files were written; none in 12
    # with this exit. (A rank that raised still leaves through the finally, and spawn reports it.)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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
