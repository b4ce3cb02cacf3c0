"""Which implementation of ``split_qkv_rmsnorm_rope`` runs: the Triton op or the AscendC kernel.

One decision, in :func:`choose_impl`, driven by ``VLLM_ASCEND_EXT_IMPL`` (read through
:func:`vllm_ascend_ext.ops.settings.impl`, any case):

``auto`` (default)
    Triton when it can serve the call; otherwise the AscendC kernel, with one warning per
    distinct reason. Triton cannot serve when it is not installed, when the device is an NPU and
    the installed Triton is not triton-ascend, on CPU tensors without Triton's interpreter
    (``TRITON_INTERPRET`` on, by :func:`vllm_ascend_ext.ops.settings.triton_interpret`'s rules),
    or for a geometry whose Triton compile failed (:func:`record_triton_failure`, called by the
    worker hook when it precompiles).
``triton``
    Always the Triton op.
``ascendc``
    Always the AscendC kernel; ``RuntimeError`` naming the reason when it cannot serve the call.

The AscendC kernel serves bf16/fp16 qkv with weights and biases of the same dtype, NeoX and
GPT-J, partial rotary, bias, no-norm, any head counts and ``head_dim <= 256``, the variants
mRoPE, gated q, v-norm and q-only layers, and the paged KV-cache write
(``split_qkv_rmsnorm_rope_kv_cache``) into ``nhd`` and ``nz`` caches of qkv's dtype or int8
(``ascendc_plan.SERVED_FEATURES``, ``ascendc_plan.KV_LAYOUTS``); it needs the CANN-built library (see
:func:`vllm_ascend_ext.kernels.ascendc_plan.unsupported_reason`). Where the Triton op supports more (fp32,
mixed weight dtypes, ``head_dim`` up to 512, the cache layouts ``hnd`` and ``cpu_vec``, fp8 and
fp32 caches), ``auto`` keeps Triton and ``ascendc`` refuses naming what it cannot serve. The
q/k norm across heads and TP ranks (``"tp_norm"``, ``split_qkv_tp_rmsnorm_rope``) is the Triton
op's alone.

:func:`run` is what the custom ops (:mod:`vllm_ascend_ext.kernels.custom_ops`) and the KV glue op
run: an op's arguments by name, validated by the op's one validator and routed (:func:`_choose`)
from tensor metadata only (no device access, no host sync) once per launch-cache key, then run on
the route (with ``functional``, in the custom op's output form). :func:`split_qkv_rmsnorm_rope`,
:func:`split_qkv_rmsnorm_rope_kv_cache` and :func:`split_qkv_tp_rmsnorm_rope` are the same with the
Triton ops' signatures and outputs.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import sys
from dataclasses import dataclass

import torch

from ..ops import launch_cache, settings, validation

__all__ = [
    "ENV_IMPL",
    "IMPLS",
    "Choice",
    "ascendc_unavailable_reason",
    "choose_impl",
    "geometry_key",
    "record_triton_failure",
    "requested_impl",
    "run",
    "split_qkv_rmsnorm_rope",
    "split_qkv_rmsnorm_rope_kv_cache",
    "split_qkv_tp_rmsnorm_rope",
    "triton_unavailable_reason",
]

ENV_IMPL = settings.IMPL
IMPLS = settings.IMPLS

logger = logging.getLogger("vllm_ascend_ext")

_triton_failures: dict[tuple, str] = {}
_warned: set[str] = set()
@dataclass(frozen=True)
class Choice:
    """The implementation picked for a call, and why."""

    impl: str  # "triton" or "ascendc"
    reason: str


def requested_impl() -> str:
    """``VLLM_ASCEND_EXT_IMPL``: ``"auto"`` (default), ``"triton"`` or ``"ascendc"``.

    Raises
    ------
    vllm_ascend_ext.ops.settings.SettingError
        A ``ValueError`` naming the variable, when the value is none of those (in any case).
    """
    return settings.impl()


def geometry_key(num_q_heads: int, num_kv_heads: int, head_dim: int, rotary_dim: int, dtype: torch.dtype,
                 is_neox: bool, features: frozenset[str] = frozenset()) -> tuple:
    """The key under which a Triton compile failure is recorded (``features``: the variant's
    ``Call.features``, each compiled apart)."""
    return (num_q_heads, num_kv_heads, head_dim, rotary_dim, str(dtype), bool(is_neox), *sorted(features))


def record_triton_failure(key: tuple, reason: str) -> None:
    """Remember that the Triton kernel failed for ``key`` (:func:`geometry_key`): ``auto`` then
    serves that geometry with AscendC. Whoever records a failure says so (the worker hook logs
    one warning naming the geometry); the selector does not warn again when it routes it."""
    _triton_failures[key] = reason
    launch_cache.clear()  # routes chosen before now may have been Triton's


def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _triton_is_ascend() -> bool:
    try:
        importlib.metadata.distribution("triton-ascend")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def triton_unavailable_reason(device: torch.device, key: tuple | None = None) -> str | None:
    """Why the Triton op cannot serve a call on ``device`` (``None`` when it can).

    Raises
    ------
    vllm_ascend_ext.ops.settings.SettingError
        When ``TRITON_INTERPRET`` holds no boolean (asked for CPU tensors only).
    """
    if not _triton_installed():
        return "triton is not installed"
    kind = torch.device(device).type
    if kind in ("npu", "privateuseone") and not _triton_is_ascend():
        return "the installed triton is not triton-ascend, which NPU tensors need"
    try:
        validation.check_runnable(device)  # CPU tensors: the interpreter, by settings' rules
    except settings.SettingError:
        raise
    except ValueError as exc:
        return str(exc)
    if key is not None and key in _triton_failures:
        return f"the Triton kernel failed for this geometry: {_triton_failures[key]}"
    return None


def _dispatch_key(device: torch.device) -> str:
    kind = torch.device(device).type
    return {"cpu": "CPU", "cuda": "CUDA"}.get(kind, "PrivateUse1")


def ascendc_unavailable_reason(device: torch.device, *, dtype: torch.dtype, head_dim: int,
                               weight_dtypes: tuple[torch.dtype, ...] = (),
                               cache_dtype: torch.dtype | None = None,
                               features: frozenset[str] = frozenset(),
                               kv_cache: validation.KVCacheWrite | None = None,
                               kv_dtype: torch.dtype | None = None) -> str | None:
    """Why the AscendC kernel cannot serve a call (``None`` when it can).

    It needs an implementation for the device's dispatch key (on an NPU: the CANN-built library,
    loaded here on first use) and a call within its feature limits (``features``: the call's
    :attr:`~vllm_ascend_ext.ops.validation.Call.features`; ``kv_cache`` and ``kv_dtype``: the
    cache write's layout and the caches' dtype). With ``kv_cache`` the op looked up is the
    AscendC KV-cache op.
    """
    from . import ascendc, ascendc_plan

    reason = ascendc_plan.unsupported_reason(dtype, head_dim, weight_dtypes=weight_dtypes, cache_dtype=cache_dtype,
                                             features=features, kv_cache=kv_cache, kv_dtype=kv_dtype)
    if reason is not None:
        return reason
    key = _dispatch_key(device)
    if key == "PrivateUse1" and not ascendc.load_npu_library():
        path, problem = ascendc.library_status()
        if path is not None and problem is not None:
            return f"the AscendC library {path} {problem}"
        return (f"the AscendC library {ascendc.LIBRARY_NAME} was not built (no CANN at install time; "
                f"or set {ascendc.ENV_LIBRARY})")
    op_name = ascendc.KV_OP_NAME if kv_cache is not None else ascendc.OP_NAME
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"vllm_ascend_ext::{op_name}", key):
        return f"the AscendC kernel has no {key} implementation (it runs on Ascend NPUs)"
    return None


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


def choose_impl(device: torch.device, *, dtype: torch.dtype, head_dim: int, key: tuple | None = None,
                weight_dtypes: tuple[torch.dtype, ...] = (), cache_dtype: torch.dtype | None = None,
                features: frozenset[str] = frozenset(), op: str = "split_qkv_rmsnorm_rope",
                kv_cache: validation.KVCacheWrite | None = None, kv_dtype: torch.dtype | None = None) -> Choice:
    """Pick Triton or AscendC for one call (the one selection function).

    Parameters
    ----------
    device : torch.device
        Where the tensors live.
    dtype : torch.dtype
        qkv's dtype.
    head_dim : int
        ``D``.
    key : tuple, optional
        :func:`geometry_key` of the call, to honour recorded Triton failures.
    weight_dtypes : tuple of torch.dtype
        Dtypes of the weights and biases passed.
    cache_dtype : torch.dtype, optional
        The cos/sin cache's dtype.
    features : frozenset of str
        The call's optional variants (``Call.features``): the Triton op serves them all, the
        AscendC kernel those :func:`vllm_ascend_ext.kernels.ascendc_plan.unsupported_reason` accepts.
    op : str
        The op's name, for the fallback warning and the error.
    kv_cache : vllm_ascend_ext.ops.validation.KVCacheWrite, optional
        The call's cache write (``Call.kv_cache``): its layout decides whether AscendC serves it.
    kv_dtype : torch.dtype, optional
        The KV caches' dtype.

    Returns
    -------
    Choice

    Raises
    ------
    ValueError
        If ``VLLM_ASCEND_EXT_IMPL`` is invalid.
    RuntimeError
        If ``ascendc`` is requested and cannot serve the call, or ``auto`` finds neither usable.
    """
    mode = requested_impl()
    if mode == "triton":
        return Choice("triton", f"{ENV_IMPL}=triton")
    triton_reason = triton_unavailable_reason(device, key) if mode == "auto" else None
    if mode == "auto" and triton_reason is None:
        return Choice("triton", "auto: Triton can serve the call")
    ascendc_reason = ascendc_unavailable_reason(device, dtype=dtype, head_dim=head_dim,
                                                weight_dtypes=weight_dtypes, cache_dtype=cache_dtype,
                                                features=features, kv_cache=kv_cache, kv_dtype=kv_dtype)
    if mode == "ascendc":
        if ascendc_reason is not None:
            raise RuntimeError(f"{ENV_IMPL}=ascendc, but {ascendc_reason}")
        return Choice("ascendc", f"{ENV_IMPL}=ascendc")
    if ascendc_reason is None:
        if key not in _triton_failures:  # a recorded failure was announced where it was recorded
            _warn_once(f"vllm_ascend_ext: {op} falls back to the AscendC kernel: {triton_reason}")
        return Choice("ascendc", f"auto: {triton_reason}")
    raise RuntimeError(f"{op}: Triton cannot serve this call ({triton_reason}) "
                       f"and neither can the AscendC kernel ({ascendc_reason})")


def _choose(call: validation.Call, qkv: torch.Tensor, cos_sin_cache: torch.Tensor, weights: tuple,
            op: str, kv_dtype: torch.dtype | None = None) -> Choice:
    """:func:`choose_impl` for a validated ``call`` (``weights``: the weights and biases, ``None``
    where absent; ``kv_dtype``: the KV caches' dtype): its features, cache write and geometry key
    from the call, dtypes from the tensors."""
    shape = call.shape
    return choose_impl(qkv.device, dtype=qkv.dtype, head_dim=shape.head_dim,
                       weight_dtypes=tuple(t.dtype for t in weights if t is not None),
                       cache_dtype=cos_sin_cache.dtype, features=call.features, op=op,
                       kv_cache=call.kv_cache, kv_dtype=kv_dtype,
                       key=geometry_key(shape.num_q_heads, shape.num_kv_heads, shape.head_dim,
                                        shape.rotary_dim, qkv.dtype, shape.is_neox, call.features))


class _Router:
    """One routed op: its route per launch-cache key, the call object that serves the call.

    The route is made on a miss by validating once (``validation.<op>``) and choosing
    (:func:`_choose`): the Triton op's entry (``vllm_ascend_ext.ops.<module>.<entry>``), or the
    AscendC call object (:class:`_AscendCRoute`) over the same validated call. The key is the op's
    launch-cache key plus ``VLLM_ASCEND_EXT_IMPL`` as set now
    (:func:`~vllm_ascend_ext.ops.settings.impl_as_set`). An op with no AscendC twin gets AscendC
    from :func:`choose_impl` only if its features were served, which they are not: that would be
    a bug, refused here rather than run on the wrong kernel.

    Parameters
    ----------
    op : str
        The op's name (its validator's in :mod:`vllm_ascend_ext.ops.validation`).
    module, entry : str
        The Triton entry's module under ``vllm_ascend_ext.ops`` and class.
    kv : bool
        Whether the op writes a KV cache.
    """

    def __init__(self, op: str, module: str, entry: str, kv: bool):
        self.op, self.module, self.entry_class, self.kv = op, f"vllm_ascend_ext.ops.{module}", entry, kv
        self.cache = launch_cache.LaunchCache(f"impl.{op}")

    def validate(self, **args) -> validation.Call:
        return getattr(validation, self.op)(**args)  # looked up per miss: tests count validations

    def make(self, call: validation.Call, args: dict):
        """The route of a validated call (on a miss)."""
        kv_dtype = args["key_cache"].dtype if self.kv else None
        weights = tuple(args.get(name) for name in ("q_weight", "k_weight", "q_bias", "k_bias"))
        choice = _choose(call, args["qkv"], args["cos_sin_cache"], weights, self.op, kv_dtype=kv_dtype)
        if choice.impl == "ascendc":
            from . import ascendc

            if not hasattr(ascendc, self.op):
                raise RuntimeError(f"{self.op}: AscendC was chosen but has no implementation of this op")
            return _AscendCRoute(ascendc.Prepared(call, args), args["qkv"])  # the same call: not validated again
        module = sys.modules.get(self.module) or importlib.import_module(self.module)
        return getattr(module, self.entry_class)(call, args)

    def run(self, args: dict, functional: bool = False):
        """Run the call of ``args`` (the op's arguments by name, the Python API's names) on its route."""
        return launch_cache.prepared(self.cache, args, self.validate, self.make, launch_cache.TOKEN_KEYS,
                                     extra=settings.impl_as_set()).run(args, functional=functional)


class _AscendCRoute:
    """An AscendC call object (:class:`vllm_ascend_ext.kernels.ascendc.Prepared`) as a route: its
    ``run`` with the Triton entries' ``functional`` form, made from the API's outputs (``[T, 0]``
    tensors shared per token count, :class:`~vllm_ascend_ext.ops.launch_cache.ZeroWidth`)."""

    __slots__ = ("prepared", "tokens_agree", "zero_width")

    def __init__(self, prepared, qkv: torch.Tensor):
        self.prepared, self.tokens_agree = prepared, prepared.tokens_agree
        self.zero_width = launch_cache.ZeroWidth(qkv.dtype, qkv.device, 3)

    def run(self, args: dict, functional: bool = False):
        outputs = self.prepared.run(args)
        call = self.prepared.call
        if not functional:
            return outputs
        if call.inplace:
            return None
        zero = self.zero_width(args["qkv"].shape[0])
        kept = call.kv_cache is None or call.kv_cache.return_kv
        return (outputs[0], outputs[1] if kept else zero[0], outputs[2] if kept and call.v_norm else zero[1],
                outputs[3] if call.q_gate else zero[2])


#: Each routed op's router (its Triton entry's module and class, whether it writes a KV cache).
_ROUTERS = {"split_qkv_rmsnorm_rope": _Router("split_qkv_rmsnorm_rope", "split_qkv_rmsnorm_rope", "Prepared", False),
            "split_qkv_rmsnorm_rope_kv_cache": _Router("split_qkv_rmsnorm_rope_kv_cache", "split_qkv_rmsnorm_rope",
                                                       "Prepared", True),
            "split_qkv_tp_rmsnorm_rope": _Router("split_qkv_tp_rmsnorm_rope", "split_qkv_tp_rmsnorm_rope",
                                                 "PreparedTP", False)}


def run(op: str, args: dict, functional: bool = False):
    """Run one call of ``op`` on the implementation that serves it (the route cached per
    launch-cache key: Triton's entry or AscendC's call object); what the custom ops, the KV glue
    op and this module's functions call (instrumentation may wrap it: it is looked up per call).

    Parameters
    ----------
    op : str
        ``"split_qkv_rmsnorm_rope"``, ``"split_qkv_rmsnorm_rope_kv_cache"`` or
        ``"split_qkv_tp_rmsnorm_rope"``.
    args : dict
        The call's arguments by name, as the op's Python API names them (``inplace`` among them
        for the first two); a caller passes its ``locals()``.
    functional : bool
        Return the outputs as a functional custom op does
        (:meth:`vllm_ascend_ext.ops.split_qkv_rmsnorm_rope.Prepared.run`): ``(q, k, v, gate)``
        with ``[T, 0]`` tensors of their own for views of qkv and absent outputs; ``None`` in place.

    Returns
    -------
    tuple of torch.Tensor or None
        The API's outputs (``(q, k, v)``, and the gate with ``q_gate``), or the functional form.

    Raises
    ------
    ValueError
        On a bad argument, naming it; on an invalid ``VLLM_ASCEND_EXT_IMPL``.
    RuntimeError
        When no implementation can serve the call (:func:`choose_impl`).
    """
    return _ROUTERS[op].run(args, functional)


def split_qkv_rmsnorm_rope(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads,
                           head_dim, eps=1e-6, *, is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0,
                           inplace=False, mrope_section=None, mrope_interleaved=False, q_gate=False, v_norm=False):
    """The Triton op's API, routed by :func:`choose_impl`: what the custom ops run.

    Parameters and results are those of :func:`vllm_ascend_ext.ops.split_qkv_rmsnorm_rope`
    (``(q, k, v)``, and the gate with ``q_gate``). The arguments go through the op's one
    validator before anything is chosen, so a bad call fails the same way whichever
    implementation would have served it; validation and choice are cached per launch-cache key
    (:mod:`vllm_ascend_ext.ops.launch_cache`), so a later call of the same key launches at once.

    Raises
    ------
    ValueError
        On a bad argument, naming it (a non-bool ``is_neox`` or ``inplace``, a tensor that
        requires grad while grad mode is on, ...); on an invalid ``VLLM_ASCEND_EXT_IMPL``.
    RuntimeError
        When no implementation can serve the call (:func:`choose_impl`).
    """
    return run("split_qkv_rmsnorm_rope", locals())


def split_qkv_rmsnorm_rope_kv_cache(qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache,
                                    slot_mapping, num_q_heads, num_kv_heads, head_dim, eps=1e-6, *,
                                    cache_layout="nhd", k_scale=None, v_scale=None, return_kv=False, is_neox=True,
                                    q_bias=None, k_bias=None, weight_offset=0.0, inplace=False, mrope_section=None,
                                    mrope_interleaved=False, q_gate=False, v_norm=False):
    """The fused prologue with the paged KV-cache write, routed by :func:`choose_impl`.

    Parameters and results are those of
    :func:`vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_kv_cache`. Validated once per key by the
    op's one validator, then routed as the prologue is: ``auto`` runs Triton where it can, else
    the AscendC twin (:func:`vllm_ascend_ext.kernels.ascendc.split_qkv_rmsnorm_rope_kv_cache`) where it
    serves the call (layouts ``nhd``/``nz``, a cache of qkv's dtype or int8);
    ``VLLM_ASCEND_EXT_IMPL=ascendc`` runs the twin or raises naming the layout or cache dtype it
    does not write.

    Raises
    ------
    ValueError
        On a bad argument, naming it; on an invalid ``VLLM_ASCEND_EXT_IMPL``.
    RuntimeError
        When no implementation can serve the call (with ``ascendc``: naming what it does not serve).
    """
    return run("split_qkv_rmsnorm_rope_kv_cache", locals())


def split_qkv_tp_rmsnorm_rope(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads,
                              head_dim, eps=1e-6, *, tp_size=1, all_reduce=None, is_neox=True):
    """The q/k norm across heads and TP ranks (MiniMax-M2), routed by :func:`choose_impl`.

    Parameters and results are those of :func:`vllm_ascend_ext.ops.split_qkv_tp_rmsnorm_rope`.
    Validated once per key, then routed: the call's features include ``"tp_norm"``, which only
    the Triton op serves (``VLLM_ASCEND_EXT_IMPL=ascendc`` raises naming it).

    Raises
    ------
    ValueError
        On a bad argument, naming it; on an invalid ``VLLM_ASCEND_EXT_IMPL``.
    RuntimeError
        When no implementation can serve the call (with ``ascendc``: always, naming ``tp_norm``).
    """
    return run("split_qkv_tp_rmsnorm_rope", locals())
