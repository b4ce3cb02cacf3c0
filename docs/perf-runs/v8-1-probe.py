"""v8 probe 2 (H200): v in k's tiles (V_WITH_K) with the KV-cache write and v-norm, against v's own
head blocks; programs per SM 8/16 with the write. One line a timing."""
import dataclasses

import torch

from vllm_ascend_ext.bench import _Timer, bytes_moved, copy_replay, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda

device = torch.device("cuda")
timer = _Timer(device, 0)
facts = cuda_facts(torch.cuda.current_device())
R = dataclasses.replace
GEOS = [("Qwen3-8B", 1), ("Qwen3-32B", 8), ("Qwen3-Next-80B-A3B", 1), ("Qwen3-VL-8B", 1), ("Gemma-4-31B:sliding", 1)]
for name, tp in GEOS:
    g = model(name).shard(tp)
    for kv in (False, True):
        shape = KernelShape.of(g, 2, 4)
        if kv:
            shape = R(shape, kv_cache=True)
        if not shape.writes_v:
            continue
        for n in (1, 64, 256, 1024, 4096, 16384):
            copy = copy_replay(device, timer, bytes_moved(g, n, kv_cache=kv))
            if kv:
                args, cache = make_kv_inputs(g, n, device)
                fn = lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache)
            else:
                args = make_inputs(g, n, device)
                fn = lambda: split_qkv_rmsnorm_rope(**args)
            base = cuda.plan_for_tokens(shape, facts, n)
            small = base == cuda.small_batch_plan(shape, facts)
            variants = {"own-v": base, "v-in-k": R(base, v_in_k_tiles=True)}
            if not small and kv:
                for psm in (8, 12):
                    p = cuda.plan(shape, facts, programs_per_sm=psm)
                    variants[f"own-v psm{psm}"] = p
                    variants[f"v-in-k psm{psm}"] = R(p, v_in_k_tiles=True)
            for label, plan in variants.items():
                with tiling.forced(plan=plan):
                    us = timer(fn)
                print(f"{g.label:28} {'kv' if kv else 'pro'} T={n:5d} {'small' if small else 'large'} {label:16} "
                      f"{us:8.2f} copy {copy:8.2f} {us / copy:5.2f}", flush=True)
