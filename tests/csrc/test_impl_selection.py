"""VLLM_ASCEND_EXT_IMPL and the Triton/AscendC choice (vllm_ascend_ext.kernels.impl)."""

from __future__ import annotations

import logging

import pytest
import torch

from vllm_ascend_ext.kernels import impl
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
    from vllm_ascend_ext.kernels import ascendc

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


# --- the variants (issue 10): which implementation serves which ------------------------------
VARIANTS = {
    "mrope": AttentionGeometry(4, 2, 64, 64, mrope_section=(8, 12, 12)),
    "mrope-interleaved": AttentionGeometry(4, 2, 64, 32, mrope_section=(6, 5, 5), mrope_interleaved=True,
                                           is_neox=False),
    "q_gate": AttentionGeometry(4, 1, 128, 32, q_gate=True, weight_offset=1.0),
    "v_norm": AttentionGeometry(4, 2, 64, 64, v_norm=True),
    "q_only": AttentionGeometry(4, 0, 64, 64),
    "all": AttentionGeometry(4, 2, 64, 64, q_gate=True, v_norm=True, mrope_section=(12, 10, 10),
                             mrope_interleaved=True),
}


def _variant_call(geometry: AttentionGeometry, tokens: int = 5) -> dict:
    return reference.make_inputs(geometry, tokens, generator=torch.Generator().manual_seed(tokens))


def _features(kwargs: dict) -> frozenset[str]:
    from vllm_ascend_ext.ops import validation

    return validation.split_qkv_rmsnorm_rope(**kwargs).features


def _key(kwargs: dict) -> tuple:
    return impl.geometry_key(kwargs["num_q_heads"], kwargs["num_kv_heads"], kwargs["head_dim"],
                             kwargs["cos_sin_cache"].shape[1], kwargs["qkv"].dtype, kwargs["is_neox"],
                             features=_features(kwargs))


def test_ascendc_serves_each_variant_and_names_any_other():
    from vllm_ascend_ext.kernels import ascendc_plan

    for name in ("mrope", "q_gate", "v_norm", "q_only"):
        assert ascendc_plan.unsupported_reason(torch.bfloat16, 128, features=frozenset({name})) is None
    served = frozenset(ascendc_plan.SERVED_FEATURES)
    assert ascendc_plan.unsupported_reason(torch.bfloat16, 128, features=served) is None
    reason = ascendc_plan.unsupported_reason(torch.bfloat16, 128, features=frozenset({"mrope", "future_variant"}))
    assert reason == "the AscendC kernel does not serve future_variant; the Triton op does"
    # a variant does not lift the kernel's other limits
    assert "head_dim <= 256" in ascendc_plan.unsupported_reason(torch.bfloat16, 512, features=frozenset({"v_norm"}))


def test_forced_ascendc_names_an_unserved_variant(monkeypatch, host_sim):
    monkeypatch.setenv(impl.ENV_IMPL, "ascendc")
    with pytest.raises(RuntimeError, match=r"VLLM_ASCEND_EXT_IMPL=ascendc, but the AscendC kernel does not serve "
                                           r"future_variant; the Triton op does"):
        impl.choose_impl(CPU, dtype=torch.bfloat16, head_dim=128, features=frozenset({"q_gate", "future_variant"}))


@pytest.mark.parametrize("unserved,geometry,named", [
    ("v_norm", "v_norm", r"v_norm \(Gemma-4's v-norm\)"),
    ("q_gate", "all", r"q_gate \(the gated q\)"),
    ("mrope", "mrope-interleaved", r"mRoPE \(\[3, T\] positions\)"),
    ("q_only", "q_only", r"q-only layers \(num_kv_heads=0\)"),
])
def test_a_call_of_an_unserved_variant_raises_naming_it(monkeypatch, host_sim, unserved, geometry, named):
    """Were the kernel not to serve a variant, a forced call of it says which, before anything runs
    (the refusal path of every variant, through the selector and the AscendC op's own check)."""
    from vllm_ascend_ext.kernels import ascendc, ascendc_plan

    monkeypatch.setattr(ascendc_plan, "SERVED_FEATURES", ascendc_plan.SERVED_FEATURES - {unserved})
    monkeypatch.setenv(impl.ENV_IMPL, "ascendc")
    kwargs = _variant_call(VARIANTS[geometry])
    before = kwargs["qkv"].clone()
    host_sim.tiling = None
    with pytest.raises(RuntimeError, match=f"ascendc, but the AscendC kernel does not serve {named}; the Triton op"):
        impl.split_qkv_rmsnorm_rope(**kwargs)
    with pytest.raises(ValueError, match=f"does not serve {named}"):
        ascendc.split_qkv_rmsnorm_rope(**kwargs)
    assert host_sim.tiling is None and torch.equal(kwargs["qkv"], before)


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANTS.keys())
def test_a_served_variant_with_a_recorded_triton_failure_runs_on_ascendc(monkeypatch, host_sim, variant):
    """auto, Triton usable but recorded as failed for this variant's key: the AscendC kernel serves
    the call, and its numbers are the reference's (one ulp of bf16)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kwargs = _variant_call(VARIANTS[variant])
    features = _features(kwargs)
    assert features  # every row here is a variant
    choice = impl.choose_impl(CPU, dtype=torch.bfloat16, head_dim=kwargs["head_dim"], features=features,
                              key=_key(kwargs))
    assert choice.impl == "triton"
    impl.record_triton_failure(_key(kwargs), "compile failed at warm-up")
    choice = impl.choose_impl(CPU, dtype=torch.bfloat16, head_dim=kwargs["head_dim"], features=features,
                              key=_key(kwargs))
    assert choice.impl == "ascendc" and "compile failed at warm-up" in choice.reason
    host_sim.tiling = None
    out = impl.split_qkv_rmsnorm_rope(**kwargs)
    assert host_sim.tiling is not None and host_sim.tiling.numTokens == 5  # the host build ran
    want = reference.split_qkv_rmsnorm_rope(**kwargs)
    assert len(out) == len(want) == (4 if kwargs["q_gate"] else 3)
    for got, ref in zip(out, want, strict=True):
        assert got.dtype == torch.bfloat16 and got.shape == ref.shape
        ulp = torch.exp2(torch.floor(torch.log2(ref.abs().clamp_min(2.0 ** -126))) - 7)
        assert ((got.double() - ref).abs() <= ulp).all()


def test_a_recorded_failure_of_one_variant_leaves_the_others_on_triton(monkeypatch, host_sim):
    """Each variant compiles apart, so its failure is recorded under its own key."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gated = _variant_call(VARIANTS["q_gate"])
    impl.record_triton_failure(_key(gated), "boom")
    plain = {**gated, "q_gate": False, "qkv": gated["qkv"][:, 4 * 128:]}
    assert _features(plain) == frozenset()
    assert impl.choose_impl(CPU, dtype=torch.bfloat16, head_dim=128, key=_key(plain)).impl == "triton"
    assert impl.choose_impl(CPU, dtype=torch.bfloat16, head_dim=128, key=_key(gated),
                            features=_features(gated)).impl == "ascendc"


# --- the KV-cache write (issue 11): Triton where it can, else AscendC for nhd/nz, bf16/fp16/int8 ---
def _kv_call(layout: str = "nhd", tokens: int = 5, dtype=torch.bfloat16, per_channel: bool = False) -> dict:
    """A small call of ``split_qkv_rmsnorm_rope_kv_cache`` (sentinel-filled caches, padding slots)."""
    geometry = AttentionGeometry(4, 2, 64, 64)
    gen = torch.Generator().manual_seed(tokens)
    return {**reference.make_inputs(geometry, tokens, generator=gen),
            **reference.make_kv_cache(geometry, tokens, cache_layout=layout, block_size=4, dtype=dtype,
                                      per_channel=per_channel, generator=gen)}


def _kv_validated(kwargs: dict):
    from vllm_ascend_ext.ops import validation

    return validation.split_qkv_rmsnorm_rope_kv_cache(**kwargs)


def _kv_features(kwargs: dict) -> frozenset[str]:
    return _kv_validated(kwargs).features


def _kv_choice(kwargs: dict) -> impl.Choice:
    call = _kv_validated(kwargs)
    return impl.choose_impl(CPU, dtype=kwargs["qkv"].dtype, head_dim=kwargs["head_dim"], features=call.features,
                            key=_kv_key(kwargs), kv_cache=call.kv_cache, kv_dtype=kwargs["key_cache"].dtype)


def _kv_key(kwargs: dict) -> tuple:
    return impl.geometry_key(kwargs["num_q_heads"], kwargs["num_kv_heads"], kwargs["head_dim"],
                             kwargs["cos_sin_cache"].shape[1], kwargs["qkv"].dtype, kwargs["is_neox"],
                             features=_kv_features(kwargs))


def _untouched(kwargs: dict):
    """A check that qkv and the caches are as they are now."""
    saved = {name: kwargs[name].clone() for name in ("qkv", "key_cache", "value_cache")}
    return lambda: all(torch.equal(kwargs[name], value) for name, value in saved.items())


def _kv_reference(kwargs: dict) -> tuple:
    """The float64 prologue and caches the call must produce."""
    prologue = {k: v for k, v in kwargs.items() if k not in ("key_cache", "value_cache", "slot_mapping",
                                                              "cache_layout", "k_scale", "v_scale")}
    ref = reference.split_qkv_rmsnorm_rope(**prologue)
    caches = reference.kv_cache_write(kwargs["key_cache"], kwargs["value_cache"], ref[1], ref[2],
                                      kwargs["slot_mapping"], kwargs["num_kv_heads"], kwargs["head_dim"],
                                      cache_layout=kwargs["cache_layout"], k_scale=kwargs["k_scale"],
                                      v_scale=kwargs["v_scale"])
    return ref, caches


def _ulp_close(got: torch.Tensor, want: torch.Tensor) -> bool:
    ulp = torch.exp2(torch.floor(torch.log2(want.abs().clamp_min(2.0 ** -126))) - 7)
    return bool(((got.double() - want).abs() <= ulp).all())


def test_ascendc_serves_the_kv_cache_write_and_names_the_rest():
    from vllm_ascend_ext.kernels import ascendc_plan

    assert "kv_cache" in ascendc_plan.SERVED_FEATURES and ascendc_plan.KV_LAYOUTS == ("nhd", "nz")
    for layout, dtype, per_channel in (("nhd", torch.bfloat16, False), ("nz", torch.bfloat16, False),
                                       ("nhd", torch.int8, False), ("nz", torch.int8, True)):
        call = _kv_validated(_kv_call(layout, dtype=dtype, per_channel=per_channel))
        assert call.features == frozenset({"kv_cache"})
        assert ascendc_plan.unsupported_reason(torch.bfloat16, 64, features=call.features, kv_cache=call.kv_cache,
                                               kv_dtype=dtype) is None
    for layout in ("hnd", "cpu_vec"):
        call = _kv_validated(_kv_call(layout))
        assert ascendc_plan.unsupported_reason(torch.bfloat16, 64, features=call.features, kv_cache=call.kv_cache,
                                               kv_dtype=torch.bfloat16) == (
            f"the AscendC kernel does not write cache_layout={layout!r} (it writes nhd, nz); the Triton op does")
    call = _kv_validated(_kv_call(dtype=torch.float8_e4m3fn))
    assert "does not write a torch.float8_e4m3fn KV cache" in ascendc_plan.unsupported_reason(
        torch.bfloat16, 64, features=call.features, kv_cache=call.kv_cache, kv_dtype=torch.float8_e4m3fn)


@pytest.mark.parametrize("layout", ["nhd", "cpu_vec"])
def test_auto_runs_the_kv_cache_write_on_triton(monkeypatch, host_sim, layout):
    """auto, Triton usable: the selector's call is the Triton op's, caches included, bit for bit
    (the AscendC host build, available here, does not run)."""
    from vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_kv_cache import split_qkv_rmsnorm_rope_kv_cache

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kwargs = _kv_call(layout)
    assert _kv_choice(kwargs).impl == "triton"
    want_cache = kwargs["key_cache"].clone()
    want = split_qkv_rmsnorm_rope_kv_cache(**{**kwargs, "key_cache": want_cache, "value_cache": (
        want_cache if layout == "cpu_vec" else kwargs["value_cache"].clone())})
    before = kwargs["key_cache"].clone()
    host_sim.tiling = None
    q, k, v = impl.split_qkv_rmsnorm_rope_kv_cache(**kwargs)
    assert host_sim.tiling is None
    assert torch.equal(q, want[0]) and k.shape == v.shape == (5, 0)
    assert torch.equal(kwargs["key_cache"], want_cache) and not torch.equal(kwargs["key_cache"], before)


@pytest.mark.parametrize("layout,dtype", [("nhd", torch.bfloat16), ("nz", torch.int8)])
def test_forced_ascendc_runs_the_kv_cache_write(monkeypatch, host_sim, layout, dtype):
    """VLLM_ASCEND_EXT_IMPL=ascendc: the AscendC kernel (host build) writes the caches, with the
    reference's numbers (one bf16 ulp; int8 exactly but at a .5 tie, none in this draw)."""
    monkeypatch.setenv(impl.ENV_IMPL, "ascendc")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kwargs = _kv_call(layout, dtype=dtype)
    ref, caches = _kv_reference(kwargs)
    host_sim.tiling = None
    q, k, v = impl.split_qkv_rmsnorm_rope_kv_cache(**kwargs)
    assert host_sim.tiling is not None and host_sim.tiling.numTokens == 5
    assert _ulp_close(q, ref[0]) and k.shape == v.shape == (5, 0)
    for got, want in zip((kwargs["key_cache"], kwargs["value_cache"]), caches, strict=True):
        assert torch.equal(got.double(), want) if dtype == torch.int8 else _ulp_close(got, want)


@pytest.mark.parametrize("layout", ["hnd", "cpu_vec"])
def test_forced_ascendc_refuses_an_unserved_layout_by_name(monkeypatch, host_sim, layout):
    """VLLM_ASCEND_EXT_IMPL=ascendc and a layout the kernel does not write: a clear error naming
    it, before anything runs (no silent fallback to Triton, nothing written)."""
    monkeypatch.setenv(impl.ENV_IMPL, "ascendc")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kwargs = _kv_call(layout)
    untouched = _untouched(kwargs)
    host_sim.tiling = None
    with pytest.raises(RuntimeError, match=rf"^VLLM_ASCEND_EXT_IMPL=ascendc, but the AscendC kernel does not write "
                                           rf"cache_layout='{layout}' \(it writes nhd, nz\); the Triton op does$"):
        impl.split_qkv_rmsnorm_rope_kv_cache(**kwargs)
    assert host_sim.tiling is None and untouched()


@pytest.mark.parametrize("why", ["no interpreter", "recorded failure"])
def test_auto_falls_back_to_ascendc_for_the_kv_cache_write(monkeypatch, host_sim, caplog, why):
    """auto, Triton unusable for the call: an nhd/nz write runs on the AscendC kernel (one warning
    without the interpreter, none for a recorded failure: it was announced when recorded); a
    layout AscendC does not write raises with both reasons, naming it, and writes nothing."""
    kwargs = _kv_call()
    if why == "no interpreter":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        reason = "interpreter"
    else:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        impl.record_triton_failure(_kv_key(kwargs), "ub overflow at compile time")
        reason = "ub overflow at compile time"
    ref, caches = _kv_reference(kwargs)
    host_sim.tiling = None
    with caplog.at_level(logging.WARNING, logger="vllm_ascend_ext"):
        q, _, _ = impl.split_qkv_rmsnorm_rope_kv_cache(**kwargs)
        impl.split_qkv_rmsnorm_rope_kv_cache(**kwargs)
    assert host_sim.tiling is not None and _ulp_close(q, ref[0]) and _ulp_close(kwargs["key_cache"], caches[0])
    warnings = [r.message for r in caplog.records]
    assert len(warnings) == (1 if why == "no interpreter" else 0)
    assert all("split_qkv_rmsnorm_rope_kv_cache falls back to the AscendC kernel" in m for m in warnings)

    hnd = _kv_call("hnd")
    if why == "recorded failure":
        impl.record_triton_failure(_kv_key(hnd), "ub overflow at compile time")
    untouched = _untouched(hnd)
    host_sim.tiling = None
    with pytest.raises(RuntimeError, match=rf"^split_qkv_rmsnorm_rope_kv_cache: Triton cannot serve this call "
                                           rf"\(.*{reason}.*\) and neither can the AscendC kernel \(.*does not "
                                           rf"write cache_layout='hnd'"):
        impl.split_qkv_rmsnorm_rope_kv_cache(**hnd)
    assert host_sim.tiling is None and untouched()


@pytest.mark.parametrize("mode", ["auto", "triton", "ascendc"])
@pytest.mark.parametrize("bad,match", [
    (dict(slot_mapping=torch.zeros(5)), "slot_mapping must be int32 or int64"),
    (dict(cache_layout="nd"), "cache_layout must be one of"),
    (dict(return_kv="yes"), "return_kv must be a bool"),
])
def test_kv_cache_selector_validates_before_choosing(monkeypatch, host_sim, mode, bad, match):
    monkeypatch.setenv(impl.ENV_IMPL, mode)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kwargs = {**_kv_call(), **bad}
    untouched = _untouched(kwargs)
    with pytest.raises(ValueError, match=match):
        impl.split_qkv_rmsnorm_rope_kv_cache(**kwargs)
    assert untouched()


def _tp_call() -> dict:
    """A tp_size=1 call of split_qkv_tp_rmsnorm_rope (its full layer is one rank's)."""
    from vllm_ascend_ext.ops.models import AttentionGeometry
    from vllm_ascend_ext.ops.reference import make_tp_inputs

    args = make_tp_inputs(AttentionGeometry(4, 2, 64, 32, qk_norm_across_heads=True), 5,
                          generator=torch.Generator().manual_seed(3))
    return dict(args, tp_size=1)


def test_ascendc_names_the_tp_norm_it_does_not_serve(monkeypatch):
    """Forced AscendC: the norm across TP ranks is refused naming ``tp_norm``, before anything runs."""
    from vllm_ascend_ext.kernels import ascendc_plan

    assert "tp_norm" not in ascendc_plan.SERVED_FEATURES
    monkeypatch.setenv(impl.ENV_IMPL, "ascendc")
    kwargs = _tp_call()
    with pytest.raises(RuntimeError, match=r"does not serve tp_norm \(the q/k norm across heads and TP ranks\)"):
        impl.split_qkv_tp_rmsnorm_rope(**kwargs)


def test_auto_runs_the_tp_norm_on_triton(monkeypatch):
    """auto: the selector's call is the Triton op's, bit for bit."""
    from vllm_ascend_ext.ops import split_qkv_tp_rmsnorm_rope

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kwargs = _tp_call()
    want = split_qkv_tp_rmsnorm_rope(**kwargs)
    got = impl.split_qkv_tp_rmsnorm_rope(**kwargs)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.fixture
def count_validations(monkeypatch):
    """How many times each validator ran (``{"prologue": n, "kv_cache": n}``)."""
    from vllm_ascend_ext.ops import validation

    count = {"prologue": 0, "kv_cache": 0}
    for key, name in (("prologue", "split_qkv_rmsnorm_rope"), ("kv_cache", "split_qkv_rmsnorm_rope_kv_cache")):
        real = getattr(validation, name)

        def counting(*args, _real=real, _key=key, **kwargs):
            count[_key] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(validation, name, counting)
    return count


@pytest.mark.parametrize("entry", ["impl", "ascendc", "custom_op"])
@pytest.mark.parametrize("inplace", [False, True])
def test_the_ascendc_route_validates_once_per_key(monkeypatch, host_sim, count_validations, entry, inplace):
    """Through the selector, the AscendC Python API or the custom op: one validation for many calls
    and token counts (the route's call object reaches the AscendC op; no second or third pass),
    the tiling of a token count derived once, each call on its own token count."""
    from vllm_ascend_ext.kernels import ascendc, custom_ops  # noqa: F401  (registers torch.ops.vllm_ascend_ext)
    from vllm_ascend_ext.ops import launch_cache

    monkeypatch.setenv(impl.ENV_IMPL, "ascendc")
    launch_cache.clear()
    geometry = AttentionGeometry(2, 1, 64, 64)
    tilings = []
    for tokens in (3, 5, 3, 7, 5, 3):
        kwargs = reference.make_inputs(geometry, tokens, generator=torch.Generator().manual_seed(tokens))
        want_q, want_k, *_ = reference.split_qkv_rmsnorm_rope(**kwargs)
        if entry == "custom_op":
            positional = [kwargs.pop(n) for n in ("qkv", "q_weight", "k_weight", "cos_sin_cache", "positions",
                                                 "num_q_heads", "num_kv_heads", "head_dim", "eps")]
            op = torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope_ if inplace else \
                torch.ops.vllm_ascend_ext.split_qkv_rmsnorm_rope
            out = op(*positional, **kwargs)
            q, k = (positional[0][:, :128], positional[0][:, 128:192]) if inplace else out[:2]
        else:
            run = impl.split_qkv_rmsnorm_rope if entry == "impl" else ascendc.split_qkv_rmsnorm_rope
            q, k, _ = run(**kwargs, inplace=inplace)
        assert host_sim.tiling.numTokens == tokens
        tilings.append(host_sim.tiling)
        torch.testing.assert_close(q.double(), want_q, atol=0.05, rtol=0.02)
        torch.testing.assert_close(k.double(), want_k, atol=0.05, rtol=0.02)
    assert count_validations["prologue"] == 1
    assert tilings[0] is tilings[2] is tilings[5] and tilings[1] is tilings[4]


def test_the_ascendc_kv_route_validates_once_and_refuses_the_same(monkeypatch, host_sim, count_validations):
    """The KV-cache write on AscendC: one validation for many calls; a bad call after good ones of
    the same shapes still raises the validator's ValueError, and the kernel's limit its own."""
    from vllm_ascend_ext.kernels import ascendc
    from vllm_ascend_ext.ops import launch_cache

    monkeypatch.setenv(impl.ENV_IMPL, "ascendc")
    launch_cache.clear()
    for _ in range(5):
        impl.split_qkv_rmsnorm_rope_kv_cache(**_kv_call())
        ascendc.split_qkv_rmsnorm_rope_kv_cache(**_kv_call())
    assert count_validations["kv_cache"] == 2  # the selector's cache and the Python API's, once each
    bad = _kv_call()
    bad["slot_mapping"] = bad["slot_mapping"][:3]
    for run in (impl.split_qkv_rmsnorm_rope_kv_cache, ascendc.split_qkv_rmsnorm_rope_kv_cache):
        with pytest.raises(ValueError, match="slot_mapping"):
            run(**bad)
    with pytest.raises(ValueError, match="does not write cache_layout='hnd'"):
        ascendc.split_qkv_rmsnorm_rope_kv_cache(**_kv_call("hnd"))
    with pytest.raises(ValueError, match="does not write cache_layout='hnd'"):
        ascendc.split_qkv_rmsnorm_rope_kv_cache(**_kv_call("hnd"))
