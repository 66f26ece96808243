"""Replay against a loopback stub of a vLLM server: verdicts and the
no-false-findings rules (HTTP errors, counter resets, restarts, timeouts,
foreign traffic, knob changes), geometry refusals, rescale, API key handling.
"""

from __future__ import annotations

import json
import sys
import types
from dataclasses import replace

import pytest

from engine_adapter.live.geometry import rescale_case
from fuzz.replaying.live_replay import (
    AGREES,
    DIVERGES,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    LiveTarget,
    load_target,
    render,
    replay,
)
from ground.engines import EngineSpec
from ground.errors import InvalidArgument, KvspecError, Unsupported
from kvspec.cli import main as cli_main
from reference.case import case_to_dict, prompt_tokens
from reference.predict import predict
from tests.conftest import MTP, hybrid, make_case
from tests.live.stub_server import Faults, StubVllm, cache_config_labels

FAST = dict(gap_s=0.0, timeout_s=5.0, settle_s=2.0)


def repeat_case(name="R"):
    """Predicted on 0.32.0 with block 128: hits 0, 256, 256."""
    return make_case(hybrid(128, 128), [[(name, 300)], [(name, 300)], [(name, 1000)]], name="repeat")


def predicted(case, version="0.32.0"):
    return predict(case, as_version=version)["hits"]


def follows(hits):
    return lambda k, prompt: hits[k]


def run(stub, case, **kw):
    return replay(LiveTarget(case, "case", None, None), stub.url, **{**FAST, **kw})


# ---------------------------------------------------------------- verdicts


def test_clean_run_matching_the_prediction_agrees():
    case = repeat_case()
    exp = predicted(case)
    assert exp == [0, 256, 256]
    with StubVllm(follows(exp)) as stub:
        rep = run(stub, case)
        assert stub.admitted == [prompt_tokens(r) for r in case.trace]  # token ids, in order
    assert rep.verdict == AGREES, rep.reasons
    assert [r.hits for r in rep.rows] == [0, 256, 256]
    assert [r.queries for r in rep.rows] == [300, 300, 1000]
    assert all(r.ttft_s is not None and r.latency_s >= r.ttft_s for r in rep.rows)
    assert rep.model == "stub-model" and rep.server_version == "0.32.0"


def test_clean_run_with_other_hits_diverges():
    case = repeat_case()
    with StubVllm(follows([0, 128, 256])) as stub:
        rep = run(stub, case)
    assert rep.verdict == DIVERGES
    assert rep.reasons == ["request 1: observed hits 128, target 256"]


def test_gap_is_respected_between_requests():
    case = repeat_case()
    with StubVllm(follows(predicted(case))) as stub:
        import time

        t0 = time.monotonic()
        rep = run(stub, case, gap_s=0.3)
        assert time.monotonic() - t0 >= 0.6
    assert rep.verdict == AGREES


# ---------------------------------------------------------------- no false findings


def test_http_500_is_not_retried_and_makes_the_run_inconclusive():
    case = repeat_case()
    with StubVllm(follows(predicted(case)), faults=Faults(status={1: [500]})) as stub:
        rep = run(stub, case)
        assert stub.completions == 1 + 0  # request 0 ok; request 1 answered 500 once and not resent
        assert len(stub.admitted) == 1
    assert rep.verdict == INCONCLUSIVE
    assert any("status=500" in r for r in rep.reasons)
    assert any("request 2: not sent" in r for r in rep.reasons)
    assert rep.rows[2].sent is False


def test_503_is_retried_a_bounded_number_of_times():
    case = repeat_case()
    with StubVllm(follows(predicted(case)), faults=Faults(status={1: [503]})) as stub:
        rep = run(stub, case)
    assert rep.verdict == AGREES, rep.reasons
    assert any("sent 2 times" in n for n in rep.notes)
    with StubVllm(follows(predicted(case)), faults=Faults(status={0: [503, 503, 503, 503]})) as stub:
        rep = run(stub, case, retries=2)
        assert stub.admitted == []
    assert rep.verdict == INCONCLUSIVE
    assert any("status=503" in r for r in rep.reasons)


def test_counter_reset_makes_the_run_inconclusive():
    case = repeat_case()
    with StubVllm(follows(predicted(case))) as stub:
        rep = run(stub, case, after_request=lambda i: stub.reset() if i == 0 else None)
    assert rep.verdict == INCONCLUSIVE
    assert (
        "request 1: prefix_cache_queries_total went down between requests (300 -> 0: restart or reset)" in rep.reasons
    )


def test_counter_reset_during_a_request():
    case = make_case(hybrid(128, 128), [[("R", 300)]] * 3)
    with StubVllm(follows(predicted(case)), faults=Faults(reset_during={2})) as stub:
        rep = run(stub, case)
    assert rep.verdict == INCONCLUSIVE
    assert (
        "request 2: prefix_cache_queries_total went down during the request (600 -> 300: restart or reset)"
        in rep.reasons
    )


def test_restart_is_seen_through_process_start_time():
    case = repeat_case()
    # counters reset to 0 and then 600 more tokens arrive: they end above the
    # old value, so only the start time tells the restart apart
    with StubVllm(follows(predicted(case))) as stub:

        def restart_then_traffic(i):
            if i == 0:
                stub.restart()
                stub.add_foreign(10_000)

        rep = run(stub, case, after_request=restart_then_traffic)
    assert rep.verdict == INCONCLUSIVE
    assert any("restarted" in r for r in rep.reasons)


def test_timeout_makes_the_run_inconclusive_and_stops_it():
    case = repeat_case()
    with StubVllm(follows(predicted(case)), faults=Faults(delay_s={1: 3.0})) as stub:
        rep = run(stub, case, timeout_s=0.5)
    assert rep.verdict == INCONCLUSIVE
    assert any("timeout_s=0.5" in r for r in rep.reasons)
    assert rep.rows[2].sent is False


def test_stream_that_stays_open_past_the_timeout():
    case = make_case(hybrid(128, 128), [[("S", 200)]])
    case = case.__class__(case.geometry, None, (case.trace[0].__class__(case.trace[0].prompt, 8),), "slow")
    with StubVllm(follows([0]), faults=Faults(stall_s={0: 0.3})) as stub:
        rep = run(stub, case, timeout_s=1.0)
    assert rep.verdict == INCONCLUSIVE
    assert any("timeout_s=1.0" in r for r in rep.reasons)


def test_foreign_traffic_between_requests():
    case = repeat_case()
    with StubVllm(follows(predicted(case))) as stub:
        rep = run(stub, case, after_request=lambda i: stub.add_foreign(77) if i == 0 else None)
    assert rep.verdict == INCONCLUSIVE
    assert any("counters moved between requests" in r and "+77" in r for r in rep.reasons)


def test_foreign_traffic_during_a_request():
    case = repeat_case()
    with StubVllm(follows(predicted(case)), faults=Faults(extra_queries_during={1: 50})) as stub:
        rep = run(stub, case)
    assert rep.verdict == INCONCLUSIVE
    assert any("query delta 350 != prompt length 300" in r for r in rep.reasons)
    # the hits still matched: a false "reproduced" is exactly what must not happen
    assert [r.hits for r in rep.rows] == [0, 256, 256]


def test_foreign_requests_that_skip_the_prefix_cache_are_seen_too():
    case = repeat_case()
    with StubVllm(follows(predicted(case))) as stub:
        rep = run(stub, case, after_request=lambda i: stub.add_uncounted_foreign() if i == 0 else None)
    assert rep.verdict == INCONCLUSIVE
    assert "request 1: requests finished between ours (request_success_total +1): foreign traffic" in rep.reasons


def test_requests_running_before_ours_are_foreign_traffic():
    case = repeat_case()
    with StubVllm(follows(predicted(case))) as stub:
        rep = run(stub, case, after_request=lambda i: stub.set_running(1) if i == 0 else None)
    assert rep.verdict == INCONCLUSIVE
    assert any("running=1" in r for r in rep.reasons)


def test_metrics_that_lag_behind_the_stream_are_waited_for():
    case = repeat_case()
    with StubVllm(follows(predicted(case)), faults=Faults(metrics_lag_s=0.3)) as stub:
        rep = run(stub, case)
    assert rep.verdict == AGREES, rep.reasons


def test_metrics_that_never_settle():
    case = repeat_case()
    with StubVllm(follows(predicted(case)), faults=Faults(metrics_lag_s=30)) as stub:
        rep = run(stub, case, settle_s=0.3)
    assert rep.verdict == INCONCLUSIVE
    assert any("did not settle" in r for r in rep.reasons)


def test_cache_config_change_during_the_run():
    case = repeat_case()
    with StubVllm(follows(predicted(case))) as stub:
        rep = run(
            stub,
            case,
            after_request=lambda i: stub.change_config(prefix_cache_retention_interval="None") if i == 1 else None,
        )
    assert rep.verdict == INCONCLUSIVE
    assert any("cache_config_info changed" in r for r in rep.reasons)


def test_dropped_connection_mid_request():
    case = repeat_case()
    with StubVllm(follows(predicted(case)), faults=Faults(drop_connection={0})) as stub:
        rep = run(stub, case)
    assert rep.verdict == INCONCLUSIVE


def test_metrics_endpoint_failing_is_an_error_not_a_verdict():
    case = repeat_case()
    with StubVllm(follows(predicted(case)), faults=Faults(metrics_status=500)) as stub:
        with pytest.raises(KvspecError, match=r"GET /metrics: HTTP 500 after 2 attempt\(s\)"):
            run(stub, case, retries=1)
        assert stub.admitted == []


def test_unreachable_server_is_one_line():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(KvspecError) as e:
        replay(LiveTarget(repeat_case(), "case", None, None), f"http://127.0.0.1:{port}", retries=0, **FAST)
    assert "\n" not in str(e.value) and "/v1/models" in str(e.value)


# ---------------------------------------------------------------- geometry


@pytest.mark.parametrize(
    "stub_kw, case_fn, match",
    [
        (
            dict(),
            lambda: make_case(hybrid(1600, 1600), [[("A", 100)]]),
            r"^geometry.groups\[0\].block_size=1600: the server's block_size is 128",
        ),
        (
            dict(),
            lambda: make_case(hybrid(128, 128), [[("A", 100)]], MTP),
            r"^speculative.method=mtp: the server runs no speculative decoding",
        ),
        (
            dict(spec_positions=2),
            lambda: repeat_case(),
            r"^server num_speculative_tokens=2: the case has speculative=null",
        ),
        (
            dict(cache_config=cache_config_labels(enable_prefix_caching="False")),
            lambda: repeat_case(),
            r"enable_prefix_caching=False",
        ),
        (
            dict(cache_config=cache_config_labels(mamba_cache_mode="none")),
            lambda: repeat_case(),
            r"mamba_cache_mode=none",
        ),
        (
            dict(cache_config=cache_config_labels(prefix_match_unit=64)),
            lambda: repeat_case(),
            r"hash_block_size=128: the server hashes every 64 tokens",
        ),
        (
            dict(max_model_len=512),
            lambda: repeat_case(),
            r"^trace\[2\] prompt\+max_tokens=1001: above the server's max_model_len=512",
        ),
        (dict(version="0.99.0"), lambda: repeat_case(), r"^server version=0.99.0"),
        (dict(version=None), lambda: repeat_case(), r"^server /version=unknown"),
    ],
)
def test_refusals_are_one_line_and_send_nothing(stub_kw, case_fn, match):
    with StubVllm(**stub_kw) as stub:
        with pytest.raises(Unsupported, match=match) as e:
            run(stub, case_fn())
        assert stub.admitted == [] and stub.completions == 0
    assert "\n" not in str(e.value)


def test_model_choice():
    case = repeat_case()
    with StubVllm(follows(predicted(case)), models=("a", "b")) as stub:
        with pytest.raises(InvalidArgument, match=r"^--model=None: the server serves 2 models"):
            run(stub, case)
        with pytest.raises(InvalidArgument, match=r"^--model='c': not served; allowed: a, b"):
            run(stub, case, model="c")
        assert run(stub, case, model="a").verdict == AGREES


def test_soft_knob_difference_runs_but_is_inconclusive():
    case = repeat_case()  # retention_interval 0
    with StubVllm(
        follows(predicted(case)), cache_config=cache_config_labels(prefix_cache_retention_interval="None")
    ) as stub:
        rep = run(stub, case)
        assert len(stub.admitted) == 3
    assert rep.verdict == INCONCLUSIVE
    assert rep.reasons == ["server knob differs: retention_interval: case 0, server dense (null)"]


def test_spec_case_on_spec_server_lists_what_cannot_be_checked():
    case = make_case(hybrid(128, 128), [[("A", 300)], [("A", 300)]], MTP)
    with StubVllm(follows(predicted(case)), spec_positions=2) as stub:
        rep = run(stub, case)
    assert rep.verdict == AGREES, rep.reasons
    assert any(u.startswith("speculative.method=mtp") for u in rep.unverified)
    assert any(u.startswith("max_num_batched_tokens=8192") for u in rep.unverified)
    with StubVllm(follows(predicted(case)), spec_positions=3) as stub:
        rep = run(stub, case)
    assert rep.verdict == INCONCLUSIVE
    assert "server knob differs: num_speculative_tokens: case 2, server 3" in rep.reasons


# ---------------------------------------------------------------- rescale


def ref32(case):
    return predict(case, as_version="0.32.0")["hits"]


def test_rescale_keeps_boundary_classes_and_the_pattern():
    seed = make_case(
        hybrid(1600, 1600), [[("A", 11910)]] * 3 + [[("A", 3200)], [("A", 3201)], [("A", 4799)]], name="seed"
    )
    new, note = rescale_case(seed, 128, ref32)
    assert [r.num_prompt_tokens for r in new.trace] == [953, 953, 953, 256, 257, 383]
    assert {g.block_size for g in new.geometry.groups} == {128}
    assert [h / 128 for h in ref32(new)] == [h / 1600 for h in ref32(seed)]
    assert "predicted hits in blocks unchanged" in note and new.name == "seed@block128"


def test_rescale_keeps_the_shared_prefix_checkpoint():
    """The moved case is predicted with the geometry's other fields (before
    reference.rescale, the live rescale built a new Geometry and dropped
    ``shared_prefix_checkpoint``)."""
    seed = make_case(hybrid(1600, 1600), [[("A", 3300)], [("A", 3300), ("B", 900)]], name="seed")
    seed = replace(seed, geometry=replace(seed.geometry, shared_prefix_checkpoint=True))
    new, _ = rescale_case(seed, 128, ref32)
    assert new.geometry.shared_prefix_checkpoint is True


def test_rescale_refuses_mixed_block_sizes():
    case = make_case(hybrid(16, 32), [[("A", 100)]])
    with pytest.raises(Unsupported, match=r"^--rescale: geometry.groups block sizes=\[16, 32\]"):
        rescale_case(case, 128, ref32)


def test_rescale_through_replay_matches_a_server():
    seed = make_case(hybrid(1600, 1600), [[("A", 11910)]] * 3, name="seed")
    exp = ref32(rescale_case(seed, 128, ref32)[0])
    with StubVllm(follows(exp)) as stub:
        with pytest.raises(Unsupported):
            run(stub, seed)
        rep = run(stub, seed, rescale=True)
        assert [len(p) for p in stub.admitted] == [953, 953, 953]
    assert rep.verdict == AGREES
    assert any(n.startswith("rescaled block 1600 -> 128") for n in rep.notes)


# ---------------------------------------------------------------- deployment cases

#: A deployment as a user writes it (a shipped model on the CPU platform);
#: the stub plays a server of it whose block vLLM resolves to 128.
DEPLOYMENT = {
    "model": "qwen3_5",
    "vllm_args": ["--enable-prefix-caching", "--mamba-cache-mode", "align"],
    "platform": "cpu",
}


def deployment_case(prompts, name="dep"):
    from reference.case import parse_case

    return parse_case(
        {
            "schema": 1,
            "name": name,
            "deployment": DEPLOYMENT,
            "trace": [{"prompt": [{"segment": s, "length": n} for s, n in p]} for p in prompts],
        }
    )


def resolution(block=128, split=None, retention=0):
    """What an engine's resolve() returns, in the parts replay reads."""
    groups = [
        {"kind": "mamba", "block_size": block, "count": 3},
        {"kind": "full_attention", "block_size": block, "count": 1},
    ]
    return {
        "geometry": {
            "groups": groups,
            "hash_block_size": block,
            "prefix_match_unit": None,
            "scheduler_block_size": block,
            "retention_interval": retention,
            "max_num_batched_tokens": 8192,
            "split_block_size": split,
        },
        "speculative": None,
        "assumptions": ["engine core: a line the resolver wrote"],
    }


def test_a_deployment_case_is_resolved_on_the_servers_version_then_checked():
    case = deployment_case([[("A", 300)], [("A", 300)]])
    asked = []

    def resolve(c, version):
        asked.append((c.deployment.model, c.geometry, version))
        return resolution(128)

    with StubVllm(follows([0, 256])) as stub:
        rep = run(stub, case, resolve_fn=resolve)
    assert asked == [("qwen3_5", None, "0.32.0")]  # unresolved, on the server's version
    assert rep.verdict == AGREES, rep.reasons
    assert [r.target for r in rep.rows] == [0, 256]
    assert any(
        n.startswith(
            "deployment resolved by vllm==0.32.0 (the server's version): block 128, hash block 128, split block 128, retention sparse (0)"
        )
        for n in rep.notes
    ), rep.notes
    assert "resolution assumed: engine core: a line the resolver wrote" in rep.notes
    assert rep.case["resolved_by"] == "vllm==0.32.0" and rep.case["geometry"]["scheduler_block_size"] == 128
    assert (
        "split_block_size=128 (the block prefill chunks end on, as vLLM 0.32.0 resolves the deployment; not exposed by the server)"
        in rep.unverified
    )


def test_the_split_block_vllm_resolves_is_predicted_and_reported():
    """Block 256 split on 128 (vLLM's CPU engine core up to 0.32.0): a
    1,470-token prompt's chunk ends at 1408, so its resend misses: what
    vLLM's replay rule predicts with that split, and a departure from the
    promise (an identical resend is promised its last block)."""
    case = deployment_case([[("A", 1470)]] * 3)
    with StubVllm(follows([0, 0, 1280]), cache_config=cache_config_labels(block_size=256)) as stub:
        rep = run(stub, case, resolve_fn=lambda c, v: resolution(256, split=128), rule="replay")
    assert rep.verdict == AGREES, rep.reasons
    assert [r.target for r in rep.rows] == [0, 0, 1280]
    with StubVllm(follows([0, 0, 1280]), cache_config=cache_config_labels(block_size=256)) as stub:
        rep = run(stub, case, resolve_fn=lambda c, v: resolution(256, split=128))
    assert rep.verdict == DIVERGES and rep.reasons == ["request 1: observed hits 0, target 1280"]
    assert [r.implemented for r in rep.rows] == [0, 0, 1280]
    assert (
        "split_block_size=128 (the block prefill chunks end on, as vLLM 0.32.0 resolves the deployment; not exposed by the server)"
        in rep.unverified
    )
    with StubVllm(follows([0, 1280, 1280]), cache_config=cache_config_labels(block_size=256)) as stub:
        rep = run(stub, case, resolve_fn=lambda c, v: resolution(256, split=None), rule="replay")
    assert rep.verdict == AGREES, rep.reasons  # the same case where the split is the block
    assert (
        "split_block_size=256 (the block prefill chunks end on, as vLLM 0.32.0 resolves the deployment; not exposed by the server)"
        in rep.unverified
    )


def test_a_resolved_geometry_the_server_does_not_have_is_refused_before_sending():
    case = deployment_case([[("A", 300)]])
    with StubVllm() as stub:
        with pytest.raises(
            Unsupported, match=r"^geometry.groups\[0\].block_size=256: the server's block_size is 128"
        ) as e:
            run(stub, case, resolve_fn=lambda c, v: resolution(256))
        assert stub.admitted == [] and stub.completions == 0
    assert "\n" not in str(e.value)


def test_a_deployment_case_without_the_servers_engine_is_refused_in_one_line(monkeypatch, tmp_path, capsys):
    from engine_adapter.host import engine as engine_mod
    from engine_adapter.host import environments

    monkeypatch.setattr(environments, "is_ready", lambda version: False)
    monkeypatch.setattr(engine_mod, "inprocess_vllm_version", lambda: None)
    case = deployment_case([[("A", 300)]])
    with StubVllm() as stub:
        with pytest.raises(
            Unsupported,
            match=r"^case.deployment='qwen3_5': resolving it needs kvspec's engine of the server's vLLM version 0.32.0 \(.*\); allowed: kvspec engines install vllm==0.32.0, or a hand case$",
        ) as e:
            run(stub, case)
        path = tmp_path / "dep.json"
        path.write_text(json.dumps(case_to_dict(case)))
        assert cli_main(["replay", str(path), "--server", stub.url]) == 2
        assert stub.admitted == [] and stub.completions == 0
    assert "\n" not in str(e.value)
    err = capsys.readouterr().err
    assert err.startswith("kvspec: case.deployment='qwen3_5': resolving it needs") and err.count("\n") == 1
    with StubVllm(version="0.99.0") as stub:  # a version kvspec has no engine for
        with pytest.raises(
            Unsupported,
            match=r"^case.deployment='qwen3_5': resolving it needs kvspec's engine of the server's vLLM version 0.99.0",
        ):
            run(stub, case)
    with StubVllm(version=None) as stub:
        with pytest.raises(
            Unsupported,
            match=r"^server /version=unknown: resolving case.deployment='qwen3_5' needs the server's vLLM version",
        ):
            run(stub, case)


def test_a_deployment_case_is_not_rescaled():
    case = deployment_case([[("A", 300)]])
    with StubVllm() as stub:
        with pytest.raises(
            Unsupported,
            match=r"^--rescale: case.deployment='qwen3_5': a deployment's block is the one vLLM resolves for it",
        ):
            run(stub, case, rescale=True, resolve_fn=lambda c, v: resolution(128))
        assert stub.completions == 0


def test_a_case_resolved_by_another_version_says_so():
    from reference.case import with_resolution

    res = resolution(128)
    case = with_resolution(deployment_case([[("A", 300)], [("A", 300)]]), res["geometry"], None, "vllm==0.33.0")
    with StubVllm(follows([0, 256])) as stub:
        rep = run(stub, case, resolve_fn=lambda c, v: pytest.fail("a resolved case is not resolved again"))
    assert rep.verdict == AGREES, rep.reasons
    assert "geometry as vllm==0.33.0 resolved the deployment; the server runs vLLM 0.32.0" in rep.notes


# ---------------------------------------------------------------- findings


def finding(case, observed, expected=None, error=None):
    return {
        "kvspec_finding": 1,
        "oracle": "reference",
        "engine": {"version": "0.29.0", "knobs": {}},
        "expected": {"hits": expected if expected is not None else predicted(case), "detail": ""},
        "observed": {"hits": observed, "queries": [], "error": error},
        "case": case_to_dict(case),
    }


def test_finding_is_reproduced_when_the_server_shows_its_observed_hits(tmp_path):
    case = repeat_case()
    path = tmp_path / "f.json"
    path.write_text(json.dumps(finding(case, [0, 0, 0])))
    target = load_target(str(path))
    assert target.kind == "finding" and target.target == [0, 0, 0] and target.source_engine == "0.29.0"
    with StubVllm(follows([0, 0, 0])) as stub:
        assert replay(target, stub.url, **FAST).verdict == REPRODUCED
    with StubVllm(follows(predicted(case))) as stub:
        rep = replay(target, stub.url, **FAST)
    assert rep.verdict == NOT_REPRODUCED
    assert [r.expected for r in rep.rows] == [0, 256, 256]


def test_finding_with_an_engine_error_is_refused(tmp_path):
    path = tmp_path / "f.json"
    path.write_text(json.dumps(finding(repeat_case(), [], error={"type": "AssertionError", "message": "x"})))
    with pytest.raises(Unsupported, match=r"^finding.observed.error=AssertionError"):
        load_target(str(path))


def test_finding_with_a_short_observed_list_is_invalid(tmp_path):
    path = tmp_path / "f.json"
    path.write_text(json.dumps(finding(repeat_case(), [0])))
    with pytest.raises(InvalidArgument, match=r"^finding.observed="):
        load_target(str(path))


# ---------------------------------------------------------------- CLI and the API key


def write_case(tmp_path, case):
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case_to_dict(case)))
    return str(path)


def test_cli_exit_codes_and_json(tmp_path, capsys):
    case = repeat_case()
    path = write_case(tmp_path, case)
    with StubVllm(follows(predicted(case))) as stub:
        assert cli_main(["replay", path, "--server", stub.url, "--gap", "0", "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "verdict: agrees" in out and "target = reference prediction, rule promise, as vLLM 0.32.0" in " ".join(
        out.split()
    )
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verdict"] == "agrees" and [r["hits"] for r in report["requests"]] == [0, 256, 256]
    with StubVllm(follows([0, 0, 0])) as stub:
        assert cli_main(["replay", path, "--server", stub.url, "--gap", "0"]) == 1
    with StubVllm(follows(predicted(case)), faults=Faults(extra_queries_during={0: 5})) as stub:
        assert cli_main(["replay", path, "--server", stub.url, "--gap", "0"]) == 3
    with StubVllm() as stub:
        seed = write_case(tmp_path, make_case(hybrid(1600, 1600), [[("A", 100)]]))
        assert cli_main(["replay", seed, "--server", stub.url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvspec: geometry.groups[0].block_size=1600") and err.count("\n") == 1


def test_api_key_comes_from_the_named_variable_and_is_never_shown(tmp_path, capsys, monkeypatch):
    secret = "sk-kvspec-test-9f8e7d6c"
    case = repeat_case()
    path = write_case(tmp_path, case)
    out_json = tmp_path / "r.json"
    monkeypatch.setenv("KVSPEC_TEST_KEY", secret)
    with StubVllm(follows(predicted(case)), api_key=secret) as stub:
        assert (
            cli_main(
                [
                    "replay",
                    path,
                    "--server",
                    stub.url,
                    "--gap",
                    "0",
                    "--api-key-env",
                    "KVSPEC_TEST_KEY",
                    "--json",
                    str(out_json),
                ]
            )
            == 0
        )
        assert set(stub.seen_auth) == {f"Bearer {secret}"}
        # no key: refused by the server, one line, no key in it
        assert cli_main(["replay", path, "--server", stub.url, "--gap", "0"]) == 2
        # the wrong key: same
        monkeypatch.setenv("KVSPEC_WRONG", "sk-wrong-123456")
        assert cli_main(["replay", path, "--server", stub.url, "--gap", "0", "--api-key-env", "KVSPEC_WRONG"]) == 2
    monkeypatch.delenv("KVSPEC_UNSET", raising=False)
    assert cli_main(["replay", path, "--server", "http://127.0.0.1:9", "--api-key-env", "KVSPEC_UNSET"]) == 2
    assert cli_main(["replay", path, "--server", "http://127.0.0.1:9", "--api-key-env", "not a name"]) == 2
    captured = capsys.readouterr()
    text = captured.out + captured.err + out_json.read_text()
    assert secret not in text and "sk-wrong-123456" not in text
    assert "status=401" in captured.err
    assert "--api-key-env=KVSPEC_UNSET: the variable is unset or empty" in captured.err


def test_render_marks_issues(capsys):
    case = repeat_case()
    with StubVllm(follows(predicted(case)), faults=Faults(extra_queries_during={2: 9})) as stub:
        rep = run(stub, case)
    from rich.console import Console

    render(rep, Console(width=200, force_terminal=False))
    out = capsys.readouterr().out
    assert "verdict: inconclusive" in out
    assert "! query delta 1009 != prompt length 1000" in out


def test_engine_flag_delegates_to_fuzz_replay(tmp_path, monkeypatch, capsys):
    calls = []
    fake = types.ModuleType("fuzz.replaying.replay")
    fake.replay_on_engine = lambda path, engine: calls.append((path, engine)) or {"verdict": "agrees", "rows": []}
    fake.render_replay = lambda result, console: console.print("rendered " + result["verdict"])
    monkeypatch.setitem(sys.modules, "fuzz.replaying.replay", fake)
    path = write_case(tmp_path, repeat_case())
    assert cli_main(["replay", path, "--engine", "vllm==0.33.0"]) == 0
    assert calls == [(path, EngineSpec("vllm", "0.33.0"))]  # the typed engine, not its name to read again
    assert "rendered agrees" in capsys.readouterr().out
    assert cli_main(["replay", path, "--engine", "vllm==0.33.0", "--model", "x"]) == 2
    fake2 = types.ModuleType("fuzz.replaying.replay")
    monkeypatch.setitem(sys.modules, "fuzz.replaying.replay", fake2)
    assert cli_main(["replay", path, "--engine", "vllm==0.33.0"]) == 2
    assert "in-process replay is not available" in capsys.readouterr().err


def test_server_and_engine_are_exclusive(tmp_path):
    path = write_case(tmp_path, repeat_case())
    with pytest.raises(SystemExit):
        cli_main(["replay", path])
    with pytest.raises(SystemExit):
        cli_main(["replay", path, "--server", "http://127.0.0.1:9", "--engine", "vllm==0.33.0"])


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--gap", "-1"], "--gap=-1.0"),
        (["--timeout", "0"], "--timeout=0.0"),
        (["--server", "ftp://x"], "--server='ftp://x'"),
    ],
)
def test_bad_flags_are_one_line(tmp_path, capsys, argv, match):
    path = write_case(tmp_path, repeat_case())
    full = ["replay", path, *(["--server", "http://127.0.0.1:9"] if "--server" not in argv else []), *argv]
    assert cli_main(full) == 2
    assert match in capsys.readouterr().err


def test_credentials_in_the_url_are_never_shown(capsys):
    from engine_adapter.live.measure import redact_url

    assert redact_url("http://user:s3cret@127.0.0.1:8000/x") == "http://127.0.0.1:8000/x"
    assert redact_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    case = repeat_case()
    with StubVllm(follows(predicted(case))) as stub:
        url = stub.url.replace("http://", "http://user:s3cret@")
        rep = replay(LiveTarget(case, "case", None, None), url, **FAST)
    from rich.console import Console

    render(rep, Console(width=200))
    assert "s3cret" not in capsys.readouterr().out and "s3cret" not in json.dumps(rep.as_dict())


def test_rule_of_the_target_and_the_implemented_rule_beside_it():
    # vLLM 0.30-0.33 keep the replay boundary (N-1 floored), not the prompt
    # end: a block-aligned prompt's one-token extension resumes a block early
    case = make_case(hybrid(128, 128), [[("E", 1280)], [("E", 1281)]], name="aligned-extension")
    assert predicted(case) == [0, 1280]
    assert predict(case, as_version="0.32.0", rule="replay")["hits"] == [0, 1152]
    with StubVllm(follows([0, 1152])) as stub:
        rep = run(stub, case)
        assert rep.verdict == DIVERGES and rep.implemented_rule == "replay"
        assert [r.implemented for r in rep.rows] == [0, 1152] and [r.target for r in rep.rows] == [0, 1280]
    with StubVllm(follows([0, 1152])) as stub:
        rep = run(stub, case, rule="replay")
        assert rep.verdict == AGREES and rep.implemented_rule is None
        with pytest.raises(InvalidArgument, match=r"^--rule='bogus'"):
            run(stub, case, rule="bogus")
        assert len(stub.admitted) == 2


# ---------------------------------------------------------------- kvspec report --live


def test_report_quotes_a_live_replay_report(tmp_path):
    """ISSUE.md's live section reads what ``kvspec replay --server --json``
    writes (``fuzz.results.report.live_summary``, used by ``kvspec report --live``):
    the verdict, the server's version and knobs, the hits per request, the
    assumptions; a document of another shape is one line."""
    from fuzz.results.findings import load_finding
    from fuzz.results.report import bundle, live_summary

    case = repeat_case()
    fpath = tmp_path / "f.json"
    fpath.write_text(json.dumps(finding(case, [0, 0, 0])))
    rpath = tmp_path / "live.json"
    with StubVllm(follows([0, 0, 0])) as stub:
        assert cli_main(["replay", str(fpath), "--server", stub.url, "--gap", "0", "--json", str(rpath)]) == 0
    _, record = load_finding(fpath)
    record["signature"] = "0123456789abcdef"  # a report names its files by it (kvspec writes one into every finding)
    live = live_summary(json.loads(rpath.read_text()), str(rpath), 3)
    issue = bundle(record, live=live)["ISSUE.md"]
    section = issue[issue.index("## Live server") :]
    section = section[: section.index("\n## ", 3)]
    assert (
        "Replayed against a running vLLM 0.32.0 OpenAI server (model `stub-model`; block_size=128, hash_block_size=128, retention_interval=0"
        in section
    )
    assert "verdict **reproduced** (the server shows the finding's observed hits at every request)" in section
    assert "| 1 | 300 | 256 | 0 | 0 |" in section and "| 2 | 1000 | 256 | 0 | 0 |" in section
    assert (
        "Not exposed by the server, assumed as the case states: max_num_batched_tokens=8192; split_block_size=128 (the block prefill chunks end on, the smallest group block: a hand case); KV cache groups=4."
        in section
    )
    for bad, says in (
        ({"verdict": "agrees", "rows": []}, "kvspec replay --server --json"),
        ({"verdict": "agrees", "requests": [{}]}, "for the finding's case (3 requests; the report has 1)"),
    ):
        with pytest.raises(InvalidArgument, match="^--live=") as e:
            live_summary(bad, "bad.json", 3)
        assert says in str(e.value) and "\n" not in str(e.value)
