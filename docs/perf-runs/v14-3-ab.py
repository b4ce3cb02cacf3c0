"""v14 A/B 3, in one process: the landed kernel (c0) and build/ab14/v1.py, v2.py (make_variants.py)
loaded side by side as modules of the package, each config timed one call a graph for every
version in turn, three rounds, beside the benchmark's same-bytes copy; outputs checked against
the float64 reference per version and config."""
import importlib.util, sys, types, pathlib
import torch
import vllm_ascend_ext.ops as pkg
from vllm_ascend_ext.bench import _Timer, _max_rel_err, _triton_copy, bytes_moved, make_inputs, make_kv_inputs
from vllm_ascend_ext.ops import reference
from vllm_ascend_ext.ops.models import model
here = pathlib.Path(__file__).parent
ops_dir = pathlib.Path(pkg.__file__).parent

def load(tag, path):
    name = f"vllm_ascend_ext.ops._ab_{tag}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec); sys.modules[name] = mod; spec.loader.exec_module(mod)
    src = (ops_dir / "split_qkv_rmsnorm_rope_kv_cache.py").read_text()
    old = "from .split_qkv_rmsnorm_rope import launch"
    assert src.count(old) == 1
    kv = types.ModuleType(name + "_kv"); kv.__package__ = "vllm_ascend_ext.ops"; sys.modules[kv.__name__] = kv
    exec(compile(src.replace(old, f"from ._ab_{tag} import launch"), kv.__name__, "exec"), kv.__dict__)
    return mod.split_qkv_rmsnorm_rope, kv.split_qkv_rmsnorm_rope_kv_cache

VERSIONS = {"c0": load("c0", ops_dir / "split_qkv_rmsnorm_rope.py"), "v1": load("v1", here / "v1.py"),
            "v2": load("v2", here / "v2.py")}
device = torch.device("cuda"); timer = _Timer(device, 0)
CONFIGS = [("Qwen3-VL-8B", 1, (1, 8, 64, 256)), ("Qwen3-VL-30B-A3B", 1, (1, 64)), ("Qwen2.5-VL-7B", 1, (1, 64, 4096)),
           ("Qwen3-8B", 1, (1, 64, 256, 4096)), ("Qwen3-235B-A22B", 1, (1, 64, 4096)), ("Qwen3-32B", 8, (1, 64)),
           ("Gemma-4-31B:sliding", 1, (1, 64, 4096))]
for name, tp, counts in CONFIGS:
    g = model(name).shard(tp)
    for n in counts:
        args = make_inputs(g, n, device)
        ref = reference.split_qkv_rmsnorm_rope(**args)
        kv_args, cache = make_kv_inputs(g, n, device)
        for tag, (pro, _) in VERSIONS.items():
            err = _max_rel_err(pro(**args), ref)
            assert err < 2e-2, (name, n, tag, err)
        for kv in (False, True):
            nb = max(1, bytes_moved(g, n, kv_cache=kv) // 4)
            src = torch.zeros(nb, dtype=torch.int16, device=device); dst = torch.empty_like(src)
            for rnd in range(3):
                copy = min(timer(lambda: _triton_copy(src, dst, b, w), 1) for b, w in ((2048, 4), (8192, 8)))
                for tag, (pro, wr) in VERSIONS.items():
                    fn = (lambda: wr(**kv_args, **cache)) if kv else (lambda: pro(**args))
                    us = timer(fn, 1)
                    print(f"{name} TP{tp} {'kv ' if kv else 'pro'} T={n} r{rnd} {tag} {us:7.2f} copy {copy:6.2f} "
                          f"{us / copy:5.3f}", flush=True)
