"""v15 A/B 2, in one process: the landed kernel (c0) and build/ab16/p1.py, p2.py (v15-2-make-variants.py)
loaded side by side as modules of the package; each config timed one call a graph and 20 calls a
graph (per call) for every version in turn, three rounds, beside the benchmark's same-bytes copy;
prologue outputs checked against the float64 reference, cache writes against c0's."""
import importlib.util, sys, types, pathlib, os
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

VERSIONS = {"c0": load("c0", ops_dir / "split_qkv_rmsnorm_rope.py"), "p1": load("p1", here / "p1.py"),
            "p2": load("p2", here / "p2.py")}
device = torch.device("cuda"); timer = _Timer(device, 0)
CONFIGS = [("Qwen3-32B", 8, (1, 64, 4096, 16384)), ("Qwen3-8B", 1, (1, 64, 4096)), ("Gemma-4-31B:sliding", 1, (64, 4096)),
           ("Qwen3-Next-80B-A3B", 1, (64, 4096)), ("Qwen3-VL-8B", 1, (64, 4096)), ("Qwen3-235B-A22B", 1, (4096,))]
if os.environ.get("AB_QUICK"):
    CONFIGS = [("Qwen3-32B", 8, (4096,))]
for name, tp, counts in CONFIGS:
    g = model(name).shard(tp)
    for n in counts:
        args = make_inputs(g, n, device)
        ref = reference.split_qkv_rmsnorm_rope(**args)
        kv_args, cache = make_kv_inputs(g, n, device)
        base = None
        for tag, (pro, wr) in VERSIONS.items():
            err = _max_rel_err(pro(**args), ref)
            assert err < 2e-2, (name, n, tag, err)
            for c in cache.values():
                if isinstance(c, torch.Tensor) and c.is_floating_point():
                    c.fill_(0)
            wr(**kv_args, **cache)
            got = [c.clone() for c in cache.values() if isinstance(c, torch.Tensor) and c.is_floating_point()]
            if base is None:
                base = got
            else:
                for x, y in zip(got, base):
                    d = (x.double() - y.double()).abs().max().item() / (y.double().abs().max().item() or 1.0)
                    assert d < 2e-2, (name, n, tag, "cache", d)
        for kv in (False, True):
            nb = max(1, bytes_moved(g, n, kv_cache=kv) // 4)
            src = torch.zeros(nb, dtype=torch.int16, device=device); dst = torch.empty_like(src)
            for calls in (1, 20):
                for rnd in range(3 if calls > 1 else 1):
                    copy = min(timer(lambda: _triton_copy(src, dst, b, w), calls) for b, w in ((2048, 4), (8192, 8)))
                    line = f"{name} TP{tp} {'kv ' if kv else 'pro'} T={n} x{calls:<2d} r{rnd} copy {copy:6.2f}"
                    for tag, (pro, wr) in VERSIONS.items():
                        fn = (lambda: wr(**kv_args, **cache)) if kv else (lambda: pro(**args))
                        us = timer(fn, calls)
                        line += f" | {tag} {us:7.2f} {us / copy:5.3f}"
                    print(line, flush=True)
