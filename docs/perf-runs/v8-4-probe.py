"""v8 probe 4: cap registers (maxnreg) with the KV-cache write, so 8 programs of 2 warps fit an SM
(ncu: 146-163 registers a thread with the write, 6 blocks an SM). Interleaved repeats in one run."""
import dataclasses
import torch
from vllm_ascend_ext.bench import _Timer, bytes_moved, copy_replay, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda
device = torch.device("cuda"); timer = _Timer(device, 0); facts = cuda_facts(torch.cuda.current_device())
R = dataclasses.replace
for name, tp in (("Qwen3-8B", 1), ("Qwen3-VL-8B", 1), ("Qwen3-32B", 8), ("Qwen3-Next-80B-A3B", 1), ("Qwen3-32B", 1)):
    g = model(name).shard(tp)
    for kv in (True, False):
        shape = KernelShape.of(g, 2, 4)
        if kv:
            shape = R(shape, kv_cache=True)
        for n in (4096, 16384):
            copy = copy_replay(device, timer, bytes_moved(g, n, kv_cache=kv))
            if kv:
                args, cache = make_kv_inputs(g, n, device)
                fn = lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache)
            else:
                args = make_inputs(g, n, device)
                fn = lambda: split_qkv_rmsnorm_rope(**args)
            variants = {"default": cuda.plan(shape, facts)}
            for psm in ((8, 16) if kv else (8,)):
                p = cuda.plan(shape, facts, programs_per_sm=psm)
                variants[f"psm{psm} maxnreg128"] = R(p, max_registers=128)
            variants["psm8 maxnreg168"] = R(cuda.plan(shape, facts, programs_per_sm=8), max_registers=168)
            for rep in range(2):
                for label, plan in variants.items():
                    with tiling.forced(plan=plan):
                        us = timer(fn)
                    print(f"{g.label:28} {'kv' if kv else 'pro'} T={n:5d} {label:18} rep{rep} {us:8.2f} copy {copy:8.2f} "
                          f"{us / copy:5.2f}", flush=True)
