"""Re-export of :mod:`kvspec.home` (kvspec's home folder and the contained
environment of every subprocess), kept for ``engine_adapter.home`` imports."""

from __future__ import annotations

from kvspec.home import REPO_ROOT, cache_dir, cache_env, contain_this_process, contained_env, engines_dir, kvspec_home, models_dir

__all__ = ["REPO_ROOT", "cache_dir", "cache_env", "contain_this_process", "contained_env", "engines_dir", "kvspec_home", "models_dir"]
