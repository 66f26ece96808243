"""Shared test helpers: building cases without JSON files."""

from __future__ import annotations

import pytest

from reference.case import parse_case

#: Tests that share one machine-wide resource run in one pytest-xdist
#: group (``make test`` runs ``-n 2 --dist loadgroup``), one after another
#: on one worker, in collection order: the live CPU server (at most one runs
#: at a time, ``tests/live/conftest.py``) with every test of the session's
#: in-process vLLM 0.32.0 CPU engine (``engine_032``: started once, on that
#: worker, for tests/live and tests/engine/test_cpu_deployment.py), and the
#: patched builds of one
#: release (a mutant build is removed after its test; making one holds the
#: release's install lock while it links the release, so the test that
#: times a ready release's install runs with them), and SGLang's engine
#: tests (one SGLang worker per module, started once). Everything else is
#: spread over both workers; ``make test`` runs tests/distribute (a local
#: Ray cluster of two vLLM workers) after the parallel run, alone.
#: The modules that drive SGLang's engine (its worker, its builds).
SGLANG_ENGINE_TESTS = ("test_sglang.py", "test_sglang_conformance.py")
XDIST_GROUPS = (
    ("live-server", lambda item: bool({"live_servers", "engine_032"} & set(getattr(item, "fixturenames", ())))),
    (
        "builds",
        lambda item: (
            item.path.parent.name == "mutate"
            or item.path.name
            in ("test_patched_engines.py", "test_planted_faults.py", "test_builds.py", "test_environments.py")
        ),
    ),
    ("sglang", lambda item: item.path.name in SGLANG_ENGINE_TESTS),
)


def xdist_group_of(item) -> str | None:
    """The group ``item`` runs in (the first that claims it), or None."""
    return next((name for name, claims in XDIST_GROUPS if claims(item)), None)


def _with_group_suffix(item, group: str) -> None:
    """Give ``item`` the node id ``<id>@<group>`` that ``--dist loadgroup``
    schedules by. pytest-xdist's worker appends it in its own
    pytest_collection_modifyitems by writing ``item._nodeid``; since pytest
    9.2 a node's id lives in ``item._id`` (a ``NodeId``) and that write is
    lost, so every test was its own work unit and the groups above held
    nothing (the live tests ran on both workers: two servers side by side,
    each started twice). The id is set here, on either pytest."""
    suffixed = f"{item.nodeid}@{group}"
    if not hasattr(item, "_id"):
        item._nodeid = suffixed  # pytest < 9.2
        return
    from _pytest.nodeid import NodeId

    item._id = NodeId.parse(suffixed)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    loadgroup = bool(getattr(config.option, "loadgroup", False))  # set on an xdist worker under --dist loadgroup
    for item in items:
        group = xdist_group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            if loadgroup and not item.nodeid.endswith(f"@{group}"):
                _with_group_suffix(item, group)


def pytest_configure(config) -> None:
    """The zygotes (engine_adapter.host.zygote) of this test run: one folder
    under kvspec's home for the whole run, set by the controlling process
    before pytest-xdist starts its workers (they inherit it), so both
    workers fork from the same zygote of an environment; stopped when the
    run ends (:func:`pytest_unconfigure`)."""
    import os

    from ground.home import kvspec_home

    if not hasattr(config, "workerinput") and "KVSPEC_ZYGOTE_DIR" not in os.environ:
        folder = kvspec_home() / f"zygotes-tests-{os.getpid()}"
        os.environ["KVSPEC_ZYGOTE_DIR"] = str(folder)
        # the run stops them at its end: room for the releases' zygotes
        # beside the patched builds' (a fresh clone's run evicted and
        # restarted 0.33.0's at the default 4), and no idle exit mid-run
        os.environ.setdefault("KVSPEC_ZYGOTE_MAX", "8")
        os.environ.setdefault("KVSPEC_ZYGOTE_IDLE_S", "1800")
        config._kvspec_zygote_dir = folder


def pytest_unconfigure(config) -> None:
    folder = getattr(config, "_kvspec_zygote_dir", None)
    if folder is None:
        return
    import os
    import shutil

    from engine_adapter.host import zygote

    zygote.stop_all()  # this run's folder (KVSPEC_ZYGOTE_DIR), none if it was never made
    shutil.rmtree(folder, ignore_errors=True)
    os.environ.pop("KVSPEC_ZYGOTE_DIR", None)


@pytest.fixture(scope="session", autouse=True)
def _warm_engines_of_this_session():
    """Warm engines (engine_adapter.host.warm) that the tests' commands start live
    in a folder of this session under kvspec's home, never beside the
    user's, and are stopped when the session ends (had it been killed,
    they still exit after their idle timeout)."""
    import os
    import shutil

    from ground.home import kvspec_home

    keys = ("KVSPEC_WARM_DIR", "KVSPEC_WARM_IDLE_S")
    before = {k: os.environ.get(k) for k in keys}
    folder = kvspec_home() / f"warm-tests-{os.getpid()}"
    os.environ["KVSPEC_WARM_DIR"] = str(folder)
    os.environ["KVSPEC_WARM_IDLE_S"] = "300"
    try:
        yield folder
    finally:
        from engine_adapter.host import warm

        warm.stop(directory=folder)
        shutil.rmtree(folder, ignore_errors=True)
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def engine_032():
    """vLLM 0.32.0 in its engine environment (a worker process per platform):
    resolves and runs the live CPU server's deployment in-process (tests/live,
    tests/engine/test_cpu_deployment.py; one start per session, on the
    live-server group's worker)."""
    from engine_adapter.host.engine import WorkerEngine
    from tests.engine.conftest import ensure_env

    ensure_env("0.32.0")
    engine = WorkerEngine("0.32.0", start_timeout=600)
    try:
        yield engine
    finally:
        engine.close()


MTP_DROP = {"method": "mtp", "num_speculative_tokens": 2, "disable_lookahead_block_hashes": True}
MTP = {"method": "mtp", "num_speculative_tokens": 2}


def hybrid(attention: int, mamba: int, mamba_count: int = 3, **geometry) -> dict:
    return {
        "groups": [
            {"kind": "full_attention", "block_size": attention},
            {"kind": "mamba", "block_size": mamba, "count": mamba_count},
        ],
        **geometry,
    }


def make_case(geometry: dict, prompts, speculative=None, name=None):
    """prompts: a list of prompts, each a list of (segment, length)."""
    return parse_case(
        {
            "schema": 1,
            "name": name,
            "geometry": geometry,
            "speculative": speculative,
            "trace": [{"prompt": [{"segment": s, "length": n} for s, n in p]} for p in prompts],
        }
    )


@pytest.fixture
def seed_case():
    return make_case(hybrid(1600, 1600), [[("A", 11910)]] * 3, MTP_DROP, name="seed-53504")
