"""The one validator of ``split_qkv_rmsnorm_rope``'s arguments: every implementation calls it.

The Triton launcher, the AscendC binding, the custom ops (their real and fake implementations)
and ``vllm-ascend-ext plan`` all turn their arguments into a :class:`~.tiling.KernelShape`
here, and every bad argument raises ``ValueError`` naming it. Nothing here imports Triton or
touches a device: it reads shapes, strides, dtypes and devices only, so it runs on fake and meta
tensors too.

Two entry points:

* :func:`geometry` checks a layer geometry (head counts, head size, rotary dims) and returns
  its :class:`KernelShape`: what ``plan`` needs for a model that has no tensors yet;
* :func:`split_qkv_rmsnorm_rope` checks a whole call and returns a :class:`Call` (the shape
  plus the features the kernel is compiled for).

:func:`check_runnable` is the one device question the Triton launcher asks before launching:
CPU tensors run only through Triton's interpreter.
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass, replace

import torch

from . import kv_cache as _kv
from . import settings
from .tiling import KernelShape, MLAShape

__all__ = ["Call", "KVCacheWrite", "MAX_HEAD_DIM", "MLACacheWrite", "MLACall", "check_runnable", "geometry",
           "mla_q_rope_", "mrope_section_of", "split_qkv_rmsnorm_rope", "split_qkv_rmsnorm_rope_kv_cache",
           "split_qkv_rmsnorm_rope_mla", "split_qkv_tp_rmsnorm_rope"]

#: Largest head the op serves: one head's tile row of 512 lanes (plus padding) is what the
#: Ascend UB model and the CUDA register budget were sized and checked for.
MAX_HEAD_DIM = 512
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
POSITION_DTYPES = (torch.int32, torch.int64)
#: The kernel takes ``eps`` and ``weight_offset`` as fp32: larger magnitudes would become inf.
FP32_MAX = float(torch.finfo(torch.float32).max)


@dataclass(frozen=True)
class KVCacheWrite:
    """A validated paged KV-cache write: where (layout strides), how (quantisation), and whether
    k and v are still returned."""

    layout: str
    key_strides: _kv.CacheStrides
    value_strides: _kv.CacheStrides
    quant: int  # kv_cache.QUANT_NONE / QUANT_INT8 / QUANT_FP8
    per_channel: bool  # int8 scales per channel ([Hkv*D]) rather than one value
    return_kv: bool


@dataclass(frozen=True)
class Call:
    """One validated call: the geometry and element sizes, and the compiled-in features."""

    shape: KernelShape
    num_tokens: int
    q_norm: bool
    k_norm: bool
    q_bias: bool
    k_bias: bool
    eps: float
    weight_offset: float
    inplace: bool
    #: mRoPE's (t, h, w) lanes when positions are ``[3, T]``; ``None`` for one position per token
    #: (including a text-only mRoPE call with ``[T]`` positions: every axis equal is plain RoPE).
    mrope_section: tuple[int, int, int] | None = None
    mrope_interleaved: bool = False
    #: The cache write of ``split_qkv_rmsnorm_rope_kv_cache``; ``None`` for the prologue alone.
    kv_cache: KVCacheWrite | None = None
    #: ``split_qkv_tp_rmsnorm_rope``'s tensor-parallel size (the norm's divisor counts every rank's
    #: columns); 1 for the other ops.
    tp_size: int = 1

    @property
    def q_gate(self) -> bool:
        return self.shape.q_gate

    @property
    def features(self) -> frozenset[str]:
        """The call's optional variants by name, for implementations to say which they serve:
        ``"mrope"`` (``[3, T]`` positions), ``"q_gate"``, ``"v_norm"``, ``"q_only"``
        (``num_kv_heads == 0``), ``"kv_cache"`` (the paged cache write), ``"tp_norm"`` (q and k
        normalised across all heads and ranks: ``split_qkv_tp_rmsnorm_rope``)."""
        s = self.shape
        return frozenset(name for name, on in (("mrope", s.mrope), ("q_gate", s.q_gate),
                                                ("v_norm", s.v_norm), ("q_only", s.num_kv_heads == 0),
                                                ("kv_cache", s.kv_cache), ("tp_norm", s.norm_across_heads)) if on)

    @property
    def v_norm(self) -> bool:
        return self.shape.v_norm

    def mark_written(self, qkv: torch.Tensor) -> None:
        """After an implementation has run the call: when it wrote q and k into ``qkv``, bump
        ``qkv``'s autograd version counter, as torch's own in-place ops do (the dispatcher does
        not for a custom ``(a!)`` op), so a graph that saved ``qkv`` refuses to backpropagate
        instead of computing a wrong gradient. Inference tensors have no version counter."""
        if self.inplace and self.num_tokens > 0 and not qkv.is_inference():
            torch.autograd.graph.increment_version(qkv)


def _count(name: str, value, least: int = 1) -> int:
    """An integer of at least ``least`` (Python or numpy integers; not bools, not floats)."""
    what = "a positive int" if least == 1 else f"an int >= {least}"
    if type(value) is int and value >= least:  # the common case, without the ABC checks below
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    value = operator.index(value)
    if value < least:
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return value


def _flag(name: str, value) -> bool:
    """A real boolean (``bool`` or numpy's ``bool_``): a string such as ``"false"`` is refused."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise ValueError(f"{name} must be a bool, got {value!r}")


def _finite(name: str, value, *, non_negative: bool = False) -> float:
    """A real number that stays finite as the kernel's fp32 argument."""
    if type(value) is not float and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise ValueError(f"{name} must be a finite float, got {value!r}")
    try:
        result = float(value)
    except OverflowError:
        result = math.inf
    if not math.isfinite(result) or abs(result) > FP32_MAX:
        raise ValueError(f"{name} must be a finite float within fp32's range, got {value!r}")
    if non_negative and result < 0:
        raise ValueError(f"{name} must be a finite non-negative float, got {value!r}")
    return result


def geometry(num_q_heads, num_kv_heads, head_dim, rotary_dim, *, is_neox=True, elem_bytes: int = 2,
             cache_bytes: int = 4, q_gate=False, v_norm=False, mrope=False,
             norm_across_heads=False, qk_norm=True) -> KernelShape:
    """Check a layer geometry; return its :class:`KernelShape`.

    Parameters
    ----------
    num_q_heads, num_kv_heads : int
        Heads of q (``>= 1``) and of k (``>= 0``; 0 is a q-only layer) on one rank (numpy
        integers are accepted).
    head_dim : int
        ``D``: even, at most :data:`MAX_HEAD_DIM`.
    rotary_dim : int
        ``R``: even, ``2 <= R <= D``.
    is_neox : bool
        NeoX (``True``) or GPT-J rotary.
    elem_bytes, cache_bytes : int
        Element sizes of qkv and of the cos/sin cache.
    q_gate, v_norm, mrope : bool
        q's heads carry a gate; v is normalised; positions are ``[3, T]`` (mRoPE).
    norm_across_heads : bool
        q and k are normalised across all heads (``split_qkv_tp_rmsnorm_rope``: MiniMax-M2);
        needs k (``num_kv_heads >= 1``) and none of q_gate, v_norm, mrope.
    qk_norm : bool
        q or k is RMS-normalised per head (a plan input: ``KernelShape.qk_norm``).

    Raises
    ------
    ValueError
        Naming the argument that is out of range.
    """
    hq, hkv = _count("num_q_heads", num_q_heads), _count("num_kv_heads", num_kv_heads, least=0)
    d = _count("head_dim", head_dim)
    if d % 2 or d > MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be even and at most {MAX_HEAD_DIM}, got {d}")
    if type(rotary_dim) is not int and (isinstance(rotary_dim, bool)
                                        or not isinstance(rotary_dim, numbers.Integral)):
        raise ValueError(f"rotary_dim must be an int, got {rotary_dim!r}")
    r = operator.index(rotary_dim)
    if r % 2 or not 2 <= r <= d:
        raise ValueError(f"rotary_dim (cos_sin_cache's last dim) must be even and in [2, head_dim={d}], "
                         f"got {r}")
    v_norm = _flag("v_norm", v_norm)
    if v_norm and hkv == 0:
        raise ValueError("v_norm needs v: a q-only layer (num_kv_heads=0) has none")
    norm_across_heads = _flag("norm_across_heads", norm_across_heads)
    if norm_across_heads:
        if hkv == 0:
            raise ValueError("num_kv_heads must be >= 1 with q/k normalised across heads (split_qkv_tp_rmsnorm_rope)")
        for name, on in (("q_gate", q_gate), ("v_norm", v_norm), ("mrope", mrope)):
            if on:
                raise ValueError(f"{name} is not supported with q/k normalised across heads "
                                 "(split_qkv_tp_rmsnorm_rope)")
    return KernelShape(num_q_heads=hq, num_kv_heads=hkv, head_dim=d, rotary_dim=r,
                       elem_bytes=elem_bytes, cache_bytes=cache_bytes,
                       is_neox=_flag("is_neox", is_neox), q_gate=_flag("q_gate", q_gate),
                       v_norm=v_norm, mrope=_flag("mrope", mrope), norm_across_heads=norm_across_heads,
                       qk_norm=_flag("qk_norm", qk_norm))


def mrope_section_of(mrope_section, rotary_dim: int) -> tuple[int, int, int] | None:
    """mRoPE's ``(t, h, w)`` frequency lanes as a tuple (``None`` stays ``None``).

    Raises
    ------
    ValueError
        Unless three non-negative ints summing to ``rotary_dim / 2``.
    """
    if mrope_section is None:
        return None
    if isinstance(mrope_section, (str, bytes)) or not hasattr(mrope_section, "__len__") \
            or len(mrope_section) != 3:
        raise ValueError(f"mrope_section must be three ints (t, h, w), got {mrope_section!r}")
    section = tuple(_count("mrope_section", v, least=0) for v in mrope_section)
    if sum(section) != rotary_dim // 2:
        raise ValueError(f"mrope_section {list(section)} must sum to rotary_dim/2 = {rotary_dim // 2}, "
                         f"the frequency lanes of cos_sin_cache's rows")
    return section


def _tensor(name: str, tensor, device) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(tensor).__name__}")
    if device is not None and tensor.device != device:
        raise ValueError(f"{name} is on {tensor.device}, qkv on {device}")
    if tensor.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{name} requires grad, and split_qkv_rmsnorm_rope has no backward: call it "
                         f"under torch.no_grad() or torch.inference_mode(), or pass {name}.detach()")
    return tensor


def _vector(name: str, tensor, length: int, device) -> None:
    _tensor(name, tensor, device)
    if tensor.dim() != 1 or tensor.shape[0] != length:
        raise ValueError(f"{name} must have shape [{length}], got {list(tensor.shape)}")
    if tensor.dtype not in DTYPES:
        raise ValueError(f"{name} must be bf16, fp16 or fp32, got {tensor.dtype}")
    if tensor.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous")


def split_qkv_rmsnorm_rope(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads,
                           head_dim, eps=1e-6, *, is_neox=True, q_bias=None, k_bias=None,
                           weight_offset=0.0, inplace=False, mrope_section=None,
                           mrope_interleaved=False, q_gate=False, v_norm=False) -> Call:
    """Check one call of the op (its exact signature); return what the kernel is compiled for.

    Raises
    ------
    ValueError
        On a bad argument; the message names it. Tensors that require grad are refused while
        grad mode is on: the op has no backward, and an in-place write under autograd must
        never leave a silently wrong gradient.
    """
    if not isinstance(qkv, torch.Tensor) or qkv.dim() != 2:
        raise ValueError("qkv must be a 2-D tensor [T, (num_q_heads*(2 if q_gate else 1) + 2*num_kv_heads) "
                         "* head_dim]")
    device = qkv.device
    _tensor("qkv", qkv, None)
    if qkv.dtype not in DTYPES:
        raise ValueError(f"qkv must be bf16, fp16 or fp32, got {qkv.dtype}")
    cache = _tensor("cos_sin_cache", cos_sin_cache, device)
    if cache.dim() != 2 or cache.shape[0] < 1:
        raise ValueError("cos_sin_cache must be a 2-D tensor [max_position, rotary_dim] with at "
                         f"least one row, got shape {list(cache.shape)}")
    if cache.dtype not in DTYPES:
        raise ValueError(f"cos_sin_cache must be fp32, bf16 or fp16, got {cache.dtype}")
    if cache.stride(1) != 1:
        raise ValueError("cos_sin_cache must have a contiguous last dim")
    _tensor("positions", positions, device)
    mrope = positions.dim() == 2
    shape = geometry(num_q_heads, num_kv_heads, head_dim, cache.shape[1], is_neox=is_neox,
                     elem_bytes=qkv.element_size(), cache_bytes=cache.element_size(), q_gate=q_gate,
                     v_norm=v_norm, mrope=mrope, qk_norm=q_weight is not None or k_weight is not None)
    section = mrope_section_of(mrope_section, shape.rotary_dim)
    mrope_interleaved = _flag("mrope_interleaved", mrope_interleaved)
    if mrope_interleaved and section is None:
        raise ValueError("mrope_interleaved=True needs mrope_section")
    width = shape.qkv_width
    if qkv.shape[1] != width:
        gated = f", q_gate={shape.q_gate}" if shape.q_gate else ""
        raise ValueError(f"qkv has {qkv.shape[1]} columns; num_q_heads={shape.num_q_heads}, "
                         f"num_kv_heads={shape.num_kv_heads}, head_dim={shape.head_dim}{gated} need {width}")
    if qkv.stride(1) != 1 or (qkv.shape[0] > 1 and qkv.stride(0) < width):
        raise ValueError("qkv must have a contiguous last dim and a row stride of at least its width")
    for name, weight in (("q_weight", q_weight), ("k_weight", k_weight)):
        if weight is not None:
            _vector(name, weight, shape.head_dim, device)
    for name, bias, weight in (("q_bias", q_bias, q_weight), ("k_bias", k_bias, k_weight)):
        if bias is not None:
            if weight is None:
                raise ValueError(f"{name} is only allowed together with a weight")
            _vector(name, bias, shape.head_dim, device)
    if shape.num_kv_heads == 0:
        for name, value in (("k_weight", k_weight), ("k_bias", k_bias)):
            if value is not None:
                raise ValueError(f"{name} must be None in a q-only layer (num_kv_heads=0)")
    if positions.dim() not in (1, 2) or (mrope and positions.shape[0] != 3):
        raise ValueError(f"positions must be [T], or [3, T] with mrope_section, got shape {list(positions.shape)}")
    if mrope and section is None:
        raise ValueError("positions is [3, T] (mRoPE's t/h/w axes) but mrope_section is not given")
    if positions.shape[-1] != qkv.shape[0]:
        raise ValueError(f"positions has {positions.shape[-1]} tokens, qkv has {qkv.shape[0]}")
    if positions.dtype not in POSITION_DTYPES:
        raise ValueError(f"positions must be int32 or int64, got {positions.dtype}")
    inplace = _flag("inplace", inplace)
    if inplace and shape.q_gate:
        raise ValueError("inplace=True cannot be combined with q_gate=True: q's heads sit 2*head_dim apart "
                         "in qkv, so q written in place is no [T, num_q_heads*head_dim] tensor")
    return Call(shape=shape, num_tokens=qkv.shape[0], q_norm=q_weight is not None,
                k_norm=k_weight is not None, q_bias=q_bias is not None, k_bias=k_bias is not None,
                eps=_finite("eps", eps, non_negative=True),
                weight_offset=_finite("weight_offset", weight_offset), inplace=inplace,
                mrope_section=section if mrope else None, mrope_interleaved=mrope and mrope_interleaved)


def _scale(name: str, scale, device, per_channel_len: int | None) -> bool:
    """One fp32 value, or (``per_channel_len``) one per channel; returns whether per channel."""
    _tensor(name, scale, device)
    if scale.dtype != torch.float32:
        raise ValueError(f"{name} must be fp32, got {scale.dtype}")
    if scale.numel() == 1:
        return False
    if per_channel_len is not None and scale.dim() == 1 and scale.shape[0] == per_channel_len:
        if scale.stride(0) != 1:
            raise ValueError(f"{name} must be contiguous")
        return True
    per = f" or [{per_channel_len}] (num_kv_heads*head_dim, per channel)" if per_channel_len else ""
    raise ValueError(f"{name} must hold one value{per}, got shape {list(scale.shape)}")


def split_qkv_rmsnorm_rope_kv_cache(qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache,
                                    slot_mapping, num_q_heads, num_kv_heads, head_dim, eps=1e-6, *,
                                    cache_layout="nhd", k_scale=None, v_scale=None, return_kv=False,
                                    **prologue) -> Call:
    """Check one call of ``split_qkv_rmsnorm_rope_kv_cache`` (its exact signature): the prologue's
    arguments as :func:`split_qkv_rmsnorm_rope` checks them, then the caches, slots and scales.

    Raises
    ------
    ValueError
        On a bad argument; the message names it.
    """
    call = split_qkv_rmsnorm_rope(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads,
                                  num_kv_heads, head_dim, eps, **prologue)
    shape, device = call.shape, qkv.device
    if shape.num_kv_heads == 0:
        raise ValueError("num_kv_heads must be >= 1 with a KV-cache write (a q-only layer has no k or v)")
    _tensor("key_cache", key_cache, device)
    _tensor("value_cache", value_cache, device)
    quant = _kv.quant_of(key_cache.dtype)
    if value_cache.dtype != key_cache.dtype:
        raise ValueError(f"value_cache must have key_cache's dtype {key_cache.dtype}, got {value_cache.dtype}")
    if not isinstance(cache_layout, str):
        raise ValueError(f"cache_layout must be a string, got {cache_layout!r}")
    key_strides, value_strides = _kv.cache_strides(key_cache, value_cache, cache_layout, shape.num_kv_heads,
                                                   shape.head_dim)
    _tensor("slot_mapping", slot_mapping, device)
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] < call.num_tokens:
        raise ValueError(f"slot_mapping must be [T] (or longer: its first T entries are read) with "
                         f"T = {call.num_tokens}, got shape {list(slot_mapping.shape)}")
    if slot_mapping.dtype not in POSITION_DTYPES:
        raise ValueError(f"slot_mapping must be int32 or int64, got {slot_mapping.dtype}")
    if slot_mapping.shape[0] > 1 and slot_mapping.stride(0) != 1:
        raise ValueError("slot_mapping must be contiguous")
    per_channel = False
    if quant == _kv.QUANT_NONE:
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            if scale is not None:
                raise ValueError(f"{name} is only used with an int8 or float8_e4m3fn cache; the cache is "
                                 f"{key_cache.dtype}: pass None")
    else:
        channels = shape.num_kv_heads * shape.head_dim if quant == _kv.QUANT_INT8 else None
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            if scale is None:
                raise ValueError(f"{name} is required with a {key_cache.dtype} cache")
        per_channel = _scale("k_scale", k_scale, device, channels)
        if _scale("v_scale", v_scale, device, channels) != per_channel:
            raise ValueError("k_scale and v_scale must both be per tensor or both per channel")
    write = KVCacheWrite(layout=cache_layout, key_strides=key_strides, value_strides=value_strides, quant=quant,
                         per_channel=per_channel, return_kv=_flag("return_kv", return_kv))
    return replace(call, shape=replace(shape, kv_cache=True), kv_cache=write)


#: The per-head op's options ``split_qkv_tp_rmsnorm_rope`` does not serve, with the value that
#: means "off" (a caller forwarding the prologue's keywords gets a ValueError naming the option).
_TP_NORM_UNSUPPORTED = dict(q_bias=None, k_bias=None, weight_offset=0.0, inplace=False, mrope_section=None,
                            mrope_interleaved=False, q_gate=False, v_norm=False)


def is_process_group(value) -> bool:
    dist = torch.distributed
    return dist.is_available() and isinstance(value, dist.ProcessGroup)


def split_qkv_tp_rmsnorm_rope(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads,
                              head_dim, eps=1e-6, *, tp_size=1, all_reduce=None, is_neox=True,
                              **prologue) -> Call:
    """Check one call of ``split_qkv_tp_rmsnorm_rope`` (its exact signature): qkv, the cache,
    positions, heads and ``eps`` as :func:`split_qkv_rmsnorm_rope` checks them, then the weights
    (``[Hq*D]`` and ``[Hkv*D]``: the rank's shards of the across-heads norm), ``tp_size`` and
    ``all_reduce``.

    ``prologue`` takes the per-head op's other options only to refuse them by name when set
    (``mrope_section``, ``q_gate``, ``v_norm``, biases, ``weight_offset``, ``inplace``): the
    across-heads norm serves none of them. ``[3, T]`` positions (mRoPE) are refused too.

    Returns
    -------
    Call
        With ``shape.norm_across_heads`` (features include ``"tp_norm"``) and ``tp_size``.

    Raises
    ------
    ValueError
        On a bad argument; the message names it: ``tp_size`` not a positive int (or not the
        size of the process group given), ``all_reduce`` missing with ``tp_size > 1`` or not a
        ``ProcessGroup`` or callable, a weight missing or not ``[H*D]``, a q-only layer
        (``num_kv_heads=0``), an unsupported option.
    """
    for name, value in prologue.items():
        if name not in _TP_NORM_UNSUPPORTED:
            raise TypeError(f"split_qkv_tp_rmsnorm_rope() got an unexpected keyword argument {name!r}")
        off = _TP_NORM_UNSUPPORTED[name]
        if (value is not None) if off is None else (isinstance(value, torch.Tensor) or value != off):
            raise ValueError(f"{name} is not supported by split_qkv_tp_rmsnorm_rope (q and k normalised "
                             f"across heads): leave it at {_TP_NORM_UNSUPPORTED[name]!r}")
    if isinstance(positions, torch.Tensor) and positions.dim() == 2:
        raise ValueError(f"positions must be [T]: split_qkv_tp_rmsnorm_rope has no mRoPE, got shape "
                         f"{list(positions.shape)}")
    tp = _count("tp_size", tp_size)
    if all_reduce is None:
        if tp > 1:
            raise ValueError(f"all_reduce is required with tp_size={tp} > 1: a torch.distributed ProcessGroup "
                             "or a callable f(tensor) -> summed tensor (vLLM's get_tp_group().all_reduce)")
    elif is_process_group(all_reduce):
        if all_reduce.size() != tp:
            raise ValueError(f"tp_size={tp} but the all_reduce process group has {all_reduce.size()} ranks")
    elif not callable(all_reduce):
        raise ValueError(f"all_reduce must be None, a torch.distributed ProcessGroup or a callable, "
                         f"got {type(all_reduce).__name__}")
    call = split_qkv_rmsnorm_rope(qkv, None, None, cos_sin_cache, positions, num_q_heads, num_kv_heads,
                                  head_dim, eps, is_neox=is_neox)
    shape, device = call.shape, qkv.device
    if shape.num_kv_heads == 0:
        raise ValueError("num_kv_heads must be >= 1: split_qkv_tp_rmsnorm_rope normalises k across its heads "
                         "(a q-only layer, num_kv_heads=0, is not supported)")
    for name, weight, heads in (("q_weight", q_weight, shape.num_q_heads), ("k_weight", k_weight,
                                                                           shape.num_kv_heads)):
        if weight is None:
            raise ValueError(f"{name} is required: the norm's weight shard, [{heads * shape.head_dim}] "
                             f"(this rank's heads x head_dim)")
        _vector(name, weight, heads * shape.head_dim, device)
    return replace(call, shape=replace(shape, norm_across_heads=True), q_norm=True, k_norm=True, tp_size=tp)


def check_runnable(device: torch.device, interpreted: bool | None = None) -> None:
    """Raise ``ValueError`` when the Triton op cannot run on ``device`` in this process.

    CPU tensors run through Triton's interpreter only, which Triton turns on from
    ``TRITON_INTERPRET`` when a kernel is defined; without it Triton fails with a bare
    "0 active drivers". ``interpreted``: whether the op's kernel was defined interpreted (the
    launcher knows; ``None``: not asked), which it is not when the variable was set after Triton
    had been imported.
    """
    if torch.device(device).type != "cpu":
        return
    if not settings.triton_interpret():
        raise ValueError("qkv is on the CPU, and the Triton op runs on CPU tensors only through Triton's "
                         f"interpreter: set {settings.TRITON_INTERPRET}=1 before importing the op (or pass "
                         "tensors on an NPU or a GPU)")
    if interpreted is False:
        raise ValueError(f"qkv is on the CPU and {settings.TRITON_INTERPRET} is set, but it was set after Triton "
                         "was imported, so the op's kernels were defined for a device, not for the interpreter: set "
                         f"{settings.TRITON_INTERPRET}=1 before Triton is imported (before importing the op)")


# --------------------------------------------------------------------------------------------
# The MLA prologue (split_qkv_rmsnorm_rope_mla) and its q side (mla_q_rope_).

#: The MLA cache dtypes by ``kv_cache_dtype``: vLLM's spellings for the combined cache, ``"int8"``
#: for vllm-ascend's int8 latent (the split form).
MLA_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "int8")
#: Widest latent row served (q_lora_rank, kv_lora_rank): the rows are normalised in chunks, so the
#: bound is not the tile's but the plans' (checked up to it: ``ops/tiling``).
MLA_MAX_RANK = 4096


@dataclass(frozen=True)
class MLACacheWrite:
    """A validated MLA cache write. ``form``: ``"combined"`` (vLLM's one ``[num_blocks, block_size,
    Lkv + R]`` tensor: ``rope`` is ``nope``'s strides at offset ``Lkv``) or ``"split"`` (vllm-ascend's
    ``(nope_cache, rope_cache)``, ``layout`` ``"nd"`` or ``"nz"``). ``nope_quant``/``rope_quant``:
    ``kv_cache.QUANT_*``; ``uint8_fp8``: an fp8 cache stored as uint8 (the launcher views it as
    float8_e4m3fn)."""

    form: str
    layout: str
    nope: _kv.CacheStrides
    rope: _kv.CacheStrides
    nope_quant: int
    rope_quant: int
    uint8_fp8: bool = False


@dataclass(frozen=True)
class MLACall:
    """One validated call of ``split_qkv_rmsnorm_rope_mla`` or ``mla_q_rope_``: everything the
    kernel is compiled and launched with but the token count (the launcher takes it from the
    tensor), so one call object serves every batch size of a layer."""

    shape: MLAShape
    eps: float
    #: The cache write; ``None`` without a cache (and always for the q side).
    cache: MLACacheWrite | None = None
    kv_cache_dtype: str = "auto"

    @property
    def q_lora_rank(self) -> int:
        return self.shape.q_lora_rank

    @property
    def kv_lora_rank(self) -> int:
        return self.shape.kv_lora_rank

    @property
    def rope_dim(self) -> int:
        return self.shape.rope_dim

    @property
    def is_neox(self) -> bool:
        return self.shape.is_neox


def _mla_tensor(name: str, tensor, device, what: str = "qkv_lora") -> torch.Tensor:
    """:func:`_tensor` with the device named against ``what`` (the MLA ops' first tensor)."""
    if isinstance(tensor, torch.Tensor) and device is not None and tensor.device != device:
        raise ValueError(f"{name} is on {tensor.device}, {what} on {device}")
    return _tensor(name, tensor, None)


def _rank(name: str, value, least: int) -> int:
    rank = _count(name, value, least=least)
    if rank > MLA_MAX_RANK:
        raise ValueError(f"{name} must be at most {MLA_MAX_RANK}, got {rank}")
    return rank


def _rope_dim(value, least: int) -> int:
    r = _count("rope_dim", value, least=least)
    if r % 2 or r > MAX_HEAD_DIM:
        raise ValueError(f"rope_dim must be even and at most {MAX_HEAD_DIM}, got {r}")
    return r


def _cos_sin_cache(cache, rope_dim: int, device, what: str) -> None:
    _mla_tensor("cos_sin_cache", cache, device, what)
    if cache.dim() != 2 or cache.shape[0] < 1 or cache.shape[1] != rope_dim:
        raise ValueError(f"cos_sin_cache must be [max_position, rope_dim={rope_dim}] with at least one row, "
                         f"got shape {list(cache.shape)}")
    if cache.dtype not in DTYPES:
        raise ValueError(f"cos_sin_cache must be fp32, bf16 or fp16, got {cache.dtype}")
    if cache.stride(1) != 1:
        raise ValueError("cos_sin_cache must have a contiguous last dim")


def _positions(positions, tokens: int, device, what: str) -> None:
    _mla_tensor("positions", positions, device, what)
    if positions.dim() != 1 or positions.shape[0] != tokens:
        raise ValueError(f"positions must be [T] with T = {tokens}, got shape {list(positions.shape)}")
    if positions.dtype not in POSITION_DTYPES:
        raise ValueError(f"positions must be int32 or int64, got {positions.dtype}")
    if tokens > 1 and positions.stride(0) != 1:
        raise ValueError("positions must be contiguous")


def _mla_cache(kv_cache, kv_cache_dtype: str, cache_layout, kv_lora_rank: int, rope_dim: int,
               device) -> MLACacheWrite:
    """The cache's form, strides and quantisation (``kv_cache`` is given)."""
    if not isinstance(cache_layout, str) or cache_layout not in ("nd", "nz"):
        raise ValueError(f"cache_layout must be 'nd' or 'nz', got {cache_layout!r}")
    if isinstance(kv_cache, (tuple, list)):
        if len(kv_cache) != 2:
            raise ValueError(f"kv_cache must be one tensor or a pair (nope_cache, rope_cache), got {len(kv_cache)} "
                             "items")
        nope_cache, rope_cache = kv_cache
        _mla_tensor("kv_cache[0]", nope_cache, device)
        if rope_dim == 0:
            if rope_cache is not None:
                raise ValueError("kv_cache[1] (the rope cache) must be None with rope_dim=0")
        else:
            _mla_tensor("kv_cache[1]", rope_cache, device)
        if kv_cache_dtype in ("fp8", "fp8_e4m3"):
            raise ValueError("kv_cache_dtype='fp8' is served for vLLM's combined cache only; the split form "
                             "(nope_cache, rope_cache) takes 'auto' or 'int8'")
        layout = "nhd" if cache_layout == "nd" else "nz"
        if (nope_cache.dtype == torch.int8) != (kv_cache_dtype == "int8") or \
                nope_cache.dtype not in _kv.FLOAT_DTYPES + (torch.int8,):
            want = "int8" if kv_cache_dtype == "int8" else "bf16, fp16 or fp32"
            raise ValueError(f"kv_cache[0] (the latent cache) must be {want} with kv_cache_dtype="
                             f"{kv_cache_dtype!r}, got {nope_cache.dtype}")
        if layout == "nz":
            for name, cache, lanes, what in (("kv_cache[0]", nope_cache, kv_lora_rank, "kv_lora_rank"),
                                             ("kv_cache[1]", rope_cache, rope_dim, "rope_dim")):
                c0 = _kv.NZ_COLUMN_BYTES // cache.element_size() if cache is not None else 1
                if lanes % c0:
                    raise ValueError(f"{name}: cache_layout='nz' needs {what} to be a multiple of {c0} for a "
                                     f"{cache.dtype} cache (32-byte fractal columns), got {lanes}")
        nope = _kv.strides_of("kv_cache[0]", nope_cache, layout, 1, kv_lora_rank)
        rope = nope
        if rope_dim:
            if rope_cache.dtype not in _kv.FLOAT_DTYPES:
                raise ValueError(f"kv_cache[1] (the rope cache) must be bf16, fp16 or fp32, got {rope_cache.dtype}")
            rope = _kv.strides_of("kv_cache[1]", rope_cache, layout, 1, rope_dim)
            if rope_cache.shape[0] != nope_cache.shape[0] or rope.block_size != nope.block_size:
                raise ValueError(f"kv_cache[1] must have kv_cache[0]'s blocks and block size "
                                 f"({nope_cache.shape[0]} x {nope.block_size}), got {rope_cache.shape[0]} x "
                                 f"{rope.block_size}")
        quant = _kv.QUANT_INT8 if kv_cache_dtype == "int8" else _kv.QUANT_NONE
        return MLACacheWrite(form="split", layout=cache_layout, nope=nope, rope=rope, nope_quant=quant,
                             rope_quant=_kv.QUANT_NONE)
    _mla_tensor("kv_cache", kv_cache, device)
    if cache_layout != "nd":
        raise ValueError("cache_layout='nz' needs the split form kv_cache=(nope_cache, rope_cache); vLLM's "
                         "combined cache is 'nd'")
    if kv_cache_dtype == "int8":
        raise ValueError("kv_cache_dtype='int8' is vllm-ascend's latent cache: pass kv_cache=(nope_cache, "
                         "rope_cache)")
    width = kv_lora_rank + rope_dim
    if kv_cache.dim() != 3 or kv_cache.shape[2] != width or kv_cache.shape[0] < 1:
        raise ValueError(f"kv_cache must be [num_blocks, block_size, kv_lora_rank + rope_dim = {width}], got "
                         f"{list(kv_cache.shape)}")
    if kv_cache.stride(2) != 1:
        raise ValueError("kv_cache must have a contiguous last dim")
    if kv_cache.shape[0] * kv_cache.shape[1] > _kv.MAX_SLOTS:
        raise ValueError(f"kv_cache has {kv_cache.shape[0]} blocks of {kv_cache.shape[1]} slots; at most "
                         f"{_kv.MAX_SLOTS} slots are addressed (32-bit slot arithmetic in the kernel)")
    fp8 = kv_cache_dtype != "auto"
    allowed = (torch.uint8, torch.float8_e4m3fn) if fp8 else _kv.FLOAT_DTYPES
    if kv_cache.dtype not in allowed:
        want = "uint8 or float8_e4m3fn" if fp8 else "bf16, fp16 or fp32"
        raise ValueError(f"kv_cache must be {want} with kv_cache_dtype={kv_cache_dtype!r}, got {kv_cache.dtype}")
    st = kv_cache.stride()
    nope = _kv.CacheStrides(block_size=kv_cache.shape[1], block=st[0], slot=st[1], head=0)
    quant = _kv.QUANT_FP8 if fp8 else _kv.QUANT_NONE
    return MLACacheWrite(form="combined", layout="nd", nope=nope, rope=replace(nope, offset=kv_lora_rank),
                         nope_quant=quant, rope_quant=quant, uint8_fp8=kv_cache.dtype == torch.uint8)


def split_qkv_rmsnorm_rope_mla(qkv_lora, q_a_weight, kv_a_weight, cos_sin_cache, positions, q_lora_rank,
                               kv_lora_rank, rope_dim, eps=1e-6, *, is_neox=False, kv_cache=None,
                               slot_mapping=None, kv_cache_dtype="auto", k_scale=None,
                               cache_layout="nd") -> MLACall:
    """Check one call of ``split_qkv_rmsnorm_rope_mla`` (its exact signature); return what the kernel
    is compiled and launched with (no token count: :class:`MLACall`).

    Raises
    ------
    ValueError
        On a bad argument; the message names it: ``qkv_lora`` (not 2-D, dtype, width, strides),
        a rank out of range, ``q_a_weight`` given without a q latent or missing with one, a
        weight of the wrong length, dtype or stride, ``cos_sin_cache`` missing with ``rope_dim > 0``
        or not ``[max_position, rope_dim]``, ``positions`` not ``[T]`` int32/int64, a tensor on
        another device or requiring grad, ``kv_cache`` of the wrong shape, dtype or form for
        ``kv_cache_dtype`` and ``cache_layout``, ``slot_mapping`` missing with a cache (or given
        without), ``k_scale`` given without a quantised cache or missing with one.
    """
    if not isinstance(qkv_lora, torch.Tensor) or qkv_lora.dim() != 2:
        raise ValueError("qkv_lora must be a 2-D tensor [T, q_lora_rank + kv_lora_rank + rope_dim]")
    _tensor("qkv_lora", qkv_lora, None)
    device, tokens = qkv_lora.device, qkv_lora.shape[0]
    if qkv_lora.dtype not in DTYPES:
        raise ValueError(f"qkv_lora must be bf16, fp16 or fp32, got {qkv_lora.dtype}")
    lq, lkv = _rank("q_lora_rank", q_lora_rank, 0), _rank("kv_lora_rank", kv_lora_rank, 1)
    r = _rope_dim(rope_dim, 0)
    width = lq + lkv + r
    if qkv_lora.shape[1] != width:
        raise ValueError(f"qkv_lora has {qkv_lora.shape[1]} columns; q_lora_rank={lq}, kv_lora_rank={lkv}, "
                         f"rope_dim={r} need {width}")
    if qkv_lora.stride(1) != 1 or (tokens > 1 and qkv_lora.stride(0) < width):
        raise ValueError("qkv_lora must have a contiguous last dim and a row stride of at least its width")
    if lq == 0:
        if q_a_weight is not None:
            raise ValueError("q_a_weight must be None with q_lora_rank=0 (no q latent to normalise)")
    else:
        if q_a_weight is None:
            raise ValueError(f"q_a_weight is required with q_lora_rank={lq}: the q_a_layernorm weight [{lq}]")
        _mla_tensor("q_a_weight", q_a_weight, device)
        _vector("q_a_weight", q_a_weight, lq, None)
    if kv_a_weight is None:
        raise ValueError(f"kv_a_weight is required: the kv_a_layernorm weight [{lkv}]")
    _mla_tensor("kv_a_weight", kv_a_weight, device)
    _vector("kv_a_weight", kv_a_weight, lkv, None)
    cache_bytes = 4
    if r:
        if cos_sin_cache is None:
            raise ValueError(f"cos_sin_cache is required with rope_dim={r}")
        _cos_sin_cache(cos_sin_cache, r, device, "qkv_lora")
        cache_bytes = cos_sin_cache.element_size()
        if positions is None:
            raise ValueError(f"positions is required with rope_dim={r}")
        _positions(positions, tokens, device, "qkv_lora")
    else:
        for name, tensor in (("cos_sin_cache", cos_sin_cache), ("positions", positions)):
            if tensor is not None:
                _mla_tensor(name, tensor, device)  # never read without rope; refused only if no tensor
    eps = _finite("eps", eps, non_negative=True)
    is_neox = _flag("is_neox", is_neox)
    if not isinstance(kv_cache_dtype, str):
        raise ValueError(f"kv_cache_dtype must be a string, got {kv_cache_dtype!r}")
    if kv_cache_dtype == "fp8_ds_mla":
        raise ValueError("kv_cache_dtype='fp8_ds_mla' (DeepSeek-V3.2's 656-byte rows with per-group dynamic "
                         "scales) is not served by split_qkv_rmsnorm_rope_mla: its op docstring says why")
    if kv_cache_dtype not in MLA_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(MLA_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    write = None
    if kv_cache is None:
        for name, value in (("slot_mapping", slot_mapping), ("k_scale", k_scale)):
            if value is not None:
                raise ValueError(f"{name} is only used with kv_cache: pass None")
        if not isinstance(cache_layout, str) or cache_layout not in ("nd", "nz"):
            raise ValueError(f"cache_layout must be 'nd' or 'nz', got {cache_layout!r}")
    else:
        write = _mla_cache(kv_cache, kv_cache_dtype, cache_layout, lkv, r, device)
        if slot_mapping is None:
            raise ValueError("slot_mapping is required with kv_cache")
        _mla_tensor("slot_mapping", slot_mapping, device)
        if slot_mapping.dim() != 1 or slot_mapping.shape[0] < tokens:
            raise ValueError(f"slot_mapping must be [T] (or longer: its first T entries are read) with "
                             f"T = {tokens}, got shape {list(slot_mapping.shape)}")
        if slot_mapping.dtype not in POSITION_DTYPES:
            raise ValueError(f"slot_mapping must be int32 or int64, got {slot_mapping.dtype}")
        if slot_mapping.shape[0] > 1 and slot_mapping.stride(0) != 1:
            raise ValueError("slot_mapping must be contiguous")
        if write.nope_quant == _kv.QUANT_NONE:
            if k_scale is not None:
                raise ValueError(f"k_scale is only used with kv_cache_dtype 'fp8' or 'int8', not "
                                 f"{kv_cache_dtype!r}: pass None")
        else:
            if k_scale is None:
                raise ValueError(f"k_scale is required with kv_cache_dtype={kv_cache_dtype!r}")
            _mla_tensor("k_scale", k_scale, device)
            _scale("k_scale", k_scale, None, None)
    shape = MLAShape(q_lora_rank=lq, kv_lora_rank=lkv, rope_dim=r, elem_bytes=qkv_lora.element_size(),
                     cache_bytes=cache_bytes, is_neox=is_neox, kv_cache=write is not None)
    return MLACall(shape=shape, eps=eps, cache=write, kv_cache_dtype=kv_cache_dtype)


def mla_q_rope_(q, cos_sin_cache, positions, rope_dim, *, is_neox=False) -> MLACall:
    """Check one call of ``mla_q_rope_`` (its exact signature): ``q`` ``[T, H, D]`` (token and
    head strides free, lanes contiguous), ``rope_dim`` even in ``[2, D]``, ``cos_sin_cache``
    ``[max_position, rope_dim]``, ``positions`` ``[T]``.

    Raises
    ------
    ValueError
        On a bad argument; the message names it.
    """
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError("q must be a 3-D tensor [T, num_heads, nope_dim + rope_dim] (q_b_proj's output viewed "
                         "per head)")
    _tensor("q", q, None)
    if q.dtype not in DTYPES:
        raise ValueError(f"q must be bf16, fp16 or fp32, got {q.dtype}")
    tokens, heads, head_dim = q.shape
    if heads < 1 or head_dim < 2:
        raise ValueError(f"q must have at least one head of at least 2 lanes, got shape {list(q.shape)}")
    r = _rope_dim(rope_dim, 2)
    if r > head_dim:
        raise ValueError(f"rope_dim must be at most q's head size {head_dim}, got {r}")
    if q.stride(2) != 1:
        raise ValueError("q must have a contiguous last dim")
    # Rows (token, head) of head_dim lanes must not overlap: taken by stride, the first row dim of
    # more than one entry steps at least a row, the next at least the whole first dim.
    reach = head_dim
    for stride, size in sorted((q.stride(i), q.shape[i]) for i in (0, 1) if q.shape[i] > 1):
        if stride < reach:
            raise ValueError(f"q's rows must not overlap (strides {q.stride()} for shape {list(q.shape)})")
        reach = stride * size
    _cos_sin_cache(cos_sin_cache, r, q.device, "q")
    _positions(positions, tokens, q.device, "q")
    shape = MLAShape(q_lora_rank=0, kv_lora_rank=0, rope_dim=r, elem_bytes=q.element_size(),
                     cache_bytes=cos_sin_cache.element_size(), is_neox=_flag("is_neox", is_neox),
                     num_heads=heads, head_dim=head_dim)
    return MLACall(shape=shape, eps=0.0)
