"""v13 probe 0: the QKV_TILE plan (a token block's q, k and v heads in one tile, every load before the
first store, one cos/sin gather) against the plan, large plans at T = 4096 / 16384, one call a graph
(x1) and 20 (x20). A sweep on 8/1/128 at T = 4096, then the top variants on every geometry where
the tile applies, two interleaved repeats. Each line: ours / the same-bytes copy."""
import dataclasses, itertools, sys
import torch
from vllm_ascend_ext.bench import _Timer, _triton_copy, bytes_moved, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache, tiling
from vllm_ascend_ext.ops.device import cuda_facts
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.tiling import KernelShape, cuda
device = torch.device("cuda"); timer = _Timer(device, 0); facts = cuda_facts(torch.cuda.current_device())
R, SMS = dataclasses.replace, facts.num_sms
def setup(g, n, kv, modes):
    if kv:
        args, cache = make_kv_inputs(g, n, device)
        fn = lambda: split_qkv_rmsnorm_rope_kv_cache(**args, **cache)
    else:
        args = make_inputs(g, n, device)
        fn = lambda: split_qkv_rmsnorm_rope(**args)
    nb = max(1, bytes_moved(g, n, kv_cache=kv) // 4)
    src = torch.zeros(nb, dtype=torch.int16, device=device); dst = torch.empty_like(src)
    copy = {c: min(timer(lambda: _triton_copy(src, dst, b, w), c) for b, w in ((2048, 4), (8192, 8))) for c in modes}
    return fn, copy
def timed(fn, copy, tag, label, plan, modes):
    out = {}
    for calls in modes:
        try:
            with tiling.forced(plan=plan):
                us = timer(fn, calls)
        except Exception as exc:  # noqa: BLE001
            print(f"{tag} {label}: {type(exc).__name__}: {str(exc)[:160]}", flush=True); return None
        out[calls] = us / copy[calls]
        print(f"{tag} x{calls:<2d} {label:34} {us:8.2f} copy {copy[calls]:8.2f} {us / copy[calls]:5.3f}", flush=True)
    return out
MODES = (1, 20)
def variants(base):
    vs = {"plan": base}
    for bt, w, cap, per_sm in itertools.product((2, 4, 8), (2, 4), (0, 128), (8, 16)):
        vs[f"qkv bt{bt} w{w} cap{cap} {per_sm}/SM"] = R(base, qkv_tiles=True, block_tokens=bt, num_warps=w,
                                                        max_registers=cap, max_programs=SMS * per_sm)
    return vs
best = {}
g = model("Qwen3-32B").shard(8)
for kv in (True, False):
    shape = R(KernelShape.of(g, 2, 4), kv_cache=kv); base = cuda.plan(shape, facts)
    print(f"8/1/128 kv={kv} plan: {base}", flush=True)
    fn, copy = setup(g, 4096, kv, MODES)
    res = {}
    vs = variants(base)
    for label, p in vs.items():
        r = timed(fn, copy, f"sweep 8/1/128 {'kv' if kv else 'pro'} T=4096", label, p, MODES)
        if r: res[label] = r
    key = 20 if kv else 1
    best[kv] = [b for b in sorted(res, key=lambda k: res[k][key]) if b != "plan"][:3]
    best[kv] += [b for b in sorted(res, key=lambda k: res[k][1 if kv else 20]) if b != "plan" and b not in best[kv]][:1]
    print(f"sweep 8/1/128 {'kv' if kv else 'pro'} best: {best[kv]}", flush=True)
for name, tp in (("Qwen3-32B", 8), ("Qwen3-8B", 4), ("Qwen3-8B", 8), ("Qwen3-VL-8B", 8)):
    g = model(name).shard(tp)
    for kv in (True, False):
        shape = R(KernelShape.of(g, 2, 4), kv_cache=kv); base = cuda.plan(shape, facts)
        vs = variants(base)
        for n in (1024, 4096, 16384):
            fn, copy = setup(g, n, kv, MODES)
            for rep in range(2):
                for label in ["plan"] + best[kv]:
                    timed(fn, copy, f"{g.num_q_heads}/{g.num_kv_heads}/{g.head_dim}{' mrope' if g.mrope_section else ''} "
                          f"{'kv' if kv else 'pro'} T={n} rep{rep}", label, vs[label], MODES)
