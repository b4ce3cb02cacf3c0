"""The AscendC fallback of ``split_qkv_rmsnorm_rope`` and ``split_qkv_rmsnorm_rope_kv_cache``: the
CANN-built library, the torch ops and the Python API.

The kernel class lives in ``csrc/split_qkv_rmsnorm_rope/``; the KV-cache op's entries, launch and
binding in ``csrc/split_qkv_rmsnorm_rope_kv_cache/`` (the same class with the SQRR_FLAG_KV_* flags).
Everything it is told comes from :mod:`vllm_ascend_ext.kernels.ascendc_plan` (the plan from the
Triton plan, the UB buffer list, the tiling struct, what the kernel serves).

Torch ops (namespace ``vllm_ascend_ext``; schemas from :func:`vllm_ascend_ext.kernels.schema.schemas`,
the one spelling of the argument list):

* ``split_qkv_rmsnorm_rope_ascendc(qkv, q_weight, k_weight, cos_sin_cache, positions,
  num_q_heads, num_kv_heads, head_dim, eps=1e-6, *, is_neox=True, q_bias=None, k_bias=None,
  weight_offset=0.0, mrope_section=None, mrope_interleaved=False, q_gate=False, v_norm=False)
  -> (q, k, v, gate)``: new q ``[T, Hq*D]`` and k ``[T, Hkv*D]``; v ``[T, Hkv*D]`` with
  ``v_norm`` and ``[T, 0]`` otherwise, gate ``[T, Hq*D]`` with ``q_gate`` and ``[T, 0]``
  otherwise (the custom op's outputs, sized by ``schema.fake_outputs``);
* ``split_qkv_rmsnorm_rope_ascendc_(qkv!, ...) -> ()``: the same, written into ``qkv`` (and
  ``qkv``'s autograd version counter bumped, as the Triton op does).

Every implementation validates with the op's one validator
(:func:`vllm_ascend_ext.ops.validation.split_qkv_rmsnorm_rope`) and then the kernel's own limits
(:func:`~vllm_ascend_ext.kernels.ascendc_plan.unsupported_reason`), ``ValueError`` naming the
argument either way: the fakes on every call, the real ones once per launch-cache key
(:class:`Prepared`, the validated call object, made by the launch cache or handed over by the
caller that already holds it). Both ops have a fake implementation always and a PrivateUse1 (NPU)
one only when the CANN-built library ``libvllm_ascend_ext_ascendc.so`` loads
(:func:`load_npu_library`; :func:`library_status` says whether one is there, without loading
it). :func:`make_impl` builds an implementation around any launch callable: the tests register
the host build of the kernel on the CPU key with it (``tests/csrc/host_sim.py``).
:func:`split_qkv_rmsnorm_rope` is the Python API of the Triton op (``inplace`` flag; returns
``(q, k, v)``, and the gate after them with ``q_gate``).

The KV-cache write: ``split_qkv_rmsnorm_rope_kv_cache_ascendc`` (the custom op's schema,
``schema.KV_CACHE_SCHEMA``) and ``..._ascendc_`` (in place), built by :func:`make_kv_impl`,
validated by ``validation.split_qkv_rmsnorm_rope_kv_cache`` then ``unsupported_reason`` (layouts
``ascendc_plan.KV_LAYOUTS``, a cache of qkv's dtype or int8);
:func:`split_qkv_rmsnorm_rope_kv_cache` is the Python API of the Triton op
``ops.split_qkv_rmsnorm_rope_kv_cache``.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import torch

from . import schema
from ..ops import launch_cache, settings, validation
from .ascendc_plan import Tiling, forced_plan, tiling, unsupported_reason

__all__ = [
    "ENV_LIBRARY",
    "INPLACE_OP_NAME",
    "KV_INPLACE_OP_NAME",
    "KV_OP_NAME",
    "LIBRARY_NAME",
    "OP_NAME",
    "Prepared",
    "library_path",
    "library_status",
    "load_npu_library",
    "kv_schemas",
    "make_impl",
    "make_kv_impl",
    "split_qkv_rmsnorm_rope",
    "split_qkv_rmsnorm_rope_kv_cache",
]

ENV_LIBRARY = settings.ASCENDC_LIB
LIBRARY_NAME = "libvllm_ascend_ext_ascendc.so"

OP_NAME = "split_qkv_rmsnorm_rope_ascendc"
INPLACE_OP_NAME = OP_NAME + "_"
#: The AscendC twin of ``split_qkv_rmsnorm_rope_kv_cache`` (functional, and ``_`` in place).
KV_OP_NAME = "split_qkv_rmsnorm_rope_kv_cache_ascendc"
KV_INPLACE_OP_NAME = KV_OP_NAME + "_"


def _validate(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps,
              *, is_neox, q_bias, k_bias, weight_offset, inplace, mrope_section=None, mrope_interleaved=False,
              q_gate=False, v_norm=False, fake: bool = False) -> validation.Call:
    """The op's one validator (``schema.validate_fake``'s form in fakes), then the kernel's limits.

    ``ValueError`` naming the argument either way; a variant the kernel does not serve (its
    :attr:`~vllm_ascend_ext.ops.validation.Call.features`) is refused by name.
    """
    validate = schema.validate_fake if fake else validation.split_qkv_rmsnorm_rope
    call = validate(
        qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps,
        is_neox=is_neox, q_bias=q_bias, k_bias=k_bias, weight_offset=weight_offset, inplace=inplace,
        mrope_section=mrope_section, mrope_interleaved=mrope_interleaved, q_gate=q_gate, v_norm=v_norm)
    weights = tuple(t.dtype for t in (q_weight, k_weight, q_bias, k_bias) if t is not None)
    reason = unsupported_reason(qkv.dtype, call.shape.head_dim, weight_dtypes=weights,
                                cache_dtype=cos_sin_cache.dtype, features=call.features)
    if reason is not None:
        raise ValueError(reason)
    return call


# --- torch ops ------------------------------------------------------------------------------------
_lib = torch.library.Library(schema.NAMESPACE, "FRAGMENT")
for _schema in schema.schemas(OP_NAME):
    _lib.define(_schema)


def _outputs(qkv: torch.Tensor, call: validation.Call) -> tuple[torch.Tensor, ...]:
    """What the kernel writes, ``(q, k, v, gate)``, as the functional op returns them.

    q and k are new ``[T, Hq*D]`` / ``[T, Hkv*D]`` tensors, or their columns of ``qkv`` in place;
    v is ``[T, Hkv*D]`` with ``v_norm`` (new, or its columns of ``qkv`` in place) and ``[T, 0]``
    otherwise; the gate is a new ``[T, Hq*D]`` with ``q_gate`` (never in place: the validator
    refuses it) and ``[T, 0]`` otherwise.
    """
    if not call.inplace:
        return schema.fake_outputs(qkv, call.shape)
    shape = call.shape
    q_cols, kv_cols = shape.num_q_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    tokens = qkv.shape[0]
    v = qkv[:, q_cols + kv_cols:q_cols + 2 * kv_cols] if shape.v_norm else qkv.new_empty((tokens, 0))
    return qkv[:, :q_cols], qkv[:, q_cols:q_cols + kv_cols], v, qkv.new_empty((tokens, 0))


@torch.library.register_fake(f"{schema.NAMESPACE}::{OP_NAME}", lib=_lib)
def _fake(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps=1e-6, *,
          is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0, **features):
    call = _validate(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps,
                     is_neox=is_neox, q_bias=q_bias, k_bias=k_bias, weight_offset=weight_offset, inplace=False,
                     fake=True, **features)
    return schema.fake_outputs(qkv, call.shape)


@torch.library.register_fake(f"{schema.NAMESPACE}::{INPLACE_OP_NAME}", lib=_lib)
def _fake_inplace(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps=1e-6,
                  *, is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0, **features):
    _validate(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps,
              is_neox=is_neox, q_bias=q_bias, k_bias=k_bias, weight_offset=weight_offset, inplace=True, fake=True,
              **features)
    return None

#: The launch caches of the AscendC ops (the prologue and the KV-cache write; functional and in
#: place share them: ``inplace`` is in the key).
_CACHE = launch_cache.LaunchCache("ascendc.split_qkv_rmsnorm_rope")
_KV_CACHE = launch_cache.LaunchCache("ascendc.split_qkv_rmsnorm_rope_kv_cache")
#: The entry a :meth:`Prepared.run` hands to the op implementation it dispatches to (this thread).
_handoff = threading.local()


def _entry(cache: launch_cache.LaunchCache, args: dict, validate) -> Prepared:
    """The call object of an op implementation's call: the one :meth:`Prepared.run` handed over
    for this very ``qkv``, else the launch cache's (validated once per key)."""
    entry = getattr(_handoff, "entry", None)
    if entry is not None and _handoff.qkv is args["qkv"]:
        return entry
    return launch_cache.prepared(cache, args, validate, Prepared, launch_cache.TOKEN_KEYS)


class Prepared:
    """A validated call of the AscendC kernel (prologue, or with ``call.kv_cache`` the KV-cache
    write), for every token count: the call object its route, its Python API and its torch ops
    pass around.

    Made once per launch-cache key from the op's validated :class:`~vllm_ascend_ext.ops.validation.Call`
    (the Triton route's object, or this module's cache's); refuses what the kernel does not serve
    (:func:`unsupported_reason`, ``ValueError``). Keeps the :class:`Tiling` and block count per
    token count (none while ``ascendc_plan.forced`` forces a plan). :meth:`run` dispatches the
    AscendC torch op of the device with this entry handed over (no second validation),
    :meth:`launch` is what that op runs.

    Parameters
    ----------
    call : vllm_ascend_ext.ops.validation.Call
        The validated call.
    args : dict
        The call's arguments by name, as the Python API takes them (``inplace`` among them).
    """

    tokens_agree = staticmethod(launch_cache.tokens_agree)

    def __init__(self, call: validation.Call, args: dict):
        qkv, kv = args["qkv"], call.kv_cache
        weights = tuple(args[n].dtype for n in ("q_weight", "k_weight", "q_bias", "k_bias") if args[n] is not None)
        reason = unsupported_reason(qkv.dtype, call.shape.head_dim, weight_dtypes=weights,
                                    cache_dtype=args["cos_sin_cache"].dtype, features=call.features, kv_cache=kv,
                                    kv_dtype=None if kv is None else args["key_cache"].dtype)
        if reason is not None:
            raise ValueError(reason)
        self.call, self.kv = call, kv is not None
        shape = call.shape
        self.q_cols, self.kv_cols = shape.num_q_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
        self.k_col = shape.num_q_heads * shape.q_head_stride
        self.int8 = self.kv and args["key_cache"].dtype == torch.int8
        self.device_index = None if qkv.device.type == "cpu" else qkv.device.index
        name = (KV_OP_NAME if self.kv else OP_NAME) + ("_" if call.inplace else "")
        self._op = getattr(getattr(torch.ops, schema.NAMESPACE), name).default
        self._tilings: dict[int, tuple[Tiling, int]] = {}

    def run(self, args: dict):
        """The Python API's call on ``args``: the AscendC op dispatched (per device) with this entry
        handed over; ``(q, k, v)``, and the gate with ``q_gate`` (see :func:`split_qkv_rmsnorm_rope`)."""
        call, qkv = self.call, args["qkv"]
        op_args = dict(args)
        del op_args["inplace"]
        _handoff.entry, _handoff.qkv, _handoff.outputs = self, qkv, None
        try:
            self._op(**op_args)
            q, k, v, gate = _handoff.outputs
        finally:
            _handoff.entry = _handoff.qkv = _handoff.outputs = None
        v_view = None if call.v_norm and not call.inplace else qkv[:, self.k_col + self.kv_cols:
                                                                     self.k_col + 2 * self.kv_cols]
        if self.kv:
            if call.inplace:
                k = qkv[:, self.k_col:self.k_col + self.kv_cols]
            v = v if v_view is None else v_view
            if not call.kv_cache.return_kv:
                k = v = qkv.new_empty((qkv.shape[0], 0))
            return (q, k, v) + ((gate,) if call.q_gate and not call.inplace else ())
        return (q, k, v if v_view is None else v_view) + ((gate,) if call.q_gate else ())

    def launch(self, args: dict, launch) -> tuple[torch.Tensor, ...]:
        """Allocate the op's outputs ``(q, k, v, gate)`` (:func:`_outputs`, :func:`_kv_outputs`), run
        ``launch`` (:func:`make_impl`'s or :func:`make_kv_impl`'s) on them, return them."""
        call, qkv = self.call, args["qkv"]
        if self.kv:
            q, k, v, gate = _kv_outputs(qkv, call)
            return_kv = call.kv_cache.return_kv
            k_out, v_out = (k if return_kv else None), (v if return_kv and call.v_norm else None)
        else:
            q, k, v, gate = _outputs(qkv, call)
            k_out, v_out = k, (v if call.v_norm else None)
        gate_out = gate if call.q_gate else None
        tokens = qkv.shape[0]
        if tokens > 0:
            t, block_dim = self._tiling(tokens, args, q, k_out, v_out, gate_out)
            weights = (args["q_weight"], args["k_weight"], args["q_bias"], args["k_bias"])
            if self.kv:
                launch(qkv, q, k_out, v_out, gate_out, args["cos_sin_cache"], args["positions"], *weights,
                       args["key_cache"], args["value_cache"], args["slot_mapping"],
                       args["k_scale"] if self.int8 else None, args["v_scale"] if self.int8 else None, block_dim, t)
            else:
                launch(qkv, q, k_out, v_out, gate_out, args["cos_sin_cache"], args["positions"], *weights,
                       block_dim, t)
            call.mark_written(qkv)
        outputs = (q, k, v, gate)
        if getattr(_handoff, "entry", None) is self:
            _handoff.outputs = outputs
        return outputs

    def _tiling(self, tokens: int, args: dict, q, k_out, v_out, gate_out) -> tuple[Tiling, int]:
        """:func:`tiling` for ``tokens``, kept per token count (every other input is the key's)."""
        kept = self._tilings.get(tokens)
        if kept is not None and forced_plan() is None:
            return kept
        t, block_dim, _ = tiling(self.call, args["qkv"], q, k_out, args["cos_sin_cache"], args["positions"],
                                 v_out=v_out, gate_out=gate_out, key_cache=args.get("key_cache"),
                                 value_cache=args.get("value_cache"), slot_mapping=args.get("slot_mapping"),
                                 device_index=self.device_index, num_tokens=tokens)
        if forced_plan() is None:
            if len(self._tilings) >= launch_cache.MAX_TOKEN_COUNTS:
                self._tilings.clear()
            self._tilings[tokens] = t, block_dim
        return t, block_dim


def make_impl(launch, inplace: bool):
    """A backend implementation of the functional (or in-place) AscendC op around ``launch``.

    Parameters
    ----------
    launch : callable
        ``launch(qkv, q, k, v, gate, cos_sin_cache, positions, q_weight, k_weight, q_bias, k_bias,
        block_dim, tiling)``: runs the kernel on ``block_dim`` vector cores with the
        :class:`Tiling` ``tiling`` (the NPU library's launch op, or the tests' host build);
        ``v`` and ``gate`` are ``None`` unless the call writes them (``v_norm``, ``q_gate``).
    inplace : bool
        Build the implementation of ``split_qkv_rmsnorm_rope_ascendc_`` (q and k written into
        ``qkv``, whose autograd version counter is then bumped unless it is an inference
        tensor) rather than of the functional op.

    Returns
    -------
    callable
        The implementation, with the op's schema as its signature (the variants' keyword
        arguments :data:`vllm_ascend_ext.kernels.schema.FEATURES` included), to register with
        ``torch.library.Library.impl`` under :data:`OP_NAME` or :data:`INPLACE_OP_NAME`. The
        functional one returns ``(q, k, v, gate)`` as ``schema.fake_outputs`` sizes them.
    """

    def impl(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps=1e-6, *,
             is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0, mrope_section=None, mrope_interleaved=False,
             q_gate=False, v_norm=False):
        args = dict(qkv=qkv, q_weight=q_weight, k_weight=k_weight, cos_sin_cache=cos_sin_cache, positions=positions,
                    num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, eps=eps, is_neox=is_neox,
                    q_bias=q_bias, k_bias=k_bias, weight_offset=weight_offset, inplace=inplace,
                    mrope_section=mrope_section, mrope_interleaved=mrope_interleaved, q_gate=q_gate, v_norm=v_norm)
        outputs = _entry(_CACHE, args, validation.split_qkv_rmsnorm_rope).launch(args, launch)
        return None if inplace else outputs

    return impl


# --- split_qkv_rmsnorm_rope_kv_cache --------------------------------------------------------------
def kv_schemas() -> tuple[str, str]:
    """The AscendC KV-cache ops' schemas: the custom op's (``schema.KV_CACHE_SCHEMA``, the one
    spelling) under :data:`KV_OP_NAME`, and in place (``qkv`` mutable, nothing returned) under
    :data:`KV_INPLACE_OP_NAME`."""
    base = schema.KV_CACHE_SCHEMA
    prefix = f"{schema.KV_CACHE_OP_NAME}(Tensor qkv"
    assert base.startswith(prefix)
    functional = KV_OP_NAME + base[len(schema.KV_CACHE_OP_NAME):]
    inplace = f"{KV_INPLACE_OP_NAME}(Tensor(c!) qkv" + base[len(prefix):].rsplit(" -> ", 1)[0] + " -> ()"
    return functional, inplace


for _schema in kv_schemas():
    _lib.define(_schema)


def _validate_kv(qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache, slot_mapping,
                 num_q_heads, num_kv_heads, head_dim, eps, *, cache_layout, k_scale, v_scale, return_kv,
                 fake: bool = False, **prologue) -> validation.Call:
    """The KV-cache op's one validator (``schema.validate_kv_cache_fake``'s form in fakes, which
    takes ``value_cache=None`` for a one-tensor layout), then the kernel's limits by name: the
    layout, the cache dtype and the variants."""
    if fake:
        call = schema.validate_kv_cache_fake(
            qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache, slot_mapping, num_q_heads,
            num_kv_heads, head_dim, eps, cache_layout=cache_layout, k_scale=k_scale, v_scale=v_scale,
            return_kv=return_kv, **prologue)
    else:
        call = validation.split_qkv_rmsnorm_rope_kv_cache(
            qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache, slot_mapping, num_q_heads,
            num_kv_heads, head_dim, eps, cache_layout=cache_layout, k_scale=k_scale, v_scale=v_scale,
            return_kv=return_kv, **prologue)
    weights = tuple(t.dtype for t in (q_weight, k_weight, prologue.get("q_bias"), prologue.get("k_bias"))
                    if t is not None)
    reason = unsupported_reason(qkv.dtype, call.shape.head_dim, weight_dtypes=weights,
                                cache_dtype=cos_sin_cache.dtype, features=call.features, kv_cache=call.kv_cache,
                                kv_dtype=key_cache.dtype)
    if reason is not None:
        raise ValueError(reason)
    return call


def _kv_outputs(qkv: torch.Tensor, call: validation.Call) -> tuple[torch.Tensor, ...]:
    """What the KV-cache kernel writes besides the caches, ``(q, k, v, gate)``: as
    ``schema.fake_outputs(..., return_kv=...)`` sizes them (k ``[T, Hkv*D]`` only with
    ``return_kv``, v only with ``return_kv`` and ``v_norm``), new or (in place) qkv's columns."""
    return_kv = call.kv_cache.return_kv
    if not call.inplace:
        return schema.fake_outputs(qkv, call.shape, return_kv=return_kv)
    shape, tokens = call.shape, qkv.shape[0]
    q_cols, kv_cols = shape.num_q_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    empty = qkv.new_empty((tokens, 0))
    k = qkv[:, q_cols:q_cols + kv_cols] if return_kv else empty
    v = qkv[:, q_cols + kv_cols:q_cols + 2 * kv_cols] if return_kv and shape.v_norm else empty
    return qkv[:, :q_cols], k, v, qkv.new_empty((tokens, 0))


def _kv_fake(inplace: bool):
    def fake(qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache, slot_mapping, num_q_heads,
             num_kv_heads, head_dim, eps=1e-6, *, cache_layout="nhd", k_scale=None, v_scale=None, return_kv=False,
             **prologue):
        call = _validate_kv(qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache,
                            slot_mapping, num_q_heads, num_kv_heads, head_dim, eps, cache_layout=cache_layout,
                            k_scale=k_scale, v_scale=v_scale, return_kv=return_kv, inplace=inplace, fake=True,
                            **prologue)
        return None if inplace else schema.fake_outputs(qkv, call.shape, return_kv=return_kv)

    return fake


torch.library.register_fake(f"{schema.NAMESPACE}::{KV_OP_NAME}", _kv_fake(False), lib=_lib)
torch.library.register_fake(f"{schema.NAMESPACE}::{KV_INPLACE_OP_NAME}", _kv_fake(True), lib=_lib)


def make_kv_impl(launch, inplace: bool):
    """A backend implementation of the functional (or in-place) AscendC KV-cache op around ``launch``.

    Parameters
    ----------
    launch : callable
        ``launch(qkv, q, k, v, gate, cos_sin_cache, positions, q_weight, k_weight, q_bias, k_bias,
        key_cache, value_cache, slot_mapping, k_scale, v_scale, block_dim, tiling)``: runs the
        kernel with the cache write on ``block_dim`` vector cores (the NPU library's launch op,
        or the tests' host build); ``k``, ``v`` and ``gate`` are ``None`` where the call does not
        write them, ``k_scale``/``v_scale`` where the cache is not int8.
    inplace : bool
        Build :data:`KV_INPLACE_OP_NAME`'s implementation (q, and k and v with ``return_kv``,
        written into ``qkv``) rather than :data:`KV_OP_NAME`'s.

    Returns
    -------
    callable
        The implementation, with the KV-cache op's schema as its signature; the functional one
        returns ``(q, k, v, gate)`` as ``schema.fake_outputs(..., return_kv=return_kv)``
        sizes them.
    """

    def impl(qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache, slot_mapping, num_q_heads,
             num_kv_heads, head_dim, eps=1e-6, *, cache_layout="nhd", k_scale=None, v_scale=None, return_kv=False,
             is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0, mrope_section=None, mrope_interleaved=False,
             q_gate=False, v_norm=False):
        value_cache = schema.value_cache_of(key_cache, value_cache, cache_layout)
        args = dict(qkv=qkv, q_weight=q_weight, k_weight=k_weight, cos_sin_cache=cos_sin_cache, positions=positions,
                    key_cache=key_cache, value_cache=value_cache, slot_mapping=slot_mapping, num_q_heads=num_q_heads,
                    num_kv_heads=num_kv_heads, head_dim=head_dim, eps=eps, cache_layout=cache_layout,
                    k_scale=k_scale, v_scale=v_scale, return_kv=return_kv, is_neox=is_neox, q_bias=q_bias,
                    k_bias=k_bias, weight_offset=weight_offset, inplace=inplace, mrope_section=mrope_section,
                    mrope_interleaved=mrope_interleaved, q_gate=q_gate, v_norm=v_norm)
        outputs = _entry(_KV_CACHE, args, validation.split_qkv_rmsnorm_rope_kv_cache).launch(args, launch)
        return None if inplace else outputs

    return impl


def split_qkv_rmsnorm_rope_kv_cache(qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache,
                                    slot_mapping, num_q_heads, num_kv_heads, head_dim, eps=1e-6, *,
                                    cache_layout="nhd", k_scale=None, v_scale=None, return_kv=False,
                                    is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0,
                                    inplace=False, mrope_section=None, mrope_interleaved=False,
                                    q_gate=False, v_norm=False):
    """The AscendC twin of ``vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_kv_cache``: same signature,
    same results, the same one validator.

    Serves the layouts ``ascendc_plan.KV_LAYOUTS`` (``nhd``, ``nz``) with a cache of qkv's dtype (bf16,
    fp16) or int8 (per tensor or per channel), with every prologue variant the kernel serves and
    with or without ``return_kv``; anything else is refused naming it (:func:`unsupported_reason`).

    Returns
    -------
    tuple of torch.Tensor
        ``(q, k, v)``, and the gate with ``q_gate``: k and v ``[T, 0]`` unless ``return_kv``; with
        it k is new (or qkv's columns in place) and v is the normalised v with ``v_norm``, else a
        view of qkv's v columns (never read or written but to copy them into the cache).

    Raises
    ------
    ValueError
        On a bad argument (the op's validator) or one beyond the kernel's limits, naming it.
    """
    args = locals()
    return launch_cache.prepared(_KV_CACHE, args, validation.split_qkv_rmsnorm_rope_kv_cache, Prepared,
                                 launch_cache.TOKEN_KEYS).run(args)



# --- the CANN-built library -------------------------------------------------------------------
ELF_MAGIC = b"\x7fELF"
#: ``e_type`` of a shared object (``elf.h``); read at byte 16 of the header.
ET_DYN = 3
_ELF_TYPES = {0: "ET_NONE", 1: "ET_REL", 2: "ET_EXEC", 3: "ET_DYN", 4: "ET_CORE"}


def _not_shared_library(path: Path) -> str | None:
    """Why ``path`` is not an ELF shared object, from its header alone (``None`` when it is)."""
    try:
        with path.open("rb") as f:
            header = f.read(18)
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if header[:4] != ELF_MAGIC:
        return "no ELF magic"
    if len(header) < 18:
        return f"ELF header truncated at {len(header)} bytes"
    order = {1: "little", 2: "big"}.get(header[5])
    if order is None:
        return f"ELF data encoding {header[5]} is neither little- nor big-endian"
    e_type = int.from_bytes(header[16:18], order)
    if e_type != ET_DYN:
        return f"ELF type {_ELF_TYPES.get(e_type, e_type)}, not ET_DYN"
    return None


def library_status() -> tuple[Path | None, str | None]:
    """Where the CANN-built op library is, and what is wrong with it, without loading it.

    ``VLLM_ASCEND_EXT_ASCENDC_LIB`` names the library; unset, it is looked for next to this file
    (where ``setup.py`` installs it). The check reads the ELF header only (magic and
    ``e_type == ET_DYN``): loading the real library needs CANN and torch_npu.

    Returns
    -------
    path : Path or None
        The library looked at; ``None`` when the variable is unset and none was built here.
    problem : str or None
        ``None`` when ``path`` is an ELF shared object; otherwise ``"does not exist"`` or
        ``"is not a shared library (<why>)"``.
    """
    override = settings.ascendc_library()
    path = override if override is not None else Path(__file__).resolve().parent.parent / LIBRARY_NAME
    if not path.exists():
        return (None, None) if override is None else (path, "does not exist")
    if not path.is_file():
        return path, "is not a shared library (not a regular file)"
    why = _not_shared_library(path)
    return path, None if why is None else f"is not a shared library ({why})"


def library_path() -> Path | None:
    """The CANN-built op library when :func:`library_status` finds a shared object, else ``None``."""
    path, problem = library_status()
    return path if problem is None else None


@functools.lru_cache(maxsize=None)
def load_npu_library() -> bool:
    """Load the CANN-built library and register the PrivateUse1 implementations (once).

    Returns ``False`` (and registers nothing) when :func:`library_path` finds none. Raises what
    ``torch.ops.load_library`` raises when it is present but cannot load.
    """
    path = library_path()
    if path is None:
        return False
    torch.ops.load_library(str(path))  # pragma: no cover - needs CANN and torch_npu
    launch_op = torch.ops.vllm_ascend_ext._split_qkv_rmsnorm_rope_ascendc_launch  # pragma: no cover

    def launch(qkv, q, k, v, gate, cache, positions, qw, kw, qb, kb, block_dim, t):  # pragma: no cover
        launch_op(qkv, q, k, v, gate, cache, positions, qw, kw, qb, kb, block_dim, t.words())

    _lib.impl(OP_NAME, make_impl(launch, False), "PrivateUse1")  # pragma: no cover
    _lib.impl(INPLACE_OP_NAME, make_impl(launch, True), "PrivateUse1")  # pragma: no cover
    kv_launch_op = torch.ops.vllm_ascend_ext._split_qkv_rmsnorm_rope_kv_cache_ascendc_launch  # pragma: no cover

    def kv_launch(qkv, q, k, v, gate, cache, positions, qw, kw, qb, kb, kc, vc, slots, ks, vs, block_dim,
                  t):  # pragma: no cover
        kv_launch_op(qkv, q, k, v, gate, cache, positions, qw, kw, qb, kb, kc, vc, slots, ks, vs, block_dim,
                     t.words())

    _lib.impl(KV_OP_NAME, make_kv_impl(kv_launch, False), "PrivateUse1")  # pragma: no cover
    _lib.impl(KV_INPLACE_OP_NAME, make_kv_impl(kv_launch, True), "PrivateUse1")  # pragma: no cover
    return True  # pragma: no cover


def split_qkv_rmsnorm_rope(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim,
                           eps=1e-6, *, is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0, inplace=False,
                           mrope_section=None, mrope_interleaved=False, q_gate=False, v_norm=False):
    """The Triton op's API on the AscendC kernel: returns ``(q, k, v)``, and the gate with ``q_gate``.

    Parameters and semantics are those of ``vllm_ascend_ext.ops.split_qkv_rmsnorm_rope``, within
    the limits :func:`unsupported_reason` names.

    Returns
    -------
    q, k : torch.Tensor
        ``[T, Hq*D]`` and ``[T, Hkv*D]``: new tensors, or views of ``qkv`` when ``inplace``.
    v : torch.Tensor
        ``[T, Hkv*D]``: a view of ``qkv`` (never read or written), or with ``v_norm`` the
        normalised v (a new tensor, or its columns of ``qkv`` when ``inplace``).
    gate : torch.Tensor
        Only with ``q_gate``: a new ``[T, Hq*D]`` tensor, the gate copied out of ``qkv``.

    Raises
    ------
    ValueError
        On a bad argument (the op's validator) or one beyond the kernel's limits, naming it.
    """
    args = locals()
    return launch_cache.prepared(_CACHE, args, validation.split_qkv_rmsnorm_rope, Prepared,
                                 launch_cache.TOKEN_KEYS).run(args)
