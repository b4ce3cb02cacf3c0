"""v16 A/B 1, in one process (H200): the write's small-batch plan under SMALL_KV_MIN_TOKENS /
SMALL_KV_V_WITH_K ("new") against the plan before it ("old": the prologue's tokens a tile, v in its
own tiles), each with dependent launch (as planned on the H200) and without it ("-"), beside the
prologue ("pro", "pro-"); one call a graph and 20 calls a graph (per call), two rounds; every
variant's outputs and caches checked against the float64 reference as the benchmark checks them."""
import dataclasses
import torch
from vllm_ascend_ext.bench import _Timer, _kv_error, make_kv_inputs
from vllm_ascend_ext.ops import reference, tiling, validation
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.split_qkv_rmsnorm_rope import split_qkv_rmsnorm_rope as pro
from vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_kv_cache import split_qkv_rmsnorm_rope_kv_cache as wr
from vllm_ascend_ext.ops.tiling import cuda
import sys
device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda"); timer = _Timer(device, 0)
facts = cuda_facts(0) if device.type == "cuda" else dataclasses.replace(cuda_facts(None), num_sms=132)
print(facts, flush=True)
CONFIGS = [("Qwen3-235B-A22B", 1), ("Qwen3-32B", 8), ("Qwen3-8B", 1), ("Llama-3.1-70B", 8), ("GLM-4-9B", 1),
           ("Phi-2", 1), ("Gemma-4-31B:sliding", 8), ("Gemma-4-E2B:full", 4), ("MiniMax-M2", 8)]
for name, tp in CONFIGS:
    g = model(name).shard(tp)
    for n in (1, 8, 64) if device.type == "cuda" else (3,):
        kv_args, cache = make_kv_inputs(g, n, device, seed=n)
        shape = validation.split_qkv_rmsnorm_rope_kv_cache(**kv_args, **cache).shape
        if n > cuda.small_batch_max_tokens(shape, facts):
            continue
        new = cuda.small_batch_plan(shape, facts)
        old = dataclasses.replace(new, v_in_k_tiles=False, block_tokens=cuda.small_batch_plan(
            validation.split_qkv_rmsnorm_rope(**kv_args).shape, facts).block_tokens)
        pro_plan = cuda.small_batch_plan(validation.split_qkv_rmsnorm_rope(**kv_args).shape, facts)
        variants = {"new": new, "old": old}
        variants |= {k + "-": dataclasses.replace(p, pdl=False) for k, p in variants.items()}
        if device.type != "cuda":
            variants = {k: p for k, p in variants.items() if not p.pdl}
        ref = reference.split_qkv_rmsnorm_rope(**kv_args)
        initial = cache["key_cache"].clone(), cache["value_cache"].clone()
        expected = reference.kv_cache_write(initial[0].cpu(), initial[1].cpu(), ref[1].cpu(), ref[2].cpu(),
                                            cache["slot_mapping"].cpu(), g.num_kv_heads, g.head_dim, cache_layout="nhd")
        for tag, p in variants.items():
            cache["key_cache"].copy_(initial[0]); cache["value_cache"].copy_(initial[1])
            with tiling.forced(backend="cuda", plan=p):
                err = _kv_error("ours_kv", wr(**kv_args, **cache), ref, cache, expected)
            assert err < 2e-2, (name, tp, n, tag, err)
        print(f"{name} TP{tp} {g.label} T={n} new {new}", flush=True)
        if device.type != "cuda":
            continue
        for calls in (1, 20):
            for rnd in range(2):
                line = f"{name} TP{tp} T={n:<3d} x{calls:<2d} r{rnd}"
                for tag, p in {"pro": pro_plan, "pro-": dataclasses.replace(pro_plan, pdl=False)}.items():
                    with tiling.forced(plan=p):
                        line += f" | {tag} {timer(lambda: pro(**kv_args), calls):6.2f}"
                for tag, p in variants.items():
                    with tiling.forced(plan=p):
                        line += f" | {tag} {timer(lambda: wr(**kv_args, **cache), calls):6.2f}"
                print(line, flush=True)
