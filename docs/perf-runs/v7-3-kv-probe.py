"""Why is the fused KV write slower than prologue + bytes? Probe variants on 32/8/128 and 8/1/128."""
import torch

from vllm_ascend_ext.bench import _Timer, make_inputs, scatter_kv
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.reference import make_kv_cache
from vllm_ascend_ext.ops.tiling import KernelShape, cuda
import dataclasses

device = torch.device("cuda")
timer = _Timer(device, 0)
facts = cuda_facts(torch.cuda.current_device())
for name, tp in (("Qwen3-8B", 1), ("Qwen3-32B", 8), ("Qwen3-VL-8B", 1)):
    g = model(name).shard(tp)
    for n in (4096, 16384):
        args = make_inputs(g, n, device)
        res = {"ours": timer(lambda: split_qkv_rmsnorm_rope(**args))}
        for bs in (16, 128):
            for layout in ("nhd", "hnd"):
                cache = make_kv_cache(g, n, cache_layout=layout, block_size=bs, padding=0, device=device)
                cache.pop("k_scale"); cache.pop("v_scale")
                res[f"kv {layout} bs{bs} rand"] = timer(lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache))
                cache["slot_mapping"] = torch.arange(n, device=device)
                res[f"kv {layout} bs{bs} contig"] = timer(lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache))
                if layout == "nhd":
                    res[f"kv {layout} bs{bs} contig +kv"] = timer(
                        lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache, return_kv=True))
                    out = split_qkv_rmsnorm_rope(**args)
                    res[f"scatter {layout} bs{bs} contig"] = timer(
                        lambda: scatter_kv(out[1], out[2], cache["key_cache"], cache["value_cache"], cache["slot_mapping"]))
        cache = make_kv_cache(g, n, cache_layout="nhd", block_size=16, padding=0, device=device)
        cache.pop("k_scale"); cache.pop("v_scale")
        shape = dataclasses.replace(KernelShape.of(g, 2, 4), kv_cache=True)
        for tile in (1024, 2048, 4096, 8192):
            for psm in (4, 8, 16):
                p = cuda.plan(shape, facts, tile_elements=tile, programs_per_sm=psm)
                with tiling.forced(plan=p):
                    res[f"kv plan tile{tile} psm{psm} w{p.num_warps} bt{p.block_tokens}"] = timer(
                        lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache))
        print(g.label, n, flush=True)
        for k, v in res.items():
            print(f"   {k:40} {v:8.2f}", flush=True)
