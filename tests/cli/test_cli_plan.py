"""``plan``: launch plans of presets and Hugging Face configs, against ops/tiling."""

import json

import pytest

from cli_helpers import assert_one_line_error
from vllm_ascend_ext.ops import device
from vllm_ascend_ext.ops.models import MODELS, model
from vllm_ascend_ext.ops.tiling import KernelShape, ascend, cuda


def _plan_json(cli, *argv):
    result = cli("plan", *argv, "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def _shape(geometry, elem=2, cache=4):
    return KernelShape.of(geometry, elem, cache)


@pytest.mark.parametrize("spec", MODELS, ids=lambda s: s.name)
def test_preset_plans_are_the_ops_plans(cli, spec):
    data = _plan_json(cli, spec.name, "--tp", "1", "--tokens", "1,4096")
    entry = data["plans"][0]
    shape = _shape(spec.shard(1))
    a_plan = ascend.plan(shape, device.ascend_facts(None))
    c_plan = cuda.plan(shape, device.cuda_facts(None))
    a = entry["ascend"]
    assert (a["block_tokens"], a["block_heads"]) == (a_plan.block_tokens, a_plan.block_heads)
    assert [b["bytes"] for b in a["ub_buffers"]] == [b.nbytes for b in a_plan.ub_buffers]
    assert a["ub_bytes"] == sum(b["bytes"] for b in a["ub_buffers"]) <= a["ub_budget"] < a["ub_capacity"]
    assert a["grid"]["4096"]["programs"] == a_plan.grid(shape, 4096)
    c = entry["cuda"]
    assert (c["block_tokens"], c["block_heads"], c["num_warps"]) == (c_plan.block_tokens, c_plan.block_heads,
                                                                     c_plan.num_warps)
    assert (c["head_blocks"], c["max_registers"]) == (c_plan.head_blocks(shape), c_plan.max_registers)
    assert a["head_blocks"] == a_plan.head_blocks(shape)
    c_small = cuda.small_batch_plan(shape, device.cuda_facts(None))
    small = c["small_batch"]
    assert (small["block_tokens"], small["block_heads"], small["num_warps"]) == (
        c_small.block_tokens, c_small.block_heads, c_small.num_warps)
    assert small["max_tokens"] == cuda.small_batch_max_tokens(shape, device.cuda_facts(None))
    # The grid at each token count is the one the op launches: T=1 under the small-batch plan.
    for tokens, kind in (("1", "small-batch"), ("4096", "large")):
        launched = cuda.plan_for_tokens(shape, device.cuda_facts(None), int(tokens))
        assert c["grid"][tokens] == {"plan": kind, "programs": launched.grid(shape, int(tokens)),
                                     "tiles": launched.num_tiles(shape, int(tokens))}


def test_text_shows_buffers_against_capacity_for_each_tp(cli):
    result = cli("plan", "qwen3-32b", "--tp", "1,8")
    assert result.code == 0
    assert result.out.count("tp=") == 2
    assert "qkv tile" in result.out and "of capacity" in result.out and "budget" in result.out
    assert "grid by tokens" in result.out and "CUDA" in result.out and "Ascend" in result.out
    assert "small-batch plan (up to" in result.out and "(large plan)" in result.out


def test_soc_and_device_overrides(cli):
    data = _plan_json(cli, "Qwen3-8B", "--soc", "Ascend910B1", "--num-sms", "78", "--ub-bytes", "131072")
    entry = data["plans"][0]
    assert entry["ascend"]["soc"] == "Ascend910B1"
    assert entry["ascend"]["vector_cores"] == device.ASCEND_SOC_DEFAULTS["Ascend910B1"][0]
    assert entry["ascend"]["ub_capacity"] == 131072
    assert entry["cuda"]["sms"] == 78 and entry["cuda"]["max_programs"] == 78 * cuda.PROGRAMS_PER_SM


QWEN3 = {"model_type": "qwen3", "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
         "hidden_size": 4096, "rms_norm_eps": 1e-6}
GLM4 = {"model_type": "glm4", "num_attention_heads": 32, "num_key_value_heads": 2, "hidden_size": 4096,
        "partial_rotary_factor": 0.5, "rms_norm_eps": 1.5625e-07}
GEMMA3 = {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "num_attention_heads": 16,
                                                  "num_key_value_heads": 8, "head_dim": 256, "rms_norm_eps": 1e-6}}
PHI2 = {"model_type": "phi", "num_attention_heads": 32, "hidden_size": 2560, "partial_rotary_factor": 0.4,
        "layer_norm_eps": 1e-5}
NEXT = {"model_type": "qwen3_next", "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
        "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-6,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"]}


@pytest.mark.parametrize("config, preset", [(QWEN3, "Qwen3-8B"), (GLM4, "GLM-4-9B"), (GEMMA3, "Gemma-3-12B"),
                                            (PHI2, "Phi-2"), (NEXT, "Qwen3-Next-80B-A3B")])
def test_config_json_reads_as_the_matching_preset(cli, tmp_path, config, preset):
    folder = tmp_path / preset
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    from_config = _plan_json(cli, str(folder), "--tp", "2")["plans"][0]
    from_preset = _plan_json(cli, preset, "--tp", "2")["plans"][0]
    assert from_config["geometry"] == from_preset["geometry"]
    assert from_config["ascend"] == from_preset["ascend"]


def test_config_notes_mixed_layers(cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(NEXT))
    result = cli("plan", str(path))
    assert result.code == 0 and "mixed layers" in result.out


def test_overrides_change_the_geometry(cli):
    entry = _plan_json(cli, "Qwen3-8B", "--gptj", "--no-qk-norm", "--rotary-dim", "64")["plans"][0]
    assert entry["geometry"]["is_neox"] is False
    assert entry["geometry"]["qk_norm"] is False
    assert entry["geometry"]["rotary_dim"] == 64


def test_mha_config_without_kv_heads(cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "num_attention_heads": 8, "hidden_size": 512}))
    geometry = _plan_json(cli, str(path))["plans"][0]["geometry"]
    assert (geometry["num_q_heads"], geometry["num_kv_heads"], geometry["head_dim"]) == (8, 8, 64)
    assert model("Qwen3-8B").name == "Qwen3-8B"


@pytest.mark.parametrize("config, fragment", [
    ({"model_type": "bert"}, "num_attention_heads"),
    ({"num_attention_heads": 0, "hidden_size": 10}, "num_attention_heads"),
    ({"num_attention_heads": 3, "hidden_size": 10}, "hidden_size"),
    ({"num_attention_heads": 4, "head_dim": 64, "partial_rotary_factor": 2}, "partial_rotary_factor"),
    ([1, 2], "JSON object"),
])
def test_bad_configs_are_one_line_errors(cli, tmp_path, config, fragment):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert_one_line_error(cli("plan", str(path)), 2, fragment)


def test_invalid_json_and_missing_files(cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    assert_one_line_error(cli("plan", str(path)), 2, "not valid JSON")
    assert_one_line_error(cli("plan", str(tmp_path / "nope.json")), 2, "no such file")
    assert_one_line_error(cli("plan", str(tmp_path / "empty") + "/"), 2)


@pytest.mark.parametrize("argv, fragment", [
    (("NoSuchModel",), "unknown model"),
    (("Qwen3-8B", "--tp", "3"), "tp=3"),
    (("Qwen3-8B", "--tp", "0"), "--tp"),
    (("Qwen3-8B", "--tokens", "1,x"), "--tokens"),
    (("Qwen3-8B", "--soc", "Ascend999"), "--soc"),
    (("Qwen3-8B", "--dtype", "fp8"), "--dtype"),
    (("Qwen3-8B", "--rotary-dim", "130"), "--rotary-dim"),
    (("Qwen3-8B", "--ub-bytes", "1024"), "fit"),
])
def test_bad_arguments_are_one_line_errors(cli, argv, fragment):
    assert_one_line_error(cli("plan", *argv), 2, fragment)


@pytest.mark.parametrize("config, field", [
    ({"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 15}, "head_dim"),
    ({"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 514}, "head_dim"),
    ({"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 1024}, "head_dim"),
    ({"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 60}, "hidden_size"),
    ({"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128, "partial_rotary_factor": 0.001},
     "partial_rotary_factor"),
    ({"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128, "rotary_dim": 130}, "rotary_dim"),
    ({"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "rotary_dim": 33}, "rotary_dim"),
])
def test_geometries_the_op_refuses_are_one_line_errors(cli, tmp_path, config, field):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = cli("plan", str(path))
    assert_one_line_error(result, 2, str(path), field)
    assert result.out == ""


@pytest.mark.parametrize("rotary", ["130", "3", "0"])
def test_rotary_dim_override_is_checked_by_the_ops_validator(cli, rotary):
    assert_one_line_error(cli("plan", "Qwen3-8B", "--rotary-dim", rotary), 2, "--rotary-dim")


def test_rotary_dim_override_on_a_config_names_the_option(cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3))
    assert_one_line_error(cli("plan", str(path), "--rotary-dim", "256"), 2, str(path), "--rotary-dim 256")


def test_soc_names_are_case_insensitive_and_printed_canonically(cli):
    result = cli("plan", "Qwen3-8B", "--soc", "ascend910b1", "--target", "ascend")
    assert result.code == 0, result.err
    assert "Ascend Ascend910B1 (48 vector cores" in result.out
    assert _plan_json(cli, "Qwen3-8B", "--soc", "ASCEND910_9391")["plans"][0]["ascend"]["soc"] == "Ascend910_9391"


@pytest.mark.parametrize("name, value", [("VLLM_ASCEND_EXT_NUM_SMS", "garbage"), ("VLLM_ASCEND_EXT_SOC", "garbage"),
                                         ("VLLM_ASCEND_EXT_UB_BYTES", "1"), ("VLLM_ASCEND_EXT_VECTOR_CORES", "-3")])
def test_malformed_environment_is_one_line_naming_the_variable(cli, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert_one_line_error(cli("plan", "Qwen3-8B"), 2, f"{name}={value!r}")


def test_environment_soc_is_case_insensitive(cli, monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_EXT_SOC", "ascend910b4")
    assert _plan_json(cli, "Qwen3-8B")["plans"][0]["ascend"]["soc"] == "Ascend910B4"
