"""The attention prologue fused with the paged KV-cache write: split qkv, RMS-normalise and rotate q
and k per head (:mod:`.split_qkv_rmsnorm_rope`, every feature), and write k and v straight into the
layer's key and value caches, so no second kernel reads them back.

Layout
------
``qkv``, the weights, ``cos_sin_cache`` and ``positions`` are the prologue op's. ``key_cache`` and
``value_cache`` are one layer's paged caches in one of the layouts of :mod:`.kv_cache` (``nhd``,
``hnd``, Ascend's fractal ``nz``), as tensors or views of one wider tensor, both with the same
shape and strides. ``slot_mapping[t]`` is token ``t``'s slot: block ``s // block_size``, row
``s % block_size``; a negative slot is padding, and that token's k and v are written nowhere.

Math
----
q, k and v exactly as the prologue op computes them (fp32, one rounding); then, per token with a
slot, per kv head ``h`` and lane ``d``::

    key_cache[slot, h, d]   = store(k[t, h, d])      # at the layout's address of (block, row, h, d)
    value_cache[slot, h, d] = store(v[t, h, d])
    store(y) = y cast to the cache dtype                        (bf16 / fp16 / fp32)
             = clamp(round_half_even(y / scale), -128, 127)     (int8, scale per tensor or channel)
             = fp8_e4m3(clamp(y / scale, -448, 448))            (fp8 e4m3fn, per-tensor scale)

Nothing else of the caches is touched. The kernel is the prologue's, compiled with its ``KV_*``
constexpr variant: the k head blocks store into the cache (and into ``k`` only with
``return_kv``), and v's head blocks, otherwise skipped unless v is normalised, load v and store
it into the cache.
"""

from __future__ import annotations

from . import launch_cache, validation
from .split_qkv_rmsnorm_rope import launch

__all__ = ["split_qkv_rmsnorm_rope_kv_cache"]


def split_qkv_rmsnorm_rope_kv_cache(qkv, q_weight, k_weight, cos_sin_cache, positions, key_cache, value_cache,
                                    slot_mapping, num_q_heads, num_kv_heads, head_dim, eps=1e-6, *,
                                    cache_layout="nhd", k_scale=None, v_scale=None, return_kv=False,
                                    is_neox=True, q_bias=None, k_bias=None, weight_offset=0.0,
                                    inplace=False, mrope_section=None, mrope_interleaved=False,
                                    q_gate=False, v_norm=False):
    """Split a fused qkv projection, RMS-normalise and rotate q and k, write k and v into the
    paged KV cache: one kernel.

    Parameters
    ----------
    qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps
        As :func:`~vllm_ascend_ext.ops.split_qkv_rmsnorm_rope.split_qkv_rmsnorm_rope`;
        ``num_kv_heads >= 1``.
    key_cache, value_cache : torch.Tensor
        One layer's caches in ``cache_layout``, same shape, strides and dtype: bf16, fp16, fp32,
        int8 or float8_e4m3fn.
    slot_mapping : torch.Tensor
        ``[T]`` (or longer; the first ``T`` are read), int32 or int64, contiguous. Negative:
        padding, nothing written. Slots must lie below ``num_blocks * block_size`` (not checked
        on the device: that would need a host sync).
    cache_layout : str
        ``"nhd"``, ``"hnd"`` or ``"nz"`` (:mod:`.kv_cache` gives each one's shape and address).
    k_scale, v_scale : torch.Tensor or None
        fp32 quantisation scales, only with an int8 or fp8 cache (required there): one value, or
        for int8 ``[Hkv*D]``, one per channel. The cache holds ``y / scale``.
    return_kv : bool
        Also return k (and v) as the prologue op does; otherwise they are ``[T, 0]``.
    is_neox, q_bias, k_bias, weight_offset, inplace, mrope_section, mrope_interleaved, q_gate, v_norm
        As the prologue op (``inplace`` writes q, and k and v with ``return_kv``, into qkv).

    Returns
    -------
    tuple of torch.Tensor
        ``(q, k, v)``, and the gate with ``q_gate``: as the prologue op returns them, with k and
        v ``[T, 0]`` unless ``return_kv``.

    Raises
    ------
    ValueError
        On a bad argument, naming it (:func:`.validation.split_qkv_rmsnorm_rope_kv_cache`).
    """
    return launch(_CACHE, locals(), validation.split_qkv_rmsnorm_rope_kv_cache)


_CACHE = launch_cache.LaunchCache("split_qkv_rmsnorm_rope_kv_cache")
