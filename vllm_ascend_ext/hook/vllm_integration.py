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
   (:func:`vllm_ascend_ext.kernels.impl.record_triton_failure`): it stays fused, served by the AscendC
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
from dataclasses import asdict, dataclass, field

import torch

from ..ops import settings
from ..ops.models import AttentionGeometry
from .steps import kv_cache_layout, kv_cache_split_hint, kv_cache_step, mla_step
from .warmup import build_plans, call_features, mla_op_calls, mla_warm_up, mla_warm_up_cases, op_variants, warm_up

__all__ = [
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
    #: The model's MLA geometries (:mod:`vllm_ascend_ext.passes.mla_fusion`), fused by the pass's MLA step.
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
    from ..ops import device as dev

    kind = dev.device_kind(device)
    if kind == "cuda":
        return {"backend": "cuda", **asdict(dev.cuda_facts(device.index))}
    index = device.index if kind == "ascend" else None
    if kind == "ascend" and index is None:
        index = torch.npu.current_device()  # pragma: no cover - needs an NPU
    return {"backend": kind, **asdict(dev.ascend_facts(index))}


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
    from ..passes.mla_fusion import model_mla_layers, model_mla_skipped

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
    (:func:`vllm_ascend_ext.kernels.impl.record_triton_failure`; ``auto`` then routes calls of its
    :func:`~vllm_ascend_ext.kernels.impl.geometry_key` to AscendC). It stays fused when the AscendC
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
    from ..kernels import impl

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


def settle_mla_geometries(state: WorkerState, layers: dict, dtype: torch.dtype) -> None:
    """Warm up the model's MLA geometries (:func:`mla_warm_up`) and decide what the MLA step fuses:
    a geometry whose warm-up failed is left unfused (``state.mla_unfused``; the MLA step's log line
    counts its layers in the total, not in the fused), with one WARNING for all of them (there is
    no AscendC MLA kernel to fall back to). The MLA plans of the fused geometries join the digest.
    """
    from ..ops import validation_mla
    from ..ops.tiling import mla_plan_for

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
            shape = getattr(validation_mla, name)(*args, **kwargs).shape
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

    from ..passes.vllm_pass import make_vllm_pass

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
