"""v10 probe 4: the gated layer (Qwen3-Next-80B-A3B TP 1, 16/2/256 R64, (1 + w), the one
benchmark row left above both issues' bars at T >= 4096) under tile knobs no probe has timed
for it: tiles of 8192 elements (8 tokens), all 16 q heads in one block, and both. Both ops,
T = 4096 / 16384, two repeats interleaved."""
import dataclasses
import torch
from vllm_ascend_ext.bench import _Timer, bytes_moved, copy_replay, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda
device = torch.device("cuda"); timer = _Timer(device, 0); facts = cuda_facts(torch.cuda.current_device())
R = dataclasses.replace


def variants(shape):
    out = {"default": cuda.plan(shape, facts)}
    for label, kw in (("tile8192", dict(tile_elements=8192)), ("heads16", dict(max_block_heads=16)),
                      ("heads16 tile8192", dict(max_block_heads=16, tile_elements=8192))):
        out[label] = cuda.plan(shape, facts, **kw)
    return out


g = model("Qwen3-Next-80B-A3B").shard(1)
for kv in (False, True):
    shape = R(KernelShape.of(g, 2, 4), kv_cache=kv)
    vs = variants(shape)
    for label, p in vs.items():
        print(label, p, flush=True)
    for n in (4096, 16384):
        copy = copy_replay(device, timer, bytes_moved(g, n, kv_cache=kv))
        if kv:
            args, cache = make_kv_inputs(g, n, device)
            fn = lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache)
        else:
            args = make_inputs(g, n, device)
            fn = lambda: split_qkv_rmsnorm_rope(**args)
        for rep in range(2):
            for label, plan in vs.items():
                try:
                    with tiling.forced(plan=plan):
                        us = timer(fn)
                except Exception as e:  # a plan the kernel refuses: say so, go on
                    print(f"{label:18} FAILED {type(e).__name__}: {str(e)[:160]}", flush=True)
                    continue
                print(f"{g.label:22} {'kv' if kv else 'pro'} T={n:5d} {label:18} rep{rep} {us:8.2f} "
                      f"copy {copy:8.2f} {us / copy:5.2f}", flush=True)
