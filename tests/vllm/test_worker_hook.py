"""The worker hook: plan digest exchange across two ranks, register(), the pass-manager swap.

The digest exchange runs in two real processes that initialise vLLM's distributed state on gloo
(``init_distributed_environment`` + ``ensure_model_parallel_initialized``, as every vLLM worker
does) and call the hook's exchange over vLLM's world group. Rank 1 can be given other device
facts (``VLLM_ASCEND_EXT_UB_BYTES``) to check that a disagreement raises on every rank.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_ascend_ext import vllm_integration as vi
from vllm_ascend_ext.geometry import model_geometries
from vllm_ascend_ext.ops.models import AttentionGeometry

ROOT = Path(__file__).resolve().parents[2]

RANK_SCRIPT = r"""
import os, sys, torch
os.environ.setdefault("TRITON_INTERPRET", "1")
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed.parallel_state import init_distributed_environment, ensure_model_parallel_initialized
from vllm_ascend_ext import vllm_integration as vi
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
    vi.exchange_digests(digest, rank_, world)
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
    # "vllm.distributed", not "vllm": without vLLM installed, pytest's rootdir on sys.path
    # makes this very folder importable as an (empty) namespace package called vllm.
    pytest.importorskip("vllm.distributed", reason="needs vLLM's distributed state")
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

    from vllm_ascend_ext import custom_ops
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


def test_off_switch(monkeypatch):
    monkeypatch.setenv(vi.ENV_FUSION, "0")
    assert not vi.fusion_enabled() and vi.register() is False


def test_register_is_idempotent(monkeypatch):
    pytest.importorskip("vllm.distributed")  # (see _two_ranks)
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    monkeypatch.setenv(vi.ENV_FUSION, "1")
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


def test_model_geometries_reads_layers():
    import torch

    class Attn(torch.nn.Module):
        def __init__(self, hq):
            super().__init__()
            self.num_heads, self.num_kv_heads, self.head_size = hq, 2, 32

    class Rope(torch.nn.Module):
        head_size, rotary_dim, is_neox_style = 32, 32, True

    class Norm(torch.nn.Module):
        variance_epsilon = 1e-6

    class Layer(torch.nn.Module):
        def __init__(self, hq, norm):
            super().__init__()
            self.attn, self.rotary_emb = Attn(hq), Rope()
            if norm:
                self.q_norm, self.k_norm = Norm(), Norm()

    model = torch.nn.Sequential(Layer(4, True), Layer(2, True), Layer(4, True), Layer(4, False))
    assert model_geometries(model) == (
        AttentionGeometry(4, 2, 32, 32, eps=1e-6), AttentionGeometry(2, 2, 32, 32, eps=1e-6),
        AttentionGeometry(4, 2, 32, 32, qk_norm=False))
