"""v13 probe 1: the gated layer's (Qwen3-Next TP 1, 16/2/256 R64 w+1 gate) small-batch plan at
T = 1 / 8 / 64 / 256, both ops, one call a graph: the plan (whole rows, 8 q heads a block, 2 warps)
against other head blocks, warps and the two-piece tail; three interleaved repeats."""
import dataclasses, itertools
import torch
from vllm_ascend_ext.bench import _Timer, _triton_copy, bytes_moved, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda
device = torch.device("cuda"); timer = _Timer(device, 0); facts = cuda_facts(torch.cuda.current_device())
R, SMS = dataclasses.replace, facts.num_sms
g = model("Qwen3-Next-80B-A3B").shard(1)
for kv in (False, True):
    shape = R(KernelShape.of(g, 2, 4), kv_cache=kv); base = cuda.small_batch_plan(shape, facts)
    vs = {"plan": base}
    for bh, w in itertools.product((2, 4, 8, 16), (1, 2, 4)):
        vs[f"whole bh{bh} w{w}"] = R(base, block_heads=bh, kv_block_heads=min(bh, 2), num_warps=w)
    vs["two-piece bh8 w4"] = R(base, whole_rows=False, two_piece_tail=True, num_warps=4)
    vs["two-piece bh4 w2"] = R(base, whole_rows=False, two_piece_tail=True, num_warps=2, block_heads=4)
    for n in (1, 8, 64, 256):
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
                print(f"gated {'kv' if kv else 'pro'} T={n} rep{rep} {label:22} {us:7.2f} copy {copy:6.2f} {us / copy:5.3f}",
                      flush=True)
