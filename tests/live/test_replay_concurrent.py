"""Live replay of a concurrent trace, against the loopback stub of a vLLM
server: a wave is sent as its arrivals say and judged on its summed
counters against the most each request can resume whatever the batching
(``reference.predict.resume_bounds``); what makes the wave's counters
untrustworthy makes the run inconclusive; what cannot be judged live is
refused before anything is sent."""

from __future__ import annotations

import time

import pytest

from fuzz.replaying.live_replay import AGREES, DIVERGES, INCONCLUSIVE, LiveTarget, render, replay
from ground.errors import Unsupported
from reference.case import parse_case, prompt_tokens
from tests.conftest import hybrid
from tests.live.stub_server import Faults, StubVllm

FAST = dict(gap_s=0.0, timeout_s=5.0, settle_s=2.0, step_s=0.0)


def wave_case(arrivals=(0, 1)):
    """A prompt alone; a wave (a prompt, its resend, a longer sibling);
    the resend again, alone once the wave finished."""
    return parse_case(
        {
            "schema": 1,
            "name": "wave",
            "geometry": hybrid(128, 128),
            "trace": [
                {"prompt": [{"segment": "S", "length": 300}]},
                {"prompt": [{"segment": "A", "length": 1000}]},
                {"prompt": [{"segment": "A", "length": 1000}], "arrival": arrivals[0]},
                {"prompt": [{"segment": "A", "length": 1000}, {"segment": "B", "length": 300}], "arrival": arrivals[1]},
                {"prompt": [{"segment": "A", "length": 1000}]},
            ],
        }
    )


def by_prompt(case, hits):
    """Hits by prompt (the stub admits a wave's requests in any order)."""
    table = {}
    for r, h in zip(case.trace, hits):
        table.setdefault(tuple(prompt_tokens(r)), []).append(h)
    return lambda k, prompt: table[tuple(prompt)].pop(0)


def run(stub, case, **kw):
    return replay(LiveTarget(case, "case", None, None), stub.url, **{**FAST, **kw})


def test_a_wave_within_its_bounds_agrees_and_is_measured_as_a_whole():
    case = wave_case()
    with StubVllm(by_prompt(case, [0, 0, 896, 896, 896])) as stub:
        rep = run(stub, case)
        assert len(stub.admitted) == 5
    assert rep.verdict == AGREES, rep.reasons
    assert rep.waves == [{"requests": [1, 2, 3], "queries": 3300, "hits": 1792}]
    assert [r.bound for r in rep.rows] == [None, 0, 999, 1000, 999]
    assert [r.hits for r in rep.rows] == [0, None, None, None, 896]  # a wave's requests are not told apart
    assert rep.rows[0].target == 0 and all(r.sent for r in rep.rows)
    assert "none resumes past what a request sent before it computed" in rep.reasons[0]
    assert any("concurrent trace" in n for n in rep.notes)
    assert rep.as_dict()["waves"] == rep.waves and rep.as_dict()["requests"][2]["bound"] == 999


def test_a_wave_above_its_bounds_diverges():
    case = wave_case()
    with StubVllm(by_prompt(case, [0, 512, 896, 896, 896])) as stub:  # the head hits what nobody computed
        rep = run(stub, case)
    assert rep.verdict == DIVERGES
    assert rep.reasons == [
        "requests 1-3 (one wave): summed hits 2304 above 1999, the sum of the most each can resume from whatever the batching"
    ]


def test_a_request_alone_after_a_wave_is_held_to_its_bound():
    case = wave_case()
    with StubVllm(by_prompt(case, [0, 0, 0, 0, 1000])) as stub:
        rep = run(stub, case)
    assert rep.verdict == DIVERGES
    assert rep.reasons[0].startswith("request 4: observed hits 1000 above 999")


def test_foreign_queries_during_a_wave_make_it_inconclusive():
    case = wave_case()
    with StubVllm(by_prompt(case, [0, 0, 0, 0, 0]), faults=Faults(extra_queries_during={2: 50})) as stub:
        rep = run(stub, case)
    assert rep.verdict == INCONCLUSIVE
    assert any("!= the wave's prompt lengths 3300" in r and "looked up twice" in r for r in rep.reasons), rep.reasons


def test_a_failed_request_in_a_wave_stops_the_replay_inconclusive():
    case = wave_case()
    with StubVllm(by_prompt(case, [0, 0, 0, 0, 0]), faults=Faults(status={2: [500]})) as stub:
        rep = run(stub, case)
        assert len(stub.admitted) == 3  # request 4 was never sent
    assert rep.verdict == INCONCLUSIVE
    assert not rep.rows[4].sent and any("status=500" in r for r in rep.reasons)


def test_arrivals_are_sent_step_s_apart():
    case = wave_case(arrivals=(2, 3))
    with StubVllm(by_prompt(case, [0, 0, 0, 0, 0])) as stub:
        t0 = time.monotonic()
        rep = run(stub, case, step_s=0.1)
        took = time.monotonic() - t0
    assert rep.verdict == AGREES, rep.reasons
    assert took >= 0.5  # (2 + 3) steps of 0.1 s


def test_render_shows_bounds_and_the_wave(capsys):
    case = wave_case()
    with StubVllm(by_prompt(case, [0, 0, 896, 896, 896])) as stub:
        rep = run(stub, case)
    from rich.console import Console

    render(rep, Console(width=200, force_terminal=False))
    out = capsys.readouterr().out
    assert "<= 999" in out and "in a wave" in out
    assert "wave 1-3 (3 requests sharing the server): hits 1792 (<= 1999: ok), queries 3300" in out


def test_a_concurrent_finding_or_rescale_is_refused_before_sending():
    case = wave_case()
    with StubVllm() as stub:
        with pytest.raises(Unsupported, match=r"^finding\.case: a concurrent trace"):
            replay(LiveTarget(case, "finding", [0] * 5, [0] * 5, "vllm==0.33.0", "stale", 2), stub.url, **FAST)
        with pytest.raises(Unsupported, match=r"^--rescale: the trace is concurrent"):
            run(stub, case, rescale=True)
        assert stub.admitted == []


@pytest.mark.parametrize("bad", [-1.0, float("nan"), 61.0])
def test_step_s_is_checked(bad):
    with pytest.raises(Exception, match=r"--step-s"):
        replay(LiveTarget(wave_case(), "case", None, None), "http://127.0.0.1:9", **{**FAST, "step_s": bad})
