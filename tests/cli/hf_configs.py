"""Trimmed copies of real Hugging Face ``config.json`` files: the keys ``plan`` reads, verbatim.

Each dictionary names the config it was cut from; keys the reader does not use (vocabulary,
MLP, vision tower...) are left out, and so are long lists the test does not need in full.
"""

# Qwen/Qwen2.5-VL-7B-Instruct config.json (flat: the language model's keys at the top level).
QWEN2_5_VL_7B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "hidden_size": 3584,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
}

# Qwen/Qwen3-VL-8B-Instruct config.json.
QWEN3_VL_8B = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "model_type": "qwen3_vl",
    "text_config": {
        "head_dim": 128,
        "hidden_size": 4096,
        "model_type": "qwen3_vl_text",
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        "rope_theta": 5000000,
    },
}

# Qwen/Qwen3-VL-30B-A3B-Instruct config.json.
QWEN3_VL_30B_A3B = {
    "architectures": ["Qwen3VLMoeForConditionalGeneration"],
    "model_type": "qwen3_vl_moe",
    "text_config": {
        "head_dim": 128,
        "hidden_size": 2048,
        "model_type": "qwen3_vl_moe_text",
        "num_attention_heads": 32,
        "num_hidden_layers": 48,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        "rope_theta": 5000000,
    },
}

# Qwen/Qwen3.5-35B-A3B config.json (Qwen/Qwen3.6-35B-A3B's text_config has the same attention keys).
QWEN3_5_35B_A3B = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "model_type": "qwen3_5_moe",
    "text_config": {
        "attn_output_gate": True,
        "full_attention_interval": 4,
        "head_dim": 256,
        "hidden_size": 2048,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 10,
        "model_type": "qwen3_5_moe_text",
        "num_attention_heads": 16,
        "num_hidden_layers": 40,
        "num_key_value_heads": 2,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25,
                            "rope_theta": 10000000, "rope_type": "default"},
    },
}

_GEMMA4_ROPE = {
    "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
    "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
}

# google/gemma-4-31B-it config.json.
GEMMA4_31B = {
    "architectures": ["Gemma4ForConditionalGeneration"],
    "model_type": "gemma4",
    "text_config": {
        "attention_k_eq_v": True,
        "global_head_dim": 512,
        "head_dim": 256,
        "hidden_size": 5376,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 10,
        "model_type": "gemma4_text",
        "num_attention_heads": 32,
        "num_global_key_value_heads": 4,
        "num_hidden_layers": 60,
        "num_key_value_heads": 16,
        "num_kv_shared_layers": 0,
        "rms_norm_eps": 1e-06,
        "rope_parameters": _GEMMA4_ROPE,
    },
}

# google/gemma-4-26B-A4B-it config.json.
GEMMA4_26B_A4B = {
    "architectures": ["Gemma4ForConditionalGeneration"],
    "model_type": "gemma4",
    "text_config": {
        "attention_k_eq_v": True,
        "global_head_dim": 512,
        "head_dim": 256,
        "hidden_size": 2816,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5,
        "model_type": "gemma4_text",
        "num_attention_heads": 16,
        "num_global_key_value_heads": 2,
        "num_hidden_layers": 30,
        "num_key_value_heads": 8,
        "num_kv_shared_layers": 0,
        "rms_norm_eps": 1e-06,
        "rope_parameters": _GEMMA4_ROPE,
    },
}

# google/gemma-4-E2B-it config.json.
GEMMA4_E2B = {
    "architectures": ["Gemma4ForConditionalGeneration"],
    "model_type": "gemma4",
    "text_config": {
        "attention_k_eq_v": False,
        "global_head_dim": 512,
        "head_dim": 256,
        "hidden_size": 1536,
        "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 7,
        "model_type": "gemma4_text",
        "num_attention_heads": 8,
        "num_hidden_layers": 35,
        "num_key_value_heads": 1,
        "num_kv_shared_layers": 20,
        "rms_norm_eps": 1e-06,
        "rope_parameters": _GEMMA4_ROPE,
    },
}
