"""Warm engines on the REAL vLLM 0.33.0 scheduler: a warm engine (a plain
process) observes what a worker of one's own (forked by its environment's
zygote, engine_adapter.host.zygote) observes, case for case (hand geometries and
deployments, in another order, so that nothing of one case leaks into the
next), concurrent clients each get their own answers, and the commands
reuse one warm engine (``KVSPEC_WARM=0``: a worker of their own).
tests/engine/test_warm_lifecycle.py covers the lifecycle on a stand-in."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from engine_adapter.host import warm, warm_state, zygote
from engine_adapter.host.engine import WarmEngine
from fuzz.draw.choosers import RandomChooser
from fuzz.draw.generate import build_case
from fuzz.driving.campaign import Campaign
from ground.errors import DeploymentRejected
from ground.home import REPO_ROOT
from reference.case import case_to_dict, load_case
from tests.engine.conftest import ensure_env

pytestmark = pytest.mark.engine

EXAMPLES = sorted((REPO_ROOT / "examples").glob("**/*.json"))


def comparable(result: dict) -> dict:
    """A result without what may differ between two processes: timing and
    which harness ran it."""
    return {k: v for k, v in result.items() if k not in ("timing", "harness")}


def observe(engine, case) -> dict:
    """The engine's result on ``case``, or vLLM's rejection of its deployment
    (an example vLLM refuses, ``examples/rejected-*``), by its message."""
    try:
        return engine.run(case)
    except DeploymentRejected as e:
        return {"rejected": str(e)}


@pytest.fixture(scope="module")
def cases(engine_033, tmp_path_factory):
    """The examples (hand and deployment), 12 random hand geometries and 12
    random deployments (drawn on what the cold engine resolves)."""
    out = [
        c for c in map(load_case, EXAMPLES) if c.deployment is None or c.deployment.engine == "vllm"
    ]  # vLLM's examples
    rng = random.Random(14)
    out += [build_case(RandomChooser(rng)) for _ in range(12)]
    resolver = Campaign(engine_033, tmp_path_factory.mktemp("resolver")).resolver
    out += [build_case(RandomChooser(rng), resolver=resolver) for _ in range(12)]
    return out


@pytest.fixture(scope="module")
def cold(engine_033, cases):
    return [comparable(observe(engine_033, c)) for c in cases]


@pytest.fixture(scope="module")
def warm_033():
    ensure_env("0.33.0")
    engine = WarmEngine("0.33.0")
    engine.start()
    return engine


def test_warm_and_cold_observe_the_same(engine_033, warm_033, cases, cold):
    """Also the zygote's rule: the cold worker was forked from a process
    that had imported vLLM, the warm server started the plain way."""
    assert any(c.deployment is not None for c in cases) and any(c.deployment is None for c in cases)
    assert isinstance(engine_033.process().proc, zygote.ForkedProcess)
    server = warm_state.read_state(warm_033.client().paths)["pid"]
    assert "engine_adapter.inside.worker" in Path(f"/proc/{server}/cmdline").read_bytes().decode()
    order = list(reversed(range(len(cases))))  # another order than the cold run's
    warm_results = {i: observe(warm_033, cases[i]) for i in order}
    for i, case in enumerate(cases):
        got = warm_results[i]
        platform = (
            case.deployment.platform if case.deployment is not None else "cuda"
        )  # a cpu deployment runs on the cpu platform's warm server
        assert "rejected" in got or got["harness"] == {"platform": platform, "mode": "worker", "warm": True}
        assert comparable(got) == cold[i], f"case {i} ({case.name}): {json.dumps(case_to_dict(case))[:300]}"


def test_two_concurrent_clients_both_get_their_answers(warm_033, cases, cold):
    halves = {0: list(range(0, len(cases), 2)), 1: list(range(1, len(cases), 2))}
    got: dict[int, dict] = {}
    failed: list[BaseException] = []

    def client(which: int) -> None:
        try:
            engine = WarmEngine("0.33.0")  # a client of its own, as another command
            for i in halves[which]:
                got[i] = comparable(observe(engine, cases[i]))
        except BaseException as e:  # noqa: BLE001 - reported below
            failed.append(e)

    threads = [threading.Thread(target=client, args=(w,)) for w in halves]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not failed, failed
    assert sorted(got) == list(range(len(cases)))
    for i in got:
        assert got[i] == cold[i], f"case {i}"


def kvspec(*argv, env=None):
    return subprocess.run(
        [sys.executable, "-m", "kvspec.cli", *argv],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=600,
        env=env or dict(os.environ),
    )


def test_the_commands_reuse_one_warm_engine(warm_033, tmp_path):
    ours = warm_033.client().env_id  # engines of other environments are others'
    (server,) = [
        w for w in warm.list_warm() if w["engine"] == "vllm==0.33.0" and w["platform"] == "cuda" and w["env"] == ours
    ]  # the cpu example has one of its own
    seed = str(REPO_ROOT / "examples" / "seed-53504.json")
    deployment = str(REPO_ROOT / "examples" / "seed-53504-deployment.json")
    run = kvspec("run", seed, "--engine", "vllm==0.33.0")
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout)["harness"] == {"platform": "cuda", "mode": "worker", "warm": True}
    assert kvspec("resolve", deployment, "--engine", "vllm==0.33.0", "--json").returncode == 0
    assert kvspec("replay", seed, "--engine", "vllm==0.33.0").returncode in (0, 1)
    chart = tmp_path / "m.png"
    assert kvspec("matrix", seed, "--engine", "vllm==0.33.0", "--chart", str(chart)).returncode == 0 and chart.exists()
    (after,) = [
        w for w in warm.list_warm() if w["engine"] == "vllm==0.33.0" and w["platform"] == "cuda" and w["env"] == ours
    ]
    assert after["pid"] == server["pid"]  # every command used the same warm engine
    cold_run = kvspec("run", seed, "--engine", "vllm==0.33.0", env={**os.environ, "KVSPEC_WARM": "0"})
    assert cold_run.returncode == 0 and json.loads(cold_run.stdout)["harness"] == {"platform": "cuda", "mode": "worker"}
