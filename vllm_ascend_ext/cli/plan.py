"""``vllm-ascend-ext plan``: the launch plans of a model's attention prologue, per TP size.

For a preset of ``ops/models.py`` or a Hugging Face ``config.json`` (see
:mod:`vllm_ascend_ext.cli.geometry`), for each of its layer geometries (one, or one per layer
kind that differs: Gemma-4's sliding, full and KV-shared layers) at each ``--tp``: the geometry
one rank sees (with the gate, v-norm, mRoPE sections, q-only), then

* Ascend: the tile (tokens x heads), every UB buffer of the tile by name and bytes against the
  UB capacity and the budget left after the compiler's reserve, and the grid by token count;
* CUDA: the large plan's tile, warps and program cap, the small-batch plan's and the token
  count up to which it is used, and the grid by token count under the plan the op picks there.

The plans are the ones the op launches with (``ops/tiling``), computed from the device facts of
``ops/device.py`` (the attached device, else the environment, else the per-SoC defaults) or
from ``--soc`` / ``--num-sms``.
"""

from __future__ import annotations

import json

from .common import CliError
from .geometry import DTYPE_BYTES, override, parse_int_list, resolve_models, shard_checked

__all__ = ["add_parser", "canonical_soc", "plans_for", "run"]

TARGETS = ("ascend", "cuda", "both")
DEFAULT_TOKENS = "1,64,4096,16384"


def canonical_soc(name: str) -> str:
    """The SoC ``name`` spelled as CANN spells it (any case accepted).

    Raises
    ------
    CliError
        When ``name`` is not an SoC of ``ops/device.py``'s table.
    """
    from ..ops import device

    for soc in device.ASCEND_SOC_DEFAULTS:
        if soc.lower() == name.strip().lower():
            return soc
    raise CliError(f"--soc {name!r} is not known; known: {', '.join(sorted(device.ASCEND_SOC_DEFAULTS))} "
                   "(any case; or give --vector-cores and --ub-bytes)")


def _facts(args):
    """The Ascend and CUDA facts to plan for: the options', else ``ops/device.py``'s.

    A malformed ``VLLM_ASCEND_EXT_*`` variable raises ``SettingError``, printed as one line.
    """
    from ..ops import device

    if args.soc is None:
        base = device.ascend_facts(None)
        soc, cores, ub, source = base.soc, base.num_vector_cores, base.ub_bytes, base.source
    else:
        soc = canonical_soc(args.soc)
        (cores, ub), source = device.ASCEND_SOC_DEFAULTS[soc], "--soc"
    if args.vector_cores is not None or args.ub_bytes is not None:
        source = "command line"
    ascend = device.AscendFacts(soc=soc, num_vector_cores=args.vector_cores or cores,
                                ub_bytes=args.ub_bytes or ub, source=source)
    if args.num_sms is not None:
        cuda = device.CudaFacts(name="(--num-sms)", num_sms=args.num_sms, source="command line")
    else:
        cuda = device.cuda_facts(None)
    return ascend, cuda


def plans_for(resolved, tp: int, dtype: str, cache_dtype: str, ascend_facts, cuda_facts, tokens) -> dict:
    """Everything ``plan`` prints for one TP size, as a JSON-ready dictionary.

    Parameters
    ----------
    resolved : ResolvedModel
        Whole-model geometry and where it was read from.
    tp : int
        Tensor-parallel size.
    dtype, cache_dtype : str
        ``bf16``, ``fp16`` or ``fp32`` for qkv and for the cos/sin cache.
    ascend_facts : AscendFacts
    cuda_facts : CudaFacts
    tokens : sequence of int
        Token counts to show the grid for.

    Raises
    ------
    CliError
        When ``tp`` does not shard the model, the op refuses the geometry (the line names the
        config file and the field), or no tile fits the UB.
    """
    from ..ops.tiling import ascend, cuda

    geometry, shape = shard_checked(resolved, tp, DTYPE_BYTES[dtype], DTYPE_BYTES[cache_dtype])
    try:
        a_plan = ascend.plan(shape, ascend_facts)
    except ValueError as exc:
        raise CliError(f"tp={tp}: no Ascend tile fits: {exc}") from None
    c_plan = cuda.plan(shape, cuda_facts)
    c_small = cuda.small_batch_plan(shape, cuda_facts)
    c_small_max = cuda.small_batch_max_tokens(shape, cuda_facts)
    c_by_tokens = {t: cuda.plan_for_tokens(shape, cuda_facts, t) for t in tokens}
    budget = ascend.ub_budget(ascend_facts)
    return {
        "name": resolved.spec.name,
        "tp": tp,
        "geometry": {
            "label": geometry.label, "num_q_heads": geometry.num_q_heads,
            "num_kv_heads": geometry.num_kv_heads, "head_dim": geometry.head_dim,
            "rotary_dim": geometry.rotary_dim, "is_neox": geometry.is_neox,
            "qk_norm": geometry.qk_norm, "weight_offset": geometry.weight_offset, "eps": geometry.eps,
            "q_gate": geometry.q_gate, "v_norm": geometry.v_norm,
            "mrope_section": list(geometry.mrope_section) if geometry.mrope_section else None,
            "mrope_interleaved": geometry.mrope_interleaved,
        },
        "ascend": {
            "soc": ascend_facts.soc, "vector_cores": ascend_facts.num_vector_cores,
            "facts_source": ascend_facts.source,
            "block_tokens": a_plan.block_tokens, "block_heads": a_plan.block_heads,
            "head_blocks": a_plan.head_blocks(shape),
            "max_programs": a_plan.max_programs,
            "ub_buffers": [{"name": b.name, "bytes": b.nbytes, "source": b.source} for b in a_plan.ub_buffers],
            "ub_bytes": a_plan.ub_bytes, "ub_capacity": a_plan.ub_capacity, "ub_budget": budget,
            "grid": {str(t): {"tiles": a_plan.num_tiles(shape, t), "programs": a_plan.grid(shape, t)}
                     for t in tokens},
        },
        "cuda": {
            "gpu": cuda_facts.name, "sms": cuda_facts.num_sms, "facts_source": cuda_facts.source,
            "block_tokens": c_plan.block_tokens, "block_heads": c_plan.block_heads,
            "head_blocks": c_plan.head_blocks(shape),
            "num_warps": c_plan.num_warps, "max_registers": c_plan.max_registers,
            "max_programs": c_plan.max_programs,
            "small_batch": {"block_tokens": c_small.block_tokens, "block_heads": c_small.block_heads,
                            "num_warps": c_small.num_warps,
                            "max_tokens": c_small_max},
            "grid": {str(t): {"tiles": p.num_tiles(shape, t), "programs": p.grid(shape, t),
                              "plan": "small-batch" if t <= c_small_max else "large"}
                     for t, p in c_by_tokens.items()},
        },
    }


def _grid_lines(grid: dict) -> list[str]:
    return [f"    {int(t):>7} tokens -> {g['programs']:>5} programs over {g['tiles']:>6} tiles"
            + (f" ({g['plan']} plan)" if "plan" in g else "") for t, g in grid.items()]


def format_plan(entry: dict, targets: str) -> str:
    """One TP size's plans as text."""
    geo = entry["geometry"]
    style = "NeoX" if geo["is_neox"] else "GPT-J"
    norm = ("q/k RMSNorm" + (f" (x({geo['weight_offset']:g}+w))" if geo["weight_offset"] else "")
            if geo["qk_norm"] else "no q/k norm")
    kv = f"{geo['num_kv_heads']} kv heads" if geo["num_kv_heads"] else "no k/v (q only)"
    extras = "".join([
        ", gate beside q" if geo["q_gate"] else "",
        ", v RMSNorm (no weight)" if geo["v_norm"] else "",
        (f", mRoPE {'interleaved' if geo['mrope_interleaved'] else 'contiguous'} t/h/w "
         + "/".join(map(str, geo["mrope_section"]))) if geo["mrope_section"] else "",
    ])
    lines = [f"tp={entry['tp']}: {geo['num_q_heads']} q heads, {kv}, "
             f"head_dim {geo['head_dim']}, rotary {geo['rotary_dim']} ({style}), {norm}, eps {geo['eps']:g}{extras}"]
    if targets in ("ascend", "both"):
        a = entry["ascend"]
        lines.append(f"  Ascend {a['soc']} ({a['vector_cores']} vector cores, {a['ub_capacity']} B UB; "
                     f"facts: {a['facts_source']})")
        lines.append(f"    tile {a['block_tokens']} tokens x {a['block_heads']} heads "
                     f"({a['block_tokens'] * a['block_heads']} rows), {a['head_blocks']} head blocks, "
                     f"grid <= {a['max_programs']} programs")
        width = max(len(b["name"]) for b in a["ub_buffers"])
        lines.append(f"    {'UB buffer':<{width}}  {'kind':<11} {'bytes':>8}  of capacity")
        for buf in a["ub_buffers"]:
            lines.append(f"    {buf['name']:<{width}}  {buf['source']:<11} {buf['bytes']:>8}  "
                         f"{100 * buf['bytes'] / a['ub_capacity']:5.1f}%")
        lines.append(f"    {'total':<{width}}  {'':<11} {a['ub_bytes']:>8}  "
                     f"{100 * a['ub_bytes'] / a['ub_capacity']:5.1f}%  (budget {a['ub_budget']} B after the "
                     f"compiler's reserve, capacity {a['ub_capacity']} B)")
        lines.append("    grid by tokens:")
        lines += _grid_lines(a["grid"])
    if targets in ("cuda", "both"):
        c = entry["cuda"]
        lines.append(f"  CUDA {c['gpu']} ({c['sms']} SMs; facts: {c['facts_source']})")
        small = c["small_batch"]
        lines.append(f"    large plan: tile {c['block_tokens']} tokens x {c['block_heads']} heads, "
                     f"{c['head_blocks']} head blocks, {c['num_warps']} warps"
                     + (f" (at most {c['max_registers']} registers a thread)" if c["max_registers"] else "")
                     + f", grid <= {c['max_programs']} programs")
        lines.append(f"    small-batch plan (up to {small['max_tokens']} tokens): tile {small['block_tokens']} "
                     f"tokens x {small['block_heads']} heads, {small['num_warps']} warps")
        lines.append("    grid by tokens:")
        lines += _grid_lines(c["grid"])
    return "\n".join(lines)


def add_parser(subparsers) -> None:
    """Declare ``plan`` and its options."""
    parser = subparsers.add_parser(
        "plan", help="launch plans (tile, UB buffers, grid) of a model for Ascend and CUDA",
        description="Show the launch plan of the fused op for a model's attention layers at the "
                    "given tensor-parallel sizes: rows per tile, UB bytes by buffer against "
                    "capacity, and the grid, for Ascend and CUDA.")
    parser.add_argument("model", help="a preset of ops/models.py (e.g. Qwen3-8B, Gemma-4-31B or one of its "
                                      "layer kinds, Gemma-4-31B:full) or a Hugging Face config.json (or the "
                                      "folder holding it)")
    parser.add_argument("--tp", default="1", help="tensor-parallel sizes, comma-separated (default 1)")
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bf16", help="qkv dtype (default bf16)")
    parser.add_argument("--cache-dtype", choices=sorted(DTYPE_BYTES), default="fp32",
                        help="cos/sin cache dtype (default fp32)")
    parser.add_argument("--tokens", default=DEFAULT_TOKENS,
                        help=f"token counts to show the grid for (default {DEFAULT_TOKENS})")
    parser.add_argument("--target", choices=TARGETS, default="both", help="which plans to show (default both)")
    parser.add_argument("--soc", help="plan for this Ascend SoC (default: the attached NPU, "
                                      "else $VLLM_ASCEND_EXT_SOC, else Ascend910B3)")
    parser.add_argument("--vector-cores", type=_positive, help="override the vector-core count")
    parser.add_argument("--ub-bytes", type=_positive, help="override the UB bytes per vector core")
    parser.add_argument("--num-sms", type=_positive, help="plan for a GPU with this many SMs (default H200's 132)")
    style = parser.add_mutually_exclusive_group()
    style.add_argument("--neox", dest="is_neox", action="store_const", const=True, help="force NeoX rotary")
    style.add_argument("--gptj", dest="is_neox", action="store_const", const=False, help="force GPT-J rotary")
    norm = parser.add_mutually_exclusive_group()
    norm.add_argument("--qk-norm", dest="qk_norm", action="store_const", const=True, help="force q/k RMSNorm")
    norm.add_argument("--no-qk-norm", dest="qk_norm", action="store_const", const=False, help="force no q/k norm")
    parser.add_argument("--rotary-dim", type=_positive, help="override the rotary dims")
    parser.add_argument("--json", action="store_true", help="print the plans as JSON")
    parser.set_defaults(run=run)


def _positive(text: str) -> int:
    import argparse

    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def run(args) -> int:
    """Print the plans of every geometry of ``args.model`` at every ``--tp``."""
    tps = parse_int_list(args.tp, "--tp")
    tokens = parse_int_list(args.tokens, "--tokens")
    models = [override(resolved, is_neox=args.is_neox, qk_norm=args.qk_norm, rotary_dim=args.rotary_dim)
              for resolved in resolve_models(args.model)]
    first = models[0]
    ascend_facts, cuda_facts = _facts(args)
    entries = [[plans_for(resolved, tp, args.dtype, args.cache_dtype, ascend_facts, cuda_facts, tokens)
                for tp in tps] for resolved in models]
    model_name = first.spec.name if len(models) == 1 else first.spec.name.split(":")[0]
    if args.json:
        print(json.dumps({"model": model_name, "source": first.source, "notes": list(first.notes),
                          "geometries": [{"name": m.spec.name, "note": m.spec.note} for m in models],
                          "dtype": args.dtype, "cache_dtype": args.cache_dtype,
                          "plans": [entry for group in entries for entry in group]}, indent=2))
        return 0
    source = "preset" if first.source == "preset" else f"from {first.source}"
    print(f"{model_name} ({source}); qkv {args.dtype}, cos/sin cache {args.cache_dtype}")
    for note in first.notes:
        print(f"  note: {note}")
    if len(models) > 1:
        print(f"  {len(models)} layer geometries: {', '.join(m.spec.name for m in models)}")
    for resolved, group in zip(models, entries):
        if len(models) > 1:
            print()
            print(f"== {resolved.spec.name}: {resolved.spec.note}")
        for entry in group:
            print()
            print(format_plan(entry, args.target))
    return 0
