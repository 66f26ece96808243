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


def S(lengths, block: int = 1, in_flight: bool = False, limit: int | None = None, groups=QWEN3_NEXT) -> P.Sizing:
    return P.Sizing(tuple(lengths), tuple(groups), block, in_flight, limit)


def _resolver(dep: dict) -> dict:
    """A stand-in resolver (a test double: qwen3_next's resolved units)."""
    return {"block": 544, "hash": 544, "max_model_len": 32768, "max_num_seqs": 256, "groups": QWEN3_NEXT}


def test_a_request_counts_every_group_of_the_one_pool():
    # 3000 tokens + 4 slack: 6 attention blocks of 544; three Mamba groups of 5 running blocks
    assert P.running_blocks(3000, QWEN3_NEXT) == 6 + 3 * 5
    assert P.kept_blocks(3000, QWEN3_NEXT) == 4 * 5


def test_levels_run_from_one_request_to_room_for_all():
    lengths = [3000, 1000, 5000, 2000]
    pools = [P.pool_for(level, S(lengths)) for level in P.LEVELS]
    assert pools == sorted(pools) and pools[0] < pools[-1]
    assert pools[0] == 1 + P.running_blocks(5000, QWEN3_NEXT)
    assert pools[-1] == 1 + sum(P.running_blocks(n, QWEN3_NEXT) + P.kept_blocks(n, QWEN3_NEXT) for n in lengths)
    with pytest.raises(ValueError, match="level='tiny'"):
        P.pool_for("tiny", S(lengths))


def test_flags_carry_the_max_model_len_vllm_needs_and_strip_back():
    flags = P.pressure_flags(P.pool_for("one", S([3000, 100])), S([3000, 100], 544))
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
    assert P.pool_for("one", S([3000], in_flight=True)) == P.pool_for("one", S([3000])) + 3


def test_the_floor_runs_from_the_start_up_check_to_what_a_running_request_holds():
    # 3000 tokens: --max-model-len 6 x 544 = 3264; the check budgets 6 attention blocks and 3 x 5 Mamba blocks
    least = 1 + 6 + 3 * 5
    assert P.floor_band(S([3000, 100], 544)) == (least, least)  # steps in turn: one pool
    assert P.floor_band(S([3000, 100], 544, in_flight=True)) == (least, least + 3)  # a block per group more
    assert P.pool_for("floor", S([3000], 544, True)) == least < P.pool_for("one", S([3000], in_flight=True))
    # the check budgets --max-model-len, not the longest request: 2,800 tokens round up to the same 3264
    assert P.floor_band(S([2800], 544)) == (least, least)
    lengths = [3000, 1000, 5000, 2000]
    assert P.pool_for("floor", S(lengths, 544)) <= P.pool_for("one", S(lengths))


def test_a_floor_pool_is_drawn_across_the_band_and_only_there():
    import random

    from fuzz.draw.choosers import RandomChooser

    c = RandomChooser(random.Random(3))
    drawn = {P.draw_pool(c, "floor", S([3000], 544, True)) for _ in range(200)}
    assert drawn == set(range(22, 26))
    before = c._rng.getstate()
    assert P.draw_pool(c, "floor", S([3000], 544)) == 22  # one pool: nothing drawn
    assert P.draw_pool(c, "one", S([3000], 544, True)) == P.pool_for("one", S([3000], in_flight=True))
    assert c._rng.getstate() == before
    assert P.pressure_flags(22, S([2800], 544)) == [P.POOL_FLAG, "22", "--max-model-len", "3264"]


def test_drawn_pools_reach_the_floor_band_of_async_deployments():
    cases = list(itertools.islice(random_cases(5, resolver=_async_resolver, pressure="always"), 400))
    offsets = set()
    for case in cases:
        args = list(case.deployment.vllm_args)
        if P.POOL_FLAG not in args:
            continue
        pool = int(args[args.index(P.POOL_FLAG) + 1])
        lengths = [r.num_prompt_tokens + r.max_tokens for r in case.trace]
        least, most = P.floor_band(S(lengths, 544, P.SYNC_FLAG not in args, 32768))
        if least <= pool <= most:
            offsets.add(pool - least)
    assert offsets == {0, 1, 2, 3}, offsets  # every pool of the band, the start-up check's least included


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


def test_a_mamba_group_counts_the_budget_the_engine_resolved():
    # vLLM 0.33.0 budgets 3 blocks a Mamba group without drafts, 6 with ngram x 3 (tests/engine/test_resolve.py)
    plain, ngram = P.with_budget(QWEN3_NEXT, 3), P.with_budget(QWEN3_NEXT, 6)
    assert P.running_blocks(3000, plain) == 6 + 3 * 3 and P.running_blocks(3000, ngram) == 6 + 3 * 6
    assert P.running_blocks(3000, plain, in_flight=True) == 6 + 3 * 4
    assert P.with_budget(QWEN3_NEXT, None) is QWEN3_NEXT  # not said: MAMBA_RUNNING_BLOCKS
    assert [g.get("request_blocks") for g in plain] == [3, None]


def test_max_model_len_stays_within_what_the_deployment_takes():
    # 4,090 tokens round up to 4,352 on 544-token blocks; a model of 4,096 positions refuses that (get_and_verify_max_len)
    assert S([4090], 544).max_model_len == 4352
    capped = S([4090], 544, limit=4096)
    assert capped.max_model_len == 4096
    assert P.pressure_flags(30, capped)[-1] == "4096"
    assert P.floor_band(capped) == (1 + 8 + 3 * 5, 1 + 8 + 3 * 5)  # ceil(4096 / 544) = 8 attention blocks


def test_a_drawn_pool_reads_back_as_its_level():
    sizing = P.Sizing.of(
        [3000, 1000, 5000, 2000], {**_resolver({}), "async_scheduling": True, "mamba_request_blocks": 3}
    )
    assert sizing.groups[0]["request_blocks"] == 3 and sizing.in_flight and sizing.limit == 32768
    least, most = P.floor_band(sizing)
    assert [P.level_of(p, sizing) for p in range(least, most + 1)] == ["floor"] * (most - least + 1)
    # room for the longest request alone is the band's top where it is as long as --max-model-len: the tightest name
    assert P.pool_for("one", sizing) == most and P.level_of(most, sizing) == "floor"
    for level in ("two", "half", "room"):
        assert P.level_of(P.pool_for(level, sizing), sizing) == level
    assert P.level_of(least - 1, sizing) is None
