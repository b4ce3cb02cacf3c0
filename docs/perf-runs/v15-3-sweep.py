"""v15 sweep 3: 8/1/128 (Qwen3-32B TP 8) at T = 4096 with dependent launch (the kernel of
v15-2-make-variants.py's p1, loaded from build/ab16/p1.py): the plan against wider programs, other
token counts, programs an SM and register caps, and the plan's tiling with positions ahead off (the
"n" suffix), both ops, 20 calls a graph (per call), three rounds."""
import dataclasses, importlib.util, sys, pathlib, os
import torch
import vllm_ascend_ext.ops as pkg
from vllm_ascend_ext.bench import _Timer, _max_rel_err, _triton_copy, bytes_moved, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import reference, tiling
from vllm_ascend_ext.ops.models import model
import types
ops_dir = pathlib.Path(pkg.__file__).parent
here = pathlib.Path(__file__).parent
spec = importlib.util.spec_from_file_location("vllm_ascend_ext.ops._ab_p1", here / "p1.py")
p1 = importlib.util.module_from_spec(spec); sys.modules[spec.name] = p1; spec.loader.exec_module(p1)
kvsrc = (ops_dir / "split_qkv_rmsnorm_rope_kv_cache.py").read_text().replace(
    "from .split_qkv_rmsnorm_rope import launch", "from ._ab_p1 import launch")
kvm = types.ModuleType("vllm_ascend_ext.ops._ab_p1_kv"); kvm.__package__ = "vllm_ascend_ext.ops"
sys.modules[kvm.__name__] = kvm; exec(compile(kvsrc, kvm.__name__, "exec"), kvm.__dict__)
pro, wr = p1.split_qkv_rmsnorm_rope, kvm.split_qkv_rmsnorm_rope_kv_cache
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
for tok, warps, per_sm, cap, ahead in [(16, 8, 2, 0, True), (8, 4, 4, 128, True), (8, 4, 4, 0, True),
                                       (4, 2, 12, 128, True), (4, 2, 16, 128, True), (2, 2, 16, 128, True),
                                       (4, 2, 8, 128, False), (4, 4, 8, 80, True), (2, 2, 8, 128, True)]:
    VARIANTS.append((f"t{tok}w{warps}p{per_sm}c{cap}{'' if ahead else 'n'}", dict(
        block_tokens=tok, num_warps=warps, max_programs=per_sm * sms, max_registers=cap, pos_ahead=ahead)))
for kv in (False, True):
    nb = max(1, bytes_moved(g, n, kv_cache=kv) // 4)
    src = torch.zeros(nb, dtype=torch.int16, device=device); dst = torch.empty_like(src)
    for calls in (20,):
        for rnd in range(3):
            copy = min(timer(lambda: _triton_copy(src, dst, b, w), calls) for b, w in ((2048, 4), (8192, 8)))
            line = f"{'kv ' if kv else 'pro'} T={n} x{calls:<2d} r{rnd} copy {copy:5.2f}"
            for tag, edit in VARIANTS:
                p = dataclasses.replace(base[kv], **edit)
                with tiling.forced(plan=p):
                    if rnd == 0:
                        assert _max_rel_err(pro(**args), ref) < 2e-2
                    fn = (lambda: wr(**kv_args, **cache)) if kv else (lambda: pro(**args))
                    us = timer(fn, calls)
                line += f" | {tag} {us:5.2f} {us / copy:5.3f}"
            print(line, flush=True)
