"""The model configs kvspec ships: real hybrid architectures, as
``transformers``' configuration classes define them by default (their
defaults mirror each architecture's reference checkpoint).

Each shipped model is one ``<name>.json`` here: the ``config.json`` a
checkpoint of that architecture carries (``architectures`` set to the vLLM
class that serves it). They are generated once, by maintainers, with
``python -m engine_adapter.models.shipped generate`` inside an engine environment
(it needs ``transformers``), and committed, so every vLLM version resolves
exactly the same config. This module never imports vLLM.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: name -> (transformers configuration class, vLLM architecture); what each is, in its comment
SHIPPED: dict[str, tuple[str, str]] = {
    # Qwen3-Next-80B-A3B: Gated DeltaNet + full attention 3:1, MTP
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
    # Qwen3.5 (text): Gated DeltaNet + full attention 3:1, MTP
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
    # Nemotron-H: Mamba-2 + attention + MLP layers
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM"),
    # Falcon-H1: Mamba-2 and attention in parallel in every layer
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM"),
    # Bamba: Mamba-2 + attention
    "bamba": ("BambaConfig", "BambaForCausalLM"),
    # Granite 4.0 MoE hybrid: Mamba-2 + attention
    "granitemoehybrid": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM"),
    # Jamba: Mamba-1 + attention 7:1, MoE
    "jamba": ("JambaConfig", "JambaForCausalLM"),
    # Attention-free: one KV cache group (the single-group branch of vLLM's
    # block-size resolution and its unitary KV cache coordinator).
    # Mamba-Codestral-7B: Mamba-2 layers only, no attention
    "mamba2": ("Mamba2Config", "Mamba2ForCausalLM"),
    # Falcon-Mamba: Mamba-1 layers only, no attention (transformers' small default widths)
    "falcon_mamba": ("FalconMambaConfig", "FalconMambaForCausalLM"),
}


#: Fields the released checkpoints carry that the configuration classes
#: leave unset: every one ships bfloat16 weights, and the Qwen hybrids carry
#: one multi-token-prediction layer (served with ``--speculative-config
#: '{"method": "mtp", ...}'``).
CHECKPOINT_FIELDS: dict[str, dict] = {
    "qwen3_next": {"torch_dtype": "bfloat16", "num_nextn_predict_layers": 1},
    "qwen3_5": {"torch_dtype": "bfloat16", "num_nextn_predict_layers": 1},
    # GraniteMoeHybridConfig() lists only Mamba layers; the released Granite
    # 4.0-H models are hybrids with 4 attention layers (IBM's model cards).
    # kvspec places them at layers 5, 13, 21 and 29 of 32 (their positions do
    # not change any block size, only the order of the KV cache groups).
    "granitemoehybrid": {
        "torch_dtype": "bfloat16",
        "layer_types": ["full_attention" if i % 8 == 5 else "linear_attention" for i in range(32)],
    },
}
DEFAULT_FIELDS = {"torch_dtype": "bfloat16"}


def names() -> tuple[str, ...]:
    return tuple(SHIPPED)


def deployment_cases() -> list[dict]:
    """One small case per shipped model (prefix caching on, an H100), for
    resolving each model once before anything is timed: vLLM inspects a
    model class in a subprocess the first time a release resolves it
    (~30 s on this 2-core machine; the answer is cached under that
    release's ``VLLM_CACHE_ROOT``). ``kvspec mutate`` resolves them before
    its control, whose budget a cold cache otherwise eats (a control on a
    fresh machine got 2 cases through in 30 s)."""
    return [
        {
            "schema": 1,
            "name": f"kvspec-warm-{name}",
            "deployment": {
                "model": name,
                "vllm_args": ["--enable-prefix-caching"],
                "platform": "cuda",
                "device": "h100",
            },
            "trace": [{"prompt": [{"segment": "warm", "length": 16}]}],
        }
        for name in names()
    ]


def config_path(name: str) -> Path:
    return HERE / f"{name}.json"


def load_config(name: str) -> dict:
    """The shipped config.json of ``name`` (a dict)."""
    return json.loads(config_path(name).read_text())


def generate(out: Path = HERE, only: tuple[str, ...] = ()) -> list[Path]:
    """Write ``<name>.json`` for every shipped model (or those in ``only``)
    from ``transformers``."""
    import transformers

    from ground.files import write_json_atomic

    written = []
    for name, (cls_name, arch) in SHIPPED.items():
        if only and name not in only:
            continue
        cfg = getattr(transformers, cls_name)()
        data = cfg.to_dict()
        data["architectures"] = [arch]
        data.update(CHECKPOINT_FIELDS.get(name, DEFAULT_FIELDS))
        data.pop("transformers_version", None)
        data["_kvspec_source"] = f"transformers {transformers.__version__} {cls_name}() defaults"
        path = out / f"{name}.json"
        write_json_atomic(path, data, indent=1, sort_keys=True)
        written.append(path)
    return written


if __name__ == "__main__":
    if sys.argv[1:2] != ["generate"] or any(n not in SHIPPED for n in sys.argv[2:]):
        print(
            f"usage: python -m engine_adapter.models.shipped generate [NAME ...]; NAME one of {', '.join(SHIPPED)}",
            file=sys.stderr,
        )
        sys.exit(2)
    for p in generate(only=tuple(sys.argv[2:])):
        print(p)
