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
* epsilon: ``rms_norm_eps`` (or ``layernorm_epsilon`` / ``layer_norm_eps``).

Multimodal configs keep the language model under ``text_config``; it is used when the top
level has no ``num_attention_heads``. Flags on the command line override every guess.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from .common import CliError

__all__ = [
    "DTYPE_BYTES",
    "GPTJ_MODEL_TYPES",
    "OFFSET_NORM_MODEL_TYPES",
    "QK_NORM_MODEL_TYPES",
    "ResolvedModel",
    "parse_int_list",
    "override",
    "resolve_model",
    "shard_checked",
    "spec_from_config",
]

#: Model types whose attention RMS-normalises q and k per head (vLLM's model files).
QK_NORM_MODEL_TYPES = frozenset({
    "qwen3", "qwen3_moe", "qwen3_next", "qwen3_vl_text", "qwen3_vl_moe_text",
    "gemma3", "gemma3_text", "gemma3n_text", "glm4_moe", "mimo_v2_flash", "bailing_moe",
    "dots1", "hunyuan_v1_dense", "hunyuan_v1_moe", "minimax_m2", "olmoe", "ernie4_5_moe",
})
#: Model types whose q/k norm multiplies by ``1 + w`` (Gemma-style).
OFFSET_NORM_MODEL_TYPES = frozenset({"gemma3", "gemma3_text", "gemma3n_text", "qwen3_next"})
#: Model types that rotate adjacent pairs (GPT-J style) rather than halves (NeoX style).
GPTJ_MODEL_TYPES = frozenset({"chatglm", "glm", "glm4", "gptj", "codegen"})
#: Element bytes by the dtype names the CLI accepts.
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class ResolvedModel:
    """A model named on the command line, read into the table's type.

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


def _positive_int(config: dict, key: str, where: str) -> int | None:
    if key not in config or config[key] is None:
        return None
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CliError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def _rotary_factor(config: dict) -> float | None:
    for holder in (config, config.get("rope_parameters"), config.get("rope_scaling")):
        if isinstance(holder, dict) and holder.get("partial_rotary_factor") is not None:
            return holder["partial_rotary_factor"]
    return None


def spec_from_config(config: dict, name: str, where: str = "config.json"):
    """A :class:`ModelSpec` from a Hugging Face config dictionary.

    Parameters
    ----------
    config : dict
        The parsed ``config.json``.
    name : str
        Name to give the spec (the model folder's name, usually).
    where : str
        What to call the config in error messages.

    Returns
    -------
    spec : ModelSpec
    notes : tuple of str
        Guesses and caveats to show the user.
    origins : dict
        The config keys a geometry value was computed from, by the op's argument name, where
        they are not a key of the same name (:attr:`ResolvedModel.origins`).

    Raises
    ------
    CliError
        When a key the geometry needs is missing or malformed. Whether the geometry is one the
        op serves is :func:`shard_checked`'s question (``ops.validation.geometry``).
    """
    from ..ops.models import ModelSpec

    notes = []
    origins = {"num_q_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads"}
    if "num_attention_heads" not in config and isinstance(config.get("text_config"), dict):
        config = config["text_config"]
        notes.append("read the language model's text_config")
    model_type = str(config.get("model_type", "")).lower()
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
    rotary = _positive_int(config, "rotary_dim", where)
    if rotary is None:
        factor = _rotary_factor(config)
        if factor is not None:
            if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
                raise CliError(f"{where}: partial_rotary_factor must be in (0, 1], got {factor!r}")
            rotary = int(head_dim * factor)
            origins["rotary_dim"] = f"partial_rotary_factor {factor!r} x head_dim {head_dim}"
        else:
            rotary = head_dim
            origins["rotary_dim"] = f"head_dim {head_dim} (no rotary_dim or partial_rotary_factor)"
    interleaved = config.get("rope_interleaved", config.get("rotary_interleaved"))
    is_neox = not interleaved if isinstance(interleaved, bool) else model_type not in GPTJ_MODEL_TYPES
    qk_norm = None
    for key in ("use_qk_norm", "qk_norm", "qk_layernorm"):
        if isinstance(config.get(key), bool):
            qk_norm = config[key]
            break
    if qk_norm is None:
        qk_norm = model_type in QK_NORM_MODEL_TYPES
        if not model_type:
            notes.append("no model_type: assumed no q/k norm (pass --qk-norm to change)")
    eps = None
    for key in ("rms_norm_eps", "layernorm_epsilon", "layer_norm_eps", "layer_norm_epsilon"):
        if isinstance(config.get(key), (int, float)) and not isinstance(config.get(key), bool):
            eps = float(config[key])
            break
    if eps is None or not math.isfinite(eps) or eps < 0:
        eps = 1e-6
        notes.append("no rms_norm_eps: assumed 1e-6")
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        kinds = sorted({str(kind) for kind in layer_types})
        if len(kinds) > 1:
            counts = ", ".join(f"{layer_types.count(kind)} {kind}" for kind in kinds)
            notes.append(f"mixed layers ({counts}): the plan is for the attention layers")
    spec = ModelSpec(name=name, num_q_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                     rotary_dim=rotary, is_neox=is_neox, qk_norm=qk_norm,
                     weight_offset=1.0 if model_type in OFFSET_NORM_MODEL_TYPES else 0.0, eps=eps,
                     note=f"from {where}" + (f" (model_type {model_type})" if model_type else ""))
    return spec, tuple(notes), origins


def resolve_model(text: str) -> ResolvedModel:
    """A preset name of ``ops/models.py`` (case-insensitive) or a path to a ``config.json``.

    A folder is taken to hold ``config.json``. ``CliError`` with the known presets when ``text``
    is neither.
    """
    from ..ops.models import MODELS

    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise CliError(f"{text} is a folder without a config.json")
    if path.is_file():
        try:
            config = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"cannot read {path}: {exc}") from None
        except json.JSONDecodeError as exc:
            raise CliError(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
        if not isinstance(config, dict):
            raise CliError(f"{path} is not a JSON object")
        name = path.parent.name or path.stem
        spec, notes, origins = spec_from_config(config, name, str(path))
        return ResolvedModel(spec, str(path), notes, origins)
    for spec in MODELS:
        if spec.name.lower() == text.lower():
            return ResolvedModel(spec, "preset")
    if text.endswith(".json") or "/" in text:
        raise CliError(f"{text}: no such file")
    raise CliError(f"unknown model {text!r}: give a config.json path or one of "
                   f"{', '.join(m.name for m in MODELS)}")


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
    """One rank's geometry at ``tp``, checked by ``ops.validation.geometry`` as the op checks it.

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
        head size of 15 or 1024, a rotary dim of 0...): one line naming the config file (or
        preset) and the field or option the bad value came from.
    """
    from ..ops import validation

    try:
        geometry = resolved.spec.shard(tp)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        shape = validation.geometry(geometry.num_q_heads, geometry.num_kv_heads, geometry.head_dim,
                                    geometry.rotary_dim, is_neox=geometry.is_neox, elem_bytes=elem_bytes,
                                    cache_bytes=cache_bytes)
    except ValueError as exc:
        message = str(exc)
        argument = re.match(r"\w+", message)
        origin = resolved.origins.get(argument.group(0)) if argument else None
        raise CliError(f"{resolved.where}: {message}" + (f" (from {origin})" if origin else "")) from None
    return geometry, shape
