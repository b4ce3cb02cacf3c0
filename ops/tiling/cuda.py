"""CUDA launch plans: tiles sized for registers and 16-byte accesses, a grid sized for SMs.

Every constant carries the measurement behind it (``docs/performance.md``; the sweep is
``scripts/tune_cuda_plan.py``; the design note is ``docs/cuda-plans.md``). A plan does not
depend on the token count; the token count only picks the large or the small-batch plan, so a
layer geometry compiles two kernels at most.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from .base import (KernelShape, MLAPlan, MLAShape, PlanBase, SumsPlan, launch_options, next_pow2, prev_pow2,
                   q_arm_heads)
from ..device import CudaFacts

__all__ = ["CudaPlan", "mla_plan", "plan", "plan_for_tokens", "small_batch_max_tokens", "small_batch_plan", "sums_plan"]

#: Padded head elements per q tile (both rotary halves and the tail, or one tail chunk): 4096
#: was best or within 3% of the best at T >= 4096 on every 128-dim geometry (docs/performance.md, v3
#: sweep), and beat 8192 on all four benchmark geometries in v5.
TILE_ELEMENTS = 4096
#: Elements of the widest sub-tile (a rotary half, or the pass-through tail) each thread holds.
#: Fewer per thread (more warps) split the loads into 2- and 4-byte accesses: 8 warps on a
#: 4096-element tile ran 1.8-2.2x slower than 2 warps (docs/performance.md, v1); v3 found 32 best.
ELEMENTS_PER_THREAD = 32
#: 2 warps is the fewest any sweep has timed (v1-v5), and the sweeps' favourite at T >= 4096.
MIN_WARPS, MAX_WARPS = 2, 8
#: Heads per tile at most: 8 beat "all of q's heads" by 5-10% at T >= 4096 (docs/performance.md, v3).
MAX_BLOCK_HEADS = 8
#: Cut a pass-through tail of at least this many (padded) lanes into chunks of the rotary half's
#: width, summed in one pass and scaled in a second that loads them again (a cache hit), so one
#: chunk is live at a time. Held whole, the 192-lane tail of 16/2/256 R64 took 247 registers per
#: thread and 12% occupancy (v4, ncu); chunked, 16/2/256 R64 and 64/4/192 R64 ran 2.0-2.8x
#: faster at T >= 4096, while the 64-lane tails of GLM-4 (128/R64 GPT-J) and Phi-2 (80/R32)
#: ran 2-4% slower chunked (v5 sweeps).
CHUNK_TAIL_MIN_LANES = 128
#: Programs per SM the grid is capped at; the persistent loop takes the rest. 8 is what fits:
#: the 128-dim kernels hold about 128 registers per thread, so 8 programs of 2 warps are resident
#: per SM (v4, ncu), and 8 beat 16 by 0.5-4.5% at T >= 4096 on every 128-dim geometry (v5 sweep);
#: 4, 6 and 12 were slower.
PROGRAMS_PER_SM = 8
#: ... and with the KV-cache write, whose kernel holds about 190 registers a thread (168 without,
#: CPU ptxas, 32/8/128): 16 on 32/8/128 at T = 4096 / 16384 37.0 -> 34.5 / 127.2 -> 114.5 us,
#: 32/8/128 mRoPE 44.5 -> 39.6 / 154.4 -> 132.5, 8/1/128 13.2 -> 13.7 / 33.5 -> 34.0 (issue-11
#: probe, docs/performance.md, v7).
KV_PROGRAMS_PER_SM = 16

#: Gather the cos/sin rows after the q/k loads are issued (ROWS_AFTER_DATA), so the positions ->
#: rows chain overlaps the data loads instead of preceding them: 2-7% faster at T >= 4096 on
#: every geometry whose tail is held whole, and 0.3-0.7 us at T <= 8 on 6 of 7 geometries
#: (32/8/128's small-batch plan lost 0.35 us); with a chunked tail it was up to 10% slower
#: (16/2/256 R64), so chunked plans gather the rows first (v5 sweep 6).
LATE_ROWS = True

#: Small batches (decode) get their own plan, compiled once like the large one. The large plan
#: is used when it has more than this many tiles per SM. In v5 sweep 6 the small-batch plan was
#: faster wherever the large plan had at most 144 tiles on the 132 SMs (1.09 per SM), and
#: slower wherever it had 192 or more (1.45 per SM), on 7 geometries at T = 64, 256, 1024.
SMALL_BATCH_TILES_PER_SM = 1.25
#: ... and 2.5 where the large plan chunks the tail or the positions are mRoPE's ([3, T]), whose
#: small-batch plans hold the tail as two pieces / take 2 tokens a tile: at T = 256 (2.4 large
#: tiles per SM) the small plan ran 16/2/256 R64 gated 9.54 us against the large plan's 10.21,
#: 32/8/128 mRoPE 7.55 against 8.38; at T = 384 (3.6 per SM) the large plan won the gated layer
#: (11.20 against 11.55) (issue-10 hand-over sweep, docs/performance.md, v7).
SMALL_BATCH_TILES_PER_SM_CHUNKED_OR_MROPE = 2.5
#: Padded head elements per small-batch q tile: 512 and 1024 were within 2% of each other
#: at T <= 256, 2048 slower on 2 of 4 geometries (v5 sweep).
SMALL_TILE_ELEMENTS = 1024
#: Warps of a small-batch program: 4 was best on 3 of 4 geometries at T <= 64 (v5 sweep), the
#: fourth (16/2/256 R64) was best at 4 in v5's first sweep.
SMALL_WARPS = 4
#: The small-batch plan holds a tail that is no power of two as two pieces (192 lanes as 128 + 64,
#: not padded to 256): 16/2/256 R64 at T = 64 7.74 -> 7.04 us, gated 7.90 -> 7.01, 512 R128 with
#: v-norm 9.98 -> 8.06; at T = 1 within 0.1-0.8 us better (issue-10 sweep, docs/performance.md, v6). The
#: large plans keep the chunked tail: two pieces were 16-20% slower there at T = 4096.
SMALL_TWO_PIECE_TAIL = True
#: ... except where the head dimension is a power of two: there the small-batch plan holds each q
#: and k head as one row (``PlanBase.whole_row``: no halves, no tail pieces; each rotary lane
#: loads its pair element a second time) in ``SMALL_WHOLE_ROW_WARPS`` warps. The gated layer
#: (16/2/256 R64, 192-lane tail), one run, three interleaved repeats, T = 8 / 64 / 256: the prologue
#: 6.66 -> 6.51 / 7.49 -> 7.24 / 9.80 -> 9.51 us, with the write 6.71 -> 6.46 / 7.64 -> 7.36 / 10.42
#: -> 9.52; 4 heads a block was faster at T <= 64 (6.33 / 7.07) and not at 256 (9.77) (docs/performance.md, v11
#: probe 4); Qwen3-Next TP 4 / 8 and Qwen3.5-35B-A3B (mRoPE, 2 tokens a tile) 1-20% faster in both ops
#: (probe 5). Elsewhere it lost: the large plans 3-60% slower with whole rows, the 128-dim small plans
#: of full rotary level or up to 11% slower (probe 3).
SMALL_WHOLE_ROW_WARPS = 2
#: Programs per SM of the small-batch plan at most: one program a tile wherever the tiles fit. At
#: ``PROGRAMS_PER_SM`` the gated layer (16/2/256 R64, whole rows, 2 warps) at T = 256 had 1280 tiles
#: on 1056 programs, a second round for 224 of them: 9.47 -> 9.09 us with 16 (12 and 24 the same),
#: with the write (1536 tiles) 9.73 -> 9.28 (docs/performance.md, v12 sweep 1). Only a chunked tail's layers
#: have more small-batch tiles than ``PROGRAMS_PER_SM`` programs (the small plan is used up to
#: ``SMALL_BATCH_TILES_PER_SM*`` large tiles an SM, each 2-4 small ones).
SMALL_PROGRAMS_PER_SM = 16
#: ... where the second piece gives each thread at least this many elements: 4 keeps its bf16
#: accesses 8 bytes wide, the small-batch plan's floor in ``cuda_compile``. Phi-2 (a 48-lane tail,
#: 32 + 16) and Qwen3-Next at TP 8 (2 q heads) would otherwise move single elements.
TWO_PIECE_MIN_PER_THREAD = 4
#: Tokens per small-batch tile at least with mRoPE ([3, T] positions: three row gathers a tile, so
#: more tokens share them): 32/8/128 interleaved at T = 64 6.91 -> 6.37 us, at T = 256 8.26 ->
#: 7.36 with 2 tokens rather than 1 (issue-10 sweep, docs/performance.md, v6).
SMALL_MROPE_MIN_TOKENS = 2
#: Tokens per small-batch tile at least where one token's row fits ``SMALL_TILE_ELEMENTS`` (8 heads of
#: 128 padded lanes, 4 of 256) in halves of at most ``SMALL_MIN_TOKENS_MAX_LANES`` padded lanes (not
#: whole rows; mRoPE takes ``SMALL_MROPE_MIN_TOKENS`` anyway). Under dependent launch, H200, one
#: process, the better of three rounds, 20 calls a graph (per call), 1 -> 2 tokens, the write:
#: 32/8/128 at T = 1 / 8 / 64 1.41 -> 1.35 / 1.53 -> 1.44 / 1.93 -> 1.79 us, 64/4/128 at T = 64 2.34 ->
#: 2.04, 32/4/128 1.86 -> 1.72, 8/2/128 1.78 -> 1.49, 16/1/128 1.90 -> 1.80, 8/1/128 at T = 256 2.43 ->
#: 2.19 (docs/performance.md, v16 A/B 0); the prologue: 32/8/128 1.42 -> 1.30 / 1.54 -> 1.40 / 1.79 -> 1.66,
#: 8/2/128 1.50 -> 1.25 / 1.62 -> 1.31 / 1.74 -> 1.40, 8/1/128 1.51 -> 1.46 / 1.60 -> 1.53 / 1.71 ->
#: 1.61, MiniMax-M2 TP 8 (6/1/128 R64) 1.88 -> 1.58 / 1.93 -> 1.70 / 2.15 -> 1.80 (3.26 -> 1.99 at
#: T = 256), Gemma-4-31B TP 8 (4/2/256) 1.64 -> 1.42 / 1.74 -> 1.52 / 1.97 -> 1.66; 64/4/128 and
#: 32/4/128 level, Llama-3.1-70B TP 8 (8/1/128, no norm) 1.17 -> 1.20 / 1.22 -> 1.24 / 1.34 -> 1.31
#: (A/B 3). One call a graph -0.9 to +0.2 us (64/4/128's prologue at T = 64 6.27 -> 6.43). Where one
#: token's row is 2048 elements (Gemma-4-31B 32/16/256, Qwen3-Next's whole rows) 2 tokens lost
#: 4-30% (A/B 0).
SMALL_MIN_TOKENS = 2
#: ... with heads of at most this many padded lanes: Gemma-4-E2B's full layer at TP 4 (2/1/512
#: v-norm) lost with 2 tokens and v in k's tiles, the write 20 calls a graph at T = 1 / 8 1.72 -> 1.87 /
#: 1.78 -> 1.91 us (one call 6.21 -> 6.59 / 6.40 -> 6.56), where Gemma-4-31B's sliding layer at TP 8
#: (4/2/256) gained (1.69 -> 1.44 / 1.74 -> 1.49 / 2.02 -> 1.58 at T = 64) (docs/performance.md, v16 A/B 1).
SMALL_MIN_TOKENS_MAX_LANES = 256
#: ... and there the write moves v in k's tiles (``PlanBase.v_with_k``) where k's block holds at most
#: half of q's heads, as in the large plan (``V_WITH_K_SMALL_K_BLOCKS``). v16 A/B 0, 20 calls a graph,
#: 2 tokens a tile without -> with: 8/1/128 at T = 64 / 256 1.76 -> 1.67 / 2.19 -> 2.02 us, 8/2/128
#: 1.49 -> 1.40 / 1.96 -> 1.79, 16/1/128 at T = 64 1.80 -> 1.75, 64/4/128 2.04 -> 1.99, 32/4/128
#: level; one call a graph -0.16 to +0.35 us. Where k's block is as large as q's (32/8/128) it lost (1.79 -> 1.97 at
#: T = 64); with one token a tile it lost at T <= 8 (up to 0.61 us one call a graph; v8 probe 2, v16
#: A/B 0).
SMALL_KV_V_WITH_K = True
#: ptxas's register cap (Triton's ``maxnreg``) for the large plan with the KV-cache write: 65536
#: registers an SM / (8 programs x 64 threads). Uncapped the write's kernel took 146 (32/8/128)
#: and 163 (mRoPE) registers a thread on the H200 (Nsight Compute), so 6 programs an SM were
#: resident instead of the prologue's 8 (127 registers). Capped at 128, in one run, two interleaved
#: repeats: 32/8/128 at T = 4096 / 16384 33.5 -> 32.8 / 113.5 -> 111.3 us, mRoPE 39.7 -> 36.4 /
#: 133.3 -> 119.2, 8/1/128 13.0 -> 13.0 / 31.8 -> 31.6, the gated layer 49.4 -> 48.2 / 173.0 ->
#: 171.7, 64/8/128 51.1 -> 49.5 / 183.0 -> 178.9; a cap of 168 was 10-46% slower (docs/performance.md, v8).
#: Triton 3.7.1's kernel needs more (the CPU compile check: 193 uncapped, 236-452 bytes a thread
#: spilled under the cap); re-measure on a GPU with a newer Triton.
KV_MAX_REGISTERS = 128
#: With the KV-cache write, the large plan moves v in k's tiles (``PlanBase.v_with_k``) where k's
#: block holds at most half of q's heads (small k tiles, v's as small): 8/1/128 at T = 4096 / 16384
#: 14.50 -> 13.60 / 35.46 -> 33.28 us, 16/2/256 R64 gated 50.11 -> 49.31 / 172.9 -> 172.3. Where k's
#: block is as large as q's it was level or slower (32/8/128 at T = 4096 35.52 -> 36.03, 32/16/256
#: v-norm level), and every small-batch plan lost 0.4-1.1 us (docs/performance.md, v8 probe 2).
V_WITH_K_SMALL_K_BLOCKS = True


#: mRoPE's large plan, with and without the KV-cache write, where q and k are normalised and q's
#: heads fill at least ``MROPE_MIN_Q_BLOCKS`` blocks (and the tail is not chunked): 4 warps under a
#: cap of 80 registers a thread, 12 programs an SM (the same tile; about 6 programs, 24 warps,
#: resident an SM where the 2-warp plan had 8 programs, 16 warps). 32/8/128 interleaved (Qwen3-VL-8B
#: TP 1), one run, two interleaved repeats: the prologue at T = 1024 / 4096 / 16384 13.55 -> 12.18 /
#: 31.17 -> 29.59 / 98.08 -> 94.59 us, with the write 14.99 -> 13.59 / 35.95 -> 34.05 / 117.83 ->
#: 113.35; caps of 72 and 88 and 10-24 programs an SM were slower or level (docs/performance.md, v9 probe 1).
#: Where it lost (probe 2), it is not used: without q/k norm (Qwen2.5-VL-7B 28/4/128, 3-5% slower),
#: on a narrow shard (Qwen3-VL-8B TP 8, 4/1/128: 3-12% slower at T = 4096, its 1024 tiles no longer
#: one wave at 6 programs an SM), with a chunked tail (Qwen3.5 gated: mixed, 7% faster to 4% slower); nor
#: without mRoPE (32/8/128, 64/4/128, 8/1/128, v-norm: level or up to 6% slower, probe 1).
MROPE_WARPS, MROPE_MAX_REGISTERS, MROPE_PROGRAMS_PER_SM = 4, 80, 12
#: ... from 4 blocks of q heads (32/8/128, 32/4/128 at TP 1): the one shard below it measured,
#: 4/1/128 (1 block), was 3-12% slower; 2 blocks (TP 2) were not measured, so they keep the old plan.
MROPE_MIN_Q_BLOCKS = 4
#: The chunked-tail prologue (no cache write, no mRoPE): 4 warps, a cap of 80, 24 programs an SM.
#: 16/2/256 R64 gated (Qwen3-Next TP 1) at T = 1024 / 4096 / 16384: 18.12 -> 17.91 / 45.73 -> 44.24 /
#: 163.63 -> 156.98 us (16 programs an SM: 45.19 / 157.34); MiMo-V2-Flash 64/4/192 R64 at T = 4096 /
#: 16384 69.36 -> 67.06 / 258.1 -> 236.7; Qwen3-Next TP 4 (4/1/256) 19.14 -> 19.28 / 49.72 -> 48.24
#: (probes 1, 2). With the write the 2-warp plan stayed best at T <= 4096 (the gated layer 47.84
#: against 48.31), so it keeps it. Chunks of 64 or 128 lanes instead of 32 were 7-79% slower (probe 0).
CHUNKED_WARPS, CHUNKED_MAX_REGISTERS, CHUNKED_PROGRAMS_PER_SM = 4, 80, 24
#: ... with the KV-cache write (the 2-warp plan, capped at ``KV_MAX_REGISTERS``) 24 programs an SM,
#: not ``KV_PROGRAMS_PER_SM``. One run, three interleaved repeats, T = 4096 / 16384, one call a graph:
#: Qwen3-Next TP 1 (16/2/256 R64 gated) 48.84 -> 46.93 / 171.92 -> 169.27 us (20 calls a graph, per
#: call: 44.08 -> 42.50 / 167.34 -> 164.43), TP 4 (4/1/256) 20.24 -> 20.24 / 52.90 -> 52.60,
#: MiMo-V2-Flash 64/4/192 R64 69.34 -> 68.40 / 250.83 -> 246.88, Qwen3.5-27B (24/4/256, mRoPE) 71.16 ->
#: 69.94 / 265.67 -> 262.54; level at T = 1024. 32 was within 1% of 24 (faster at 16384, slower at
#: 4096); 24 was also the best of 8 / 16 / 24 under six other tilings of the gated layer (docs/performance.md,
#: v11 sweep 2, probe 4).
CHUNKED_KV_PROGRAMS_PER_SM = 24
#: A chunked tail's mRoPE prologue (Qwen3.5: the 2-warp plan, ``CHUNKED_*`` not measured faster
#: there, v9 probe 2) 64 programs an SM, not ``PROGRAMS_PER_SM``: Qwen3.5-27B TP 1 (24/4/256 R64) at
#: T = 1024 / 4096 / 16384 24.42 -> 23.69 / 68.44 -> 65.75 / 251.69 -> 241.93 us, 32 and 48 between
#: (docs/performance.md, v11 probe 4); Qwen3.5-35B-A3B 47.46 -> 46.00 / 165.59 -> 156.30 and Qwen3.5-397B-A17B
#: 87.01 -> 80.00 / 329.14 -> 302.32 at T = 4096 / 16384 (probe 5). Without mRoPE (the ``CHUNKED_*``
#: plan) more than 24 was mixed: the gated layer 157.34 -> 151.37 us at T = 16384 with 64, MiMo's
#: 66.85 -> 68.54 at 4096.
CHUNKED_MROPE_PROGRAMS_PER_SM = 64

#: Load the positions (and, with the write, the slots) of a program's next tile while it works on
#: the current one (``PlanBase.positions_ahead``) in the large plans where q's heads fill at most
#: this many blocks, k is present and the tail is held whole. Each program then runs several tiles
#: (T >= 4096), and without it every tile's cos/sin gather and cache addresses wait on a load
#: (Nsight Compute, 8/1/128 at T = 4096: long-scoreboard stalls 4.33 -> 3.37 cycles an instruction,
#: 8.74 -> 8.19 us). One run, two interleaved repeats, T = 4096 / 16384, prologue: 8/1/128 11.97 ->
#: 11.20 / 27.78 -> 26.70 us, 8/2/128 12.22 -> 11.55 / 29.86 -> 28.48, 4/1/128 9.54 -> 9.25 / 18.46
#: -> 17.70, 16/2/128 16.51 -> 16.00 / 45.86 -> 45.28, mRoPE 4/1/128 10.94 -> 10.50 / 23.39 -> 22.30,
#: Gemma-4-E2B 8/1/256 v-norm 20.00 -> 19.46 / 57.02 -> 55.81, 8/1/512 v-norm 34.08 -> 32.42 / 109.79
#: -> 105.31, Gemma-4-26B-A4B 16/2/512 v-norm 52.74 -> 51.23 / 184.86 -> 180.80; with the write (at
#: ``POS_AHEAD_KV_PROGRAMS_PER_SM``) 8/1/128 12.83 -> 12.03 / 31.30 -> 29.95, 8/2/128 13.66 -> 13.18 /
#: 34.82 -> 33.92, 16/2/128 18.43 -> 17.95 / 50.88 -> 50.50, mRoPE 8/2/128 16.29 -> 14.11 / 40.69 ->
#: 35.07, 4/1/128 12.26 -> 10.75 / 27.39 -> 22.21, 16/4/128 23.23 -> 20.90 / 64.58 -> 60.54, the
#: v-norm layers 1.5-2.8% faster (docs/performance.md, v10 probes 0-2). With more blocks it was mixed
#: (32/8/128: 1.3% faster at T = 4096, 1.2% slower at 16384; 64/4/128 0.8% and 2.3% slower), with a
#: chunked tail slower (the gated layer, 1.7-2% in both ops).
POS_AHEAD_MAX_Q_BLOCKS = 2
#: ... but an mRoPE prologue in this plan only where k's block holds at most this many heads: there
#: it was faster (4/1/128 above; Qwen2.5-VL-7B TP 4, 7/1/128, 11.14 -> 10.85 / 25.76 -> 24.64), with
#: more it lost at T = 16384 (8/2/128 14.21 -> 13.89 / 34.75 -> 35.94; 16/4/128 20.06 -> 20.29 /
#: 56.26 -> 60.13; docs/performance.md, v10 probes 1, 2). Why is not known.
POS_AHEAD_MROPE_PROLOGUE_MAX_K_HEADS = 1
#: ... there the write runs 8 programs an SM, not ``KV_PROGRAMS_PER_SM``: with POS_AHEAD, 8 was
#: faster than 16 on 8/1/128 (T = 4096: 12.93 -> 12.03 us), 8/2/128 (13.60 -> 13.18), 4/1/128
#: (16384: 21.15 -> 20.80) and 16/2/128 at T = 4096 (18.30 -> 17.95; 0.7% slower at 16384).
POS_AHEAD_KV_PROGRAMS_PER_SM = 8
#: ... but under dependent launch (``DEPENDENT_LAUNCH``) the write loads them at the gather instead
#: where k's block is one head beside q's blocks of at least this many heads (one axis of
#: positions). H200, one process, the better of two rounds, T = 4096 / 16384, ahead -> at the
#: gather: 8/1/128 (Qwen3-32B TP 8) 20 calls a graph 5.56 -> 4.98 / 24.05 -> 24.53 us, one call
#: 11.46 -> 11.58 / 28.38 -> 29.22; 16/1/128 (Qwen3-235B-A22B TP 4) 9.13 -> 8.61 / 42.55 -> 40.68, one
#: call 16.93 -> 16.51 / 46.75 -> 45.31; 8/1/256 v-norm (Gemma-4-E2B) level. Where q's block is
#: smaller or k's larger it lost or was mixed: 4/1/128 20 calls 4.17 -> 4.23 at T = 4096, 8/2/128 one
#: call 12.74 -> 13.18; mRoPE 4/1/128 one call 10.27 -> 11.74 (docs/performance.md, v15 A/B 4). Without
#: dependent launch the rule above stands (v10). Why the amortised write gains is not known.
POS_AT_GATHER_KV_PDL_MIN_Q_HEADS = 8
#: The mRoPE plan (``MROPE_*``) loads positions ahead too: its prologue on 32/8/128 (Qwen3-VL-8B)
#: T = 4096 / 16384 29.70 -> 28.80 / 94.78 -> 92.45 us, 32/4/128 (Qwen3-VL-30B-A3B) 28.51 -> 27.52 /
#: 88.58 -> 85.02; with the write only where v moves in k's tiles (``V_WITH_K_SMALL_K_BLOCKS``):
#: 32/4/128 31.81 -> 29.92 / 98.34 -> 95.52, where 32/8/128 (k's block as large as q's) went
#: 34.30 -> 34.08 / 113.34 -> 115.71 (docs/performance.md, v10 probes 0, 1).
POS_AHEAD_MROPE = True

#: Where the head block gathers the rows after its own loads (``LATE_ROWS``, whole rows) and the
#: positions are not loaded ahead, the head block loads the positions too, at the gather
#: (``PlanBase.positions_at_gather``, the kernel's ``POS_PTRS``): issue is in order, and positions
#: loaded and clamped before the q/k arm held every data load of the tile back until they arrived
#: (CPU SASS). T <= 64 0.2-0.5 us faster on every non-mRoPE geometry timed (the gated layer at T = 1
#: 5.92 -> 5.57, 32/8/128 6.14 -> 5.63, 8/1/128 at T = 64 6.72 -> 6.18), T = 256 1-4%, T >= 4096
#: level (docs/performance.md, v13 A/B 5).
POS_AT_GATHER = True
#: ... with mRoPE's three positions only in small-batch plans of rotary halves (not whole rows),
#: its rows gathered before the reduction there. One process, three rounds, the prologue:
#: Qwen3-VL-8B (32/8/128) at T = 8 / 64 / 256 6.14 -> 6.08 / 6.59 -> 6.37 / 7.58 -> 7.36 us (T = 1 level),
#: Qwen3-VL-30B-A3B (32/4/128) at T = 1 / 64 5.89 -> 5.47 / 6.40 -> 6.18; with the write Qwen3-VL-8B
#: at T = 64 6.59 -> 6.40; Qwen2.5-VL-7B (28/4/128, no q/k norm) level at T = 1 / 64 (docs/performance.md, v14
#: A/B 3). On whole-row plans (Qwen3.5) it was 2-14% slower at T <= 64 (v13 A/B 6); the large plans
#: were not timed with it.
POS_AT_GATHER_MROPE_SMALL_HALVES = True

#: Launch with programmatic dependent launch where the GPU has it (``CudaFacts.dependent_launch``:
#: compute capability 9.0+, ``VLLM_ASCEND_EXT_CUDA_PDL`` on): the kernel waits for the grid before
#: it (``griddepcontrol.wait``) before touching memory, then lets the next grid launch, so in a
#: captured graph its launch and its programs' start overlap the end of the kernel before it. H200,
#: one process, 20 calls a graph (per call), the better of three rounds: T = 1 2.10 -> 1.49 us
#: (Qwen3-32B TP 8 prologue), 1.97 -> 1.42 (Qwen3-8B), T = 64 2.3-3.1 -> 1.7-2.5 on every geometry
#: timed, T = 4096 0.4-0.7 us off (8/1/128's write 6.10 -> 5.60), T = 16384 0.3 off; one call a graph
#: level (nothing before it to overlap); waiting without letting the next grid launch early gained
#: a fifth as much. Gemma-4-31B's prologue at T = 4096 (20 calls) lost 2% (69.03 -> 70.60)
#: (docs/performance.md, v15 A/B 2).
DEPENDENT_LAUNCH = True


@dataclass(frozen=True)
class CudaPlan(PlanBase):
    """A CUDA launch: ``block_tokens`` x (``block_heads`` q | ``kv_block_heads`` k) tiles."""

    kv_block_heads: int
    num_warps: int
    tail_lanes: int = 0  # lanes per pass-through tail chunk; 0: the whole tail at once
    late_rows: bool = LATE_ROWS  # the kernel's ROWS_AFTER_DATA
    two_piece_tail: bool = False  # a whole tail that is no power of two held as two pieces
    v_in_k_tiles: bool = False  # the kernel's V_WITH_K
    max_registers: int = 0  # ptxas's cap on registers a thread (Triton's maxnreg); 0: no cap
    pos_ahead: bool = False  # the kernel's POS_AHEAD
    whole_rows: bool = False  # the kernel's WHOLE_ROW
    pos_at_gather: bool = True  # the kernel's POS_PTRS, where rows are gathered late, not ahead
    pdl: bool = False  # the kernel's PDL, launched with programmatic dependent launch

    @property
    def rows_after_data(self) -> bool:
        return self.late_rows

    @property
    def v_with_k(self) -> bool:
        return self.v_in_k_tiles

    @property
    def positions_ahead(self) -> bool:
        return self.pos_ahead

    @property
    def whole_row(self) -> bool:
        return self.whole_rows

    @property
    def dependent_launch(self) -> bool:
        return self.pdl

    @property
    def positions_at_gather(self) -> bool:
        return self.pos_at_gather and (self.late_rows or self.whole_rows) and not self.pos_ahead

    def tail_width(self, shape: KernelShape) -> int:
        if self.tail_lanes:
            return self.tail_lanes
        return prev_pow2(shape.pass_dim) if self._split(shape) else shape.pass_pad

    def tail_width2(self, shape: KernelShape) -> int:
        return next_pow2(shape.pass_dim - prev_pow2(shape.pass_dim)) if self._split(shape) else 0

    def _split(self, shape: KernelShape) -> bool:
        """Two pieces where the tail is no power of two and the second piece still gives every
        thread ``TWO_PIECE_MIN_PER_THREAD`` elements of a q tile (else its accesses narrow)."""
        if not self.two_piece_tail or self.tail_lanes or shape.pass_dim == prev_pow2(shape.pass_dim):
            return False
        second = next_pow2(shape.pass_dim - prev_pow2(shape.pass_dim))
        threads = 32 * self.num_warps
        return self.block_tokens * self.block_heads * second >= TWO_PIECE_MIN_PER_THREAD * threads

    @property
    def block_heads_k(self) -> int:
        return self.kv_block_heads

    @property
    def launch_options(self) -> dict:
        return launch_options(self.num_warps, self.max_registers, self.pdl)


@functools.lru_cache(maxsize=None)
def plan(shape: KernelShape, facts: CudaFacts, *, tile_elements: int = TILE_ELEMENTS,
         elements_per_thread: int = ELEMENTS_PER_THREAD, programs_per_sm: int | None = None,
         max_block_heads: int = MAX_BLOCK_HEADS,
         chunk_tail_min_lanes: int = CHUNK_TAIL_MIN_LANES) -> CudaPlan:
    """The CUDA plan for one layer geometry on one GPU (pure: same inputs, same plan).

    q's heads of a token go in as few blocks as ``max_block_heads`` allows, k's likewise (so
    cos/sin rows are read a few times per token at most); tokens per tile fill
    ``tile_elements``; warps give each thread ``elements_per_thread`` of the widest sub-tile
    (a rotary half, or the tail or tail chunk when it is wider). A tail of
    ``chunk_tail_min_lanes`` or more goes in chunks of a rotary half's width. The keyword
    arguments exist for the sweep; the defaults are the plan (``programs_per_sm``:
    ``PROGRAMS_PER_SM``, ``KV_PROGRAMS_PER_SM`` with the KV-cache write, whose kernel is capped at
    ``KV_MAX_REGISTERS``). Normalised mRoPE layers of many q heads, and a chunked tail's prologue,
    take at least 4 warps under a cap of 80 registers and their own programs per SM (``MROPE_*``,
    ``CHUNKED_*``: where each was measured faster); a chunked tail's write and mRoPE prologue
    only their own programs per SM (``CHUNKED_KV_*``, ``CHUNKED_MROPE_*``). Layers of at most
    ``POS_AHEAD_MAX_Q_BLOCKS`` blocks of q heads, and the mRoPE plan, load the next tile's
    positions ahead (``POS_AHEAD_*``); the others load them at the gather (``POS_AT_GATHER``),
    except mRoPE's. Where the GPU has it every plan launches with programmatic dependent launch
    (``DEPENDENT_LAUNCH``), and then the write's plan of one k head beside full blocks of q's loads
    its positions at the gather rather than ahead (``POS_AT_GATHER_KV_PDL_MIN_Q_HEADS``).
    """
    q_heads, k_heads = _block_heads(shape, max_block_heads)
    pdl = _dependent_launch(facts)
    tail, chunked = 0, False
    if shape.pass_dim:
        chunked = shape.pass_pad >= chunk_tail_min_lanes and shape.pass_pad > shape.half_pad
        tail = shape.half_pad if chunked else shape.pass_pad
    tokens = prev_pow2(max(1, tile_elements // (q_heads * (2 * shape.half_pad + tail))))
    widest = tokens * q_heads * max(shape.half_pad, tail)
    warps = max(MIN_WARPS, min(MAX_WARPS, prev_pow2(widest // (32 * elements_per_thread))))
    per_sm, cap = (KV_PROGRAMS_PER_SM, KV_MAX_REGISTERS) if shape.kv_cache else (PROGRAMS_PER_SM, 0)
    q_blocks = -(-shape.num_q_heads // q_heads)
    v_with_k = V_WITH_K_SMALL_K_BLOCKS and _small_k_blocks(shape, q_heads, k_heads)
    ahead = False
    if shape.mrope and shape.qk_norm and not chunked and q_blocks >= MROPE_MIN_Q_BLOCKS:
        warps, per_sm, cap = max(warps, MROPE_WARPS), MROPE_PROGRAMS_PER_SM, MROPE_MAX_REGISTERS
        ahead = POS_AHEAD_MROPE and (v_with_k or not shape.kv_cache)
    elif chunked and not shape.mrope and not shape.kv_cache:
        warps, per_sm, cap = max(warps, CHUNKED_WARPS), CHUNKED_PROGRAMS_PER_SM, CHUNKED_MAX_REGISTERS
    elif chunked:
        per_sm = CHUNKED_KV_PROGRAMS_PER_SM if shape.kv_cache else CHUNKED_MROPE_PROGRAMS_PER_SM
    elif not chunked and shape.num_kv_heads and q_blocks <= POS_AHEAD_MAX_Q_BLOCKS:
        if shape.kv_cache:
            per_sm = POS_AHEAD_KV_PROGRAMS_PER_SM
            ahead = not (pdl and not shape.mrope and k_heads == 1 and q_heads >= POS_AT_GATHER_KV_PDL_MIN_Q_HEADS)
        else:
            ahead = not shape.mrope or k_heads <= POS_AHEAD_MROPE_PROLOGUE_MAX_K_HEADS
    return CudaPlan(block_tokens=tokens, block_heads=q_heads, kv_block_heads=k_heads,
                    max_programs=facts.num_sms * (programs_per_sm or per_sm), num_warps=warps,
                    tail_lanes=tail if chunked else 0, late_rows=LATE_ROWS and not chunked,
                    v_in_k_tiles=v_with_k, max_registers=cap, pos_ahead=ahead,
                    pos_at_gather=POS_AT_GATHER and not shape.mrope, pdl=pdl)


def _dependent_launch(facts: CudaFacts) -> bool:
    """Whether this GPU's plans launch with programmatic dependent launch (``DEPENDENT_LAUNCH``)."""
    return DEPENDENT_LAUNCH and facts.dependent_launch


def _small_k_blocks(shape: KernelShape, q_heads: int, k_heads: int) -> bool:
    """A cache write whose k block holds at most half of q's heads: where v moves in k's tiles
    (``V_WITH_K_SMALL_K_BLOCKS``, ``SMALL_KV_V_WITH_K``)."""
    return shape.kv_cache and 2 * k_heads <= q_heads


def _block_heads(shape: KernelShape, max_block_heads: int) -> tuple[int, int]:
    """Heads per q block and per k block: all of a tensor's heads, up to ``max_block_heads``."""
    return (min(next_pow2(shape.num_q_heads), max_block_heads),
            min(next_pow2(shape.num_kv_heads), max_block_heads))


@functools.lru_cache(maxsize=None)
def small_batch_plan(shape: KernelShape, facts: CudaFacts) -> CudaPlan:
    """The plan for batches too small to fill the GPU with :func:`plan`'s tiles (pure).

    Tiles of ``SMALL_TILE_ELEMENTS`` (usually one token row of up to 8 heads) in ``SMALL_WARPS``
    warps. The tail is held whole: at these sizes the chunked tail's second load is latency on
    the critical path (16/2/256 R64 at T <= 256: 7.9-9.3 us whole, 8.5-9.6 chunked, v5 sweep 2);
    a tail that is no power of two as two pieces (``SMALL_TWO_PIECE_TAIL``), or, where the head
    dimension is a power of two, each head as one row (``SMALL_WHOLE_ROW_WARPS``). One program a
    tile, up to ``SMALL_PROGRAMS_PER_SM`` an SM. The head block loads the positions at the gather
    (``POS_AT_GATHER``; mRoPE's only in halves, ``POS_AT_GATHER_MROPE_SMALL_HALVES``). Tiles of one
    token row in halves of at most ``SMALL_MIN_TOKENS_MAX_LANES`` take ``SMALL_MIN_TOKENS`` tokens,
    and there the write moves v in k's tiles where k's block is small (``SMALL_KV_V_WITH_K``).
    Dependent launch as :func:`plan`.
    """
    q_heads, k_heads = _block_heads(shape, MAX_BLOCK_HEADS)
    tokens = prev_pow2(max(1, SMALL_TILE_ELEMENTS // (q_heads * shape.padded_head_dim)))
    if shape.mrope:
        tokens = max(tokens, SMALL_MROPE_MIN_TOKENS)
    whole = (bool(shape.pass_dim) and prev_pow2(shape.head_dim) == shape.head_dim
             and prev_pow2(shape.pass_dim) != shape.pass_dim)
    more_tokens = (not whole and tokens < SMALL_MIN_TOKENS and q_heads * shape.padded_head_dim <= SMALL_TILE_ELEMENTS
                   and shape.padded_head_dim <= SMALL_MIN_TOKENS_MAX_LANES)
    if more_tokens:
        tokens = SMALL_MIN_TOKENS
    return CudaPlan(block_tokens=tokens, block_heads=q_heads, kv_block_heads=k_heads,
                    max_programs=facts.num_sms * SMALL_PROGRAMS_PER_SM,
                    num_warps=SMALL_WHOLE_ROW_WARPS if whole else SMALL_WARPS,
                    two_piece_tail=SMALL_TWO_PIECE_TAIL and not whole, whole_rows=whole,
                    v_in_k_tiles=more_tokens and SMALL_KV_V_WITH_K and _small_k_blocks(shape, q_heads, k_heads),
                    pos_at_gather=POS_AT_GATHER and (not shape.mrope or (POS_AT_GATHER_MROPE_SMALL_HALVES
                                                                         and not whole)),
                    pdl=_dependent_launch(facts))


def plan_for_tokens(shape: KernelShape, facts: CudaFacts, num_tokens: int) -> CudaPlan:
    """:func:`small_batch_plan` while :func:`plan` would have at most
    ``SMALL_BATCH_TILES_PER_SM`` tiles per SM for ``num_tokens`` tokens, else :func:`plan`.

    Two compiled kernels per layer geometry at most, whatever the batch sizes.
    """
    if num_tokens <= small_batch_max_tokens(shape, facts):
        return small_batch_plan(shape, facts)
    return plan(shape, facts)


@functools.lru_cache(maxsize=None)
def small_batch_max_tokens(shape: KernelShape, facts: CudaFacts) -> int:
    """The most tokens :func:`plan_for_tokens` gives the small-batch plan."""
    large = plan(shape, facts)
    per_sm = (SMALL_BATCH_TILES_PER_SM_CHUNKED_OR_MROPE if large.tail_lanes or shape.mrope
              else SMALL_BATCH_TILES_PER_SM)
    token_blocks = int(per_sm * facts.num_sms) // large.head_blocks(shape)
    return token_blocks * large.block_tokens


@functools.lru_cache(maxsize=None)
def sums_plan(shape: KernelShape, facts: CudaFacts) -> SumsPlan:
    """The CUDA plan of ``split_qkv_tp_rmsnorm_rope``'s sums-of-squares kernel: tiles of
    :data:`TILE_ELEMENTS` (4 tokens x 1024 columns, or fewer columns for narrow shards), 4 warps,
    :data:`PROGRAMS_PER_SM` programs per SM. Not tuned yet (no measurement behind it)."""
    cols_q = min(next_pow2(shape.num_q_heads * shape.head_dim), 1024)
    cols_k = min(next_pow2(max(1, shape.num_kv_heads) * shape.head_dim), 1024)
    tokens = max(1, TILE_ELEMENTS // max(cols_q, cols_k))
    return SumsPlan(block_tokens=tokens, block_cols_q=cols_q, block_cols_k=cols_k,
                    max_programs=PROGRAMS_PER_SM * facts.num_sms, num_warps=4)


#: Lanes of a latent row the MLA prologue holds at once at most: kv_c's 512 whole and q_c's 1536 as
#: three exact chunks (the Ascend plan's rule, ``ascend.mla_row_chunk``). The H200 sweep
#: (``scripts/tune_mla_plan.py``, docs/performance.md) found q_c held whole (2048 lanes, masked)
#: within 1% of three 512-lane chunks at T >= 4096, so the chunks stay.
MLA_MAX_ROW_CHUNK = 512
#: The MLA prologue's tile (tokens x the widest row chunk) and warps: 4 tokens x 512 lanes on 2
#: warps was the sweep's best or within 2% of it at T = 4096 and 16384 on DeepSeek-V3, Kimi-K2 and
#: V2-Lite (1.13-1.19x the same-bytes copy where the GQA plan's 8 tokens on 4 warps gave 1.15-1.36x).
MLA_TILE_ELEMENTS, MLA_WARPS = 2048, 2
#: The q side's tile: 1024 elements (2 tokens x 8 heads x 64 rotary lanes), 4 warps: the sweep's
#: best or within 4% of it (1.0-1.15x the copy; the GQA plan's 8 tokens: 1.0-1.24x). Fewer heads on
#: the rank take more tokens to the same tile (8 elements, 16 bytes, a thread: ``cuda_compile``
#: requires 16-byte accesses; not timed below 8 heads).
MLA_Q_TILE_ELEMENTS, MLA_Q_WARPS = 1024, 4
#: Programs an SM walking the MLA tiles grid-stride: 16 beat 8 at T = 16384 on every sweep row. This
#: sizes the grid; the large prologue plan's 124 registers a thread (CPU ptxas; 128 allocated) let 8
#: of its 2-warp programs run on an SM at once (a cap of 64 with 2 tokens a tile, 16 at once:
#: docs/performance.md).
MLA_PROGRAMS_PER_SM = 16
#: Both MLA launches with programmatic dependent launch where the GPU has it (as ``DEPENDENT_LAUNCH``):
#: the q side's launch overlaps the end of the prologue's. H200, one lease, ``VLLM_ASCEND_EXT_CUDA_PDL=0``
#: then on, both launches (``bench --op split_qkv_rmsnorm_rope_mla``): 20 calls a graph T = 1 4.57-4.61
#: -> 3.38-3.41 us (V2-Lite 4.13 -> 2.96), T = 64 5.07-5.38 -> 3.94-4.26; T = 4096 one call a graph
#: 1-8 % less (V2-Lite 17.44 -> 16.54), T = 16384 0.5-2 %; errors identical.
MLA_DEPENDENT_LAUNCH = True


#: The MLA prologue's small-batch plan (:func:`mla_small_plan`): one token a tile, q_c's and kv_c's
#: rows held whole (up to :data:`MLA_SMALL_MAX_ROW` lanes: one pass, no second read of the row).
#: H100, 2026-12-06 (``tune_mla_plan.py --tokens 1 64``), the prologue alone, one call a graph,
#: T = 1 / 64, the large plan -> this one on 2 warps: DeepSeek-V3 7.78 / 8.45 -> 6.18 / 6.69 us,
#: Kimi-K2 TP 8 7.84 / 8.16 -> 6.40 / 6.56 (the sweep's best of 1-4 tokens x 2-8 warps), V2-Lite
#: 6.85 / 7.25 -> 6.50 / 6.98 (4 warps, 6.24 / 6.75 there, move kv_c's 512 lanes in 8-byte pieces:
#: ``cuda_compile``'s 16-byte rule).
MLA_SMALL_MAX_ROW = 2048
#: The small plan's warps: one for each this many lanes of the widest row held (at most 32 lanes a
#: thread): q_c's 2048 (padded) on 2 warps, V2-Lite's kv_c 512 on 1. H100, 2026-12-06
#: (``tune_mla_plan.py --tokens 1 64 256 1024 --warps 1 2``, ``tune_mla_plan_warps.txt``), the
#: prologue alone, 2 -> 1 warp: V2-Lite 2.6-4 % faster at every T (T = 1 / 64 6.05 / 6.50 -> 5.89 /
#: 6.27 us); the q-latent rows 2-18 % slower to T = 256 (DeepSeek-V3 T = 1 5.95 -> 7.01), 3-4 %
#: faster at 1024 (9.44 -> 9.09), where the small plan nearly ends: they keep 2.
MLA_SMALL_LANES_PER_WARP = 1024
#: The small plan serves up to this many tokens an SM (T <= 1056 on 132 SMs). H100, 2026-12-06
#: (``tune_mla_plan.py --tokens 128 .. 2048 --block-tokens 1 4``, ``tune_mla_plan_mid.txt``), the
#: prologue alone, small -> large plan: T = 512 DeepSeek-V3 / Kimi-K2 TP 8 / V2-Lite 7.55 / 7.68 /
#: 6.43 -> 8.96 / 9.09 / 6.82 us, T = 1024 9.15 / 9.22 / 7.01 -> 9.95 / 10.05 / 7.17, T = 2048
#: 13.09 / 12.83 / 8.35 -> 12.83 / 12.83 / 8.16: the small plan wins to T = 1024 (7.8 tokens an
#: SM) on every row and not at 2048 (15.5); between them it is not measured.
MLA_SMALL_TOKENS_PER_SM = 8
#: The small plan's grid is a program a tile (it has no more tiles than ``MLA_PROGRAMS_PER_SM``
#: programs an SM), so the kernel walks one tile with no loop (``ONE_TILE``): in the loop's
#: preheader LLVM computed both arms' addresses before the branch to the arm (CPU SASS, Triton
#: 3.7.1: about 100 instructions before the kv arm's first load, 47 without).
MLA_SMALL_ONE_TILE = True


@functools.lru_cache(maxsize=None)
def mla_plan(shape: MLAShape, facts: CudaFacts) -> MLAPlan:
    """The CUDA plan of the MLA kernel (pure; the H200 sweep's constants above): the prologue's tile
    is :data:`MLA_TILE_ELEMENTS` (tokens x the widest row chunk; q arms of as many heads as fit
    that chunk, :func:`~.base.q_arm_heads`) on :data:`MLA_WARPS` warps, the
    q side's :data:`MLA_Q_TILE_ELEMENTS` (tokens x up to ``MAX_BLOCK_HEADS`` heads x the rotary
    lanes) on :data:`MLA_Q_WARPS`; :data:`MLA_PROGRAMS_PER_SM` programs an SM walking the tiles grid-stride;
    dependent launch where :data:`MLA_DEPENDENT_LAUNCH` and the GPU allow. Small batches of the prologue take
    :func:`mla_small_plan` (:func:`mla_plan_for_tokens`)."""
    from .ascend import mla_row_chunk

    q_chunk = min(mla_row_chunk(shape.q_lora_rank), MLA_MAX_ROW_CHUNK) if shape.q_lora_rank else 1
    kv_chunk = min(mla_row_chunk(shape.kv_lora_rank), MLA_MAX_ROW_CHUNK) if shape.kv_lora_rank else 1
    rot = 2 * shape.half_pad if shape.rope_dim else 1
    if shape.q_rope:
        heads, warps = min(next_pow2(shape.num_heads), MAX_BLOCK_HEADS), MLA_Q_WARPS
        tokens = prev_pow2(max(1, MLA_Q_TILE_ELEMENTS // (heads * rot)))
    else:
        heads, warps = q_arm_heads(shape, max(q_chunk, kv_chunk), MAX_BLOCK_HEADS), MLA_WARPS
        tokens = prev_pow2(max(1, MLA_TILE_ELEMENTS // max(q_chunk, kv_chunk, rot)))
    return MLAPlan(block_tokens=tokens, block_heads=heads, q_chunk=q_chunk, kv_chunk=kv_chunk,
                   max_programs=facts.num_sms * MLA_PROGRAMS_PER_SM, num_warps=warps,
                   pdl=MLA_DEPENDENT_LAUNCH and _dependent_launch(facts))


@functools.lru_cache(maxsize=None)
def mla_small_plan(shape: MLAShape, facts: CudaFacts) -> MLAPlan:
    """The MLA prologue's small-batch plan: :func:`mla_plan` with one token a tile, each latent
    row held whole where it has at most :data:`MLA_SMALL_MAX_ROW` lanes, a warp for each
    :data:`MLA_SMALL_LANES_PER_WARP` lanes of the widest (at least one; the q side has no small plan
    of its own: :func:`mla_plan`)."""
    large = mla_plan(shape, facts)
    if shape.q_rope:
        return large

    def whole(rank: int, chunk: int) -> int:
        return next_pow2(rank) if rank and next_pow2(rank) <= MLA_SMALL_MAX_ROW else chunk

    q_chunk, kv_chunk = whole(shape.q_lora_rank, large.q_chunk), whole(shape.kv_lora_rank, large.kv_chunk)
    warps = max(1, max(q_chunk, kv_chunk) // MLA_SMALL_LANES_PER_WARP)
    return replace(large, block_tokens=1, block_heads=q_arm_heads(shape, max(q_chunk, kv_chunk), MAX_BLOCK_HEADS),
                   q_chunk=q_chunk, kv_chunk=kv_chunk, num_warps=warps, one_tile=MLA_SMALL_ONE_TILE)


def mla_plan_for_tokens(shape: MLAShape, facts: CudaFacts, num_tokens: int) -> MLAPlan:
    """:func:`mla_small_plan` up to :data:`MLA_SMALL_TOKENS_PER_SM` tokens an SM
    (:func:`mla_small_max_tokens`), else :func:`mla_plan`: two compiled kernels per MLA geometry at
    most, whatever the batch sizes."""
    if num_tokens <= mla_small_max_tokens(shape, facts):
        return mla_small_plan(shape, facts)
    return mla_plan(shape, facts)


def mla_small_max_tokens(shape: MLAShape, facts: CudaFacts) -> int:
    """The most tokens :func:`mla_plan_for_tokens` gives the small-batch plan (0 for the q side)."""
    return 0 if shape.q_rope else MLA_SMALL_TOKENS_PER_SM * facts.num_sms
