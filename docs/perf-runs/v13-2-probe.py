"""v13 probe 2: small-batch whole-row plans (D = 256, a 192-lane tail) with 8 (the plan), 4 and 2 q heads
a block, both ops, one call a graph, T = 1 / 8 / 64 / 256 and the most tokens the small plan takes;
three interleaved repeats. Each line: ours / the same-bytes copy."""
import dataclasses
import torch
from vllm_ascend_ext.bench import _Timer, _triton_copy, bytes_moved, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda
device = torch.device("cuda"); timer = _Timer(device, 0); facts = cuda_facts(torch.cuda.current_device())
R = dataclasses.replace
for name, tp in (("Qwen3-Next-80B-A3B", 1), ("Qwen3-Next-80B-A3B", 2), ("Qwen3.5-27B", 1), ("Qwen3.5-27B", 2),
                 ("Qwen3.5-35B-A3B", 1), ("Qwen3.5-397B-A17B", 1)):
    g = model(name).shard(tp)
    for kv in (False, True):
        shape = R(KernelShape.of(g, 2, 4), kv_cache=kv); base = cuda.small_batch_plan(shape, facts)
        assert base.whole_rows, (name, tp)
        vs = {f"plan bh{base.block_heads}": base}
        for bh in (4, 2):
            if bh < base.block_heads:
                vs[f"bh{bh}"] = R(base, block_heads=bh, kv_block_heads=min(bh, base.kv_block_heads))
        top = cuda.small_batch_max_tokens(shape, facts)
        for n in (1, 8, 64, 256, top):
            if kv:
                args, cache = make_kv_inputs(g, n, device)
                fn = lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache)
            else:
                args = make_inputs(g, n, device)
                fn = lambda: split_qkv_rmsnorm_rope(**args)
            nb = max(1, bytes_moved(g, n, kv_cache=kv) // 4)
            src = torch.zeros(nb, dtype=torch.int16, device=device); dst = torch.empty_like(src)
            copy = min(timer(lambda: _triton_copy(src, dst, b, w), 1) for b, w in ((2048, 4), (8192, 8)))
            for rep in range(3):
                for label, p in vs.items():
                    with tiling.forced(plan=p):
                        us = timer(fn, 1)
                    print(f"{name} TP{tp} {g.num_q_heads}/{g.num_kv_heads} {'kv' if kv else 'pro'} T={n} rep{rep} "
                          f"{label:10} {us:7.2f} copy {copy:6.2f} {us / copy:5.3f}", flush=True)
