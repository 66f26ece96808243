"""The output oracle in live replay (``kvspec replay CASE --server URL
--outputs``), against the stub server (a test double of vLLM's HTTP
surface, tests/live/stub_server.py): each request's greedy ids and top
logprobs against its cold twin (the same request with a fresh
``cache_salt``); the same outputs agree, different ones diverge through the
one judge; the twin's counters are ours, not foreign traffic."""

from __future__ import annotations

from fuzz.replaying.live_replay import AGREES, DIVERGES, LiveTarget, replay
from reference.case import prompt_tokens
from reference.predict import predict
from tests.conftest import hybrid, make_case
from tests.live.stub_server import StubVllm

FAST = dict(gap_s=0.0, timeout_s=5.0, settle_s=2.0)
CASE = make_case(hybrid(128, 128), [[("R", 300)], [("R", 300)], [("R", 1000)]], name="repeat")


def hits():
    exp = predict(CASE, as_version="0.32.0")["hits"]
    return lambda k, prompt: exp[k]


def test_same_outputs_cached_and_cold_agree_and_twins_are_salted():
    with StubVllm(hits()) as stub:
        rep = replay(LiveTarget(CASE, "case", None, None), stub.url, outputs=True, **FAST)
        assert stub.admitted == stub.salted == [prompt_tokens(r) for r in CASE.trace]
    assert rep.verdict == AGREES, rep.reasons
    assert all(r.output_ids == r.cold_output_ids == [7] for r in rep.rows)
    assert any("cold twin" in n for n in rep.notes)


def test_a_stale_output_diverges_through_the_judge():
    # a TEST DOUBLE of a stale state: a cached request that hit generates another token than its cold twin
    def outputs(prompt, cold):
        return [7] * 64 if cold or len(prompt) != 1000 else [9] * 64

    with StubVllm(hits(), outputs_fn=outputs) as stub:
        rep = replay(LiveTarget(CASE, "case", None, None), stub.url, outputs=True, **FAST)
    assert rep.verdict == DIVERGES
    assert any(r.startswith("outputs fires at request 2") for r in rep.reasons), rep.reasons
    with StubVllm(hits(), outputs_fn=outputs) as stub:  # without --outputs the hits alone agree
        assert replay(LiveTarget(CASE, "case", None, None), stub.url, **FAST).verdict == AGREES
