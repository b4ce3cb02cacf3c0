"""``vllm-ascend-ext bench --host`` and its probe ``scripts/profile_host.py``, on the CPU (smoke:
the figures mean nothing here, the mode and its files are what is checked)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from vllm_ascend_ext.bench import host, report

ROOT = Path(__file__).resolve().parents[2]


def test_host_mode_writes_its_table(tmp_path):
    result = host.run_host(torch.device("cpu"), cases=host.CASES[:1] + host.CASES[-1:], calls=1)
    rows = result["rows"]
    assert [r.op for r in rows] == ["split_qkv_rmsnorm_rope", "split_qkv_tp_rmsnorm_rope"]
    assert all(r.ours > 0 and r.torch_ops > 0 and r.add_ > 0 for r in rows)
    assert rows[0].unfused > 0 and rows[1].unfused is None
    text = host.format_host_table(result)
    paths = report.write_host_outputs(result, tmp_path, text=text)
    assert {p.name for p in paths} >= {"bench_host.csv", "bench_host.json", "bench_host.txt"}
    assert json.loads((tmp_path / "bench_host.json").read_text())["meta"]["tokens"] == 1
    assert all(p.parent == tmp_path for p in tmp_path.iterdir())


def test_meta_host_mode_runs_the_real_path_without_launching():
    """``--meta``: every op's Python (validation, launch cache, plan, allocation) on meta tensors,
    through torch.ops into the real implementation (not the fake), nothing launched."""
    from vllm_ascend_ext.ops import launch_cache

    launch_cache.clear()
    result = host.run_host(torch.device("meta"), calls=2, rounds=1)
    assert len(result["rows"]) == len(host.CASES) and result["meta"]["device"] == "meta"
    assert all(r.ours > 0 and r.torch_ops > 0 for r in result["rows"])
    stats = launch_cache.stats()
    assert stats["impl.split_qkv_rmsnorm_rope"][2] > 0  # torch.ops reached the selector, not the fake


def test_profile_host_script_runs():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-P", str(ROOT / "scripts" / "profile_host.py"), "--calls", "1",
                          "--top", "3"], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "split_qkv_rmsnorm_rope (direct)" in out.stdout and "function calls" in out.stdout
