"""The inputs of one benchmark row and the fewest bytes it moves, per op family.

The prologue (:func:`make_inputs`, :func:`bytes_moved`), the KV-cache write (:func:`make_kv_inputs`,
and :func:`bytes_moved` with ``kv_cache=True``), the norm across TP ranks (:func:`tp_local_geometry`,
:func:`make_tp_inputs`) and MLA (:func:`make_mla_case`, :func:`mla_bytes_moved`). Every draw comes
from ``ops.reference``'s generators with a seeded CPU generator (the same seed gives the same
inputs), positions inside a :data:`~.catalog.MAX_POSITION`-row cos/sin cache as the unfused
providers need. The byte counts are the floor every row is held against (and ``vllm-ascend-ext
report``'s, for the fused kernel).
"""

from __future__ import annotations

import functools

import torch

from .catalog import KV_BLOCK_SIZE, MAX_POSITION, MLA_BLOCK_SIZE

__all__ = ["bytes_moved", "make_inputs", "make_kv_inputs", "make_mla_case", "make_tp_inputs", "mla_bytes_moved",
           "mla_launches", "tp_local_geometry"]


def make_inputs(geometry, tokens: int, device, dtype=torch.bfloat16, seed: int = 0) -> dict:
    """The benchmark's arguments of one call: ``ops.reference.make_inputs`` with a seeded generator.

    Parameters
    ----------
    geometry : AttentionGeometry
        One rank's layer geometry.
    tokens : int
        ``T``.
    device : torch.device or str
        Where the tensors live.
    dtype : torch.dtype
        qkv's (and the weights') dtype; the cache is fp32.
    seed : int
        Seed of the CPU generator the draws come from (the same seed gives the same inputs).

    Returns
    -------
    dict
        The op's keyword arguments. Positions stay inside the cache, as the unfused providers
        need.
    """
    from ..ops.reference import make_inputs as reference_inputs

    generator = torch.Generator(device="cpu").manual_seed(seed)
    return reference_inputs(geometry, tokens, device=device, dtype=dtype, cache_dtype=torch.float32,
                            max_position=MAX_POSITION, out_of_range=False, generator=generator)


def bytes_moved(geometry, tokens: int, elem_bytes: int = 2, cache_bytes: int = 4, kv_cache: bool = False) -> int:
    """The fewest bytes the prologue moves: q and k read and written (and the gate and v where
    they are written), one cos/sin row a token (three with mRoPE).

    Parameters
    ----------
    geometry : AttentionGeometry
        One rank's layer geometry.
    tokens : int
        ``T``.
    elem_bytes, cache_bytes : int
        Element sizes of qkv (and of a KV cache of its dtype) and of the cos/sin cache.
    kv_cache : bool
        The bytes of ``split_qkv_rmsnorm_rope_kv_cache``: v is always read and written (into
        the value cache), k written into the key cache, a cache line per token and kv head, of
        qkv's dtype.

    Returns
    -------
    int
    """
    heads = geometry.num_q_heads * (2 if geometry.q_gate else 1) + geometry.num_kv_heads * (
        2 if geometry.v_norm or kv_cache else 1)
    rows = 1 if geometry.mrope_section is None else 3
    return tokens * (2 * heads * geometry.head_dim * elem_bytes + rows * geometry.rotary_dim * cache_bytes)


def make_kv_inputs(geometry, tokens: int, device, seed: int = 0) -> tuple[dict, dict]:
    """The KV-cache run's arguments of one call: the prologue's (:func:`make_inputs`) and the cache's.

    Parameters
    ----------
    geometry : AttentionGeometry
        One rank's layer geometry.
    tokens : int
        ``T``.
    device : torch.device or str
        Where the tensors live.
    seed : int
        Seed of the CPU generators the draws come from.

    Returns
    -------
    args : dict
        The prologue op's keyword arguments (bf16 qkv).
    cache : dict
        ``key_cache, value_cache, slot_mapping, cache_layout`` from ``ops.reference.make_kv_cache``:
        bf16 ``nhd`` caches of :data:`KV_BLOCK_SIZE`-row blocks, sentinel-filled, with room for
        twice the tokens, and one random distinct slot a token (no padding).
    """
    from ..ops.reference import make_kv_cache

    cache = make_kv_cache(geometry, tokens, cache_layout="nhd", dtype=torch.bfloat16, block_size=KV_BLOCK_SIZE,
                          padding=0, device=device, generator=torch.Generator(device="cpu").manual_seed(seed))
    return make_inputs(geometry, tokens, device, seed=seed), {
        name: cache[name] for name in ("key_cache", "value_cache", "slot_mapping", "cache_layout")}


def tp_local_geometry(full, tp: int):
    """The geometry one rank of ``tp`` sees of the full layer ``full`` as vLLM shards MiniMax-M2:
    ``Hq/tp`` q heads, ``max(1, Hkv/tp)`` kv heads (replicated when fewer than the ranks)."""
    from dataclasses import fields, replace

    from ..ops.models import AttentionGeometry

    local = {f.name: getattr(full, f.name) for f in fields(AttentionGeometry)}
    return replace(AttentionGeometry(**local), num_q_heads=full.num_q_heads // tp,
                   num_kv_heads=max(1, full.num_kv_heads // tp))


def make_tp_inputs(full, tokens: int, tp: int, rank: int, device, seed: int = 0) -> tuple[dict, tuple]:
    """One rank's arguments of ``split_qkv_tp_rmsnorm_rope`` and the float64 reference of its outputs.

    Every rank draws the same full layer (``ops.reference.make_tp_inputs``, bf16, a seeded CPU
    generator, positions clamped into a :data:`MAX_POSITION`-row cache as the unfused path
    needs), computes the single-process float64 reference of the whole layer
    (``reference.split_qkv_tp_rmsnorm_rope_full``) and keeps its shard (``shard_minimax``,
    ``shard_minimax_outputs``: vLLM's sharding, replicated kv heads included).

    Parameters
    ----------
    full : AttentionGeometry
        The unsharded layer.
    tokens : int
        ``T``.
    tp, rank : int
        The group's size and this rank.
    device : torch.device or str
        Where the tensors live (the reference is computed there).
    seed : int
        Seed of the CPU generator (the same on every rank).

    Returns
    -------
    args : dict
        The op's keyword arguments but ``all_reduce`` (``tp_size`` included).
    reference : tuple of torch.Tensor
        float64 ``q``, ``k``, ``v`` of this rank's heads.
    """
    from ..ops import reference

    generator = torch.Generator(device="cpu").manual_seed(seed)
    layer = reference.make_tp_inputs(full, tokens, device=device, dtype=torch.bfloat16, max_position=MAX_POSITION,
                                     generator=generator)
    layer["positions"].clamp_(0, MAX_POSITION - 1)
    ref = reference.shard_minimax_outputs(reference.split_qkv_tp_rmsnorm_rope_full(**layer), full.num_q_heads,
                                          full.num_kv_heads, full.head_dim, tp, rank)
    return reference.shard_minimax(layer, tp, rank), tuple(t.clone() for t in ref)


def mla_bytes_moved(spec, heads: int, tokens: int, elem_bytes: int = 2, cos_bytes: int = 4) -> int:
    """The fewest bytes the two launches move: qkv_lora's used columns read, both weights read
    once, q_c, kv_c_normed and k_pe written, the cache rows written (``Lkv + R`` of qkv's dtype a
    token), q_pe read and written (``H x R`` a token), and a cos/sin row a token read by each
    launch (the q side runs after ``q_b_proj``, so both need it). Positions and slots are not
    counted.

    Parameters
    ----------
    spec : MLASpec
        The model (``ops.models.MLA_MODELS``).
    heads : int
        q heads on the rank.
    tokens : int
        ``T``.
    elem_bytes, cos_bytes : int
        Element sizes of qkv_lora (outputs, q and cache alike) and of the cos/sin cache.

    Returns
    -------
    int
    """
    lq, lkv, rope = spec.q_lora_rank, spec.kv_lora_rank, spec.rope_dim
    per_token = elem_bytes * ((lq + lkv + rope) + (lq + lkv + rope) + (lkv + rope) + 2 * heads * rope)
    return tokens * (per_token + 2 * rope * cos_bytes) + elem_bytes * (lq + lkv)


def make_mla_case(spec, heads: int, tokens: int, device, seed: int = 0) -> dict:
    """One row's inputs: the prologue's arguments (``ops.reference.make_mla_inputs``, bf16, fp32
    cos/sin cache of :data:`MAX_POSITION` rows, positions inside it), a bf16 combined cache
    (``ops.reference.make_mla_cache``: sentinel-filled, :data:`MLA_BLOCK_SIZE`-row blocks, room
    for twice the tokens, no padding slot), and ``q`` ``[T, H, nope + R]`` drawn on the device.

    Returns
    -------
    dict
        ``args`` (the op's keyword arguments), ``kv_cache``, ``slot_mapping``, ``q`` (ours'), and
        ``q_vllm`` (a copy of it for the ``vllm`` provider: each rotates its own in place).
    """
    from ..ops.reference import make_mla_cache, make_mla_inputs

    generator = torch.Generator(device="cpu").manual_seed(seed)
    args = make_mla_inputs(spec.q_lora_rank, spec.kv_lora_rank, spec.rope_dim, tokens, device=device,
                           dtype=torch.bfloat16, cache_dtype=torch.float32, max_position=MAX_POSITION,
                           out_of_range=False, is_neox=spec.is_neox, eps=spec.eps, generator=generator)
    cache = make_mla_cache(args, dtype=torch.bfloat16, block_size=MLA_BLOCK_SIZE, padding=0, generator=generator)
    device_generator = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(tokens, heads, spec.q_head_dim, device=device, generator=device_generator).to(torch.bfloat16)
    return {"args": args, "kv_cache": cache["kv_cache"], "slot_mapping": cache["slot_mapping"], "q": q,
            "q_vllm": q.clone()}


def mla_launches(ops, case: dict):
    """A zero-argument callable running our MLA launches on ``case`` (:func:`make_mla_case`) as the
    MLA step calls them, returning the prologue's outputs: the prologue with the cache write, then
    ``mla_q_rope_`` on ``q``; without a q latent the prologue rotates ``q`` itself, one launch
    (an ``ops`` whose prologue takes no ``q``, another checkout's for an A/B, runs both launches).

    Parameters
    ----------
    ops : module
        Where ``split_qkv_rmsnorm_rope_mla`` and ``mla_q_rope_`` are taken from (``vllm_ascend_ext.ops``).
    case : dict
        :func:`make_mla_case`'s.
    """
    import inspect

    a, q = case["args"], case["q"]
    prologue = functools.partial(ops.split_qkv_rmsnorm_rope_mla, **a, kv_cache=case["kv_cache"],
                                 slot_mapping=case["slot_mapping"])
    if not a["q_lora_rank"] and "q" in inspect.signature(ops.split_qkv_rmsnorm_rope_mla).parameters:
        return functools.partial(prologue, q=q)

    def both():
        outputs = prologue()
        ops.mla_q_rope_(q, a["cos_sin_cache"], a["positions"], a["rope_dim"], is_neox=a["is_neox"])
        return outputs
    return both
