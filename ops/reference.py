"""The float64 reference of the ops and the one input generator: pure PyTorch, no kernel code.

Written from the math in each op's docstring, element by element as the definition reads, and
sharing nothing with any implementation (Triton, AscendC, the unfused vLLM spelling): the tests
of ``tests/ops`` and ``tests/csrc`` and the benchmark's correctness check all compare against
it. The next ops extend this module.
"""

from __future__ import annotations

import math

import torch

__all__ = ["make_inputs", "split_qkv_rmsnorm_rope"]


def split_qkv_rmsnorm_rope(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads,
                           head_dim, eps=1e-6, *, is_neox=True, q_bias=None, k_bias=None,
                           weight_offset=0.0, inplace=False):
    """q and k of ``split_qkv_rmsnorm_rope`` in float64 (the op's signature; ``inplace`` ignored).

    Per token and head: ``y = x / sqrt(mean(x**2) + eps) * (weight_offset + w) + b`` when that
    tensor has a weight, then the rotary pairs of the first ``R`` dims rotated by the cache row
    of the clamped position; the rest pass through.

    Returns
    -------
    q, k : torch.Tensor
        float64, ``[T, Hq*D]`` and ``[T, Hkv*D]``, on qkv's device.
    """
    tokens, rotary = qkv.shape[0], cos_sin_cache.shape[1]
    half = rotary // 2
    pos = positions.long().clamp(0, cos_sin_cache.shape[0] - 1)
    rows = cos_sin_cache.double()[pos]
    cos, sin = rows[:, None, :half], rows[:, None, half:]
    if is_neox:
        first, second = torch.arange(half), torch.arange(half, rotary)
    else:
        first, second = torch.arange(0, rotary, 2), torch.arange(1, rotary, 2)
    outs, start = [], 0
    for heads, weight, bias in ((num_q_heads, q_weight, q_bias), (num_kv_heads, k_weight, k_bias)):
        x = qkv[:, start:start + heads * head_dim].double().reshape(tokens, heads, head_dim)
        start += heads * head_dim
        if weight is not None:
            x = x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * (weight_offset + weight.double())
            if bias is not None:
                x = x + bias.double()
        y = x.clone()
        y[..., first] = x[..., first] * cos - x[..., second] * sin
        y[..., second] = x[..., second] * cos + x[..., first] * sin
        outs.append(y.reshape(tokens, heads * head_dim))
    return outs[0], outs[1]


def make_inputs(geometry, tokens: int, *, device="cpu", dtype=torch.bfloat16, cache_dtype=torch.float32,
                positions_dtype=torch.int64, bias: bool = False, row_padding: int = 0,
                cache_row_padding: int = 0, max_position: int = 97, out_of_range: bool = True,
                generator: torch.Generator | None = None) -> dict:
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
    generator : torch.Generator, optional
        CPU generator for reproducible draws; the default generator otherwise.

    Returns
    -------
    dict
        ``qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads,
        head_dim, eps, is_neox, q_bias, k_bias, weight_offset``.
    """
    g = geometry

    def randn(*size):
        return torch.randn(*size, generator=generator)

    width = g.qkv_width
    qkv = randn(tokens, width + row_padding).to(device=device, dtype=dtype)[:, :width]
    weights = [randn(g.head_dim).to(device=device, dtype=dtype) if g.qk_norm else None for _ in range(2)]
    biases = [(0.5 * randn(g.head_dim)).to(device=device, dtype=dtype) if bias and w is not None else None
              for w in weights]
    angles = torch.rand(max_position, g.rotary_dim // 2, generator=generator, dtype=torch.float64)
    cache = torch.cat([(2 * math.pi * angles).cos(), (2 * math.pi * angles).sin(),
                       torch.zeros(max_position, cache_row_padding, dtype=torch.float64)], dim=1)
    cache = cache.to(device=device, dtype=cache_dtype)[:, :g.rotary_dim]
    spill = 3 if out_of_range else 0
    positions = torch.randint(-spill, max_position + spill, (tokens,), generator=generator)
    return dict(qkv=qkv, q_weight=weights[0], k_weight=weights[1], cos_sin_cache=cache,
                positions=positions.to(device=device, dtype=positions_dtype),
                num_q_heads=g.num_q_heads, num_kv_heads=g.num_kv_heads, head_dim=g.head_dim,
                eps=g.eps, is_neox=g.is_neox, q_bias=biases[0], k_bias=biases[1],
                weight_offset=g.weight_offset)
