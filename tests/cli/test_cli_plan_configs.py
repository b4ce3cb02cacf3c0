"""``plan`` on issue 10's models: mRoPE, the gated q, v-norm and Gemma-4's layer kinds, read from
trimmed copies of their real configs (``hf_configs``) into the geometries of ``ops/models.py``."""

import copy
import json

import pytest

from cli_helpers import assert_one_line_error
from hf_configs import (GEMMA4_26B_A4B, GEMMA4_31B, GEMMA4_E2B, QWEN2_5_VL_7B, QWEN3_5_35B_A3B, QWEN3_VL_8B,
                        QWEN3_VL_30B_A3B)
from vllm_ascend_ext.cli.geometry import resolve_model, resolve_models
from vllm_ascend_ext.ops.models import MODELS, model


def _write(tmp_path, config, folder="model"):
    path = tmp_path / folder / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    return path


def _plans(cli, *argv):
    result = cli("plan", *argv, "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def _by_geometry(data):
    """``{geometry name: {tp: entry}}`` of a ``plan --json`` answer."""
    out = {}
    for entry in data["plans"]:
        out.setdefault(entry["name"], {})[entry["tp"]] = entry
    return out


@pytest.mark.parametrize("config, preset, tps", [
    (QWEN2_5_VL_7B, "Qwen2.5-VL-7B", "1,2,4"),
    (QWEN3_VL_8B, "Qwen3-VL-8B", "1,2,4,8"),
    (QWEN3_VL_30B_A3B, "Qwen3-VL-30B-A3B", "1,2,4,8"),
    (QWEN3_5_35B_A3B, "Qwen3.5-35B-A3B", "1,2,4,8"),
    (GEMMA4_31B, "Gemma-4-31B", "1,2,4,8"),
    (GEMMA4_26B_A4B, "Gemma-4-26B-A4B", "1,2,4,8"),
    (GEMMA4_E2B, "Gemma-4-E2B", "1,2,4,8"),
], ids=lambda v: v if isinstance(v, str) and "," not in v else None)
def test_real_configs_read_as_the_table_rows(cli, tmp_path, config, preset, tps):
    """Every geometry a config gives is the table's row of that model and layer kind, with the
    same plans, at every TP size the model runs at."""
    from_config = _by_geometry(_plans(cli, str(_write(tmp_path, config, preset)), "--tp", tps))
    from_preset = _by_geometry(_plans(cli, preset, "--tp", tps))
    assert list(from_config) == list(from_preset)  # same layer kinds, in the table's order
    for name, entries in from_preset.items():
        assert list(from_config[name]) == [int(tp) for tp in tps.split(",")]
        for tp, entry in entries.items():
            assert from_config[name][tp]["geometry"] == entry["geometry"], (name, tp)
            assert from_config[name][tp]["ascend"] == entry["ascend"], (name, tp)
            assert from_config[name][tp]["cuda"] == entry["cuda"], (name, tp)


def test_gemma4_layer_kinds_and_their_layer_counts(tmp_path):
    resolved = resolve_models(str(_write(tmp_path, GEMMA4_E2B, "gemma-4-E2B")))
    assert [r.spec.name for r in resolved] == ["gemma-4-E2B:sliding", "gemma-4-E2B:full",
                                              "gemma-4-E2B:sliding-kv-shared", "gemma-4-E2B:full-kv-shared"]
    assert [r.spec.note.split("; ")[1] for r in resolved] == [
        "12 of 35 layers", "3 of 35 layers", "16 of 35 layers", "4 of 35 layers"]
    full = resolved[1]
    assert (full.spec.head_dim, full.spec.rotary_dim, full.spec.v_norm) == (512, 512, True)
    assert full.origins["head_dim"] == "global_head_dim"
    assert "proportional" in full.origins["rotary_dim"]
    shared = resolved[3]
    assert (shared.spec.num_kv_heads, shared.spec.v_norm, shared.spec.qk_norm) == (0, False, True)
    # A single geometry is what the other subcommands take: the first.
    assert resolve_model(str(tmp_path / "gemma-4-E2B" / "config.json")).spec.name == "gemma-4-E2B:sliding"


def test_gemma4_k_eq_v_takes_the_global_kv_heads_only_when_set(tmp_path):
    config = copy.deepcopy(GEMMA4_31B)
    full = {r.spec.name: r for r in resolve_models(str(_write(tmp_path, config, "a")))}["a:full"]
    assert full.spec.num_kv_heads == 4 and "num_global_key_value_heads" in full.origins["num_kv_heads"]
    config["text_config"]["attention_k_eq_v"] = False
    full = {r.spec.name: r for r in resolve_models(str(_write(tmp_path, config, "b")))}["b:full"]
    assert full.spec.num_kv_heads == 16


def test_per_layer_config_replaces_the_global_keys(tmp_path):
    """transformers' explicit per-layer overrides (sparse, by layer index) win over the
    global_head_dim derivation."""
    config = copy.deepcopy(GEMMA4_31B)
    text = config["text_config"]
    for key in ("global_head_dim", "num_global_key_value_heads", "attention_k_eq_v"):
        del text[key]
    text["per_layer_config"] = {str(i): {"head_dim": 128, "num_key_value_heads": 8}
                                for i, kind in enumerate(text["layer_types"]) if kind == "full_attention"}
    specs = {r.spec.name: r for r in resolve_models(str(_write(tmp_path, config, "m")))}
    assert (specs["m:full"].spec.head_dim, specs["m:full"].spec.num_kv_heads, specs["m:full"].spec.rotary_dim) == \
        (128, 8, 128)
    assert specs["m:full"].origins["head_dim"] == "per_layer_config.5.head_dim"
    assert specs["m:sliding"].spec.head_dim == 256


def test_gemma3_layer_kinds_of_one_geometry_stay_one(tmp_path):
    config = {"model_type": "gemma3_text", "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
              "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}
    resolved = resolve_models(str(_write(tmp_path, config, "g3")))
    assert [r.spec.name for r in resolved] == ["g3"]


def test_gate_follows_the_config_key_over_the_model_type(tmp_path):
    config = copy.deepcopy(QWEN3_5_35B_A3B)
    assert resolve_model(str(_write(tmp_path, config, "a"))).spec.q_gate is True
    config["text_config"]["attn_output_gate"] = False
    assert resolve_model(str(_write(tmp_path, config, "b"))).spec.q_gate is False
    next_config = {"model_type": "qwen3_next", "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256}
    assert resolve_model(str(_write(tmp_path, next_config, "c"))).spec.q_gate is True  # vLLM's default


def test_text_names_every_feature_and_geometry(cli):
    result = cli("plan", "Gemma-4-E2B", "--tp", "2", "--target", "ascend")
    assert result.code == 0, result.err
    out = result.out
    for name in ("Gemma-4-E2B:sliding", "Gemma-4-E2B:full", "Gemma-4-E2B:sliding-kv-shared",
                 "Gemma-4-E2B:full-kv-shared"):
        assert f"== {name}: " in out
    assert "v RMSNorm (no weight)" in out and "no k/v (q only)" in out
    assert "qkv tile (q + k + v arms)" in out and "qkv tile (q arm)" in out
    out = cli("plan", "Qwen3.5-27B", "--target", "ascend").out
    assert "gate beside q" in out and "mRoPE interleaved t/h/w 11/11/10" in out
    assert "cos/sin rows (t, h, w axes)" in out and "qkv tile (q + k + gate arms)" in out
    assert "mRoPE contiguous t/h/w 16/24/24" in cli("plan", "Qwen2.5-VL-7B").out


def test_a_layer_kind_preset_alone(cli):
    data = _plans(cli, "gemma-4-31b:FULL")
    assert [g["name"] for g in data["geometries"]] == ["Gemma-4-31B:full"]
    assert data["plans"][0]["geometry"]["head_dim"] == 512


@pytest.mark.parametrize("spec", MODELS, ids=lambda s: s.name)
def test_every_row_plans_at_every_tp_it_runs_at(cli, spec):
    """The op's validator accepts every row of the table at each TP size vLLM runs it at."""
    data = _plans(cli, spec.name, "--tp", ",".join(map(str, spec.tp_sizes)), "--tokens", "1")
    assert [entry["tp"] for entry in data["plans"]] == list(spec.tp_sizes)
    for entry in data["plans"]:
        geometry = model(spec.name).shard(entry["tp"])
        assert entry["geometry"]["label"] == geometry.label


def test_tp_the_model_cannot_run_at(cli):
    assert_one_line_error(cli("plan", "Qwen2.5-VL-7B", "--tp", "8"), 2, "tp=8", "28 q heads")


def _edited(config, text_level=True, **changes):
    config = copy.deepcopy(config)
    target = config["text_config"] if text_level else config
    for key, value in changes.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    return config


@pytest.mark.parametrize("config, fragments", [
    (_edited(QWEN2_5_VL_7B, False, rope_scaling={"type": "mrope", "mrope_section": [16, 24]}),
     ["rope_scaling.mrope_section", "three non-negative integers"]),
    (_edited(QWEN2_5_VL_7B, False, rope_scaling={"type": "mrope", "mrope_section": [16, 24, -1]}),
     ["rope_scaling.mrope_section"]),
    (_edited(QWEN2_5_VL_7B, False, rope_scaling={"type": "mrope", "mrope_section": [16, 24, 23]}),
     ["mrope_section", "sum to rotary_dim/2 = 64", "(from rope_scaling.mrope_section)"]),
    (_edited(QWEN3_VL_8B, rope_scaling={"mrope_section": [24, 20, 20], "mrope_interleaved": "yes"}),
     ["rope_scaling.mrope_interleaved", "true or false"]),
    (_edited(QWEN3_5_35B_A3B, attn_output_gate="yes"), ["attn_output_gate", "true or false"]),
    (_edited(GEMMA4_31B, layer_types="sliding_attention"), ["layer_types", "list"]),
    (_edited(GEMMA4_31B, num_hidden_layers=59), ["layer_types names 60 layers", "num_hidden_layers is 59"]),
    (_edited(GEMMA4_E2B, num_kv_shared_layers=36), ["num_kv_shared_layers", "[0, 35]"]),
    (_edited(GEMMA4_E2B, num_kv_shared_layers="20"), ["num_kv_shared_layers"]),
    (_edited(GEMMA4_31B, per_layer_config=[1, 2]), ["per_layer_config"]),
    (_edited(GEMMA4_31B, per_layer_config={"5": {"head_dim": 0}}), ["per_layer_config.5.head_dim"]),
    (_edited(GEMMA4_31B, attention_k_eq_v="true"), ["attention_k_eq_v", "true or false"]),
    (_edited(GEMMA4_31B, global_head_dim=1024), ["head_dim must be even and at most 512", "(from global_head_dim)"]),
    (_edited(GEMMA4_31B, num_global_key_value_heads=0), ["num_global_key_value_heads", "positive integer"]),
    (_edited(GEMMA4_31B, rope_parameters={"full_attention": {"rope_type": "default", "partial_rotary_factor": 2},
                                          "sliding_attention": {"rope_type": "default"}}),
     ["rope_parameters.full_attention.partial_rotary_factor", "(0, 1]"]),
])
def test_bad_issue10_keys_are_one_line_errors_naming_the_file_and_field(cli, tmp_path, config, fragments):
    path = _write(tmp_path, config)
    result = cli("plan", str(path))
    assert_one_line_error(result, 2, str(path), *fragments)
    assert result.out == ""


# Issue 29: what a config file can hold that is not a config. Each is one line naming the file
# and, where it has one, the field; exit 2; no plan.

_LLAMA = {"model_type": "llama", "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 128}


def _short_id(value):
    """A test id for a parameter: its text, cut to 24 characters (a 401-digit integer would be the id)."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} chars)"


def _write_text(tmp_path, text):
    path = tmp_path / "m" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _plan_fails(cli, path, *fragments):
    result = cli("plan", str(path))
    assert_one_line_error(result, 2, str(path), *fragments)
    assert result.out == ""


@pytest.mark.parametrize("depth", [65, 900, 100_000])
def test_deeply_nested_array_names_the_file_field_and_line(cli, tmp_path, depth):
    """Past Python's stack (100 000) the reader fails; between 64 levels and that, it reads a value
    no config holds; either way the line names the field the nesting is under."""
    text = '{"num_attention_heads": 8, "head_dim": 128,\n"layer_types": ' + "[" * depth + "]" * depth + "}"
    _plan_fails(cli, _write_text(tmp_path, text), "layer_types[0][0]", "more than 64 levels", "line 2")


def test_deeply_nested_top_level_names_the_file(cli, tmp_path):
    _plan_fails(cli, _write_text(tmp_path, "[" * 100_000 + "]" * 100_000), "more than 64 levels", "line 1")


@pytest.mark.parametrize("key, text, field", [
    ("num_attention_heads", "1" * 5000, "num_attention_heads"),
    ("rope_scaling", '{"mrope_section": [16, 24, %s]}' % ("2" * 5000), "rope_scaling.mrope_section[2]"),
    ("vocab_size", "-" + "9" * 5000, "vocab_size"),  # a key plan does not read: the file is still not a config
], ids=_short_id)
def test_integer_too_long_for_python_names_the_file_and_field(cli, tmp_path, key, text, field):
    body = json.dumps(_LLAMA)[:-1] + f', "{key}": {text}}}'
    _plan_fails(cli, _write_text(tmp_path, body), field, "5000 digits")


@pytest.mark.parametrize("key", ["num_attention_heads", "num_key_value_heads", "head_dim", "rotary_dim",
                                 "num_hidden_layers"])
@pytest.mark.parametrize("value", [10 ** 400, 2 ** 20 + 1], ids=_short_id)
def test_integers_past_any_model_are_refused(cli, tmp_path, key, value):
    """Python reads a 401-digit integer; no model has it (a layer count that large kept `plan`
    counting layers until memory ran out). The line stays short."""
    result = cli("plan", str(_write(tmp_path, _LLAMA | {key: value})))
    assert_one_line_error(result, 2, key, "at most 1048576")
    assert len(result.err) < 300


@pytest.mark.parametrize("key", ["rope_interleaved", "rotary_interleaved", "use_qk_norm", "qk_norm", "qk_layernorm"])
@pytest.mark.parametrize("value", ["true", "false", 1, 0, [True]])
def test_boolean_keys_given_anything_but_a_boolean(cli, tmp_path, key, value):
    """``"rope_interleaved": "true"`` was read as no key at all: the geometry silently NeoX."""
    _plan_fails(cli, _write(tmp_path, _LLAMA | {key: value}), key, "true or false")


@pytest.mark.parametrize("key, value, expected", [
    ("rope_interleaved", True, ("is_neox", False)),
    ("rotary_interleaved", True, ("is_neox", False)),
    ("rope_interleaved", False, ("is_neox", True)),
    ("use_qk_norm", True, ("qk_norm", True)),
    ("qk_layernorm", True, ("qk_norm", True)),
])
def test_boolean_keys_given_a_boolean_are_followed(tmp_path, key, value, expected):
    spec = resolve_model(str(_write(tmp_path, _LLAMA | {key: value}))).spec
    assert getattr(spec, expected[0]) is expected[1]


def test_false_rope_interleaved_wins_over_the_model_type(tmp_path):
    spec = resolve_model(str(_write(tmp_path, _LLAMA | {"model_type": "glm4", "rope_interleaved": False}))).spec
    assert spec.is_neox is True


@pytest.mark.parametrize("key, value, fragments", [
    ("rms_norm_eps", "1e-6", ["rms_norm_eps", "a finite number >= 0"]),
    ("rms_norm_eps", True, ["rms_norm_eps"]),
    ("rms_norm_eps", -1e-6, ["rms_norm_eps"]),
    ("layernorm_epsilon", 10 ** 400, ["layernorm_epsilon"]),
    ("num_attention_heads", "8", ["num_attention_heads", "positive integer"]),
    ("num_attention_heads", True, ["num_attention_heads", "positive integer"]),
    ("head_dim", 128.0, ["head_dim", "positive integer"]),
    ("model_type", 5, ["model_type", "a string"]),
    ("model_type", ["glm4"], ["model_type", "a string"]),
    ("rope_scaling", "linear", ["rope_scaling", "an object"]),
    ("rope_parameters", [1], ["rope_parameters", "an object"]),
    ("rope_scaling", {"rope_type": 5}, ["rope_scaling.rope_type", "a string"]),
    ("rope_scaling", {"mrope_section": [16, 24, 10 ** 400]}, ["rope_scaling.mrope_section"]),
    ("text_config", "qwen3", ["text_config", "an object"]),
], ids=_short_id)
def test_keys_of_the_wrong_kind_name_the_file_and_field(cli, tmp_path, key, value, fragments):
    config = {k: v for k, v in _LLAMA.items() if key != "text_config" or k != "num_attention_heads"}
    result = cli("plan", str(_write(tmp_path, config | {key: value})))
    assert_one_line_error(result, 2, *fragments)
    assert len(result.err) < 300


@pytest.mark.parametrize("key, value, fragments", [
    ("num_kv_shared_layers", False, ["num_kv_shared_layers"]),
    ("num_kv_shared_layers", 10 ** 400, ["num_kv_shared_layers"]),
    ("per_layer_config", {"\u00b2": {"head_dim": 128}}, ["per_layer_config"]),
    ("per_layer_config", {"1" * 5000: {"head_dim": 128}}, ["per_layer_config"]),
    ("per_layer_config", {"5": {"head_dim": "128"}}, ["per_layer_config.5.head_dim"]),
], ids=_short_id)
def test_gemma4_keys_of_the_wrong_kind(cli, tmp_path, key, value, fragments):
    result = cli("plan", str(_write(tmp_path, _edited(GEMMA4_E2B if "shared" in key else GEMMA4_31B, **{key: value}))))
    assert_one_line_error(result, 2, *fragments)
    assert len(result.err) < 300
