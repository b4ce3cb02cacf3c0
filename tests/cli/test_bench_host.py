"""``vllm-ascend-ext bench --host`` and its probes ``scripts/profile_host.py`` and
``scripts/probe_triton_op.py``, on the CPU (smoke:
the figures mean nothing here, the mode and its files are what is checked)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vllm_ascend_ext.bench import host, report

ROOT = Path(__file__).resolve().parents[2]


def test_host_mode_writes_its_table(tmp_path):
    """The prologue, the TP norm and both MLA launches on the CPU: each op timed directly and
    through torch.ops, ``-`` where a column does not apply, and the files."""
    cases = (host.CASES[0], *[c for c in host.CASES if c[2] in ("tp", "mla", "mla_q_rope")])
    result = host.run_host(torch.device("cpu"), cases=cases, calls=1)
    rows = result["rows"]
    assert [r.op for r in rows] == ["split_qkv_rmsnorm_rope", "split_qkv_tp_rmsnorm_rope", "split_qkv_rmsnorm_rope_mla",
                                    "mla_q_rope_"]
    assert all(r.ours > 0 and r.torch_ops > 0 and r.add_ > 0 and r.compiled_delta is None for r in rows)
    assert rows[0].unfused > 0 and all(r.unfused is None for r in rows[1:])
    assert rows[0].empty_ops > 0 and all(r.empty_ops is None and r.empty_compiled_delta is None for r in rows[1:])
    text = host.format_host_table(result)
    mla_lines = [line.split() for line in text.splitlines() if line.startswith("DeepSeek-V3 TP8 (MLA)")]
    assert [(line[3], line[5], line[7], line[10], line[11], line[12]) for line in mla_lines] == [
        ("split_qkv_rmsnorm_rope_mla", "-", "-", "-", "-", "-"), ("mla_q_rope_", "-", "-", "-", "-", "-")]
    assert all(r.launch is None for r in rows)  # the interpreter: no direct launch to replay
    assert all(r.key > 0 for r in rows)
    assert result["meta"]["new_empty"] > 0 and result["meta"]["view"] > 0
    paths = report.write_host_outputs(result, tmp_path, text=text)
    assert {p.name for p in paths} >= {"bench_host.csv", "bench_host.json", "bench_host.txt"}
    saved = json.loads((tmp_path / "bench_host.json").read_text())
    assert saved["meta"]["tokens"] == 1 and [r["op"] for r in saved["rows"]] == [r.op for r in rows]
    assert all(p.parent == tmp_path for p in tmp_path.iterdir())


def test_meta_host_mode_runs_the_real_path_without_launching():
    """``--meta``: every op's Python (validation, launch cache, plan, allocation) on meta tensors,
    through torch.ops into the real implementation (not the fake), nothing launched."""
    from vllm_ascend_ext.ops import launch_cache

    launch_cache.clear()
    result = host.run_host(torch.device("meta"), calls=2, rounds=1)
    assert len(result["rows"]) == len(host.CASES) and result["meta"]["device"] == "meta"
    assert all(r.ours > 0 and r.torch_ops > 0 and r.launch is None for r in result["rows"])
    assert all((r.empty_ops is not None) == (r.op == "split_qkv_rmsnorm_rope") for r in result["rows"])
    assert {r.op for r in result["rows"]} >= {"split_qkv_rmsnorm_rope_mla", "mla_q_rope_"}
    stats = launch_cache.stats()
    assert stats["impl.split_qkv_rmsnorm_rope"][2] > 0  # torch.ops reached the selector, not the fake
    # The MLA ops have no selector: each direct call (3 warm-ups + 2) is one lookup of its launch cache,
    # so more hits than those mean torch.ops reached the op too.
    assert stats["split_qkv_rmsnorm_rope_mla"][2] > 5 and stats["mla_q_rope_"][2] > 5


def test_key_replay_is_a_hit_and_nothing_else():
    """``key``: the replayed ``prepared`` finds the direct call's entry each time: no validation,
    no new entry, and the entry it returns is the one the call used."""
    from vllm_ascend_ext.ops import launch_cache

    meta = torch.device("meta")
    direct = host._case("Qwen3-8B", "prologue", meta)[0]
    launch_cache.clear()
    direct()
    entries, misses, hits = launch_cache.stats()["split_qkv_rmsnorm_rope"]
    replay = host.key_replay(direct)
    found = [replay() for _ in range(3)]
    assert launch_cache.stats()["split_qkv_rmsnorm_rope"] == (entries, misses, hits + 4)  # the recorded call, 3 replays
    assert entries == 1 and all(entry is found[0] for entry in found)
    assert isinstance(found[0], launch_cache.PlannedLaunches)


def test_profile_host_script_runs():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-P", str(ROOT / "scripts" / "profile_host.py"), "--calls", "1",
                          "--top", "3"], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "split_qkv_rmsnorm_rope (direct)" in out.stdout and "function calls" in out.stdout


def test_profile_host_script_stubs_the_launcher():
    """``--stub-launch``: every host case's direct call through the direct path (the written-out
    launch, a no-op launcher), its arguments checked against the bound template's (the script
    exits non-zero on a difference), timed, then profiled."""
    out = subprocess.run([sys.executable, "-P", str(ROOT / "scripts" / "profile_host.py"), "--stub-launch",
                          "--calls", "1", "--top", "40"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    timed = [line for line in out.stdout.splitlines() if line.endswith(" us")]
    assert len(timed) == len(host.CASES) + 1
    assert "<direct launch of" in out.stdout and "<launch-cache key>" in out.stdout


@pytest.mark.full  # 12 s of Inductor on the CPU; the module is linted either way
def test_profile_host_script_profiles_a_compiled_call():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-P", str(ROOT / "scripts" / "profile_host.py"), "--calls", "1",
                          "--top", "3", "--compiled"], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "compiled function with the custom op" in out.stdout and "function calls" in out.stdout


def test_probe_triton_op_script_returns_what_ours_does():
    # On the CPU the probe checks its triton_op (eager: the interpreter) against our op, and stops.
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-P", str(ROOT / "scripts" / "probe_triton_op.py"), "--calls", "1"],
                         capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["triton_op output == ours: True"]


def test_probe_triton_op_script_refuses_a_gated_model():
    out = subprocess.run([sys.executable, "-P", str(ROOT / "scripts" / "probe_triton_op.py"), "--model",
                          "Qwen3-Next-80B-A3B"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 2 and "no gate" in out.stderr.splitlines()[-1], out.stderr[-2000:]
