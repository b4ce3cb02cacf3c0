#!/usr/bin/env python3
"""Sweep the CUDA MLA plan's knobs, each of the two launches timed apart, on the local GPU.

For each MLA model and token count, times the prologue (``split_qkv_rmsnorm_rope_mla`` with the
bf16 combined cache write) and the q side (``mla_q_rope_``) separately under every plan of the
sweep (CUDA-graph replay, the benchmark's :class:`Timer`), each against a plain copy of the same
bytes of that launch, and prints the current plan (``ops/tiling/cuda.py``'s ``mla_plan``) beside
the best. The numbers back the MLA constants of ``ops/tiling/cuda.py``; their outcome is one line
in ``docs/performance.md``. ``--json`` keeps every measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys

import torch
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

from vllm_ascend_ext.bench import Timer, copy_replay
from vllm_ascend_ext.bench_mla import make_mla_case
from vllm_ascend_ext.ops import mla_q_rope_, split_qkv_rmsnorm_rope_mla, tiling, validation
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import mla_model
from vllm_ascend_ext.ops.tiling import MLAPlan, MLAShape, cuda

#: (model, tp) rows: the widest q side, the narrowest, and no q latent.
ROWS = (("DeepSeek-V3", 1), ("Kimi-K2", 8), ("DeepSeek-V2-Lite", 1))


def _bytes(spec, heads: int, tokens: int) -> tuple[int, int]:
    """Fewest bytes of the prologue (with the cache write) and of the q side, bf16 data, an fp32 cos/sin
    row of ``rope_dim`` a token each (``bench_mla.mla_bytes_moved`` is their sum)."""
    lq, lkv, r = spec.q_lora_rank, spec.kv_lora_rank, spec.rope_dim
    prologue = tokens * (2 * ((lq + lkv + r) + (lq + lkv + r) + (lkv + r)) + r * 4) + 2 * (lq + lkv)
    q_side = tokens * (2 * 2 * heads * r + r * 4)
    return prologue, q_side


def _shapes(case: dict) -> tuple[MLAShape, MLAShape]:
    """The prologue's and the q side's plan shapes, as the validator gives them."""
    args = case["args"]
    call = validation.split_qkv_rmsnorm_rope_mla(**args, kv_cache=case["kv_cache"], slot_mapping=case["slot_mapping"])
    q_call = validation.mla_q_rope_(case["q"], args["cos_sin_cache"], args["positions"], args["rope_dim"],
                                    is_neox=args["is_neox"])
    return call.shape, q_call.shape


def _candidates(base: MLAPlan, q_side: bool, facts, args) -> list[MLAPlan]:
    plans = []
    block_tokens, warps_list = (args.q_block_tokens, args.q_warps) if q_side else (args.block_tokens, args.warps)
    for tokens, warps, per_sm in itertools.product(block_tokens, warps_list, args.per_sm):
        common = dict(block_tokens=tokens, num_warps=warps, max_programs=per_sm * facts.num_sms)
        if q_side:
            plans += [dataclasses.replace(base, block_heads=h, **common) for h in args.block_heads]
        else:
            chunks = args.q_chunk if base.q_chunk > 1 else [1]  # 1: no q latent
            plans += [dataclasses.replace(base, q_chunk=c, **common) for c in chunks]
    return list(dict.fromkeys(plans))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--block-tokens", type=int, nargs="+", default=[2, 4, 8, 16],
                        help="the prologue's tokens a tile (the q side's: --q-block-tokens)")
    parser.add_argument("--q-block-tokens", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--warps", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--q-warps", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--per-sm", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--block-heads", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--q-chunk", type=int, nargs="+", default=[512, 2048],
                        help="q_c's chunk (2048: the 1536-lane row held whole, masked)")
    parser.add_argument("--reps", type=int, default=20, help="graph replays a timing")
    parser.add_argument("--json", help="write every measurement here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("tune_mla_plan: needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    timer = Timer(device, args.reps)
    facts = cuda_facts(torch.cuda.current_device())
    records = []
    for (name, tp), tokens in itertools.product(ROWS, args.tokens):
        spec = mla_model(name)
        heads = spec.num_heads // tp
        case = make_mla_case(spec, heads, tokens, device)
        a = case["args"]
        prologue_shape, q_shape = _shapes(case)
        nbytes = _bytes(spec, heads, tokens)
        launches = (
            ("prologue", prologue_shape, nbytes[0],
             lambda: split_qkv_rmsnorm_rope_mla(**a, kv_cache=case["kv_cache"], slot_mapping=case["slot_mapping"])),
            ("q_rope", q_shape, nbytes[1],
             lambda: mla_q_rope_(case["q"], a["cos_sin_cache"], a["positions"], a["rope_dim"], is_neox=a["is_neox"])),
        )
        for launch, shape, size, fn in launches:
            copy = copy_replay(device, timer, size)
            current = cuda.mla_plan(shape, facts)
            timings = {}
            for plan in [current, *_candidates(current, shape.q_rope, facts, args)]:
                with tiling.forced(plan=plan):
                    try:
                        timings[plan] = timer(fn)
                    except (CompilationError, OutOfResources, RuntimeError) as exc:  # reported, not fatal
                        print(f"  {launch} {plan}: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
            best = min(timings, key=timings.get)
            print(f"{name} tp{tp} T={tokens} {launch}: copy {copy:.2f} us; current {timings[current]:.2f} "
                  f"({timings[current] / copy:.2f}x) {current.block_tokens}t/{current.block_heads}h/"
                  f"{current.q_chunk}q/{current.num_warps}w/{current.max_programs // facts.num_sms}ps; best "
                  f"{timings[best]:.2f} ({timings[best] / copy:.2f}x) {best.block_tokens}t/{best.block_heads}h/"
                  f"{best.q_chunk}q/{best.num_warps}w/{best.max_programs // facts.num_sms}ps", flush=True)
            records += [dict(model=name, tp=tp, tokens=tokens, launch=launch, copy_us=copy, us=us,
                             current=plan == current, **dataclasses.asdict(plan)) for plan, us in timings.items()]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
