"""A concurrent trace on the real vLLM CPU server and on vLLM 0.32.0's own
scheduler in-process, as one deployment (issue 25, item 4).

The trace: a prompt alone; a wave of a prompt, its resend into the same
step and a longer sibling one step later; the resend alone once the wave
finished. In-process, the serial prefix is predicted and the rest judged
by the concurrent oracles (``stale``, ``block_table``, ...) and by
``resume_bounds``; live, the serial prefix is judged per request and the
wave on its summed counters against the same bounds (a server's counters
cannot tell a wave's requests apart). Both must agree: vLLM 0.32.0 serves
this trace correctly. The hits the two sides summed over the wave are
printed beside each other; they may differ (the server batches by the
clock, the in-process loop by the case's steps), so nothing is asserted
on them.
"""

from __future__ import annotations

import pytest

from fuzz.judge.oracles import CONCURRENT_ORACLES, check_all, resolved
from fuzz.judge.verdict import Target as Prediction
from fuzz.judge.verdict import judge
from fuzz.replaying.live_replay import AGREES, LiveTarget, replay
from reference.case import case_to_dict, parse_case, waves
from reference.predict import predict

pytestmark = [pytest.mark.live, pytest.mark.engine, pytest.mark.timeout(1800)]

VERSION = "0.32.0"


def test_a_concurrent_wave_agrees_in_process_and_live(live_server, live_case, engine_032, block, seg):
    B = block
    s, a, b = seg("S"), seg("A"), seg("B")
    n = 4 * B + 40
    case = live_case(
        [[(s, 2 * B + 8)], [(a, n)], [(a, n)], [(a, n), (b, B)], [(a, n)]], "live-concurrent", max_tokens=2
    )
    raw = case_to_dict(case)
    raw["trace"][2]["arrival"], raw["trace"][3]["arrival"] = 0, 1
    case = parse_case(raw)
    assert waves(case) == [[0], [1, 2, 3], [4]]

    expected = predict(case, as_version=VERSION)
    assert expected["predicted"] == 1 and expected["bounds"][1:] == [0, n - 1, n + 1, n - 1]
    observed = engine_032.run(case)
    judged = resolved(case, observed, VERSION)
    oracles = tuple(o for o in CONCURRENT_ORACLES if o not in ("knobs", "versions", "resolution"))
    in_process = judge(
        Prediction(expected["hits"], "promise", bounds=expected["bounds"]),
        observed,
        check_all(judged, VERSION, observed, None, oracles),
    )
    assert in_process.verdict == AGREES, in_process.reasons

    live = replay(LiveTarget(case, "case", None, None), live_server.url, gap_s=0.2, timeout_s=300.0)
    assert live.verdict == AGREES, live.reasons
    (wave,) = live.waves
    assert wave["requests"] == [1, 2, 3] and wave["queries"] == 3 * n + B
    assert live.rows[0].hits == 0 and live.rows[4].hits is not None
    print(
        f"[live] wave hits: server {wave['hits']:g}, in-process {sum(observed['hits'][1:4])}; "
        f"request 4 alone: server {live.rows[4].hits:g}, in-process {observed['hits'][4]}",
        flush=True,
    )
