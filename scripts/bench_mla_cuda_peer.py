#!/usr/bin/env python3
"""Our MLA prologue against vLLM's CUDA peer, built from vLLM's source on the local GPU (issue 30).

``vllm-ascend-ext bench --op split_qkv_rmsnorm_rope_mla``'s ``vllm`` provider does the RoPE and the
cache write in PyTorch, a slower peer than vLLM's CUDA path. This script builds that path's kernel,
``concat_and_cache_mla_rope_fused`` (vLLM's ``csrc/cache_kernels_fused.cu``: the RoPE of ``q_pe``
and ``k_pe`` in place and the MLA cache write, one launch, one block a token), with torch's
extension builder in a temporary folder, from the vLLM checkout given by ``--vllm-source``.
vLLM's file is compiled unchanged; the few vLLM headers it includes are replaced by stand-ins of
ours (:data:`STAND_INS`: ``VLLM_LDG`` a plain load of the read-only cos/sin row, the
floating-point dispatch and the ``kv_cache_dtype="auto"`` case only), so nothing else of vLLM is
needed and nothing of it is copied into this project.

Per MLA layer of the benchmark and token count, timed as the benchmark times (``Timer``: one call
a captured graph, and ``--calls`` calls in one graph, per call):

* ``ours``: ``split_qkv_rmsnorm_rope_mla`` with the combined bf16 cache write, then ``mla_q_rope_``
  (without a q latent, V2-Lite, one launch: the prologue rotates q; ``cases.mla_launches``);
* ``vllm_cuda``: vLLM's Triton ``fused_q_kv_rmsnorm`` (as the benchmark's ``vllm`` provider
  launches it), then ``concat_and_cache_mla_rope_fused`` on ``q[..., nope:]``, ``k_pe`` (the
  projection's columns, rotated in place as vLLM does) and the normalised ``kv_c``: the path vLLM
  0.32 runs on CUDA with its MLA RoPE + KV-cache fusion on. Its cos/sin cache is a bf16 copy
  (the kernel reads the query's dtype); ours reads the fp32 one.

Each provider's cache after one call is checked against the float64 reference (``err``: largest
difference over the rows' scale; vLLM rotates in bf16). The bar (issue 30): ours <= 0.8 x the peer
at T <= 64, both timings. Needs a CUDA GPU, nvcc and a C++ compiler.

``--baseline DIR`` also times another revision's ``ops/`` folder (a worktree's, or ``git archive REV
ops | tar -x -C PARENT`` for ``DIR = PARENT/ops``), imported under its own name in the same process,
as ``base``, each row's providers interleaved: an A/B of a kernel change at small T, where timings
spread between processes by as much as the change. ``--floor`` first times what any two launches
of this op pay at one call a graph (:func:`floor_launches`): two empty kernels, and two kernels
that each do the q side's least work for one token (load a position, then that position's
cos/sin row, store it), the second launched dependent on the first as ours is.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import itertools
import sys
import tempfile
from pathlib import Path

#: vLLM's file holding the kernel, below a vLLM checkout; the extension built from it.
CUDA_FILE = "csrc/cache_kernels_fused.cu"
EXTENSION = "vllm_mla_rope_peer"

#: The vLLM headers ``cache_kernels_fused.cu`` includes, as stand-ins of ours: only what the
#: ``kv_cache_dtype="auto"`` path of that file needs (an fp8 cache is refused at run time).
STAND_INS = {
    "cuda_compat.h": "#pragma once\n#define VLLM_LDG(arg) (*(arg))\n",  # __ldg has no c10::BFloat16 overload
    "dispatch_utils.h": """#pragma once
#include <ATen/Dispatch.h>
#define VLLM_DISPATCH_FLOATING_TYPES(TYPE, NAME, ...)                 \\
  AT_DISPATCH_SWITCH(TYPE, NAME,                                      \\
                     AT_DISPATCH_CASE(at::ScalarType::Float, __VA_ARGS__) \\
                     AT_DISPATCH_CASE(at::ScalarType::Half, __VA_ARGS__)  \\
                     AT_DISPATCH_CASE(at::ScalarType::BFloat16, __VA_ARGS__))
""",
    "quantization/w8a8/fp8/common.cuh": "#pragma once\n",
    "quantization/w8a8/fp8/nvidia/quant_utils.cuh": """#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <c10/util/Exception.h>
namespace vllm {
enum class Fp8KVCacheDataType { kAuto = 0, kFp8E4M3 = 1, kFp8E5M2 = 2 };
namespace fp8 {
template <typename Tout, typename Tin, Fp8KVCacheDataType kv_dt>
__device__ Tout scaled_convert(const Tin& x, float scale);  // never instantiated: "auto" only
}  // namespace fp8
}  // namespace vllm
#define DISPATCH_BY_KV_CACHE_DTYPE(SRC_DTYPE, KV_DTYPE, FN)                             \\
  do {                                                                                \\
    TORCH_CHECK(KV_DTYPE == "auto", "stand-in headers: kv_cache_dtype auto only");    \\
    auto src_ = c10::typeMetaToScalarType(SRC_DTYPE);                                 \\
    if (src_ == at::ScalarType::Float) {                                              \\
      FN(float, float, vllm::Fp8KVCacheDataType::kAuto);                              \\
    } else if (src_ == at::ScalarType::Half) {                                        \\
      FN(uint16_t, uint16_t, vllm::Fp8KVCacheDataType::kAuto);                        \\
    } else if (src_ == at::ScalarType::BFloat16) {                                    \\
      FN(__nv_bfloat16, __nv_bfloat16, vllm::Fp8KVCacheDataType::kAuto);              \\
    } else {                                                                          \\
      TORCH_CHECK(false, "unsupported dtype");                                        \\
    }                                                                                 \\
  } while (false)
""",
}

#: Our binding of vLLM's host function (its signature as the file declares it).
BINDING = """#include <torch/extension.h>
void concat_and_cache_mla_rope_fused(torch::Tensor& positions, torch::Tensor& q_pe, torch::Tensor& k_pe,
                                     torch::Tensor& kv_c, torch::Tensor& rope_cos_sin_cache, bool rope_is_neox,
                                     torch::Tensor& kv_cache_slot_mapping, torch::Tensor& kv_cache,
                                     const std::string& kv_cache_dtype, torch::Tensor& kv_cache_quant_scale,
                                     bool has_slot_mapping);
static void launch(torch::Tensor positions, torch::Tensor q_pe, torch::Tensor k_pe, torch::Tensor kv_c,
                   torch::Tensor cos_sin, bool is_neox, torch::Tensor slots, torch::Tensor kv_cache,
                   std::string kv_cache_dtype, torch::Tensor scale) {
  concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, cos_sin, is_neox, slots, kv_cache, kv_cache_dtype,
                                  scale, true);
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("concat_and_cache_mla_rope_fused", &launch); }
"""


def find_cuda_file(vllm_source: str) -> Path:
    """vLLM's ``cache_kernels_fused.cu`` below ``vllm_source`` (a checkout, its ``csrc/`` or the
    file); ``ValueError`` naming ``--vllm-source`` when it is not there."""
    root = Path(vllm_source)
    for path in (root, root / Path(CUDA_FILE).name, root / CUDA_FILE):
        if path.is_file() and path.name == Path(CUDA_FILE).name:
            return path
    raise ValueError(f"--vllm-source {str(root)!r} holds no vLLM {CUDA_FILE}")


def write_sources(cuda_file: Path, folder: Path) -> list[Path]:
    """vLLM's file (unchanged), our stand-in headers beside it and our binding, in ``folder``."""
    for name, text in STAND_INS.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    kernel = folder / Path(CUDA_FILE).name
    kernel.write_text(cuda_file.read_text())
    binding = folder / "binding.cpp"
    binding.write_text(BINDING)
    return [kernel, binding]


def build(cuda_file: Path, folder: Path):
    """The built extension, for the local GPU's arch: ``torch.utils.cpp_extension.load`` where
    ninja is here, else a ``setup.py build_ext`` of the same sources (torch's ``BuildExtension``
    without ninja), imported from ``folder``."""
    import importlib.util
    import subprocess

    import torch
    from torch.utils import cpp_extension

    major, minor = torch.cuda.get_device_capability()
    sources = [str(p) for p in write_sources(cuda_file, folder)]
    flags = ["-O3", f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"]
    if cpp_extension.is_ninja_available():
        return cpp_extension.load(name=EXTENSION, sources=sources, build_directory=str(folder),
                                  extra_include_paths=[str(folder)], extra_cuda_cflags=flags, verbose=False)
    (folder / "setup.py").write_text(
        "from setuptools import setup\n"
        "from torch.utils.cpp_extension import BuildExtension, CUDAExtension\n"
        f"setup(name={EXTENSION!r}, ext_modules=[CUDAExtension({EXTENSION!r}, {sources!r}, "
        f"include_dirs=[{str(folder)!r}], extra_compile_args={{'cxx': ['-O3'], 'nvcc': {flags!r}}})], "
        "cmdclass={'build_ext': BuildExtension.with_options(use_ninja=False)})\n")
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=folder, check=True,
                   stdout=subprocess.DEVNULL)
    built = next(folder.glob(f"{EXTENSION}*.so"))
    spec = importlib.util.spec_from_file_location(EXTENSION, built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_ops(folder: str):
    """The ops package in ``folder`` (another checkout's ``ops/``) imported as ``baseline_ops``
    (its imports are relative, so it shares nothing with ``vllm_ascend_ext.ops``); ``ValueError``
    naming ``--baseline`` when ``folder`` holds no ops package."""
    init = Path(folder) / "__init__.py"
    if not (init.is_file() and (Path(folder) / "split_qkv_rmsnorm_rope_mla.py").is_file()):
        raise ValueError(f"--baseline {folder!r} is not an ops/ folder")
    spec = importlib.util.spec_from_file_location("baseline_ops", init, submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def least_work_kernel():
    """The floor's kernel (Triton imported on first use): with ``WORK`` it loads one position, then
    that position's cos/sin row, and stores the row (the q side's dependent loads for one token,
    the prologue's too); without, it returns. ``PDL``: ``grid_dependency`` first, as ours."""
    import triton
    import triton.language as tl

    from vllm_ascend_ext.ops.split_qkv_rmsnorm_rope import grid_dependency

    @triton.jit
    def least(pos_ptr, cache_ptr, out_ptr, R: tl.constexpr, WORK: tl.constexpr, PDL: tl.constexpr):
        if PDL:
            grid_dependency()
        if WORK:
            lanes = tl.arange(0, R)
            row = tl.load(pos_ptr).to(tl.int64)
            tl.store(out_ptr + lanes, tl.load(cache_ptr + row * R + lanes))

    return least


def least_work_launch(device, work: bool = True):
    """A zero-argument callable launching :func:`least_work_kernel` once on its own small tensors
    (a 4096-row fp32 cos/sin cache of 64 lanes), dependent on the launch before it where the GPU
    has programmatic dependent launch."""
    import torch

    pdl = torch.cuda.get_device_capability(device)[0] >= 9
    options = {"launch_pdl": True} if pdl else {}
    positions = torch.zeros(1, dtype=torch.int64, device=device)
    cos_sin, out = torch.rand(4096, 64, device=device), torch.empty(64, device=device)
    kernel = least_work_kernel()
    return lambda: kernel[(1,)](positions, cos_sin, out, R=64, WORK=work, PDL=pdl, **options)


def floor_launches(timer, device) -> dict:
    """One-call-a-graph microseconds of two launches doing the least this op's launches do:
    ``empty`` (two kernels that return) and ``chain`` (two :func:`least_work_launch` kernels),
    each pair's second kernel launched dependent on the first as ours is."""
    def two(work: bool):
        launch = least_work_launch(device, work)

        def run():
            launch()
            launch()
        return run

    return {"empty": timer(two(False)), "chain": timer(two(True))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-source", required=True, metavar="DIR",
                        help=f"a vLLM checkout holding {CUDA_FILE} and vllm/models/common/ops/fused_qk_rmsnorm.py")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 4096])
    parser.add_argument("--calls", type=int, default=20, help="calls a graph in the amortised timing")
    parser.add_argument("--baseline", metavar="DIR", help="also time the ops/ folder DIR (another checkout's) as base")
    parser.add_argument("--floor", action="store_true", help="first time two empty and two least-work launches")
    args = parser.parse_args()
    try:
        if min(args.tokens) < 1 or args.calls < 1:
            raise ValueError(f"--tokens and --calls take positive integers, got {args.tokens} and {args.calls}")
        import torch

        if not torch.cuda.is_available():
            raise ValueError("needs a CUDA GPU")
        cuda_file = find_cuda_file(args.vllm_source)
        from vllm_ascend_ext.bench import mla

        kernel, _ = mla.load_vllm_kernel(str(Path(args.vllm_source)))
        base = load_ops(args.baseline) if args.baseline else None
    except ValueError as exc:
        print(f"bench_mla_cuda_peer: {exc}", file=sys.stderr)
        return 2
    from vllm_ascend_ext.bench.cases import make_mla_case, mla_launches
    from vllm_ascend_ext.bench.catalog import MLA_GEOMETRIES
    from vllm_ascend_ext import ops as ours_ops
    from vllm_ascend_ext.bench.timing import TIMINGS_PER_ROW, Timer
    from vllm_ascend_ext.ops.models import mla_model
    from vllm_ascend_ext.ops.reference import mla_cache_write
    from vllm_ascend_ext.ops.reference import split_qkv_rmsnorm_rope_mla as reference

    device = torch.device("cuda")
    timer = Timer(device, 50)
    if args.floor:
        floor = floor_launches(timer, device)
        print(f"floor, one call a graph: two empty launches {floor['empty']:.2f} us, two position -> cos/sin row -> "
              f"store launches {floor['chain']:.2f} us", flush=True)
    with tempfile.TemporaryDirectory(prefix="vllm-mla-peer-") as folder:
        ext = build(cuda_file, Path(folder))
        print(f"{torch.cuda.get_device_name()}; ours = prologue + q side (two launches; V2-Lite one); vllm_cuda = "
              f"vLLM's Triton fused_q_kv_rmsnorm + vLLM's CUDA concat_and_cache_mla_rope_fused ({cuda_file}); us per "
              f"call, the better of {TIMINGS_PER_ROW} interleaved timings"
              + (f"; base = the ops of {args.baseline}" if base else ""))
        amortised = f"x{args.calls}"
        base_head = f" {'base':>8} {'base ' + amortised:>9} {'err base':>8}" if base else ""
        print(f"{'model':16} {'tp':>2} {'T':>6} {'ours':>8} {'vllm_cuda':>9} {'ratio':>6} {'ours ' + amortised:>9} "
              f"{'vllm ' + amortised:>9} {'ratio':>6} {'err ours':>8} {'err vllm':>8}{base_head}")
        for (name, tp), tokens in itertools.product(MLA_GEOMETRIES, args.tokens):
            spec = mla_model(name)
            case = make_mla_case(spec, spec.heads_at(tp), tokens, device, seed=tokens)
            a, cache, slots = case["args"], case["kv_cache"], case["slot_mapping"]
            lq, lkv, rope = a["q_lora_rank"], a["kv_lora_rank"], a["rope_dim"]
            cache0 = cache.clone()
            refs = reference(**a)
            expected = mla_cache_write(cache0.cpu(), refs[1].cpu(), refs[2].cpu(), slots.cpu()).double()
            scale_rows = torch.cat(refs[1:3], dim=-1).abs().max().item() or 1.0
            x_peer, q_peer = a["qkv_lora"].clone(), case["q_vllm"]
            cos_sin, positions = a["cos_sin_cache"].to(torch.bfloat16), a["positions"].long()
            slots64, one = slots.long(), torch.ones(1, dtype=torch.float32, device=device)

            def vllm_cuda():
                q_c = x_peer[:, :lq] if lq else None
                _, kv_c = mla.vllm_q_kv_rmsnorm(kernel, q_c, x_peer[:, lq:lq + lkv], a["q_a_weight"],
                                                a["kv_a_weight"], a["eps"])
                ext.concat_and_cache_mla_rope_fused(positions, q_peer[..., q_peer.shape[-1] - rope:],
                                                    x_peer[:, lq + lkv:].unsqueeze(1), kv_c, cos_sin,
                                                    a["is_neox"], slots64, cache, "auto", one)

            providers = [(mla_launches(ours_ops, case), None), (vllm_cuda, a["qkv_lora"])]
            providers += [(mla_launches(base, case), None)] if base else []
            errors = []
            for fn, source in providers:
                cache.copy_(cache0)
                if source is not None:
                    x_peer.copy_(source)
                fn()
                errors.append((cache.cpu().double() - expected).abs().max().item() / scale_rows)
            times = [[float("inf")] * 2 for _ in providers]
            for _, (i, (fn, _)) in itertools.product(range(TIMINGS_PER_ROW), enumerate(providers)):
                times[i] = [min(times[i][0], timer(fn)), min(times[i][1], timer(fn, args.calls))]
            (o1, o20), (v1, v20) = times[:2]
            base_cells = f" {times[2][0]:8.2f} {times[2][1]:9.2f} {errors[2]:8.1e}" if base else ""
            print(f"{name:16} {tp:2d} {tokens:6d} {o1:8.2f} {v1:9.2f} {o1 / v1:6.2f} {o20:9.2f} {v20:9.2f} "
                  f"{o20 / v20:6.2f} {errors[0]:8.1e} {errors[1]:8.1e}{base_cells}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
