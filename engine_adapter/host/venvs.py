"""One manager for the virtual environments kvspec builds: the engine
environments (``engine_adapter.host.environments``, one per vLLM version) and the
live server's (``engine_adapter.live.env``).

What they share:

* **the ready marker**: a venv ``ROOT`` is ready when
  ``ROOT/.kvspec-ready.json`` exists and records what it was built from
  (each caller checks its own fingerprint). The marker is written last and
  atomically (:func:`ground.files.write_json_atomic`), so a killed or
  failed install leaves none and the next install starts over;
* **tools from kvspec's interpreter** (:func:`ensure_tools`): pytest,
  atheris, coverage... installed into a venv that lacks them at the
  versions kvspec's own interpreter has, without dependencies, each step
  bounded in time;
* **the install lock**: an ``flock`` on ``.ROOT-NAME.lock`` beside the venv
  serializes installs of one venv; a second installer waits, polling, for at
  most ``wait_s`` seconds, then gives up with one line (EngineError);
* **the install transaction** (:func:`install`): under the lock, a ready venv
  is kept; otherwise what stands there is removed, the caller's steps build
  it, a failure of any kind removes the half-built directory, and the ready
  marker is written last. The engine environments, the builds
  (``engine_adapter.host.builds``) and the live server's env all install
  through it.

This module never imports vLLM.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from engine_adapter.protocol import READY_MARKER
from ground.errors import EngineError
from ground.files import write_json_atomic
from ground.home import contained_env

MARKER_NAME = READY_MARKER


def marker_path(root: Path) -> Path:
    return Path(root) / MARKER_NAME


def read_marker(root: Path) -> dict | None:
    """The ready marker of the venv at ``root`` (None when absent or unreadable)."""
    try:
        marker = json.loads(marker_path(root).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def write_marker(root: Path, payload: dict) -> None:
    """Mark the venv at ``root`` ready (atomically; call it last)."""
    write_json_atomic(marker_path(root), payload)


def lock_path(root: Path) -> Path:
    root = Path(root)
    return root.parent / f".{root.name}.lock"


def wait_flock(f, deadline: float, poll_s: float, timeout_message: str) -> None:
    """Take an exclusive ``flock`` on the open file ``f``, polling every
    ``poll_s`` seconds until ``time.monotonic()`` passes ``deadline``; then
    EngineError(``timeout_message``). kvspec's one bounded lock wait (the
    install lock here, a warm engine's start lock)."""
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise EngineError(timeout_message) from None
            time.sleep(poll_s)


@contextlib.contextmanager
def install_lock(
    root: Path, *, wait_s: float, label: str, progress: Callable[[str], None] | None = None, poll_s: float = 1.0
) -> Iterator[None]:
    """Hold the install lock of the venv at ``root``; wait (polling every
    ``poll_s``) at most ``wait_s`` seconds for another installer.
    ``label`` names the venv in the one-line error."""
    path = lock_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress is not None:
                progress(f"[{label}] another install holds {path}; waiting")
            wait_flock(
                f,
                time.monotonic() + wait_s,
                poll_s,
                f"{label}: install lock {path} held by another install for over {wait_s:.0f} s; allowed: a free lock",
            )
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def install(
    root: Path,
    *,
    label: str,
    wait_s: float,
    is_ready: Callable[[], bool],
    build: Callable[[], dict],
    force: bool = False,
    progress: Callable[[str], None] | None = None,
    poll_s: float = 1.0,
    stale_line: str,
    ready_line: Callable[[dict], str] | None = None,
    built_line: Callable[[dict], str] | None = None,
) -> dict:
    """Install the venv at ``root`` as one transaction; return its marker.

    Under :func:`install_lock` (``label``, ``wait_s``, ``poll_s``): when
    ``is_ready()`` and not ``force``, the venv stays as it is and its marker
    (``{}`` when unreadable) is returned, after ``ready_line(marker)``.
    Otherwise a directory standing at ``root`` (incomplete, stale or forced)
    is removed after ``stale_line``; ``build()`` makes the venv and returns
    its marker, which is written last (:func:`write_marker`, atomically), then
    ``built_line(marker)``. Any exception on the way (a failed step, Ctrl-C)
    removes the half-built directory and is raised again: no marker, nothing
    that looks ready."""
    say = progress or (lambda _line: None)
    root = Path(root)
    with install_lock(root, wait_s=wait_s, label=label, progress=progress, poll_s=poll_s):
        if not force and is_ready():
            marker = read_marker(root) or {}
            if ready_line is not None:
                say(ready_line(marker))
            return marker
        if root.exists():
            say(stale_line)
            shutil.rmtree(root)
        try:
            marker = build()
            write_marker(root, marker)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        if built_line is not None:
            say(built_line(marker))
        return marker


#: Bounds of :func:`ensure_tools`: the import probe, the install.
PROBE_TIMEOUT_S, INSTALL_TIMEOUT_S = 60.0, 300.0


def ensure_tools(python: str, modules: tuple[str, ...], dists: tuple[str, ...], timeout: float | None = None) -> bool:
    """Make ``import`` of every one of ``modules`` work in the venv of
    ``python``: nothing is installed when they already import; otherwise
    ``dists`` at the versions kvspec's own interpreter has, without
    dependencies (pip's cache under kvspec's home). Each step is bounded by
    its own limit and by ``timeout`` seconds; False when it did not work."""

    def bound(limit: float) -> float:
        return min(limit, timeout) if timeout else limit

    try:
        probe = subprocess.run(
            [python, "-c", "import " + ", ".join(modules)],
            capture_output=True,
            timeout=bound(PROBE_TIMEOUT_S),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    if probe.returncode == 0:
        return True
    try:
        pins = [f"{name}=={importlib.metadata.version(name)}" for name in dists]
    except importlib.metadata.PackageNotFoundError:
        return False
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                python,
                "install",
                "-q",
                "--no-deps",
                "--disable-pip-version-check",
                *pins,
            ],
            capture_output=True,
            text=True,
            env=contained_env(),
            timeout=bound(INSTALL_TIMEOUT_S),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0
