"""``doctor``: the backend and why, versions, CANN, device facts, the AscendC fallback."""

import json

import pytest

from cli_helpers import assert_one_line_error
from vllm_ascend_ext.cli import doctor
from vllm_ascend_ext.cli.common import detect_backend


def _checks(result):
    return {check["name"]: check for check in json.loads(result.out)["checks"]}


def test_reports_the_detected_backend_and_why(cli):
    backend = detect_backend()
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


def test_ascendc_library_is_reported_built_when_present(cli, monkeypatch, tmp_path):
    library = tmp_path / "libvllm_ascend_ext_ascendc.so"
    library.write_bytes(b"\x7fELF")
    monkeypatch.setenv("VLLM_ASCEND_EXT_ASCENDC_LIB", str(library))
    checks = _checks(cli("doctor", "--json"))
    assert checks["AscendC fallback"]["status"] == "ok"
    assert str(library) in checks["AscendC fallback"]["detail"]


def test_ascendc_library_absent_says_how_to_build(cli, monkeypatch):
    monkeypatch.delenv("VLLM_ASCEND_EXT_ASCENDC_LIB", raising=False)
    checks = _checks(cli("doctor", "--json", "--backend", "npu"))
    assert checks["AscendC fallback"]["status"] == "--"
    assert "CANN" in checks["AscendC fallback"]["fix"]


def test_require_another_backend_exits_1_with_one_line(cli):
    other = next(name for name in ("npu", "cuda", "cpu") if name != detect_backend().name)
    result = cli("doctor", "--require", other)
    assert_one_line_error(result, 1, other)


def test_require_the_detected_backend_passes(cli):
    assert cli("doctor", "--require", detect_backend().name).code == 0


@pytest.mark.parametrize("argv", [("--require", "tpu"), ("--backend", "gpu"), ("--frob",)])
def test_bad_options_are_one_line_errors(cli, argv):
    assert_one_line_error(cli("doctor", *argv), 2)
