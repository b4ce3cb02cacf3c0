"""The prologue run: ``split_qkv_rmsnorm_rope`` against the unfused eager and ``torch.compile`` paths.

For each geometry of ``ops.models.BENCH_GEOMETRIES`` and each token count it times three
providers on the device:

* ``eager``: the unfused prologue as vLLM runs it natively (:func:`unfused_prologue`: split, view,
  RMSNorm in fp32 cast back, view, RoPE by ``index_select`` of the cache);
* ``compile``: ``torch.compile`` of that same code;
* ``ours``: ``vllm_ascend_ext.ops.split_qkv_rmsnorm_rope`` (out of place).

The floor is the fewest bytes the prologue must move (``cases.bytes_moved``: read q and k, write q
and k, read one cos/sin row per token) over the device-to-device copy bandwidth measured in the
same run; the launch floor is an empty Triton kernel replayed from a CUDA graph. Beside the floor
each row has the same-bytes copy (``timing.copy_replay``). Before timing, every provider's output
is checked against the float64 reference of ``ops.reference`` on inputs from its generator
(``cases.make_inputs``). On CPU the kernel runs through the Triton interpreter: the sizes are small
and the timings mean nothing for NPU or GPU speed; the run is a correctness and plumbing check.

:func:`run` measures (through ``harness.measure``), :func:`format_table` and :func:`bar_verdict`
present (the bars of issues 2 and 10, CUDA runs).
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from .cases import bytes_moved, make_inputs
from .catalog import BAR_LARGE_TOKENS, BAR_SMALL_TOKENS, OP, PROVIDERS
from .harness import Case, Row, Timed, checked_providers, checked_tokens, max_rel_err, measure, run_meta
from .report import cells
from .timing import TIMINGS_PER_ROW, Timer, copy_bandwidth, copy_replay, launch_floor

__all__ = ["BAR_FLOOR_RATIO", "BAR_LAUNCH_RATIO", "COPY_BAR_LARGE", "COPY_BAR_SMALL", "COPY_BAR_SMALL_TOKENS",
           "bar_verdict", "format_table", "native_rope", "run", "unfused_prologue"]

#: The bar of issue 2, checked at the end of a CUDA run.
BAR_FLOOR_RATIO = 1.3  # ours <= 1.3 x floor for T >= BAR_LARGE_TOKENS
BAR_LAUNCH_RATIO = 1.3  # ours <= 1.3 x empty-kernel replay for T <= BAR_SMALL_TOKENS
#: The bar of issue 10, against the same-bytes copy of the same run: ours <= 1.10 x the copy for
#: T >= BAR_LARGE_TOKENS and <= 1.25 x for T <= COPY_BAR_SMALL_TOKENS.
COPY_BAR_LARGE = 1.10
COPY_BAR_SMALL = 1.25
COPY_BAR_SMALL_TOKENS = 256


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
    return (native_rope(q, cos, sin, head_dim, is_neox), native_rope(k, cos, sin, head_dim, is_neox),
            v) + ((gate,) if q_gate else ())


def native_rope(x, cos, sin, head_dim: int, is_neox: bool):
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


def run(device: torch.device, tokens=None, providers=None, geometries=None,
        progress: Callable[[str], None] | None = None, reps: int | None = None) -> dict:
    """Check and time every (geometry, token count, provider).

    Parameters
    ----------
    device : torch.device
        Where to run (CUDA, NPU or CPU through the Triton interpreter).
    tokens : sequence of int, optional
        Token counts (default: ``GPU_TOKENS`` on an accelerator, ``CPU_TOKENS`` on CPU).
    providers : sequence of str, optional
        Any of :data:`~.catalog.PROVIDERS` (default all of them).
    geometries : sequence of (model name, tp), optional
        Default ``ops.models.BENCH_GEOMETRIES``.
    progress : callable, optional
        Called with a short label before each measurement; the run is over when this returns.
    reps : int, optional
        Repetitions per timing where the device has no graph replay (NPU, CPU).

    Returns
    -------
    dict
        ``{"rows": [Row, ...], "meta": {...}}``; ``meta`` holds the op, the device, the copy
        bandwidth, the launch floor and the versions.

    Raises
    ------
    ValueError
        Naming ``tokens`` or ``providers`` when one is not a positive int / not a provider.
    """
    from ..ops import split_qkv_rmsnorm_rope
    from ..ops.models import BENCH_GEOMETRIES, model
    from ..ops.reference import split_qkv_rmsnorm_rope as reference

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
    table = {"eager": unfused_prologue, "compile": compiled, "ours": split_qkv_rmsnorm_rope}
    bandwidth = copy_bandwidth(device, timer)
    launch = launch_floor(device, timer)

    def make_case(layer, count: int) -> Case:
        name, tp = layer
        geometry = model(name).shard(tp)
        args = make_inputs(geometry, count, device, seed=count)
        ref = reference(**args)
        nbytes = bytes_moved(geometry, count)
        floor = nbytes / bandwidth * 1e6 if bandwidth == bandwidth else float("nan")
        copy_us = copy_replay(device, timer, nbytes)

        def timed(fn) -> Timed:
            call = functools.partial(fn, **args)
            return Timed([call] * TIMINGS_PER_ROW, check=lambda: max_rel_err(call(), ref))

        def row(provider: str, timed: Timed, err: float) -> Row:
            return Row(name, tp, geometry.label, count, provider, timed.best(timer), err, nbytes, floor, launch,
                       copy_us)

        return Case(f"{name} tp{tp} T={count}", {p: timed(table[p]) for p in providers}, row)

    rows = measure(geometries, tokens, make_case, progress)
    meta = run_meta(device, OP) | {"copy_bandwidth_GBps": bandwidth / 1e9, "launch_floor_us": launch}
    return {"rows": rows, "meta": meta}


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
        ours/launch floor, the same-bytes copy and ours/copy, compile/ours, our error.
    """
    rows, meta = result["rows"], result["meta"]
    by_key = cells(rows)
    providers = [p for p in PROVIDERS if any(p in v for v in by_key.values())]
    head = f"{'geometry':24} {'T':>6} " + " ".join(f"{p + ' us':>11}" for p in providers)
    head += (f" {'ours GB/s':>10} {'floor us':>9} {'ours/floor':>10} {'ours/launch':>11}"
             f" {'copy us':>8} {'ours/copy':>9} {'compile/ours':>12} {'err':>8}")
    lines = [f"device {meta['device']}: copy {meta['copy_bandwidth_GBps']:.0f} GB/s, "
             f"empty-kernel replay {meta['launch_floor_us']:.2f} us", head]
    for (model_name, tp, label, count), row in by_key.items():
        ours = row.get("ours")
        line = f"{label:24} {count:6d} " + " ".join(f"{row[p].us:11.2f}" for p in providers)
        if ours:
            compile_ratio = row["compile"].us / ours.us if "compile" in row else float("nan")
            line += (f" {ours.gbps:10.1f} {ours.floor_us:9.2f} {ours.us / ours.floor_us:10.2f}"
                     f" {ours.us / ours.launch_us:11.2f} {ours.copy_us:8.2f} {ours.us / ours.copy_us:9.2f}"
                     f" {compile_ratio:12.2f} {ours.max_rel_err:8.1e}")
        lines.append(line)
    return "\n".join(lines)


def bar_verdict(result: dict) -> list[str]:
    """Issue 2's bar, line by line (CUDA runs): floor ratio, launch ratio, ours vs compile; then
    issue 10's: ours against the same-bytes copy at large and at small token counts.

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
