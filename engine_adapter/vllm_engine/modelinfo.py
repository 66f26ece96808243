"""vLLM's model-info cache, filled once at install.

vLLM inspects a model class (hybrid? attention-free? MTP?) in a child
process that imports vLLM a second time, "to avoid initializing CUDA"
(``vllm/model_executor/models/registry.py`` 0.33.0:1122-1125
``_LazyRegisteredModel.inspect_model_cls`` -> ``_run_in_subprocess``,
:1594), and keeps the answer per class and module hash under
``$VLLM_CACHE_ROOT/modelinfos`` (:1013, :1070 ``_save_modelinfo_to_cache``;
the same in 0.29.0:1045 and 0.32.0:1079). On a fresh machine each class
that kvspec's deployments touch costs one more ``import vllm`` (about 25 s
of CPU on 2 cores) the first time something resolves it.

:func:`warm` runs vLLM's own ``inspect_model_cls`` for those classes in
this process (the install's self-test: on CPU, where there is no CUDA to
keep away), with the child-process hop replaced by a call, so vLLM writes
the cache files its child would have written, from the same function
(``_ModelInfo.from_model_cls(load_model_cls())``). A release without these
hooks, or a class that fails here, is left to vLLM (its child process, as
before): this only moves work earlier, it decides nothing."""

from __future__ import annotations

import importlib

from engine_adapter.models.served import MAMBA_KIND

#: Drafter and fallback classes vLLM inspects for kvspec's deployments
#: beside the served architectures and their ``*_mtp`` heads: the EAGLE
#: heads of a Llama drafter (engine_adapter/models/served.py's EAGLE
#: config), the Llama target itself, and the Transformers fallback.
OTHER_CLASSES = ("EagleLlamaForCausalLM", "Eagle3LlamaForCausalLM", "LlamaForCausalLM", "TransformersForCausalLM")


def classes(registry) -> list[str]:
    """The registry's architectures kvspec's deployments touch: the served
    ones (``MAMBA_KIND``), every class in a module named after one of
    theirs plus a suffix (``qwen3_next_mtp`` beside ``qwen3_next``), and
    :data:`OTHER_CLASSES`."""
    models = getattr(registry, "models", {})
    stems = {getattr(models.get(a), "module_name", "").rsplit(".", 1)[-1] for a in MAMBA_KIND if a in models}
    stems.discard("")
    picked = [a for a in models if getattr(models[a], "module_name", "").rsplit(".", 1)[-1].startswith(tuple(stems))]
    return sorted(set(picked) | {a for a in OTHER_CLASSES if a in models})


def warm() -> dict:
    """Inspect :func:`classes` in this process; counts of classes
    inspected, and of those left to vLLM (no hook, or failed here)."""
    try:
        registry_module = importlib.import_module("vllm.model_executor.models.registry")
        registry = registry_module.ModelRegistry
        hop = registry_module._run_in_subprocess
    except (ImportError, AttributeError):
        return {"inspected": 0, "left_to_vllm": "all"}
    names = classes(registry)
    left = 0
    registry_module._run_in_subprocess = lambda fn: fn()
    try:
        for name in names:
            try:
                registry.models[name].inspect_model_cls()
            except Exception:  # noqa: BLE001 - vLLM's own child process inspects it later
                left += 1
    finally:
        registry_module._run_in_subprocess = hop
    return {"inspected": len(names) - left, "left_to_vllm": left}
