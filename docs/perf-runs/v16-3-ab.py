"""v16 A/B 3, in one process (H200): the prologue's small-batch plan as planned ("pro") and with
2 tokens a tile ("pro2") where the write's now takes 2 (SMALL_KV_MIN_TOKENS), beside the write as
planned ("kv"); one call a graph and 20 calls a graph (per call), three rounds; every variant's
outputs checked against the float64 reference."""
import dataclasses
import sys
import torch
from vllm_ascend_ext.bench import _Timer, _max_rel_err, make_kv_inputs
from vllm_ascend_ext.ops import reference, tiling, validation
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.split_qkv_rmsnorm_rope import split_qkv_rmsnorm_rope as pro
from vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_kv_cache import split_qkv_rmsnorm_rope_kv_cache as wr
from vllm_ascend_ext.ops.tiling import cuda
device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda"); timer = _Timer(device, 0)
facts = cuda_facts(0) if device.type == "cuda" else dataclasses.replace(cuda_facts(None), num_sms=132)
print(facts, flush=True)
CONFIGS = [("Qwen3-235B-A22B", 1), ("Qwen3-32B", 8), ("Qwen3-8B", 1), ("Qwen3-30B-A3B", 1), ("Qwen3-8B", 4),
           ("Llama-3.1-70B", 8), ("MiniMax-M2", 8), ("Gemma-4-31B:sliding", 8)]
for name, tp in CONFIGS:
    g = model(name).shard(tp)
    for n in (1, 8, 64, 256) if device.type == "cuda" else (3,):
        kv_args, cache = make_kv_inputs(g, n, device, seed=n)
        shape = validation.split_qkv_rmsnorm_rope(**kv_args).shape
        kv_shape = validation.split_qkv_rmsnorm_rope_kv_cache(**kv_args, **cache).shape
        if n > cuda.small_batch_max_tokens(shape, facts):
            continue
        plan = cuda.small_batch_plan(shape, facts)
        kv_plan = cuda.plan_for_tokens(kv_shape, facts, n)
        variants = {"pro": plan, "pro2": dataclasses.replace(plan, block_tokens=2 * plan.block_tokens)}
        if device.type != "cuda":
            variants = {k: dataclasses.replace(p, pdl=False) for k, p in variants.items()}
        ref = reference.split_qkv_rmsnorm_rope(**kv_args)
        for tag, p in variants.items():
            with tiling.forced(backend="cuda", plan=p):
                assert _max_rel_err(pro(**kv_args), ref) < 2e-2, (name, tp, n, tag)
        print(f"{name} TP{tp} {g.label} T={n} pro {plan} kv {kv_plan}", flush=True)
        if device.type != "cuda":
            continue
        for calls in (1, 20):
            for rnd in range(3):
                line = f"{name} TP{tp} T={n:<3d} x{calls:<2d} r{rnd}"
                for tag, p in variants.items():
                    with tiling.forced(plan=p):
                        line += f" | {tag} {timer(lambda: pro(**kv_args), calls):6.2f}"
                line += f" | kv {timer(lambda: wr(**kv_args, **cache), calls):6.2f}"
                print(line, flush=True)
