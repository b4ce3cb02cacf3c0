"""v10 probe 2: the POS_AHEAD rule (``cuda.POS_AHEAD_*``) on shards it covers that probes 0 and 1
did not time: head dims 256 and 512 in one block of q heads (Gemma-4-E2B's v-norm layers), two
blocks with mRoPE (Qwen3-VL-8B TP 2) and with 512-dim heads (Gemma-4-26B-A4B's full layers). The
plan as it is now ("rule") against the same plan without positions ahead and, with the write, at
``KV_PROGRAMS_PER_SM`` ("v9"). Both ops, T = 1024 / 4096 / 16384, two repeats interleaved."""
import dataclasses
import torch
from vllm_ascend_ext.bench import _Timer, bytes_moved, copy_replay, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda
device = torch.device("cuda"); timer = _Timer(device, 0); facts = cuda_facts(torch.cuda.current_device())
R = dataclasses.replace


def variants(shape, kv):
    rule = cuda.plan(shape, facts)
    assert rule.positions_ahead, shape
    per_sm = cuda.KV_PROGRAMS_PER_SM if kv else cuda.PROGRAMS_PER_SM
    return {"rule": rule, "v9": R(rule, pos_ahead=False, max_programs=facts.num_sms * per_sm)}


def run(g, kv, n, vs, copy):
    if kv:
        args, cache = make_kv_inputs(g, n, device)
        fn = lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache)
    else:
        args = make_inputs(g, n, device)
        fn = lambda: split_qkv_rmsnorm_rope(**args)
    for rep in range(2):
        for label, plan in vs.items():
            with tiling.forced(plan=plan):
                us = timer(fn)
            print(f"{g.label:34} {'kv' if kv else 'pro'} T={n:5d} {label:6} rep{rep} {us:8.2f} "
                  f"copy {copy:8.2f} {us / copy:5.2f}", flush=True)


GEOS = (("Gemma-4-E2B:sliding", 1), ("Gemma-4-E2B:full", 1), ("Qwen3-VL-8B", 2), ("Gemma-4-26B-A4B:full", 1))
for name, tp in GEOS:
    g = model(name).shard(tp)
    for kv in (False, True):
        shape = R(KernelShape.of(g, 2, 4), kv_cache=kv)
        for n in (1024, 4096, 16384):
            run(g, kv, n, variants(shape, kv), copy_replay(device, timer, bytes_moved(g, n, kv_cache=kv)))
