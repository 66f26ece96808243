"""pytest inside an engine environment, for the regression tests
``kvspec report`` writes and vLLM's own tests (they run against that
environment's vLLM): installed by the one venv manager
(:func:`engine_adapter.host.venvs.ensure_tools`), at the versions kvspec's own
interpreter has; nothing is installed when pytest already imports there.
"""

from __future__ import annotations

from engine_adapter.host.venvs import ensure_tools

TEST_TOOLS = ("pytest", "pluggy", "iniconfig")


def ensure_pytest(python: str, timeout: float | None = None) -> bool:
    """Make ``import pytest`` work in the environment of ``python``."""
    return ensure_tools(python, ("pytest",), TEST_TOOLS, timeout)


def ensure_coverage(python: str, timeout: float | None = None) -> bool:
    """Make ``import coverage`` work in the environment of ``python``
    (``kvspec mutate``'s branch coverage of vLLM's functions)."""
    return ensure_tools(python, ("coverage",), ("coverage",), timeout)
