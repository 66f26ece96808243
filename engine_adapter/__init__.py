"""engine_adapter: the real engine, driven on CPU in an environment of its own per release (vLLM now).

Public API (importing this package never imports vLLM)::

    from engine_adapter import open_engine
    with open_engine("vllm==0.33.0", install=True) as engine:
        result = engine.run(case)   # {"hits", "queries", "knobs", "explain", ...}

See engine.py (Engine, in-process vs worker), environments.py (install/list),
driver.py (what is driven and observed), protocol.py (the worker's wire format).
"""

from __future__ import annotations

from typing import Any

__all__ = ["open_engine", "Engine", "SUPPORTED_VERSIONS", "DEFAULT_ENGINE", "parse_engine"]


def __getattr__(name: str) -> Any:
    if name in ("open_engine", "Engine", "InProcessEngine", "WorkerEngine"):
        from engine_adapter.host import engine

        return getattr(engine, name)
    if name in ("SUPPORTED_VERSIONS", "DEFAULT_ENGINE", "DEFAULT_VERSION", "parse_engine"):
        from engine_adapter.host import versions

        return getattr(versions, name)
    raise AttributeError(f"module 'engine_adapter' has no attribute {name!r}")
