"""v15 sweep 1: 8/1/128 (Qwen3-32B TP 8) at T = 4096, fewer and wider programs (8-32 tokens a tile in
4-8 warps, 1-4 programs an SM) against the plan, both ops, one call and 20 calls a graph, three
rounds; then the registers and spills of the plan's kernel and the head-major variants (A/B 0) as
this GPU's Triton compiles them."""
import dataclasses, importlib.util, sys, pathlib, os
import torch
import vllm_ascend_ext.ops as pkg
from vllm_ascend_ext.bench import _Timer, _max_rel_err, _triton_copy, bytes_moved, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import reference, tiling
from vllm_ascend_ext.ops.models import model
from vllm_ascend_ext.ops.split_qkv_rmsnorm_rope import split_qkv_rmsnorm_rope as pro
from vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_kv_cache import split_qkv_rmsnorm_rope_kv_cache as wr
from vllm_ascend_ext.ops.tiling import cuda
from vllm_ascend_ext.ops import device as dev
device = torch.device("cuda"); timer = _Timer(device, 0)
g = model("Qwen3-32B").shard(8)
facts = dev.cuda_facts(0)
sms = facts.num_sms
n = int(os.environ.get("T", "4096"))
args = make_inputs(g, n, device); ref = reference.split_qkv_rmsnorm_rope(**args)
kv_args, cache = make_kv_inputs(g, n, device)
from vllm_ascend_ext.ops import validation
shape_pro = validation.split_qkv_rmsnorm_rope(**args).shape
shape_kv = validation.split_qkv_rmsnorm_rope_kv_cache(**kv_args, **cache).shape
base = {False: cuda.plan(shape_pro, facts), True: cuda.plan(shape_kv, facts)}
print("plans", base, flush=True)
VARIANTS = [("plan", {})]
for tok, warps, per_sm, cap in [(8, 4, 4, 128), (8, 4, 2, 128), (16, 8, 2, 128), (16, 8, 1, 128), (16, 4, 2, 0),
                                (32, 8, 1, 128), (8, 4, 4, 0), (16, 8, 2, 0), (8, 4, 3, 168), (16, 8, 1, 255)]:
    VARIANTS.append((f"t{tok}w{warps}p{per_sm}c{cap}", dict(block_tokens=tok, num_warps=warps,
                                                             max_programs=per_sm * sms, max_registers=cap)))
for kv in (False, True):
    nb = max(1, bytes_moved(g, n, kv_cache=kv) // 4)
    src = torch.zeros(nb, dtype=torch.int16, device=device); dst = torch.empty_like(src)
    for calls in (1, 20):
        for rnd in range(3):
            copy = min(timer(lambda: _triton_copy(src, dst, b, w), calls) for b, w in ((2048, 4), (8192, 8)))
            line = f"{'kv ' if kv else 'pro'} T={n} x{calls:<2d} r{rnd} copy {copy:5.2f}"
            for tag, edit in VARIANTS:
                p = dataclasses.replace(base[kv], **edit)
                with tiling.forced(plan=p):
                    if rnd == 0 and calls == 1:
                        assert _max_rel_err(pro(**args), ref) < 2e-2
                    fn = (lambda: wr(**kv_args, **cache)) if kv else (lambda: pro(**args))
                    us = timer(fn, calls)
                line += f" | {tag} {us:5.2f} {us / copy:5.3f}"
            print(line, flush=True)
# registers / spills as compiled here
try:
    from vllm_ascend_ext.ops.split_qkv_rmsnorm_rope import _split_qkv_rmsnorm_rope_kernel as K
    def dump(kern, tag):
        for dcache in getattr(kern, "device_caches", {}).values():
            for key, ck in dcache[0].items():
                print(tag, "regs", ck.n_regs, "spills", ck.n_spills, "warps", ck.metadata.num_warps, flush=True)
    dump(K, "landed")
    here = pathlib.Path(__file__).parent
    for tag in ("hm", "hf"):
        name = f"vllm_ascend_ext.ops._ab_{tag}"
        spec = importlib.util.spec_from_file_location(name, here / f"{tag}.py")
        mod = importlib.util.module_from_spec(spec); sys.modules[name] = mod; spec.loader.exec_module(mod)
        mod.split_qkv_rmsnorm_rope(**args)
        dump(mod._split_qkv_rmsnorm_rope_kernel, tag)
        for ck_cache in mod._split_qkv_rmsnorm_rope_kernel.device_caches.values():
            for key, ck in ck_cache[0].items():
                open(os.environ["OUT"] + f"/{tag}-{ck.n_regs}r.ttgir", "w").write(ck.asm["ttgir"])
                open(os.environ["OUT"] + f"/{tag}-{ck.n_regs}r.cubin", "wb").write(ck.asm["cubin"])
    for ck_cache in K.device_caches.values():
        for key, ck in ck_cache[0].items():
            if ck.metadata.num_warps == 2:
                stem = os.environ["OUT"] + f"/c0-{ck.metadata.num_warps}w-{ck.n_regs}r"
                open(stem + ".ttgir", "w").write(ck.asm["ttgir"])
                open(stem + ".cubin", "wb").write(ck.asm["cubin"])

except Exception as e:
    print("dump failed", repr(e))
