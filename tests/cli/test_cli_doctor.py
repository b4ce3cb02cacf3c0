"""``doctor``: the backend and why, versions, CANN, device facts, the AscendC fallback."""

import json
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error
from vllm_ascend_ext.cli import doctor
from vllm_ascend_ext.devices import detect_device


def _checks(result):
    return {check["name"]: check for check in json.loads(result.out)["checks"]}


def test_reports_the_detected_backend_and_why(cli):
    backend = detect_device()
    result = cli("doctor")
    assert result.code == 0
    first = result.out.splitlines()[0]
    assert first.startswith("..  backend")
    assert backend.reason in first
    for name in ("torch", "triton", "CANN", "msprof", "vllm", "vllm-ascend", "Ascend facts",
                 "CUDA facts", "AscendC fallback", "implementation"):
        assert f"  {name} " in result.out


def test_json_has_every_check_and_missing_pieces_say_how(cli):
    result = cli("doctor", "--json")
    assert result.code == 0
    data = json.loads(result.out)
    assert data["backend"]["name"] in ("npu", "cuda", "cpu")
    for check in data["checks"]:
        assert check["status"] in ("ok", "--", "!!", "..")
        if check["status"] in ("--", "!!"):
            assert check["fix"], check


def test_forcing_npu_marks_npu_pieces_missing_with_a_fix(cli, monkeypatch):
    for name in doctor.CANN_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(doctor, "CANN_DEFAULT", "/nonexistent/ascend-toolkit/latest")
    monkeypatch.setattr(doctor.shutil, "which", lambda name: None)
    monkeypatch.setattr(doctor, "dist_version",
                        lambda name: {"torch": "2.13.0", "triton": "3.7.1"}.get(name))
    checks = _checks(cli("doctor", "--json", "--backend", "npu"))
    assert checks["torch_npu"]["status"] == "--" and "pip install torch-npu" in checks["torch_npu"]["fix"]
    assert checks["CANN"]["status"] == "--" and "set_env.sh" in checks["CANN"]["fix"]
    assert checks["msprof"]["status"] == "--"
    assert checks["triton"]["status"] == "!!" and "triton-ascend" in checks["triton"]["fix"]
    assert checks["vllm-ascend"]["status"] == "--"
    assert "no NPU attached" in checks["Ascend facts"]["detail"]


def test_triton_ascend_is_told_apart_from_upstream_triton(cli, monkeypatch):
    monkeypatch.setattr(doctor, "dist_version",
                        lambda name: {"torch": "2.13.0", "triton-ascend": "3.2.0"}.get(name))
    checks = _checks(cli("doctor", "--json", "--backend", "npu"))
    assert checks["triton"]["status"] == "ok"
    assert "triton-ascend 3.2.0" in checks["triton"]["detail"]
    checks = _checks(cli("doctor", "--json", "--backend", "cuda"))
    assert checks["triton"]["status"] == "!!"


def test_cann_found_through_its_environment_with_its_version(cli, monkeypatch, tmp_path):
    (tmp_path / "version.cfg").write_text("# CANN\nversion=8.1.RC1\n")
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path))
    checks = _checks(cli("doctor", "--json"))
    assert checks["CANN"]["status"] == "ok"
    assert str(tmp_path) in checks["CANN"]["detail"] and "8.1.RC1" in checks["CANN"]["detail"]


def test_cann_variable_pointing_nowhere_is_flagged(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path / "missing"))
    checks = _checks(cli("doctor", "--json"))
    assert checks["CANN"]["status"] == "!!"


def _shared_library() -> Path:
    """A real ELF shared object: one of torch's own libraries."""
    import torch

    return sorted((Path(torch.__file__).parent / "lib").glob("libc10*.so"))[0]


def test_ascendc_library_is_reported_built_when_present(cli, monkeypatch):
    library = _shared_library()
    monkeypatch.setenv("VLLM_ASCEND_EXT_ASCENDC_LIB", str(library))
    checks = _checks(cli("doctor", "--json"))
    assert checks["AscendC fallback"]["status"] == "ok"
    assert str(library) in checks["AscendC fallback"]["detail"]


@pytest.mark.parametrize("target, words", [("missing.so", "does not exist"), ("/etc/passwd", "not a shared library")])
def test_ascendc_library_that_is_not_one_is_flagged(cli, monkeypatch, tmp_path, target, words):
    path = tmp_path / target if not target.startswith("/") else Path(target)
    monkeypatch.setenv("VLLM_ASCEND_EXT_ASCENDC_LIB", str(path))
    check = _checks(cli("doctor", "--json"))["AscendC fallback"]
    assert check["status"] == "!!", check
    assert str(path) in check["detail"] and words in check["detail"]
    assert "VLLM_ASCEND_EXT_ASCENDC_LIB" in check["detail"] and "VLLM_ASCEND_EXT_ASCENDC_LIB" in check["fix"]
    assert "unset" not in check["detail"] and "built:" not in check["detail"]


@pytest.mark.parametrize("name, value, line", [
    ("VLLM_ASCEND_EXT_UB_BYTES", "1", "Ascend facts"),
    ("VLLM_ASCEND_EXT_UB_BYTES", "lots", "Ascend facts"),
    ("VLLM_ASCEND_EXT_SOC", "Ascend999", "Ascend facts"),
    ("VLLM_ASCEND_EXT_NUM_SMS", "garbage", "CUDA facts"),
    ("VLLM_ASCEND_EXT_NUM_SMS", "0", "CUDA facts"),
    ("VLLM_ASCEND_EXT_CUDA_PDL", "maybe", "CUDA facts"),
])
def test_malformed_device_fact_variables_are_wrong_and_named(cli, monkeypatch, name, value, line):
    monkeypatch.setenv(name, value)
    result = cli("doctor", "--json", "--backend", "cpu")
    assert result.code == 0
    check = _checks(result)[line]
    assert check["status"] == "!!", check
    assert check["detail"].startswith(f"{name}={value!r}")
    assert check["fix"].startswith(f"set {name} to ") and "unset it" in check["fix"]
    text = cli("doctor", "--backend", "cpu").out
    assert f"!!  {line}" in text and name in text


def test_ascendc_library_absent_says_how_to_build(cli, monkeypatch):
    monkeypatch.delenv("VLLM_ASCEND_EXT_ASCENDC_LIB", raising=False)
    checks = _checks(cli("doctor", "--json", "--backend", "npu"))
    assert checks["AscendC fallback"]["status"] == "--"
    assert "CANN" in checks["AscendC fallback"]["fix"]


def test_require_another_backend_exits_1_with_one_line(cli):
    other = next(name for name in ("npu", "cuda", "cpu") if name != detect_device().name)
    result = cli("doctor", "--require", other)
    assert_one_line_error(result, 1, other)


def test_require_the_detected_backend_passes(cli):
    assert cli("doctor", "--require", detect_device().name).code == 0


@pytest.mark.parametrize("argv", [("--require", "tpu"), ("--backend", "gpu"), ("--frob",)])
def test_bad_options_are_one_line_errors(cli, argv):
    assert_one_line_error(cli("doctor", *argv), 2)


@pytest.mark.parametrize("backend, fix", [("cuda", "NVIDIA"), ("npu", "CANN")])
def test_forced_backend_without_its_device_says_what_to_install(cli, backend, fix):
    """Where ``bench --backend X`` sends the user: the device line says it is absent and how to get it."""
    from vllm_ascend_ext.devices import unavailable_reason

    why = unavailable_reason(backend)
    if why is None:
        pytest.skip(f"this machine has a {backend} device")
    checks = _checks(cli("doctor", "--json", "--backend", backend))
    assert checks["device"]["status"] == "--" and why in checks["device"]["detail"]
    assert fix in checks["device"]["fix"]


def test_cpu_only_torch_is_wrong_for_cuda(cli, monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "cuda", None)
    checks = _checks(cli("doctor", "--json", "--backend", "cuda"))
    assert checks["torch"]["status"] == "!!" and "CPU-only build" in checks["torch"]["detail"]
    assert "CUDA build of torch" in checks["torch"]["fix"]
    assert _checks(cli("doctor", "--json", "--backend", "cpu"))["torch"]["status"] == "ok"
