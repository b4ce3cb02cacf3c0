"""Compile the fused kernel for a Hopper GPU (sm_90) on the CPU, for every CUDA plan of the table.

Run with upstream Triton (no GPU needed; Triton's CUDA backend goes as far as PTX on the CPU)::

    python -m vllm_ascend_ext.ops.cuda_compile

The Triton interpreter runs the kernel's Python, not the compiler, so it cannot see what only
compiling shows: a type error in a branch, or a tile whose loads fell apart into 2-byte accesses
(which cost up to 2x on the H200, ``docs/perf-notes.md``). For each model of ``ops/models.py``
at each TP size it runs at this builds both CUDA plans (large and small-batch), compiles the
kernel with the divisibility hints a real launch gets (pointers and row strides divisible by 16),
and requires the large plan's tiles to be moved in 16-byte vectors (``ld.global.v4`` /
``st.global.v4`` in the PTX; the small-batch plan's one-token tiles at least in 8-byte ones).
A geometry with issue 10's arms or rows (the gate copy, v-norm, mRoPE's h/w cos/sin rows) is
also compiled without them under the same plan, and what they add is checked against that bare
kernel: the gate and v arms must store something, and no access they or the extra cos/sin rows
add may be of a kind (width) the bare kernel does not use for its own loads and stores. The
gate's tile is q's shape and v's is k's, so an arm may be as narrow as the q or k arm it copies
(under the small-batch plan a tile of one kv head is moved 2 or 4 bytes per thread in the k arm
too: that is the layout), never narrower; an arm that fell apart into 2-byte accesses where q
and k move 16 bytes fails even when the rest of the kernel is vectorised. Rows of the table that
compile to the same kernel are compiled once. It also assembles the
PTX with Triton's bundled ``ptxas`` and reports registers per thread and spilled bytes:
registers are what limited occupancy on the H200 (``docs/perf-notes.md``). The count depends on
the Triton and ptxas versions: with v4's kernel, 16/2/256 R64 read 243 here (Triton 3.7.1) where
Nsight Compute saw 247 on the H200 (Triton 3.6), and 32/8/128 read 170 here against 128 there;
read it as a trend. It prints last ``compiled N/N CUDA kernel plans ...`` and exits non-zero on
any failure.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import replace

from ._check_common import first_error, refuse_interpreted_kernel
from .device import cuda_facts
from .models import geometry_table
from .tiling import KernelShape, cuda

#: Compute capability of the H100/H200 this project measures on.
TARGET_ARCH = 90
#: Arguments a real launch passes divisible by 16 (Triton specialises them so): the tensors
#: (allocated 16-byte aligned) and their row strides. Not ``pos_axis_stride``: it is the token
#: count for ``[3, T]`` positions.
_DIVISIBLE = ("qkv_ptr", "q_out_ptr", "k_out_ptr", "gate_out_ptr", "v_out_ptr", "q_w_ptr", "k_w_ptr",
              "q_b_ptr", "k_b_ptr", "cache_ptr", "pos_ptr", "qkv_stride", "q_out_stride", "k_out_stride",
              "gate_out_stride", "v_out_stride", "cache_stride")


def bare(geometry):
    """``geometry`` without issue 10's extra arms and rows (gate, v-norm, mRoPE), or ``None``
    when it has none (a q-only layer keeps its shape: there is no k to put back)."""
    if not (geometry.q_gate or geometry.v_norm or geometry.mrope_section is not None):
        return None
    return replace(geometry, q_gate=False, v_norm=False, mrope_section=None, mrope_interleaved=False)


def _kernel(geometry, small: bool, plan_geometry=None):
    """The plan, signature and constexprs of one geometry under the plan ``plan_geometry``
    (default: its own) gets."""
    from .split_qkv_rmsnorm_rope import _constexprs, _signature

    shape = KernelShape.of(geometry, 2, 4)
    plan = (cuda.small_batch_plan if small else cuda.plan)(KernelShape.of(plan_geometry or geometry, 2, 4),
                                                           cuda_facts())
    constexprs = _constexprs(shape, plan, q_norm=geometry.qk_norm, k_norm=geometry.qk_norm,
                             q_bias=False, k_bias=False, mrope_section=geometry.mrope_section,
                             mrope_interleaved=geometry.mrope_interleaved)
    return shape, plan, _signature("bf16", "fp32"), constexprs


def _key(geometry, small: bool, plan_geometry=None) -> tuple:
    """What decides the compiled kernel (rows of the table that share it compile once)."""
    _, plan, signature, constexprs = _kernel(geometry, small, plan_geometry)
    return tuple(signature.items()), tuple(sorted(constexprs.items())), tuple(sorted(plan.launch_options.items()))


def compile_plan(geometry, small: bool = False, plan_geometry=None) -> dict:
    """Compile one geometry's CUDA plan (``small``: the small-batch plan; ``plan_geometry``: the
    plan of another geometry, default its own) to PTX; count the vector and scalar global
    accesses."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .split_qkv_rmsnorm_rope import _split_qkv_rmsnorm_rope_kernel as kernel

    shape, plan, signature, constexprs = _kernel(geometry, small, plan_geometry)
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(signature) if name in _DIVISIBLE}
    signature |= {name: "constexpr" for name in constexprs}
    source = ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", TARGET_ARCH, 32),
                              options=plan.launch_options)
    ptx = compiled.asm["ptx"]
    return {"plan": plan, "tail": plan.tail_width(shape) if shape.pass_dim else 0,
            "v4": len(re.findall(r"(?:ld|st)\.global\.v4", ptx)),
            "v2": len(re.findall(r"(?:ld|st)\.global\.v2", ptx)),
            "scalar16": len(re.findall(r"(?:ld|st)\.global\.b16", ptx)),
            "kinds": collections.Counter(re.findall(r"\b((?:ld|st)\.global(?:\.\w+)*)", ptx)), **_ptxas_report(ptx)}


def _ptxas_report(ptx: str) -> dict:
    """Registers per thread and spilled bytes, from ``ptxas -v`` on the PTX."""
    from triton.backends.nvidia.compiler import get_ptxas

    arch = re.search(r"^\.target\s+(\S+)", ptx, re.M).group(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as fh:
            fh.write(ptx)
        result = subprocess.run([get_ptxas(TARGET_ARCH).path, f"-arch={arch}", "-v", path,
                                 "-o", os.path.join(tmp, "kernel.cubin")],
                                capture_output=True, text=True, check=True)
    registers = re.search(r"Used (\d+) registers", result.stderr)
    spills = re.search(r"(\d+) bytes spill stores", result.stderr)
    return {"registers": int(registers.group(1)) if registers else -1,
            "spill_bytes": int(spills.group(1)) if spills else -1}


def _compile_job(job) -> tuple[dict | None, str | None]:
    """:func:`compile_plan` for one ``(geometry, small, plan_geometry)``: its row, or the error's
    first line."""
    try:
        return compile_plan(*job), None
    except Exception as exc:  # noqa: BLE001 - report every failure, then fail the run
        return None, f"{type(exc).__name__}: {first_error(exc)}"


def _added_problems(geometry, row: dict, without: dict) -> tuple[str, list[str]]:
    """What the gate, v and mRoPE rows add to the bare kernel (``+<accesses> (<16-byte ones>
    v4)``), and what is wrong with it (module docstring)."""
    added = row["kinds"] - without["kinds"]
    # Compared by width, loads and stores alike: an arm copying a tile (the gate) may load at the
    # width the bare kernel stores that tile's shape at (Qwen3-Next at TP 8, a 1-token x 2-head
    # small-batch tile: its 32-lane rotary halves are 64 elements over 128 threads, 2 bytes each).
    def width(kind):
        return kind.split(".", 1)[1]
    bare_widths = {width(kind) for kind in without["kinds"]}
    new_kinds = sorted(kind for kind in set(added) if width(kind) not in bare_widths)
    problems = []
    if (geometry.q_gate or geometry.v_norm) and not any(kind.startswith("st.") for kind in added):
        problems.append("the gate / v arm adds no store")
    if new_kinds:
        problems.append(f"the gate / v / mRoPE accesses use {', '.join(new_kinds)}, which the kernel "
                        "without them does not")
    wide = sum(count for kind, count in added.items() if ".v4." in kind)
    return f"+{sum(added.values())} ({wide} v4)", problems


def main(argv: list[str] | None = None) -> int:
    """Compile every CUDA plan of the geometry table; exit 1 on any failure."""
    if refuse_interpreted_kernel():
        return 2
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        print("upstream Triton with its NVIDIA backend is needed (pip install triton)", file=sys.stderr)
        return 2
    jobs = [(f"{name} tp{tp}", geometry, small) for name, tp, geometry in geometry_table()
            for small in (False, True)]
    # Each distinct kernel once: the table's, then the bare kernels (without the extra arms,
    # under the same plan) of those with issue 10's arms.
    work: dict = {}
    for _, geometry, small in jobs:
        work.setdefault(_key(geometry, small), (geometry, small, None))
        if bare(geometry) is not None:
            work.setdefault(_key(bare(geometry), small, geometry), (bare(geometry), small, geometry))
    print(f"{'plan':34} {'geometry':40} {'kind':5} {'BT':>3} {'BHq':>4} {'BHk':>4} "
          f"{'tail':>4} {'warps':>5} {'v4':>4} {'v2':>4} {'b16':>4} {'added':>11} {'regs':>4} {'spill':>5}  status")
    ok = 0
    # The plans compile independently: one process per CPU core (CI has two).
    with concurrent.futures.ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = dict(zip(work, pool.map(_compile_job, work.values())))
    seen: dict = {}
    for label, geometry, small in jobs:
        kind = "small" if small else "large"
        key = _key(geometry, small)
        row, error = results[key]
        same = f" (= {seen[key]})" if key in seen else ""
        seen.setdefault(key, label)
        if error is not None:
            print(f"{label:34} {geometry.label:40} {kind:5} compile failed: {error}{same}")
            continue
        plan = row["plan"]
        # The large plan's tiles must move in 16-byte vectors; the small-batch plan's one-token
        # tiles spread over 4 warps may use 8-byte ones, but never only scalars.
        problems = [] if (row["v4"] > 0 if not small else row["v4"] + row["v2"] > 0) else ["no vector accesses"]
        added = ""
        if bare(geometry) is not None:
            without, error = results[_key(bare(geometry), small, geometry)]
            if error is not None:
                problems.append(f"the bare kernel failed: {error}")
            else:
                added, more = _added_problems(geometry, row, without)
                problems += more
        ok += not problems
        print(f"{label:34} {geometry.label:40} {kind:5} {plan.block_tokens:3d} "
              f"{plan.block_heads:4d} {plan.block_heads_k:4d} {row['tail']:4d} "
              f"{plan.num_warps:5d} {row['v4']:4d} {row['v2']:4d} {row['scalar16']:4d} {added:>11} "
              f"{row['registers']:4d} {row['spill_bytes']:5d}  "
              f"{'ok' if not problems else 'FAIL: ' + '; '.join(problems)}{same}")
    print("added: global accesses the gate, v and mRoPE rows add to the kernel without them (16-byte ones)")
    print(f"compiled {ok}/{len(jobs)} CUDA kernel plans for sm_{TARGET_ARCH} (to PTX, on the CPU; "
          f"{len(work)} distinct kernels, bare ones included)")
    return 0 if ok == len(jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
