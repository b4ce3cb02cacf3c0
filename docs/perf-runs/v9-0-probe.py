"""v9 probe 0: knobs not swept before, on the rows that miss the bars (H200, bf16). Two repeats,
interleaved, one run. (a) the gated layer's tail in chunks of 64 or 128 lanes (3 or 2 chunks)
instead of a rotary half's 32 (6 chunks), with 2 or 4 warps, 2 or 4 tokens a tile; (b) 8/1/128 and
the others with 4 warps under a register cap of 64-96 (twice the programs resident); (c) the
caps and programs per SM with the cache write. Prints one line a timing."""
import dataclasses
import torch
from vllm_ascend_ext.bench import _Timer, bytes_moved, copy_replay, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda
device = torch.device("cuda"); timer = _Timer(device, 0); facts = cuda_facts(torch.cuda.current_device())
R = dataclasses.replace
S = facts.num_sms


def variants(shape, kv):
    base = cuda.plan(shape, facts)
    out = {"default": base}
    if base.tail_lanes:  # the gated layer: chunk width, warps, tokens
        for lanes in (64, 128):
            for warps in (2, 4):
                for bt in (2, 4):
                    out[f"tail{lanes} w{warps} bt{bt}"] = R(base, tail_lanes=lanes, num_warps=warps, block_tokens=bt)
        out["tail32 w4"] = R(base, num_warps=4)
    for cap in (64, 80, 96):
        for psm in (12, 16):
            out[f"w4 nreg{cap} psm{psm}"] = R(base, num_warps=4, max_registers=cap, max_programs=S * psm)
    if kv:
        for cap in (96, 112):
            out[f"w2 nreg{cap} psm16"] = R(base, max_registers=cap, max_programs=S * 16)
    else:
        out["w2 nreg96 psm12"] = R(base, max_registers=96, max_programs=S * 12)
    return out


for name, tp in (("Qwen3-Next-80B-A3B", 1), ("Qwen3-32B", 8), ("Qwen3-VL-8B", 1)):
    g = model(name).shard(tp)
    for kv in (False, True):
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
            vs = variants(shape, kv)
            for rep in range(2):
                for label, plan in vs.items():
                    try:
                        with tiling.forced(plan=plan):
                            us = timer(fn)
                    except Exception as e:  # a knob the kernel refuses: say so, go on
                        print(f"{g.label:28} {label:22} FAILED {type(e).__name__}: {str(e)[:120]}", flush=True)
                        continue
                    print(f"{g.label:28} {'kv' if kv else 'pro'} T={n:5d} {label:22} rep{rep} {us:8.2f} "
                          f"copy {copy:8.2f} {us / copy:5.2f}", flush=True)
