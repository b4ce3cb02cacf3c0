"""The cache write's fp32 values (an fp32 cache holds the kernel's unrounded y) against float64, 8/1/128
(Qwen3-32B TP 8) at 16387 tokens, HND: the largest errors in fp8 units of a calibrated per-tensor
scale (amax/448), by plan. Looks for what put the fp8 GPU test one grid step off."""
import torch
from vllm_ascend_ext.ops import reference, split_qkv_rmsnorm_rope_kv_cache, tiling, validation
from vllm_ascend_ext.ops import device as dev
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import ascend, cuda
g = model("Qwen3-32B").shard(8)
D = 128
for seed in range(3):
    torch.manual_seed(seed)
    args = reference.make_inputs(g, 16387, device="cuda", dtype=torch.bfloat16, max_position=4099)
    cache = reference.make_kv_cache(g, 16387, cache_layout="hnd", dtype=torch.float32, block_size=16, padding=0,
                                    device="cuda")
    for key in ("k_scale", "v_scale"):
        cache.pop(key, None)
    ref = reference.split_qkv_rmsnorm_rope(**{k: (v.cpu() if isinstance(v, torch.Tensor) else v)
                                              for k, v in args.items()})
    k64 = ref[1].cuda()
    slots = cache["slot_mapping"].long()
    blk, off = slots // 16, slots % 16
    shape = validation.split_qkv_rmsnorm_rope_kv_cache(**args, **cache).shape
    for name, plan in (("ascend", ascend.plan(shape, dev.ascend_facts(None))),
                       ("cuda", cuda.plan(shape, dev.cuda_facts(0)))):
        with tiling.forced(plan=plan):
            split_qkv_rmsnorm_rope_kv_cache(**args, **cache)
        torch.cuda.synchronize()
        got = cache["key_cache"][blk, 0, off, :].double()  # [T, D] (one kv head)
        err = (got - k64).abs() / k64.abs().amax() * 448
        top = torch.topk(err.flatten(), 5)
        toks = (top.indices // D).tolist()
        print(seed, name, f"max err {top.values[0].item():.2e} fp8 units", "tokens", toks,
              "lanes", (top.indices % D).tolist(), "y/amax",
              [f"{(k64.flatten()[i] / k64.abs().amax()).item():.3g}" for i in top.indices.tolist()],
              "median", f"{err.median().item():.1e}", flush=True)
