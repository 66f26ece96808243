"""Where the live tier keeps its caches: ``$KVSPEC_HOME`` or the repo's ``.kvspec/``.

Nothing the live tier writes (server venv, pip cache, VLLM_CACHE_ROOT, HF
caches, server logs, the tiny model dir) goes to ``~``: every path is under
:func:`kvspec_home`.
"""

from __future__ import annotations

import os
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[2]


def kvspec_home() -> Path:
    """``$KVSPEC_HOME`` if set, else ``<repo>/.kvspec`` (git-ignored)."""
    env = os.environ.get("KVSPEC_HOME")
    if env:
        return Path(env).expanduser().resolve()
    if (_REPO_ROOT / "pyproject.toml").exists():
        return _REPO_ROOT / ".kvspec"
    return Path.cwd() / ".kvspec"


def engines_dir() -> Path:
    return kvspec_home() / "engines"


def cache_dir(name: str) -> Path:
    """A named cache under ``$KVSPEC_HOME/cache`` (pip, vllm, hf, ...)."""
    return kvspec_home() / "cache" / name


def logs_dir() -> Path:
    return kvspec_home() / "logs"


def models_dir() -> Path:
    return kvspec_home() / "models"


def contained_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of ``base`` (default: os.environ) with every cache variable the
    server stack reads pointed inside kvspec's home, never at ``~``."""
    env = dict(os.environ if base is None else base)
    home = kvspec_home()
    env.update(
        {
            "VLLM_CACHE_ROOT": str(cache_dir("vllm")),
            "VLLM_CONFIG_ROOT": str(cache_dir("vllm-config")),
            "HF_HOME": str(cache_dir("hf")),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "XDG_CACHE_HOME": str(cache_dir("xdg")),
            "TORCHINDUCTOR_CACHE_DIR": str(cache_dir("torchinductor")),
            "TRITON_CACHE_DIR": str(cache_dir("triton")),
            "NUMBA_CACHE_DIR": str(cache_dir("numba")),
            "PIP_CACHE_DIR": str(cache_dir("pip")),
            "MPLCONFIGDIR": str(cache_dir("matplotlib")),
            "KVSPEC_HOME": str(home),
        }
    )
    return env
