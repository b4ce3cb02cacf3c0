"""v13 A/B 6 (mRoPE, small batches): one kernel version (the site on PYTHONPATH), every config timed one call a graph (and
20 calls where marked), printed with the version's tag (argv[1]); the prologue's outputs checked
against the float64 reference once per config."""
import sys, torch
from vllm_ascend_ext.bench import _Timer, _max_rel_err, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import reference, split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache
from vllm_ascend_ext.ops.models import model
tag = sys.argv[1]
device = torch.device("cuda"); timer = _Timer(device, 0)
CONFIGS = [
    ("Qwen3-VL-8B", 1, (1, 64, 256), ()),
    ("Qwen3.5-27B", 1, (1, 8, 64), ()),
    ("Qwen3.5-35B-A3B", 1, (1, 64), ()),
]
for name, tp, counts, x20 in CONFIGS:
    g = model(name).shard(tp)
    for n in counts:
        args = make_inputs(g, n, device)
        err = _max_rel_err(split_qkv_rmsnorm_rope(**args), reference.split_qkv_rmsnorm_rope(**args))
        for kv in (False, True):
            if kv:
                a, cache = make_kv_inputs(g, n, device)
                fn = lambda: split_qkv_rmsnorm_rope_kv_cache(**a, **cache)
            else:
                fn = lambda: split_qkv_rmsnorm_rope(**args)
            for calls in (1, 20) if n in x20 else (1,):
                us = timer(fn, calls)
                print(f"{tag} {name} TP{tp} {'kv ' if kv else 'pro'} T={n} x{calls} {us:8.2f} err {err:.1e}", flush=True)
