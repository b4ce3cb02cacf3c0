"""Lower the fused kernel for an Ascend target on the CPU, for every plan of the geometry table.

Run in a virtual environment with ``triton-ascend==3.2.0`` (it installs the package ``triton``)::

    python -m vllm_ascend_ext.ops.ascend_lowering [--soc Ascend910B3] [--verbose]

For each model of ``ops/models.py`` at each TP size (and a few feature variants), this builds
the Ascend launch plan, runs triton-ascend's ``ttir`` and ``ttadapter`` (ttir -> linalg) stages
for ``GPUTarget("npu", <soc>, 0)`` (the final bishengir stage needs CANN and is not run), then:

* sums the explicit local buffers of the linalg output (``memref.alloc``: the copies from
  global memory into the UB) and checks them against the UB model's ``gm`` buffers
  (``ops/tiling/ascend.py``): the model must cover what the lowering allocates;
* checks the whole model, and the lowering's allocation with its second buffers, against
  the UB capacity;
* checks that the outputs are never read (a masked store the lowering cannot bound becomes a
  read-modify-write of the whole block, which races with the neighbouring rows).

It prints one row per plan and, last, ``lowered N/N kernel plans ...``; it exits non-zero on
any lowering error or violated check.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import traceback
from dataclasses import dataclass

from ._check_common import first_error, refuse_interpreted_kernel
from . import settings
from .device import ascend_facts
from .models import geometry_table
from .tiling import KernelShape, ascend

_ALLOC = re.compile(r"(%[\w.]+) = memref\.alloc\(\)[^:]*: memref<([^>]*)>")
_CAST = re.compile(r"(%[\w.]+) = memref\.reinterpret_cast (%arg\d+) ")
_VIEW = re.compile(r"(%[\w.]+) = memref\.subview (%[\w.]+)\[")
_COPY = re.compile(r"memref\.copy (%[\w.]+), (%[\w.]+) ")
_BYTES = {"i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "bf16": 2, "f16": 2, "f32": 4}


@dataclass(frozen=True)
class Variant:
    """A feature combination lowered on top of a geometry's own (bf16, fp32 cache)."""

    name: str
    dtype: str = "bf16"
    cache_dtype: str = "fp32"
    q_norm: bool | None = None  # None: as the model has it
    bias: bool = False


VARIANTS = (
    Variant("fp16"),
    Variant("fp16 qkv, bf16 cache", dtype="fp16", cache_dtype="bf16"),
    Variant("fp32", dtype="fp32"),
    Variant("bias", bias=True),
    Variant("k-only norm", q_norm=False),
)


def _alloc_bytes(shape_text: str) -> int:
    *dims, dtype = shape_text.split("x")
    count = 1
    for dim in dims:
        count *= int(dim)
    return count * _BYTES[dtype]


def _reads_of_outputs(linalg: str, output_args: set[str]) -> int:
    """How many ``memref.copy`` ops read from an output argument (should be none)."""
    root = {}
    for name, arg in _CAST.findall(linalg):
        root[name] = arg
    for name, source in _VIEW.findall(linalg):
        root[name] = source
    count = 0
    for source, _ in _COPY.findall(linalg):
        while source in root:
            source = root[source]
        count += source in output_args
    return count


def _lower(fn, signature: dict, constants: dict, soc: str) -> str:
    from triton._C.libtriton import ir
    from triton.backends.ascend.compiler import AscendBackend
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    backend = AscendBackend(GPUTarget("npu", soc, 0))
    options = backend.parse_options({})
    stages: dict = {}
    backend.add_stages(stages, options)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    signature = dict(signature) | {name: "constexpr" for name in constants}
    source = ASTSource(fn, signature, constants=constants)
    module = source.make_ir(options, backend.get_codegen_implementation(), backend.get_module_map(), context)
    metadata = dataclasses.asdict(options) | {"hash": source.hash()}
    return stages["ttadapter"](stages["ttir"](module, metadata), metadata)


def lower_plan(geometry, variant: Variant | None, facts) -> dict:
    """Plan and lower one geometry (with an optional feature variant) for the NPU of ``facts``
    (:class:`~.device.AscendFacts`); return the report row."""
    from .split_qkv_rmsnorm_rope import _constexprs, _signature
    from .split_qkv_rmsnorm_rope import _split_qkv_rmsnorm_rope_kernel as kernel

    variant = variant or Variant("")
    elem = {"bf16": 2, "fp16": 2, "fp32": 4}
    shape = KernelShape.of(geometry, elem[variant.dtype], elem[variant.cache_dtype])
    plan = ascend.plan(shape, facts)
    q_norm = geometry.qk_norm if variant.q_norm is None else variant.q_norm
    k_norm = geometry.qk_norm or variant.q_norm is False
    signature = _signature(variant.dtype, variant.cache_dtype)
    constants = _constexprs(shape, plan, q_norm=q_norm, k_norm=k_norm,
                            q_bias=variant.bias and q_norm, k_bias=variant.bias and k_norm)
    linalg = _lower(kernel, signature, constants, facts.soc)
    # The lowered function takes two leading runtime arguments, then the kernel's in order.
    names = list(signature)
    outputs = {f"%arg{names.index(n) + 2}" for n in ("q_out_ptr", "k_out_ptr")}
    allocs = [_alloc_bytes(shape_text) for _, shape_text in _ALLOC.findall(linalg)]
    ir_bytes = sum(allocs)
    row = {
        "plan": plan, "ir_allocs": len(allocs), "ir_bytes": ir_bytes,
        "model_gm": plan.ub_bytes_from("gm"), "model": plan.ub_bytes,
        "capacity": plan.ub_capacity, "output_reads": _reads_of_outputs(linalg, outputs),
    }
    problems = []
    if ir_bytes > row["model_gm"]:
        problems.append(f"lowering allocates {ir_bytes} B of copies, model's gm buffers {row['model_gm']} B")
    if plan.ub_bytes > plan.ub_capacity:
        problems.append(f"model {plan.ub_bytes} B over capacity {plan.ub_capacity} B")
    if ir_bytes * ascend.MULTIBUFFER > plan.ub_capacity:
        problems.append(f"lowering x{ascend.MULTIBUFFER} buffers over capacity")
    if row["output_reads"]:
        problems.append(f"{row['output_reads']} read(s) of an output (read-modify-write store)")
    row["problems"] = problems
    return row


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: lower every plan, print the table, exit 1 on any failure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--soc", help=f"Ascend SoC to target (default: ${settings.SOC} or Ascend910B3)")
    parser.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
    args = parser.parse_args(argv)
    if args.soc:
        os.environ[settings.SOC] = args.soc
    try:
        facts = ascend_facts()
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if refuse_interpreted_kernel():
        return 2
    try:
        import triton.backends.ascend  # noqa: F401
    except ImportError:
        print("triton-ascend is not installed in this environment (pip install triton-ascend==3.2.0 "
              "pybind11 in a venv of its own)", file=sys.stderr)
        return 2
    jobs = [(f"{name} tp{tp}", geometry, None) for name, tp, geometry in geometry_table()]
    base = geometry_table((1,))[0][2]
    jobs += [(f"{geometry_label} [{v.name}]", base, v) for geometry_label, v in
             (("Qwen3-8B tp1", v) for v in VARIANTS)]
    print(f"target {facts.soc}: {facts.num_vector_cores} vector cores, UB {facts.ub_bytes} B ({facts.source})")
    print(f"{'plan':38} {'geometry':26} {'BT':>3} {'BH':>3} {'IR allocs':>10} {'model gm':>9} "
          f"{'model':>7} {'cap':>7}  status")
    ok = retried = 0
    for label, geometry, variant in jobs:
        try:
            try:
                row = lower_plan(geometry, variant, facts)
            except subprocess.CalledProcessError as exc:
                if exc.returncode >= 0:
                    raise
                # triton-adapter-opt killed by a signal: seen once (SIGABRT, the bias variant,
                # while the machine was loaded by other jobs) and not reproduced in 28 further
                # lowerings of that plan. Say so and try once more; a second crash fails it.
                retried += 1
                print(f"{label}: triton-adapter-opt died ({first_error(exc)}); lowering again")
                row = lower_plan(geometry, variant, facts)
        except Exception as exc:  # noqa: BLE001 - report every failure, then fail the run
            print(f"{label:38} {geometry.label:26} lowering failed: {type(exc).__name__}: "
                  f"{first_error(exc)}")
            if args.verbose:
                traceback.print_exc()
            continue
        plan = row["plan"]
        status = "ok" if not row["problems"] else "FAIL: " + "; ".join(row["problems"])
        ok += not row["problems"]
        print(f"{label:38} {geometry.label:26} {plan.block_tokens:3d} {plan.block_heads:3d} "
              f"{row['ir_bytes']:10d} {row['model_gm']:9d} {row['model']:7d} {row['capacity']:7d}  {status}")
    note = f", {retried} lowered again after a crash of triton-adapter-opt" if retried else ""
    print(f"lowered {ok}/{len(jobs)} kernel plans for {facts.soc} (ttir -> linalg; the bishengir "
          f"stage needs CANN and was not run{note})")
    return 0 if ok == len(jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
