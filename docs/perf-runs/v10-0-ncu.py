"""One fused call of 8/1/128 (Qwen3-32B TP 8) at T = 4096 for Nsight Compute: argv[1] "pro" or
"kv", argv[2] "default" or "ahead" (``CudaPlan.pos_ahead``). Calls the op twice (compile, then
the profiled one)."""
import dataclasses
import sys
import torch
from vllm_ascend_ext.bench import make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda
op, variant = sys.argv[1], sys.argv[2]
g = model("Qwen3-32B").shard(8)
shape = KernelShape.of(g, 2, 4)
if op == "kv":
    shape = dataclasses.replace(shape, kv_cache=True)
    args, cache = make_kv_inputs(g, 4096, "cuda")
    fn = lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache)
else:
    args = make_inputs(g, 4096, "cuda")
    fn = lambda: split_qkv_rmsnorm_rope(**args)
plan = cuda.plan(shape, cuda_facts(torch.cuda.current_device()))
if variant == "ahead":
    plan = dataclasses.replace(plan, pos_ahead=True)
with tiling.forced(plan=plan):
    for _ in range(2):
        fn()
torch.cuda.synchronize()
