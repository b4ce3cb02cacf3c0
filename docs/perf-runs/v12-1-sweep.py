"""Sweeps on one site: 8/1/128 (Qwen3-32B TP 8) large plans at T = 4096 (both ops, x1 and x20 with
the write); the gated layer's small-batch plan at T = 256 (both ops). Each line ours / copy."""
import dataclasses, itertools
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
            print(f"{tag} {label}: {type(exc).__name__}: {str(exc)[:100]}", flush=True); return None
        out[calls] = us / copy[calls]
        print(f"{tag} x{calls:<2d} {label:40} {us:8.2f} copy {copy[calls]:8.2f} {us / copy[calls]:5.3f}", flush=True)
    return out
g = model("Qwen3-32B").shard(8)
for kv in (True, False):
    shape = R(KernelShape.of(g, 2, 4), kv_cache=kv); base = cuda.plan(shape, facts)
    modes = (1, 20)
    fn, copy = setup(g, 4096, kv, modes)
    tag = f"8/1/128 {'kv' if kv else 'pro'} T=4096"
    res = {}
    vs = {"plan": base}
    for bt, w, cap, per_sm in itertools.product((2, 4, 8), (2, 4), ((0, 128) if kv else (0, 80)), (8, 16, 32)):
        vs[f"bt{bt} w{w} cap{cap} {per_sm}/SM"] = R(base, block_tokens=bt, num_warps=w, max_registers=cap, max_programs=SMS * per_sm)
    vs["plan no-ahead"] = R(base, pos_ahead=False)
    vs["plan no-vk"] = R(base, v_in_k_tiles=False) if kv else base
    for label, p in vs.items():
        r = timed(fn, copy, tag, label, p, modes)
        if r: res[label] = r
    best = sorted(res, key=lambda k: res[k][20])[:5]
    print(f"{tag} top-x20: {best}", flush=True)
    for n in (4096, 16384):
        fn, copy = setup(g, n, kv, modes)
        for rep in range(2):
            for label in ["plan"] + [b for b in best if b != "plan"]:
                timed(fn, copy, f"8/1/128 {'kv' if kv else 'pro'} T={n} rep{rep}", label, vs[label], modes)
g = model("Qwen3-Next-80B-A3B").shard(1)
for kv in (False, True):
    shape = R(KernelShape.of(g, 2, 4), kv_cache=kv); base = cuda.small_batch_plan(shape, facts)
    fn, copy = setup(g, 256, kv, (1,))
    vs = {"plan": base}
    for bh, w, per_sm in itertools.product((4, 8), (2, 4), (8, 12, 16, 24)):
        vs[f"whole bh{bh} w{w} {per_sm}/SM"] = R(base, block_heads=bh, num_warps=w, max_programs=SMS * per_sm)
    large = cuda.plan(shape, facts)
    vs["large plan"] = large
    for per_sm in (8, 16, 48):
        vs[f"large {per_sm}/SM"] = R(large, max_programs=SMS * per_sm)
    for rep in range(2):
        for label, p in vs.items():
            timed(fn, copy, f"gated {'kv' if kv else 'pro'} T=256 rep{rep}", label, p, (1,))
