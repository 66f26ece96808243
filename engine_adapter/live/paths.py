"""Where the live tier keeps its caches: the engine adapter's home
(``$KVSPEC_HOME`` or the repo's ``.kvspec/``), shared with ground.home.

Nothing the live tier writes (server venv, pip cache, VLLM_CACHE_ROOT, HF
caches, server logs, the tiny model dir) goes to ``~``.
"""

from __future__ import annotations

from pathlib import Path

from ground.home import cache_dir, contained_env, engines_dir, kvspec_home, models_dir

__all__ = ["cache_dir", "contained_env", "engines_dir", "kvspec_home", "logs_dir", "models_dir"]


def logs_dir() -> Path:
    return kvspec_home() / "logs"
