"""Model geometry for the CLI: a preset of ``ops/models.py`` or a Hugging Face ``config.json``.

A config is read into the same :class:`~vllm_ascend_ext.ops.models.ModelSpec` the presets use
(no parallel table), from the keys Hugging Face configs publish:

* heads: ``num_attention_heads``; kv heads: ``num_key_value_heads`` (``multi_query_group_num``
  in ChatGLM-style configs; default: as many as q heads);
* head size: ``head_dim`` (``kv_channels`` in ChatGLM-style configs), else
  ``hidden_size / num_attention_heads``;
* rotary dims: ``rotary_dim``, else ``partial_rotary_factor`` (top level, or inside
  ``rope_parameters`` / ``rope_scaling``) times the head size, else the whole head;
* rotary style: GPT-J (interleaved pairs) for the model types in :data:`GPTJ_MODEL_TYPES` or
  when the config says ``rope_interleaved`` / ``rotary_interleaved``; NeoX otherwise;
* q/k norm: ``use_qk_norm`` / ``qk_norm`` / ``qk_layernorm`` when the config has one, else by
  ``model_type`` (:data:`QK_NORM_MODEL_TYPES`); ``(1 + w)`` norms for :data:`OFFSET_NORM_MODEL_TYPES`;
* epsilon: ``rms_norm_eps`` (or ``layernorm_epsilon`` / ``layer_norm_eps``);
* mRoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5): ``mrope_section`` (three lanes counts t/h/w)
  and ``mrope_interleaved`` in ``rope_parameters`` / ``rope_scaling``, as vLLM's ``get_rope``
  reads them;
* a gate beside each q head (Qwen3-Next, Qwen3.5): ``attn_output_gate`` when the config has
  it, else by ``model_type`` (:data:`GATED_MODEL_TYPES`: vLLM's ``Qwen3NextAttention`` gates
  unless told not to);
* v-norm (Gemma-4): by ``model_type`` (:data:`V_NORM_MODEL_TYPES`), on every layer that
  projects k and v.

Layer types: ``layer_types`` names each layer's kind. Only softmax-attention kinds
(:data:`ATTENTION_LAYER_TYPES`) have the op's prologue (Qwen3-Next's ``linear_attention`` layers
do not). Gemma-4 gives its kinds different geometries: full-attention layers take
``global_head_dim`` (transformers' default 512 when absent) and, with ``attention_k_eq_v``,
``num_global_key_value_heads``; each kind's rotary comes from ``rope_parameters[<kind>]``
(``"proportional"`` RoPE rotates the whole head in vLLM: R = D); an explicit
``per_layer_config`` (layer index -> overrides) replaces that derivation, as in transformers;
the last ``num_kv_shared_layers`` layers project q only (``num_kv_heads = 0``). Each distinct
geometry is one spec, named ``<model>:<kind>`` when there are several (``plan`` prints each).

Multimodal configs keep the language model under ``text_config``; it is used when the top
level has no ``num_attention_heads``. Flags on the command line override every guess.

A key the reader uses must be of its kind, or the command stops with one line naming the file
and the key: a boolean is ``true``/``false`` (not ``"true"``), a count a positive integer up to
:data:`MAX_CONFIG_INT` (not ``"8"``, ``8.0``, ``true`` or a 400-digit number), an epsilon a
finite number, ``model_type`` a string, ``rope_scaling`` / ``rope_parameters`` / ``text_config``
objects. The file itself is read by :func:`~vllm_ascend_ext.cli.common.read_json` (nesting and
integers Python cannot read).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from .common import CliError, read_json, shown

__all__ = [
    "ATTENTION_LAYER_TYPES",
    "DTYPE_BYTES",
    "GATED_MODEL_TYPES",
    "GLOBAL_GEOMETRY_MODEL_TYPES",
    "GPTJ_MODEL_TYPES",
    "MAX_CONFIG_INT",
    "OFFSET_NORM_MODEL_TYPES",
    "QK_NORM_MODEL_TYPES",
    "V_NORM_MODEL_TYPES",
    "ResolvedModel",
    "parse_int_list",
    "override",
    "resolve_model",
    "resolve_models",
    "shard_checked",
    "specs_from_config",
]

#: Model types whose attention RMS-normalises q and k per head (vLLM's model files).
QK_NORM_MODEL_TYPES = frozenset({
    "qwen3", "qwen3_moe", "qwen3_next", "qwen3_vl_text", "qwen3_vl_moe_text",
    "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text",
    "gemma3", "gemma3_text", "gemma3n_text", "gemma4", "gemma4_text", "glm4_moe", "mimo_v2_flash",
    "bailing_moe", "dots1", "hunyuan_v1_dense", "hunyuan_v1_moe", "minimax_m2", "olmoe", "ernie4_5_moe",
})
#: Model types whose q/k norm multiplies by ``1 + w`` (Gemma-style; Qwen3-Next's and Qwen3.5's
#: ``Qwen3NextRMSNorm`` is vLLM's ``GemmaRMSNorm``). Gemma-4's is a plain RMSNorm.
OFFSET_NORM_MODEL_TYPES = frozenset({"gemma3", "gemma3_text", "gemma3n_text", "qwen3_next",
                                     "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"})
#: Model types that rotate adjacent pairs (GPT-J style) rather than halves (NeoX style).
GPTJ_MODEL_TYPES = frozenset({"chatglm", "glm", "glm4", "gptj", "codegen"})
#: Model types whose q carries an output gate when the config has no ``attn_output_gate``.
GATED_MODEL_TYPES = frozenset({"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"})
#: Model types that RMS-normalise v without a weight (Gemma-4's ``v_norm``).
V_NORM_MODEL_TYPES = frozenset({"gemma4", "gemma4_text"})
#: ``layer_types`` entries that are softmax attention (with the op's q/k/v prologue).
ATTENTION_LAYER_TYPES = frozenset({"attention", "full_attention", "sliding_attention", "chunked_attention"})
#: Element bytes by the dtype names the CLI accepts.
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
#: Model types whose full-attention layers take ``global_head_dim`` and, with
#: ``attention_k_eq_v``, ``num_global_key_value_heads`` (transformers' ``Gemma4TextConfig``).
GLOBAL_GEOMETRY_MODEL_TYPES = frozenset({"gemma4", "gemma4_text"})
#: ``global_head_dim`` when such a config leaves it out (``Gemma4TextConfig``'s default).
GEMMA4_GLOBAL_HEAD_DIM = 512
#: The largest count a config key may give (heads, head size, hidden size, layers, mRoPE lanes):
#: 2**20, 64 times the largest published (hidden_size 16384, Llama-3.1-405B). A larger one is a
#: typo, and a layer count of 10**400 kept ``plan`` counting layers until memory ran out
#: (2**20 layers take about 5 s on the 2-core CI machine).
MAX_CONFIG_INT = 1 << 20
#: Keys that give the norm's epsilon, in the order read.
EPS_KEYS = ("rms_norm_eps", "layernorm_epsilon", "layer_norm_eps", "layer_norm_epsilon")


@dataclass(frozen=True)
class ResolvedModel:
    """A model (or one of its layer geometries) named on the command line, read into the
    table's type.

    Attributes
    ----------
    spec : ModelSpec
        Whole-model geometry (shard it with :meth:`ModelSpec.shard`).
    source : str
        ``"preset"`` or the path of the ``config.json`` read.
    notes : tuple of str
        What was guessed or worth knowing (mixed layer types, defaults taken).
    origins : dict
        Where a geometry value came from when it was not a key of the same name, by the op's
        argument name: ``{"rotary_dim": "partial_rotary_factor 0.5"}``, ``{"rotary_dim":
        "--rotary-dim 130"}``. Error lines name it.
    """

    spec: object
    source: str
    notes: tuple[str, ...] = ()
    origins: dict = field(default_factory=dict)

    @property
    def where(self) -> str:
        """The model as error lines name it: the config file, or ``preset <name>``."""
        return f"preset {self.spec.name}" if self.source == "preset" else self.source


def parse_int_list(text: str, name: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)``; ``CliError`` naming ``name`` unless all are positive ints."""
    try:
        values = tuple(int(part) for part in str(text).split(",") if part.strip())
    except ValueError:
        raise CliError(f"{name} must be a comma-separated list of positive integers, got {text!r}") from None
    if not values or any(value < 1 for value in values):
        raise CliError(f"{name} must be a comma-separated list of positive integers, got {text!r}")
    return values


def _positive_int(config: dict, key: str, where: str, field_name: str | None = None) -> int | None:
    if key not in config or config[key] is None:
        return None
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONFIG_INT:
        raise CliError(f"{where}: {field_name or key} must be a positive integer (at most {MAX_CONFIG_INT}), "
                       f"got {shown(value)}")
    return value


def _flag(config: dict, key: str, where: str, field_name: str | None = None) -> bool | None:
    """A boolean key (``None`` when absent); anything but true/false is an error naming it."""
    if config.get(key) is None:
        return None
    if not isinstance(config[key], bool):
        raise CliError(f"{where}: {field_name or key} must be true or false, got {shown(config[key])}")
    return config[key]


def _first_flag(config: dict, keys: tuple[str, ...], where: str) -> bool | None:
    """The first of ``keys`` the config sets (each, when set, a boolean), or ``None``."""
    for key in keys:
        value = _flag(config, key, where)
        if value is not None:
            return value
    return None


def _model_type(config: dict, where: str) -> str:
    """``model_type`` lower-cased (``""`` when absent); a string or an error naming it."""
    value = config.get("model_type")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise CliError(f"{where}: model_type must be a string, got {shown(value)}")
    return value.lower()


def _eps(config: dict, where: str) -> float | None:
    """The first of :data:`EPS_KEYS` the config sets, a finite number >= 0, or ``None``."""
    for key in EPS_KEYS:
        value = config.get(key)
        if value is None:
            continue
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an integer past float's range
                pass
        if number is None or not math.isfinite(number) or number < 0:
            raise CliError(f"{where}: {key} must be a finite number >= 0, got {shown(value)}")
        return number
    return None


def _check_objects(config: dict, where: str) -> None:
    """``rope_parameters`` and ``rope_scaling``, when set, are objects (an error naming the key)."""
    for key in ("rope_parameters", "rope_scaling"):
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise CliError(f"{where}: {key} must be an object, got {shown(config[key])}")


def _rope_holders(config: dict, kind: str | None) -> list[tuple[str, dict]]:
    """The dictionaries rotary keys are read from, with their names for error lines: the layer
    kind's own ``rope_parameters[<kind>]`` (Gemma-4), then ``rope_parameters``, ``rope_scaling``."""
    holders = []
    for key in ("rope_parameters", "rope_scaling"):
        holder = config.get(key)
        if isinstance(holder, dict):
            if kind is not None and isinstance(holder.get(kind), dict):
                holders.append((f"{key}.{kind}", holder[kind]))
            holders.append((key, holder))
    return holders


def _rotary_factor(config: dict, kind: str | None) -> tuple[str, object] | None:
    for name, holder in [("", config)] + _rope_holders(config, kind):
        if holder.get("partial_rotary_factor") is not None:
            return (f"{name}." if name else "") + "partial_rotary_factor", holder["partial_rotary_factor"]
    return None


def _rope_type(config: dict, kind: str | None, where: str) -> tuple[str, str] | None:
    for name, holder in _rope_holders(config, kind):
        key = "rope_type" if holder.get("rope_type") is not None else "type"
        value = holder.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise CliError(f"{where}: {name}.{key} must be a string, got {shown(value)}")
        return f"{name}.rope_type", value
    return None


def _mrope(config: dict, where: str) -> tuple[tuple[int, int, int] | None, bool, str | None]:
    """mRoPE's sections, whether they interleave, and the field the sections came from."""
    for name, holder in _rope_holders(config, None):
        if holder.get("mrope_section") is None:
            continue
        section = holder["mrope_section"]
        if not isinstance(section, list) or len(section) != 3 or any(
                isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_CONFIG_INT for v in section):
            raise CliError(f"{where}: {name}.mrope_section must be three non-negative integers (t, h, w), "
                           f"got {shown(section)}")
        interleaved = _flag(holder, "mrope_interleaved", where, f"{name}.mrope_interleaved")
        return tuple(section), bool(interleaved), f"{name}.mrope_section"
    return None, False, None


def _layer_kinds(config: dict, where: str) -> tuple[list[str] | None, int]:
    """``layer_types`` (checked) and the number of layers."""
    layer_types = config.get("layer_types")
    if layer_types is None:
        return None, _positive_int(config, "num_hidden_layers", where) or 0
    if not isinstance(layer_types, list) or not layer_types or not all(isinstance(k, str) for k in layer_types):
        raise CliError(f"{where}: layer_types must be a non-empty list of layer type names, "
                       f"got {shown(layer_types)}")
    layers = _positive_int(config, "num_hidden_layers", where)
    if layers is not None and layers != len(layer_types):
        raise CliError(f"{where}: layer_types names {len(layer_types)} layers, num_hidden_layers is {layers}")
    return layer_types, len(layer_types)


def _per_layer_overrides(config: dict, where: str) -> dict[int, dict] | None:
    """``per_layer_config`` as ``{layer index: overrides}``, or ``None`` when absent."""
    raw = config.get("per_layer_config")
    if raw is None:
        return None
    pairs = list(enumerate(raw)) if isinstance(raw, list) else list(raw.items()) if isinstance(raw, dict) else None
    # An index is ASCII digits, no more than a layer count has ("²" is a digit to str.isdigit).
    if pairs is None or not all(isinstance(value, dict) and re.fullmatch(r"[0-9]{1,7}", str(index))
                                for index, value in pairs):
        raise CliError(f"{where}: per_layer_config must map layer indices to objects of overrides, got {shown(raw)}")
    return {int(index): value for index, value in pairs}


def _base_fields(config: dict, where: str, notes: list[str]) -> tuple[dict, dict, str]:
    """What every layer shares: heads, head size, style, norm, eps, gate, mRoPE."""
    origins = {"num_q_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads"}
    model_type = _model_type(config, where)
    heads = _positive_int(config, "num_attention_heads", where)
    if heads is None:
        raise CliError(f"{where} has no num_attention_heads: not a decoder-attention config")
    kv_heads = _positive_int(config, "num_key_value_heads", where)
    if kv_heads is None:
        kv_heads = _positive_int(config, "multi_query_group_num", where)
        origins["num_kv_heads"] = "multi_query_group_num"
    if kv_heads is None:
        origins["num_kv_heads"] = "num_attention_heads (no num_key_value_heads)"
        kv_heads = heads
        notes.append("no num_key_value_heads: kv heads = q heads (MHA)")
    head_dim = _positive_int(config, "head_dim", where)
    if head_dim is None:
        head_dim = _positive_int(config, "kv_channels", where)
        origins["head_dim"] = f"kv_channels {head_dim}"
    if head_dim is None:
        hidden = _positive_int(config, "hidden_size", where)
        if hidden is None:
            raise CliError(f"{where} has neither head_dim nor hidden_size")
        if hidden % heads:
            raise CliError(f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        head_dim = hidden // heads
        origins["head_dim"] = f"hidden_size {hidden} / num_attention_heads {heads}"
    interleaved = _first_flag(config, ("rope_interleaved", "rotary_interleaved"), where)
    is_neox = not interleaved if interleaved is not None else model_type not in GPTJ_MODEL_TYPES
    qk_norm = _first_flag(config, ("use_qk_norm", "qk_norm", "qk_layernorm"), where)
    if qk_norm is None:
        qk_norm = model_type in QK_NORM_MODEL_TYPES
        if not model_type:
            notes.append("no model_type: assumed no q/k norm (pass --qk-norm to change)")
    eps = _eps(config, where)
    if eps is None:
        eps = 1e-6
        notes.append("no rms_norm_eps: assumed 1e-6")
    q_gate = _flag(config, "attn_output_gate", where)
    if q_gate is None:
        q_gate = model_type in GATED_MODEL_TYPES
    else:
        origins["q_gate"] = "attn_output_gate"
    section, mrope_interleaved, section_origin = _mrope(config, where)
    if section_origin:
        origins["mrope_section"] = section_origin
    fields = dict(num_q_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, is_neox=is_neox,
                  qk_norm=qk_norm, weight_offset=1.0 if model_type in OFFSET_NORM_MODEL_TYPES else 0.0,
                  eps=eps, q_gate=q_gate, mrope_section=section, mrope_interleaved=mrope_interleaved)
    return fields, origins, model_type


def _rotary(config: dict, kind: str | None, head_dim: int, where: str) -> tuple[int, str | None]:
    """The rotary dims of a layer kind, and where they came from (``None``: a key of that name)."""
    rotary = _positive_int(config, "rotary_dim", where)
    if rotary is not None:
        return rotary, None
    rope_type = _rope_type(config, kind, where)
    if rope_type is not None and rope_type[1] == "proportional":
        # vLLM's Gemma4RotaryEmbedding: the frequencies past partial_rotary_factor are zero, and
        # the whole head is rotated (cos 1, sin 0 on those pairs): the cache is head_dim wide.
        return head_dim, f"{rope_type[0]} proportional: the whole head {head_dim}"
    factor = _rotary_factor(config, kind)
    if factor is not None:
        name, value = factor
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise CliError(f"{where}: {name} must be in (0, 1], got {shown(value)}")
        return int(head_dim * value), f"{name} {value!r} x head_dim {head_dim}"
    return head_dim, f"head_dim {head_dim} (no rotary_dim or partial_rotary_factor)"


def specs_from_config(config: dict, name: str, where: str = "config.json") -> tuple[list, tuple[str, ...]]:
    """The geometries of a Hugging Face config's attention layers, one :class:`ModelSpec` each.

    Parameters
    ----------
    config : dict
        The parsed ``config.json``.
    name : str
        Name to give the spec (the model folder's name, usually); with several geometries each
        is named ``<name>:<layer kind>``.
    where : str
        What to call the config in error messages.

    Returns
    -------
    specs : list of (ModelSpec, dict)
        Each geometry with its origins: the config keys a value was computed from, by the op's
        argument name, where they are not a key of the same name (:attr:`ResolvedModel.origins`).
    notes : tuple of str
        Guesses and caveats to show the user.

    Raises
    ------
    CliError
        When a key the geometry needs is missing or malformed (one line naming the file and the
        field). Whether a geometry is one the op serves is :func:`shard_checked`'s question
        (``ops.validation.geometry``).
    """
    from ..ops.models import ModelSpec

    notes: list[str] = []
    if "num_attention_heads" not in config and config.get("text_config") is not None:
        if not isinstance(config["text_config"], dict):
            raise CliError(f"{where}: text_config must be an object, got {shown(config['text_config'])}")
        outer_type = _model_type(config, where)
        config = config["text_config"]
        if "model_type" not in config and outer_type:
            config = config | {"model_type": outer_type}
        notes.append("read the language model's text_config")
    _check_objects(config, where)
    base, base_origins, model_type = _base_fields(config, where, notes)
    layer_types, num_layers = _layer_kinds(config, where)
    kv_shared = config.get("num_kv_shared_layers")
    kv_shared = 0 if kv_shared is None else kv_shared
    if isinstance(kv_shared, bool) or not isinstance(kv_shared, int) or not 0 <= kv_shared <= max(num_layers, 0) \
            or (kv_shared and not num_layers):
        raise CliError(f"{where}: num_kv_shared_layers must be an integer in [0, {num_layers}] (the layers), "
                       f"got {shown(kv_shared)}")
    per_layer = _per_layer_overrides(config, where)
    k_eq_v = bool(_flag(config, "attention_k_eq_v", where))
    global_kv = _positive_int(config, "num_global_key_value_heads", where)
    global_head_dim = _positive_int(config, "global_head_dim", where)
    v_norm = model_type in V_NORM_MODEL_TYPES
    if layer_types is not None:
        kinds = sorted(set(layer_types))
        if len(kinds) > 1:
            counts = ", ".join(f"{layer_types.count(kind)} {kind}" for kind in kinds)
            notes.append(f"mixed layers ({counts}): the plan is for the attention layers")
    attention = [i for i, kind in enumerate(layer_types or ()) if kind in ATTENTION_LAYER_TYPES]
    if layer_types is not None and not attention:
        notes.append("no layer type of layer_types is softmax attention: the plan takes every layer as one")
    layers = [(i, layer_types[i]) for i in attention] if attention else [(i, None) for i in range(max(num_layers, 1))]
    first_shared = num_layers - kv_shared
    groups: dict = {}  # geometry -> [kinds, layer count, origins]
    for index, kind in layers:
        fields, origins = dict(base), dict(base_origins)
        override = per_layer.get(index, {}) if per_layer is not None else {}
        if per_layer is None and kind == "full_attention" and model_type in GLOBAL_GEOMETRY_MODEL_TYPES:
            # Gemma-4 (transformers' Gemma4TextConfig): full layers take the global geometry.
            fields["head_dim"] = global_head_dim or GEMMA4_GLOBAL_HEAD_DIM
            origins["head_dim"] = "global_head_dim" if global_head_dim else \
                f"no global_head_dim: transformers' default {GEMMA4_GLOBAL_HEAD_DIM}"
            if k_eq_v and global_kv is not None:
                fields["num_kv_heads"] = global_kv
                origins["num_kv_heads"] = "num_global_key_value_heads (attention_k_eq_v)"
        for key, target in (("head_dim", "head_dim"), ("num_key_value_heads", "num_kv_heads"),
                            ("num_attention_heads", "num_q_heads")):
            if key in override:
                fields[target] = _positive_int(override, key, where, f"per_layer_config.{index}.{key}")
                origins[target] = f"per_layer_config.{index}.{key}"
        rotary, rotary_origin = _rotary(config, kind, fields["head_dim"], where)
        fields["rotary_dim"] = rotary
        if rotary_origin:
            origins["rotary_dim"] = rotary_origin
        shared = kv_shared > 0 and index >= first_shared
        fields["v_norm"] = v_norm and not shared
        if shared:
            fields["num_kv_heads"] = 0
            origins["num_kv_heads"] = "num_kv_shared_layers (q only)"
        label = (kind or "attention").removesuffix("_attention") + ("-kv-shared" if shared else "")
        entry = groups.setdefault(tuple(sorted(fields.items())), [[], 0, origins])
        if label not in entry[0]:
            entry[0].append(label)
        entry[1] += 1
    specs = []
    for fields, (labels, count, origins) in groups.items():
        fields = dict(fields)
        spec_name = name if len(groups) == 1 else f"{name}:{'+'.join(labels)}"
        note = f"from {where}" + (f" (model_type {model_type})" if model_type else "")
        if len(groups) > 1:
            note += f"; {count} of {len(layer_types or layers)} layers"
        specs.append((ModelSpec(name=spec_name, note=note, **fields), origins))
    return specs, tuple(notes)


def _preset_rows(text: str) -> list:
    """Rows of ``ops/models.py`` called ``text``, or whose model is (``Gemma-4-31B`` names
    ``Gemma-4-31B:sliding`` and ``Gemma-4-31B:full``); case-insensitive."""
    from ..ops.models import MODELS

    wanted = text.lower()
    exact = [spec for spec in MODELS if spec.name.lower() == wanted]
    return exact or [spec for spec in MODELS if spec.name.lower().split(":")[0] == wanted]


def resolve_models(text: str) -> list[ResolvedModel]:
    """Every geometry of a preset (its rows) or a ``config.json`` (its layer kinds).

    ``text`` is a preset name of ``ops/models.py`` (case-insensitive; a model's name without
    ``:<layer kind>`` gives all its rows) or a path to a ``config.json`` (a folder is taken to
    hold one). ``CliError`` with the known presets when ``text`` is neither.
    """
    from ..ops.models import MODELS

    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise CliError(f"{text} is a folder without a config.json")
    if path.is_file():
        config = read_json(path)
        if not isinstance(config, dict):
            raise CliError(f"{path} is not a JSON object")
        name = path.parent.name or path.stem
        specs, notes = specs_from_config(config, name, str(path))
        return [ResolvedModel(spec, str(path), notes, origins) for spec, origins in specs]
    rows = _preset_rows(text)
    if rows:
        return [ResolvedModel(spec, "preset") for spec in rows]
    if text.endswith(".json") or "/" in text:
        raise CliError(f"{text}: no such file")
    models = sorted({m.name.split(":")[0] for m in MODELS}, key=[m.name.split(":")[0] for m in MODELS].index)
    raise CliError(f"unknown model {text!r}: give a config.json path or one of {', '.join(models)} "
                   "(a model with layer kinds also as <model>:<kind>)")


def resolve_model(text: str) -> ResolvedModel:
    """The first geometry :func:`resolve_models` gives (a model with several layer kinds: its
    first; name ``<model>:<kind>`` for another)."""
    return resolve_models(text)[0]


def override(resolved: ResolvedModel, *, is_neox=None, qk_norm=None, rotary_dim=None) -> ResolvedModel:
    """``resolved`` with the command line's overrides applied (``None`` keeps a field).

    The values are not checked here: :func:`shard_checked` checks the geometry and names
    ``--rotary-dim`` when that is what is wrong.
    """
    changes = {key: value for key, value in
               (("is_neox", is_neox), ("qk_norm", qk_norm), ("rotary_dim", rotary_dim)) if value is not None}
    if not changes:
        return resolved
    origins = dict(resolved.origins)
    if rotary_dim is not None:
        origins["rotary_dim"] = f"--rotary-dim {rotary_dim}"
    return replace(resolved, spec=replace(resolved.spec, **changes), origins=origins)


def shard_checked(resolved: ResolvedModel, tp: int, elem_bytes: int = 2, cache_bytes: int = 4):
    """One rank's geometry at ``tp``, checked by ``ops.validation`` as the op checks it.

    Parameters
    ----------
    resolved : ResolvedModel
        The model (a preset or a config, with any overrides).
    tp : int
        Tensor-parallel size.
    elem_bytes, cache_bytes : int
        Element sizes of qkv and of the cos/sin cache.

    Returns
    -------
    geometry : AttentionGeometry
    shape : KernelShape

    Raises
    ------
    CliError
        Exit status 2 when ``tp`` does not shard the model, or the op refuses the geometry (a
        head size of 15 or 1024, a rotary dim of 0, mRoPE sections that do not sum to R/2...):
        one line naming the config file (or preset) and the field or option the bad value
        came from.
    """
    from ..ops import validation

    try:
        geometry = resolved.spec.shard(tp)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        shape = validation.geometry(geometry.num_q_heads, geometry.num_kv_heads, geometry.head_dim,
                                    geometry.rotary_dim, is_neox=geometry.is_neox, elem_bytes=elem_bytes,
                                    cache_bytes=cache_bytes, q_gate=geometry.q_gate, v_norm=geometry.v_norm,
                                    mrope=geometry.mrope_section is not None,
                                    norm_across_heads=geometry.qk_norm_across_heads, qk_norm=geometry.qk_norm)
        validation.mrope_section_of(geometry.mrope_section, geometry.rotary_dim)
    except ValueError as exc:
        message = str(exc)
        argument = re.match(r"\w+", message)
        origin = resolved.origins.get(argument.group(0)) if argument else None
        raise CliError(f"{resolved.where}: {message}" + (f" (from {origin})" if origin else "")) from None
    return geometry, shape
