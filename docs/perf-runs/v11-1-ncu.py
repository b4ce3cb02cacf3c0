"""One gated-layer call (Qwen3-Next-80B-A3B TP 1, T = 4096) for Nsight Compute: argv[1] = pro|kv,
argv[2] = default|gq (the gate in q's tiles, 8 heads a block). Two calls: compile, then profiled."""
import dataclasses
import sys
import torch
from vllm_ascend_ext.bench import make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda
kv, variant = sys.argv[1] == "kv", sys.argv[2]
g = model("Qwen3-Next-80B-A3B").shard(1)
shape = dataclasses.replace(KernelShape.of(g, 2, 4), kv_cache=kv)
plan = cuda.plan_for_tokens(shape, cuda_facts(0), 4096)
plan = dataclasses.replace(plan, g_in_q_tiles=variant == "gq")
if kv:
    args, cache = make_kv_inputs(g, 4096, "cuda")
    fn = lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache)
else:
    args = make_inputs(g, 4096, "cuda")
    fn = lambda: split_qkv_rmsnorm_rope(**args)
with tiling.forced(plan=plan):
    for _ in range(2):
        fn()
torch.cuda.synchronize()
