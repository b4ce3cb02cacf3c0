"""v14 probe 2: mRoPE's small-batch plan (Qwen3-VL-8B, Qwen3-VL-30B-A3B, Qwen2.5-VL-7B TP 1) at
T = 1 / 8 / 64 / 256, both ops, one call a graph: the plan (2 tokens x 8 heads, 4 warps, halves)
against other tokens / heads a tile and warps; three interleaved repeats in one process, each
timing beside the same-bytes copy of the benchmark."""
import dataclasses
import torch
from vllm_ascend_ext.bench import _Timer, _max_rel_err, _triton_copy, bytes_moved, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import reference, split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda
device = torch.device("cuda"); timer = _Timer(device, 0); facts = cuda_facts(torch.cuda.current_device())
R = dataclasses.replace
VARIANTS = {"t1 w4": dict(block_tokens=1), "t1 w2": dict(block_tokens=1, num_warps=2),
            "t2 w2": dict(num_warps=2), "t2 w8": dict(num_warps=8), "t4 w4": dict(block_tokens=4),
            "t2 h4": dict(block_heads=4, kv_block_heads=4), "t1 h4 w2": dict(block_tokens=1, block_heads=4,
                                                                           kv_block_heads=4, num_warps=2)}
for name in ("Qwen3-VL-8B", "Qwen3-VL-30B-A3B", "Qwen2.5-VL-7B"):
    g = model(name).shard(1)
    for kv in (False, True):
        shape = R(KernelShape.of(g, 2, 4), kv_cache=kv); base = cuda.small_batch_plan(shape, facts)
        vs = {"plan": base}
        for label, kw in VARIANTS.items():
            vs[label] = R(base, **{k: min(v, base.kv_block_heads) if k == "kv_block_heads" else v for k, v in kw.items()})
        for n in (1, 8, 64, 256):
            if cuda.plan_for_tokens(shape, facts, n) != base:
                continue
            if kv:
                args, cache = make_kv_inputs(g, n, device)
                fn = lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache)
            else:
                args = make_inputs(g, n, device)
                fn = lambda: split_qkv_rmsnorm_rope(**args)
                ref = reference.split_qkv_rmsnorm_rope(**args)
                for label, p in vs.items():
                    with tiling.forced(plan=p):
                        err = _max_rel_err(split_qkv_rmsnorm_rope(**args), ref)
                    assert err < 2e-2, (name, n, label, err)
            nb = max(1, bytes_moved(g, n, kv_cache=kv) // 4)
            src = torch.zeros(nb, dtype=torch.int16, device=device); dst = torch.empty_like(src)
            for rep in range(3):
                copy = min(timer(lambda: _triton_copy(src, dst, b, w), 1) for b, w in ((2048, 4), (8192, 8)))
                for label, p in vs.items():
                    with tiling.forced(plan=p):
                        us = timer(fn, 1)
                    print(f"{name} {'kv ' if kv else 'pro'} T={n} rep{rep} {label:9} {us:7.2f} copy {copy:6.2f} {us / copy:5.3f}",
                          flush=True)
