"""Lower the fused kernel for an Ascend target on the CPU, for every plan of the geometry table.

Run in a virtual environment with ``triton-ascend==3.2.0`` (it installs the package ``triton``)::

    python -m vllm_ascend_ext.ops.ascend_lowering [--soc Ascend910B3] [--verbose]

For each model of ``ops/models.py`` at each TP size it runs at (and feature variants on a few of
them), this builds the Ascend launch plan, runs triton-ascend's ``ttir`` and ``ttadapter`` (ttir
-> linalg) stages for ``GPUTarget("npu", <soc>, 0)`` (the final bishengir stage needs CANN and is
not run), then:

* sums the explicit local buffers of the linalg output (``memref.alloc``: the copies from
  global memory into the UB) and checks them against the UB model's ``gm`` buffers
  (``ops/tiling/ascend.py``): the model must cover what the lowering allocates;
* checks the whole model, and the lowering's allocation with its second buffers, against
  the UB capacity;
* checks that the outputs (q, k, the gate, v) are never read (a masked store the lowering
  cannot bound becomes a read-modify-write of the whole block, which races with the neighbouring
  rows).

Rows of the table that compile to the same kernel (same per-rank geometry, variant and plan;
``eps`` and ``weight_offset`` are run-time arguments) are lowered once and reported on each row.
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
from dataclasses import dataclass, replace

from ._check_common import first_error, refuse_interpreted_kernel
from . import settings
from .device import ascend_facts
from .models import geometry_table, model
from .tiling import KernelShape, ascend

_ALLOC = re.compile(r"(%[\w.]+) = memref\.alloc\(\)[^:]*: memref<([^>]*)>")
_CAST = re.compile(r"(%[\w.]+) = memref\.reinterpret_cast (%arg\d+) ")
_VIEW = re.compile(r"(%[\w.]+) = memref\.subview (%[\w.]+)\[")
_COPY = re.compile(r"memref\.copy (%[\w.]+), (%[\w.]+) ")
_BYTES = {"i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "bf16": 2, "f16": 2, "f32": 4}


@dataclass(frozen=True)
class Variant:
    """A feature combination lowered on top of a table row's geometry at TP 1 (whose own
    features it keeps; the table's rows lower as bf16 with an fp32 cache)."""

    name: str
    dtype: str = "bf16"
    cache_dtype: str = "fp32"
    q_norm: bool | None = None  # None: as the model has it
    bias: bool = False
    is_neox: bool | None = None  # None: as the model has it
    base: str = "Qwen3-8B"


VARIANTS = (
    Variant("fp16", dtype="fp16"),  # (until issue 10 this row lowered bf16: dtype was left out)
    Variant("fp16 qkv, bf16 cache", dtype="fp16", cache_dtype="bf16"),
    Variant("fp32", dtype="fp32"),
    Variant("bias", bias=True),
    Variant("k-only norm", q_norm=False),
    # Issue 10's variants in the combinations the table does not reach on its own.
    Variant("bias", bias=True, base="Qwen3-Next-80B-A3B"),  # gate + bias + partial rotary
    Variant("fp32", dtype="fp32", base="Qwen3.5-397B-A17B"),  # gate + interleaved mRoPE in fp32
    Variant("fp16 qkv, bf16 cache", dtype="fp16", cache_dtype="bf16", base="Gemma-4-31B:full"),  # v-norm, D=512
    Variant("gptj", is_neox=False, base="Qwen3-VL-8B"),  # interleaved mRoPE, GPT-J pairs
    Variant("gptj", is_neox=False, base="Qwen2.5-VL-7B"),  # contiguous mRoPE, no norm
    Variant("gptj, fp16", dtype="fp16", is_neox=False, base="Gemma-4-E2B:sliding-kv-shared"),  # q-only
    Variant("no q norm", q_norm=False, base="Gemma-4-E2B:full-kv-shared"),  # q-only, rotation alone
)


def _alloc_bytes(shape_text: str) -> int:
    *dims, dtype = shape_text.split("x")
    count = 1
    for dim in dims:
        count *= int(dim)
    return count * _BYTES[dtype]


def _reads_of_outputs(linalg: str, output_args: set[str]) -> int:
    """How many ``memref.copy`` ops read from an output argument (should be none).

    Views are followed back to the argument they were cast from as they are defined, line by
    line: MLIR reuses a value's name in sibling regions (the arms of the head-block branch), so
    a name means the definition most recently printed above its use.
    """
    root: dict[str, str] = {}
    count = 0
    for line in linalg.splitlines():
        defined = _CAST.search(line) or _VIEW.search(line)
        if defined:
            root[defined.group(1)] = root.get(defined.group(2), defined.group(2))
            continue
        copied = _COPY.search(line)
        if copied:
            count += root.get(copied.group(1), copied.group(1)) in output_args
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


_ELEM = {"bf16": 2, "fp16": 2, "fp32": 4}


def _kernel(geometry, variant: Variant, facts):
    """The shape, plan, signature and constexprs one geometry and variant compile with."""
    from .split_qkv_rmsnorm_rope import _constexprs, _signature

    shape = KernelShape.of(geometry, _ELEM[variant.dtype], _ELEM[variant.cache_dtype])
    plan = ascend.plan(shape, facts)
    q_norm = geometry.qk_norm if variant.q_norm is None else variant.q_norm
    k_norm = geometry.qk_norm or variant.q_norm is False
    constants = _constexprs(shape, plan, q_norm=q_norm, k_norm=k_norm,
                            q_bias=variant.bias and q_norm, k_bias=variant.bias and k_norm,
                            mrope_section=geometry.mrope_section, mrope_interleaved=geometry.mrope_interleaved)
    return shape, plan, _signature(variant.dtype, variant.cache_dtype), constants


def _job_key(geometry, variant: Variant | None, facts) -> tuple:
    """What decides the lowered kernel: signature and constexprs (so table rows with the same
    per-rank geometry share one lowering)."""
    _, _, signature, constants = _kernel(geometry, variant or Variant(""), facts)
    return tuple(signature.items()), tuple(sorted(constants.items()))


def lower_plan(geometry, variant: Variant | None, facts) -> dict:
    """Plan and lower one geometry (with an optional feature variant) for the NPU of ``facts``
    (:class:`~.device.AscendFacts`); return the report row."""
    from .split_qkv_rmsnorm_rope import _split_qkv_rmsnorm_rope_kernel as kernel

    variant = variant or Variant("")
    shape, plan, signature, constants = _kernel(geometry, variant, facts)
    linalg = _lower(kernel, signature, constants, facts.soc)
    # The lowered function takes two leading runtime arguments, then the kernel's in order.
    names = list(signature)
    outputs = {f"%arg{names.index(n) + 2}" for n in ("q_out_ptr", "k_out_ptr", "gate_out_ptr", "v_out_ptr")}
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
    for v in VARIANTS:
        geometry = model(v.base).shard(1)
        if v.is_neox is not None:
            geometry = replace(geometry, is_neox=v.is_neox)
        jobs.append((f"{v.base} tp1 [{v.name}]", geometry, v))
    print(f"target {facts.soc}: {facts.num_vector_cores} vector cores, UB {facts.ub_bytes} B ({facts.source})")
    print(f"{'plan':48} {'geometry':40} {'BT':>3} {'BH':>3} {'IR allocs':>10} {'model gm':>9} "
          f"{'model':>7} {'cap':>7}  status")
    ok = retried = 0
    lowered: dict = {}  # job key -> (row or None, label of the row lowered first)
    for label, geometry, variant in jobs:
        key = _job_key(geometry, variant, facts)
        if key in lowered:
            row, first = lowered[key]
            if row is None:
                print(f"{label:48} {geometry.label:40} lowering failed: as {first}")
                continue
            same = f" (= {first})"
        else:
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
                lowered[key] = (None, label)
                print(f"{label:48} {geometry.label:40} lowering failed: {type(exc).__name__}: "
                      f"{first_error(exc)}")
                if args.verbose:
                    traceback.print_exc()
                continue
            lowered[key] = (row, label)
            same = ""
        plan = row["plan"]
        status = ("ok" if not row["problems"] else "FAIL: " + "; ".join(row["problems"])) + same
        ok += not row["problems"]
        print(f"{label:48} {geometry.label:40} {plan.block_tokens:3d} {plan.block_heads:3d} "
              f"{row['ir_bytes']:10d} {row['model_gm']:9d} {row['model']:7d} {row['capacity']:7d}  {status}")
    note = f", {retried} lowered again after a crash of triton-adapter-opt" if retried else ""
    print(f"lowered {ok}/{len(jobs)} kernel plans for {facts.soc} ({len(lowered)} distinct kernels; ttir -> "
          f"linalg; the bishengir stage needs CANN and was not run{note})")
    return 0 if ok == len(jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
