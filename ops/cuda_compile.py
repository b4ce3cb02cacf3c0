"""Compile the fused kernel for a Hopper GPU (sm_90) on the CPU, for every CUDA plan of the table.

Run with upstream Triton (no GPU needed; Triton's CUDA backend goes as far as PTX on the CPU)::

    python -m vllm_ascend_ext.ops.cuda_compile [--kv-only]

The Triton interpreter runs the kernel's Python, not the compiler, so it cannot see what only
compiling shows: a type error in a branch, or a tile whose loads fell apart into 2-byte accesses
(which cost up to 2x on the H200, ``docs/performance.md``). For each model of ``ops/models.py``
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
registers are what limited occupancy on the H200 (``docs/performance.md``). The count depends on
the Triton and ptxas versions: with v4's kernel, 16/2/256 R64 read 243 here (Triton 3.7.1) where
Nsight Compute saw 247 on the H200 (Triton 3.6), and 32/8/128 read 170 here against 128 there;
read it as a trend.

The KV-cache write (``split_qkv_rmsnorm_rope_kv_cache``, :data:`KV_FORMS` on :data:`KV_ROWS`,
both plans) is compiled as the op's validator configures it (caches of the ``meta`` device), with
what a real launch specialises: the cache's pointers, strides and offsets divisible by 16. Each
form is compiled without k and v out, and returning them: what the latter adds to the prologue
under the same plan is the cache's stores (and the slot and scale loads), and what it adds to
the former is k's and v's output stores, whose tiles the cache stores copy. Those cache stores
must move, per thread, at least as many lanes as those output stores at the widest and at the
narrowest: a bf16 NHD/HND row goes to the cache as wide as to ``k_out`` (16 bytes a thread in
the large plan), an int8 or fp8 one at the same lanes or more (half the bytes), and an NZ row
the same, since a 32-byte fractal column holds more lanes than one 16-byte vector store. An
fp8 cache must be cast with ``cvt.rn.satfinite.e4m3x2.f32``, and an int8 or fp8 cache divide by
its scale with ``div.rn.f32`` (IEEE; Triton's ``/`` is ``div.full.f32``, within 2 ulp). The
table is compiled at TP 1/2/4/8 and at 16 for the rows that run at it (MiniMax-M2), and for the
rows normalised across heads (``split_qkv_tp_rmsnorm_rope``) the first kernel too, the sums of
squares (``[sums]``), whose loads must be 16 bytes wide. It prints last ``compiled N/N CUDA
kernel plans ...`` and exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace

from ._check_common import (TRITON_DTYPES, first_error, in_argument_order, kv_cache_call, mla_call,
                            refuse_interpreted_kernel)
from .device import cuda_facts
from .models import MLA_MODELS, TP_SIZES, geometry_table, model
from .tiling import KernelShape, cuda

#: Compute capability of the H100/H200 this project measures on.
TARGET_ARCH = 90
#: Arguments a real launch passes divisible by 16 (Triton specialises them so): the tensors
#: (allocated 16-byte aligned) and their row strides. Not ``pos_axis_stride``: it is the token
#: count for ``[3, T]`` positions.
_DIVISIBLE = ("qkv_ptr", "q_out_ptr", "k_out_ptr", "gate_out_ptr", "v_out_ptr", "q_w_ptr", "k_w_ptr",
              "q_b_ptr", "k_b_ptr", "cache_ptr", "pos_ptr", "qkv_stride", "q_out_stride", "k_out_stride",
              "gate_out_stride", "v_out_stride", "cache_stride",
              # The cache write's: the caches (views of one [2, ...] tensor: the value half starts
              # a whole number of blocks in), slots and scales, and the layouts' strides and
              # offsets, multiples of 16 elements for every D of the table, 16-slot blocks and
              # 32-byte NZ columns (0, the offset of every layout but cpu_vec's values, is one).
              "k_cache_ptr", "v_cache_ptr", "slot_ptr", "k_scale_ptr", "v_scale_ptr", "block_size",
              "k_block_stride", "k_slot_stride", "k_head_stride", "k_offset", "v_block_stride",
              "v_slot_stride", "v_head_stride", "v_offset", "kv_chunk_stride")


@dataclass(frozen=True)
class KVForm:
    """A cache write compiled on top of a geometry: ``layout`` (``"nhd"``, ``"hnd"``, ``"nz"``),
    ``cache`` dtype (a key of :data:`~._check_common.TRITON_DTYPES`; int8 and fp8 quantised per
    tensor) and whether k and v are returned too."""

    layout: str
    cache: str
    return_kv: bool = True

    @property
    def name(self) -> str:
        return f"kv {self.layout} {self.cache}{' +kv' if self.return_kv else ''}"


#: The cache write's forms: vLLM's NHD and HND and Ascend's NZ in bf16, int8 and fp8 e4m3 on
#: NHD, each without k and v out (vLLM's use) and returning them too: what the latter adds to
#: the prologue is the cache's stores and loads, and what it adds to the former is k's and v's
#: output stores, of the same tiles as the cache's.
KV_FORMS = tuple(KVForm(layout, cache, return_kv) for layout, cache in
                 (("nhd", "bf16"), ("hnd", "bf16"), ("nz", "bf16"), ("nhd", "int8"), ("nhd", "fp8_e4m3"))
                 for return_kv in (False, True))
#: Table rows the forms are compiled on (model, TP): a plain 32/8/128, its one-kv-head TP 8
#: shard, a gated partial-rotary D = 256 and a v-norm D = 512 layer.
KV_ROWS = (("Qwen3-8B", 1), ("Qwen3-8B", 8), ("Qwen3-Next-80B-A3B", 1), ("Gemma-4-31B:full", 1))


def bare(geometry):
    """``geometry`` without issue 10's extra arms and rows (gate, v-norm, mRoPE), or ``None``
    when it has none (a q-only layer keeps its shape: there is no k to put back)."""
    if not (geometry.q_gate or geometry.v_norm or geometry.mrope_section is not None):
        return None
    return replace(geometry, q_gate=False, v_norm=False, mrope_section=None, mrope_interleaved=False)


def _sm90_facts():
    """The plan facts of the GPU compiled for (``TARGET_ARCH``): the SM count of :func:`cuda_facts`,
    with dependent launch, as the op launches there."""
    return replace(cuda_facts(), dependent_launch=True)


def _kernel(geometry, small: bool, plan_geometry=None, kv: KVForm | None = None, kv_plan: bool = False):
    """The plan, signature and constexprs of one geometry under the plan ``plan_geometry``
    (default: its own) gets; with ``kv`` as the cache-write op (validated by the op's own
    validator, :func:`~._check_common.kv_cache_call`); ``kv_plan``: under the plan of the
    cache write's shape (the prologue compared against it)."""
    from .split_qkv_rmsnorm_rope import constexprs, signature
    from .split_qkv_rmsnorm_rope import split_qkv_rmsnorm_rope_kernel as kernel

    call = None
    shape = KernelShape.of(geometry, 2, 4)
    if kv is not None:
        call = kv_cache_call(geometry, "bf16", "fp32", layout=kv.layout, cache_dtype=kv.cache,
                             return_kv=kv.return_kv, q_norm=geometry.qk_norm, k_norm=geometry.qk_norm)
        shape = call.shape
    plan_shape = KernelShape.of(plan_geometry or geometry, 2, 4)
    if kv is not None or kv_plan:
        plan_shape = replace(plan_shape, kv_cache=True)
    plan = (cuda.small_batch_plan if small else cuda.plan)(plan_shape, _sm90_facts())
    constexprs = constexprs(shape, plan, q_norm=geometry.qk_norm, k_norm=geometry.qk_norm,
                             q_bias=False, k_bias=False, mrope_section=geometry.mrope_section,
                             mrope_interleaved=geometry.mrope_interleaved,
                             kv_cache=call.kv_cache if call else None)
    signature = in_argument_order(kernel, signature("bf16", "fp32", TRITON_DTYPES[kv.cache] if kv else None))
    return shape, plan, signature, constexprs


def _key(geometry, small: bool, plan_geometry=None, kv: KVForm | None = None, kv_plan: bool = False) -> tuple:
    """What decides the compiled kernel (rows of the table that share it compile once)."""
    _, plan, signature, constexprs = _kernel(geometry, small, plan_geometry, kv, kv_plan)
    return tuple(signature.items()), tuple(sorted(constexprs.items())), tuple(sorted(plan.launch_options.items()))


def compile_plan(geometry, small: bool = False, plan_geometry=None, kv: KVForm | None = None,
                 kv_plan: bool = False) -> dict:
    """Compile one geometry's CUDA plan (``small``: the small-batch plan; ``plan_geometry``: the
    plan of another geometry, default its own; ``kv``, ``kv_plan``: as :func:`_kernel`) to PTX;
    count the vector and scalar global accesses."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .split_qkv_rmsnorm_rope import split_qkv_rmsnorm_rope_kernel as kernel

    shape, plan, signature, constexprs = _kernel(geometry, small, plan_geometry, kv, kv_plan)
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
            "fp8_cvt": len(re.findall(r"cvt\.rn\.satfinite\.e4m3x2\.f32", ptx)),
            "div_rn": len(re.findall(r"div\.rn\.f32", ptx)),
            "kinds": collections.Counter(re.findall(r"\b((?:ld|st)\.global(?:\.\w+)*)", ptx)), **_ptxas_report(ptx)}


def compile_sums(geometry) -> dict:
    """Compile ``split_qkv_tp_rmsnorm_rope``'s first kernel (the sums of squares) for one rank's
    geometry under its CUDA plan (bf16 qkv, the row stride divisible by 16) to PTX; count its
    vector loads."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .split_qkv_tp_rmsnorm_rope import sums_constexprs, sums_kernel, sums_signature

    shape = KernelShape.of(geometry, 2, 4)
    plan = cuda.sums_plan(shape, cuda_facts())
    signature = in_argument_order(sums_kernel, sums_signature("bf16"))
    constexprs = sums_constexprs(shape, plan)
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(signature)
             if name in ("qkv_ptr", "sums_ptr", "qkv_stride")}
    source = ASTSource(sums_kernel, signature | {name: "constexpr" for name in constexprs},
                       constexprs=constexprs, attrs=attrs)
    ptx = triton.compile(source, target=GPUTarget("cuda", TARGET_ARCH, 32), options=plan.launch_options).asm["ptx"]
    return {"plan": plan, "v4": len(re.findall(r"ld\.global\.v4", ptx)), **_ptxas_report(ptx)}


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


def _store_bytes(kind: str) -> int:
    """Bytes one global access of ``kind`` moves per thread (``st.global.v4.b32``: 16)."""
    vector = re.search(r"\.v(\d+)\.", kind)
    bits = re.search(r"\.[bsuf](\d+)$", kind)
    return (int(vector.group(1)) if vector else 1) * int(bits.group(1)) // 8


def _cache_store_problems(kv: KVForm, row: dict, without: dict, no_kv_out: dict) -> tuple[str, list[str]]:
    """What a cache write returning k and v (``row``) adds to the prologue under the same plan
    (``without``: the stores added are the cache's) and to the same write without k and v out
    (``no_kv_out``: the stores added are k's and v's output stores, of the same tiles), and
    what is wrong with it: no cache store, or cache stores moving fewer lanes per thread than
    those output stores, at the widest or at the narrowest (``+<stores> st, <lanes> lanes``)."""
    def stores(kinds):
        return {kind: n for kind, n in kinds.items() if kind.startswith("st.")}

    cache = stores(row["kinds"] - without["kinds"])
    outputs = stores(row["kinds"] - no_kv_out["kinds"])
    cache_bytes = {"bf16": 2, "fp16": 2, "fp32": 4, "int8": 1, "fp8_e4m3": 1}[kv.cache]
    if not cache:
        return "+0 st", ["the cache write adds no store"]
    if not outputs:
        return "", ["returning k and v adds no store"]
    cache_lanes = {_store_bytes(kind) // cache_bytes for kind in cache}
    out_lanes = {_store_bytes(kind) // 2 for kind in outputs}
    problems = []
    if max(cache_lanes) < max(out_lanes):
        problems.append(f"cache stores move at most {max(cache_lanes)} lanes per thread, k/v output stores "
                        f"{max(out_lanes)}")
    if min(cache_lanes) < min(out_lanes):
        problems.append(f"a cache store moves {min(cache_lanes)} lane(s) per thread, no k/v output store "
                        f"fewer than {min(out_lanes)}")
    lanes = "/".join(str(n) for n in sorted(cache_lanes, reverse=True))
    return f"+{sum(cache.values())} st, {lanes} lanes", problems


# --------------------------------------------------------------------------------------------
# MLA (issue 30): split_qkv_rmsnorm_rope_mla and its q side, mla_q_rope_.

#: Arguments of the MLA kernel a real launch passes divisible by 16: the tensors and the row strides
#: of the outputs (new contiguous tensors of 1536, 512, 64 lanes) and of the caches, the rope part's
#: offset in the combined cache (512) and q's token stride (a multiple of 192), head stride (192)
#: and the rope lanes' column (128), for every model of the MLA table.
_MLA_DIVISIBLE = ("x_ptr", "q_ptr", "q_c_ptr", "kv_c_ptr", "k_pe_ptr", "q_w_ptr", "kv_w_ptr", "cache_ptr", "pos_ptr",
                  "nope_cache_ptr", "rope_cache_ptr", "slot_ptr", "scale_ptr", "x_stride", "q_c_stride",
                  "kv_c_stride", "k_pe_stride", "cache_stride", "nope_block_stride", "nope_slot_stride",
                  "rope_block_stride", "rope_slot_stride", "nope_chunk_stride", "rope_chunk_stride",
                  "rope_offset", "q_stride", "q_head_stride", "q_rope_col")


@dataclass(frozen=True)
class MLAForm:
    """An MLA kernel compiled on a model: the q side, or the prologue with the cache ``form``
    (``None``, ``"combined"``, ``"split"`` in ``layout``) of ``kv_cache_dtype`` (bf16 activations,
    fp32 cos/sin)."""

    name: str
    q_side: bool = False
    form: str | None = None
    layout: str = "nd"
    kv_cache_dtype: str = "auto"
    small: bool = False  # the prologue's small-batch plan (cuda.mla_small_plan)
    with_q: bool = False  # the prologue rotating q too (no q latent)


#: The prologue's forms (the same kernel at every TP size: the latent is replicated): no cache,
#: vLLM's combined cache in bf16 and fp8 (float8_e4m3fn storage: a uint8 cache is viewed so), the
#: split pair in ND bf16 and NZ with an int8 latent; the small-batch plan with the combined cache.
MLA_FORMS = (MLAForm("mla"), MLAForm("mla, kv combined", form="combined"),
             MLAForm("mla, kv combined fp8", form="combined", kv_cache_dtype="fp8"),
             MLAForm("mla, kv split nd", form="split"),
             MLAForm("mla, kv split nz int8", form="split", layout="nz", kv_cache_dtype="int8"),
             MLAForm("mla small batch, kv combined", form="combined", small=True))
#: Without a q latent, the prologue as the MLA step calls it: rotating q too (the q heads shard, so
#: at each TP size), with the combined cache, both plans.
MLA_Q_FORMS = (MLAForm("mla with q, kv combined", form="combined", with_q=True),
               MLAForm("mla small batch with q, kv combined", form="combined", small=True, with_q=True))


def mla_jobs() -> list[tuple[str, object, int, MLAForm]]:
    """``(label, spec, heads, form)``: each model's prologue in :data:`MLA_FORMS`, its q side at
    each TP size, and without a q latent its prologue rotating q (:data:`MLA_Q_FORMS`) at each."""
    jobs = []
    for spec in MLA_MODELS:
        jobs += [(f"{spec.name} tp* [{f.name}]", spec, spec.heads_at(1), f) for f in MLA_FORMS]
        jobs += [(f"{spec.name} tp{tp} [mla q side]", spec, spec.heads_at(tp), MLAForm("q", q_side=True))
                 for tp in spec.tp_sizes]
        if not spec.q_lora_rank:
            jobs += [(f"{spec.name} tp{tp} [{f.name}]", spec, spec.heads_at(tp), f)
                     for tp in spec.tp_sizes for f in MLA_Q_FORMS]
    return jobs


def _mla_kernel_of(spec, heads: int, form: MLAForm):
    from .split_qkv_rmsnorm_rope_mla import constexprs, signature
    from .split_qkv_rmsnorm_rope_mla import mla_kernel as kernel

    storage = "fp8_e4m3" if form.kv_cache_dtype == "fp8" else None
    call = mla_call(spec, heads, "bf16", "fp32", q_side=form.q_side, form=form.form, layout=form.layout,
                    kv_cache_dtype=form.kv_cache_dtype, storage=storage, with_q=form.with_q)
    plan = (cuda.mla_small_plan if form.small else cuda.mla_plan)(call.shape, _sm90_facts())
    nope = {"auto": "bf16", "int8": "int8", "fp8": "fp8_e4m3"}[form.kv_cache_dtype]
    rope = "fp8_e4m3" if form.kv_cache_dtype == "fp8" else "bf16"
    signature = in_argument_order(kernel, signature("bf16", "fp32", TRITON_DTYPES[nope], TRITON_DTYPES[rope]))
    return kernel, plan, signature, constexprs(call, plan)


def compile_mla(spec, heads: int, form: MLAForm) -> dict:
    """Compile one MLA kernel (bf16, its CUDA plan) to PTX; count its vector accesses, fp8 casts,
    IEEE divisions, registers and spills."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel, plan, signature, constexprs = _mla_kernel_of(spec, heads, form)
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(signature) if name in _MLA_DIVISIBLE}
    source = ASTSource(kernel, signature | {name: "constexpr" for name in constexprs}, constexprs=constexprs,
                       attrs=attrs)
    ptx = triton.compile(source, target=GPUTarget("cuda", TARGET_ARCH, 32), options=plan.launch_options).asm["ptx"]
    return {"plan": plan, "v4": len(re.findall(r"(?:ld|st)\.global\.v4", ptx)),
            "v2": len(re.findall(r"(?:ld|st)\.global\.v2", ptx)),
            "scalar16": len(re.findall(r"(?:ld|st)\.global\.b16", ptx)),
            "fp8_cvt": len(re.findall(r"cvt\.rn\.satfinite\.e4m3x2\.f32", ptx)),
            "div_rn": len(re.findall(r"div\.rn\.f32", ptx)), **_ptxas_report(ptx)}


def _compile_mla_job(job) -> tuple[dict | None, str | None]:
    try:
        return compile_mla(*job), None
    except Exception as exc:  # noqa: BLE001 - report every failure, then fail the run
        return None, f"{type(exc).__name__}: {first_error(exc)}"


def main_mla(jobs) -> int:
    """Compile the MLA jobs (:func:`mla_jobs`), print a row each; return how many passed. The
    tiles must move 16-byte vectors; an fp8 cache must be cast with ``cvt.rn.satfinite.e4m3x2.f32``
    and a quantised one divide by its scale with ``div.rn.f32``."""
    work: dict = {}
    for _, spec, heads, form in jobs:
        work.setdefault(_mla_key(spec, heads, form), (spec, heads, form))
    with concurrent.futures.ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = dict(zip(work, pool.map(_compile_mla_job, work.values())))
    ok, seen = 0, {}
    for label, spec, heads, form in jobs:
        key = _mla_key(spec, heads, form)
        row, error = results[key]
        same = f" (= {seen[key]})" if key in seen else ""
        seen.setdefault(key, label)
        if error is not None:
            print(f"{label:50} {'mla':40} compile failed: {error}{same}")
            continue
        problems = [] if row["v4"] else ["no 16-byte accesses"]
        if form.kv_cache_dtype == "fp8" and not row["fp8_cvt"]:
            problems.append("no cvt.rn.satfinite.e4m3x2.f32: the fp8 cast is not the saturating one")
        if form.kv_cache_dtype != "auto" and not row["div_rn"]:
            problems.append("no div.rn.f32: the division by the scale is not the IEEE one")
        ok += not problems
        plan, status = row["plan"], "ok" if not problems else "FAIL: " + "; ".join(problems)
        geometry = f"MLA {spec.q_lora_rank}/{spec.kv_lora_rank}/{spec.rope_dim}, q {heads}x{spec.q_head_dim}"
        print(f"{label:50} {geometry:40} {'mla':5} {plan.block_tokens:3d} {plan.block_heads:4d} {'-':>4} "
              f"{'-':>4} {plan.num_warps:5d} {row['v4']:4d} {row['v2']:4d} {row['scalar16']:4d} {'':>17} "
              f"{row['registers']:4d} {row['spill_bytes']:5d}  {status}{same}")
    return ok


def _mla_key(spec, heads: int, form: MLAForm) -> tuple:
    _, plan, signature, constexprs = _mla_kernel_of(spec, heads, form)
    return tuple(signature.items()), tuple(sorted(constexprs.items())), tuple(sorted(plan.launch_options.items()))


def main(argv: list[str] | None = None) -> int:
    """Compile every CUDA plan of the geometry table; exit 1 on any failure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kv-only", action="store_true",
                        help="compile the KV-cache write's plans only (split_qkv_rmsnorm_rope_kv_cache)")
    parser.add_argument("--mla-only", action="store_true",
                        help="compile the MLA plans only (split_qkv_rmsnorm_rope_mla, mla_q_rope_)")
    args = parser.parse_args(argv)
    if refuse_interpreted_kernel():
        return 2
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        print("upstream Triton with its NVIDIA backend is needed (pip install triton)", file=sys.stderr)
        return 2
    if args.mla_only:
        jobs = mla_jobs()
        ok = main_mla(jobs)
        print(f"compiled {ok}/{len(jobs)} CUDA kernel plans for sm_{TARGET_ARCH} (MLA; to PTX, on the CPU)")
        return 0 if ok == len(jobs) else 1
    table = geometry_table(TP_SIZES + (16,))  # 16: the rows that run at it (MiniMax-M2)
    jobs = [(f"{name} tp{tp}", geometry, small, None) for name, tp, geometry in table
            for small in (False, True) if not args.kv_only]
    jobs += [(f"{name} tp{tp} [{kv.name}]", model(name).shard(tp), small, kv) for name, tp in KV_ROWS
             for kv in KV_FORMS for small in (False, True)]
    # Each distinct kernel once: the table's, then the bare kernels (without the extra arms,
    # under the same plan) of those with issue 10's arms, and the prologue under a cache
    # write's plan.
    work: dict = {}
    for _, geometry, small, kv in jobs:
        work.setdefault(_key(geometry, small, kv=kv), (geometry, small, None, kv))
        if kv is not None:
            work.setdefault(_key(geometry, small, kv_plan=True), (geometry, small, None, None, True))
            work.setdefault(_key(geometry, small, kv=replace(kv, return_kv=False)),
                            (geometry, small, None, replace(kv, return_kv=False)))
        elif bare(geometry) is not None:
            work.setdefault(_key(bare(geometry), small, geometry), (bare(geometry), small, geometry))
    print(f"{'plan':50} {'geometry':40} {'kind':5} {'BT':>3} {'BHq':>4} {'BHk':>4} "
          f"{'tail':>4} {'warps':>5} {'v4':>4} {'v2':>4} {'b16':>4} {'added':>17} {'regs':>4} {'spill':>5}  status")
    ok = 0
    # The plans compile independently: one process per CPU core (CI has two).
    with concurrent.futures.ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = dict(zip(work, pool.map(_compile_job, work.values())))
    seen: dict = {}
    for label, geometry, small, kv in jobs:
        kind = "small" if small else "large"
        key = _key(geometry, small, kv=kv)
        row, error = results[key]
        same = f" (= {seen[key]})" if key in seen else ""
        seen.setdefault(key, label)
        if error is not None:
            print(f"{label:50} {geometry.label:40} {kind:5} compile failed: {error}{same}")
            continue
        plan = row["plan"]
        # The large plan's tiles must move in 16-byte vectors; the small-batch plan's one-token
        # tiles spread over 4 warps may use 8-byte ones, but never only scalars.
        problems = [] if (row["v4"] > 0 if not small else row["v4"] + row["v2"] > 0) else ["no vector accesses"]
        added = ""
        if kv is not None:
            if kv.cache == "fp8_e4m3" and not row["fp8_cvt"]:
                # The kernel rounds onto the e4m3 grid itself; the cast must then be the hardware's
                # saturating round-to-nearest-even one, which the CUDA reference agrees with.
                problems.append("no cvt.rn.satfinite.e4m3x2.f32: the fp8 cast is not the saturating one")
            if kv.cache in ("int8", "fp8_e4m3") and not row["div_rn"]:
                # y / scale must be IEEE's division: Triton's `/` is div.full.f32 (within 2 ulp),
                # which put exact fp32 ties on the wrong side (docs/performance.md, v9).
                problems.append("no div.rn.f32: the division by the scale is not the IEEE one")
            if kv.return_kv:
                without, error = results[_key(geometry, small, kv_plan=True)]
                no_kv_out, error2 = results[_key(geometry, small, kv=replace(kv, return_kv=False))]
                if error or error2:
                    problems.append(f"a kernel compared with failed: {error or error2}")
                else:
                    added, more = _cache_store_problems(kv, row, without, no_kv_out)
                    problems += more
        elif bare(geometry) is not None:
            without, error = results[_key(bare(geometry), small, geometry)]
            if error is not None:
                problems.append(f"the bare kernel failed: {error}")
            else:
                added, more = _added_problems(geometry, row, without)
                problems += more
        ok += not problems
        print(f"{label:50} {geometry.label:40} {kind:5} {plan.block_tokens:3d} "
              f"{plan.block_heads:4d} {plan.block_heads_k:4d} {row['tail']:4d} "
              f"{plan.num_warps:5d} {row['v4']:4d} {row['v2']:4d} {row['scalar16']:4d} {added:>17} "
              f"{row['registers']:4d} {row['spill_bytes']:5d}  "
              f"{'ok' if not problems else 'FAIL: ' + '; '.join(problems)}{same}")
    # split_qkv_tp_rmsnorm_rope's sums kernel for the rows normalised across heads: 16-byte loads.
    sums_jobs: dict = {}
    for name, tp, geometry in table:
        if geometry.qk_norm_across_heads:
            sums_jobs.setdefault(geometry, []).append(f"{name} tp{tp} [sums]")
    for geometry, labels in sums_jobs.items():
        try:
            row, error = compile_sums(geometry), None
        except Exception as exc:  # noqa: BLE001 - report every failure, then fail the run
            row, error = None, f"{type(exc).__name__}: {first_error(exc)}"
        for i, label in enumerate(labels):
            same = f" (= {labels[0]})" if i else ""
            if error is not None:
                print(f"{label:50} {geometry.label:40} sums  compile failed: {error}{same}")
                continue
            ok_row = row["v4"] > 0
            ok += ok_row
            plan = row["plan"]
            print(f"{label:50} {geometry.label:40} sums  {plan.block_tokens:3d} {'-':>4} {'-':>4} {'-':>4} "
                  f"{plan.num_warps:5d} {row['v4']:4d} {'-':>4} {'-':>4} {'':>17} {row['registers']:4d} "
                  f"{row['spill_bytes']:5d}  {'ok' if ok_row else 'FAIL: no 16-byte loads'}{same}")
    jobs += [label for labels in sums_jobs.values() for label in labels]
    if not args.kv_only:
        mla = mla_jobs()
        ok += main_mla(mla)
        jobs += [label for label, *_ in mla]
    print("added: global accesses the gate, v and mRoPE rows add to the kernel without them (16-byte ones); "
          "for a cache write returning k and v, the stores it adds to the prologue under its plan and the "
          "lanes each moves per thread (checked against the k/v output stores returning k and v adds)")
    print(f"compiled {ok}/{len(jobs)} CUDA kernel plans for sm_{TARGET_ARCH} (to PTX, on the CPU; "
          f"{len(work)} distinct kernels, bare ones included)")
    return 0 if ok == len(jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
