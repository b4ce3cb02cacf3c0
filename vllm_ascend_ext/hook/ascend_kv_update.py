"""vllm-ascend, opt-in: move its KV-cache write out of attention, where the fusion pass can fold it.

By default vllm-ascend's GQA backend writes the cache inside its attention forward
(``AscendAttentionBackendImpl.forward`` -> ``reshape_and_cache`` -> ``DeviceOperator.reshape_and_cache``:
``torch_npu.npu_scatter_pa_kv_cache`` on A2/A3, ``torch_npu._npu_reshape_and_cache`` on 310P), so
vLLM's ``unified_kv_cache_update`` never reaches the graph and the pass has nothing to fold: the
prologue is fused, the cache write stays where it is.

With ``VLLM_ASCEND_EXT_ASCEND_KV_UPDATE=1`` the worker hook calls :func:`switch` (after the
distributed init, before the model is built and compiled), which, unless the engine is one it
refuses (:func:`refusal`, logged):

* sets ``AscendAttentionBackend.forward_includes_kv_cache_update = False`` (inherited by the 310P
  backend), so vLLM's ``Attention.forward`` puts ``unified_kv_cache_update(key, value, layer_name)``
  before attention for every layer that owns its cache, and that op calls the backend's own
  ``do_kv_cache_update`` (vllm-ascend HEAD has it: ``DeviceOperator.reshape_and_cache`` on the
  layer's caches);
* makes ``AscendAttentionBackendImpl.reshape_and_cache`` skip its write for exactly those layers
  (:func:`skip_reason` is ``None``: a decoder layer of the base impl class or of one that
  overrides neither ``forward`` nor ``reshape_and_cache``, that is not KV-sharing), returning
  ``(query, key, value, output)`` as it does; every other layer runs the original method;
* gives vLLM's forward context the per-layer slot mappings it reads (``forward_context.slot_mapping``):
  vllm-ascend's ``set_ascend_forward_context`` passes none, so ``unified_kv_cache_update`` would
  write nothing. The ``set_forward_context`` that ``vllm_ascend.ascend_forward_context`` calls is
  wrapped: when its caller passes no slot mapping, each layer's is taken from its attention
  metadata (``AscendMetadata.slot_mapping``, ``num_actual_tokens`` long) and copied into a
  persistent buffer padded with ``-1`` to the step's ``num_tokens`` (the padded token count the
  key and value have; ``-1`` is vLLM's padding slot, written nowhere), so a captured graph reads
  the same address at every replay. Two small device copies per KV-cache group and step; no host
  sync.

The pass then folds ``unified_kv_cache_update`` into the fused prologue for the layers whose cache
:func:`layer_layout` maps to a layout the op writes: vllm-ascend's ND cache
(``[num_blocks, block_size, Hkv, D]`` per k and v: ``"nhd"``) and 310P's NZ cache
(``[num_blocks, Hkv*D // 16, block_size, 16]``: ``"nz"``), in the activation dtype (bf16/fp16). int8
C8 caches are refused (their impl quantises with its own scales and offsets, and the engine is
refused anyway). Layers the pass does not fold keep vLLM's ``unified_kv_cache_update``, which calls
vllm-ascend's own ``do_kv_cache_update``.

vllm-ascend is reached through one lazily imported seam, :func:`ascend_attention` (tests pass
stand-ins of the same class and method names). Nothing here was run on an NPU.
"""

from __future__ import annotations

import functools
import importlib
import logging
from dataclasses import dataclass

import torch

from ..ops import settings

__all__ = [
    "ATTENTION_MODULE",
    "FORWARD_CONTEXT_MODULE",
    "AscendAttention",
    "SlotMappings",
    "ascend_attention",
    "is_ascend_backend",
    "layer_layout",
    "refusal",
    "skip_reason",
    "switch",
]

logger = logging.getLogger("vllm_ascend_ext")

ATTENTION_MODULE = "vllm_ascend.attention.attention_v1"
FORWARD_CONTEXT_MODULE = "vllm_ascend.ascend_forward_context"
#: Set on what :func:`switch` installed, so that a second call is a no-op.
_MARK = "_vllm_ascend_ext_kv_update"
_logged: set[str] = set()


def _info_once(message: str, *args) -> None:
    text = message % args if args else message
    if text not in _logged:
        _logged.add(text)
        logger.info(text)


@dataclass
class AscendAttention:
    """vllm-ascend's pieces the switch touches: the one seam to them.

    Attributes
    ----------
    backend : type
        ``AscendAttentionBackend`` (its ``forward_includes_kv_cache_update`` is set).
    impl : type
        ``AscendAttentionBackendImpl`` (its ``reshape_and_cache`` is wrapped; its
        ``do_kv_cache_update`` is what vLLM then calls).
    forward_context : module or None
        ``vllm_ascend.ascend_forward_context`` (its ``set_forward_context`` is wrapped to pass
        the slot mappings); ``None`` leaves the forward context alone.
    """

    backend: type
    impl: type
    forward_context: object = None


def ascend_attention() -> AscendAttention | None:
    """vllm-ascend's attention classes and forward-context module, or ``None`` when they cannot be
    imported here (no vllm-ascend / torch_npu). Imported lazily, when :func:`switch` runs."""
    try:
        attention = importlib.import_module(ATTENTION_MODULE)
        forward_context = importlib.import_module(FORWARD_CONTEXT_MODULE)
        return AscendAttention(attention.AscendAttentionBackend, attention.AscendAttentionBackendImpl,
                               forward_context)
    except Exception:  # noqa: BLE001 - any failure: vllm-ascend is not usable in this process
        return None


def refusal(vllm_config) -> str | None:
    """Why this engine keeps vllm-ascend's in-forward cache write, or ``None`` when it can switch.

    The backend's flag is one per class, so engines in which some layer's write cannot move are
    refused as a whole: MLA (its own backend and write, ``npu_kv_rmsnorm_rope_cache``),
    encoder-decoder (cross-attention writes with the encoder's slots), KV transfer (producers
    record ``reshape_cache_event`` and connectors are notified by ``notify_kv_cache_written`` right
    after the in-forward write), an int8 "C8" cache (``AscendC8AttentionBackendImpl`` quantises and
    writes in its own forward; the inherited ``do_kv_cache_update`` would write unquantised
    values), any other cache dtype, and prefill/decode context parallelism (their impls gather
    k and v before the write).
    """
    model = getattr(vllm_config, "model_config", None)
    if getattr(model, "use_mla", False):
        return "an MLA model: its attention backend writes the cache in its own forward"
    if getattr(model, "is_encoder_decoder", False):
        return "an encoder-decoder model: cross-attention writes its cache with the encoder's slots"
    if getattr(vllm_config, "kv_transfer_config", None) is not None:
        return ("KV transfer is configured: producers and connectors are signalled right after the "
                "in-forward write (reshape_cache_event, notify_kv_cache_written)")
    if getattr(getattr(vllm_config, "quant_config", None), "enable_c8_quant", False):
        return "an int8 C8 KV cache: its impl quantises and writes the cache in its own forward"
    cache_dtype = str(getattr(getattr(vllm_config, "cache_config", None), "cache_dtype", "auto"))
    if cache_dtype != "auto":
        return f"kv_cache_dtype {cache_dtype!r}: only a cache in the activation dtype is switched"
    parallel = getattr(vllm_config, "parallel_config", None)
    for name in ("prefill_context_parallel_size", "decode_context_parallel_size"):
        if (getattr(parallel, name, 1) or 1) > 1:
            return f"{name} > 1: the context-parallel impls gather k and v before their write"
    return None


def skip_reason(impl, impl_cls: type) -> str | None:
    """``None`` when ``impl``'s in-forward write is the one ``unified_kv_cache_update`` replaces,
    else why it keeps its own ``reshape_and_cache``."""
    if getattr(impl, "kv_sharing_target_layer_name", None) is not None:
        return "KV-sharing layers read another layer's cache (vLLM runs no cache update for them)"
    attn_type = str(getattr(impl, "attn_type", "decoder"))
    if attn_type.rsplit(".", 1)[-1].lower() != "decoder":
        return f"attention type {attn_type!r} is not a decoder's"
    cls = type(impl)
    for method in ("forward", "reshape_and_cache", "do_kv_cache_update"):
        if getattr(cls, method, None) is not getattr(impl_cls, method, None):
            return f"{cls.__name__} overrides {method}"
    return None


class SlotMappings:
    """Per-layer slot mappings for vLLM's forward context, from vllm-ascend's attention metadata.

    Each distinct metadata slot mapping (one per KV-cache group; ``num_actual_tokens`` long) is
    copied into a persistent buffer of the same dtype and device, padded with ``-1`` to the step's
    ``num_tokens`` (the rows key and value have in the graph), so the address a captured graph
    reads is the same at every step. The buffer grows (a new address) only past its size, which
    starts at the scheduler's ``max_num_batched_tokens``.
    """

    def __init__(self) -> None:
        self.buffers: dict[tuple, torch.Tensor] = {}

    def _buffer(self, slots: torch.Tensor, tokens: int, capacity: int) -> torch.Tensor:
        key = (slots.device, slots.dtype, slots.untyped_storage().data_ptr())
        buf = self.buffers.get(key)
        if buf is None or buf.shape[0] < tokens:
            buf = torch.full((max(tokens, capacity),), -1, dtype=slots.dtype, device=slots.device)
            self.buffers[key] = buf
        return buf

    def __call__(self, attn_metadata, num_tokens: int | None, vllm_config=None) -> dict[str, torch.Tensor]:
        """``{layer_name: slot_mapping}`` for the layers of ``attn_metadata`` (a dict) that carry a
        1-D ``slot_mapping``; ``{}`` for anything else."""
        if not isinstance(attn_metadata, dict):
            return {}
        capacity = getattr(getattr(vllm_config, "scheduler_config", None), "max_num_batched_tokens", 0) or 0
        out: dict[str, torch.Tensor] = {}
        done: dict[int, torch.Tensor] = {}
        for name, metadata in attn_metadata.items():
            slots = getattr(metadata, "slot_mapping", None)
            if not isinstance(slots, torch.Tensor) or slots.dim() != 1:
                continue
            if id(slots) not in done:
                rows = slots.shape[0]
                if num_tokens is None or rows > num_tokens:
                    done[id(slots)] = slots
                else:
                    buf = self._buffer(slots, num_tokens, capacity)
                    buf[:rows].copy_(slots)
                    buf[rows:num_tokens].fill_(-1)
                    done[id(slots)] = buf[:num_tokens]
            out[name] = done[id(slots)]
        return out


def _forward_context_has_slots() -> bool:
    """``False`` only when vLLM's forward context is set and has no slot mapping (then
    ``unified_kv_cache_update`` writes nothing and the in-forward write must run); ``True`` when
    it has one, or when there is no vLLM forward context to ask (stand-ins)."""
    try:
        from vllm.forward_context import get_forward_context, is_forward_context_available
    except Exception:  # noqa: BLE001 - no vLLM here
        return True
    if not is_forward_context_available():
        return True
    return bool(get_forward_context().slot_mapping)


def _wrap_set_forward_context(module, provider: SlotMappings) -> None:
    original = getattr(module, "set_forward_context", None)
    if original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def set_forward_context(attn_metadata, vllm_config, *args, **kwargs):
        if not kwargs.get("slot_mapping") and len(args) < 6:
            num_tokens = args[0] if args else kwargs.get("num_tokens")
            kwargs["slot_mapping"] = provider(attn_metadata, num_tokens, vllm_config) or None
        return original(attn_metadata, vllm_config, *args, **kwargs)

    setattr(set_forward_context, _MARK, True)
    module.set_forward_context = set_forward_context


def switch(vllm_config, modules: AscendAttention | None = None) -> bool:
    """Move vllm-ascend's KV-cache write out of attention when ``VLLM_ASCEND_EXT_ASCEND_KV_UPDATE``
    is on (see the module notes). Idempotent; logs one INFO line saying what was switched or why not.

    Parameters
    ----------
    vllm_config : vllm.config.VllmConfig
        The engine's config (read by :func:`refusal` and for the slot buffers' size).
    modules : AscendAttention, optional
        Default :func:`ascend_attention`. Tests pass stand-ins.

    Returns
    -------
    bool
        Whether the write is switched (now or by an earlier call).
    """
    if not settings.ascend_kv_update_enabled():
        return False
    modules = ascend_attention() if modules is None else modules
    if modules is None:
        _info_once("vllm_ascend_ext: %s is on but vllm-ascend's attention (%s) cannot be imported here; "
                   "nothing switched", settings.ASCEND_KV_UPDATE, ATTENTION_MODULE)
        return False
    impl_cls, backend = modules.impl, modules.backend
    if getattr(impl_cls.reshape_and_cache, _MARK, False):
        return True
    why = refusal(vllm_config)
    if why is not None:
        _info_once("vllm_ascend_ext: %s is on but vllm-ascend keeps its KV-cache write inside attention: %s",
                   settings.ASCEND_KV_UPDATE, why)
        return False
    original = impl_cls.reshape_and_cache

    @functools.wraps(original)
    def reshape_and_cache(self, query, key, value, kv_cache, attn_metadata, output):
        reason = skip_reason(self, impl_cls)
        if reason is None and _forward_context_has_slots():
            return query, key, value, output
        if reason is None:
            reason = ("vLLM's forward context has no slot mapping this step, so unified_kv_cache_update "
                      "writes nothing: the in-forward write runs instead")
        _info_once("vllm_ascend_ext: %s keeps its in-forward KV-cache write: %s", type(self).__name__, reason)
        return original(self, query, key, value, kv_cache, attn_metadata, output)

    setattr(reshape_and_cache, _MARK, True)
    impl_cls.reshape_and_cache = reshape_and_cache
    backend.forward_includes_kv_cache_update = False
    if modules.forward_context is not None:
        _wrap_set_forward_context(modules.forward_context, SlotMappings())
    logger.info(
        "vllm_ascend_ext: %s=1: vllm-ascend's KV-cache write moved out of attention: "
        "%s.forward_includes_kv_cache_update = False, %s.reshape_and_cache writes nothing for decoder layers "
        "that own their cache, vLLM's unified_kv_cache_update calls %s.do_kv_cache_update (slot mappings from "
        "the attention metadata%s); the fusion pass folds it where the layout is ND or NZ",
        settings.ASCEND_KV_UPDATE, backend.__name__, impl_cls.__name__, impl_cls.__name__,
        "" if modules.forward_context is not None else ": NOT provided, no forward-context module given")
    return True


def is_ascend_backend(backend) -> bool:
    """Whether ``backend`` (an attention backend class) is vllm-ascend's (by its module)."""
    return str(getattr(backend, "__module__", "")).startswith("vllm_ascend.")


#: Probe sizes for reading a backend's cache shape (distinct, so the shape tells the layout).
_NB, _BS, _H, _D = 3, 64, 2, 32


def layer_layout(layer, dtype: torch.dtype) -> tuple[str | None, str]:
    """``(cache_layout or None, reason)`` of a vllm-ascend attention layer for the pass's KV step.

    ``"nhd"`` for ``AscendAttentionBackend``'s ND cache (``get_kv_cache_shape`` ->
    ``(2, num_blocks, block_size, Hkv, D)``), ``"nz"`` for 310P's (``(2, num_blocks, Hkv*D // 16,
    block_size, 16)``; the op's NZ lane width is 32 bytes of the cache dtype: 16 for fp16), with
    the cache in the activation dtype, bf16 or fp16. Refused: the in-forward write still on
    (:func:`switch` not run or refused), the C8 impl or any other cache dtype, other shapes.
    """
    backend = getattr(layer, "attn_backend", None)
    if getattr(backend, "forward_includes_kv_cache_update", True):
        return None, (f"vllm-ascend writes the cache inside attention ({settings.ASCEND_KV_UPDATE} "
                      "moves it out)")
    impl = getattr(layer, "impl", None)
    if "C8" in type(impl).__name__ or getattr(layer, "kv_cache_torch_dtype", None) == torch.int8:
        return None, "an int8 C8 cache is quantised by vllm-ascend's C8 impl, not written by the op"
    kv_dtype = str(getattr(layer, "kv_cache_dtype", "auto"))
    if kv_dtype != "auto":
        return None, f"kv_cache_dtype {kv_dtype!r} on vllm-ascend is not written by the op"
    if dtype not in (torch.bfloat16, torch.float16):
        return None, f"a {dtype} cache on vllm-ascend is not one of its layouts' dtypes (bf16, fp16)"
    try:
        shape = tuple(backend.get_kv_cache_shape(_NB, _BS, _H, _D))
    except Exception as exc:  # noqa: BLE001 - unknown: leave vLLM's update
        return None, f"the cache shape is unknown ({type(exc).__name__}: {exc})"
    if shape == (2, _NB, _BS, _H, _D):
        return "nhd", ""
    if shape == (2, _NB, _H * _D // 16, _BS, 16) and dtype == torch.float16:
        return "nz", ""
    return None, f"{backend.__name__}'s cache shape {shape} (for {_NB}, {_BS}, {_H}, {_D}) is not ND or fp16 NZ"
