"""v8 probe (H200): copied rows in pieces (row_subtiles), mRoPE lane-by-lane cos/sin (lane_rows),
programs per SM and warps with the KV-cache write; int32 slot arithmetic in every variant.
One line a timing: geometry, op, T, variant, us, copy us, ratio."""
import dataclasses
import sys

import torch

from vllm_ascend_ext.bench import _Timer, bytes_moved, copy_replay, make_inputs, make_kv_inputs, KV_BLOCK_SIZE
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda

device = torch.device("cuda")
timer = _Timer(device, 0)
facts = cuda_facts(torch.cuda.current_device())
GEOS = [("Qwen3-8B", 1), ("Qwen3-32B", 8), ("Qwen3-Next-80B-A3B", 1), ("Qwen3-VL-8B", 1), ("Gemma-4-31B:sliding", 1)]
TOKENS = (1, 64, 256, 4096, 16384)
R = dataclasses.replace
for name, tp in GEOS:
    g = model(name).shard(tp)
    for kv in (False, True):
        shape = KernelShape.of(g, 2, 4)
        if kv:
            shape = R(shape, kv_cache=True)
        for n in TOKENS:
            copy = copy_replay(device, timer, bytes_moved(g, n, kv_cache=kv))
            if kv:
                args, cache = make_kv_inputs(g, n, device)
                fn = lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache)
            else:
                args = make_inputs(g, n, device)
                fn = lambda: split_qkv_rmsnorm_rope(**args)
            base = cuda.plan_for_tokens(shape, facts, n)
            small = base == cuda.small_batch_plan(shape, facts)
            variants = {"whole": R(base, row_subtiles=0, lane_rows=False),
                        "rows1": R(base, row_subtiles=1, lane_rows=False),
                        "rows2": R(base, row_subtiles=2, lane_rows=False)}
            if g.mrope_section is not None:
                variants["whole+lane"] = R(base, row_subtiles=0, lane_rows=True)
                variants["rows1+lane"] = R(base, row_subtiles=1, lane_rows=True)
            if not small:
                lane = g.mrope_section is not None
                for psm in ((8, 12, 16) if kv else (8, 16)):
                    p = cuda.plan(shape, facts, programs_per_sm=psm)
                    variants[f"rows1 psm{psm}"] = R(p, row_subtiles=1, lane_rows=lane)
                    p = cuda.plan(shape, facts, programs_per_sm=psm, elements_per_thread=16)
                    variants[f"rows1 psm{psm} ept16"] = R(p, row_subtiles=1, lane_rows=lane)
                if lane or kv:
                    p = cuda.plan(shape, facts, tile_elements=2048, programs_per_sm=16 if kv else 8)
                    variants["rows1 tile2048"] = R(p, row_subtiles=1, lane_rows=lane)
            for label, plan in variants.items():
                with tiling.forced(plan=plan):
                    us = timer(fn)
                print(f"{g.label:28} {'kv' if kv else 'pro'} T={n:5d} {'small' if small else 'large'} {label:22} "
                      f"{us:8.2f} copy {copy:8.2f} {us / copy:5.2f} warps={plan.num_warps} bt={plan.block_tokens} "
                      f"grid={plan.max_programs}", flush=True)
