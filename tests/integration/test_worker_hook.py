"""The worker hook: plan digest exchange across two ranks, register(), the pass-manager swap,
the warm-up's fallback for a geometry whose compile fails, and our variables as vLLM sees them.

The digest exchange runs in two real processes that initialise vLLM's distributed state on gloo
(``init_distributed_environment`` + ``ensure_model_parallel_initialized``, as every vLLM worker
does) and call the hook's exchange over vLLM's world group. Rank 1 can be given other device
facts (``VLLM_ASCEND_EXT_UB_BYTES``) to check that a disagreement raises on every rank.

The warm-up tests stub the op (no vLLM, no kernel); the tests that need vLLM skip without it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from vllm_ascend_ext.kernels import custom_ops, impl, mla_ops
from vllm_ascend_ext.passes import mla_fusion
from vllm_ascend_ext.hook import vllm_integration as vi
from vllm_ascend_ext.hook import warmup as wu
from vllm_ascend_ext.hook.geometry import model_geometries, module_geometry
from vllm_ascend_ext.ops import settings
from vllm_ascend_ext.ops.models import AttentionGeometry

#: The vllm suite runs the whole module (the tests that need vLLM skip without it; the others run
#: in both environments).
pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]

RANK_SCRIPT = r"""
import os, sys, torch
os.environ.setdefault("TRITON_INTERPRET", "1")
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed.parallel_state import init_distributed_environment, ensure_model_parallel_initialized
from vllm_ascend_ext.hook import vllm_integration as vi
from vllm_ascend_ext.ops.models import AttentionGeometry
rank, port = int(sys.argv[1]), sys.argv[2]
with set_current_vllm_config(VllmConfig()):
    init_distributed_environment(2, rank, f"tcp://127.0.0.1:{port}", rank, "gloo")
    ensure_model_parallel_initialized(2, 1)
device = torch.device("cpu")
facts = vi.read_facts(device)
geos = [AttentionGeometry(16, 2, 128, 128), AttentionGeometry(16, 2, 128, 64, qk_norm=False)]
digest = vi.plan_digest(facts, vi.build_plans(device, geos, torch.bfloat16))
rank_, world, _ = vi._world()
try:
    vi.exchange_digests(digest)
    print(f"rank {rank}: agreed {digest[:12]}", flush=True)
except vi.PlanMismatchError as exc:
    print(f"rank {rank}: MISMATCH {exc}", flush=True)
# Shut down as a vLLM worker does. Left to interpreter exit, gloo's threads can still be
# joinable when their destructors run, and the rank aborts ("terminate called without an
# active exception"): CI saw it once, and 1 run in 10 did here before this.
from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel
torch.distributed.barrier()
destroy_model_parallel()
destroy_distributed_environment()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_ranks(rank1_env: dict) -> list[str]:
    pytest.importorskip("vllm", reason="needs vLLM's distributed state")
    port = str(_free_port())
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, TRITON_INTERPRET="1", **(rank1_env if rank == 1 else {}))
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(rank), port], cwd=ROOT,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out[-4000:]
        outs.append(out)
    return outs


def test_two_ranks_agree():
    outs = _two_ranks({})
    lines = [next(line for line in out.splitlines() if line.startswith("rank ")) for out in outs]
    assert lines[0].startswith("rank 0: agreed") and lines[1].startswith("rank 1: agreed")
    assert lines[0].split()[-1] == lines[1].split()[-1]


def test_two_ranks_disagree_raise_on_both():
    outs = _two_ranks({"VLLM_ASCEND_EXT_UB_BYTES": str(64 * 1024)})
    for rank, out in enumerate(outs):
        line = next(line for line in out.splitlines() if line.startswith(f"rank {rank}:"))
        assert "MISMATCH" in line and "ranks [0]" in line and "ranks [1]" in line


@pytest.mark.parametrize("backend", ["ascend", "cuda"])
def test_warm_up_runs_each_digested_plan(monkeypatch, backend):
    import torch

    from vllm_ascend_ext.kernels import custom_ops
    from vllm_ascend_ext.ops import tiling

    calls = []
    monkeypatch.setattr(custom_ops, "functional_op",
                        lambda: lambda qkv, *args, **kwargs: calls.append(qkv.shape[0]))
    geos = [AttentionGeometry(16, 2, 128, 128), AttentionGeometry(8, 1, 256, 64, qk_norm=False)]
    device = torch.device("cpu")
    with tiling.forced(backend):
        plans = vi.build_plans(device, geos, torch.bfloat16)
        vi.warm_up(device, geos, torch.bfloat16)
    assert calls == [p["tokens"] for p in plans]
    assert len(plans) == len(geos) * (2 if backend == "cuda" else 1)


def test_compare_digests_names_ranks():
    vi.compare_digests(["a" * 64] * 3)
    with pytest.raises(vi.PlanMismatchError, match=r"ranks \[0, 2\].*ranks \[1\]"):
        vi.compare_digests(["a" * 64, "b" * 64, "a" * 64])


@pytest.mark.parametrize("value", ["0", "off", "No", " FALSE "])
def test_off_switch(monkeypatch, value):
    monkeypatch.setenv(settings.FUSION, value)
    assert not settings.fusion_enabled() and vi.register() is False


@pytest.mark.parametrize("value", ["disable", "2", "of"])
def test_bad_fusion_value_raises_naming_the_variable(monkeypatch, value):
    # VLLM_ASCEND_EXT_FUSION=disable once meant "on" (vLLM logged fused 2/2).
    monkeypatch.setenv(settings.FUSION, value)
    with pytest.raises(settings.SettingError, match=f"VLLM_ASCEND_EXT_FUSION='{value}'"):
        vi.register()


def test_register_is_idempotent(monkeypatch):
    pytest.importorskip("vllm", reason="needs vLLM")
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    monkeypatch.setenv(settings.FUSION, "1")
    monkeypatch.setattr(WorkerWrapperBase, "init_device", WorkerWrapperBase.init_device)
    assert vi.register() and vi.register()
    wrapped = WorkerWrapperBase.init_device
    assert getattr(wrapped, vi._MARK)
    assert not getattr(wrapped.__wrapped__, vi._MARK, False)  # wrapped exactly once


def test_init_package_has_no_vllm_import():
    code = "import sys, vllm_ascend_ext; assert 'vllm' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_replace_in_pass_manager_drops_their_pass_only():
    class QKNormRopeFusionPass:  # stand-in with vllm-ascend's pass's class name
        pass

    class Other:
        pass

    class StandInGraphFusionPassManager:  # stand-in for vllm-ascend's GraphFusionPassManager
        def __init__(self):
            self.passes = []

        def configure(self, config):
            self.passes += [QKNormRopeFusionPass(), Other()]

    vi.replace_in_pass_manager(StandInGraphFusionPassManager)
    vi.replace_in_pass_manager(StandInGraphFusionPassManager)  # idempotent
    manager = StandInGraphFusionPassManager()
    manager.configure(None)
    assert [type(p).__name__ for p in manager.passes] == ["Other"]


class _Attn(torch.nn.Module):
    def __init__(self, hq):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_size = hq, 2, 32


class _Rope(torch.nn.Module):
    head_size, rotary_dim, is_neox_style = 32, 32, True


class _Norm(torch.nn.Module):
    variance_epsilon = 1e-6


class _Layer(torch.nn.Module):
    """An attention layer as :mod:`vllm_ascend_ext.hook.geometry` reads one: ``hq``/2/32."""

    def __init__(self, hq, norm=True):
        super().__init__()
        self.attn, self.rotary_emb = _Attn(hq), _Rope()
        self.proj = torch.nn.Linear(2, 2, dtype=torch.bfloat16)  # the model dtype read by the hook
        if norm:
            self.q_norm, self.k_norm = _Norm(), _Norm()


def test_model_geometries_reads_layers():
    model = torch.nn.Sequential(_Layer(4), _Layer(2), _Layer(4), _Layer(4, norm=False))
    assert model_geometries(model) == (
        AttentionGeometry(4, 2, 32, 32, eps=1e-6), AttentionGeometry(2, 2, 32, 32, eps=1e-6),
        AttentionGeometry(4, 2, 32, 32, qk_norm=False))


# ---- the issue-10 variants, read as vLLM 0.32's modules carry them --------------------------


class _MRope(_Rope):
    """``MRotaryEmbedding``'s attributes (Qwen3-VL 8B: sections [24, 20, 20] interleaved)."""

    head_size, rotary_dim = 128, 128

    def __init__(self, section=(24, 20, 20), interleaved=True):
        super().__init__()
        self.mrope_section, self.mrope_interleaved = list(section), interleaved


class GemmaRMSNorm(_Norm):
    """Named as vLLM's (``Qwen3NextRMSNorm`` is an alias of it): the q/k norm is ``x * (1 + w)``."""


class _WeightlessNorm(_Norm):
    has_weight = False


def _module(hq, hkv, d, rope, **attrs):
    """An attention module with vLLM's attribute names (``attn``, ``rotary_emb``, norms, flags)."""
    module = torch.nn.Module()
    module.attn = types.SimpleNamespace(num_heads=hq, num_kv_heads=hkv, head_size=d)
    module.rotary_emb = rope
    for name, value in attrs.items():
        setattr(module, name, value)
    return module


def _rope(d, r, **attrs):
    rope = types.SimpleNamespace(head_size=d, rotary_dim=r, is_neox_style=True)
    rope.__dict__.update(attrs)
    return rope


QWEN3_VL = AttentionGeometry(32, 8, 128, 128, eps=1e-6, mrope_section=(24, 20, 20), mrope_interleaved=True)
QWEN25_VL = AttentionGeometry(28, 4, 128, 128, qk_norm=False, mrope_section=(16, 24, 24))
QWEN3_NEXT = AttentionGeometry(16, 2, 256, 64, weight_offset=1.0, eps=1e-6, q_gate=True)
QWEN35 = AttentionGeometry(16, 2, 256, 64, weight_offset=1.0, eps=1e-6, q_gate=True, mrope_section=(11, 11, 10),
                           mrope_interleaved=True)
GEMMA4 = AttentionGeometry(8, 1, 256, 256, eps=1e-6, v_norm=True)
GEMMA4_Q_ONLY = AttentionGeometry(8, 0, 512, 512, eps=1e-6)


@pytest.mark.parametrize("module, want", [
    (_module(32, 8, 128, _MRope(), q_norm=_Norm(), k_norm=_Norm()), QWEN3_VL),
    (_module(28, 4, 128, _rope(128, 128, mrope_section=[16, 24, 24], mrope_interleaved=False)), QWEN25_VL),
    (_module(16, 2, 256, _rope(256, 64), q_norm=GemmaRMSNorm(), k_norm=GemmaRMSNorm(), attn_output_gate=True),
     QWEN3_NEXT),
    (_module(16, 2, 256, _rope(256, 64, mrope_section=[11, 11, 10], mrope_interleaved=True), q_norm=GemmaRMSNorm(),
             k_norm=GemmaRMSNorm(), attn_output_gate=True), QWEN35),
    (_module(8, 1, 256, _rope(256, 256), q_norm=_Norm(), k_norm=_Norm(), v_norm=_WeightlessNorm(),
             is_kv_shared_layer=False), GEMMA4),
    # a KV-shared layer: attn keeps the target layer's kv heads, the prologue has none
    (_module(8, 1, 512, _rope(512, 512), q_norm=_Norm(), is_kv_shared_layer=True), GEMMA4_Q_ONLY),
    # a v-norm with a weight is not the op's: q and k are fused, v's norm stays in the graph
    (_module(8, 1, 256, _rope(256, 256), q_norm=_Norm(), k_norm=_Norm(), v_norm=_Norm()),
     AttentionGeometry(8, 1, 256, 256, eps=1e-6)),
    # vLLM's own fused gated kernel serves it (CUDA): not ours
    (_module(16, 2, 256, _rope(256, 64), q_norm=GemmaRMSNorm(), k_norm=GemmaRMSNorm(), attn_output_gate=True,
             use_fused_qk_norm_rope_gate=True), None),
    # sections the op cannot serve (not three; not summing to R/2)
    (_module(32, 8, 128, _rope(128, 128, mrope_section=[32, 32]), q_norm=_Norm(), k_norm=_Norm()), None),
    (_module(32, 8, 128, _rope(128, 128, mrope_section=[24, 20, 21]), q_norm=_Norm(), k_norm=_Norm()), None),
    # a KV-shared layer without a q norm has no prologue the op serves
    (_module(8, 1, 512, _rope(512, 512), is_kv_shared_layer=True), None),
], ids=["qwen3-vl", "qwen2.5-vl", "qwen3-next", "qwen3.5", "gemma4", "gemma4-q-only", "weighted-v-norm",
        "vllm-fused-gate", "two-sections", "sections-not-r/2", "q-only-no-norm"])
def test_module_geometry_reads_the_variants(module, want):
    assert module_geometry(module) == want


def _recording_op(seen):
    def op(qkv, q_weight, k_weight, cache, positions, hq, hkv, d, eps, **kwargs):
        seen.append(dict(qkv=tuple(qkv.shape), q_weight=q_weight is not None, k_weight=k_weight is not None,
                         positions=tuple(positions.shape), **kwargs))

    return op


def test_warm_up_calls_every_variant_as_the_pass_will(monkeypatch):
    # mRoPE with [3, T] positions, the gate with a (2*Hq + 2*Hkv)*D wide qkv, a q-only layer
    # without k weight, and a v-norm geometry twice: with the v-norm and without it (what the
    # pass fuses where it cannot prove the graph's v-norm weightless).
    calls: list = []
    monkeypatch.setattr(custom_ops, "functional_op", lambda: _recording_op(calls))
    assert vi.warm_up(CPU, [QWEN3_VL, QWEN35, GEMMA4, GEMMA4_Q_ONLY], torch.bfloat16) == {}
    assert [(c["positions"], c["qkv"], c["k_weight"], c["q_gate"], c["v_norm"], c["mrope_section"],
             c["mrope_interleaved"], c["weight_offset"]) for c in calls] == [
        ((3, 1), (1, 48 * 128), True, False, False, [24, 20, 20], True, 0.0),
        ((3, 1), (1, 36 * 256), True, True, False, [11, 11, 10], True, 1.0),
        ((1,), (1, 10 * 256), True, False, True, None, False, 0.0),
        ((1,), (1, 10 * 256), True, False, False, None, False, 0.0),
        ((1,), (1, 8 * 512), False, False, False, None, False, 0.0)]


def test_warm_up_failure_of_a_variant_is_keyed_by_its_features(fallback, hook_log, monkeypatch):
    fallback.fail = lambda hq, q_weight: hq == 8  # the Gemma-4 layers
    state = vi.WorkerState(device=CPU, backend="ascend", facts=vi.read_facts(CPU))
    vi.settle_geometries(state, [QWEN3_VL, GEMMA4, GEMMA4_Q_ONLY], torch.bfloat16)
    assert state.geometries == [QWEN3_VL] and list(state.unfused) == [GEMMA4, GEMMA4_Q_ONLY]
    keys = [key for key, _ in fallback.recorded]
    assert keys == [_key(GEMMA4, features=frozenset({"v_norm"})), _key(GEMMA4),
                    _key(GEMMA4_Q_ONLY, features=frozenset({"q_only"}))]
    # AscendC is asked per variant, until one it cannot serve (then the geometry is unfused)
    assert [asked["features"] for _, asked in fallback.asked] == [frozenset({"v_norm"}), frozenset({"q_only"})]
    assert fallback.asked[1][1]["weight_dtypes"] == (torch.bfloat16,)  # q's weight only
    assert len(_warnings(hook_log)) == 2
    # The digest covers the fused geometry's variant plans only.
    assert state.digest == vi.plan_digest(state.facts, vi.build_plans(CPU, [QWEN3_VL], torch.bfloat16))


def test_call_features_are_the_validators():
    assert vi.call_features(QWEN3_VL, torch.bfloat16) == {"mrope"}
    assert vi.call_features(QWEN35, torch.bfloat16) == {"mrope", "q_gate"}
    assert vi.call_features(GEMMA4, torch.bfloat16) == {"v_norm"}
    assert vi.call_features(GEMMA4_Q_ONLY, torch.bfloat16) == {"q_only"}
    assert vi.op_variants(GEMMA4) == [GEMMA4, AttentionGeometry(8, 1, 256, 256, eps=1e-6)]


def test_warm_up_runs_the_real_op_for_every_variant():
    # The real op (Triton interpreter), small geometries of each family: nothing fails.
    small = [AttentionGeometry(2, 1, 16, 16, mrope_section=(3, 3, 2), mrope_interleaved=True),
             AttentionGeometry(2, 1, 16, 8, qk_norm=False, mrope_section=(2, 1, 1)),
             AttentionGeometry(2, 1, 16, 8, weight_offset=1.0, q_gate=True, mrope_section=(2, 1, 1),
                               mrope_interleaved=True),
             AttentionGeometry(2, 1, 16, 16, v_norm=True), AttentionGeometry(2, 0, 16, 16)]
    assert vi.warm_up(CPU, small, torch.float32) == {}


# ---- warm-up compile failures: record, route to AscendC or leave unfused ---------------------

WIDE, NARROW = AttentionGeometry(4, 2, 32, 32, eps=1e-6), AttentionGeometry(2, 2, 32, 32, eps=1e-6)
NARROW_NO_NORM = AttentionGeometry(2, 2, 32, 32, qk_norm=False)
CPU = torch.device("cpu")
FAILURE = "forced compile failure for this test\nsecond line, not part of the reason"


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def hook_log():
    """The package logger's records at INFO and above (caplog cannot see them: the logger stops
    propagating once register() configured it)."""
    handler, level = _Records(), vi.logger.level
    vi.logger.setLevel(logging.INFO)
    vi.logger.addHandler(handler)
    yield handler
    vi.logger.removeHandler(handler)
    vi.logger.setLevel(level)


@pytest.fixture
def fallback(monkeypatch):
    """Stub the op (raising where ``fail(hq, q_weight)`` says so), record what the hook tells
    :mod:`vllm_ascend_ext.kernels.impl`, and let a test say whether AscendC can serve."""
    seen = types.SimpleNamespace(recorded=[], asked=[], calls=[], ascendc_reason="no AscendC here",
                                 fail=lambda hq, q_weight: hq == 2)

    def op(qkv, q_weight, k_weight, cache, positions, hq, *args, **kwargs):
        seen.calls.append(hq)
        if seen.fail(hq, q_weight):
            raise RuntimeError(FAILURE)

    def ascendc_unavailable_reason(device, **kwargs):
        seen.asked.append((device, kwargs))
        return seen.ascendc_reason

    monkeypatch.delenv(settings.IMPL, raising=False)  # auto
    monkeypatch.setattr(custom_ops, "functional_op", lambda: op)
    monkeypatch.setattr(impl, "record_triton_failure", lambda key, reason: seen.recorded.append((key, reason)))
    monkeypatch.setattr(impl, "ascendc_unavailable_reason", ascendc_unavailable_reason)
    return seen


def _load(model) -> vi.WorkerState:
    """Run the hook's after-load step on ``model`` as a CPU worker's."""
    state = vi.WorkerState(device=CPU, backend="ascend", facts=vi.read_facts(CPU))
    vi.after_load_model(types.SimpleNamespace(get_model=lambda: model), state)
    return state


def _warnings(log) -> list[str]:
    return [r.getMessage() for r in log.records if r.levelno >= logging.WARNING]


def _key(geo, dtype=torch.bfloat16, features=frozenset()):
    return impl.geometry_key(geo.num_q_heads, geo.num_kv_heads, geo.head_dim, geo.rotary_dim, dtype,
                             geo.is_neox, features=features)


def test_warm_up_failure_leaves_the_geometry_unfused(fallback, hook_log):
    state = _load(torch.nn.Sequential(_Layer(4), _Layer(2)))
    reason = "RuntimeError: forced compile failure for this test"
    assert state.geometries == [WIDE]
    assert list(state.unfused) == [NARROW] and reason in state.unfused[NARROW] and not state.ascendc
    assert fallback.recorded == [(_key(NARROW), reason)]
    assert fallback.asked == [(CPU, dict(dtype=torch.bfloat16, head_dim=32,
                                         weight_dtypes=(torch.bfloat16, torch.bfloat16),
                                         cache_dtype=torch.bfloat16, features=frozenset()))]
    warnings = _warnings(hook_log)
    assert len(warnings) == 1
    assert NARROW.label in warnings[0] and "left unfused" in warnings[0] and reason in warnings[0]
    assert "no AscendC fallback (no AscendC here)" in warnings[0] and "second line" not in warnings[0]
    # The digest covers what is fused: the plans of WIDE only.
    assert state.digest == vi.plan_digest(state.facts, vi.build_plans(CPU, [WIDE], torch.bfloat16))
    summary = next(r.getMessage() for r in hook_log.records if "agreed by all ranks" in r.getMessage())
    assert "2 attention geometries [4/2/32; 2/2/32 (unfused)]" in summary


@pytest.mark.parametrize("mode", ["triton", "ascendc"])
def test_no_fallback_unless_the_impl_is_auto(fallback, hook_log, monkeypatch, mode):
    fallback.ascendc_reason = None
    monkeypatch.setenv(settings.IMPL, mode)
    state = _load(torch.nn.Sequential(_Layer(4), _Layer(2)))
    assert state.geometries == [WIDE] and list(state.unfused) == [NARROW] and not state.ascendc
    warnings = _warnings(hook_log)
    assert len(warnings) == 1 and f"VLLM_ASCEND_EXT_IMPL={mode} allows no fallback" in warnings[0]


def test_warm_up_failure_routed_to_ascendc_stays_fused(fallback, hook_log):
    fallback.ascendc_reason = None
    state = _load(torch.nn.Sequential(_Layer(4), _Layer(2)))
    reason = "RuntimeError: forced compile failure for this test"
    assert state.geometries == [WIDE, NARROW]
    assert state.ascendc == {NARROW: reason} and not state.unfused
    assert fallback.recorded == [(_key(NARROW), reason)]
    warnings = _warnings(hook_log)
    assert len(warnings) == 1
    assert NARROW.label in warnings[0] and "AscendC kernel serves it" in warnings[0] and reason in warnings[0]
    triton_only = vi.plan_digest(state.facts, vi.build_plans(CPU, [WIDE], torch.bfloat16))
    all_triton = vi.plan_digest(state.facts, vi.build_plans(CPU, [WIDE, NARROW], torch.bfloat16))
    assert state.digest not in (triton_only, all_triton)


def test_no_failure_fuses_everything_without_warnings(fallback, hook_log):
    fallback.fail = lambda hq, q_weight: False
    state = _load(torch.nn.Sequential(_Layer(4), _Layer(2)))
    assert state.geometries == [WIDE, NARROW] and not state.unfused and not state.ascendc
    assert fallback.recorded == [] and fallback.asked == [] and _warnings(hook_log) == []
    assert fallback.calls == [4, 2]
    assert state.digest == vi.plan_digest(state.facts, vi.build_plans(CPU, [WIDE, NARROW], torch.bfloat16))


def test_geometry_sharing_a_failed_key_goes_the_same_way(fallback, hook_log):
    # NARROW and NARROW_NO_NORM share impl's key: once NARROW is recorded as failed, the op would
    # route both to AscendC, so without AscendC both stay unfused. One warning each.
    fallback.fail = lambda hq, q_weight: hq == 2 and q_weight is not None
    state = _load(torch.nn.Sequential(_Layer(4), _Layer(2), _Layer(2, norm=False)))
    assert state.geometries == [WIDE] and list(state.unfused) == [NARROW, NARROW_NO_NORM]
    assert [key for key, _ in fallback.recorded] == [_key(NARROW)]
    warnings = _warnings(hook_log)
    assert len(warnings) == 2
    assert NARROW.label in warnings[0] and NARROW_NO_NORM.label in warnings[1]
    assert "shares its Triton kernel key with 2/2/32" in warnings[1]


def test_a_bad_setting_is_not_taken_for_a_compile_failure(fallback):
    def raise_setting_error(hq, q_weight):
        raise settings.SettingError("VLLM_ASCEND_EXT_IMPL='tritton': expected one of auto, triton, ascendc")

    fallback.fail = raise_setting_error
    with pytest.raises(settings.SettingError, match="VLLM_ASCEND_EXT_IMPL"):
        _load(torch.nn.Sequential(_Layer(4)))
    assert fallback.recorded == []


def test_pass_counts_the_unfused_geometries(fallback):
    # What install_pass hands the compiler: fuse state.geometries, count the unfused ones too.
    from vllm_ascend_ext.passes.fusion import QKNormRoPEFusionPass

    state = _load(torch.nn.Sequential(_Layer(4), _Layer(2)))
    pass_ = QKNormRoPEFusionPass(lambda: state.geometries, counted=lambda: [*state.geometries, *state.unfused])
    assert pass_.geometries() == (WIDE,) and set(pass_.counted_geometries()) == {WIDE, NARROW}


# ---- MLA geometries: warm-up of both launches, a failure leaves MLA unfused -----------------


class DeepseekScalingRotaryEmbedding(torch.nn.Module):
    """Named as vLLM's (the MLA step reads the rope's class names); fp32 cache as DeepSeek's."""

    def __init__(self, r):
        super().__init__()
        self.head_size = self.rotary_dim = r
        self.is_neox_style = False
        self.register_buffer("cos_sin_cache", torch.zeros(16, r))


class _MLAAttn(torch.nn.Module):
    def __init__(self, name):
        super().__init__()
        self.layer_name = name


class _MLALayer(torch.nn.Module):
    """A ``MultiHeadLatentAttentionWrapper`` as :func:`vllm_ascend_ext.passes.mla_fusion.module_mla_geometry`
    reads one: q latent ``lq`` (0: none), kv latent 16, rope 8, 2 heads of 8 + 8 lanes."""

    def __init__(self, name, lq=24):
        super().__init__()
        self.q_lora_rank, self.kv_lora_rank, self.qk_rope_head_dim, self.qk_nope_head_dim = lq or None, 16, 8, 8
        self.num_heads = 2
        self.kv_a_layernorm = _Norm()
        self.q_a_layernorm = _Norm() if lq else None
        self.mla_attn, self.rotary_emb = _MLAAttn(name), DeepseekScalingRotaryEmbedding(8)
        self.proj = torch.nn.Linear(2, 2, dtype=torch.bfloat16)


MLA_Q, MLA_NO_Q = (mla_fusion.MLAGeometry(24, 16, 8, 8, 2, 1e-6), mla_fusion.MLAGeometry(0, 16, 8, 8, 2, 1e-6))


def _mla_state(layout=None, block_size=None) -> vi.WorkerState:
    return vi.WorkerState(device=CPU, backend="ascend", facts=vi.read_facts(CPU), mla_cache_layout=layout,
                          mla_block_size=block_size)


def test_mla_warm_up_compiles_the_cache_write_where_the_pass_fuses_it():
    layers = mla_fusion.model_mla_layers(torch.nn.Sequential(_MLALayer("a"), _MLALayer("b"), _MLALayer("c", 0)))
    assert list(layers) == [MLA_Q, MLA_NO_Q] and [len(v) for v in layers.values()] == [2, 1]
    layout = {"a": (False, "not verified"), "b": (True, ""), "c": (False, "not verified")}.get
    cases = vi.mla_warm_up_cases(_mla_state(layout, 16), layers, torch.bfloat16)
    assert cases == [wu.MLAWarmUp(MLA_Q, torch.float32, 16), wu.MLAWarmUp(MLA_NO_Q, torch.float32, None)]
    # the cache-write step off (no layout): no cache write compiled
    assert [c.block_size for c in vi.mla_warm_up_cases(_mla_state(None, 16), layers, torch.bfloat16)] == [None] * 2


def _glue_calls(geo, dtype, block_size, monkeypatch, tokens=5, num_blocks=7):
    """Call the MLA step's replacements as the compiled graph does: the glue op's implementation
    (the prologue with the layer's cache, found through a stubbed forward context) and
    ``mla_q_rope_`` on the GEMM output viewed per head (without a q latent, the glue op rotating
    that q itself)."""
    width = geo.kv_lora_rank + geo.rope_dim
    cache = torch.zeros(num_blocks, block_size, width, dtype=dtype)
    slots = torch.arange(tokens, dtype=torch.int64)
    monkeypatch.setattr(mla_fusion, "attention_context", lambda name: (None, cache, slots))
    head = geo.nope_dim + geo.rope_dim
    x = torch.randn(tokens, geo.q_lora_rank + width, dtype=dtype)
    cos_sin, positions = torch.randn(64, geo.rope_dim), torch.arange(tokens)
    weights = (torch.ones(geo.q_lora_rank, dtype=dtype) if geo.q_lora_rank else None,
               torch.ones(geo.kv_lora_rank, dtype=dtype))
    q = torch.randn(tokens, geo.num_heads * head, dtype=dtype).reshape(-1, geo.num_heads, head)
    mla_fusion._glue_impl(x, *weights, cos_sin, positions, geo.q_lora_rank, geo.kv_lora_rank, geo.rope_dim,
                          geo.eps, is_neox=geo.is_neox, layer_name="layer", kv_cache_dtype="auto", k_scale=None,
                          q=None if geo.q_lora_rank else q)
    assert cache.any()  # the cache write ran
    if geo.q_lora_rank:
        mla_ops.q_rope_op()(q, cos_sin, positions, geo.rope_dim, is_neox=geo.is_neox)


@pytest.mark.kernel
@pytest.mark.parametrize("geo", [MLA_Q, MLA_NO_Q], ids=["q_lora", "no_q_lora"])
def test_mla_warm_up_compiles_what_the_pass_calls(geo, monkeypatch):
    # The real ops (Triton interpreter): every kernel specialisation the pass's calls bind (other
    # token and block counts) was bound by the warm-up; without the cache case, the glue op's is not.
    import importlib

    import launch_keys

    from vllm_ascend_ext.ops import launch_cache

    mla_module = importlib.import_module("vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_mla")  # not the function

    dtype, record = torch.bfloat16, functools.partial(launch_keys.recording, mla_module,
                                                      do_not_specialize=launch_keys.MLA_DO_NOT_SPECIALIZE)
    for block_size, covered in ((16, True), (None, False)):
        launch_cache.clear()
        with record([]) as warmed:
            assert vi.mla_warm_up(CPU, [wu.MLAWarmUp(geo, torch.float32, block_size)], dtype) == {}
        launch_cache.clear()
        with record([]) as called:
            _glue_calls(geo, dtype, 16, monkeypatch)
        launches = 1 + bool(geo.q_lora_rank)  # the prologue, and mla_q_rope_ where there is a q latent
        assert len(warmed) == launches + bool(block_size) and len(called) == launches
        assert (set(called) <= set(warmed)) is covered, (called, warmed)


@pytest.fixture
def failing_mla(monkeypatch):
    """Make the MLA prologue's warm-up call raise (the q side untouched)."""
    calls = []

    def op(*args, **kwargs):
        calls.append(kwargs.get("kv_cache") is not None)
        raise RuntimeError(FAILURE)

    monkeypatch.setattr(mla_ops, "mla_op", lambda: op)
    return calls


def test_mla_warm_up_failure_leaves_mla_unfused(fallback, failing_mla, hook_log):
    fallback.fail = lambda hq, q_weight: False
    state = _load(torch.nn.Sequential(_Layer(4), _MLALayer("a"), _MLALayer("b", 0)))
    reason = "RuntimeError: forced compile failure for this test"
    assert state.geometries == [WIDE] and state.mla_geometries == []
    assert state.mla_unfused == {MLA_Q: reason, MLA_NO_Q: reason}
    assert failing_mla == [False, False]  # one call each: a failed geometry's other calls are not made
    warnings = _warnings(hook_log)
    assert len(warnings) == 1 and "MLA geometries left unfused" in warnings[0]
    assert MLA_Q.label in warnings[0] and MLA_NO_Q.label in warnings[0] and "second line" not in warnings[0]
    summary = next(r.getMessage() for r in hook_log.records if "agreed by all ranks" in r.getMessage())
    assert f"3 attention geometries [4/2/32; {MLA_Q.label} (unfused); {MLA_NO_Q.label} (unfused)]" in summary
    # the digest is the GQA geometries' alone, as if the model had no MLA layer
    assert state.digest == vi.plan_digest(state.facts, vi.build_plans(CPU, [WIDE], torch.bfloat16))
    # the MLA step the hook installs fuses what is left: nothing
    step = mla_fusion.MLAFusion(lambda: state.mla_geometries)
    assert step.geometries() == ()


def test_mla_warm_up_runs_both_launches_and_digests_their_plans(fallback, hook_log, monkeypatch):
    fallback.fail = lambda hq, q_weight: False
    calls = []
    monkeypatch.setattr(mla_ops, "mla_op", lambda: lambda *a, **k: calls.append(("prologue", k.get("kv_cache"))))
    monkeypatch.setattr(mla_ops, "q_rope_op", lambda: lambda q, *a, **k: calls.append(("q_rope", q)))
    state = _load(torch.nn.Sequential(_Layer(4), _MLALayer("a")))
    assert state.mla_geometries == [MLA_Q] and not state.mla_unfused and _warnings(hook_log) == []
    assert [(kind, None if v is None else tuple(v.shape)) for kind, v in calls] == [
        ("prologue", None), ("q_rope", (1, 2, 16))]
    gqa_only = vi.plan_digest(state.facts, vi.build_plans(CPU, [WIDE], torch.bfloat16))
    assert state.digest != gqa_only  # the MLA plans are part of it


def test_mla_layer_with_fuse_qkv_rmsnorm_is_skipped_and_said(fallback, hook_log):
    # GLM-5-Next's spelling (docs/vllm-integration.md, MLA): not fused, one INFO line with the reason.
    fallback.fail = lambda hq, q_weight: False
    glm = _MLALayer("b")
    glm.fuse_qkv_rmsnorm = True
    model = torch.nn.Sequential(_MLALayer("a"), glm, _MLALayer("c", 0))
    assert mla_fusion.mla_skip_reason(glm) == mla_fusion.FUSED_QKV_RMSNORM_REASON
    assert mla_fusion.model_mla_skipped(model) == {mla_fusion.FUSED_QKV_RMSNORM_REASON: 1}
    state = _load(model)
    assert state.mla_geometries == [MLA_Q, MLA_NO_Q] and not state.mla_unfused
    lines = [r.getMessage() for r in hook_log.records if r.levelno == logging.INFO]
    assert f"vllm_ascend_ext: 1 MLA layer not fused: {mla_fusion.FUSED_QKV_RMSNORM_REASON}" in lines


# ---- our variables as vLLM sees them --------------------------------------------------------

OUR_VLLM_NAMES = [name for name in settings.names() if name.startswith("VLLM_")]
#: A valid value of each of our VLLM_* variables, and what vllm.envs reads it as.
VALID = {
    settings.FUSION: ("off", False),
    settings.IMPL: ("Triton", "triton"),
    settings.SOC: ("ascend910b4", "Ascend910B4"),
    settings.UB_BYTES: ("0x10000", 65536),
    settings.VECTOR_CORES: ("20", 20),
    settings.NUM_SMS: ("78", 78),
    settings.CUDA_PDL: ("Off", False),
    settings.ASCENDC_LIB: ("/opt/lib.so", Path("/opt/lib.so")),
    settings.BUILD_ASCENDC: ("no", False),
    settings.MSPROF_SCRIPT: ("/opt/msprof.sh", Path("/opt/msprof.sh")),
    settings.TEST_DEVICE: ("CPU", "cpu"),
    settings.KV_CACHE_FUSION: ("Off", False),
    settings.ASCEND_KV_UPDATE: ("yes", True),
}


def test_every_vllm_variable_has_a_typed_reader():
    assert {n for n in settings.READERS if n.startswith("VLLM_")} == set(OUR_VLLM_NAMES) == set(VALID)


@pytest.fixture
def vllm_envs(monkeypatch):
    """vLLM's variable table, restored afterwards; no foreign unknown VLLM_* variable set."""
    pytest.importorskip("vllm", reason="needs vLLM")
    from vllm import envs

    monkeypatch.setattr(envs, "environment_variables", {k: v for k, v in envs.environment_variables.items()
                                                        if k not in OUR_VLLM_NAMES})
    for name in list(os.environ):
        if name.startswith("VLLM_") and name not in envs.environment_variables:
            monkeypatch.delenv(name)
    return envs


def test_vllm_knows_our_variables(vllm_envs, monkeypatch):
    from vllm.platforms import current_platform, interface

    for name, (value, _) in VALID.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="Unknown vLLM environment variable detected: VLLM_ASCEND_EXT_"):
        current_platform.validate_environ(True)  # as vLLM was before the plugin declared them
    assert vi.register() is False  # switched off (VALID's FUSION is "off"), variables declared
    assert vi.declare_environment_variables() == []  # idempotent
    current_platform.validate_environ(True)  # fail_on_environ_validation: no longer refused
    warned = []
    monkeypatch.setattr(interface.logger, "warning", lambda *args, **kwargs: warned.append(args))
    current_platform.validate_environ(False)
    assert warned == []
    for name, (_, parsed) in VALID.items():
        assert getattr(vllm_envs, name) == parsed
    factors = vllm_envs.compile_factors()  # every getter called, none skipped
    assert all(name in factors for name in OUR_VLLM_NAMES)


def _vllm_process(code: str, env: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh process (vLLM loads its plugins once per process, through our
    installed entry point) with a tiny model config in ``tmp_path``."""
    pytest.importorskip("vllm", reason="needs vLLM")
    from run_tiny import MODELS

    (tmp_path / "config.json").write_text(json.dumps(MODELS["qwen3"]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_ASCEND_EXT_")} | env
    return subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)


ENGINE_CONFIG = """
import sys
from vllm.engine.arg_utils import EngineArgs
for hard_fail in (False, True):
    EngineArgs(model=sys.argv[1], skip_tokenizer_init=True,
               fail_on_environ_validation=hard_fail).create_engine_config()
    print("engine config built, fail_on_environ_validation", hard_fail, flush=True)
"""


def test_vllm_engine_accepts_our_variables(tmp_path):
    proc = _vllm_process(ENGINE_CONFIG, {settings.FUSION: "0", settings.SOC: "ascend910b3"}, tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "engine config built, fail_on_environ_validation True" in log
    assert "Unknown vLLM environment variable" not in log


def test_vllm_engine_refuses_a_bad_fusion_value(tmp_path):
    proc = _vllm_process(ENGINE_CONFIG, {settings.FUSION: "disable"}, tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "engine config built" not in log
    assert "SettingError: VLLM_ASCEND_EXT_FUSION='disable'" in log
