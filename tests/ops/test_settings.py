"""The settings module: every variable read through it, by one set of rules, named in every error."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from vllm_ascend_ext.ops import device, settings
from vllm_ascend_ext.ops.tiling import KernelShape, ascend

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for name in settings.names():
        if name != settings.TRITON_INTERPRET:  # the interpreter stays as conftest set it
            monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("text,value", [("1", True), ("true", True), ("TRUE", True), (" Yes ", True),
                                        ("on", True), ("0", False), ("False", False), ("no", False),
                                        ("OFF", False)])
def test_booleans_accept_the_usual_words_in_any_case(monkeypatch, text, value):
    monkeypatch.setenv(settings.FUSION, text)
    assert settings.fusion_enabled() is value


@pytest.mark.parametrize("text", ["disable", "2", "enabled", "y"])
def test_a_boolean_that_does_not_parse_names_the_variable_and_value(monkeypatch, text):
    monkeypatch.setenv(settings.FUSION, text)
    with pytest.raises(ValueError, match=rf"{settings.FUSION}='{text}'"):
        settings.fusion_enabled()


def test_empty_means_unset(monkeypatch):
    monkeypatch.setenv(settings.FUSION, " ")
    monkeypatch.setenv(settings.NUM_SMS, "")
    assert settings.fusion_enabled() is True and settings.num_sms() is None


@pytest.mark.parametrize("name,text", [
    (settings.UB_BYTES, "1"), (settings.UB_BYTES, "garbage"), (settings.UB_BYTES, str(settings.MAX_UB_BYTES + 1)),
    (settings.VECTOR_CORES, "0"), (settings.VECTOR_CORES, "4.5"),
])
def test_ascend_numbers_are_checked_where_they_are_read(monkeypatch, name, text):
    monkeypatch.setenv(name, text)
    with pytest.raises(settings.SettingError, match=name):
        device.ascend_facts(None)


@pytest.mark.parametrize("text", ["garbage", "-3", "0"])
def test_num_sms_is_checked_where_it_is_read(monkeypatch, text):
    monkeypatch.setenv(settings.NUM_SMS, text)
    with pytest.raises(settings.SettingError, match=settings.NUM_SMS):
        device.cuda_facts(None)


def test_dependent_launch_is_on_unless_switched_off(monkeypatch):
    monkeypatch.delenv(settings.CUDA_PDL, raising=False)
    assert settings.cuda_pdl_enabled() is True
    monkeypatch.setenv(settings.CUDA_PDL, "Off")
    assert settings.cuda_pdl_enabled() is False
    monkeypatch.setenv(settings.CUDA_PDL, "sometimes")
    with pytest.raises(settings.SettingError, match=rf"{settings.CUDA_PDL}='sometimes'"):
        settings.cuda_pdl_enabled()
    with pytest.raises(settings.SettingError, match=settings.CUDA_PDL):
        device.cuda_facts(None)  # read without a GPU too
    monkeypatch.setenv(settings.CUDA_PDL, "on")
    assert device.cuda_facts(None).dependent_launch is False  # no GPU: the interpreter cannot run it


def test_soc_names_are_case_insensitive_and_unknown_ones_refused(monkeypatch):
    monkeypatch.setenv(settings.SOC, "ascend910b4")
    assert device.ascend_facts(None).soc == "Ascend910B4"
    monkeypatch.setenv(settings.SOC, "garbage")
    with pytest.raises(settings.SettingError, match=rf"{settings.SOC}='garbage'"):
        device.ascend_facts(None)


def test_facts_follow_the_environment_of_each_call(monkeypatch):
    monkeypatch.setenv(settings.VECTOR_CORES, "7")
    assert device.ascend_facts(None).num_vector_cores == 7
    monkeypatch.setenv(settings.VECTOR_CORES, "9")
    assert device.ascend_facts(None).num_vector_cores == 9
    monkeypatch.setenv(settings.NUM_SMS, "17")
    assert device.cuda_facts(None).num_sms == 17


def test_every_setting_has_one_reader():
    assert set(settings.READERS) == set(settings.names())


def test_every_known_soc_has_facts():
    assert set(settings.ASCEND_SOCS) == set(device.ASCEND_SOC_DEFAULTS)


def test_the_smallest_ub_accepted_plans_the_widest_head():
    """MIN_UB_BYTES is enough for the smallest tile of D = R = 512, fp32 qkv and cache."""
    facts = device.AscendFacts("test", 1, settings.MIN_UB_BYTES, "test")
    plan = ascend.plan(KernelShape(1, 1, 512, 512, 4, 4), facts)
    assert plan.block_tokens >= ascend.MIN_BLOCK_TOKENS
    tight = device.AscendFacts("test", 1, settings.MIN_UB_BYTES // 2, "test")
    with pytest.raises(ValueError):
        ascend.plan(KernelShape(1, 1, 512, 512, 4, 4), tight)


@pytest.mark.parametrize("text,value", [("1", True), ("true", True), ("yes", True), ("ON", True), ("0", False)])
def test_triton_interpret_reads_like_triton(monkeypatch, text, value):
    monkeypatch.setenv(settings.TRITON_INTERPRET, text)
    assert settings.triton_interpret() is value


def _sources():
    for folder in ("ops", "vllm_ascend_ext", "tests", "scripts"):
        yield from (ROOT / folder).rglob("*.py")
    yield ROOT / "setup.py"


_NAME = r"[\"'](?:VLLM_ASCEND_EXT_\w+|TRITON_INTERPRET)[\"']"
#: Reads of a variable: get/getenv/pop, ``environ[NAME]`` not followed by an assignment, ``in``.
_READ = re.compile(rf"(?:environ\.get|getenv|environ\.pop)\(\s*{_NAME}|environ\[{_NAME}\](?!\s*=[^=])"
                   rf"|{_NAME}\s+(?:not\s+)?in\s+os\.environ")


def test_no_variable_is_read_outside_the_settings_module():
    """Our variables and TRITON_INTERPRET are read in ops/settings.py only (writes, such as turning
    the interpreter on for a CPU run, are not reads)."""
    offenders = [f"{path.relative_to(ROOT)}: {m.group(0)}" for path in _sources()
                 if path != ROOT / "ops" / "settings.py" for m in _READ.finditer(path.read_text())]
    assert offenders == []


def test_every_variable_named_in_the_code_is_a_setting():
    named = {m for path in _sources() for m in re.findall(r"VLLM_ASCEND_EXT_[A-Z_]+[A-Z]", path.read_text())}
    assert named - set(settings.names()) == set()


def test_the_readme_table_is_written_from_the_settings():
    """The README's settings table is SETTINGS row for row: every variable, in order, word for word."""
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `[A-Z_]+` \|.*$", readme, flags=re.M)
    assert rows == [f"| `{s.name}` | {s.accepted} | {s.default} | {s.effect} |" for s in settings.SETTINGS]


def _setup_module():
    spec = importlib.util.spec_from_file_location("_setup_under_test", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)  # not __main__: setup() is not called
    return module


@pytest.mark.parametrize("switch,cann,expected", [
    ("false", "/opt/cann", (False, "VLLM_ASCEND_EXT_BUILD_ASCENDC is off")),
    ("Off", "/opt/cann", (False, "VLLM_ASCEND_EXT_BUILD_ASCENDC is off")),
    (None, None, (False, "ASCEND_HOME_PATH is not set")),
    ("yes", "/opt/cann", (True, "for Ascend910B3")),
])
def test_setup_parses_its_variables_by_the_same_rules(monkeypatch, switch, cann, expected):
    for name, value in ((settings.BUILD_ASCENDC, switch), ("ASCEND_HOME_PATH", cann)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert _setup_module().ascendc_build() == expected


def test_setup_refuses_a_bad_switch_and_a_forced_build_without_cann(monkeypatch):
    setup = _setup_module()
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    monkeypatch.setenv(settings.BUILD_ASCENDC, "sometimes")
    with pytest.raises(ValueError, match=settings.BUILD_ASCENDC):
        setup.ascendc_build()
    monkeypatch.setenv(settings.BUILD_ASCENDC, "1")
    with pytest.raises(RuntimeError, match="ASCEND_HOME_PATH"):
        setup.ascendc_build()
