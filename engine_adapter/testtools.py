"""pytest inside an engine environment, for the regression tests
``kvspec report`` writes (they run against that environment's vLLM).

Installed like the fuzzing tools (``fuzz.atheris_runner.ensure_fuzz_tools``):
the versions kvspec's own interpreter has, without dependencies, bounded in
time; nothing is installed when pytest already imports there.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version

from kvspec.home import contained_env

TEST_TOOLS = ("pytest", "pluggy", "iniconfig")
PROBE_TIMEOUT_S, INSTALL_TIMEOUT_S = 60.0, 300.0


def ensure_pytest(python: str) -> bool:
    """Make ``import pytest`` work in the environment of ``python``."""
    try:
        probe = subprocess.run([python, "-c", "import pytest"], capture_output=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False
    if probe.returncode == 0:
        return True
    try:
        pins = [f"{name}=={version(name)}" for name in TEST_TOOLS]
    except PackageNotFoundError:
        return False
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--disable-pip-version-check", *pins], capture_output=True, text=True, env=contained_env(), timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0
