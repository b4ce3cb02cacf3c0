"""The float64 reference of the ops and the one input generator: pure PyTorch, no kernel code.

Written from the math in each op's docstring, element by element as the definition reads, and
sharing nothing with any implementation (Triton, AscendC, the unfused vLLM spelling): the tests
of ``tests/ops`` and ``tests/csrc`` and the benchmark's correctness check all compare against
it. The next ops extend this module.
"""

from __future__ import annotations

import math

import torch

__all__ = ["kv_cache_write", "make_inputs", "make_kv_cache", "make_mla_cache", "make_mla_inputs", "make_tp_inputs",
           "mla_cache_write", "mla_q_rope", "shard_minimax", "shard_minimax_outputs", "split_qkv_rmsnorm_rope",
           "split_qkv_rmsnorm_rope_mla", "split_qkv_tp_rmsnorm_rope_full"]


def _lane_axes(half: int, mrope_section, interleaved: bool) -> torch.Tensor:
    """For each of the ``R/2`` frequency lanes, the position axis (0 = t, 1 = h, 2 = w) whose cache
    row it reads: contiguous sections (vLLM's ``cos.split(mrope_section)``, section ``j`` from
    axis ``j``), or interleaved (``apply_interleaved_rope``: lane ``i`` takes h if ``i % 3 == 1``
    and ``i < 3*h``, w if ``i % 3 == 2`` and ``i < 3*w``, else t)."""
    t, h, w = mrope_section
    axes = []
    for i in range(half):
        if interleaved:
            axes.append(1 if i % 3 == 1 and i < 3 * h else 2 if i % 3 == 2 and i < 3 * w else 0)
        else:
            axes.append(0 if i < t else 1 if i < t + h else 2)
    return torch.tensor(axes, dtype=torch.long)


def split_qkv_rmsnorm_rope(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads,
                           head_dim, eps=1e-6, *, is_neox=True, q_bias=None, k_bias=None,
                           weight_offset=0.0, inplace=False, mrope_section=None, mrope_interleaved=False,
                           q_gate=False, v_norm=False):
    """The outputs of ``split_qkv_rmsnorm_rope`` in float64 (the op's signature; ``inplace``
    ignored).

    Per token and head: ``y = x / sqrt(mean(x**2) + eps) * (weight_offset + w) + b`` when that
    tensor has a weight, then the rotary pairs of the first ``R`` dims rotated by the cache row
    of the clamped position (with ``[3, T]`` positions, lane ``i`` of the row of its axis); the
    rest pass through. With ``q_gate`` each q head of qkv is ``D`` values of q then ``D`` of the
    gate; with ``v_norm`` v's heads are divided by their RMS; ``num_kv_heads == 0`` is q alone.

    Returns
    -------
    tuple of torch.Tensor
        float64 ``q`` ``[T, Hq*D]``, ``k`` and ``v`` ``[T, Hkv*D]`` (v normalised with
        ``v_norm``, else as in qkv), and with ``q_gate`` the gate ``[T, Hq*D]``, on qkv's device.
    """
    tokens, rotary = qkv.shape[0], cos_sin_cache.shape[1]
    half = rotary // 2
    table = cos_sin_cache.double()
    pos = positions.long().clamp(0, cos_sin_cache.shape[0] - 1)
    if pos.dim() == 2:  # [3, T]: lane i of the row of its axis
        lanes = torch.arange(half)
        axes = _lane_axes(half, mrope_section, mrope_interleaved).to(pos.device)
        row_of_lane = pos[axes.to(pos.device)].T  # [T, R/2]: the position lane i reads
        cos = table[row_of_lane, lanes.to(pos.device)][:, None, :]
        sin = table[row_of_lane, half + lanes.to(pos.device)][:, None, :]
    else:
        rows = table[pos]
        cos, sin = rows[:, None, :half], rows[:, None, half:]
    if is_neox:
        first, second = torch.arange(half), torch.arange(half, rotary)
    else:
        first, second = torch.arange(0, rotary, 2), torch.arange(1, rotary, 2)
    d, hq, hkv = head_dim, num_q_heads, num_kv_heads
    x = qkv.double()
    if q_gate:
        q_in = x[:, :2 * hq * d].reshape(tokens, hq, 2 * d)
        q_in, gate = q_in[..., :d], q_in[..., d:].reshape(tokens, hq * d)
        start = 2 * hq * d
    else:
        q_in, gate, start = x[:, :hq * d].reshape(tokens, hq, d), None, hq * d
    k_in = x[:, start:start + hkv * d].reshape(tokens, hkv, d)
    v = x[:, start + hkv * d:start + 2 * hkv * d].reshape(tokens, hkv, d)

    def rms(y):
        return y / torch.sqrt((y * y).mean(dim=-1, keepdim=True) + eps)

    outs = []
    for heads, y, weight, bias in ((hq, q_in, q_weight, q_bias), (hkv, k_in, k_weight, k_bias)):
        if weight is not None:
            y = rms(y) * (weight_offset + weight.double())
            if bias is not None:
                y = y + bias.double()
        rotated = y.clone()
        rotated[..., first] = y[..., first] * cos - y[..., second] * sin
        rotated[..., second] = y[..., second] * cos + y[..., first] * sin
        outs.append(rotated.reshape(tokens, heads * d))
    v = (rms(v) if v_norm else v).reshape(tokens, hkv * d)
    return (outs[0], outs[1], v) + ((gate,) if q_gate else ())


def make_inputs(geometry, tokens: int, *, device="cpu", dtype=torch.bfloat16, cache_dtype=torch.float32,
                positions_dtype=torch.int64, bias: bool = False, row_padding: int = 0,
                cache_row_padding: int = 0, max_position: int = 97, out_of_range: bool = True,
                text_positions: bool = False, generator: torch.Generator | None = None) -> dict:
    """Fresh random arguments of one ``split_qkv_rmsnorm_rope`` call, as keyword arguments.

    Parameters
    ----------
    geometry : AttentionGeometry
        Heads, head size, rotary dims and style, norm and its ``weight_offset`` and ``eps``.
    tokens : int
        ``T``.
    device, dtype, cache_dtype, positions_dtype
        Where, and the dtypes of qkv (and weights, biases), of the cache and of positions.
    bias : bool
        Give q and k a bias (only where they have a weight).
    row_padding, cache_row_padding : int
        Extra elements per row of qkv / of the cache: the tensors passed are views with a
        larger row stride.
    max_position : int
        Rows of the cos/sin cache; each row is ``cos(a)``, ``sin(a)`` of random angles.
    out_of_range : bool
        Let positions fall a few rows outside ``[0, max_position)`` (the op clamps them).
    text_positions : bool
        For an mRoPE geometry, positions ``[T]`` (a text-only batch) instead of ``[3, T]``
        with each axis drawn independently.
    generator : torch.Generator, optional
        CPU generator for reproducible draws; the default generator otherwise.

    Returns
    -------
    dict
        ``qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads,
        head_dim, eps, is_neox, q_bias, k_bias, weight_offset`` and the geometry's
        ``op_options`` (``q_gate, v_norm, mrope_section, mrope_interleaved``). A q-only
        geometry (``num_kv_heads == 0``) has no k weight or bias.
    """
    g = geometry

    def randn(*size):
        return torch.randn(*size, generator=generator)

    width = g.qkv_width
    qkv = randn(tokens, width + row_padding).to(device=device, dtype=dtype)[:, :width]
    weights = [randn(g.head_dim).to(device=device, dtype=dtype) if g.qk_norm and heads else None
               for heads in (g.num_q_heads, g.num_kv_heads)]
    biases = [(0.5 * randn(g.head_dim)).to(device=device, dtype=dtype) if bias and w is not None else None
              for w in weights]
    angles = torch.rand(max_position, g.rotary_dim // 2, generator=generator, dtype=torch.float64)
    cache = torch.cat([(2 * math.pi * angles).cos(), (2 * math.pi * angles).sin(),
                       torch.zeros(max_position, cache_row_padding, dtype=torch.float64)], dim=1)
    cache = cache.to(device=device, dtype=cache_dtype)[:, :g.rotary_dim]
    spill = 3 if out_of_range else 0
    axes = () if g.mrope_section is None or text_positions else (3,)
    positions = torch.randint(-spill, max_position + spill, (*axes, tokens), generator=generator)
    return dict(qkv=qkv, q_weight=weights[0], k_weight=weights[1], cos_sin_cache=cache,
                positions=positions.to(device=device, dtype=positions_dtype),
                num_q_heads=g.num_q_heads, num_kv_heads=g.num_kv_heads, head_dim=g.head_dim,
                eps=g.eps, is_neox=g.is_neox, q_bias=biases[0], k_bias=biases[1],
                weight_offset=g.weight_offset, **g.op_options)


def kv_cache_write(key_cache, value_cache, k, v, slot_mapping, num_kv_heads, head_dim, *, cache_layout="nhd",
                   k_scale=None, v_scale=None):
    """What ``split_qkv_rmsnorm_rope_kv_cache`` leaves in the caches, in float64: copies of both
    caches (their old values as float64) with each token's k and v (``[T, Hkv*D]``, float64) stored
    at its slot, padding slots skipped.

    Addresses follow the layouts' definitions: ``nhd`` ``cache[b, o, h, d]``; ``hnd``
    ``cache[b, h, o, d]``; ``nz`` ``cache[b, c // C0, o, c % C0]`` with ``c = h*D + d`` and
    ``C0`` the lanes of 32 bytes; ``cpu_vec`` (one tensor ``[NB, H, BS, 2D]``, passed as both
    caches) the flat page ``p = (b*H + h)*BS*2D``, k at ``p + d*BS + o`` and v at
    ``p + BS*D + o*D + d``. A quantised cache gets ``y / scale`` (the scale per tensor, or per
    channel ``h*D + d``) saturated, int8 rounded half to even, fp8 e4m3 rounded to its grid.

    Returns
    -------
    tuple of torch.Tensor
        float64 key and value caches of the caches' shapes (for ``cpu_vec`` the one tensor, twice).
    """
    def as_float64(cache):
        return (cache.float() if cache.dtype == torch.float8_e4m3fn else cache).double().clone()

    one = cache_layout == "cpu_vec"
    results = [as_float64(key_cache)]
    results.append(results[0] if one else as_float64(value_cache))
    for which, (result, y, scale) in enumerate(((results[0], k, k_scale), (results[1], v, v_scale))):
        cache = key_cache
        y = y.double().reshape(y.shape[0], num_kv_heads, head_dim)
        if cache.dtype in (torch.int8, torch.float8_e4m3fn):
            y = y / scale.double().reshape(-1).expand(num_kv_heads * head_dim).reshape(num_kv_heads, head_dim)
            if cache.dtype == torch.int8:
                y = y.clamp(-128, 127).round()
            else:
                y = y.clamp(-448, 448).to(torch.float8_e4m3fn).double()
        block_size = cache.shape[1] if cache_layout == "nhd" else cache.shape[2]
        c0 = 32 // cache.element_size()
        slots = slot_mapping[:y.shape[0]].long().to(result.device)
        tokens = torch.nonzero(slots >= 0).flatten()
        b, o = slots[tokens] // block_size, slots[tokens] % block_size
        rows = y[tokens.to(y.device)].to(result.device)  # [n, Hkv, D]
        if cache_layout == "nhd":
            result[b, o] = rows
        elif cache_layout == "hnd":
            result.permute(0, 2, 1, 3)[b, o] = rows
        elif cache_layout == "nz":
            c = torch.arange(num_kv_heads * head_dim, device=result.device)
            result[b[:, None], (c // c0)[None, :], o[:, None], (c % c0)[None, :]] = rows.reshape(len(tokens), c.numel())
        else:
            h = torch.arange(num_kv_heads, device=result.device)[None, :, None]
            d = torch.arange(head_dim, device=result.device)[None, None, :]
            page = (b[:, None, None] * num_kv_heads + h) * block_size * 2 * head_dim
            o = o[:, None, None]
            at = page + d * block_size + o if which == 0 else page + block_size * head_dim + o * head_dim + d
            result.view(-1)[at.flatten()] = rows.flatten()
    return tuple(results)


def make_kv_cache(geometry, tokens: int, *, cache_layout="nhd", dtype=torch.bfloat16, block_size: int = 16,
                  num_blocks: int | None = None, padding: int = 2, device="cpu", per_channel: bool = False,
                  generator: torch.Generator | None = None) -> dict:
    """Fresh cache-write arguments for ``tokens`` tokens: sentinel-filled key and value caches (views
    of one ``[2, ...]`` tensor; for ``cpu_vec`` one tensor, twice) with room to spare, a random
    slot per token (distinct, crossing block boundaries, ``padding`` of them negative) and, for an
    int8/fp8 cache, scales.

    Returns
    -------
    dict
        ``key_cache, value_cache, slot_mapping, cache_layout, k_scale, v_scale``.
    """
    g = geometry
    num_blocks = num_blocks or max(2, -(-2 * tokens // block_size) + 1)
    hd = g.num_kv_heads * g.head_dim
    if cache_layout == "nhd":
        shape = (num_blocks, block_size, g.num_kv_heads, g.head_dim)
    elif cache_layout == "hnd":
        shape = (num_blocks, g.num_kv_heads, block_size, g.head_dim)
    elif cache_layout == "nz":
        c0 = 32 // torch.empty((), dtype=dtype).element_size()
        shape = (num_blocks, hd // c0, block_size, c0)
    else:  # cpu_vec: one tensor holds both
        shape = (num_blocks, g.num_kv_heads, block_size, 2 * g.head_dim)
    both = torch.full((2, *shape), 7.0, dtype=torch.float32)
    both = both.to(dtype).to(device)
    if cache_layout == "cpu_vec":
        both = both[:1].expand(2, *shape)
    slots = torch.randperm(num_blocks * block_size, generator=generator)[:tokens]
    if padding:
        slots[torch.randperm(tokens, generator=generator)[:min(padding, tokens)]] = -1
    scales = {}
    if dtype in (torch.int8, torch.float8_e4m3fn):
        n = hd if per_channel else 1
        for name in ("k_scale", "v_scale"):
            scales[name] = (0.01 + 0.05 * torch.rand(n, generator=generator)).to(device)
    return dict(key_cache=both[0], value_cache=both[1], slot_mapping=slots.to(device),
                cache_layout=cache_layout, k_scale=scales.get("k_scale"), v_scale=scales.get("v_scale"))


def split_qkv_tp_rmsnorm_rope_full(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads,
                                   head_dim, eps=1e-6, *, is_neox=True):
    """What ``split_qkv_tp_rmsnorm_rope`` computes on every rank together, in float64, from the
    FULL unsharded layer in one process (MiniMax-M2's ``MiniMaxText01RMSNormTP`` at TP 1).

    Per token: q's ``Hq*D`` columns divided by their RMS over all of them (``sqrt(mean(x**2) +
    eps)``) times ``q_weight`` (``[Hq*D]``), k's ``Hkv*D`` columns likewise with ``k_weight``;
    then each head rotated as :func:`split_qkv_rmsnorm_rope` rotates it (partial rotary over the
    first ``R`` dims, NeoX or GPT-J, clamped positions). ``num_q_heads``/``num_kv_heads`` are the
    model's total head counts.

    Returns
    -------
    tuple of torch.Tensor
        float64 ``q`` ``[T, Hq*D]``, ``k`` and ``v`` ``[T, Hkv*D]`` (v as in qkv).
    """
    x = qkv.double()
    q_cols, kv_cols = num_q_heads * head_dim, num_kv_heads * head_dim
    normed = x[:, :q_cols + 2 * kv_cols].clone()
    for start, cols, weight in ((0, q_cols, q_weight), (q_cols, kv_cols, k_weight)):
        y = normed[:, start:start + cols]
        normed[:, start:start + cols] = y / torch.sqrt((y * y).mean(dim=-1, keepdim=True) + eps) * weight.double()
    return split_qkv_rmsnorm_rope(normed, None, None, cos_sin_cache, positions, num_q_heads, num_kv_heads,
                                  head_dim, eps, is_neox=is_neox)


def _minimax_heads(num_q_heads: int, num_kv_heads: int, tp: int, rank: int) -> tuple[range, range]:
    """The q heads and kv heads (of the full layer) rank ``rank`` of ``tp`` holds, as vLLM shards
    MiniMax-M2: q heads split evenly; kv heads split while there are at least ``tp`` of them,
    else replicated, rank ``r`` holding kv head ``r // (tp // Hkv)``."""
    if num_q_heads % tp or not 0 <= rank < tp:
        raise ValueError(f"tp={tp}, rank={rank} cannot shard {num_q_heads} q heads")
    hq = num_q_heads // tp
    if num_kv_heads >= tp:
        if num_kv_heads % tp:
            raise ValueError(f"tp={tp} does not divide {num_kv_heads} kv heads")
        hkv = num_kv_heads // tp
        kv = range(rank * hkv, (rank + 1) * hkv)
    else:
        if tp % num_kv_heads:
            raise ValueError(f"{num_kv_heads} kv heads cannot be replicated over tp={tp}")
        head = rank // (tp // num_kv_heads)
        kv = range(head, head + 1)
    return range(rank * hq, (rank + 1) * hq), kv


def _head_columns(heads: range, head_dim: int, start: int = 0) -> slice:
    return slice(start + heads.start * head_dim, start + heads.stop * head_dim)


def shard_minimax(full_args: dict, tp: int, rank: int) -> dict:
    """One rank's ``split_qkv_tp_rmsnorm_rope`` arguments from the full layer's (keyword arguments
    of :func:`split_qkv_tp_rmsnorm_rope_full`, as :func:`make_tp_inputs` returns them): its slice
    of q's, k's and v's columns (a new contiguous qkv), its shards of the weights
    (``MiniMaxText01RMSNormTP``'s weight loader: the rows of its heads; replicated kv heads share
    their head's shard), the same cache and positions, the local head counts and ``tp_size``.

    Returns
    -------
    dict
        Keyword arguments of ``split_qkv_tp_rmsnorm_rope`` but ``all_reduce``.
    """
    hq, hkv, d = full_args["num_q_heads"], full_args["num_kv_heads"], full_args["head_dim"]
    q_heads, kv_heads = _minimax_heads(hq, hkv, tp, rank)
    qkv = full_args["qkv"]
    q = qkv[:, _head_columns(q_heads, d)]
    k = qkv[:, _head_columns(kv_heads, d, hq * d)]
    v = qkv[:, _head_columns(kv_heads, d, (hq + hkv) * d)]
    return dict(qkv=torch.cat([q, k, v], dim=1).contiguous(),
                q_weight=full_args["q_weight"][_head_columns(q_heads, d)].contiguous(),
                k_weight=full_args["k_weight"][_head_columns(kv_heads, d)].contiguous(),
                cos_sin_cache=full_args["cos_sin_cache"], positions=full_args["positions"],
                num_q_heads=len(q_heads), num_kv_heads=len(kv_heads), head_dim=d, eps=full_args["eps"],
                tp_size=tp, is_neox=full_args["is_neox"])


def shard_minimax_outputs(outputs, num_q_heads: int, num_kv_heads: int, head_dim: int, tp: int, rank: int):
    """The columns of the full layer's ``(q, k, v)`` (``[T, Hq*D]``, ``[T, Hkv*D]`` each) that
    rank ``rank`` of ``tp`` computes (:func:`shard_minimax`'s heads)."""
    q_heads, kv_heads = _minimax_heads(num_q_heads, num_kv_heads, tp, rank)
    q, k, v = outputs
    return (q[:, _head_columns(q_heads, head_dim)], k[:, _head_columns(kv_heads, head_dim)],
            v[:, _head_columns(kv_heads, head_dim)])


def make_tp_inputs(geometry, tokens: int, *, padding: int = 0, device="cpu", dtype=torch.bfloat16,
                   cache_dtype=torch.float32, max_position: int = 97,
                   generator: torch.Generator | None = None) -> dict:
    """Fresh random arguments of :func:`split_qkv_tp_rmsnorm_rope_full` for the FULL layer of
    ``geometry`` (an unsharded ``AttentionGeometry``/``ModelSpec``): :func:`make_inputs`' qkv,
    cache and positions (some out of range), with weights of ``Hq*D`` and ``Hkv*D`` values.

    ``padding`` of the tokens (the last ones) are padding tokens as a padded batch has them: rows
    of zeros in qkv at positions outside the cache (half below 0, half past its end).

    Returns
    -------
    dict
        ``qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim,
        eps, is_neox``.
    """
    g = geometry
    args = make_inputs(g, tokens, device=device, dtype=dtype, cache_dtype=cache_dtype,
                       max_position=max_position, generator=generator)
    if padding:
        pad = slice(tokens - padding, tokens)
        args["qkv"][pad] = 0
        off = torch.tensor([-5 if i % 2 else max_position + 7 for i in range(padding)], device=device)
        args["positions"][pad] = off.to(args["positions"].dtype)
    weights = [(1 + 0.5 * torch.randn(h * g.head_dim, generator=generator)).to(device=device, dtype=dtype)
               for h in (g.num_q_heads, g.num_kv_heads)]
    return dict(qkv=args["qkv"], q_weight=weights[0], k_weight=weights[1], cos_sin_cache=args["cos_sin_cache"],
                positions=args["positions"], num_q_heads=g.num_q_heads, num_kv_heads=g.num_kv_heads,
                head_dim=g.head_dim, eps=g.eps, is_neox=g.is_neox)


# --------------------------------------------------------------------------------------------
# MLA (split_qkv_rmsnorm_rope_mla, mla_q_rope_): written from issue 30's definition.

def _rotate_last(x: torch.Tensor, cos_sin_cache, positions, rope_dim: int, is_neox: bool) -> torch.Tensor:
    """float64 ``x`` (``[T, ..., R]``) rotated by the cache rows of the clamped positions: pairs
    ``(i, i + R/2)`` (NeoX) or ``(2i, 2i + 1)`` (GPT-J), ``(a, b) -> (a*c - b*s, b*c + a*s)``."""
    half = rope_dim // 2
    rows = cos_sin_cache.double()[positions.long().clamp(0, cos_sin_cache.shape[0] - 1)]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (half,)
    cos, sin = rows[:, :half].reshape(shape), rows[:, half:].reshape(shape)
    if is_neox:
        first, second = torch.arange(half), torch.arange(half, rope_dim)
    else:
        first, second = torch.arange(0, rope_dim, 2), torch.arange(1, rope_dim, 2)
    y = x.clone()
    y[..., first] = x[..., first] * cos - x[..., second] * sin
    y[..., second] = x[..., second] * cos + x[..., first] * sin
    return y


def split_qkv_rmsnorm_rope_mla(qkv_lora, q_a_weight, kv_a_weight, cos_sin_cache, positions, q_lora_rank,
                               kv_lora_rank, rope_dim, eps=1e-6, *, is_neox=False, **cache_arguments):
    """The outputs of ``split_qkv_rmsnorm_rope_mla`` in float64 (the op's signature; the cache
    arguments and ``q`` are ignored: :func:`mla_cache_write` gives the cache, :func:`mla_q_rope` what
    the op leaves in a ``q`` it is given).

    ``q_c = x / sqrt(mean(x**2) + eps) * q_a_weight`` over the first ``q_lora_rank`` columns (empty
    when 0), ``kv_c_normed`` likewise over the next ``kv_lora_rank`` with ``kv_a_weight``, ``k_pe``
    the last ``rope_dim`` columns rotated by the cache row of the clamped position (GPT-J pairs
    unless ``is_neox``).

    Returns
    -------
    tuple of torch.Tensor
        float64 ``q_c [T, Lq]``, ``kv_c_normed [T, Lkv]``, ``k_pe [T, R]``.
    """
    x = qkv_lora.double()
    lq, lkv = q_lora_rank, kv_lora_rank

    def rms(y, w):
        return y / torch.sqrt((y * y).mean(dim=-1, keepdim=True) + eps) * w.double()

    q_c = rms(x[:, :lq], q_a_weight) if lq else x[:, :0].clone()
    kv_c = rms(x[:, lq:lq + lkv], kv_a_weight)
    k_pe = x[:, lq + lkv:lq + lkv + rope_dim].clone()
    if rope_dim:
        k_pe = _rotate_last(k_pe, cos_sin_cache, positions, rope_dim, is_neox)
    return q_c, kv_c, k_pe


def mla_q_rope(q, cos_sin_cache, positions, rope_dim, *, is_neox=False):
    """What ``mla_q_rope_`` leaves in ``q`` (``[T, H, D]``), in float64: the last ``rope_dim`` lanes
    of every head rotated as :func:`split_qkv_rmsnorm_rope_mla` rotates k_pe, the rest unchanged."""
    y = q.double().clone()
    y[..., q.shape[2] - rope_dim:] = _rotate_last(y[..., q.shape[2] - rope_dim:], cos_sin_cache, positions,
                                                  rope_dim, is_neox)
    return y


def _mla_store(values: torch.Tensor, dtype: torch.dtype, kv_cache_dtype: str, k_scale) -> torch.Tensor:
    """The op's outputs (``values``, in their own dtype) as the cache stores them: cast
    (``"auto"``), or ``y / k_scale`` in fp32 (IEEE) saturated and rounded half to even, to int8
    (``"int8"``) or to fp8 e4m3 (``"fp8"``; a uint8 cache gets its bits)."""
    if kv_cache_dtype == "auto":
        return values.to(dtype)
    y = values.float() / k_scale.float().reshape(())
    if kv_cache_dtype == "int8":
        return y.clamp(-128, 127).round().to(torch.int8)
    q = y.clamp(-448, 448).to(torch.float8_e4m3fn)
    return q.view(torch.uint8) if dtype == torch.uint8 else q


def mla_cache_write(kv_cache, kv_c_normed, k_pe, slot_mapping, *, kv_cache_dtype="auto", k_scale=None,
                    cache_layout="nd"):
    """What ``split_qkv_rmsnorm_rope_mla`` leaves in the cache, from its outputs ``kv_c_normed`` and
    ``k_pe`` (as the op returned them: the cache holds the rounded outputs): a copy of the cache
    (or of the pair) with, for each of the first ``T`` tokens whose slot ``s`` is not negative,
    block ``b = s // block_size``, row ``o = s % block_size``:

    * combined ``[NB, BS, Lkv + R]``: ``cache[b, o] = store(cat(kv_c_normed[t], k_pe[t]))``;
    * split, ``"nd"``: ``nope[b, o, 0, :] = store(kv_c_normed[t])``, ``rope[b, o, 0, :] = k_pe[t]``
      (cast);
    * split, ``"nz"``: lane ``c`` at ``nope[b, c // C0, o, c % C0]`` (``C0``: 32 bytes of the
      cache's dtype), likewise ``rope``.

    ``store`` as :func:`_mla_store` (``kv_cache_dtype``); the split form's rope cache is always a cast.

    Returns
    -------
    torch.Tensor or tuple of torch.Tensor
        The cache (or the pair) after the write, in its dtypes.
    """
    tokens = kv_c_normed.shape[0]
    slots = slot_mapping[:tokens].long().cpu()
    if isinstance(kv_cache, (tuple, list)):
        results = []
        for cache, values, how in ((kv_cache[0], kv_c_normed, kv_cache_dtype), (kv_cache[1], k_pe, "auto")):
            if cache is None:
                results.append(None)
                continue
            result = cache.clone()
            block_size = result.shape[1] if cache_layout == "nd" else result.shape[2]
            stored = _mla_store(values, cache.dtype, how, k_scale)
            c0 = 32 // cache.element_size()
            for t in range(tokens):
                s = int(slots[t])
                if s < 0:
                    continue
                b, o = s // block_size, s % block_size
                for c in range(values.shape[1]):
                    if cache_layout == "nd":
                        result[b, o, 0, c] = stored[t, c]
                    else:
                        result[b, c // c0, o, c % c0] = stored[t, c]
            results.append(result)
        return tuple(results)
    result = kv_cache.clone()
    block_size = result.shape[1]
    stored = _mla_store(torch.cat([kv_c_normed, k_pe], dim=1), kv_cache.dtype, kv_cache_dtype, k_scale)
    for t in range(tokens):
        s = int(slots[t])
        if s >= 0:
            result[s // block_size, s % block_size] = stored[t]
    return result


def make_mla_inputs(q_lora_rank: int, kv_lora_rank: int, rope_dim: int, tokens: int, *, device="cpu",
                    dtype=torch.bfloat16, cache_dtype=torch.float32, positions_dtype=torch.int64,
                    row_padding: int = 0, max_position: int = 97, out_of_range: bool = True, is_neox=False,
                    eps: float = 1e-6, generator: torch.Generator | None = None) -> dict:
    """Fresh random arguments of one ``split_qkv_rmsnorm_rope_mla`` call (no cache), as keyword
    arguments: ``qkv_lora`` (a view with ``row_padding`` extra elements a row), weights around 1
    (``q_a_weight`` ``None`` with ``q_lora_rank == 0``), a cos/sin cache of random angles (``None``
    with ``rope_dim == 0``, and positions ``None`` then), positions a few rows out of range."""
    def randn(*size):
        return torch.randn(*size, generator=generator)

    width = q_lora_rank + kv_lora_rank + rope_dim
    qkv = randn(tokens, width + row_padding).to(device=device, dtype=dtype)[:, :width]
    q_w = (1 + 0.5 * randn(q_lora_rank)).to(device=device, dtype=dtype) if q_lora_rank else None
    kv_w = (1 + 0.5 * randn(kv_lora_rank)).to(device=device, dtype=dtype)
    cache = positions = None
    if rope_dim:
        angles = torch.rand(max_position, rope_dim // 2, generator=generator, dtype=torch.float64)
        cache = torch.cat([(2 * math.pi * angles).cos(), (2 * math.pi * angles).sin()], dim=1)
        cache = cache.to(device=device, dtype=cache_dtype)
        spill = 3 if out_of_range else 0
        positions = torch.randint(-spill, max_position + spill, (tokens,), generator=generator)
        positions = positions.to(device=device, dtype=positions_dtype)
    return dict(qkv_lora=qkv, q_a_weight=q_w, kv_a_weight=kv_w, cos_sin_cache=cache, positions=positions,
                q_lora_rank=q_lora_rank, kv_lora_rank=kv_lora_rank, rope_dim=rope_dim, eps=eps, is_neox=is_neox)


def make_mla_cache(args: dict, *, form: str = "combined", cache_layout: str = "nd", kv_cache_dtype: str = "auto",
                   dtype=None, block_size: int = 16, padding: int = 2, fill: float = 7.0,
                   generator: torch.Generator | None = None) -> dict:
    """Cache-write arguments for the call ``args`` (:func:`make_mla_inputs`): a cache filled with
    ``fill`` (combined ``[NB, BS, Lkv + R]``, or the split pair in ``cache_layout``) with room to
    spare, distinct random slots (``padding`` of them -1) and, for ``"fp8"``/``"int8"``, a scale.
    ``dtype``: the cache's (default: qkv_lora's; ``"fp8"``'s uint8; ``"int8"``'s latent int8).

    Returns
    -------
    dict
        ``kv_cache, slot_mapping, kv_cache_dtype, k_scale, cache_layout``.
    """
    qkv = args["qkv_lora"]
    tokens, lkv, r = qkv.shape[0], args["kv_lora_rank"], args["rope_dim"]
    num_blocks = max(2, -(-2 * tokens // block_size) + 1)
    if dtype is None:
        dtype = {"auto": qkv.dtype, "int8": torch.int8}.get(kv_cache_dtype, torch.uint8)
    full = torch.full((), fill).to(torch.float8_e4m3fn).view(torch.uint8) if dtype == torch.uint8 else fill

    def cache(lanes: int, dt) -> torch.Tensor:
        if form == "combined":
            shape = (num_blocks, block_size, lanes)
        elif cache_layout == "nd":
            shape = (num_blocks, block_size, 1, lanes)
        else:
            c0 = 32 // torch.empty((), dtype=dt).element_size()
            shape = (num_blocks, lanes // c0, block_size, c0)
        return torch.full(shape, full, dtype=torch.float32).to(dt).to(qkv.device) if dt != torch.uint8 else \
            torch.full(shape, int(full), dtype=dt, device=qkv.device)

    if form == "combined":
        kv_cache = cache(lkv + r, dtype)
    else:
        kv_cache = (cache(lkv, dtype), cache(r, qkv.dtype) if r else None)
    slots = torch.randperm(num_blocks * block_size, generator=generator)[:tokens]
    if padding:
        slots[torch.randperm(tokens, generator=generator)[:min(padding, tokens)]] = -1
    scale = None
    if kv_cache_dtype != "auto":
        scale = (0.01 + 0.05 * torch.rand(1, generator=generator)).to(qkv.device)
    return dict(kv_cache=kv_cache, slot_mapping=slots.to(qkv.device), kv_cache_dtype=kv_cache_dtype, k_scale=scale,
                cache_layout=cache_layout)
