"""The model config a deployment serves, before vLLM reads it.

A deployment names a shipped model or a user's ``config.json``, with
``model_overrides`` on top. This module reads it (bounded), checks it
(``reference.model_config``'s limits, no code-loading key, an architecture
kvspec knows: :data:`MAMBA_KIND`) and writes it, keyed by its content, to
the folder an engine's parser is pointed at (vLLM:
``engine_adapter.vllm_engine.resolve``). Family-neutral and engine-free: the
host side checks a case's model with it (:func:`check_case_model`) before
any engine starts.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from engine_adapter.models import SHIPPED, load_config
from ground.errors import InvalidArgument, Unsupported
from ground.files import write_text_atomic
from ground.home import models_dir
from ground.printable import one_line
from reference.deployment import Deployment
from reference.model_config import check_model_config

#: vLLM architecture -> the kind of its Mamba-like layers.
MAMBA_KIND = {
    "Qwen3NextForCausalLM": "gdn",
    "Qwen3_5ForCausalLM": "gdn",
    "Qwen3_5MoeForCausalLM": "gdn",
    "NemotronHForCausalLM": "mamba2",
    "FalconH1ForCausalLM": "mamba2",
    "GraniteMoeHybridForCausalLM": "mamba2",
    "BambaForCausalLM": "mamba2",
    "JambaForCausalLM": "mamba1",
    # Attention-free: Mamba layers only, one KV cache group (vLLM's
    # ``MambaModelConfig`` turns on align mode with prefix caching).
    "Mamba2ForCausalLM": "mamba2",
    "FalconMambaForCausalLM": "mamba1",
    "MambaForCausalLM": "mamba1",
}


def model_config_dict(dep: Deployment) -> dict:
    """The config.json the deployment serves: a shipped one or the user's,
    with ``model_overrides`` applied. Before vLLM reads it: no code-loading
    key (``auto_map``, ...), layers and dimensions within
    ``reference.model_config``'s limits, and ``architectures[0]`` one kvspec
    knows (``MAMBA_KIND``)."""
    if dep.model in SHIPPED:
        cfg = load_config(dep.model)
    else:
        path = Path(dep.model).expanduser()
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise InvalidArgument(
                f"deployment.model={dep.model!r}: neither a shipped model ({', '.join(SHIPPED)}) nor a readable config.json"
            )
        try:
            if path.stat().st_size > 4 << 20:
                raise InvalidArgument(
                    f"deployment.model={dep.model!r}: config.json above 4 MiB; allowed: a model config"
                )
            cfg = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
            raise InvalidArgument(f"deployment.model={dep.model!r}: not a JSON config ({one_line(e, 120)})") from None
        if not isinstance(cfg, dict):
            raise InvalidArgument(f"deployment.model={dep.model!r}: config.json must hold an object")
        check_model_config(cfg, f"deployment.model={dep.model!r}: config.json field")
    cfg = dict(cfg)
    cfg.update(dep.model_overrides)
    check_model_config(cfg, "deployment model config")  # merged: also a Deployment built without parse_deployment
    archs = cfg.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise InvalidArgument(
            f"deployment.model={dep.model!r}: config.json has no architectures list; allowed: a Hugging Face model config"
        )
    if archs[0] not in MAMBA_KIND:
        raise Unsupported(
            f"deployment.model architectures[0]={archs[0]!r}: not an architecture kvspec knows; allowed: {', '.join(sorted(MAMBA_KIND))}"
        )
    return cfg


def check_case_model(case) -> None:
    """The model config of ``case``'s deployment (a user's config.json naming
    code, unreadable or too large; overrides merged), checked as
    :func:`model_config_dict` checks it, before any build or engine starts:
    the commands that take a case call it first, so a refusal is one line,
    exit 2, not found after an engine start. A hand geometry has none; an
    architecture kvspec does not know stays the run's to report."""
    if case.deployment is None or case.geometry is not None:
        return
    try:
        model_config_dict(case.deployment)
    except Unsupported:
        pass


def model_dir(cfg: dict) -> Path:
    """A folder holding ``cfg`` as config.json, keyed by its content (written
    atomically under kvspec's home)."""
    text = json.dumps(cfg, indent=1, sort_keys=True) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = models_dir() / f"deploy-{digest}"
    target = path / "config.json"
    if target.is_file():
        return path
    write_text_atomic(target, text)
    return path


#: Speculative methods whose drafter kvspec writes itself (a deployment may
#: not name a drafter ``model``: the allow-list refuses the key).
DRAFTER_METHODS = ("eagle", "eagle3")


def drafter_config(target: dict) -> dict:
    """The drafter an EAGLE or EAGLE-3 deployment is resolved with: kvspec's
    own one-layer Llama head sized to the target (its hidden size, vocab,
    attention heads and head size, so its KV layer has the target's page and
    joins the target's attention group, as vLLM's worker groups it). vLLM's
    ``EAGLEConfig`` names it ``EagleLlamaForCausalLM`` or
    ``Eagle3LlamaForCausalLM`` by method. kvspec's choice, never a path a
    case names; no weights are loaded (``--load-format dummy``)."""
    text = target.get("text_config") if isinstance(target.get("text_config"), dict) else target
    hidden = int(text.get("hidden_size") or 0)
    heads = int(text.get("num_attention_heads") or 1)
    head_dim = int(text.get("head_dim") or (hidden // heads if hidden else 0))
    return {
        "_kvspec_source": "kvspec's EAGLE drafter for the target (engine_adapter.models.served.drafter_config)",
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": int(text.get("num_key_value_heads") or heads),
        "head_dim": head_dim,
        "vocab_size": int(text.get("vocab_size") or 0),
        "max_position_embeddings": int(text.get("max_position_embeddings") or 32768),
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def drafter_dir(target: dict) -> Path:
    """The folder holding :func:`drafter_config` for ``target`` (keyed by content)."""
    return model_dir(drafter_config(target))
