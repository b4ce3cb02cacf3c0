"""Probe (issue 28): the prologue as a ``torch.library.triton_op``, whose launch Inductor emits in
the compiled code, against our custom op and the empty op of its schema, host µs at T = 1.

    python -P scripts/probe_triton_op.py [--model Qwen3-8B] [--calls 2000]

The probe's op (``vllm_ascend_ext_probe::split_qkv_rmsnorm_rope``) takes qkv, the two weights, the
cos/sin cache and positions of one geometry and returns q and k: its body allocates them and
launches our kernel through ``torch.library.wrap_triton`` with the arguments our call object binds
for T = 1 (``Prepared.bound_for``: validation and plan are done once, outside the trace). That is
the best case of the route: the plan and grid are fixed when the function is traced, which a graph
of symbolic token count (vLLM's) would have to express in T; the AscendC route has no Triton
kernel to wrap. Prints, on CUDA, what a ``torch.compile``\\ d function (no CUDA graph) spends more
with each op (``bench --host``'s ``compiled+``), and each op called through ``torch.ops``; on the
CPU (the interpreter: no compiled timing) only that the probe's op returns what ours does. Needs
the package importable (``pip install -e .``, or ``PYTHONPATH`` on the layout
``scripts/gpu_tests.sh`` builds).
"""

from __future__ import annotations

import argparse
import importlib

import torch

#: The probe's namespace (nothing else registers in it).
NAMESPACE = "vllm_ascend_ext_probe"
#: Launch options the probe drops (Triton's dependent launch: not tried through ``wrap_triton``).
DROPPED_OPTIONS = ("launch_pdl",)


def triton_op_for(kwargs: dict):
    """The probe's op for the call ``kwargs`` (the prologue's arguments by name, T = 1, no
    ``q_gate``/``v_norm``/in place: one q and one k output): defined once per process."""
    prologue = importlib.import_module("vllm_ascend_ext.ops.split_qkv_rmsnorm_rope")
    from vllm_ascend_ext.ops import launch_cache, validation

    args = dict(kwargs)
    args.setdefault("eps", 1e-6)
    prepared = launch_cache.prepared(launch_cache.LaunchCache("probe_triton_op"), args,
                                     validation.split_qkv_rmsnorm_rope, prologue.Prepared, prologue.TOKEN_KEYS)
    qkv = args["qkv"]
    q_cols, kv_cols = prepared.q_cols, prepared.kv_cols
    inputs = {name: args.get(name) for name in prologue.INPUTS}  # biases etc.: fixed, not op arguments

    def sources(qkv, q, k, q_weight, k_weight, cos_sin_cache, positions):
        named = dict(inputs, q_weight=q_weight, k_weight=k_weight, cos_sin_cache=cos_sin_cache, positions=positions)
        return (qkv, q, k, None, None, *(named[n] for n in prologue.INPUTS), None)

    first = (qkv, qkv.new_empty(1, q_cols), qkv.new_empty(1, kv_cols), args["q_weight"], args["k_weight"],
             args["cos_sin_cache"], args["positions"])
    grid, bound = prepared.bound_for(1, sources(*first))

    @torch.library.triton_op(f"{NAMESPACE}::split_qkv_rmsnorm_rope", mutates_args=())
    def op(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, cos_sin_cache: torch.Tensor,
           positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = qkv.shape[0]
        q, k = qkv.new_empty(tokens, q_cols), qkv.new_empty(tokens, kv_cols)
        launch = bound.kwargs(sources(qkv, q, k, q_weight, k_weight, cos_sin_cache, positions), (tokens, 0))
        for name in DROPPED_OPTIONS:
            launch.pop(name, None)
        torch.library.wrap_triton(prologue.split_qkv_rmsnorm_rope_kernel)[(grid,)](**launch)
        return q, k

    return op


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen3-8B")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()

    from vllm_ascend_ext.bench.cases import make_inputs
    from vllm_ascend_ext.bench.host import compiled_delta, empty_op, per_call
    from vllm_ascend_ext.kernels import custom_ops  # noqa: F401  (registers torch.ops.vllm_ascend_ext)
    from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope
    from vllm_ascend_ext.ops.models import model

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    geometry = model(args.model)
    if geometry.q_gate or geometry.v_norm:
        parser.error(f"--model {args.model}: the probe's op returns q and k only (no gate, no v-norm)")
    kwargs = make_inputs(geometry, 1, device)
    op = triton_op_for(kwargs)
    names = ("qkv", "q_weight", "k_weight", "cos_sin_cache", "positions")
    mine = [kwargs[n] for n in names]
    counts = ("num_q_heads", "num_kv_heads", "head_dim")
    rest = {n: v for n, v in kwargs.items() if n not in names + counts}
    with torch.inference_mode():
        q, k = op(*mine)
        want_q, want_k, _ = split_qkv_rmsnorm_rope(**kwargs)
        same = torch.equal(q, want_q) and torch.equal(k, want_k)
        print(f"triton_op output == ours: {same}")
        if not same:
            raise SystemExit(1)
        if device.type != "cuda":
            return
        positional = [kwargs[n] for n in names + counts]
        print(f"host us per call, T = 1, {args.model}, {torch.cuda.get_device_name()}, {args.calls} calls, best of 3")
        rows = {
            "ours, torch.ops": (torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope, positional, rest),
            "empty op, torch.ops": (empty_op(), positional, rest),
            "triton_op, torch.ops": (op, mine, {}),
        }
        for label, (fn, pos, kw) in rows.items():
            eager = per_call(lambda fn=fn, pos=pos, kw=kw: fn(*pos, **kw), args.calls, 3, device)
            compiled = compiled_delta(fn, pos, kw, args.calls, 3, device)
            print(f"{label:22s} {eager:7.1f}   compiled+ {compiled:7.1f}")
        from torch._inductor.utils import run_and_get_code

        torch._dynamo.reset()
        _, (code, *_) = run_and_get_code(torch.compile(lambda *a: op(*a)[0], dynamic=False), *mine)
        itself = "split_qkv_rmsnorm_rope_kernel" in code and "torch.ops.vllm_ascend_ext_probe" not in code
        print(f"compiled code launches the kernel itself: {itself}")


if __name__ == "__main__":
    main()
