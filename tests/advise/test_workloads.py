"""Built-in workloads are deterministic in their options and seed and have
the shapes ``advise.workloads`` states; recorded traces parse both forms;
bad options and malformed trace lines are one line naming them."""

from __future__ import annotations

import json

import pytest

from advise import workloads
from ground.errors import InvalidArgument
from reference.case import prompt_tokens


def _tokens(w):
    return [prompt_tokens(r) for r in w.requests]


@pytest.mark.parametrize("name", workloads.WORKLOADS)
def test_same_seed_same_requests_other_seed_other_lengths(name):
    a = workloads.build(name, {}, seed=3)
    b = workloads.build(name, {}, seed=3)
    assert a.requests == b.requests
    assert len(a.requests) == workloads.DEFAULTS[name]["requests"]
    if name != "resend":  # the resend has no jitter
        assert workloads.build(name, {}, seed=4).requests != a.requests


def test_resend_is_one_prompt_sent_again():
    w = workloads.build("resend", {"requests": 3, "prompt_tokens": 11910})
    assert [r.num_prompt_tokens for r in w.requests] == [11910] * 3
    assert len({r for r in w.requests}) == 1


def test_chat_turns_extend_the_last_and_conversations_share_the_system_prompt():
    w = workloads.build("chat", {"requests": 6, "turns": 3, "system_tokens": 500}, seed=1)
    toks = _tokens(w)
    for c in range(2):
        for t in range(1, 3):
            prev, cur = toks[3 * c + t - 1], toks[3 * c + t]
            assert len(cur) > len(prev) and cur[: len(prev)] == prev
    assert toks[0][:500] == toks[3][:500] and toks[0][500] != toks[3][500]


def test_interleaved_is_round_robin_over_conversations():
    w = workloads.build("interleaved", {"requests": 8, "conversations": 4, "system_tokens": 100}, seed=2)
    streams = [r.prompt[1].segment for r in w.requests]
    assert streams == ["c0", "c1", "c2", "c3"] * 2
    toks = _tokens(w)
    for c in range(4):
        assert toks[4 + c][: len(toks[c])] == toks[c]  # turn 1 extends turn 0 of the same conversation


def test_agent_and_rag_shapes():
    agent = workloads.build("agent", {"requests": 8, "turns": 4}, seed=0)
    assert all(r.prompt[0].segment == "sys" and r.prompt[0].length == 6000 for r in agent.requests)
    assert [r.prompt[1].segment for r in agent.requests] == ["task0"] * 4 + ["task1"] * 4
    rag = workloads.build("rag", {"requests": 20, "documents": 3}, seed=0)
    docs = {r.prompt[1].segment for r in rag.requests}
    assert docs <= {"doc0", "doc1", "doc2"} and len(docs) > 1
    assert len({r.prompt[2].segment for r in rag.requests}) == 20  # every question its own


def test_bad_options_are_one_line():
    with pytest.raises(InvalidArgument, match=r"^--workload='chats': allowed: resend, chat"):
        workloads.build("chats")
    with pytest.raises(InvalidArgument, match=r"^--documents=3: not an option of --workload chat"):
        workloads.build("chat", {"documents": 3})
    with pytest.raises(InvalidArgument, match=r"^--requests=0: must be an integer in \[1, "):
        workloads.build("resend", {"requests": 0})
    with pytest.raises(InvalidArgument, match=r"a prompt has at most 1,048,576 tokens"):
        workloads.build("chat", {"turns": 3, "requests": 3, "turn_tokens": 1_000_000, "prompt_tokens": 100})


def _write(tmp_path, lines):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(x) if not isinstance(x, str) else x for x in lines) + "\n")
    return str(path)


def test_trace_of_token_counts_keeps_prefix_relations(tmp_path):
    path = _write(
        tmp_path,
        [
            {"tokens": 1000},
            {"tokens": 1500, "shares": {"request": 0, "tokens": 1000}},
            {"tokens": 1200, "shares": {"request": 0, "tokens": 1000}},
            "",
            {"tokens": 1800, "shares": {"request": 1, "tokens": 1500}},
            {"tokens": 700, "shares": {"request": 3, "tokens": 600}, "max_tokens": 4},
        ],
    )
    w = workloads.load_trace(path)
    toks = _tokens(w)
    assert [len(t) for t in toks] == [1000, 1500, 1200, 1800, 700]
    assert toks[1][:1000] == toks[0] and toks[2][:1000] == toks[0]
    assert toks[1][1000] != toks[2][1000]  # siblings: their own tokens after the shared 1000
    assert toks[3][:1500] == toks[1]
    assert toks[4][:600] == toks[3][:600] and w.requests[4].max_tokens == 4
    assert len(w.requests[3].prompt) == 1  # a chain of extensions continues one stream
    assert len(w.requests[2].prompt) == 2


def test_trace_of_prompts(tmp_path):
    path = _write(
        tmp_path,
        [{"prompt": [{"segment": "A", "length": 50}]}, {"prompt": [{"segment": "A", "length": 80}], "max_tokens": 2}],
    )
    w = workloads.load_trace(path)
    assert [r.num_prompt_tokens for r in w.requests] == [50, 80]


@pytest.mark.parametrize(
    "lines, message",
    [
        (["{not json"], r"^--trace line 1="),
        ([{"tokens": 0}], r"^--trace line 1\.tokens=0: must be an integer in \[1, "),
        (
            [{"tokens": 10, "shares": {"request": 0, "tokens": 5}}],
            r"^--trace line 1\.shares\.request=0: the first request shares with none",
        ),
        (
            [{"tokens": 10}, {"tokens": 10, "shares": {"request": 0, "tokens": 11}}],
            r"^--trace line 2\.shares\.tokens=11: must be an integer in \[0, 10\]",
        ),
        ([{"tokens": 10}, {"prompt": [{"segment": "A", "length": 5}]}], r"^--trace line 2=.*one form per file"),
        ([{"tokens": 10, "text": "hi"}], r"^--trace line 1\.text='hi': unknown field"),
        ([{"prompt": [{"segment": "A", "length": -1}]}], r"^--trace line 1: trace\[0\]\.prompt\[0\]\.length=-1"),
        ([], r"^--trace=0: has no request"),
    ],
)
def test_malformed_trace_lines_are_one_line(tmp_path, lines, message):
    with pytest.raises(InvalidArgument, match=message) as e:
        workloads.load_trace(_write(tmp_path, lines) if lines else _write(tmp_path, [""]))
    assert "\n" not in str(e.value)


def test_trace_file_that_is_not_a_file(tmp_path):
    with pytest.raises(InvalidArgument, match=r"^--trace=.*is a folder"):
        workloads.load_trace(str(tmp_path))
