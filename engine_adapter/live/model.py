"""The tiny hybrid model the CPU server runs: a ``config.json`` and nothing else.

A Qwen3.5-style hybrid (``Qwen3_5ForCausalLM``): 3 ``linear_attention`` (Gated
DeltaNet, a Mamba-kind KV cache group in vLLM) + 1 ``full_attention`` layer,
hidden 128, head_dim 128 (vLLM's CPU GDN kernel needs 128), 4 KV heads,
vocab 1024 (matches ``reference.case.TOKEN_VOCAB``), one MTP layer, bf16.
The server runs it with ``--load-format dummy`` (random weights) and
``--skip-tokenizer-init`` (prompts are token ids), so no weights or tokenizer
files exist or are fetched. Outputs are noise; only the prefix cache's
behaviour matters.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine_adapter.live.paths import models_dir
from reference.case import write_text_atomic

MODEL_NAME = "kvspec-tiny-qwen3_5-hybrid"

TINY_CONFIG: dict = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "model_type": "qwen3_5_text",
    "dtype": "bfloat16",
    "vocab_size": 1024,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 65536,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    "attention_bias": False,
    "tie_word_embeddings": False,
    "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": False,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}


def tiny_model_dir() -> Path:
    """Write (if missing or different) and return the tiny model's directory."""
    root = models_dir() / MODEL_NAME
    root.mkdir(parents=True, exist_ok=True)
    path = root / "config.json"
    text = json.dumps(TINY_CONFIG, indent=2, sort_keys=True) + "\n"
    try:
        if path.read_text() == text:
            return root
    except OSError:
        pass
    write_text_atomic(path, text)
    return root
