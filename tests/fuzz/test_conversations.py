"""Conversations (the chat shape) in the generator, the shrinker and the
``stale`` oracle, without an engine."""

from __future__ import annotations

import random

from fuzz.draw.choosers import RandomChooser
from fuzz.draw.conversation import CONVERSATION_RATE, MAX_DECODE
from fuzz.draw.generate import MAX_DRAWN_PROMPT, build_case, describe
from fuzz.judge.oracle_states import check_stale, decode_writes
from fuzz.results.shrink import shrink
from reference.case import case_to_dict, parse_case, prompt_tokens, quotes_output
from tests.conftest import hybrid


def conversations(seeds=range(400)):
    for seed in seeds:
        case = build_case(RandomChooser(random.Random(seed)))
        if any(quotes_output(r) for r in case.trace):
            yield case


def test_a_conversation_turn_is_the_previous_prompt_its_output_and_new_text():
    found = list(conversations(range(1000)))
    # about one case in CONVERSATION_RATE
    assert 1000 / CONVERSATION_RATE / 2 < len(found) < 1000 / CONVERSATION_RATE * 2
    for case in found:
        quoting = [i for i, r in enumerate(case.trace) if quotes_output(r)]
        for i in quoting:
            turn = case.trace[i]
            (at,) = [k for k, s in enumerate(turn.prompt) if s.output is not None][-1:]
            j = turn.prompt[at].output
            assert j == i - 1  # the turn before it
            earlier = case.trace[j]
            assert turn.prompt[:at] == earlier.prompt  # its prompt, then its output, then new text
            assert turn.prompt[at].length == earlier.max_tokens
            assert at == len(turn.prompt) - 2 and turn.prompt[-1].output is None
            assert prompt_tokens(turn)[: earlier.num_prompt_tokens] == prompt_tokens(earlier)
        for i in [quoting[0] - 1, *quoting]:
            r = case.trace[i]
            assert 10 <= r.max_tokens <= MAX_DECODE  # tens to hundreds
            assert r.num_prompt_tokens + r.max_tokens <= MAX_DRAWN_PROMPT
            assert r.arrival is None  # served serially
        assert "out" in describe(case)
        assert parse_case(case_to_dict(case)) == case


def test_half_the_turns_end_within_their_outputs_reach_of_a_block_boundary():
    near = total = 0
    for case in conversations(range(1500)):
        block = case.geometry.scheduler_block_size
        for i, r in enumerate(case.trace[:-1]):
            if quotes_output(case.trace[i + 1]) and case.trace[i + 1].prompt[-2].output == i:
                total += 1
                n = r.num_prompt_tokens
                near += -(-n // block) * block - n in range(1, r.max_tokens + 1) or n % block == 0
    assert total and near / total > 0.4, (near, total)


def chat_case(retention=None):
    return parse_case(
        {
            "schema": 1,
            "geometry": hybrid(16, 16, 1, retention_interval=retention),
            "trace": [
                {"prompt": [{"segment": "X", "length": 7}]},
                {"prompt": [{"segment": "A", "length": 40}], "max_tokens": 30},
                {
                    "prompt": [{"segment": "A", "length": 40}, {"output": 1}, {"segment": "B", "length": 20}],
                    "max_tokens": 30,
                },
                {
                    "prompt": [
                        {"segment": "A", "length": 40},
                        {"output": 1},
                        {"segment": "B", "length": 20},
                        {"output": 2},
                        {"segment": "C", "length": 5},
                    ]
                },
            ],
        }
    )


def test_the_shrinker_keeps_output_segments_valid():
    case = chat_case()

    def fires(c):
        # the divergence needs a prompt quoting an output of at least 20 tokens
        return any(s.output is not None and s.length >= 20 for r in c.trace for s in r.prompt)

    small, _ = shrink(case, fires)
    assert parse_case(case_to_dict(small)) == small
    assert len(small.trace) == 2
    assert small.trace[1].prompt[1].output == 0 and small.trace[1].prompt[1].length == small.trace[0].max_tokens >= 20


def _observation(hits, computed):
    """A dense serial run of chat_case as an engine reports it: each prefill
    one chunk, each decode step one token."""
    case = chat_case()
    explain = []
    for i, r in enumerate(case.trace):
        n = r.num_prompt_tokens
        explain.append(
            {
                "request": i,
                "prompt_tokens": n,
                "written": [n],
                "chunk_ends": [n],
                "decode_steps": [[p, 1, 1] for p in range(n, n + r.max_tokens - 1)],
                "computed_tokens": computed[i],
                "retained_mamba_blocks": {"16": []},
                "retained_output_states": [],
            }
        )
    return case, {"hits": hits, "explain": explain}


def test_stale_accepts_a_resume_where_an_earlier_decode_step_ended():
    assert decode_writes({"prompt_tokens": 40, "decode_steps": [[40, 1, 1], [41, 1, 1]], "computed_tokens": 42}) == {
        41,
        42,
    }
    case, obs = _observation([0, 0, 64, 112], [7, 69, 119, 125])
    assert check_stale(case, "0.33.0", obs) == []


def test_stale_fires_on_a_resume_past_what_the_earlier_decode_computed():
    # request 1 computed 69 tokens: no state of its output lies at 80
    case, obs = _observation([0, 0, 80, 0], [7, 69, 119, 125])
    (div,) = check_stale(case, "0.33.0", obs)
    assert div.requests == [2]
    assert div.expected[2] == 69  # the highest written at or below 80 over its tokens


def _spec_chat(first_step_end: int):
    """stale-02ecbc7a's shape (Jamba, block 160, ngram; K=3 here, so a
    step may keep up to four tokens): A:159 decodes with drafts; the next turn quotes its prompt and output and
    resumes at 160, the block boundary the first step's two tokens cross."""
    case = parse_case(
        {
            "schema": 1,
            "geometry": hybrid(160, 160, 1),
            "speculative": {"method": "ngram", "num_speculative_tokens": 3},
            "trace": [
                {"prompt": [{"segment": "A", "length": 159}], "max_tokens": 6},
                {"prompt": [{"segment": "A", "length": 159}, {"output": 0}, {"segment": "B", "length": 1}]},
            ],
        }
    )
    steps = [[159, 4, 4], *[[p, 4, 4] for p in range(first_step_end, 164)]]
    explain = [
        {"prompt_tokens": 159, "written": [159], "decode_steps": steps, "computed_tokens": 164},
        {"prompt_tokens": 166, "written": [166], "decode_steps": []},
    ]
    return case, {"hits": [0, 160], "explain": explain}


def test_stale_accepts_a_resume_at_the_block_boundary_a_speculative_step_crossed():
    # the step from 159 computes the states after 160 and 161 tokens; vLLM's
    # postprocess_mamba_fused_kernel copies the one on the block grid (160)
    steps = {"prompt_tokens": 159, "decode_steps": [[159, 2, 2], [161, 2, 2]], "computed_tokens": 162}
    assert 160 not in decode_writes(steps) and decode_writes(steps, (160,)) == {160, 161, 162}
    # under async scheduling the recorded starts run ahead of what a step
    # kept (stale-fd08ce45: MTP 3, block 576); every block boundary up to the
    # end is still passed, whichever step reached it
    fd08 = {"prompt_tokens": 1149, "decode_steps": [[p, 4, 4] for p in (1149, 1153, 1154)], "computed_tokens": 1155}
    assert decode_writes(fd08, (576,)) == {1152, 1153, 1154, 1155}
    # a block of 2 below a step's 4 tokens: only the crossings the starts show
    small = {"prompt_tokens": 10, "decode_steps": [[10, 4, 4], [13, 4, 4]], "computed_tokens": 17}
    assert decode_writes(small, (2,)) == {12, 13, 16, 17}
    case, obs = _spec_chat(161)
    assert check_stale(case, "0.33.0", obs) == []


def test_stale_still_fires_inside_a_speculative_step():
    # the first step from 159 kept one token: 160 is then a step start, a write
    case, obs = _spec_chat(160)
    assert check_stale(case, "0.33.0", obs) == []
    # a step from 159 to 163 leaves 160 (the boundary) but not 161
    obs["hits"] = [0, 161]
    obs["explain"][0]["decode_steps"] = [[159, 4, 4], [163, 4, 4]]
    (div,) = check_stale(case, "0.33.0", obs)
    assert div.requests == [1] and div.expected[1] == 160
