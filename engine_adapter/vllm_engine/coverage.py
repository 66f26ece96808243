"""The vLLM functions under test, for coverage-guided fuzzing.

``kvspec fuzz --driver atheris`` instruments these functions only (their
code objects, in place: ``atheris.instrument_func``), not all of
``vllm.v1.core``: the prefix-cache lookup, the boundaries a hit and the
retained Mamba states are computed on, retention, the align-mode prefill
split, and how a deployment's block sizes are resolved. Everything else the
scheduler runs per step (``schedule()``, block allocation, request
bookkeeping) is left as it is: covering it told the fuzzer little and cost
most of its speed.

A name a version lacks is skipped (``functions_under_test`` reports which
were found). This module imports vLLM.
"""

from __future__ import annotations

import importlib
import inspect
import types
from collections.abc import Callable

#: (module, qualified name): a function, or a class (all functions defined in it).
UNDER_TEST: tuple[tuple[str, str], ...] = (
    # lookup and its boundaries: the hit, the EAGLE drop, the junction
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager.get_computed_blocks"),
    ("vllm.v1.core.kv_cache_coordinator", "HybridKVCacheCoordinator"),
    ("vllm.v1.core.kv_cache_coordinator", "KVCacheCoordinator.cache_blocks"),
    ("vllm.v1.core.kv_cache_coordinator", "replay_boundaries"),
    ("vllm.v1.core.kv_cache_coordinator", "_validate_prefix_cache_retention_interval"),
    ("vllm.v1.core.single_type_kv_cache_manager", "FullAttentionManager"),
    ("vllm.v1.core.single_type_kv_cache_manager", "SingleTypeKVCacheManager.find_longest_cache_hit"),
    ("vllm.v1.core.single_type_kv_cache_manager", "SingleTypeKVCacheManager.cache_blocks"),
    ("vllm.v1.core.single_type_kv_cache_manager", "SingleTypeKVCacheManager._has_partial_local_hit"),
    # retention: which Mamba states are kept, and where a hit may resume
    ("vllm.v1.core.single_type_kv_cache_manager", "MambaManager"),
    # the align-mode prefill split (where a chunk ends, so where a state is written)
    ("vllm.v1.core.sched.scheduler", "Scheduler._mamba_block_aligned_split"),
    # a deployment's block sizes and hit alignment
    ("vllm.v1.core.kv_cache_utils", "resolve_kv_cache_block_sizes"),
    ("vllm.v1.core.kv_cache_utils", "resolve_cache_hit_alignment_tokens"),
)


def _functions_of(obj) -> list[types.FunctionType]:
    """A function, or every function defined in a class (methods, static
    and class methods, property getters and setters)."""
    if isinstance(obj, types.FunctionType):
        return [obj]
    if not inspect.isclass(obj):
        return []
    out = []
    for value in vars(obj).values():
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property):
            out += [f for f in (value.fget, value.fset) if isinstance(f, types.FunctionType)]
        elif isinstance(value, types.FunctionType):
            out.append(value)
    return out


def functions_under_test() -> tuple[list[Callable], list[str]]:
    """(the functions of :data:`UNDER_TEST` this vLLM has, the names it lacks)."""
    found: dict[int, Callable] = {}
    missing = []
    for module_name, qualname in UNDER_TEST:
        try:
            obj = importlib.import_module(module_name)
            for part in qualname.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            missing.append(f"{module_name}:{qualname}")
            continue
        funcs = _functions_of(obj)
        if not funcs:
            missing.append(f"{module_name}:{qualname}")
        for f in funcs:
            found[id(f)] = f
    return list(found.values()), missing
