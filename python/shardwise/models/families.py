"""Named model families: each released model's shape as a transformers model type and the
fields of its published ``config.json`` that differ from that type's defaults. ``model=NAME`` on
``shardwise-train``'s command line (``model.hf_config: NAME`` in a YAML) builds it with random
initialization from the seed, nothing downloaded; ``model.hf_overrides`` replaces fields on top
(tests shrink the models that way). The parameter counts are the released models' (Gemma 3 4B:
its language model, without the vision tower), checked in tests/python/test_model_families.py.
"""

from __future__ import annotations

_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}  # fmt: skip

FAMILIES: dict[str, tuple[str, dict, int]] = {
    # name: (model type, published fields, published parameter count)
    "gemma3_1b": (
        "gemma3_text",
        {"hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
         "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
         "vocab_size": 262144, "max_position_embeddings": 32768, "sliding_window": 512,
         "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
         "query_pre_attn_scalar": 256, "tie_word_embeddings": True},
        999_885_952,
    ),
    "gemma3_4b": (
        "gemma3_text",
        {"hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
         "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
         "vocab_size": 262208, "max_position_embeddings": 131072, "sliding_window": 1024,
         "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
         "rope_scaling": {"rope_type": "linear", "factor": 8.0},
         "query_pre_attn_scalar": 256, "tie_word_embeddings": True},
        3_880_263_168,
    ),
    "llama3_1b": (  # Llama 3.2 1B
        "llama",
        {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
         "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
         "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0,
         "rope_scaling": {**_LLAMA3_ROPE, "factor": 32.0}, "rms_norm_eps": 1e-5,
         "tie_word_embeddings": True},
        1_235_814_400,
    ),
    "llama3_8b": (  # Llama 3.1 8B
        "llama",
        {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
         "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0,
         "rope_scaling": {**_LLAMA3_ROPE, "factor": 8.0}, "rms_norm_eps": 1e-5,
         "tie_word_embeddings": False},
        8_030_261_248,
    ),
    "qwen2_0_5b": (
        "qwen2",
        {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
         "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
         "max_position_embeddings": 131072, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
         "tie_word_embeddings": True},
        494_032_768,
    ),
}  # fmt: skip


def published(name: str) -> tuple[str, dict]:
    """(model type, its published fields) of a family name."""
    kind, fields, _ = FAMILIES[name]
    return kind, dict(fields)
