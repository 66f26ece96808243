"""Concurrent traces without an engine: the case format, the waves, what the
model predicts, how the oracles scope themselves, the shrinker and the
generator. The observations here are hand-written dicts in the engine's
result layout (a test double of an observation, named as one); the real
engine's side is ``tests/engine/test_concurrent.py``."""

from __future__ import annotations

import random

import pytest

from fuzz.draw.choosers import RandomChooser
from fuzz.draw.generate import build_case
from fuzz.driving.reach import trace_shape
from fuzz.judge.oracles import CONCURRENT_ORACLES, ORACLES, check_all, check_stale, serial_part
from fuzz.judge.verdict import AGREES, DIVERGES, Target, judge
from fuzz.results.shrink import shrink
from ground.errors import InvalidArgument
from reference.case import case_to_dict, is_concurrent, parse_case, serial_prefix, waves
from reference.predict import predict

GEOMETRY = {
    "groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}],
    "max_num_batched_tokens": 64,
}


def case_of(*requests) -> object:
    """``requests``: (length, arrival) pairs, all over stream A."""
    trace = []
    for length, arrival in requests:
        r = {"prompt": [{"segment": "A", "length": length}]}
        if arrival is not None:
            r["arrival"] = arrival
        trace.append(r)
    return parse_case({"schema": 1, "geometry": GEOMETRY, "trace": trace})


def test_arrival_is_parsed_kept_and_bounded():
    case = case_of((100, None), (100, 0), (40, 3), (100, None))
    assert [r.arrival for r in case.trace] == [None, 0, 3, None]
    again = parse_case(case_to_dict(case))
    assert again == case
    assert "arrival" not in case_to_dict(case)["trace"][0]  # a serial request's JSON is as before
    assert waves(case) == [[0, 1, 2], [3]] and serial_prefix(case) == 0 and is_concurrent(case)
    with pytest.raises(InvalidArgument, match=r"trace\[0\]\.arrival"):
        case_of((100, 0))
    for bad in (-1, True, 1.5, "1", 1 << 21):
        with pytest.raises(InvalidArgument, match=r"trace\[1\]\.arrival"):
            parse_case(
                {
                    "schema": 1,
                    "geometry": GEOMETRY,
                    "trace": [
                        {"prompt": [{"segment": "A", "length": 5}]},
                        {"prompt": [{"segment": "A", "length": 5}], "arrival": bad},
                    ],
                }
            )


def test_the_serial_prefix_stops_at_the_head_of_the_first_shared_wave():
    assert serial_prefix(case_of((10, None), (20, None), (30, None))) == 3
    assert serial_prefix(case_of((10, None), (20, None), (30, 1), (40, None))) == 1
    assert not is_concurrent(case_of((10, None), (20, None)))


def test_the_model_predicts_the_serial_prefix_and_no_further():
    serial = predict(case_of((100, None), (100, None)))
    concurrent = predict(case_of((100, None), (100, None), (100, 0)))
    assert concurrent["predicted"] == 1
    assert concurrent["hits"][:1] == serial["hits"][:1] and concurrent["hits"][1:] == [None, None]
    assert concurrent["queries"] == [100, 100, 100]
    assert predict(case_of((100, None), (100, None)))["predicted"] == 2


def observation(hits, written_steps, first_steps, chunk_ends=None):
    """A result dict in the engine's layout (a test double)."""
    explain = []
    for i, (h, ws, fs) in enumerate(zip(hits, written_steps, first_steps)):
        explain.append(
            {
                "request": i,
                "hit": h,
                "written": [p for p, _ in ws],
                "written_steps": [list(x) for x in ws],
                "first_step": fs,
                "chunk_ends": chunk_ends[i] if chunk_ends else [p for p, _ in ws],
                "steps": 3,
                "retained_mamba_blocks": None,
            }
        )
    return {"hits": list(hits), "queries": [100] * len(hits), "knobs": {}, "explain": explain}


def test_stale_fires_on_a_state_read_in_the_step_that_computes_it():
    case = case_of((100, None), (100, 0))
    # request 0 writes 64 in step 1 and 100 in step 2; request 1 first runs in step 1 and resumes at 64
    same_step = observation([0, 64], [[(64, 1), (100, 2)], [(100, 3)]], [0, 1])
    (div,) = check_stale(case, "0.33.0", same_step)
    assert (
        div.requests == [1]
        and div.expected[1] == 0
        and "in step 1, the first that ran it, from the state request 0 computes in step 1" in div.detail
    )
    one_step_later = observation([0, 64], [[(64, 1), (100, 2)], [(100, 3)]], [0, 2])
    assert check_stale(case, "0.33.0", one_step_later) == []


def test_a_later_request_that_ran_first_may_have_written_the_state():
    """In a wave a request sent later can compute a state before an earlier
    one is first scheduled (vLLM deferred the earlier one): its write counts."""
    case = case_of((100, None), (100, 0), (100, 0))
    obs = observation([0, 64, 0], [[(100, 3)], [(100, 6)], [(64, 1)]], [2, 5, 0])
    assert check_stale(case, "0.33.0", obs) == []


def test_a_request_of_an_earlier_wave_finished_before_the_next_wave_whatever_its_step_count():
    """A wave is sent once every earlier request finished (reference.case.waves),
    so the states an earlier serial request's decode left count for the
    wave's requests even where its step count runs past the wave's first
    step (async scheduling counts the steps while its last is in flight: a
    campaign's stale finding on vLLM 0.33.0, request 3 with 28 steps from
    step 18, the wave from step 44). A position no step wrote still fires."""
    trace = [
        {"prompt": [{"segment": "A", "length": 40}], "max_tokens": 30},
        {"prompt": [{"segment": "A", "length": 40}, {"output": 0}, {"segment": "B", "length": 1}]},
        {"prompt": [{"segment": "C", "length": 10}], "arrival": 0},
    ]
    case = parse_case({"schema": 1, "geometry": GEOMETRY, "trace": trace})
    assert waves(case) == [[0], [1, 2]]

    def obs(hit):
        o = observation([0, hit, 0], [[(40, 0)], [(71, 5)], [(10, 5)]], [0, 5, 5])
        o["explain"][0].update(prompt_tokens=40, computed_tokens=70, decode_steps=[[p, 2, 2] for p in range(40, 70, 2)])
        o["explain"][0]["steps"] = 8  # past step 5, where the wave first ran
        return o

    assert check_stale(case, "0.33.0", obs(64)) == []  # request 0's decode crossed 64 before the wave was sent
    (div,) = check_stale(case, "0.33.0", obs(65))  # between two steps' starts, off the block grid
    assert div.requests == [1] and "resumed at 65" in div.detail


def test_the_serial_oracles_judge_only_the_serial_prefix():
    case = case_of((100, None), (100, None), (100, 0))
    # request 1 resends request 0 and hits 0 (the promise fires there); request 2 shares steps with it
    obs = observation([0, 0, 7], [[(64, 0), (100, 1)], [(64, 2), (100, 3)], [(100, 3)]], [0, 2, 3])
    part_case, part_obs = serial_part(case, obs)
    assert len(part_case.trace) == 1 and part_obs["hits"] == [0] and len(part_obs["explain"]) == 1
    fired = {d.oracle for d in check_all(case, "0.33.0", obs, None, ("promise", "reference", "stale"))}
    assert "promise" not in fired and "reference" not in fired  # request 1 is the head of a shared wave
    assert "stale" in fired  # request 2 resumed at 7, where nothing was written
    assert set(CONCURRENT_ORACLES) <= set(ORACLES) | {
        "resolution",
        "versions",
        "engine_error",
        "outputs",
    }  # outputs: run when asked


def test_a_target_without_predictions_past_the_prefix_is_judged_by_the_oracles():
    case = case_of((100, None), (100, None), (100, 0))
    target = predict(case)
    obs = observation([0, 0, 0], [[(100, 1)], [(100, 2)], [(100, 3)]], [0, 2, 3])
    assert judge(Target(target["hits"], "promise"), obs).verdict == AGREES
    wrong = dict(obs, hits=[5, 0, 0])
    verdict = judge(Target(target["hits"], "promise"), wrong)
    assert verdict.verdict == DIVERGES and verdict.reasons[0].startswith("request 0:")
    stale = check_stale(case, "0.33.0", dict(obs, hits=[0, 0, 64]))
    assert judge(Target(target["hits"], "promise"), obs, stale).verdict == DIVERGES


def test_the_shrinker_makes_a_trace_serial_where_the_predicate_allows():
    case = case_of((100, None), (100, 3), (100, 2))
    smallest, _calls = shrink(case, lambda c: len(c.trace) >= 2)
    assert not is_concurrent(smallest)
    kept, _calls = shrink(case, lambda c: any(r.arrival is not None for r in c.trace))
    assert is_concurrent(kept) and len(kept.trace) == 2 and kept.trace[1].arrival == 0 and kept.trace[0].arrival is None


def test_the_generator_draws_concurrent_cases_sometimes_and_valid_ones_always():
    rng = random.Random(5)
    cases = [build_case(RandomChooser(rng)) for _ in range(300)]
    concurrent = [c for c in cases if is_concurrent(c)]
    assert 20 <= len(concurrent) <= 100, len(concurrent)
    for c in concurrent:
        assert c.trace[0].arrival is None and parse_case(case_to_dict(c)) == c
        assert trace_shape(c).endswith("concurrent")


def test_a_same_step_read_is_its_own_class_and_a_stale_key_is_not():
    from fuzz.results.findings import make_finding, signature
    from fuzz.results.known_classes import classify

    serial = case_of((100, None), (100, None))
    concurrent = case_of((100, None), (100, 0))
    obs = observation([0, 64], [[(64, 1), (100, 2)], [(100, 3)]], [0, 1])
    (div,) = check_stale(concurrent, "0.33.0", obs)
    assert div.context.get("same_step") and "request 0 computes in step 1" in div.detail
    serial_div = check_stale(serial, "0.33.0", observation([0, 64], [[(100, 2)], [(100, 3)]], [0, 3]))[0]
    assert not serial_div.context.get("same_step")
    assert signature(serial, div, {}) != signature(serial, serial_div, {})
    assert classify(make_finding(concurrent, div, obs)) is None
    # the serial one is the stale-state class where partial hits exist (a
    # hash unit below the block), and unclassified where they cannot
    found = make_finding(serial, serial_div, obs)
    assert classify(found) is None
    found["case"]["geometry"]["prefix_match_unit"] = 8
    assert classify(found) == "stale-state"
    # a state held that nobody wrote is the serial stale rule, concurrent or not: the same class
    held = observation([0, 0], [[(100, 2)], [(100, 3)]], [0, 1])
    held["explain"][1]["retained_mamba_blocks"] = {"16": [2]}  # the state at 48, which no prefill wrote
    (keyed,) = check_stale(concurrent, "0.33.0", held)
    assert keyed.context.get("stale_keys") and not keyed.context.get("same_step")


def test_resume_bounds_stop_at_what_a_request_sent_before_computed():
    from reference.predict import resume_bounds

    case = parse_case(
        {
            "schema": 1,
            "geometry": GEOMETRY,
            "trace": [
                {"prompt": [{"segment": "A", "length": 100}], "max_tokens": 4},
                {"prompt": [{"segment": "A", "length": 100}], "arrival": 0},  # its resend: N - 1
                {
                    "prompt": [{"segment": "A", "length": 60}, {"segment": "B", "length": 90}],
                    "arrival": 1,
                },  # diverges at 60
                {"prompt": [{"segment": "A", "length": 200}]},  # holds request 0 whole: + its 3 computed outputs
                {"prompt": [{"segment": "C", "length": 50}], "arrival": 2},  # shares nothing
            ],
        }
    )
    assert resume_bounds(case) == [0, 99, 60, 103, 0]
    predicted = predict(case)
    assert predicted["bounds"] == [0, 99, 60, 103, 0] and predicted["predicted"] == 0  # request 0 heads a shared wave
    assert "bounds" not in predict(case_of((100, None), (100, None)))  # a serial prediction is as before


def test_the_judge_holds_unpredicted_hits_to_their_bounds_alone_or_summed_over_a_wave():
    hits, bounds = [0, None, None], [None, 99, 99]
    ok = judge(Target(hits, "promise", bounds=bounds), {"hits": [0, 64, 99]})
    assert ok.verdict == AGREES and "none resumes past what a request sent before it computed" in ok.reasons[0]
    above = judge(Target(hits, "promise", bounds=bounds), {"hits": [0, 100, 0]})
    assert above.verdict == DIVERGES and above.reasons == [
        "request 1: observed hits 100 above 99, the most it can resume from whatever the batching (no request sent before it computed more)"
    ]
    summed = {"hits": [0, None, None], "waves": [{"requests": [1, 2], "hits": 199}]}
    assert judge(Target(hits, "promise", bounds=bounds), summed).verdict == DIVERGES
    assert (
        judge(Target(hits, "promise", bounds=bounds), dict(summed, waves=[{"requests": [1, 2], "hits": 198}])).verdict
        == AGREES
    )
