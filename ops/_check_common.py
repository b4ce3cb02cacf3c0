"""What the two compile checks (``ascend_lowering``, ``cuda_compile``) share."""

from __future__ import annotations

import os
import sys

from . import settings

#: Triton's spelling of the dtypes the checks compile for (``_signature``'s arguments).
TRITON_DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "int8": "i8", "fp8_e4m3": "fp8e4nv"}

_KERNEL_MODULE = "vllm_ascend_ext.ops.split_qkv_rmsnorm_rope"


def refuse_interpreted_kernel() -> bool:
    """Turn the Triton interpreter off for this process; if the kernel was already imported under
    it, say so on stderr and return True (the caller exits 2).

    The interpreter replaces the kernel with a Python object that cannot be compiled; a compile
    check must see the kernel before Triton's interpreter flag does.
    """
    interpreted = settings.triton_interpret()
    os.environ.pop(settings.TRITON_INTERPRET, None)
    if interpreted and _KERNEL_MODULE in sys.modules:
        print("the kernel was imported under TRITON_INTERPRET=1; run this check without it", file=sys.stderr)
        return True
    return False


def in_argument_order(kernel, signature: dict) -> dict:
    """``signature`` (argument name -> type, as ``_signature`` gives it) reordered as ``kernel``
    declares its arguments.

    triton-ascend 3.2's ``ASTSource`` types the kernel's arguments by the *position* of each entry
    of the signature, not by its name, and both checks address arguments by position (upstream
    Triton's divisibility hints, the lowered function's ``%argN``): a signature listing the
    KV-cache arguments first typed ``qkv_ptr`` as the key cache's pointer and made every lowering
    fail. Names the kernel does not declare, and run-time arguments left out, raise ``KeyError``.
    """
    unknown = set(signature) - set(kernel.arg_names)
    missing = [p.name for p in kernel.params if not p.is_constexpr and p.name not in signature]
    if unknown or missing:
        raise KeyError(f"{kernel.__name__}'s signature has unknown arguments {sorted(unknown)} and lacks "
                       f"run-time ones {missing}")
    return {name: signature[name] for name in kernel.arg_names if name in signature}


def first_error(exc: Exception) -> str:
    """The first line that says something: a crashed tool's own message, else the exception's."""
    stderr = getattr(exc, "stderr", None)
    if isinstance(stderr, bytes):
        for line in stderr.decode(errors="replace").splitlines():
            if line.strip() and not line.lstrip().startswith("#") and "Stack dump" not in line:
                return line.strip()
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def kv_cache_call(geometry, dtype: str, cos_sin_dtype: str, *, layout: str, cache_dtype: str,
                  per_channel: bool = False, return_kv: bool = False, q_norm: bool, k_norm: bool,
                  bias: bool = False):
    """The :class:`~.validation.Call` of one ``split_qkv_rmsnorm_rope_kv_cache`` call on
    ``geometry`` (an ``ops.models.AttentionGeometry``), validated by the op's own validator on
    tensors of the ``meta`` device (shapes and strides only): its ``shape`` (``kv_cache`` set)
    and its ``kv_cache`` (:class:`~.validation.KVCacheWrite`: layout strides, quantisation,
    ``return_kv``) are what a real launch compiles with.

    ``dtype`` is qkv's (and the weights'), ``cos_sin_dtype`` the cos/sin cache's, ``cache_dtype``
    the KV cache's (keys of :data:`TRITON_DTYPES`); an int8 or fp8 cache gets fp32 scales, one
    per channel with ``per_channel``. Each cache is one half of a ``[2, ...]`` tensor of 4 blocks
    of 16 slots, as vLLM allocates them (the strides are run-time arguments: only the layout's
    chunk width is compiled in).
    """
    import torch

    from . import kv_cache, validation

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                   "int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}

    def meta(shape, dt):
        return torch.empty(shape, dtype=torch_dtype[dt] if isinstance(dt, str) else dt, device="meta")

    hq, hkv, d = geometry.num_q_heads, geometry.num_kv_heads, geometry.head_dim
    blocks, block_size = 4, 16
    if layout == "nz":
        c0 = kv_cache.NZ_COLUMN_BYTES // torch.empty((), dtype=torch_dtype[cache_dtype]).element_size()
        per_cache = (blocks, hkv * d // c0, block_size, c0)
    elif layout == "hnd":
        per_cache = (blocks, hkv, block_size, d)
    else:
        per_cache = (blocks, block_size, hkv, d)
    caches = meta((2,) + per_cache, cache_dtype)
    scale = None
    if cache_dtype in ("int8", "fp8_e4m3"):
        scale = meta((hkv * d,) if per_channel else (1,), torch.float32)

    def weight(on: bool):
        return meta((d,), dtype) if on else None

    tokens = 1
    positions = meta((3, tokens) if geometry.mrope_section is not None else (tokens,), torch.int64)
    return validation.split_qkv_rmsnorm_rope_kv_cache(
        meta((tokens, geometry.qkv_width), dtype), weight(q_norm), weight(k_norm),
        meta((4096, geometry.rotary_dim), cos_sin_dtype), positions, caches[0], caches[1],
        meta((tokens,), torch.int64), hq, hkv, d, geometry.eps, cache_layout=layout, k_scale=scale,
        v_scale=scale, return_kv=return_kv, is_neox=geometry.is_neox, q_bias=weight(bias and q_norm),
        k_bias=weight(bias and k_norm), weight_offset=geometry.weight_offset,
        mrope_section=geometry.mrope_section, mrope_interleaved=geometry.mrope_interleaved,
        q_gate=geometry.q_gate, v_norm=geometry.v_norm)



def mla_call(spec, heads: int, dtype: str, cos_sin_dtype: str, *, q_side: bool = False, form: str | None = None,
             layout: str = "nd", kv_cache_dtype: str = "auto", storage: str | None = None, is_neox: bool | None = None,
             rope_dim: int | None = None, with_q: bool = False):
    """The :class:`~.validation_mla.MLACall` of one MLA call on ``spec`` (an ``ops.models.MLASpec``),
    validated by the op's own validator on ``meta`` tensors: ``q_side``, ``mla_q_rope_`` on
    ``[1, heads, nope + rope]``; else ``split_qkv_rmsnorm_rope_mla``, with the cache ``form``
    (``None``: none; ``"combined"``: vLLM's ``[4, 16, Lkv + R]``; ``"split"``: the pair in
    ``layout``) of ``kv_cache_dtype``, the cache's element type ``storage`` (a key of
    :data:`TRITON_DTYPES`, or ``"uint8"``; default: ``dtype``, int8 for ``"int8"``'s latent, uint8
    for ``"fp8"``). ``is_neox`` and ``rope_dim`` override the spec's. ``with_q`` (no q latent): the
    prologue also rotates ``q [1, heads, nope + rope]``."""
    import torch

    from . import validation_mla

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                   "int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn, "uint8": torch.uint8}

    def meta(shape, dt):
        return torch.empty(shape, dtype=torch_dtype[dt], device="meta")

    r = spec.rope_dim if rope_dim is None else rope_dim
    neox = spec.is_neox if is_neox is None else is_neox
    cos = meta((4096, r), cos_sin_dtype) if r else None
    positions = meta((1,), "fp32").to(torch.int64) if r else None
    if q_side:
        return validation_mla.mla_q_rope_(meta((1, heads, spec.nope_dim + r), dtype), cos, positions, r, is_neox=neox)
    lq, lkv = spec.q_lora_rank, spec.kv_lora_rank
    kv_cache = slots = scale = None
    if form is not None:
        latent = storage or {"auto": dtype, "int8": "int8"}.get(kv_cache_dtype, "uint8")
        blocks, block_size = 4, 16
        if form == "combined":
            kv_cache = meta((blocks, block_size, lkv + r), latent)
        else:
            def one(lanes, dt):
                if layout == "nd":
                    return meta((blocks, block_size, 1, lanes), dt)
                c0 = 32 // torch.empty((), dtype=torch_dtype[dt]).element_size()
                return meta((blocks, lanes // c0, block_size, c0), dt)
            kv_cache = (one(lkv, latent), one(r, dtype) if r else None)
        slots = meta((1,), "fp32").to(torch.int64)
        if kv_cache_dtype != "auto":
            scale = meta((1,), "fp32")
    return validation_mla.split_qkv_rmsnorm_rope_mla(
        meta((1, lq + lkv + r), dtype), meta((lq,), dtype) if lq else None, meta((lkv,), dtype), cos, positions,
        lq, lkv, r, spec.eps, is_neox=neox, kv_cache=kv_cache, slot_mapping=slots, kv_cache_dtype=kv_cache_dtype,
        k_scale=scale, cache_layout=layout, q=meta((1, heads, spec.nope_dim + r), dtype) if with_q else None)
