"""``profile`` and its workload: refused on CPU, msprof command lines, the workload's sidecar."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error
from vllm_ascend_ext.cli import workload
from vllm_ascend_ext.cli.common import detect_backend
from vllm_ascend_ext.cli.profile import msprof_script

ON_CPU = detect_backend().name == "cpu"
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "profile_msprof.sh"


@pytest.mark.skipif(not ON_CPU, reason="needs a machine without NPU and GPU")
def test_cpu_is_refused_in_one_line(cli):
    assert_one_line_error(cli("profile"), 1, "profiling needs an NPU")


def test_dry_run_on_npu_prints_both_msprof_forms(cli):
    result = cli("profile", "--backend", "npu", "--dry-run", "--model", "Qwen3-32B", "--tp", "8",
                 "--tokens", "1024", "--providers", "eager,ours")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    app = [line for line in lines if line.startswith("msprof --application=")]
    assert len(app) == 2
    assert '--provider ours --out <out>/msprof/ours --model Qwen3-32B --tp 8 --tokens 1024' in app[1]
    assert app[1].endswith('--output=<out>/msprof/ours --task-time=on --ai-core=on --aic-metrics=PipeUtilization')
    op = [line for line in lines if line.startswith("msprof op ")]
    assert len(op) == 1
    assert "--kernel-name=_split_qkv_rmsnorm_rope_kernel --launch-count=5" in op[0]
    assert "-m vllm_ascend_ext.cli.workload --provider ours --out <out>/msprof_op" in op[0]


def test_dry_run_on_cuda_names_torch_profiler(cli):
    result = cli("profile", "--backend", "cuda", "--dry-run", "--providers", "ours")
    assert result.code == 0
    assert "torch.profiler" in result.out and "trace.json" in result.out


@pytest.mark.skipif(shutil.which("msprof") is not None, reason="msprof is installed here")
def test_npu_without_msprof_is_one_line(cli, tmp_path):
    assert_one_line_error(cli("profile", "--backend", "npu", "--out", tmp_path), 1, "msprof is not on PATH")


@pytest.mark.parametrize("argv, fragment", [
    (("--providers", "ours,slow"), "--providers"),
    (("--tokens", "0"), "--tokens"),
    (("--warmup", "-1"), "--warmup"),
    (("--model", "Nope"), "unknown model"),
    (("--tp", "3"), "tp=3"),
])
def test_bad_arguments_are_one_line_errors(cli, argv, fragment):
    assert_one_line_error(cli("profile", "--backend", "npu", "--dry-run", *argv), 2, fragment)


def test_script_is_found_and_overridable(monkeypatch, tmp_path):
    assert msprof_script() == SCRIPT
    monkeypatch.setenv("VLLM_ASCEND_EXT_MSPROF_SCRIPT", str(tmp_path / "none.sh"))
    with pytest.raises(Exception, match="not found"):
        msprof_script()


def test_script_usage_and_missing_msprof():
    usage = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert usage.returncode == 2 and "OUT_DIR" in usage.stdout
    env = dict(os.environ, PATH="/usr/bin:/bin")
    missing = subprocess.run(["bash", str(SCRIPT), "/tmp/unused"], capture_output=True, text=True, env=env)
    assert missing.returncode == 1 and "msprof is not on PATH" in missing.stderr


@pytest.mark.skipif(not ON_CPU, reason="sizes chosen for the CPU interpreter")
@pytest.mark.parametrize("provider", ["eager", "ours"])
def test_workload_runs_and_writes_its_sidecar(tmp_path, provider):
    code = workload.main(["--provider", provider, "--model", "Qwen3-32B", "--tp", "8", "--tokens", "2",
                          "--iterations", "2", "--warmup", "1", "--backend", "cpu", "--out", str(tmp_path)])
    assert code == 0
    meta = json.loads((tmp_path / "workload.json").read_text())
    assert meta == {"provider": provider, "model": "Qwen3-32B", "tp": 8, "tokens": 2, "dtype": "bf16",
                    "cache_dtype": "fp32", "iterations": 3, "device": "cpu"}


def test_workload_bad_input_is_one_line(capsys):
    assert workload.main(["--tokens", "0", "--backend", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tokens" in err[0]
