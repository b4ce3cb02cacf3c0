"""``profile`` and its workload: refused on CPU, msprof command lines, the workload's sidecar."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error
from vllm_ascend_ext.cli import profile, workload
from vllm_ascend_ext.devices import detect_device
from vllm_ascend_ext.cli.profile import msprof_script

ON_CPU = detect_device().name == "cpu"
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
    assert "--kernel-name=split_qkv_rmsnorm_rope_kernel --launch-count=5" in op[0]
    assert "-m vllm_ascend_ext.cli.workload --provider ours --out <out>/msprof_op" in op[0]


def test_dry_run_on_cuda_names_torch_profiler(cli):
    result = cli("profile", "--backend", "cuda", "--dry-run", "--providers", "ours")
    assert result.code == 0
    assert "torch.profiler" in result.out and "trace.json" in result.out


@pytest.fixture
def npu_here(monkeypatch):
    """Pretend an NPU is attached (nothing may actually run on it)."""
    from vllm_ascend_ext.cli import common

    monkeypatch.setattr(common, "unavailable_reason", lambda name: None)

    def ran(*args, **kwargs):
        raise AssertionError("something ran")

    monkeypatch.setattr(profile.subprocess, "run", ran)


@pytest.mark.skipif(shutil.which("msprof") is not None, reason="msprof is installed here")
def test_npu_without_msprof_is_one_line(cli, tmp_path, npu_here):
    assert_one_line_error(cli("profile", "--backend", "npu", "--out", tmp_path), 1, "msprof is not on PATH")


@pytest.mark.parametrize("backend, device", [("cuda", "CUDA GPU"), ("npu", "Ascend NPU")])
def test_absent_device_is_one_line_pointing_at_doctor(cli, tmp_path, backend, device):
    from vllm_ascend_ext.devices import unavailable_reason

    if unavailable_reason(backend) is None:
        pytest.skip(f"this machine has a {device}")
    result = cli("profile", "--backend", backend, "--out", tmp_path / "out")
    assert_one_line_error(result, 2, f"--backend {backend}", device, "vllm-ascend-ext doctor")
    assert not (tmp_path / "out").exists()


def test_unwritable_out_is_refused_before_profiling(cli, tmp_path, monkeypatch, npu_here):
    monkeypatch.setattr(profile.shutil, "which", lambda name: "/opt/fake/msprof")
    blocker = tmp_path / "file"
    blocker.write_text("")
    for out in (blocker, blocker / "sub"):
        assert_one_line_error(cli("profile", "--backend", "npu", "--out", out), 2, "--out", str(out))


def test_malformed_environment_is_refused_before_profiling(cli, tmp_path, monkeypatch, npu_here):
    monkeypatch.setattr(profile.shutil, "which", lambda name: "/opt/fake/msprof")
    monkeypatch.setenv("VLLM_ASCEND_EXT_NUM_SMS", "many")
    assert_one_line_error(cli("profile", "--backend", "npu", "--out", tmp_path / "out"), 2,
                          "VLLM_ASCEND_EXT_NUM_SMS='many'")
    assert not (tmp_path / "out").exists()


def test_model_whose_geometry_the_op_refuses_is_one_line(cli, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 514}))
    assert_one_line_error(cli("profile", "--backend", "npu", "--dry-run", "--model", config), 2,
                          str(config), "head_dim")


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
    other = tmp_path / "mine.sh"
    other.write_text("")
    monkeypatch.setenv("VLLM_ASCEND_EXT_MSPROF_SCRIPT", f" {other} ")
    assert msprof_script() == other


def test_blank_script_variable_means_unset(monkeypatch):
    """The variable is read through ops.settings: blank is unset, as for every variable."""
    monkeypatch.setenv("VLLM_ASCEND_EXT_MSPROF_SCRIPT", "  ")
    assert msprof_script() == SCRIPT


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


def _workload(*argv):
    return workload.main(["--model", "Qwen3-32B", "--tp", "8", "--tokens", "2", "--iterations", "1",
                          "--warmup", "0", *map(str, argv)])


@pytest.fixture
def no_workload(monkeypatch):
    """Make running the workload fail the test: what must be refused is refused first."""
    def built(*args, **kwargs):
        raise AssertionError("the workload ran")

    monkeypatch.setattr(workload, "make_call", built)


def test_workload_unwritable_out_is_refused_before_running(tmp_path, capsys, no_workload):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert _workload("--backend", "cpu", "--out", blocker / "sub") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out" in err[0] and str(blocker / "sub") in err[0]


@pytest.mark.parametrize("backend", ["cuda", "npu"])
def test_workload_absent_device_is_one_line(capsys, no_workload, backend):
    from vllm_ascend_ext.devices import unavailable_reason

    if unavailable_reason(backend) is None:
        pytest.skip(f"this machine has a {backend} device")
    assert _workload("--backend", backend) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--backend {backend}" in err[0] and "doctor" in err[0]


def test_workload_malformed_environment_is_one_line(monkeypatch, capsys, no_workload):
    monkeypatch.setenv("VLLM_ASCEND_EXT_SOC", "Ascend1")
    assert _workload("--backend", "cpu") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "VLLM_ASCEND_EXT_SOC='Ascend1'" in err[0]


def test_workload_geometry_the_op_refuses_is_one_line(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 1024}))
    assert workload.main(["--model", str(config), "--backend", "cpu", "--tokens", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(config) in err[0] and "head_dim" in err[0]
