"""Run a tiny randomly initialised model through a real vLLM and write what it generated.

Usage: ``python -m tests.vllm.run_tiny MODEL OUT.json`` with MODEL one of :data:`MODELS`
(env ``TINY_DTYPE``: ``bfloat16`` (default) or ``float32``; ``TINY_TP``: tensor-parallel size;
``TINY_FAIL_WARM_UP_HEADS=N``, test-only: the worker hook's warm-up call of every geometry with
N q heads raises :data:`FORCED_FAILURE`, as a failed Triton compile would; vLLM must run
in-process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the default here). Greedy
generation of a few token-id prompts (no tokenizer, ``load_format="dummy"``, seed fixed, so two
runs of one vLLM build see the same weights), writing ``{"outputs": [{"token_ids": [...],
"logprobs": [...],
"prompt_logprobs": [...]}, ...]}``. Run in its own process by ``test_vllm_e2e.py``, once with the
plugin and once with ``VLLM_ASCEND_EXT_FUSION=0``; vLLM's log goes to stdout/stderr.

The plugin is loaded the way vLLM loads it, through the ``vllm.general_plugins`` entry point;
if the package was installed without the entry point, it is registered by hand (and said so).
"""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile

#: Tiny configs: 2 layers, hidden 128, D=32. ``two_geometries`` has 4 q heads in layer 0 and
#: 2 in layer 1 (a test model subclassing vLLM's Qwen3, registered below).
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
}
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [11, 42, 7, 300, 9, 77, 5, 123], [500, 3]]
MAX_TOKENS = 6
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


def randomise_weights(model) -> None:
    """Replace the dummy loader's near-zero weights (logits ~ 0, every logprob ~ -log V) by
    seeded ones of a useful scale, so that generation and logprobs depend on every layer."""
    import torch

    generator = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                values = 1 + 0.2 * torch.randn(param.shape, generator=generator)
            elif param.dim() >= 2:
                scale = LM_HEAD_SCALE if name.startswith("lm_head") else 1.0
                values = torch.randn(param.shape, generator=generator) * scale * param.shape[-1] ** -0.5
            else:
                values = 0.1 * torch.randn(param.shape, generator=generator)
            param.copy_(values.to(param.dtype))


def _count_fused_calls() -> list:
    """Count executions of the fused op (instrumentation: the custom ops look
    ``impl.split_qkv_rmsnorm_rope`` up on every call)."""
    from vllm_ascend_ext import impl

    calls = [0]
    original = impl.split_qkv_rmsnorm_rope

    def counting(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    impl.split_qkv_rmsnorm_rope = counting
    return calls


def _fail_warm_up(num_q_heads: int) -> None:
    """Make the worker hook's warm-up call of every geometry with ``num_q_heads`` q heads raise
    :data:`FORCED_FAILURE` (the op is patched for the duration of ``warm_up`` only; the pass
    and the model's own calls are untouched). Test-only."""
    from unittest import mock

    from vllm_ascend_ext import custom_ops, vllm_integration

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
    calls = _count_fused_calls()
    if os.environ.get("TINY_FAIL_WARM_UP_HEADS"):
        _fail_warm_up(int(os.environ["TINY_FAIL_WARM_UP_HEADS"]))
    if name == "two_geometries":
        _register_two_geometry_model()
    from vllm import LLM, SamplingParams

    model_dir = tempfile.mkdtemp(prefix=f"tiny-{name}-")
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(MODELS[name], f)
    llm = LLM(model=model_dir, load_format="dummy", skip_tokenizer_init=True,
              dtype=os.environ.get("TINY_DTYPE", "bfloat16"),
              max_model_len=64, max_num_seqs=4, max_num_batched_tokens=64, seed=0,
              tensor_parallel_size=int(os.environ.get("TINY_TP", "1")))
    llm.apply_model(randomise_weights)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=0, prompt_logprobs=0,
                            detokenize=False)
    results = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    outputs = []
    for result in results:
        completion = result.outputs[0]
        logprobs = [entry[tok].logprob for tok, entry in zip(completion.token_ids, completion.logprobs)]
        prompt_logprobs = [entry[tok].logprob for tok, entry in
                           zip(result.prompt_token_ids[1:], result.prompt_logprobs[1:])]
        outputs.append({"token_ids": list(completion.token_ids), "logprobs": logprobs,
                        "prompt_logprobs": prompt_logprobs})
    with open(out_path, "w") as f:
        json.dump({"outputs": outputs, "fused_op_calls": calls[0]}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
