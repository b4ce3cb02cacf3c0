"""v15 A/B 4, in one process, the kernel with dependent launch (the plan's, H200): every large plan that
loads positions ahead, timed as planned ("plan") and with positions ahead off ("noahead"), one call a
graph and 20 calls a graph (per call) beside the benchmark's same-bytes copy; outputs checked
against the float64 reference."""
import dataclasses
import torch
from vllm_ascend_ext.bench import _Timer, _max_rel_err, _triton_copy, bytes_moved, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import reference, tiling, validation
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.split_qkv_rmsnorm_rope import split_qkv_rmsnorm_rope as pro
from vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_kv_cache import split_qkv_rmsnorm_rope_kv_cache as wr
from vllm_ascend_ext.ops.tiling import cuda
device = torch.device("cuda"); timer = _Timer(device, 0)
facts = cuda_facts(0)
print(facts, flush=True)
CONFIGS = [("Qwen3-32B", 8), ("Qwen3-8B", 4), ("Qwen3-8B", 8), ("Qwen3-235B-A22B", 4), ("Qwen3-VL-8B", 8),
           ("Qwen3-VL-30B-A3B", 1), ("Gemma-4-E2B:sliding", 1), ("Qwen3-VL-8B", 1)]
for name, tp in CONFIGS:
    g = model(name).shard(tp)
    for n in (4096, 16384):
        args = make_inputs(g, n, device)
        ref = reference.split_qkv_rmsnorm_rope(**args)
        kv_args, cache = make_kv_inputs(g, n, device)
        for kv in (False, True):
            shape = (validation.split_qkv_rmsnorm_rope_kv_cache(**kv_args, **cache) if kv
                     else validation.split_qkv_rmsnorm_rope(**args)).shape
            plan = cuda.plan(shape, facts)
            if not plan.pos_ahead:
                continue
            variants = {"plan": plan, "noahead": dataclasses.replace(plan, pos_ahead=False)}
            for tag, p in variants.items():
                with tiling.forced(plan=p):
                    assert _max_rel_err(pro(**args), ref) < 2e-2, (name, n, tag)
            nb = max(1, bytes_moved(g, n, kv_cache=kv) // 4)
            src = torch.zeros(nb, dtype=torch.int16, device=device); dst = torch.empty_like(src)
            for calls in (1, 20):
                for rnd in range(2):
                    copy = min(timer(lambda: _triton_copy(src, dst, b, w), calls) for b, w in ((2048, 4), (8192, 8)))
                    line = f"{name} TP{tp} {'kv ' if kv else 'pro'} T={n} x{calls:<2d} r{rnd} copy {copy:6.2f}"
                    for tag, p in variants.items():
                        with tiling.forced(plan=p):
                            fn = (lambda: wr(**kv_args, **cache)) if kv else (lambda: pro(**args))
                            us = timer(fn, calls)
                        line += f" | {tag} {us:7.2f} {us / copy:5.3f}"
                    print(line, flush=True)
