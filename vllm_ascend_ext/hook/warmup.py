"""The worker hook's warm-up: the launch plans of a model's geometries, the op calls that compile
every kernel variant and plan before the first step (GQA/MQA prologue and MLA), and what failed.

:mod:`vllm_ascend_ext.hook.vllm_integration` calls it after the model is loaded and decides from
its failures what the pass fuses.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace

import torch

from ..ops import settings
from ..ops.models import AttentionGeometry


def failure_reason(exc: BaseException) -> str:
    """A failed warm-up call's reason as the log gives it: the exception's type and the first line
    of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _plan_cases(device: torch.device, geometries, dtype: torch.dtype):
    """Yield ``(geometry, variant, shape, tokens)``: one token count per launch plan of each op
    variant (:func:`op_variants`) of each geometry on ``device`` (on CUDA the small-batch and
    the large plan)."""
    from ..ops.tiling import KernelShape, warm_up_token_counts

    elem = torch.empty((), dtype=dtype).element_size()
    for geo in geometries:
        for variant in op_variants(geo):
            shape = KernelShape.of(variant, elem, elem)
            for tokens in warm_up_token_counts(device, shape):
                yield geo, variant, shape, tokens


def build_plans(device: torch.device, geometries, dtype: torch.dtype) -> list[dict]:
    """The launch plans of every geometry's op variants on ``device`` (the op's own planner; on
    CUDA the small-batch and the large plan), as plain dicts."""
    from ..ops.tiling import plan_for

    plans = []
    for _, variant, shape, tokens in _plan_cases(device, geometries, dtype):
        plan = plan_for(device, shape, tokens)
        plans.append({"geometry": asdict(variant), "tokens": tokens, "plan": type(plan).__name__,
                      "fields": {k: v for k, v in sorted(vars(plan).items())
                                 if isinstance(v, (int, float, str, bool))}})
    return plans


def op_variants(geo: AttentionGeometry) -> list[AttentionGeometry]:
    """The op variants a layer of ``geo`` may call: ``geo`` itself and, for a v-norm geometry,
    the same without the v-norm (what the fusion pass fuses where it cannot prove the graph's
    v-norm weightless: vllm-ascend's ``npu_rms_norm`` with its ones weight)."""
    return [geo, replace(geo, v_norm=False)] if geo.v_norm and geo.num_kv_heads else [geo]


def op_arguments(geo: AttentionGeometry, dtype: torch.dtype, device: torch.device, tokens: int) -> tuple:
    """``(args, kwargs)`` of one call of the functional op for ``geo`` (zeros; ``[3, T]``
    positions for mRoPE, no k weight for a q-only layer): what warm-up runs. For a geometry with
    ``qk_norm_across_heads`` (MiniMax-M2) a call of ``split_qkv_tp_rmsnorm_rope`` at ``tp_size``
    1 (weights of ``H*D``; its kernels do not depend on the TP size, so this compiles what every
    rank runs, without a collective)."""
    if geo.qk_norm_across_heads:
        d = geo.head_dim
        return ((torch.zeros(tokens, geo.qkv_width, dtype=dtype, device=device),
                 torch.ones(geo.num_q_heads * d, dtype=dtype, device=device),
                 torch.ones(geo.num_kv_heads * d, dtype=dtype, device=device),
                 torch.zeros(1, geo.rotary_dim, dtype=dtype, device=device),
                 torch.zeros(tokens, dtype=torch.int64, device=device), geo.num_q_heads, geo.num_kv_heads, d,
                 geo.eps, 1, geo.is_neox), {})
    weight = torch.ones(geo.head_dim, dtype=dtype, device=device) if geo.qk_norm else None
    positions = (3, tokens) if geo.mrope_section is not None else (tokens,)
    args = (torch.zeros(tokens, geo.qkv_width, dtype=dtype, device=device), weight,
            weight if geo.num_kv_heads else None, torch.zeros(1, geo.rotary_dim, dtype=dtype, device=device),
            torch.zeros(*positions, dtype=torch.int64, device=device), geo.num_q_heads, geo.num_kv_heads,
            geo.head_dim, geo.eps)
    options = geo.op_options
    if options["mrope_section"] is not None:
        options["mrope_section"] = list(options["mrope_section"])
    return args, dict(is_neox=geo.is_neox, weight_offset=geo.weight_offset, **options)


def call_features(geo: AttentionGeometry, dtype: torch.dtype) -> frozenset[str]:
    """The op's ``Call.features`` for a call of ``geo`` (asked of the one validator): the
    variant the kernel is compiled for, what :func:`vllm_ascend_ext.kernels.impl.geometry_key` keys on."""
    from ..ops import validation

    args, kwargs = op_arguments(geo, dtype, torch.device("cpu"), 1)
    if geo.qk_norm_across_heads:
        return validation.split_qkv_tp_rmsnorm_rope(*args[:9], tp_size=args[9], is_neox=args[10]).features
    return validation.split_qkv_rmsnorm_rope(*args, **kwargs).features


def warm_up(device: torch.device, geometries, dtype: torch.dtype) -> dict[AttentionGeometry, str]:
    """Run the fused op on ``device`` once per geometry, op variant (:func:`op_variants`) and
    plan (CUDA has a small-batch and a large plan; ``split_qkv_tp_rmsnorm_rope`` at TP 1 for
    MiniMax-M2's norm across heads, see :func:`op_arguments`): Triton compiles each kernel now, not
    inside a graph capture.

    Parameters
    ----------
    device : torch.device
        The worker's device.
    geometries : sequence of AttentionGeometry
        The geometries to compile.
    dtype : torch.dtype
        The model's activation dtype.

    Returns
    -------
    dict
        The geometries whose call raised, each with the reason (the exception's type and the
        first line of its message); a failed geometry's remaining plans are not run.

    Raises
    ------
    vllm_ascend_ext.ops.settings.SettingError
        A bad ``VLLM_ASCEND_EXT_*`` value is the operator's to fix, not a compile failure.
    """
    from ..kernels import custom_ops

    failures: dict[AttentionGeometry, str] = {}
    for geo, variant, _, tokens in _plan_cases(device, geometries, dtype):
        if geo in failures:
            continue
        op = custom_ops.tp_norm_op() if variant.qk_norm_across_heads else custom_ops.functional_op()
        try:
            args, kwargs = op_arguments(variant, dtype, device, tokens)
            op(*args, **kwargs)
        except settings.SettingError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of one geometry's compile or run
            failures[geo] = failure_reason(exc)
    return failures


@dataclass(frozen=True)
class MLAWarmUp:
    """What the MLA warm-up compiles for one MLA geometry: the prologue (without a cache; and with
    vLLM's combined cache of ``block_size`` rows a block in the activation dtype, as the MLA step's
    glue op writes it, when ``block_size`` is set) and ``mla_q_rope_`` (without a q latent, the
    prologue rotating q instead), with a ``cos_sin_cache`` of ``cos_sin_dtype`` (the layers'
    rotary cache)."""

    geometry: object  # vllm_ascend_ext.passes.mla_fusion.MLAGeometry
    cos_sin_dtype: torch.dtype
    block_size: int | None = None


def mla_warm_up_cases(state, layers: dict, dtype: torch.dtype) -> list[MLAWarmUp]:
    """One :class:`MLAWarmUp` per MLA geometry of ``layers``
    (:func:`vllm_ascend_ext.passes.mla_fusion.model_mla_layers`): the cache write is compiled where the MLA
    step will fuse it into at least one of the geometry's layers (``state.mla_cache_layout`` of
    the layer's ``mla_attn.layer_name``, as the pass asks it)."""
    cases = []
    for geo, modules in layers.items():
        buffer = getattr(getattr(modules[0], "rotary_emb", None), "cos_sin_cache", None)
        block_size = None
        if state.mla_cache_layout is not None and state.mla_block_size:
            for module in modules:
                name = getattr(getattr(module, "mla_attn", None), "layer_name", None)
                try:
                    fused = name is not None and state.mla_cache_layout(name)[0]
                except Exception:  # noqa: BLE001 - unknown here: the pass will decide (and may compile)
                    fused = False
                if fused:
                    block_size = int(state.mla_block_size)
                    break
        cases.append(MLAWarmUp(geo, buffer.dtype if isinstance(buffer, torch.Tensor) else dtype, block_size))
    return cases


def mla_op_calls(case: MLAWarmUp, dtype: torch.dtype, device: torch.device, tokens: int = 1) -> list[tuple]:
    """``(name, args, kwargs)`` (``name``: the op's in :mod:`vllm_ascend_ext.kernels.mla_ops` and
    :mod:`~vllm_ascend_ext.ops.validation`) of the calls :func:`mla_warm_up` makes for ``case``
    (zeros, ``tokens`` tokens): ``split_qkv_rmsnorm_rope_mla`` without a cache, the same with vLLM's
    combined cache ``[1, block_size, Lkv + R]`` (activation dtype, ``kv_cache_dtype="auto"``, an
    int64 slot mapping, as the glue op passes them) when ``case.block_size``, and ``mla_q_rope_``
    on ``q [T, H, nope + R]`` (``q_b_proj``'s output viewed per head); without a q latent the
    prologue's calls take that ``q`` instead (the MLA step rotates it in the prologue's launch) and
    there is no ``mla_q_rope_``."""
    from ..kernels import mla_ops

    geo = case.geometry
    zeros = functools.partial(torch.zeros, device=device)
    args = (zeros(tokens, geo.q_lora_rank + geo.kv_lora_rank + geo.rope_dim, dtype=dtype),
            torch.ones(geo.q_lora_rank, dtype=dtype, device=device) if geo.q_lora_rank else None,
            torch.ones(geo.kv_lora_rank, dtype=dtype, device=device), zeros(1, geo.rope_dim, dtype=case.cos_sin_dtype),
            zeros(tokens, dtype=torch.int64), geo.q_lora_rank, geo.kv_lora_rank, geo.rope_dim, geo.eps)
    q = zeros(tokens, geo.num_heads, geo.nope_dim + geo.rope_dim, dtype=dtype)
    in_prologue = {} if geo.q_lora_rank else {"q": q}
    calls = [(mla_ops.MLA_OP_NAME, args, {"is_neox": geo.is_neox, **in_prologue})]
    if case.block_size:
        cache = zeros(1, case.block_size, geo.kv_lora_rank + geo.rope_dim, dtype=dtype)
        calls.append((mla_ops.MLA_OP_NAME, args, dict(is_neox=geo.is_neox, kv_cache=cache,
                                                   slot_mapping=zeros(tokens, dtype=torch.int64),
                                                   kv_cache_dtype="auto", k_scale=None, **in_prologue)))
    if not in_prologue:
        calls.append((mla_ops.Q_ROPE_OP_NAME, (q, args[3], args[4], geo.rope_dim), {"is_neox": geo.is_neox}))
    return calls


def mla_warm_up(device: torch.device, cases, dtype: torch.dtype) -> dict:
    """Run both MLA launches of each geometry once per launch plan (:func:`mla_op_calls` at each of
    ``tiling.mla_warm_up_token_counts``: on CUDA the prologue's small-batch and large plans):
    Triton compiles them now, not at the first step.

    Parameters
    ----------
    device : torch.device
        The worker's device.
    cases : sequence of MLAWarmUp
        What to compile (:func:`mla_warm_up_cases`).
    dtype : torch.dtype
        The model's activation dtype.

    Returns
    -------
    dict
        The geometries whose call raised, each with the reason (the exception's type and the
        first line of its message); a failed geometry's remaining calls are not made.

    Raises
    ------
    vllm_ascend_ext.ops.settings.SettingError
        A bad ``VLLM_ASCEND_EXT_*`` value is the operator's to fix, not a compile failure.
    """
    from ..kernels import mla_ops
    from ..ops import validation_mla
    from ..ops.tiling import mla_warm_up_token_counts

    failures = {}
    for case in cases:
        try:
            calls = mla_op_calls(case, dtype, device)
            _, args, kwargs = calls[0]
            counts = mla_warm_up_token_counts(device, validation_mla.split_qkv_rmsnorm_rope_mla(*args, **kwargs).shape)
            for tokens in counts:
                for name, args, kwargs in calls if tokens == 1 else mla_op_calls(case, dtype, device, tokens):
                    op = mla_ops.q_rope_op() if name == mla_ops.Q_ROPE_OP_NAME else mla_ops.mla_op()
                    op(*args, **kwargs)
        except settings.SettingError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of one geometry's compile or run
            failures[case.geometry] = failure_reason(exc)
    return failures
