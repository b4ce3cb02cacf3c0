"""The CUDA compile check's width rules for the KV-cache write, on access counts as PTX gives
them (``python -m vllm_ascend_ext.ops.cuda_compile`` compiles the kernels themselves)."""

from __future__ import annotations

from collections import Counter

import pytest

from vllm_ascend_ext.ops import cuda_compile as cc


@pytest.mark.parametrize("kind,nbytes", [("st.global.v4.b32", 16), ("st.global.v2.b32", 8), ("st.global.b16", 2),
                                         ("ld.global.b64", 8), ("st.global.b8", 1), ("st.global.v4.b16", 8)])
def test_store_bytes(kind, nbytes):
    assert cc._store_bytes(kind) == nbytes


# The prologue under the cache write's plan; the cache write without k and v out; with them.
PROLOGUE = Counter({"ld.global.v4.b32": 20, "st.global.v4.b32": 16})


def rows(cache: dict, k_out: dict | None = None):
    """``(with k and v out, without them)`` for cache stores ``cache`` and k/v output stores
    ``k_out`` (default: the prologue's k stores, 8 of its 16, as 16-byte vectors)."""
    k_out = Counter(k_out or {"st.global.v4.b32": 8})
    no_kv_out = PROLOGUE - k_out + Counter(cache) + Counter({"ld.global.b64": 2})
    return {"kinds": no_kv_out + k_out}, {"kinds": no_kv_out}


def test_bf16_cache_rows_as_wide_as_k_out_pass():
    row, no_kv_out = rows({"st.global.v4.b32": 12})
    added, problems = cc._cache_store_problems(cc.KVForm("nhd", "bf16"), row, {"kinds": PROLOGUE}, no_kv_out)
    assert problems == [] and added == "+12 st, 8 lanes"


def test_int8_cache_rows_at_half_the_bytes_pass():
    row, no_kv_out = rows({"st.global.v2.b32": 12})
    added, problems = cc._cache_store_problems(cc.KVForm("nhd", "int8"), row, {"kinds": PROLOGUE}, no_kv_out)
    assert problems == [] and added == "+12 st, 8 lanes"


def test_cache_rows_narrower_than_k_out_fail_at_the_widest_and_the_narrowest():
    row, no_kv_out = rows({"st.global.b16": 128})
    _, problems = cc._cache_store_problems(cc.KVForm("nz", "bf16"), row, {"kinds": PROLOGUE}, no_kv_out)
    assert len(problems) == 2 and "at most 1 lanes" in problems[0] and "1 lane(s)" in problems[1]
    row, no_kv_out = rows({"st.global.v4.b32": 8, "st.global.b16": 4})
    _, problems = cc._cache_store_problems(cc.KVForm("nhd", "bf16"), row, {"kinds": PROLOGUE}, no_kv_out)
    assert problems == ["a cache store moves 1 lane(s) per thread, no k/v output store fewer than 8"]


def test_narrow_k_out_tiles_allow_equally_narrow_cache_stores():
    # A one-kv-head small-batch tile: k moves 2 or 1 lanes a thread, and so may its cache rows.
    row, no_kv_out = rows({"st.global.b32": 2, "st.global.b16": 1}, k_out={"st.global.b32": 2, "st.global.b16": 1})
    _, problems = cc._cache_store_problems(cc.KVForm("nhd", "bf16"), row, {"kinds": PROLOGUE}, no_kv_out)
    assert problems == []


def test_a_write_adding_no_cache_store_fails():
    row, no_kv_out = rows({})
    _, problems = cc._cache_store_problems(cc.KVForm("nhd", "bf16"), row, {"kinds": PROLOGUE}, no_kv_out)
    assert problems == ["the cache write adds no store"]


def test_every_form_is_compiled_with_and_without_k_and_v_out():
    forms = {(kv.layout, kv.cache) for kv in cc.KV_FORMS}
    assert forms == {("nhd", "bf16"), ("hnd", "bf16"), ("nz", "bf16"), ("nhd", "int8"), ("nhd", "fp8_e4m3")}
    assert {(kv.layout, kv.cache, kv.return_kv) for kv in cc.KV_FORMS} == {
        form + (ret,) for form in forms for ret in (False, True)}
