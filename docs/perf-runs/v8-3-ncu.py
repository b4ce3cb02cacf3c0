"""One fused call for Nsight Compute: argv[1] = case name. Calls the op twice (compile, then the profiled one)."""
import sys
import torch
from vllm_ascend_ext.bench import make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache
from vllm_ascend_ext.ops.models import model
CASES = {"kv-32-8": ("Qwen3-8B", 1, True), "kv-8-1": ("Qwen3-32B", 8, True), "kv-mrope": ("Qwen3-VL-8B", 1, True),
         "pro-32-8": ("Qwen3-8B", 1, False), "pro-mrope": ("Qwen3-VL-8B", 1, False), "pro-8-1": ("Qwen3-32B", 8, False)}
name, tp, kv = CASES[sys.argv[1]]
g = model(name).shard(tp)
if kv:
    args, cache = make_kv_inputs(g, 4096, "cuda")
    fn = lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache)
else:
    args = make_inputs(g, 4096, "cuda")
    fn = lambda: split_qkv_rmsnorm_rope(**args)
for _ in range(2):
    fn()
torch.cuda.synchronize()
