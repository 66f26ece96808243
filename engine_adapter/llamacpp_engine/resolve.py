"""A llama.cpp deployment: the allow-listed ``llama-server`` flags set on
llama.cpp's own ``CommonParams`` (``xllamacpp.CommonParams``, the struct
``common/common.h`` declares), and what the server resolved from them read
back from the server itself (its load log: ``tools/server/server-context.cpp
load_model``: n_slots, n_ctx_slot, checkpoints max / min spacing, the prompt
cache limit; ``llama_context``: n_ctx, n_batch, n_ubatch).

The model is one of kvspec's tiny random-weight GGUF files
(:mod:`engine_adapter.llamacpp_engine.gguf_models`), chosen by the
deployment's shipped model name; kvspec's own settings (one thread, no
warm-up, verbosity 4 for the checkpoint trace) are set last and reported.
"""

from __future__ import annotations

from typing import Any

import xllamacpp

from engine_adapter.llamacpp_engine import gguf_models
from ground.errors import Unsupported
from reference.deployment import Deployment
from reference.llamacpp_flags import parse_llamacpp_args

#: deployment.model (kvspec's shipped config) -> llama.cpp architecture.
MODELS = {shipped: arch for arch, shipped in gguf_models.ARCHITECTURES.items()}
#: kvspec's own settings of every server it starts (not the deployment's).
HARNESS = {"n_threads": 1, "warmup": False, "verbosity": 4}


def model_arch(dep: Deployment) -> str:
    if dep.model not in MODELS:
        raise Unsupported(
            f"deployment.model={dep.model!r}: llama.cpp runs kvspec's tiny GGUF models; allowed: {', '.join(MODELS)}"
        )
    if dep.model_overrides:
        raise Unsupported(
            "deployment.model_overrides: the GGUF models are written from the shipped shapes; allowed: {} with engine llamacpp"
        )
    return MODELS[dep.model]


def common_params(dep: Deployment, seed: int = 0, overrides: dict[str, Any] | None = None) -> tuple[Any, dict]:
    """llama.cpp's ``CommonParams`` for the deployment, and what was set."""
    arch = model_arch(dep)
    fields = parse_llamacpp_args(list(dep.args))
    fields.update(overrides or {})
    p = xllamacpp.CommonParams()
    path = gguf_models.model_path(arch, seed)
    p.model.path = str(path)
    for name, value in fields.items():
        setattr(p, name, value)
    p.cpuparams.n_threads = HARNESS["n_threads"]
    p.cpuparams_batch.n_threads = HARNESS["n_threads"]
    p.warmup = HARNESS["warmup"]
    p.verbosity = HARNESS["verbosity"]
    return p, {"arch": arch, "model_file": path.name, "set": fields}


def read_back(p: Any) -> dict:
    """The ``CommonParams`` fields kvspec reports, as the struct holds them."""
    names = (
        "n_ctx",
        "n_parallel",
        "n_ctx_checkpoints",
        "checkpoint_min_step",
        "cache_ram_mib",
        "n_batch",
        "n_ubatch",
        "cache_prompt",
        "swa_full",
        "kv_unified",
        "cache_idle_slots",
        "n_cache_reuse",
        "slot_prompt_similarity",
    )
    return {n: getattr(p, n) for n in names}
