"""The one validator of the MLA prologue's arguments (``split_qkv_rmsnorm_rope_mla``) and of its q
side (``mla_q_rope_``): every implementation calls it, and every bad argument raises ``ValueError``
naming it. Like :mod:`.validation`, it reads shapes, strides, dtypes and devices only (fake and
meta tensors pass through it too).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from . import kv_cache as _kv
from .arg_checks import DTYPES, POSITION_DTYPES, count_arg, finite_arg, flag_arg, scale_arg, tensor_arg, vector_arg
from .tiling import MLAShape
from .validation import MAX_HEAD_DIM

__all__ = ["MLACacheWrite", "MLACall", "MLA_CACHE_DTYPES", "MLA_MAX_RANK", "mla_q_rope_", "split_qkv_rmsnorm_rope_mla"]


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
    return tensor_arg(name, tensor, None)


def _rank(name: str, value, least: int) -> int:
    rank = count_arg(name, value, least=least)
    if rank > MLA_MAX_RANK:
        raise ValueError(f"{name} must be at most {MLA_MAX_RANK}, got {rank}")
    return rank


def _rope_dim(value, least: int) -> int:
    r = count_arg("rope_dim", value, least=least)
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


def _q_heads(q, rope_dim, device, what: str) -> tuple[int, int, int, int]:
    """Check ``q`` ``[T, H, D]`` (token and head strides free, lanes contiguous, rows not
    overlapping; on ``what``'s ``device`` where given) and ``rope_dim`` (even, ``[2, D]``); return
    ``(T, H, D, rope_dim)``."""
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError("q must be a 3-D tensor [T, num_heads, nope_dim + rope_dim] (q_b_proj's or q_proj's "
                         "output viewed per head)")
    if device is not None and q.device != device:
        raise ValueError(f"q is on {q.device}, {what} on {device}")
    tensor_arg("q", q, None)
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
    return tokens, heads, head_dim, r


def split_qkv_rmsnorm_rope_mla(qkv_lora, q_a_weight, kv_a_weight, cos_sin_cache, positions, q_lora_rank,
                               kv_lora_rank, rope_dim, eps=1e-6, *, is_neox=False, kv_cache=None,
                               slot_mapping=None, kv_cache_dtype="auto", k_scale=None,
                               cache_layout="nd", q=None) -> MLACall:
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
        without), ``k_scale`` given without a quantised cache or missing with one, ``q`` given with
        a q latent or without RoPE, or not ``[T, H, D]`` of qkv_lora's dtype (as ``mla_q_rope_``'s).
    """
    if not isinstance(qkv_lora, torch.Tensor) or qkv_lora.dim() != 2:
        raise ValueError("qkv_lora must be a 2-D tensor [T, q_lora_rank + kv_lora_rank + rope_dim]")
    tensor_arg("qkv_lora", qkv_lora, None)
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
        vector_arg("q_a_weight", q_a_weight, lq, None)
    if kv_a_weight is None:
        raise ValueError(f"kv_a_weight is required: the kv_a_layernorm weight [{lkv}]")
    _mla_tensor("kv_a_weight", kv_a_weight, device)
    vector_arg("kv_a_weight", kv_a_weight, lkv, None)
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
    eps = finite_arg("eps", eps, non_negative=True)
    is_neox = flag_arg("is_neox", is_neox)
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
            scale_arg("k_scale", k_scale, None, None)
    heads = head_dim = 0
    if q is not None:
        if lq:
            raise ValueError(f"q is rotated in the prologue only without a q latent (q_lora_rank=0, got {lq}): "
                             "with one, q_b_proj sits between; rotate its output with mla_q_rope_")
        if not r:
            raise ValueError("q is given but rope_dim=0: there is nothing of q to rotate")
        q_tokens, heads, head_dim, _ = _q_heads(q, r, device, "qkv_lora")
        if q_tokens != tokens:
            raise ValueError(f"q must be [T, H, D] with T = {tokens} (qkv_lora's rows), got shape {list(q.shape)}")
        if q.dtype != qkv_lora.dtype:
            raise ValueError(f"q must have qkv_lora's dtype {qkv_lora.dtype}, got {q.dtype}")
    shape = MLAShape(q_lora_rank=lq, kv_lora_rank=lkv, rope_dim=r, elem_bytes=qkv_lora.element_size(),
                     cache_bytes=cache_bytes, is_neox=is_neox, kv_cache=write is not None, num_heads=heads,
                     head_dim=head_dim)
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
    tokens, heads, head_dim, r = _q_heads(q, rope_dim, None, "q")
    _cos_sin_cache(cos_sin_cache, r, q.device, "q")
    _positions(positions, tokens, q.device, "q")
    shape = MLAShape(q_lora_rank=0, kv_lora_rank=0, rope_dim=r, elem_bytes=q.element_size(),
                     cache_bytes=cos_sin_cache.element_size(), is_neox=flag_arg("is_neox", is_neox),
                     num_heads=heads, head_dim=head_dim)
    return MLACall(shape=shape, eps=0.0)
