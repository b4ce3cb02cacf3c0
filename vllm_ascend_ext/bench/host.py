"""Host time per call (``vllm-ascend-ext bench --host``): what a call costs the CPU, at T = 1.

Outside captured graphs the host issues every launch, so a call's Python is latency as much as
its kernel. Per op and geometry this times an eager loop of calls (``CALLS`` after a warm-up,
best of ``ROUNDS``; the device synchronised once at each end, so a host slower than the device
is what is measured) for:

* ``add_``: ``torch.Tensor.add_`` on a small tensor, one ATen launch: the floor of any op;
* ``unfused``: the prologue as vLLM runs it unfused in eager (split, views, RMSNorm, RoPE);
* ``ours``: our op called directly (``vllm_ascend_ext.ops``), through the launch cache;
* ``launch`` (direct Triton launch only, CUDA): the op's launches of one call replayed with every
  argument fixed (:func:`launch_replay`): Triton's compiled launcher alone, what a launch costs below
  our Python; ours minus it is the key, the lookup and the outputs. Beside it the meta's
  ``new_empty`` and ``view``: one output allocation (``qkv.new_empty(1, 4096)``) and one column view
  of qkv, the primitives the outputs are made of. The direct path cannot cost less than its
  launches and its outputs;
* ``key``: the launch cache's hit alone, as one call of ``ours`` takes it (:func:`key_replay`:
  the key computed from the call's arguments, the lookup, the token-count check). Launches,
  outputs and key together are what no cached call avoids;
* ``torch.ops``: the custom op through the dispatcher (what a compiled graph calls);
* ``compiled`` (CUDA only): a ``torch.compile``\\ d function (no CUDA graph) calling the custom
  op, minus the same compiled function without it;
* ``empty`` and ``compiled empty`` (the prologue's rows): ``torch.ops`` and ``compiled`` for an
  empty op of the prologue's schema (:func:`empty_op`: it allocates the outputs as ours does and
  launches nothing): what any op of that schema costs there, so that ours minus it is what our
  validation-free path (key, plan lookup, launch) adds.

The ops: the prologue (plain, gated q, mRoPE, v-norm geometries), its in-place form, the KV-cache
write, the TP norm at TP 1, and the MLA prologue's two launches (``split_qkv_rmsnorm_rope_mla``
writing the MLA cache, and the q side ``mla_q_rope_``) of DeepSeek-V3 at :data:`MLA_TP` (``unfused``
and ``compiled`` are ``-`` there: not measured). CPU runs go through the Triton interpreter: their figures say
nothing of an accelerator's host path, only that the mode works. On the ``meta`` device
(``--meta``) every tensor is a ``meta`` tensor: the ops validate, look up the launch cache, plan
and allocate, and launch nothing, so the figures are the Python around the launch on this CPU
(``torch.ops`` then redispatches to the CPU implementation: the Meta key would run the fake).
``report.write_host_outputs`` writes the files.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from unittest import mock

import torch

from .cases import make_inputs, make_mla_case
from .catalog import OP
from .harness import run_meta, triton_version
from .prologue import unfused_prologue

__all__ = ["CALLS", "CASES", "EMPTY_NAMESPACE", "MLA_TP", "ROUNDS", "HostRow", "compiled_delta", "empty_op",
           "each_launch", "format_host_table", "key_replay", "launch_replay", "per_call", "run_host"]

#: Calls per timed loop on an accelerator (the issue's bar asks for at least 1000), and rounds.
CALLS = 2000
ROUNDS = 3
#: On CPU every call runs the interpreter: a few calls show that the mode works.
CPU_CALLS = 3

#: The TP size of the MLA rows (DeepSeek-V3's 128 q heads over 8 ranks: 16 a rank; the latent whole).
MLA_TP = 8
#: (label, model, op variant): the geometries and ops timed (the MLA rows' model is a row of
#: ``ops.models.MLA_MODELS``, at :data:`MLA_TP`).
CASES = (
    ("Qwen3-8B", "Qwen3-8B", "prologue"),
    ("Qwen3-8B", "Qwen3-8B", "inplace"),
    ("Qwen3-8B", "Qwen3-8B", "kv_cache"),
    ("Qwen3-Next (gated)", "Qwen3-Next-80B-A3B", "prologue"),
    ("Qwen3-VL (mRoPE)", "Qwen3-VL-8B", "prologue"),
    ("Gemma-4 (v-norm)", "Gemma-4-31B:sliding", "prologue"),
    ("MiniMax-M2 TP1", "MiniMax-M2", "tp"),
    ("DeepSeek-V3 TP8 (MLA)", "DeepSeek-V3", "mla"),
    ("DeepSeek-V3 TP8 (MLA)", "DeepSeek-V3", "mla_q_rope"),
)
#: The op each variant calls.
OP_OF = {"prologue": "split_qkv_rmsnorm_rope", "inplace": "split_qkv_rmsnorm_rope_",
         "kv_cache": "split_qkv_rmsnorm_rope_kv_cache", "tp": "split_qkv_tp_rmsnorm_rope",
         "mla": "split_qkv_rmsnorm_rope_mla", "mla_q_rope": "mla_q_rope_"}


@dataclass
class HostRow:
    """One op and geometry: host µs per call of each provider (``None``: not measured here)."""

    case: str
    op: str
    add_: float
    unfused: float | None
    ours: float
    torch_ops: float
    compiled_delta: float | None
    empty_ops: float | None = None
    empty_compiled_delta: float | None = None
    launch: float | None = None
    key: float | None = None


def per_call(fn, calls: int, rounds: int, device: torch.device) -> float:
    """Best of ``rounds`` loops of ``calls`` calls: µs per call (the device synchronised at the
    ends only)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(rounds):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def _case(model: str, variant: str, device: torch.device):
    """The direct call, the custom-op call and the unfused eager call of one case (callables)."""
    from ..kernels import custom_ops, mla_ops  # noqa: F401  (register torch.ops.vllm_ascend_ext)
    from ..ops import (split_qkv_rmsnorm_rope, split_qkv_rmsnorm_rope_kv_cache,
                      split_qkv_tp_rmsnorm_rope)
    from ..ops.models import model as spec

    ops = torch.ops.vllm_ascend_ext
    if device.type == "meta":  # the real implementation through the dispatcher, not the fake
        ops = _Redispatched(ops, torch._C.DispatchKeySet(torch._C.DispatchKey.CPU))
    if variant in ("mla", "mla_q_rope"):
        return _mla_case(model, variant, device, ops)
    geometry = spec(model)
    if variant == "tp":
        args = make_inputs(geometry, 1, device)
        hd = geometry.head_dim
        tp = {n: args[n] for n in ("qkv", "cos_sin_cache", "positions", "num_q_heads", "num_kv_heads", "head_dim",
                                   "eps")}
        tp.update(q_weight=torch.rand(geometry.num_q_heads * hd, device=device, dtype=args["qkv"].dtype),
                  k_weight=torch.rand(geometry.num_kv_heads * hd, device=device, dtype=args["qkv"].dtype))
        order = ("qkv", "q_weight", "k_weight", "cos_sin_cache", "positions", "num_q_heads", "num_kv_heads",
                 "head_dim", "eps")
        return (lambda: split_qkv_tp_rmsnorm_rope(**tp),
                lambda: ops.split_qkv_tp_rmsnorm_rope(*(tp[n] for n in order), 1, geometry.is_neox), None, tp)
    args = make_inputs(geometry, 1, device)
    positional = [args.pop(n) for n in ("qkv", "q_weight", "k_weight", "cos_sin_cache", "positions",
                                        "num_q_heads", "num_kv_heads", "head_dim", "eps")]
    qkv, q_weight, k_weight, cache, positions = positional[:5]
    keywords = args
    if variant == "kv_cache":
        blocks = torch.zeros(64, 16, geometry.num_kv_heads, geometry.head_dim, dtype=qkv.dtype, device=device)
        caches = (blocks, torch.zeros_like(blocks))
        slots = torch.zeros(1, dtype=torch.int64, device=device)
        kv_pos = positional[:5] + [*caches, slots] + positional[5:]
        return (lambda: split_qkv_rmsnorm_rope_kv_cache(*kv_pos, **keywords),
                lambda: ops.split_qkv_rmsnorm_rope_kv_cache(*kv_pos, **keywords), None, None)
    if variant == "inplace":
        return (lambda: split_qkv_rmsnorm_rope(*positional, inplace=True, **keywords),
                lambda: ops.split_qkv_rmsnorm_rope_(*positional, **keywords), None, None)
    return (lambda: split_qkv_rmsnorm_rope(*positional, **keywords),
            lambda: ops.split_qkv_rmsnorm_rope(*positional, **keywords),
            lambda: unfused_prologue(*positional, **keywords), (positional, keywords))


def _mla_case(model: str, variant: str, device: torch.device, ops):
    """The direct and custom-op calls of an MLA case: the prologue writing the combined MLA cache
    (``"mla"``), or the q side's RoPE in place (``"mla_q_rope"``); the benchmark's inputs
    (``cases.make_mla_case``, T = 1), drawn on the CPU and moved for a ``meta`` run."""
    from ..ops import mla_q_rope_, split_qkv_rmsnorm_rope_mla
    from ..ops.models import mla_model

    spec = mla_model(model)
    case = make_mla_case(spec, spec.heads_at(MLA_TP), 1, "cpu" if device.type == "meta" else device)
    moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in case["args"].items()}
    q, kv_cache, slots = (case[k].to(device) for k in ("q", "kv_cache", "slot_mapping"))
    if variant == "mla_q_rope":
        rope = (moved["cos_sin_cache"], moved["positions"], moved["rope_dim"])
        return (lambda: mla_q_rope_(q, *rope, is_neox=spec.is_neox),
                lambda: ops.mla_q_rope_(q, *rope, is_neox=spec.is_neox), None, None)
    positional = [moved[n] for n in ("qkv_lora", "q_a_weight", "kv_a_weight", "cos_sin_cache", "positions",
                                     "q_lora_rank", "kv_lora_rank", "rope_dim", "eps")]
    cache = dict(is_neox=spec.is_neox, kv_cache=kv_cache, slot_mapping=slots)
    return (lambda: split_qkv_rmsnorm_rope_mla(*positional, **cache),
            lambda: ops.split_qkv_rmsnorm_rope_mla(*positional, **cache), None, None)


class _Redispatched:
    """``torch.ops.vllm_ascend_ext`` whose ops redispatch to the implementation of ``keys``."""

    def __init__(self, ops, keys):
        self._ops, self._keys = ops, keys

    def __getattr__(self, name):
        return self.one(getattr(self._ops, name), self._keys)

    @staticmethod
    def one(op, keys):
        """``op`` (an ``OpOverloadPacket``) redispatched to the implementation of ``keys`` (a
        ``DispatchKeySet`` or one ``DispatchKey``)."""
        if isinstance(keys, torch._C.DispatchKey):
            keys = torch._C.DispatchKeySet(keys)
        overload = op.default
        return lambda *args, **kwargs: overload.redispatch(keys, *args, **kwargs)


def each_launch(direct, visit) -> None:
    """Run ``direct()`` with each of its bound kernels' launches handed to ``visit(bound, grid,
    sources, runtime_values, launch)`` instead (``launch``: the real ``BoundKernel.__call__``,
    which ``visit`` calls with the first four to launch)."""
    from ..ops.triton_launcher import BoundKernel

    launch = BoundKernel.__call__
    with mock.patch.object(BoundKernel, "__call__", lambda bound, *call: visit(bound, *call, launch)):
        direct()


def launch_replay(direct):
    """The launches of one ``direct()`` call, each replayed with its arguments fixed
    (:meth:`~vllm_ascend_ext.ops.triton_launcher.BoundKernel.replay`), as one callable; ``None``
    where a launch is not direct (the interpreter, triton-ascend) or nothing launches (``meta``)."""
    calls = []

    def record(bound, grid, sources, runtime_values, launch):
        calls.append(bound.replay(grid, sources, runtime_values))
        launch(bound, grid, sources, runtime_values)

    each_launch(direct, record)
    return None if None in calls else _in_turn(calls)


def key_replay(direct):
    """The launch-cache hits of one ``direct()`` call, replayed: :func:`.launch_cache.prepared`
    called again on each one's arguments (the key, the lookup and the token-count check; the entry
    is there, so nothing validates), as one callable; ``None`` where the call took no cache."""
    from ..ops import launch_cache

    hits = []
    prepared = launch_cache.prepared

    def record(*args):
        hits.append(functools.partial(prepared, *args))
        return prepared(*args)

    with mock.patch.object(launch_cache, "prepared", record):
        direct()
    return _in_turn(hits)


def _in_turn(calls: list):
    """One callable that makes each of ``calls`` in turn (the only one itself); ``None`` for none."""
    if not calls:
        return None
    if len(calls) == 1:
        return calls[0]
    return lambda: [call() for call in calls]


#: The namespace of :func:`empty_op` (the benchmark's own: nothing else registers in it).
EMPTY_NAMESPACE = "vllm_ascend_ext_bench"
#: The empty op's library once defined, and its ``[T, 0]`` outputs per (dtype, device).
_EMPTY_LIB: list = []
_EMPTY_ZERO: dict = {}


def empty_op():
    """``torch.ops.vllm_ascend_ext_bench.split_qkv_rmsnorm_rope``: the prologue's functional schema
    with an implementation that validates nothing and launches nothing, only allocates the outputs
    as ours does (q and k, v with ``v_norm``, the gate with ``q_gate``, ``[T, 0]`` tensors made once
    per token count otherwise); defined once per process, on every device key ours has."""
    from ..kernels.schema import DISPATCH_KEYS, OP_NAME, schemas

    if not _EMPTY_LIB:
        lib = torch.library.Library(EMPTY_NAMESPACE, "FRAGMENT")
        lib.define(schemas(OP_NAME)[0])
        for key in DISPATCH_KEYS:
            lib.impl(OP_NAME, _empty_impl, key)
        torch.library.register_fake(f"{EMPTY_NAMESPACE}::{OP_NAME}", _empty_impl, lib=lib)
        _EMPTY_LIB.append(lib)
    return getattr(getattr(torch.ops, EMPTY_NAMESPACE), OP_NAME)


def _empty_impl(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps=1e-6, *,
                q_gate=False, v_norm=False, **_):
    from ..ops.launch_cache import ZeroWidth

    tokens, q_cols, kv_cols = qkv.shape[0], num_q_heads * head_dim, num_kv_heads * head_dim
    if isinstance(qkv, torch._subclasses.FakeTensor):  # traced: no shared [T, 0] tensors
        zero = (qkv.new_empty(tokens, 0), qkv.new_empty(tokens, 0))
    else:
        made = _EMPTY_ZERO.get((qkv.dtype, qkv.device))
        if made is None:
            made = _EMPTY_ZERO[(qkv.dtype, qkv.device)] = ZeroWidth(qkv.dtype, qkv.device, 2)
        zero = made(tokens)
    return (qkv.new_empty(tokens, q_cols), qkv.new_empty(tokens, kv_cols),
            qkv.new_empty(tokens, kv_cols) if v_norm else zero[0], qkv.new_empty(tokens, q_cols) if q_gate else zero[1])


def compiled_delta(op, positional, keywords, calls: int, rounds: int, device: torch.device) -> float:
    """µs a compiled function (no CUDA graph) spends more when it calls ``op`` (a functional op
    whose first output is q, on qkv and the other ``positional`` arguments)."""
    import torch._inductor.config as inductor_config

    qkv = positional[0]

    def without(qkv):
        return qkv * 2

    def with_op(*positional):
        return positional[0] * 2, op(*positional, **keywords)[0]

    # Each case compiles afresh: the cases share these functions' code objects, and Dynamo would
    # otherwise check every earlier case's guards (failing) before finding this one's. Compiled in
    # this process: no pool of compile workers left running beside the timed loops.
    torch._dynamo.reset()
    without_c = torch.compile(without, dynamic=False)
    with_c = torch.compile(with_op, dynamic=False)
    with inductor_config.patch(compile_threads=1):
        base = per_call(lambda: without_c(qkv), calls, rounds, device)
        full = per_call(lambda: with_c(*positional), calls, rounds, device)
    return full - base


def run_host(device: torch.device, cases=CASES, calls: int | None = None, rounds: int = ROUNDS) -> dict:
    """Time every case on ``device``; ``{"meta": ..., "rows": [HostRow, ...]}``."""
    calls = calls or (CALLS if device.type != "cpu" else CPU_CALLS)  # meta: no launch, the full loop
    rounds = rounds if device.type != "cpu" else 1
    floor_tensor = torch.zeros(16, device=device)
    add = per_call(lambda: floor_tensor.add_(1), calls, rounds, device)
    rows = []
    with torch.inference_mode():
        qkv = torch.zeros(1, 6144, dtype=torch.bfloat16, device=device)
        primitives = {"new_empty": per_call(lambda: qkv.new_empty(1, 4096), calls, rounds, device),
                      "view": per_call(lambda: qkv[:, 4096:5120], calls, rounds, device)}
        for label, model, variant in cases:
            direct, through_ops, unfused, extra = _case(model, variant, device)
            compiled = empty = empty_compiled = None
            if variant == "prologue" and extra is not None:
                positional, keywords = extra
                empty_ops = empty_op()
                if device.type == "meta":
                    empty_ops = _Redispatched.one(empty_ops, torch._C.DispatchKey.CPU)
                empty = per_call(lambda: empty_ops(*positional, **keywords), calls, rounds, device)
                if device.type == "cuda":
                    compiled = compiled_delta(torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope, *extra, calls,
                                              rounds, device)
                    empty_compiled = compiled_delta(empty_op(), *extra, calls, rounds, device)
            ours = per_call(direct, calls, rounds, device)
            replay = launch_replay(direct)
            hits = key_replay(direct)
            rows.append(HostRow(
                case=label, op=OP_OF[variant],
                add_=add, unfused=None if unfused is None else per_call(unfused, calls, rounds, device),
                ours=ours, torch_ops=per_call(through_ops, calls, rounds, device),
                compiled_delta=compiled, empty_ops=empty, empty_compiled_delta=empty_compiled,
                launch=None if replay is None else per_call(replay, calls, rounds, device),
                key=None if hits is None else per_call(hits, calls, rounds, device)))
    meta = {"mode": "host", "device": run_meta(device, OP)["device"], "calls": calls, "rounds": rounds,
            "tokens": 1, "torch": torch.__version__, "triton": triton_version(), **primitives}
    return {"meta": meta, "rows": rows}


def format_host_table(result: dict) -> str:
    """The rows as a text table, µs per call."""
    def cell(value):
        return "-" if value is None else f"{value:.1f}"

    meta = result["meta"]
    head = (f"{'case':22s} {'op':34s} {'add_':>6s} {'unfused':>8s} {'ours':>6s} {'launch':>6s} {'key':>5s} "
            f"{'torch.ops':>9s} {'compiled+':>9s} {'empty':>6s} {'empty compiled+':>15s}")
    lines = [f"host us per call, T = 1 ({meta['device']}, {meta['calls']} calls, best of {meta['rounds']}); "
             f"new_empty {meta['new_empty']:.1f}, a view {meta['view']:.1f}", head]
    for r in result["rows"]:
        lines.append(f"{r.case:22s} {r.op:34s} {cell(r.add_):>6s} {cell(r.unfused):>8s} {cell(r.ours):>6s} "
                     f"{cell(r.launch):>6s} {cell(r.key):>5s} {cell(r.torch_ops):>9s} {cell(r.compiled_delta):>9s} "
                     f"{cell(r.empty_ops):>6s} {cell(r.empty_compiled_delta):>15s}")
    return "\n".join(lines)
