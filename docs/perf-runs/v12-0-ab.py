"""A/B of kernel versions (one site per process): every bench geometry, both ops, the plan the op
picks; ours and the same-bytes copy of the same process. argv[1] = label."""
import sys
import torch
from vllm_ascend_ext.bench import _Timer, _triton_copy, bytes_moved, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache
from vllm_ascend_ext.ops.models import BENCH_GEOMETRIES, model
device = torch.device("cuda"); timer = _Timer(device, 0); label = sys.argv[1]
for name, tp in BENCH_GEOMETRIES:
    g = model(name).shard(tp)
    for kv in (False, True):
        for n in ((8, 256, 4096, 16384) if not kv else (64, 4096, 16384)):
            if kv:
                args, cache = make_kv_inputs(g, n, device)
                fn = lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache)
            else:
                args = make_inputs(g, n, device)
                fn = lambda: split_qkv_rmsnorm_rope(**args)
            nb = max(1, bytes_moved(g, n, kv_cache=kv) // 4)
            src = torch.zeros(nb, dtype=torch.int16, device=device); dst = torch.empty_like(src)
            for calls in ((1, 20) if kv and n >= 4096 else (1,)):
                copy = min(timer(lambda: _triton_copy(src, dst, b, w), calls) for b, w in ((2048, 4), (8192, 8)))
                us = timer(fn, calls)
                print(f"{label} {g.label[:26]:26} {'kv' if kv else 'pro':3} x{calls:<2d} T={n:5d} {us:8.2f} copy {copy:8.2f} "
                      f"{us / copy:5.3f}", flush=True)
