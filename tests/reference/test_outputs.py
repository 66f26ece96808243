"""Output segments (the chat shape): the case format and the reference
model's answer for a prompt that quotes an earlier request's output."""

from __future__ import annotations

import json

import pytest

from ground.errors import InvalidArgument
from reference.case import (
    OUTPUT_TOKEN,
    case_to_dict,
    parse_case,
    prompt_tokens,
    resync_outputs,
    segment_tokens,
    sequence_tokens,
)
from reference.knobs import resolve_knobs
from reference.serial import output_states, simulate, simulate_pairwise
from tests.conftest import MTP, MTP_DROP, hybrid


def chat(retention=0, speculative=None, first=40, max_tokens=30, text=20, block=16):
    """Turn 1: A:first generating max_tokens; turn 2: turn 1's prompt, its
    output and B:text."""
    return parse_case(
        {
            "schema": 1,
            "geometry": hybrid(block, block, 1, retention_interval=retention),
            "speculative": speculative,
            "trace": [
                {"prompt": [{"segment": "A", "length": first}], "max_tokens": max_tokens},
                {"prompt": [{"segment": "A", "length": first}, {"output": 0}, {"segment": "B", "length": text}]},
            ],
        }
    )


def test_an_output_segment_is_the_quoted_requests_output_tokens():
    case = chat()
    follow = prompt_tokens(case.trace[1])
    assert follow == segment_tokens("A", 40) + [OUTPUT_TOKEN] * 30 + segment_tokens("B", 20)
    assert case.trace[1].num_prompt_tokens == 90
    assert sequence_tokens(case.trace[0]) == follow[:70]
    assert OUTPUT_TOKEN not in segment_tokens("A", 5000)  # no stream reaches into an output


def test_round_trip_writes_the_output_index_back():
    case = chat()
    raw = case_to_dict(case)
    assert raw["trace"][1]["prompt"][1] == {"output": 0}
    assert parse_case(raw) == case
    assert json.dumps(case_to_dict(parse_case(raw))) == json.dumps(raw)


def test_a_case_without_outputs_is_written_as_before():
    case = parse_case(
        {
            "schema": 1,
            "geometry": hybrid(16, 16),
            "trace": [{"prompt": [{"segment": "A", "length": 5}, {"segment": "B", "length": 3}], "max_tokens": 4}],
        }
    )
    raw = case_to_dict(case)
    assert raw["trace"] == [{"prompt": [{"segment": "A", "length": 5}, {"segment": "B", "length": 3}], "max_tokens": 4}]


def _bad(trace):
    with pytest.raises(InvalidArgument) as err:
        parse_case({"schema": 1, "geometry": hybrid(16, 16), "trace": trace})
    message = str(err.value)
    assert "\n" not in message
    return message


FIRST = {"prompt": [{"segment": "A", "length": 8}], "max_tokens": 5}


@pytest.mark.parametrize("value", [1, 2, -1, True, "0", None, 1.0, 10**30])
def test_an_output_index_names_an_earlier_request(value):
    message = _bad([FIRST, {"prompt": [{"output": value}]}])
    assert message.startswith("trace[1].prompt[0].output=")
    assert "allowed: an integer in [0, 0]" in message


def test_an_output_segment_takes_no_other_field():
    message = _bad([FIRST, {"prompt": [{"output": 0, "length": 5}]}])
    assert message.startswith("trace[1].prompt[0].length=5: unknown field; allowed: output")


def test_the_first_request_quotes_nothing():
    assert _bad([{"prompt": [{"output": 0}]}]).startswith(
        "trace[0].prompt[0].output=0: no request finished before this one is sent"
    )


def test_a_request_quotes_only_an_earlier_wave():
    # request 2 arrives while request 1 runs (one wave): request 1's output is not there yet
    wave = [FIRST, {"prompt": [{"segment": "B", "length": 8}]}, {"prompt": [{"output": 1}], "arrival": 0}]
    assert "allowed: an integer in [0, 0]" in _bad(wave)
    ok = [FIRST, {"prompt": [{"segment": "B", "length": 8}]}, {"prompt": [{"output": 0}], "arrival": 0}]
    assert parse_case({"schema": 1, "geometry": hybrid(16, 16), "trace": ok}).trace[2].num_prompt_tokens == 5


def test_quoted_outputs_count_toward_the_prompt_limit():
    big = {"prompt": [{"segment": "A", "length": 8}], "max_tokens": 1 << 20}
    message = _bad([big, {"prompt": [{"segment": "A", "length": 8}, {"output": 0}]}])
    assert message.startswith("trace[1].prompt=")
    assert "at most 1,048,576 tokens" in message


def test_resync_follows_dropped_requests_and_max_tokens():
    case = parse_case(
        {
            "schema": 1,
            "geometry": hybrid(16, 16),
            "trace": [
                {"prompt": [{"segment": "X", "length": 3}]},
                FIRST,
                {"prompt": [{"segment": "A", "length": 8}, {"output": 1}]},
            ],
        }
    )
    kept = resync_outputs(case.trace[1:], [1, 2])
    assert kept is not None and kept[1].prompt[1].output == 0 and kept[1].num_prompt_tokens == 13
    assert resync_outputs((case.trace[0], case.trace[2]), [0, 2]) is None  # the quoted request is gone


# ------------------------------------------------------------ the model


def hits(case, version="0.33.0", rule="replay"):
    knobs = resolve_knobs(case, version)
    steps = simulate(case, knobs, rule)
    assert [s.as_dict() for s in steps] == [s.as_dict() for s in simulate_pairwise(case, knobs, rule)]
    return [s.hit for s in steps]


@pytest.mark.parametrize("rule", ["promise", "replay", "legacy"])
def test_follow_up_resumes_inside_the_output_under_dense_retention(rule):
    # turn 1 computes 40 + 30 - 1 = 69 tokens; its decode leaves states at 48
    # and 64 (the block grid past its prompt). Turn 2 shares 69 tokens with
    # it: attention reaches 64 (4 full blocks), the deepest state is 64.
    assert hits(chat(retention=None), rule=rule) == [0, 64]


@pytest.mark.parametrize("rule", ["promise", "replay", "legacy"])
def test_follow_up_recomputes_the_output_under_sparse_retention(rule):
    # sparse retention keeps only prompt positions: turn 1's extension
    # boundary floor(40 / 16) * 16 = 32
    assert hits(chat(retention=0), rule=rule) == [0, 32]


def test_periodic_retention_keeps_the_outputs_segment_ends():
    assert hits(chat(retention=32)) == [0, 64]
    assert hits(chat(retention=48, block=16, first=40, max_tokens=30)) == [0, 48]


def test_speculative_decoding():
    # lookahead hashes (L = 1): states up to C - L = 68 -> 48, 64
    assert hits(chat(retention=None, speculative=MTP)) == [0, 64]
    # the EAGLE drop: attention gives up its last block, 64 -> 48
    assert hits(chat(retention=None, speculative=MTP_DROP)) == [0, 48]
    assert hits(chat(retention=0, speculative=MTP_DROP)) == [0, 16]


def test_a_short_output_leaves_no_state_on_the_grid():
    # 40 + 10 - 1 = 49 tokens: the only block boundary passed is 48
    assert hits(chat(retention=None, max_tokens=10)) == [0, 48]
    # 40 + 5 - 1 = 44: none past the prompt; the prompt's own chunk end at 32
    assert hits(chat(retention=None, max_tokens=5)) == [0, 32]


def test_output_states_rule():
    case = chat(retention=None)
    knobs = resolve_knobs(case, "0.33.0")
    assert output_states(40, 30, case.geometry, knobs) == {16: {48, 64}}
    assert output_states(40, 1, case.geometry, knobs) == {}
    assert output_states(40, 30, chat(retention=0).geometry, knobs) == {}
    assert output_states(40, 30, chat(retention=32).geometry, knobs) == {16: {64}}
    spec = chat(retention=None, speculative=MTP)
    knobs = resolve_knobs(spec, "0.33.0")
    assert knobs.hash_lookahead_tokens == 1
    # 64 computed: block 64's hash covers the 25th output token, sampled in
    # the last step, and the cache call after that step keys it
    assert output_states(40, 25, spec.geometry, knobs) == {16: {48, 64}}
    assert output_states(40, 24, spec.geometry, knobs) == {16: {48}}  # 63 computed
    # a prompt on the block grid: its last block's hash waits for the first output token
    assert output_states(48, 1, spec.geometry, knobs) == {16: {48}}
    assert (
        output_states(48, 1, chat(retention=None).geometry, resolve_knobs(chat(), "0.33.0")) == {}
    )  # no lookahead: the prompt rule's


def test_a_one_token_turn_on_the_grid_is_resumed_at_its_end_with_lookahead_hashes():
    # A:48 generating one token: with lookahead hashes the block ending at 48
    # is hashed with the output token after it; the follow-up quoting it resumes at 48
    assert hits(chat(retention=None, speculative=MTP, first=48, max_tokens=1)) == [0, 48]
    assert hits(chat(retention=None, first=48, max_tokens=1)) == [0, 48]  # without: the prompt's own state at 48
    assert hits(chat(retention=0, speculative=MTP, first=48, max_tokens=1)) == [0, 32]


def test_a_resend_never_reaches_into_an_output():
    case = parse_case(
        {
            "schema": 1,
            "geometry": hybrid(16, 16, 1, retention_interval=None),
            "trace": [
                {"prompt": [{"segment": "A", "length": 40}], "max_tokens": 30},
                {"prompt": [{"segment": "A", "length": 40}]},
            ],
        }
    )
    assert hits(case) == [0, 32]
