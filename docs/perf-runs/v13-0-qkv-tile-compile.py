import dataclasses, itertools, sys
from vllm_ascend_ext.ops import cuda_compile
from vllm_ascend_ext.ops.tiling import cuda
from vllm_ascend_ext.ops.models import model
R = dataclasses.replace
orig = cuda.plan
kvf = cuda_compile.KVForm("nhd", "bf16", False)
for name, tp in (("Qwen3-32B", 8),):
    g = model(name).shard(tp)
    for kv in (kvf, None):
        for qkv, bt, w, cap in [(False, None, None, None)] + list(itertools.product((True,), (2, 4, 8), (2, 4), (0, 128))):
            def patched(s, f, **k):
                p = orig(s, f, **k)
                return R(p, qkv_tiles=True, block_tokens=bt, num_warps=w, max_registers=cap) if qkv else p
            cuda.plan = patched
            try:
                r = cuda_compile.compile_plan(g, kv=kv)
                print(f"{name} tp{tp} kv={kv is not None} qkv={qkv} bt{bt} w{w} cap{cap}: regs {r['registers']} spill {r['spill_bytes']} v4 {r['v4']} v2 {r['v2']} b16 {r['scalar16']}", flush=True)
            except Exception as e:
                print(f"{name} kv={kv is not None} qkv={qkv} bt{bt} w{w} cap{cap}: {type(e).__name__} {str(e)[:300]}", flush=True)
            finally:
                cuda.plan = orig
