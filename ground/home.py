"""Where kvspec keeps what it writes: ``$KVSPEC_HOME`` or ``<repo>/.kvspec``.

Engine environments, pip's download cache, ``VLLM_CACHE_ROOT``, the Hugging
Face cache and the tiny model directories all live under :func:`kvspec_home`,
never under ``~``. :func:`contained_env` is the environment every subprocess
(pip, the engine worker) runs with.

On the ground floor: vLLM-free and free of every other floor, imported by
``engine_adapter`` (also inside an engine environment, where the repository
is on ``PYTHONPATH``), ``fuzz`` and the commands alike.
``engine_adapter.live.paths`` re-exports it.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
#: kvspec's top-level packages. Their names are generic (``fuzz``,
#: ``reference``, ``spec``): kvspec runs from its checkout, installed
#: editable into its own virtual environment (docs/architecture.md, "How
#: kvspec installs"), and :func:`foreign_packages` says when another
#: package of the same name would be imported instead.
PACKAGES = ("ground", "reference", "spec", "engine_adapter", "fuzz", "advise", "mutate", "kvspec")


def foreign_packages() -> list[tuple[str, str]]:
    """``(name, where it imports from)`` for each of :data:`PACKAGES` that
    this interpreter would import from somewhere other than kvspec's
    checkout (another installed package of the same name, earlier on
    ``sys.path``); empty when every one is kvspec's."""
    found = []
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        origin = None if spec is None else (spec.origin or next(iter(spec.submodule_search_locations or []), None))
        if origin is None or not Path(origin).resolve().is_relative_to(REPO_ROOT / name):
            found.append((name, str(origin)))
    return found


def kvspec_home() -> Path:
    """``$KVSPEC_HOME`` if set, else ``<repo>/.kvspec`` (git-ignored)."""
    env = os.environ.get("KVSPEC_HOME")
    if env:
        return Path(env).expanduser().resolve()
    return REPO_ROOT / ".kvspec"


def engines_dir() -> Path:
    return kvspec_home() / "engines"


def cache_dir(name: str) -> Path:
    return kvspec_home() / "cache" / name


def models_dir() -> Path:
    return kvspec_home() / "models"


def cache_env(vllm_version: str | None = None) -> dict[str, str]:
    """Cache variables of pip, vLLM, Hugging Face, torch and friends.

    ``VLLM_CACHE_ROOT`` is per vLLM version: vLLM's model-inspection cache
    (``modelinfos/``) is keyed by model class only, so two versions sharing
    it would overwrite each other's entries and pay the ~20 s cold
    inspection on every switch."""
    return {
        "KVSPEC_HOME": str(kvspec_home()),
        "VLLM_CACHE_ROOT": str(cache_dir(f"vllm-{vllm_version}" if vllm_version else "vllm")),
        "VLLM_CONFIG_ROOT": str(cache_dir("vllm-config")),
        "VLLM_NO_USAGE_STATS": "1",
        # vLLM logs to stdout by default; kvspec's stdout carries JSON
        "VLLM_LOGGING_STREAM": "ext://sys.stderr",
        "DO_NOT_TRACK": "1",
        "HF_HOME": str(cache_dir("hf")),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "XDG_CACHE_HOME": str(cache_dir("xdg")),
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir("torchinductor")),
        "TRITON_CACHE_DIR": str(cache_dir("triton")),
        "NUMBA_CACHE_DIR": str(cache_dir("numba")),
        "PIP_CACHE_DIR": str(cache_dir("pip")),
        "UV_CACHE_DIR": str(cache_dir("uv")),
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_NO_CONFIG": "1",
        "MPLCONFIGDIR": str(cache_dir("matplotlib")),
    }


def contained_env(base: dict[str, str] | None = None, vllm_version: str | None = None) -> dict[str, str]:
    """A copy of ``base`` (default ``os.environ``) with every cache inside kvspec's home."""
    env = dict(os.environ if base is None else base)
    env.update(cache_env(vllm_version))
    return env


def contain_this_process() -> None:
    """Point this process's caches inside kvspec's home, before vLLM is imported.

    Values already set by the caller win only for ``KVSPEC_HOME``; cache roots
    are always kvspec's (a user's ``~/.cache/vllm`` is never written)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("vllm")
    except PackageNotFoundError:
        installed = None
    for key, value in cache_env(installed).items():
        os.environ[key] = value
