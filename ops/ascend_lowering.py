"""Lower the fused kernel for an Ascend target on the CPU, for every plan of the geometry table.

Run in a virtual environment with ``triton-ascend==3.2.0`` (it installs the package ``triton``)::

    python -m vllm_ascend_ext.ops.ascend_lowering [--soc Ascend910B3] [--verbose] [--kv-only]

For each model of ``ops/models.py`` at each TP size it runs at (and feature variants on a few of
them), and for the KV-cache write (``split_qkv_rmsnorm_rope_kv_cache``: ND and NZ layouts, the
activation dtype and int8 per tensor and per channel, with and without k and v out; on the plain
Qwen3 rows and one row of each feature family, :data:`KV_TABLE_MODELS`, :data:`KV_FAMILIES`,
configured by the op's own validator on ``meta`` tensors), and for ``split_qkv_tp_rmsnorm_rope``
(the table's rows normalised across heads, MiniMax-M2 / M2.5, at TP 1/2/4/8/16: its second
kernel is the table row's own plan, compiled with ``NORM_SUMS``/``ELEM_W``; its first kernel,
the sums of squares, is lowered beside it as ``[sums]``), this builds the Ascend launch plan,
runs triton-ascend's ``ttir`` and ``ttadapter`` (ttir -> linalg) stages for
``GPUTarget("npu", <soc>, 0)`` (the final bishengir stage needs CANN and is not run), then:

* sums the explicit local buffers of the linalg output (``memref.alloc``: the copies from
  global memory into the UB) and checks them against the UB model's ``gm`` buffers
  (``ops/tiling/ascend.py``): the model must cover what the lowering allocates, and the buffers
  it models exactly (all but those modelled at their widest: weights, per-channel scales) must
  be allocated, or the model is out of date;
* checks the whole model, and the lowering's allocation with its second buffers, against
  the UB capacity;
* checks that the outputs (q, k, the gate, v) and the caches are never read (a masked store the
  lowering cannot bound becomes a read-modify-write of the whole block, which races with the
  neighbouring rows) and that no output is stored element by element;
* counts the KV-cache stores the lowering makes element by element (column ``elem st``):
  reported, not failed, as ``docs/ascend-ub-model.md`` explains (every cache write does so with
  triton-ascend 3.2 today: its padding-slot mask depends on loaded data, and NZ's lane offsets
  are not a strided block).

fp8 caches are not lowered: triton-ascend 3.2 refuses every fp8 type for Ascend910B/A3
(``unexpected type fp8``), so the fp8 cache write is CUDA's only.

Rows of the table that compile to the same kernel (same per-rank geometry, variant and plan;
``eps`` and ``weight_offset`` are run-time arguments) are lowered once and reported on each row.
It prints one row per plan and, last, ``lowered N/N kernel plans ...``; it exits non-zero on
any lowering error or violated check.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import re
import subprocess
import sys
import traceback
from dataclasses import dataclass, replace

from ._check_common import (TRITON_DTYPES, first_error, in_argument_order, kv_cache_call, mla_call,
                            refuse_interpreted_kernel)
from . import settings
from .device import ascend_facts
from .models import MLA_MODELS, TP_SIZES, MLASpec, geometry_table, mla_model, model
from .tiling import KernelShape, ascend

_ALLOC = re.compile(r"(%[\w.]+) = memref\.alloc\(\)[^:]*: memref<([^>]*)>")
_CAST = re.compile(r"(%[\w.]+) = memref\.reinterpret_cast (%arg\d+) ")
_VIEW = re.compile(r"(%[\w.]+) = memref\.subview (%[\w.]+)\[")
_COPY = re.compile(r"memref\.copy (%[\w.]+), (%[\w.]+) ")
#: A store of one element (``tensor<1x..>``): what an access the lowering cannot express as a
#: block becomes, inside loops over the tile's elements.
_ELEMENT_STORE = re.compile(r"materialize_in_destination %[\w.]+ in writable (%[\w.]+) : \(tensor<1x")
_BYTES = {"i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "bf16": 2, "f16": 2, "f32": 4}
_OUTPUTS = ("q_out_ptr", "k_out_ptr", "gate_out_ptr", "v_out_ptr")
_CACHES = ("k_cache_ptr", "v_cache_ptr")


@dataclass(frozen=True)
class KVWrite:
    """How a KV-cache variant writes the cache: ``layout`` ``"nhd"`` (vllm-ascend's ND) or ``"nz"``
    (its fractal NZ: 32-byte columns, ``KV_CHUNK`` 8, 16, 32 lanes for fp32, bf16/fp16, int8), in the
    activation dtype or ``int8`` (per tensor, or ``per_channel``), returning k and v too with
    ``return_kv``."""

    layout: str
    int8: bool = False
    per_channel: bool = False
    return_kv: bool = False

    @property
    def name(self) -> str:
        cache = ("int8/ch" if self.per_channel else "int8") if self.int8 else "dtype"
        return f"kv {self.layout} {cache}{' +kv' if self.return_kv else ''}"


#: Every combination: two layouts x (the activation dtype, int8 per tensor, int8 per channel) x
#: return_kv (12 kernels per geometry).
KV_ALL = tuple(KVWrite(layout, int8, per_channel, return_kv) for layout in ("nhd", "nz")
               for int8, per_channel in ((False, False), (True, False), (True, True))
               for return_kv in (False, True))
#: Four that between them take each layout, each cache form and both return_kv settings, the
#: per-channel form (the UB model's widest) on NZ.
KV_COVER = (KVWrite("nhd"), KVWrite("nz", return_kv=True), KVWrite("nhd", int8=True, return_kv=True),
            KVWrite("nz", int8=True, per_channel=True))


@dataclass(frozen=True)
class Variant:
    """A feature combination lowered on top of a table row's geometry at TP 1 (whose own
    features it keeps; the table's rows lower as bf16 with an fp32 cache), with ``kv`` as the
    KV-cache write op (``split_qkv_rmsnorm_rope_kv_cache``) in the form ``kv`` says."""

    name: str
    dtype: str = "bf16"
    cache_dtype: str = "fp32"
    q_norm: bool | None = None  # None: as the model has it
    bias: bool = False
    is_neox: bool | None = None  # None: as the model has it
    base: str = "Qwen3-8B"
    kv: KVWrite | None = None
    #: ``split_qkv_tp_rmsnorm_rope``'s first kernel (the sums of squares) instead of the prologue's.
    sums: bool = False


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
    # Issue 12: the across-heads norm (NORM_SUMS, ELEM_W) in the dtypes and rotary style the table's
    # bf16 NeoX rows do not reach, and its first kernel in fp32.
    Variant("fp32", dtype="fp32", base="MiniMax-M2"),
    Variant("gptj, fp16", dtype="fp16", is_neox=False, base="MiniMax-M2"),
    Variant("sums, fp32", dtype="fp32", base="MiniMax-M2", sums=True),
)
#: TP sizes of the table lowered: every size a row runs at (16 only for MiniMax-M2 / M2.5).
TABLE_TP_SIZES = TP_SIZES + (16,)

#: The KV-cache write (issue 11) on the plain Qwen3 rows of the table, at every TP size each
#: runs at, in the :data:`KV_COVER` forms (Qwen3-8B at TP 1 in all of :data:`KV_ALL`).
KV_TABLE_MODELS = ("Qwen3-8B", "Qwen3-32B", "Qwen3-30B-A3B", "Qwen3-235B-A22B")
#: ... and at TP 1 on one row of each feature family the prologue's check covers, in the
#: :data:`KV_COVER` forms. A q-only layer has no k or v to write (the op refuses it).
KV_FAMILIES = (
    Variant("", base="Qwen3-Next-80B-A3B"),  # gate, partial rotary, w+1, D = 256
    Variant("", base="Qwen3.5-397B-A17B"),  # gate + interleaved mRoPE
    Variant("", base="Qwen3-VL-8B"),  # interleaved mRoPE
    Variant("gptj", is_neox=False, base="Qwen2.5-VL-7B"),  # contiguous mRoPE, GPT-J pairs, no norm
    Variant("", base="GLM-4-9B"),  # GPT-J, partial rotary, no norm
    Variant("", base="Gemma-4-31B:full"),  # v-norm written to the cache too, D = 512
    Variant("", base="MiMo-V2-Flash-qk"),  # D = 192, a 128-lane tail
    Variant("", base="Phi-3-mini"),  # D = 96: rotary halves of 48 padded to 64
    Variant("", base="Llama-3.1-8B"),  # no norm
    Variant("fp16", dtype="fp16"),
    Variant("fp32", dtype="fp32"),  # fp32 cache; NZ columns of 8 lanes
    Variant("bias", bias=True),
    Variant("k-only norm", q_norm=False),
)


def _alloc_bytes(shape_text: str) -> int:
    *dims, dtype = shape_text.split("x")
    count = 1
    for dim in dims:
        count *= int(dim)
    return count * _BYTES[dtype]


def _accesses(linalg: str, args: dict[str, str]) -> collections.Counter:
    """``(kind, name)`` -> how many: ``"read"``, a ``memref.copy`` from the argument ``name``, and
    ``"element store"``, a store of one element into it (a loop body storing the tile element
    by element), for the arguments ``args`` (``%argN`` -> name).

    Views are followed back to the argument they were cast from as they are defined, line by
    line: MLIR reuses a value's name in sibling regions (the arms of the head-block branch), so
    a name means the definition most recently printed above its use.
    """
    root: dict[str, str] = {}
    counts: collections.Counter = collections.Counter()
    for line in linalg.splitlines():
        defined = _CAST.search(line) or _VIEW.search(line)
        if defined:
            root[defined.group(1)] = root.get(defined.group(2), defined.group(2))
            continue
        copied = _COPY.search(line)
        stored = _ELEMENT_STORE.search(line)
        for kind, match in (("read", copied), ("element store", stored)):
            if match and root.get(match.group(1), match.group(1)) in args:
                counts[kind, args[root.get(match.group(1), match.group(1))]] += 1
    return counts


_FUNC_ARG = re.compile(r"%arg(\d+): (memref<\?x(\w+)>|\w+)")
_IR_TYPES = {"bf16": "bf16", "fp16": "f16", "fp32": "f32", "i8": "i8", "i32": "i32", "i64": "i64"}


def _check_arguments(linalg: str, runtime: list[str], signature: dict) -> None:
    """Raise ``ValueError`` unless the lowered function's arguments after its two leading ones
    are ``runtime`` in order, each of its ``signature`` type (the checks of outputs and caches
    find them by position)."""
    header = next(line for line in linalg.splitlines() if "func.func" in line)
    declared = {int(n): (elem or whole) for n, whole, elem in _FUNC_ARG.findall(header)}
    for i, name in enumerate(runtime):
        want = _IR_TYPES[signature[name].lstrip("*")]
        if declared.get(i + 2) != want:
            raise ValueError(f"lowered argument %arg{i + 2} is {declared.get(i + 2)}, expected {name} ({want})")


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
    signature = in_argument_order(fn, dict(signature) | {name: "constexpr" for name in constants})
    source = ASTSource(fn, signature, constants=constants)
    module = source.make_ir(options, backend.get_codegen_implementation(), backend.get_module_map(), context)
    metadata = dataclasses.asdict(options) | {"hash": source.hash()}
    return stages["ttadapter"](stages["ttir"](module, metadata), metadata)


_ELEM = {"bf16": 2, "fp16": 2, "fp32": 4}


def _kernel(geometry, variant: Variant, facts):
    """The shape, plan, signature and constexprs one geometry and variant compile with (a KV
    variant's as the op's validator makes them: :func:`~._check_common.kv_cache_call`)."""
    from .split_qkv_rmsnorm_rope import constexprs, signature
    from .split_qkv_rmsnorm_rope import split_qkv_rmsnorm_rope_kernel as kernel

    if variant.sums:
        from .split_qkv_tp_rmsnorm_rope import sums_constexprs, sums_kernel, sums_signature

        shape = KernelShape.of(geometry, _ELEM[variant.dtype], _ELEM[variant.cache_dtype])
        plan = ascend.sums_plan(shape, facts)
        return shape, plan, in_argument_order(sums_kernel, sums_signature(variant.dtype)), \
            sums_constexprs(shape, plan)
    q_norm = geometry.qk_norm if variant.q_norm is None else variant.q_norm
    k_norm = geometry.qk_norm or variant.q_norm is False
    kv = variant.kv
    if kv is None:
        shape = KernelShape.of(geometry, _ELEM[variant.dtype], _ELEM[variant.cache_dtype])
        plan = ascend.plan(shape, facts)
        constants = constexprs(shape, plan, q_norm=q_norm, k_norm=k_norm,
                                q_bias=variant.bias and q_norm, k_bias=variant.bias and k_norm,
                                mrope_section=geometry.mrope_section,
                                mrope_interleaved=geometry.mrope_interleaved)
        return shape, plan, in_argument_order(kernel, signature(variant.dtype, variant.cache_dtype)), constants
    cache_dtype = "int8" if kv.int8 else variant.dtype
    call = kv_cache_call(geometry, variant.dtype, variant.cache_dtype, layout=kv.layout, cache_dtype=cache_dtype,
                         per_channel=kv.per_channel, return_kv=kv.return_kv, q_norm=q_norm, k_norm=k_norm,
                         bias=variant.bias)
    plan = ascend.plan(call.shape, facts)
    constants = constexprs(call.shape, plan, q_norm=call.q_norm, k_norm=call.k_norm, q_bias=call.q_bias,
                            k_bias=call.k_bias, mrope_section=call.mrope_section,
                            mrope_interleaved=call.mrope_interleaved, kv_cache=call.kv_cache)
    signature = signature(variant.dtype, variant.cache_dtype, TRITON_DTYPES[cache_dtype])
    return call.shape, plan, in_argument_order(kernel, signature), constants


def _job_key(geometry, variant: Variant | None, facts) -> tuple:
    """What decides the lowered kernel: signature and constexprs (so table rows with the same
    per-rank geometry share one lowering)."""
    if isinstance(variant, MLAVariant):
        _, _, signature, constants = _mla_kernel_of(geometry, variant, facts)
        return ("mla",) + tuple(signature.items()), tuple(sorted(constants.items()))
    _, _, signature, constants = _kernel(geometry, variant or Variant(""), facts)
    return tuple(signature.items()), tuple(sorted(constants.items()))


def lower_plan(geometry, variant: Variant | None, facts) -> dict:
    """Plan and lower one geometry (with an optional feature variant) for the NPU of ``facts``
    (:class:`~.device.AscendFacts`); return the report row."""
    from .split_qkv_rmsnorm_rope import split_qkv_rmsnorm_rope_kernel as kernel
    from .split_qkv_rmsnorm_rope_mla import mla_kernel
    from .split_qkv_tp_rmsnorm_rope import sums_kernel

    variant = variant or Variant("")
    if isinstance(variant, MLAVariant):
        shape, plan, signature, constants = _mla_kernel_of(geometry, variant, facts)
        # The q side rotates q in place: x_ptr is its input and its output (read by design).
        outputs = ("x_ptr",) if variant.q_side else _MLA_OUTPUTS
        caches = () if variant.q_side else _MLA_CACHES
        fn = mla_kernel
    else:
        shape, plan, signature, constants = _kernel(geometry, variant, facts)
        # The sums kernel's one output is the [T, 2] sums; the prologue kernel reads them.
        outputs, caches = (("sums_ptr",), ()) if variant.sums else (_OUTPUTS, _CACHES)
        fn = sums_kernel if variant.sums else kernel
    linalg = _lower(fn, signature, constants, facts.soc)
    # The lowered function takes two leading runtime arguments, then the kernel's in order (the
    # constants dropped); checked against the types it declares.
    runtime = [name for name in signature if name not in constants]
    _check_arguments(linalg, runtime, signature)
    args = {f"%arg{i + 2}": name for i, name in enumerate(runtime) if name in outputs + caches}
    accesses = _accesses(linalg, args)
    allocs = [_alloc_bytes(shape_text) for _, shape_text in _ALLOC.findall(linalg)]
    ir_bytes = sum(allocs)
    row = {
        "plan": plan, "ir_allocs": len(allocs), "ir_bytes": ir_bytes,
        "model_gm": plan.ub_bytes_from("gm"), "model": plan.ub_bytes,
        "model_exact": sum(b.nbytes for b in plan.ub_buffers if b.source == "gm" and not b.worst_case),
        "capacity": plan.ub_capacity,
        "output_reads": sum(accesses["read", name] for name in outputs + caches
                            if not (isinstance(variant, MLAVariant) and variant.q_side)),
        "output_element_stores": sum(accesses["element store", name] for name in outputs),
        "cache_element_stores": (sum(accesses["element store", name] for name in caches)
                                 if shape.kv_cache and not getattr(variant, "sums", False) else None),
    }
    problems = []
    if ir_bytes > row["model_gm"]:
        problems.append(f"lowering allocates {ir_bytes} B of copies, model's gm buffers {row['model_gm']} B")
    if ir_bytes < row["model_exact"]:
        problems.append(f"lowering allocates {ir_bytes} B of copies, less than the {row['model_exact']} B of "
                        "gm buffers the model lists as exact: the model is out of date")
    if plan.ub_bytes > plan.ub_capacity:
        problems.append(f"model {plan.ub_bytes} B over capacity {plan.ub_capacity} B")
    if ir_bytes * ascend.MULTIBUFFER > plan.ub_capacity:
        problems.append(f"lowering x{ascend.MULTIBUFFER} buffers over capacity")
    if row["output_reads"]:
        problems.append(f"{row['output_reads']} read(s) of an output or cache (read-modify-write store)")
    if row["output_element_stores"]:
        problems.append(f"{row['output_element_stores']} output store(s) lowered element by element")
    row["problems"] = problems
    return row


def plan_jobs(kv_only: bool = False, mla_only: bool = False) -> list[tuple[str, object, Variant | None]]:
    """``(label, geometry, variant)`` of every plan the check lowers: the table's rows and
    :data:`VARIANTS`, then the KV-cache write's (:data:`KV_TABLE_MODELS`, :data:`KV_FAMILIES`),
    then MLA's (:func:`mla_jobs`); ``kv_only`` / ``mla_only``: the KV-cache write's / MLA's alone."""
    if mla_only:
        return mla_jobs()
    def at_tp1(v: Variant):
        geometry = model(v.base).shard(1)
        return geometry if v.is_neox is None else replace(geometry, is_neox=v.is_neox)

    jobs: list = []
    if not kv_only:
        for name, tp, geometry in geometry_table(TABLE_TP_SIZES):
            jobs.append((f"{name} tp{tp}", geometry, None))
            if geometry.qk_norm_across_heads:  # split_qkv_tp_rmsnorm_rope's first kernel too
                jobs.append((f"{name} tp{tp} [sums]", geometry, Variant("sums", sums=True)))
        jobs += [(f"{v.base} tp1 [{v.name}]", at_tp1(v), v) for v in VARIANTS]
    for name, tp, geometry in geometry_table():
        if name in KV_TABLE_MODELS:
            forms = KV_ALL if (name, tp) == (KV_TABLE_MODELS[0], 1) else KV_COVER
            jobs += [(f"{name} tp{tp} [{kv.name}]", geometry, Variant(kv.name, kv=kv)) for kv in forms]
    for v in KV_FAMILIES:
        jobs += [(f"{v.base} tp1 [{', '.join(filter(None, (v.name, kv.name)))}]", at_tp1(v), replace(v, kv=kv))
                 for kv in KV_COVER]
    if not kv_only:
        jobs += mla_jobs()
    return jobs


# --------------------------------------------------------------------------------------------
# MLA (issue 30): split_qkv_rmsnorm_rope_mla and its q side, mla_q_rope_.

_MLA_OUTPUTS = ("q_c_ptr", "kv_c_ptr", "k_pe_ptr")
_MLA_CACHES = ("nope_cache_ptr", "rope_cache_ptr")


@dataclass(frozen=True)
class MLAVariant:
    """An MLA kernel lowered for a :class:`MLARow`: the q side (``mla_q_rope_``) or the prologue
    with the cache ``form`` (``None``, ``"combined"``, ``"split"`` in ``layout``) of
    ``kv_cache_dtype``, in ``dtype`` with a ``cos_dtype`` cos/sin cache; ``is_neox`` / ``no_rope``
    override the model's rotary style / drop its RoPE (Kimi-K3's form)."""

    name: str
    q_side: bool = False
    dtype: str = "bf16"
    cos_dtype: str = "fp32"
    form: str | None = None
    layout: str = "nd"
    kv_cache_dtype: str = "auto"
    is_neox: bool | None = None
    no_rope: bool = False
    with_q: bool = False  # the prologue rotating q too (no q latent)


@dataclass(frozen=True)
class MLARow:
    """A row of the MLA table as the check lowers it: the model and its q heads on one rank."""

    spec: MLASpec
    heads: int

    @property
    def label(self) -> str:
        s = self.spec
        return f"MLA {s.q_lora_rank}/{s.kv_lora_rank}/{s.rope_dim}, q {self.heads}x{s.q_head_dim}"


#: The prologue's forms lowered on every MLA model (its geometry does not depend on the TP size:
#: the latent is replicated): no cache, vLLM's combined cache, vllm-ascend's split pair in ND and
#: NZ, and the NZ pair with an int8 latent. fp8 is not lowered: triton-ascend 3.2 has no fp8 type.
MLA_FORMS = (MLAVariant(""), MLAVariant("kv combined", form="combined"), MLAVariant("kv split nd", form="split"),
             MLAVariant("kv split nz", form="split", layout="nz"),
             MLAVariant("kv split nz int8", form="split", layout="nz", kv_cache_dtype="int8"))
#: Without a q latent, the prologue rotating q too, as the MLA step calls it.
MLA_Q_FORMS = (MLAVariant("kv combined", form="combined", with_q=True),
               MLAVariant("kv split nz", form="split", layout="nz", with_q=True))
#: ... and on DeepSeek-V3 the variants the table's bf16 GPT-J rows do not reach.
MLA_EXTRA = (MLAVariant("neox", is_neox=True), MLAVariant("fp16, bf16 cos/sin", dtype="fp16", cos_dtype="bf16"),
             MLAVariant("fp32, kv split nz", dtype="fp32", form="split", layout="nz"),
             MLAVariant("no rope, kv combined", no_rope=True, form="combined"),
             MLAVariant("q side neox fp16", q_side=True, dtype="fp16", is_neox=True))


def mla_jobs() -> list[tuple[str, MLARow, MLAVariant]]:
    """The MLA plans the check lowers: each model's prologue in :data:`MLA_FORMS` (once: the same at
    every TP size), its q side at each TP size (the heads shard), without a q latent its prologue
    rotating q (with the combined cache and the NZ pair) at each TP size, and :data:`MLA_EXTRA` on
    DeepSeek-V3 at TP 1."""
    jobs: list = []
    for spec in MLA_MODELS:
        whole = MLARow(spec, spec.heads_at(1))
        jobs += [(f"{spec.name} tp* [mla{', ' + v.name if v.name else ''}]", whole, v) for v in MLA_FORMS]
        jobs += [(f"{spec.name} tp{tp} [mla q side]", MLARow(spec, spec.heads_at(tp)), MLAVariant("q", q_side=True))
                 for tp in spec.tp_sizes]
        if not spec.q_lora_rank:
            jobs += [(f"{spec.name} tp{tp} [mla with q, {v.name}]", MLARow(spec, spec.heads_at(tp)), v)
                     for tp in spec.tp_sizes for v in MLA_Q_FORMS]
    v3 = mla_model("DeepSeek-V3")
    jobs += [(f"DeepSeek-V3 tp1 [mla {v.name}]", MLARow(v3, v3.heads_at(1)), v) for v in MLA_EXTRA]
    return jobs


def _mla_kernel_of(row: MLARow, variant: MLAVariant, facts):
    """The shape, plan, signature and constexprs of one MLA row and variant, as the op's validator
    configures them (:func:`~._check_common.mla_call`)."""
    from .split_qkv_rmsnorm_rope_mla import constexprs, signature
    from .split_qkv_rmsnorm_rope_mla import mla_kernel as kernel

    call = mla_call(row.spec, row.heads, variant.dtype, variant.cos_dtype, q_side=variant.q_side, form=variant.form,
                    layout=variant.layout, kv_cache_dtype=variant.kv_cache_dtype, is_neox=variant.is_neox,
                    rope_dim=0 if variant.no_rope else None, with_q=variant.with_q)
    plan = ascend.mla_plan(call.shape, facts)
    nope = "int8" if variant.kv_cache_dtype == "int8" else variant.dtype
    signature = signature(TRITON_DTYPES[variant.dtype], TRITON_DTYPES[variant.cos_dtype], TRITON_DTYPES[nope],
                           TRITON_DTYPES[variant.dtype])
    return call.shape, plan, in_argument_order(kernel, signature), constexprs(call, plan)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: lower every plan, print the table, exit 1 on any failure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--soc", help=f"Ascend SoC to target (default: ${settings.SOC} or Ascend910B3)")
    parser.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
    parser.add_argument("--kv-only", action="store_true",
                        help="lower the KV-cache write's plans only (split_qkv_rmsnorm_rope_kv_cache)")
    parser.add_argument("--mla-only", action="store_true",
                        help="lower the MLA plans only (split_qkv_rmsnorm_rope_mla, mla_q_rope_)")
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
    jobs = plan_jobs(kv_only=args.kv_only, mla_only=args.mla_only)
    print(f"target {facts.soc}: {facts.num_vector_cores} vector cores, UB {facts.ub_bytes} B ({facts.source})")
    print(f"{'plan':58} {'geometry':40} {'BT':>3} {'BH':>3} {'IR allocs':>10} {'model gm':>9} "
          f"{'model':>7} {'cap':>7} {'elem st':>7}  status")
    ok = retried = kv_rows = kv_elementwise = 0
    lowered: dict = {}  # job key -> (row or None, label of the row lowered first)
    for label, geometry, variant in jobs:
        key = _job_key(geometry, variant, facts)
        if key in lowered:
            row, first = lowered[key]
            if row is None:
                print(f"{label:58} {geometry.label:40} lowering failed: as {first}")
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
                print(f"{label:58} {geometry.label:40} lowering failed: {type(exc).__name__}: "
                      f"{first_error(exc)}")
                if args.verbose:
                    traceback.print_exc()
                continue
            lowered[key] = (row, label)
            same = ""
        plan = row["plan"]
        status = ("ok" if not row["problems"] else "FAIL: " + "; ".join(row["problems"])) + same
        ok += not row["problems"]
        elementwise = row["cache_element_stores"]
        kv_rows += elementwise is not None
        kv_elementwise += bool(elementwise)
        print(f"{label:58} {geometry.label:40} {plan.block_tokens:3d} {getattr(plan, 'block_heads', '-')!s:>3} "
              f"{row['ir_bytes']:10d} {row['model_gm']:9d} {row['model']:7d} {row['capacity']:7d} "
              f"{'-' if elementwise is None else elementwise:>7}  {status}")
    note = f", {retried} lowered again after a crash of triton-adapter-opt" if retried else ""
    print("elem st: KV-cache stores the lowering makes element by element (one-element stores in loops "
          "over the tile); docs/ascend-ub-model.md says why")
    if kv_rows:
        print(f"{kv_elementwise}/{kv_rows} KV-cache plans store the cache element by element")
    print(f"lowered {ok}/{len(jobs)} kernel plans for {facts.soc} ({len(lowered)} distinct kernels; ttir -> "
          f"linalg; the bishengir stage needs CANN and was not run{note})")
    return 0 if ok == len(jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
