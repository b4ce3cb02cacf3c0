"""VLLM_ASCEND_EXT_IMPL and the Triton/AscendC choice (vllm_ascend_ext.impl)."""

from __future__ import annotations

import logging

import pytest
import torch

from vllm_ascend_ext import impl
from vllm_ascend_ext.ops import reference
from vllm_ascend_ext.ops.models import AttentionGeometry

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv(impl.ENV_IMPL, raising=False)
    monkeypatch.setattr(impl, "_triton_failures", {})
    monkeypatch.setattr(impl, "_warned", set())


def test_invalid_env_names_the_variable(monkeypatch):
    monkeypatch.setenv(impl.ENV_IMPL, "cuda")
    with pytest.raises(ValueError, match=impl.ENV_IMPL):
        impl.choose_impl(CPU, dtype=torch.bfloat16, head_dim=128)


def test_forced_triton(monkeypatch):
    monkeypatch.setenv(impl.ENV_IMPL, "triton")
    assert impl.choose_impl(CPU, dtype=torch.float32, head_dim=512).impl == "triton"


def test_auto_prefers_triton(monkeypatch, host_sim):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert impl.choose_impl(CPU, dtype=torch.bfloat16, head_dim=128).impl == "triton"


def test_auto_falls_back_once_with_the_reason(monkeypatch, host_sim, caplog):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # Triton cannot serve CPU tensors: AscendC's host build does
    with caplog.at_level(logging.WARNING, logger="vllm_ascend_ext"):
        for _ in range(3):
            choice = impl.choose_impl(CPU, dtype=torch.bfloat16, head_dim=128)
            assert choice.impl == "ascendc" and "interpreter" in choice.reason
    assert len([r for r in caplog.records if "falls back to the AscendC kernel" in r.message]) == 1


def test_a_recorded_failure_is_routed_without_a_second_warning(monkeypatch, host_sim, caplog):
    """The worker hook warns once when it records a failed geometry; routing it says nothing more
    (the issue asks for exactly one warning per failed geometry)."""
    key = impl.geometry_key(32, 8, 128, 128, torch.bfloat16, True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    impl.record_triton_failure(key, "ub overflow at compile time")
    with caplog.at_level(logging.WARNING, logger="vllm_ascend_ext"):
        for _ in range(3):
            choice = impl.choose_impl(CPU, dtype=torch.bfloat16, head_dim=128, key=key)
            assert choice.impl == "ascendc" and "ub overflow" in choice.reason
    assert [r.message for r in caplog.records] == []


def test_auto_raises_when_neither_can_serve(monkeypatch, host_sim):
    key = impl.geometry_key(8, 1, 320, 320, torch.bfloat16, True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    impl.record_triton_failure(key, "boom")
    with pytest.raises(RuntimeError, match=r"\(the Triton kernel failed for this geometry: boom\).*head_dim <= 256"):
        impl.choose_impl(CPU, dtype=torch.bfloat16, head_dim=320, key=key)


@pytest.mark.parametrize("kwargs,match", [
    (dict(dtype=torch.float32, head_dim=128), "bf16/fp16"),
    (dict(dtype=torch.bfloat16, head_dim=320), "head_dim <= 256"),
    (dict(dtype=torch.bfloat16, head_dim=128, weight_dtypes=(torch.float32,)), "qkv's dtype"),
])
def test_forced_ascendc_names_its_limits(monkeypatch, host_sim, kwargs, match):
    monkeypatch.setenv(impl.ENV_IMPL, "ascendc")
    with pytest.raises(RuntimeError, match=match):
        impl.choose_impl(CPU, **kwargs)


@pytest.mark.parametrize("library,match", [
    (None, "was not built"),
    ("/nonexistent/libvllm_ascend_ext_ascendc.so", "/nonexistent/libvllm_ascend_ext_ascendc.so does not exist"),
    ("/etc/passwd", "is not a shared library"),
])
def test_forced_ascendc_without_the_library_on_npu(monkeypatch, library, match):
    monkeypatch.setenv(impl.ENV_IMPL, "ascendc")
    if library is None:
        monkeypatch.delenv("VLLM_ASCEND_EXT_ASCENDC_LIB", raising=False)
    else:
        monkeypatch.setenv("VLLM_ASCEND_EXT_ASCENDC_LIB", library)
    from vllm_ascend_ext import ascendc

    ascendc.load_npu_library.cache_clear()
    try:
        with pytest.raises(RuntimeError, match=match):
            impl.choose_impl(torch.device("privateuseone"), dtype=torch.bfloat16, head_dim=128)
    finally:
        ascendc.load_npu_library.cache_clear()


def test_selected_callable_runs_the_ascendc_kernel(monkeypatch, host_sim):
    monkeypatch.setenv(impl.ENV_IMPL, "ascendc")
    qkv = torch.randn(3, 4 * 64).bfloat16()
    cache = torch.randn(8, 64)
    q, k, v = impl.split_qkv_rmsnorm_rope(qkv, None, None, cache, torch.arange(3), 2, 1, 64)
    assert host_sim.tiling.numTokens == 3 and q.shape == (3, 128) and v.shape == (3, 64)


def test_impl_names_any_case(monkeypatch, host_sim):
    monkeypatch.setenv(impl.ENV_IMPL, "  AscendC ")
    assert impl.requested_impl() == "ascendc"
    assert impl.choose_impl(CPU, dtype=torch.bfloat16, head_dim=128).impl == "ascendc"


@pytest.mark.parametrize("value", ["1", "true", "yes", "ON", " True "])
def test_interpreter_switch_by_the_settings_rules(monkeypatch, value):
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert impl.triton_unavailable_reason(CPU) is None
    assert impl.choose_impl(CPU, dtype=torch.float32, head_dim=512).impl == "triton"


@pytest.mark.parametrize("value", ["0", "off", "no"])
def test_cpu_without_the_interpreter_is_a_reason(monkeypatch, value):
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert "TRITON_INTERPRET" in impl.triton_unavailable_reason(CPU)


def test_interpreter_switch_that_does_not_parse_names_it(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "maybe")
    with pytest.raises(ValueError, match="TRITON_INTERPRET='maybe'"):
        impl.choose_impl(CPU, dtype=torch.bfloat16, head_dim=128)


def _small_call():
    gen = torch.Generator().manual_seed(11)
    geometry = AttentionGeometry(2, 1, 64, 64)
    return reference.make_inputs(geometry, 3, generator=gen)


@pytest.mark.parametrize("mode", ["triton", "ascendc"])
@pytest.mark.parametrize("bad,match", [
    (dict(is_neox="false"), "is_neox must be a bool"),
    (dict(inplace="no"), "inplace must be a bool"),
    (dict(eps=float("inf")), "eps"),
])
def test_selector_validates_before_choosing(monkeypatch, host_sim, mode, bad, match):
    monkeypatch.setenv(impl.ENV_IMPL, mode)
    kwargs = _small_call()
    before = kwargs["qkv"].clone()
    with pytest.raises(ValueError, match=match):
        impl.split_qkv_rmsnorm_rope(**{**kwargs, **bad})
    assert torch.equal(kwargs["qkv"], before)


@pytest.mark.parametrize("mode", ["triton", "ascendc"])
def test_selector_result_matches_the_reference(monkeypatch, host_sim, mode):
    monkeypatch.setenv(impl.ENV_IMPL, mode)
    kwargs = _small_call()
    want_q, want_k, *_ = reference.split_qkv_rmsnorm_rope(**kwargs)
    q, k, _ = impl.split_qkv_rmsnorm_rope(**kwargs)
    torch.testing.assert_close(q.double(), want_q, atol=0.02, rtol=0.02)
    torch.testing.assert_close(k.double(), want_k, atol=0.02, rtol=0.02)
