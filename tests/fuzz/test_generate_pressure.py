"""The pinned pool a drawn case gets (fuzz.draw.generate_pressure) and where the
judge sees pressure (fuzz.judge.oracles.before_pressure): pure, no engine."""

from __future__ import annotations

import itertools

import pytest

from fuzz.draw import generate_pressure as P
from fuzz.driving.drivers import random_cases
from fuzz.judge.oracle_registry import PRESSURE_ORACLES, SAFETY_ORACLES
from fuzz.judge.oracles import before_pressure, prefix_part
from reference.case import parse_case

QWEN3_NEXT = [
    {"kind": "mamba", "block_size": 544, "count": 3},
    {"kind": "full_attention", "block_size": 544, "count": 1},
]


def _resolver(dep: dict) -> dict:
    """A stand-in resolver (a test double: qwen3_next's resolved units)."""
    return {"block": 544, "hash": 544, "max_model_len": 32768, "max_num_seqs": 256, "groups": QWEN3_NEXT}


def test_a_request_counts_every_group_of_the_one_pool():
    # 3000 tokens + 4 slack: 6 attention blocks of 544; three Mamba groups of 5 running blocks
    assert P.running_blocks(3000, QWEN3_NEXT) == 6 + 3 * 5
    assert P.kept_blocks(3000, QWEN3_NEXT) == 4 * 5


def test_levels_run_from_one_request_to_room_for_all():
    lengths = [3000, 1000, 5000, 2000]
    pools = [P.pool_for(level, lengths, QWEN3_NEXT) for level in P.LEVELS]
    assert pools == sorted(pools) and pools[0] < pools[-1]
    assert pools[0] == 1 + P.running_blocks(5000, QWEN3_NEXT)
    assert pools[-1] == 1 + sum(P.running_blocks(n, QWEN3_NEXT) + P.kept_blocks(n, QWEN3_NEXT) for n in lengths)
    with pytest.raises(ValueError, match="level='tiny'"):
        P.pool_for("tiny", lengths, QWEN3_NEXT)


def test_flags_carry_the_max_model_len_vllm_needs_and_strip_back():
    flags = P.pressure_flags("one", [3000, 100], QWEN3_NEXT, 544)
    assert flags == [P.POOL_FLAG, str(1 + P.running_blocks(3000, QWEN3_NEXT)), "--max-model-len", str(6 * 544)]
    base = ["--enable-prefix-caching", "--scheduling-policy", "fcfs"]
    assert P.strip_pool(base + flags) == base
    assert P.strip_pool(base) == base


def test_pressure_is_drawn_aside_so_the_cases_stay_those_without_it():
    plain = list(itertools.islice(random_cases(5, resolver=_resolver, pressure="none"), 24))
    drawn = list(itertools.islice(random_cases(5, resolver=_resolver, pressure="always"), 24))
    assert [c.trace for c in plain] == [c.trace for c in drawn]
    assert [list(c.deployment.vllm_args) for c in plain] == [P.strip_pool(list(c.deployment.vllm_args)) for c in drawn]
    assert all(P.POOL_FLAG in c.deployment.vllm_args for c in drawn)
    assert not any(P.POOL_FLAG in c.deployment.vllm_args for c in plain)


def test_the_judge_cuts_liveness_at_the_first_wave_under_pressure():
    case = parse_case(
        {
            "schema": 1,
            "deployment": {"model": "qwen3_next", "vllm_args": ["--enable-prefix-caching"]},
            "trace": [
                {"prompt": [{"segment": "A", "length": 100}]},
                {"prompt": [{"segment": "B", "length": 100}]},
                {"prompt": [{"segment": "B", "length": 100}], "arrival": 0},
                {"prompt": [{"segment": "A", "length": 100}]},
            ],
        }
    )
    quiet = {"hits": [0, 0, 0, 0], "explain": [{"request": i} for i in range(4)]}
    assert before_pressure(case, quiet) is None
    pressed = {**quiet, "explain": [{"request": 0}, {"request": 1}, {"request": 2, "preempted_steps": [3]}, {}]}
    assert before_pressure(case, pressed) == 1  # the wave of request 2 starts at request 1
    evicted = {**quiet, "explain": [{"request": 0}, {"request": 1, "evicted": [[1, 0, 16, 16, 1]]}, {}, {}]}
    assert before_pressure(case, evicted) is None  # kvspec's own pool: a freed block reused, judged as before
    pinned = {**evicted, "resolution": {"facts": {"pool_set_by_deployment": True}}}
    assert before_pressure(case, pinned) == 1  # the deployment's pool: pressure from request 1 on
    part, obs = prefix_part(case, pressed, 1)
    assert len(part.trace) == 1 and obs["hits"] == [0] and len(obs["explain"]) == 1
    assert set(SAFETY_ORACLES) <= set(PRESSURE_ORACLES) and "promise" not in PRESSURE_ORACLES


def test_an_async_deployment_s_running_request_holds_one_mamba_block_more_per_group():
    # the step in flight keeps its skipped block (processed-token basis, vLLM 0.33.0 kv_cache_manager.py:561-567)
    assert P.running_blocks(3000, QWEN3_NEXT, in_flight=True) == P.running_blocks(3000, QWEN3_NEXT) + 3
    assert P.pool_for("one", [3000], QWEN3_NEXT, True) == P.pool_for("one", [3000], QWEN3_NEXT) + 3


def _async_resolver(dep: dict) -> dict:
    """A stand-in resolver (a test double) whose deployments resolve async
    scheduling unless the case turns it off."""
    return {**_resolver(dep), "async_scheduling": "--no-async-scheduling" not in dep["vllm_args"]}


def test_the_scheduler_is_drawn_aside_async_by_default_and_sync_sometimes():
    plain = list(itertools.islice(random_cases(5, resolver=_resolver, pressure="none"), 48))
    drawn = list(itertools.islice(random_cases(5, resolver=_async_resolver, pressure="none"), 48))
    assert [c.trace for c in plain] == [c.trace for c in drawn]
    sync = [P.SYNC_FLAG in c.deployment.vllm_args for c in drawn]
    assert 0 < sum(sync) < len(sync) / 2
    assert not any(P.SYNC_FLAG in c.deployment.vllm_args for c in plain)
    again = list(itertools.islice(random_cases(5, resolver=_async_resolver, pressure="none"), 48))
    assert [list(c.deployment.vllm_args) for c in again] == [list(c.deployment.vllm_args) for c in drawn]
