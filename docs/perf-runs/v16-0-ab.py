"""v16 A/B 0, in one process, the landed kernel with dependent launch (H200): the write's small-batch
plan as planned ("plan") and four variants (v in k's tiles "vk"; 2x the tokens a tile "t2"; both "vkt2";
the other warp count "w"), beside the prologue's own plan ("pro"), one call a graph and 20 calls a
graph (per call), three rounds; every variant's outputs and caches checked against the float64
reference as the benchmark checks them."""
import dataclasses
import torch
from vllm_ascend_ext.bench import _Timer, _kv_error, make_kv_inputs
from vllm_ascend_ext.ops import reference, tiling, validation
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import BENCH_GEOMETRIES, model
from vllm_ascend_ext.ops.split_qkv_rmsnorm_rope import split_qkv_rmsnorm_rope as pro
from vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_kv_cache import split_qkv_rmsnorm_rope_kv_cache as wr
from vllm_ascend_ext.ops.tiling import cuda
device = torch.device("cuda"); timer = _Timer(device, 0)
facts = cuda_facts(0)
print(facts, flush=True)
CONFIGS = list(BENCH_GEOMETRIES) + [("Qwen3-30B-A3B", 1), ("Qwen3-8B", 4), ("Qwen3-235B-A22B", 4)]
for name, tp in CONFIGS:
    g = model(name).shard(tp)
    for n in (1, 8, 64, 256):
        kv_args, cache = make_kv_inputs(g, n, device, seed=n)
        shape = validation.split_qkv_rmsnorm_rope_kv_cache(**kv_args, **cache).shape
        if n > cuda.small_batch_max_tokens(shape, facts):
            continue
        plan = cuda.small_batch_plan(shape, facts)
        other_warps = 2 if plan.num_warps == 4 else 4
        variants = {"plan": plan, "vk": dataclasses.replace(plan, v_in_k_tiles=True),
                    "t2": dataclasses.replace(plan, block_tokens=2 * plan.block_tokens),
                    "vkt2": dataclasses.replace(plan, v_in_k_tiles=True, block_tokens=2 * plan.block_tokens),
                    "w": dataclasses.replace(plan, num_warps=other_warps)}
        ref = reference.split_qkv_rmsnorm_rope(**kv_args)
        initial = cache["key_cache"].clone(), cache["value_cache"].clone()
        expected = reference.kv_cache_write(initial[0].cpu(), initial[1].cpu(), ref[1].cpu(), ref[2].cpu(),
                                            cache["slot_mapping"].cpu(), g.num_kv_heads, g.head_dim, cache_layout="nhd")
        for tag, p in variants.items():
            cache["key_cache"].copy_(initial[0]); cache["value_cache"].copy_(initial[1])
            with tiling.forced(plan=p):
                err = _kv_error("ours_kv", wr(**kv_args, **cache), ref, cache, expected)
            assert err < 2e-2, (name, tp, n, tag, err)
        print(f"{name} TP{tp} {g.label} T={n} plan {plan}", flush=True)
        for calls in (1, 20):
            for rnd in range(3):
                base = timer(lambda: pro(**kv_args), calls)
                line = f"{name} TP{tp} T={n:<3d} x{calls:<2d} r{rnd} pro {base:6.2f}"
                for tag, p in variants.items():
                    with tiling.forced(plan=p):
                        us = timer(lambda: wr(**kv_args, **cache), calls)
                    line += f" | {tag} {us:6.2f} {us / base:5.3f}"
                print(line, flush=True)
