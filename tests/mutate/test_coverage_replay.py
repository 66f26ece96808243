"""The coverage replay of ``kvspec mutate --coverage`` (mutate.coverage.
replay_coverage) on the real vLLM 0.33.0: the campaign's cases split over
two processes, each under its own coverage data file, combined into one
report; a shard past the time bound is stopped and named."""

from __future__ import annotations

import json

import pytest

from ground.errors import EngineError
from tests.engine.conftest import ensure_env

pytestmark = pytest.mark.engine

CASE = {
    "schema": 1,
    "geometry": {
        "groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16, "count": 1}],
        "retention_interval": 0,
        "max_num_batched_tokens": 2048,
    },
    "speculative": None,
    "trace": [{"prompt": [{"segment": "A", "length": 40}]}, {"prompt": [{"segment": "A", "length": 40}]}],
}


@pytest.mark.slow  # over a minute on 2 cores: `make test-slow` (Makefile, test tiers)
def test_the_replay_runs_every_case_over_two_processes_and_combines_their_coverage(tmp_path):
    from mutate.coverage import replay_coverage

    ensure_env("0.33.0")
    cases = tmp_path / "cases.json"
    other = {**CASE, "geometry": {**CASE["geometry"], "retention_interval": 32}}
    cases.write_text(json.dumps([CASE, other, CASE]))
    out = replay_coverage("0.33.0", cases, tmp_path, jobs=2)
    assert out["replay"] == {"ran": 3, "refused": 0, "jobs": 2}
    assert [len(json.loads((tmp_path / f"coverage-cases.{k}.json").read_text())) for k in range(2)] == [2, 1]
    # both shards' data went into the one report: the split and the lookup ran
    executed = {f: len(info["executed_lines"]) for f, info in out["files"].items()}
    assert executed.get("v1/core/sched/scheduler.py", 0) > 0 and executed.get("v1/core/kv_cache_coordinator.py", 0) > 0


def test_a_shard_past_its_time_bound_is_stopped_and_named(tmp_path):
    from mutate.coverage import replay_coverage

    ensure_env("0.33.0")
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([CASE, CASE]))
    with pytest.raises(EngineError, match="shard 0 ran past 1 s"):
        replay_coverage("0.33.0", cases, tmp_path, jobs=2, timeout_s=1)
