"""SGLang 0.5.23's implemented rule (``reference.sglang_prefill``) on hand
cases whose numbers follow from the rules it cites; each was also observed
on the real engine (``python -m tests.conformance.sglang_replay_table``,
docs/sglang.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ground.errors import InvalidArgument, Unsupported
from reference.case import load_case, parse_case
from reference.sglang_prefill import SglangSetting, first_chunk, legitimately_above, next_chunk, simulate, track

ROOT = Path(__file__).resolve().parents[2]


def setting(page=64, chunk=2048, extra=True, grid=64, state_chunk=64, states=-1, track_grid=256) -> SglangSetting:
    return SglangSetting(
        page_size=page,
        chunked_prefill_size=chunk,
        extra_buffer=extra,
        strategy="extra_buffer" if extra else "no_buffer",
        cache_chunk=max(grid, page),
        checkpoint_grid=grid,
        state_chunk=state_chunk,
        max_states_per_path=states,
        track_grid=track_grid,
    )


def case(prompts: list[list[tuple[str, int]]]):
    return parse_case(
        {
            "schema": 1,
            "name": "t",
            "deployment": {"model": "qwen3_next", "engine": "sglang"},
            "trace": [{"prompt": [{"segment": s, "length": n} for s, n in p]} for p in prompts],
        }
    )


def test_first_chunk_is_floored_to_an_absolute_page_and_later_ones_are_not():
    s = setting(chunk=1000)
    assert first_chunk(0, 3000, s) == 960  # 1000 floored to the page
    assert next_chunk(3000 - 960, s) == 1000  # min(remaining, budget), unrounded
    assert first_chunk(100, 2900, s) == 924  # ends on the absolute page 1024: (100 + 960) // 64 * 64 - 100
    assert first_chunk(0, 1000, s) == 960  # 1000 rounded up to the page (1024) does not fit a budget of 1000


def test_tracking_is_relative_to_the_extend_and_the_branching_point_replaces_it():
    s = setting()
    assert track(0, 3200, None, s).seqlen == 3200
    assert track(1960, 2960, None, s).seqlen == 2920  # 1960 + 15 x 64: off the page
    assert track(0, 3200, 3136, s).seqlen == 3136  # the branching point instead of the last grid point
    assert track(0, 40, None, s) is None  # an extend shorter than the grid tracks nothing


def test_the_grid_multiple_resend_resumes_at_the_chunk_end_then_the_branching_point():
    steps = simulate(load_case(ROOT / "examples" / "sglang-grid-resend-qwen3_next.json"), setting())
    assert [s.hit for s in steps] == [0, 2048, 3136, 0, 3264, 3264]
    assert steps[1].branching == 3136 and steps[0].tracked == [2048, 3200]
    assert all(s.resumed_same_tokens in (None, True) for s in steps)


def test_a_sibling_keeps_only_its_branching_point():
    steps = simulate(load_case(ROOT / "examples" / "sglang-sibling-branch-qwen3_next.json"), setting())
    assert [s.hit for s in steps] == [0, 0, 640, 1024]
    assert steps[1].tracked == [640]


def test_no_buffer_keeps_chunk_ends_and_prompt_ends():
    steps = simulate(load_case(ROOT / "examples" / "sglang-no-buffer-qwen3_next.json"), setting(page=1, extra=False))
    assert [s.hit for s in steps] == [0, 2048, 0, 2048, 3300]


def test_a_continuing_chunk_off_the_page_keys_a_state_below_the_tokens_it_holds():
    # page 64, budget 1000: chunks end 960, 1960, 2960; the third extend
    # tracks 1960 + 15 x 64 = 2920, keyed at 2880 (page_aligned)
    steps = simulate(case([[("A", 3000)]] * 3), setting(chunk=1000))
    assert [s.hit for s in steps] == [0, 2880, 2944]
    assert steps[0].chunk_ends == [960, 1960, 2960, 3000]
    assert (steps[1].resumed_content, steps[1].resumed_same_tokens) == (2920, False)
    assert steps[2].resumed_same_tokens is True


def test_a_hit_above_the_promise_by_a_chunk_end_state_is_legitimate():
    c = case([[("A", 1024)], [("A", 1024)], [("A", 1024), ("B", 40)], [("A", 700), ("C", 300)]])
    steps = simulate(c, setting(chunk=512))
    assert steps[3].hit == 512 and steps[3].resumed_same_tokens is True
    obs = {
        "hits": [s.hit for s in steps],
        "explain": [{"resumed_state": {"same_tokens": s.resumed_same_tokens} if s.hit else None} for s in steps],
    }
    assert set(legitimately_above([0, 960, 1024, 0], obs, steps)) == {3}
    obs["explain"][3] = {"resumed_state": {"same_tokens": False}}  # the engine's state disagrees: not legitimate
    assert legitimately_above([0, 960, 1024, 0], obs, steps) == {}


def test_what_the_rule_does_not_model_is_refused():
    with pytest.raises(Unsupported):
        simulate(case([[("A", 100)]]), setting(states=2))
    concurrent = {
        "schema": 1,
        "name": "t",
        "deployment": {"model": "qwen3_next", "engine": "sglang"},
        "trace": [
            {"prompt": [{"segment": "A", "length": 100}]},
            {"prompt": [{"segment": "A", "length": 100}], "arrival": 0},
        ],
    }
    with pytest.raises(Unsupported):
        simulate(parse_case(concurrent), setting())


def decode_case(trace: list[dict]):
    return parse_case(
        {"schema": 1, "name": "t", "deployment": {"model": "qwen3_next", "engine": "sglang"}, "trace": trace}
    )


def test_decode_tracks_every_interval_and_a_follow_up_resumes_inside_the_output():
    """A 1,000-token prompt decoding 600 tokens (page 64, grid 64, track grid
    256): its prefill tracks 960, its decode steps 1,024, 1,280 and 1,536
    (``seq % 256 == 0``, ``schedule_batch.py:3815``); the turn that quotes
    its output resumes at 1,536, over its own tokens; a resend of the
    prompt alone resumes at 960. Observed the same on SGLang 0.5.23
    (``python -m tests.conformance.sglang_replay_table``)."""
    a = [{"segment": "A", "length": 1000}]
    steps = simulate(
        decode_case(
            [
                {"prompt": a, "max_tokens": 600},
                {"prompt": a + [{"output": 0}, {"segment": "B", "length": 50}]},
                {"prompt": a + [{"segment": "C", "length": 10}]},
            ]
        ),
        setting(),
    )
    assert steps[0].tracked == [960, 1024, 1280, 1536] and steps[0].kept == [960, 1536]
    assert [r.hit for r in steps] == [0, 1536, 960]
    assert steps[1].resumed_same_tokens is True and steps[2].resumed_same_tokens is True


def test_a_decode_needs_the_track_grid_and_no_buffer_keeps_the_working_state():
    trace = [{"prompt": [{"segment": "A", "length": 100}], "max_tokens": 40}]
    with pytest.raises(InvalidArgument):
        simulate(decode_case(trace), setting(track_grid=0))
    steps = simulate(
        decode_case(
            trace + [{"prompt": [{"segment": "A", "length": 100}, {"output": 0}, {"segment": "B", "length": 3}]}]
        ),
        setting(page=1, chunk=None, extra=False, grid=64),
    )
    assert steps[0].kept == [100, 139] and steps[1].hit == 139


def test_eagle_verify_steps_track_where_they_cross_and_key_every_computed_output():
    """Rule 6 (EAGLE chain, 4 tokens a verify, track grid 256): a 1,000-token
    prompt decoding 24 tokens verifies up to 1,024 and tracks 1,024; its 24
    outputs are all computed, so the state at 1,024 is kept and a turn
    quoting 30 outputs resumes there. With 22 outputs the step to 1,024 runs
    past them: 960 is kept instead (``_select_finished_checkpoint``).
    Observed the same on SGLang 0.5.23 (``tests/engine/test_sglang.py``,
    the ``spec-extra_buffer`` group of ``tests.conformance.sglang_replay_table``)."""
    from dataclasses import replace

    a = [{"segment": "A", "length": 1000}]
    for m, hit in ((24, 1024), (22, 960)):
        steps = simulate(
            decode_case(
                [
                    {"prompt": [{"segment": "Z", "length": 5}], "max_tokens": 30},
                    {"prompt": a, "max_tokens": m},
                    {"prompt": a + [{"output": 0}, {"segment": "C", "length": 10}]},
                ]
            ),
            replace(setting(), draft_tokens=4),
        )
        assert steps[1].tracked == [960, 1024], m
        assert [r.hit for r in steps] == [0, 0, hit], m
        assert steps[2].resumed_same_tokens is True
    plain = simulate(decode_case([{"prompt": a, "max_tokens": 24}]), setting())
    assert plain[0].tracked == [960]  # a plain decode computes 1,023 tokens: no step reaches 1,024


def test_a_concurrent_trace_is_predicted_for_its_serial_prefix_with_bounds_for_the_rest():
    """As for vLLM (``reference.predict``): the rule states the requests that
    ran alone; the wave's are ``null``, each with the most it can resume
    whatever SGLang batches (``bounds``), for the concurrent oracles."""
    from reference.sglang_prefill import predict as sglang_predict

    trace = [
        {"prompt": [{"segment": "A", "length": 1000}]},
        {"prompt": [{"segment": "A", "length": 1000}]},
        {"prompt": [{"segment": "A", "length": 1000}, {"segment": "B", "length": 10}], "arrival": 0},
    ]
    p = sglang_predict(decode_case(trace), setting())
    assert p["predicted"] == 1 and p["hits"] == [0, None, None]
    assert p["bounds"][0] is None and p["bounds"][2] >= p["bounds"][1] > 0
    assert sglang_predict(decode_case(trace[:2]), setting())["hits"] == [0, 960]  # serial: stated in full
