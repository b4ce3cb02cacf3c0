#!/usr/bin/env python3
"""Sweep the CUDA MLA plan's knobs, each of the two launches timed apart, on the local GPU.

For each MLA model and token count, times the prologue (``split_qkv_rmsnorm_rope_mla`` with the
bf16 combined cache write) and the q side (``mla_q_rope_``) separately under every plan of the
sweep (CUDA-graph replay, the benchmark's :class:`Timer`), each against a plain copy of the same
bytes of that launch, and prints the current plan (``ops/tiling/cuda.py``'s
``mla_plan_for_tokens``: the small-batch plan at small token counts) beside the best. The numbers
back the MLA constants of ``ops/tiling/cuda.py``; their outcome is one line in
``docs/performance.md``. ``--json`` keeps every measurement. V2-Lite's rows time its prologue
without ``q`` and the q side apart, the op's two-launch form; the MLA step runs it as one launch
(the prologue given ``q``: ``cases.mla_launches``), which the benchmark times.

``--floor`` times, instead of the sweep, both launches' bytes as one copy (the benchmark's ``copy``
column) and as two copies in one graph, one a launch (what two launches pay in ramps and tails
that one does not); then each launch under the current plan against two copies of its bytes: the
plain contiguous copy and a copy with the launch's own access pattern and no math
(:func:`pattern_copies`: the q side reads and writes back ``q[..., nope:]`` in place, ``R`` of every
``nope + R`` lanes; the prologue reads ``qkv_lora``'s rows and writes ``q_c``, ``kv_c``, ``k_pe`` and
the cache row at the token's slot). Where the pattern copy is itself slower than the contiguous
one, that gap is the access pattern's, not the math's.

``--both`` times, instead of each launch apart, both launches in one call (the benchmark's
``ours``) under each of the prologue's candidate plans, the q side under its own plan
(:func:`both_launches`), one call a graph and ``AMORTISED_CALLS`` calls a graph, the current plan
first: an A/B of a prologue plan as the benchmark would see it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import sys

import torch
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

from vllm_ascend_ext.bench.cases import make_mla_case
from vllm_ascend_ext.bench.catalog import AMORTISED_CALLS
from vllm_ascend_ext.bench.timing import Timer, copy_calls, copy_replay
from vllm_ascend_ext.ops import mla_q_rope_, split_qkv_rmsnorm_rope_mla, tiling, validation_mla
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import mla_model
from vllm_ascend_ext.ops.tiling import MLAPlan, MLAShape, cuda

#: (model, tp) rows: the widest q side, the narrowest, and no q latent.
ROWS = (("DeepSeek-V3", 1), ("Kimi-K2", 8), ("DeepSeek-V2-Lite", 1))


def _bytes(spec, heads: int, tokens: int) -> tuple[int, int]:
    """Fewest bytes of the prologue (with the cache write) and of the q side, bf16 data, an fp32 cos/sin
    row of ``rope_dim`` a token each (``bench.cases.mla_bytes_moved`` is their sum)."""
    lq, lkv, r = spec.q_lora_rank, spec.kv_lora_rank, spec.rope_dim
    prologue = tokens * (2 * ((lq + lkv + r) + (lq + lkv + r) + (lkv + r)) + r * 4) + 2 * (lq + lkv)
    q_side = tokens * (2 * 2 * heads * r + r * 4)
    return prologue, q_side


def _shapes(case: dict) -> tuple[MLAShape, MLAShape]:
    """The prologue's and the q side's plan shapes, as the validator gives them."""
    args = case["args"]
    call = validation_mla.split_qkv_rmsnorm_rope_mla(**args, kv_cache=case["kv_cache"],
                                                     slot_mapping=case["slot_mapping"])
    q_call = validation_mla.mla_q_rope_(case["q"], args["cos_sin_cache"], args["positions"], args["rope_dim"],
                                        is_neox=args["is_neox"])
    return call.shape, q_call.shape


@functools.lru_cache(maxsize=None)
def _pattern_kernels():
    """The two no-math copies (Triton imported on first use)."""
    import triton
    import triton.language as tl

    @triton.jit
    def q_side_copy(q_ptr, rows, row_stride, OFFSET: tl.constexpr, R: tl.constexpr, BLOCK_ROWS: tl.constexpr):
        # q[..., OFFSET:OFFSET + R] of rows [T * H] read and written back in place.
        row = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)[:, None]
        lanes = tl.arange(0, R)[None, :]
        mask = row < rows
        ptrs = q_ptr + row * row_stride + OFFSET + lanes
        tl.store(ptrs, tl.load(ptrs, mask=mask), mask=mask)

    @triton.jit
    def prologue_copy(x_ptr, q_c_ptr, kv_c_ptr, k_pe_ptr, cache_ptr, slot_ptr, tokens, x_stride, cache_stride,
                      LQ: tl.constexpr, LKV: tl.constexpr, R: tl.constexpr, CHUNK: tl.constexpr,
                      BLOCK_T: tl.constexpr):
        # qkv_lora's rows copied into q_c [T, LQ], kv_c [T, LKV], k_pe [T, R] and the cache row
        # (kv_c, k_pe) at the token's slot, CHUNK columns at a time.
        tok = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
        tok_ok = tok < tokens
        slot = tl.load(slot_ptr + tok, mask=tok_ok, other=0).to(tl.int64)
        for start in tl.static_range(0, LQ + LKV + R, CHUNK):
            col = start + tl.arange(0, CHUNK)[None, :]
            ok = tok_ok & (col < LQ + LKV + R)
            x = tl.load(x_ptr + tok * x_stride + col, mask=ok)
            if LQ > 0:
                tl.store(q_c_ptr + tok * LQ + col, x, mask=ok & (col < LQ))
            kv_col = col - LQ
            tl.store(kv_c_ptr + tok * LKV + kv_col, x, mask=ok & (kv_col >= 0) & (kv_col < LKV))
            tl.store(k_pe_ptr + tok * R + kv_col - LKV, x, mask=ok & (kv_col >= LKV))
            tl.store(cache_ptr + slot * cache_stride + kv_col, x, mask=ok & (kv_col >= 0))

    return q_side_copy, prologue_copy


def pattern_copies(case: dict, q_block_rows: int = 16, block_tokens: int = 2, chunk: int = 512) -> tuple:
    """``(prologue, q_side)``: zero-argument callables that move each launch's bytes in its access
    pattern with no math (``--floor``), on ``case`` (:func:`make_mla_case`); the prologue's writes
    go to ``q_c``/``kv_c``/``k_pe`` (made once, returned by each call) and into ``case["kv_cache"]``,
    the q side rewrites ``q`` with itself."""
    import triton

    q_side_copy, prologue_copy = _pattern_kernels()
    args, q, cache, slots = case["args"], case["q"], case["kv_cache"], case["slot_mapping"]
    x, lq, lkv, r = args["qkv_lora"], args["q_lora_rank"], args["kv_lora_rank"], args["rope_dim"]
    tokens, rows = x.shape[0], q.shape[0] * q.shape[1]
    q_c, kv_c, k_pe = (x.new_empty(tokens, n) for n in (lq, lkv, r))
    flat_cache = cache.view(-1, lkv + r)

    def q_side():
        q_side_copy[(triton.cdiv(rows, q_block_rows),)](q, rows, q.stride(1), OFFSET=q.shape[2] - r, R=r,
                                                         BLOCK_ROWS=q_block_rows, num_warps=4)

    def prologue():
        prologue_copy[(triton.cdiv(tokens, block_tokens),)](
            x, q_c, kv_c, k_pe, flat_cache, slots, tokens, x.stride(0), flat_cache.stride(0), LQ=lq, LKV=lkv, R=r,
            CHUNK=chunk, BLOCK_T=block_tokens, num_warps=4)
        return q_c, kv_c, k_pe

    return prologue, q_side


def two_copies(device, timer, nbytes: tuple[int, int]) -> float:
    """Microseconds of two plain copies in one graph, one of each launch's bytes (the benchmark's
    copy kernel, the faster configuration): what two launches moving the op's bytes reach, against
    the one copy of all of them that the benchmark's ``copy`` column is (``--floor``)."""
    first, second = copy_calls(device, nbytes[0]), copy_calls(device, nbytes[1])
    return min(timer(lambda a=a, b=b: (a(), b())) for a, b in zip(first, second))


def both_launches(prologue, q_side, plan: MLAPlan):
    """One call of both launches (zero-argument callables), the prologue under ``plan`` and the q side
    under the plan it would get (the forced plan is dropped before it runs)."""
    def run():
        with tiling.forced(plan=plan):
            prologue()
        q_side()
    return run


def _timed(timer, fn, launch: str, plan: MLAPlan, calls: tuple[int, ...] = (1,)) -> list[float] | None:
    """``fn`` timed at each count of calls a graph, or ``None`` where the candidate ``plan`` fails to
    compile or launch (reported with ``launch``'s name, not fatal: the sweep goes on)."""
    try:
        return [timer(fn, n) for n in calls]
    except (CompilationError, OutOfResources, RuntimeError) as exc:
        print(f"  {launch} {plan}: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
        return None


def _label(plan: MLAPlan, facts) -> str:
    """A plan as the printed lines name it: tokens, heads, q_c chunk, warps, programs an SM (``pt``: a
    program a tile, ``one_tile``), register cap."""
    programs = "pt" if plan.one_tile else f"{plan.max_programs // facts.num_sms}ps"
    return (f"{plan.block_tokens}t/{plan.block_heads}h/{plan.q_chunk}q/{plan.num_warps}w/"
            f"{programs}/{plan.max_registers}r")


def _candidates(base: MLAPlan, q_side: bool, facts, args) -> list[MLAPlan]:
    """The sweep's plans around ``base``: its knobs replaced as the flags say (a base with a program a
    tile keeps that, and its programs an SM: ``--per-sm`` would change nothing)."""
    plans = []
    block_tokens, warps_list = (args.q_block_tokens, args.q_warps) if q_side else (args.block_tokens, args.warps)
    per_sm_list = [base.max_programs // facts.num_sms] if base.one_tile else args.per_sm
    for tokens, warps, per_sm, cap in itertools.product(block_tokens, warps_list, per_sm_list, args.max_registers):
        common = dict(block_tokens=tokens, num_warps=warps, max_programs=per_sm * facts.num_sms, max_registers=cap)
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
    parser.add_argument("--max-registers", type=int, nargs="+", default=[0],
                        help="ptxas's cap on registers a thread (Triton's maxnreg; 0: no cap)")
    parser.add_argument("--q-chunk", type=int, nargs="+", default=[512, 2048],
                        help="q_c's chunk (2048: the 1536-lane row held whole, masked)")
    parser.add_argument("--reps", type=int, default=20, help="graph replays a timing")
    parser.add_argument("--json", help="write every measurement here")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--both", action="store_true",
                      help="no per-launch sweep: both launches in one call under each prologue candidate")
    mode.add_argument("--floor", action="store_true",
                      help="no sweep: each launch against the contiguous copy and its no-math pattern copy")
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
        if args.floor:
            one, two = copy_replay(device, timer, sum(nbytes)), two_copies(device, timer, nbytes)
            print(f"{name} tp{tp} T={tokens} both launches' bytes: one copy {one:.2f} us, two copies (one a "
                  f"launch's bytes) in one graph {two:.2f} ({two / one:.2f}x)", flush=True)
            records.append(dict(model=name, tp=tp, tokens=tokens, launch="both", copy_us=one, two_copies_us=two))
            patterns = pattern_copies(case)
            for (launch, shape, size, fn), pattern in zip(launches, patterns):
                copy, floor, ours = copy_replay(device, timer, size), timer(pattern), timer(fn)
                print(f"{name} tp{tp} T={tokens} {launch}: copy {copy:.2f} us, pattern copy {floor:.2f} "
                      f"({floor / copy:.2f}x copy), ours {ours:.2f} ({ours / copy:.2f}x copy, "
                      f"{ours / floor:.2f}x pattern)", flush=True)
                records.append(dict(model=name, tp=tp, tokens=tokens, launch=launch, copy_us=copy,
                                    pattern_us=floor, us=ours))
            continue
        if args.both:
            current = cuda.mla_plan_for_tokens(prologue_shape, facts, tokens)
            for plan in [current, *_candidates(current, False, facts, args)]:
                times = _timed(timer, both_launches(launches[0][3], launches[1][3], plan), "both", plan,
                               (1, AMORTISED_CALLS))
                if times is None:
                    continue
                one, amortised = times
                print(f"{name} tp{tp} T={tokens} both launches, prologue {_label(plan, facts)}"
                      f"{' (current)' * (plan == current)}: {one:.2f} us one call, {amortised:.2f} per call "
                      f"over {AMORTISED_CALLS}", flush=True)
                records.append(dict(model=name, tp=tp, tokens=tokens, launch="both", us=one, amortised_us=amortised,
                                    current=plan == current, **dataclasses.asdict(plan)))
            continue
        for launch, shape, size, fn in launches:
            copy = copy_replay(device, timer, size)
            current = cuda.mla_plan_for_tokens(shape, facts, tokens)
            timings = {}
            for plan in [current, *_candidates(current, shape.q_rope, facts, args)]:
                with tiling.forced(plan=plan):
                    times = _timed(timer, fn, launch, plan)
                if times is not None:
                    timings[plan] = times[0]
            best = min(timings, key=timings.get)
            print(f"{name} tp{tp} T={tokens} {launch}: copy {copy:.2f} us; current {timings[current]:.2f} "
                  f"({timings[current] / copy:.2f}x) {_label(current, facts)}; best {timings[best]:.2f} "
                  f"({timings[best] / copy:.2f}x) {_label(best, facts)}", flush=True)
            records += [dict(model=name, tp=tp, tokens=tokens, launch=launch, copy_us=copy, us=us,
                             current=plan == current, **dataclasses.asdict(plan)) for plan, us in timings.items()]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
