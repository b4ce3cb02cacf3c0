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

import numbers
import operator
from dataclasses import dataclass, replace

import torch

from . import kv_cache as _kv
from . import settings
from .arg_checks import DTYPES, POSITION_DTYPES, count_arg, finite_arg, flag_arg, scale_arg, tensor_arg, vector_arg
from .tiling import KernelShape

__all__ = ["Call", "KVCacheWrite", "MAX_HEAD_DIM", "check_runnable", "geometry", "mrope_section_of",
           "split_qkv_rmsnorm_rope", "split_qkv_rmsnorm_rope_kv_cache", "split_qkv_tp_rmsnorm_rope"]

#: Largest head the op serves: one head's tile row of 512 lanes (plus padding) is what the
#: Ascend UB model and the CUDA register budget were sized and checked for.
MAX_HEAD_DIM = 512


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
    hq, hkv = count_arg("num_q_heads", num_q_heads), count_arg("num_kv_heads", num_kv_heads, least=0)
    d = count_arg("head_dim", head_dim)
    if d % 2 or d > MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be even and at most {MAX_HEAD_DIM}, got {d}")
    if type(rotary_dim) is not int and (isinstance(rotary_dim, bool)
                                        or not isinstance(rotary_dim, numbers.Integral)):
        raise ValueError(f"rotary_dim must be an int, got {rotary_dim!r}")
    r = operator.index(rotary_dim)
    if r % 2 or not 2 <= r <= d:
        raise ValueError(f"rotary_dim (cos_sin_cache's last dim) must be even and in [2, head_dim={d}], "
                         f"got {r}")
    v_norm = flag_arg("v_norm", v_norm)
    if v_norm and hkv == 0:
        raise ValueError("v_norm needs v: a q-only layer (num_kv_heads=0) has none")
    norm_across_heads = flag_arg("norm_across_heads", norm_across_heads)
    if norm_across_heads:
        if hkv == 0:
            raise ValueError("num_kv_heads must be >= 1 with q/k normalised across heads (split_qkv_tp_rmsnorm_rope)")
        for name, on in (("q_gate", q_gate), ("v_norm", v_norm), ("mrope", mrope)):
            if on:
                raise ValueError(f"{name} is not supported with q/k normalised across heads "
                                 "(split_qkv_tp_rmsnorm_rope)")
    return KernelShape(num_q_heads=hq, num_kv_heads=hkv, head_dim=d, rotary_dim=r,
                       elem_bytes=elem_bytes, cache_bytes=cache_bytes,
                       is_neox=flag_arg("is_neox", is_neox), q_gate=flag_arg("q_gate", q_gate),
                       v_norm=v_norm, mrope=flag_arg("mrope", mrope), norm_across_heads=norm_across_heads,
                       qk_norm=flag_arg("qk_norm", qk_norm))


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
    section = tuple(count_arg("mrope_section", v, least=0) for v in mrope_section)
    if sum(section) != rotary_dim // 2:
        raise ValueError(f"mrope_section {list(section)} must sum to rotary_dim/2 = {rotary_dim // 2}, "
                         f"the frequency lanes of cos_sin_cache's rows")
    return section


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
    tensor_arg("qkv", qkv, None)
    if qkv.dtype not in DTYPES:
        raise ValueError(f"qkv must be bf16, fp16 or fp32, got {qkv.dtype}")
    cache = tensor_arg("cos_sin_cache", cos_sin_cache, device)
    if cache.dim() != 2 or cache.shape[0] < 1:
        raise ValueError("cos_sin_cache must be a 2-D tensor [max_position, rotary_dim] with at "
                         f"least one row, got shape {list(cache.shape)}")
    if cache.dtype not in DTYPES:
        raise ValueError(f"cos_sin_cache must be fp32, bf16 or fp16, got {cache.dtype}")
    if cache.stride(1) != 1:
        raise ValueError("cos_sin_cache must have a contiguous last dim")
    tensor_arg("positions", positions, device)
    mrope = positions.dim() == 2
    shape = geometry(num_q_heads, num_kv_heads, head_dim, cache.shape[1], is_neox=is_neox,
                     elem_bytes=qkv.element_size(), cache_bytes=cache.element_size(), q_gate=q_gate,
                     v_norm=v_norm, mrope=mrope, qk_norm=q_weight is not None or k_weight is not None)
    section = mrope_section_of(mrope_section, shape.rotary_dim)
    mrope_interleaved = flag_arg("mrope_interleaved", mrope_interleaved)
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
            vector_arg(name, weight, shape.head_dim, device)
    for name, bias, weight in (("q_bias", q_bias, q_weight), ("k_bias", k_bias, k_weight)):
        if bias is not None:
            if weight is None:
                raise ValueError(f"{name} is only allowed together with a weight")
            vector_arg(name, bias, shape.head_dim, device)
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
    inplace = flag_arg("inplace", inplace)
    if inplace and shape.q_gate:
        raise ValueError("inplace=True cannot be combined with q_gate=True: q's heads sit 2*head_dim apart "
                         "in qkv, so q written in place is no [T, num_q_heads*head_dim] tensor")
    return Call(shape=shape, num_tokens=qkv.shape[0], q_norm=q_weight is not None,
                k_norm=k_weight is not None, q_bias=q_bias is not None, k_bias=k_bias is not None,
                eps=finite_arg("eps", eps, non_negative=True),
                weight_offset=finite_arg("weight_offset", weight_offset), inplace=inplace,
                mrope_section=section if mrope else None, mrope_interleaved=mrope and mrope_interleaved)


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
    tensor_arg("key_cache", key_cache, device)
    tensor_arg("value_cache", value_cache, device)
    quant = _kv.quant_of(key_cache.dtype)
    if value_cache.dtype != key_cache.dtype:
        raise ValueError(f"value_cache must have key_cache's dtype {key_cache.dtype}, got {value_cache.dtype}")
    if not isinstance(cache_layout, str):
        raise ValueError(f"cache_layout must be a string, got {cache_layout!r}")
    key_strides, value_strides = _kv.cache_strides(key_cache, value_cache, cache_layout, shape.num_kv_heads,
                                                   shape.head_dim)
    tensor_arg("slot_mapping", slot_mapping, device)
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
        per_channel = scale_arg("k_scale", k_scale, device, channels)
        if scale_arg("v_scale", v_scale, device, channels) != per_channel:
            raise ValueError("k_scale and v_scale must both be per tensor or both per channel")
    write = KVCacheWrite(layout=cache_layout, key_strides=key_strides, value_strides=value_strides, quant=quant,
                         per_channel=per_channel, return_kv=flag_arg("return_kv", return_kv))
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
    tp = count_arg("tp_size", tp_size)
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
        vector_arg(name, weight, heads * shape.head_dim, device)
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
