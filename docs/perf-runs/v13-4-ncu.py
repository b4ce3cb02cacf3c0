"""v13 ncu: 8/1/128 (Qwen3-32B TP 8) at T = 4096, the write (kv) or the prologue (pro) or the copy of the
write's bytes (copy), 24 direct launches back to back (profile one late in the run with the cache
untouched between launches: data as warm in L2 as in a 20-call graph)."""
import dataclasses, sys, torch
from vllm_ascend_ext.bench import _triton_copy, bytes_moved, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache
from vllm_ascend_ext.ops.models import model
g = model("Qwen3-32B").shard(8); what = sys.argv[1]
if what == "kv":
    args, cache = make_kv_inputs(g, 4096, "cuda"); fn = lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache)
elif what == "pro":
    args = make_inputs(g, 4096, "cuda"); fn = lambda: split_qkv_rmsnorm_rope(**args)
else:
    nb = bytes_moved(g, 4096, kv_cache=True) // 4
    src = torch.zeros(nb, dtype=torch.int16, device="cuda"); dst = torch.empty_like(src)
    block, warps = (2048, 4) if what == "copy2048" else (8192, 8)
    fn = lambda: _triton_copy(src, dst, block, warps)
for _ in range(24):
    fn()
torch.cuda.synchronize()
