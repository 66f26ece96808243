"""Engine tests run the REAL vLLM scheduler in its per-version environment.

The session fixtures install an environment when it is missing (the same
``kvspec engines install`` code path; a few minutes cold, seconds when
ready) and keep one worker per version for the whole session.
"""

from __future__ import annotations

import sys

import pytest

from engine_adapter.host import environments
from engine_adapter.host.engine import WorkerEngine

TESTED_VERSIONS = ("0.29.0", "0.33.0")


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def ensure_env(version: str) -> None:
    if not environments.is_ready(version):
        environments.install(version, progress=_progress)
    assert environments.is_ready(version)


@pytest.fixture(scope="session")
def engines():
    """{version: WorkerEngine}, started lazily, closed at session end."""
    started: dict[str, WorkerEngine] = {}

    def get(version: str) -> WorkerEngine:
        if version not in started:
            ensure_env(version)
            engine = WorkerEngine(version)
            engine.start()
            started[version] = engine
        return started[version]

    yield get
    for engine in started.values():
        engine.close()


@pytest.fixture(scope="session")
def engine_029(engines):
    return engines("0.29.0")


@pytest.fixture(scope="session")
def engine_033(engines):
    return engines("0.33.0")
