"""Live replay against hostile or broken servers (issue 10, point 7), on the
loopback stub: a body trickled a byte at a time is cut at --timeout (wall
clock, not httpx's per-read timeout), the API key echoed back in an error
body or in /metrics never reaches output or the --json report, and garbage
/metrics after a request was sent is an inconclusive verdict with a report
(exit 3), not a refusal. Also: bad --server URLs and non-finite --gap /
--timeout values are one line, exit 2.
"""

from __future__ import annotations

import json
import time

import pytest

from engine_adapter.live.client import LiveClient, LiveError, LiveTimeout, check_base_url, redact, split_lines
from fuzz.replaying.live_replay import INCONCLUSIVE, LiveTarget, replay
from ground.errors import InvalidArgument, KvspecError
from kvspec.cli import main as cli_main
from reference.case import case_to_dict
from tests.conftest import hybrid, make_case
from tests.live.stub_server import Faults, StubVllm
from tests.live.test_replay_unit import FAST, follows, predicted, repeat_case

SECRET = "sk-kvspec-echo-7d1c0ffee"


def write_case(tmp_path, case) -> str:
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case_to_dict(case)))
    return str(path)


# ---------------------------------------------------------------- slow bodies


def test_a_trickled_get_body_is_cut_at_the_wall_clock_timeout():
    # /metrics is ~2.5 kB: at 0.2 s a byte it would take ~10 minutes; every
    # single read returns well within httpx's per-read timeout
    with StubVllm(faults=Faults(trickle_s={"/metrics": 0.2})) as stub:
        client = LiveClient(stub.url, timeout_s=1.5, retries=2)
        t0 = time.monotonic()
        with pytest.raises(LiveTimeout, match=r"^timeout_s=1.5: GET /metrics did not finish in time"):
            client.metrics_text()
        took = time.monotonic() - t0
        client.close()
    assert took < 2.5, took  # one deadline for the request, retries included


def test_a_trickled_completion_stream_is_cut_and_the_run_is_inconclusive():
    case = repeat_case()
    with StubVllm(follows(predicted(case)), faults=Faults(trickle_s={"/v1/completions": 0.2})) as stub:
        t0 = time.monotonic()
        rep = replay(LiveTarget(case, "case", None, None), stub.url, **{**FAST, "timeout_s": 2.0})
        took = time.monotonic() - t0
    assert rep.verdict == INCONCLUSIVE
    assert any("timeout_s=2.0: POST /v1/completions did not finish in time" in r for r in rep.reasons)
    assert rep.rows[1].sent is False
    assert took < 5, took


def test_cli_replay_of_a_trickling_server_ends_near_its_timeout(tmp_path, capsys):
    """The issue's case: one byte every 0.5 s hung `replay --timeout 5` past 90 s."""
    path = write_case(tmp_path, repeat_case())
    with StubVllm(faults=Faults(trickle_s={"/v1/models": 0.5})) as stub:
        t0 = time.monotonic()
        assert cli_main(["replay", path, "--server", stub.url, "--timeout", "2", "--gap", "0"]) == 2
        took = time.monotonic() - t0
    err = capsys.readouterr().err
    assert err.startswith("kvspec: timeout_s=2.0: GET /v1/models did not finish in time") and err.count("\n") == 1
    assert took < 4, took


def test_a_stream_line_without_end_is_bounded():
    with pytest.raises(LiveError, match="a line longer than 8 bytes"):
        list(split_lines([b"data: 1\n", b"x" * 5, b"y" * 5], limit=8))
    assert list(split_lines([b"da", b"ta: 1\r\nda", b"ta: 2\n", b"tail"])) == ["data: 1", "data: 2", "tail"]


# ---------------------------------------------------------------- the key


def test_redact_covers_every_form_of_the_key():
    key = 'sk-"odd\\key/+='
    text = f"raw {key} json {json.dumps(key)[1:-1]} repr {key!r} url sk-%22odd%5Ckey%2F%2B%3D header Authorization: Bearer other-token"
    out = redact(text, key)
    assert "odd" not in out and "other-token" not in out
    assert out.count("[redacted]") == 5
    assert redact("Bearer [redacted] stays", None) == "Bearer [redacted] stays"
    assert redact("no key here", SECRET) == "no key here"


def _assert_no_key(*texts: str) -> None:
    for text in texts:
        assert SECRET not in text
        assert SECRET[3:15] not in text  # not even a cut-off piece of it


def test_key_echoed_in_an_error_body_is_redacted_in_output_and_report(tmp_path, capsys, monkeypatch):
    case = repeat_case()
    path = write_case(tmp_path, case)
    report = tmp_path / "report.json"
    monkeypatch.setenv("KVSPEC_ECHO_KEY", SECRET)
    echo = json.dumps({"error": {"message": f"rejected header 'Authorization: Bearer {SECRET}' (key {SECRET})"}})
    faults = Faults(status={1: [500]}, status_body={1: echo})
    with StubVllm(follows(predicted(case)), api_key=SECRET, faults=faults) as stub:
        rc = cli_main(
            [
                "replay",
                path,
                "--server",
                stub.url,
                "--gap",
                "0",
                "--api-key-env",
                "KVSPEC_ECHO_KEY",
                "--json",
                str(report),
            ]
        )
        assert set(stub.seen_auth) == {f"Bearer {SECRET}"}  # the real key was sent
    assert rc == 3
    out = capsys.readouterr()
    saved = report.read_text()
    _assert_no_key(out.out, out.err, saved)
    reasons = json.loads(saved)["reasons"]
    assert any("status=500" in r and "Bearer [redacted]" in r and "(key [redacted])" in r for r in reasons), reasons


def test_key_echoed_in_metrics_is_redacted(tmp_path, capsys, monkeypatch):
    case = repeat_case()
    path = write_case(tmp_path, case)
    report = tmp_path / "report.json"
    monkeypatch.setenv("KVSPEC_ECHO_KEY", SECRET)
    # after the first request, /metrics turns into an echo of the request
    faults = Faults(metrics_garbage_after=1, metrics_garbage=f"Authorization: Bearer {SECRET}\n")
    with StubVllm(follows(predicted(case)), api_key=SECRET, faults=faults, models=(f"model-{SECRET}",)) as stub:
        rc = cli_main(
            [
                "replay",
                path,
                "--server",
                stub.url,
                "--gap",
                "0",
                "--api-key-env",
                "KVSPEC_ECHO_KEY",
                "--json",
                str(report),
            ]
        )
    assert rc == 3
    out = capsys.readouterr()
    saved = report.read_text()
    _assert_no_key(out.out, out.err, saved)
    data = json.loads(saved)
    assert data["model"] == "model-[redacted]"
    assert any("metrics after the request unreadable" in r and "[redacted]" in r for r in data["reasons"]), data[
        "reasons"
    ]


def test_key_echoed_in_metrics_before_anything_was_sent(tmp_path, capsys, monkeypatch):
    path = write_case(tmp_path, repeat_case())
    monkeypatch.setenv("KVSPEC_ECHO_KEY", SECRET)
    faults = Faults(metrics_garbage_after=0, metrics_garbage=f"{SECRET} is not allowed here\n")
    with StubVllm(api_key=SECRET, faults=faults) as stub:
        assert cli_main(["replay", path, "--server", stub.url, "--api-key-env", "KVSPEC_ECHO_KEY"]) == 2
        assert stub.completions == 0
    err = capsys.readouterr().err
    _assert_no_key(err)
    assert err.startswith("kvspec: metrics='[redacted] is not allowed here") and err.count("\n") == 1


# ---------------------------------------------------------------- garbage metrics


def test_garbage_metrics_after_a_request_is_inconclusive_with_a_report(tmp_path, capsys):
    case = repeat_case()
    path = write_case(tmp_path, case)
    report = tmp_path / "report.json"
    with StubVllm(follows(predicted(case)), faults=Faults(metrics_garbage_after=1)) as stub:
        assert cli_main(["replay", path, "--server", stub.url, "--gap", "0", "--json", str(report)]) == 3
        assert len(stub.admitted) == 1  # it stopped there
    out = capsys.readouterr().out
    assert "verdict: inconclusive" in out
    data = json.loads(report.read_text())
    assert data["verdict"] == "inconclusive"
    assert data["reasons"][0].startswith(
        "request 0: metrics after the request unreadable: metrics='<html>this is not Prometheus text"
    )
    assert "request 1: not sent" in data["reasons"] and "request 2: not sent" in data["reasons"]


def test_garbage_metrics_between_requests_is_inconclusive_too():
    case = repeat_case()
    calls = {"n": 0}
    with StubVllm(follows(predicted(case))) as stub:

        def break_metrics(i):
            if i == 0:
                stub.faults.metrics_garbage_after = 1  # from the scrape before request 1 on
            calls["n"] += 1

        rep = replay(LiveTarget(case, "case", None, None), stub.url, after_request=break_metrics, **FAST)
    assert rep.verdict == INCONCLUSIVE
    assert any(r.startswith("request 1: metrics before the request unreadable") for r in rep.reasons), rep.reasons


# ---------------------------------------------------------------- options


@pytest.mark.parametrize(
    "url, says",
    [
        ("http://[::1", "is not a valid URL"),
        ("http://127.0.0.1:abc", "is not a valid URL"),
        ("http://127.0.0.1:70000", "is not a valid URL"),
        ("http://127.0.0.1:0", "port 0"),
        ("http://[zz::1]:80", "is not a valid URL"),
        ("http://[fe80::1]:80", None),
        ("http://", "has no host"),
        ("ftp://x", "must be an http:// or https:// URL"),
        ("http://h:1/x?y=1", "has a query or fragment"),
        ("http://a b", "no spaces"),
        ("http://user:pw-s3cret@[::1", "is not a valid URL"),
    ],
)
def test_bad_server_urls_are_one_line(tmp_path, capsys, url, says):
    if says is None:
        assert check_base_url(url) == url
        return
    path = write_case(tmp_path, repeat_case())
    assert cli_main(["replay", path, "--server", url, "--timeout", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvspec: --server=") and err.count("\n") == 1 and says in err, err
    assert "pw-s3cret" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--gap=nan"],
        ["--gap=inf"],
        ["--gap=-1"],
        ["--timeout=nan"],
        ["--timeout=-5"],
        ["--timeout=inf"],
        ["--timeout=0"],
    ],
)
def test_non_finite_or_negative_seconds_are_one_line(tmp_path, capsys, argv):
    path = write_case(tmp_path, repeat_case())
    assert cli_main(["replay", path, "--server", "http://127.0.0.1:9", *argv]) == 2
    err = capsys.readouterr().err
    flag = argv[0].split("=")[0]
    assert err.startswith(f"kvspec: {flag}=") and err.count("\n") == 1


def test_replay_api_refuses_nan_too():
    with pytest.raises(InvalidArgument, match=r"^--gap=nan"):
        replay(LiveTarget(repeat_case(), "case", None, None), "http://127.0.0.1:9", gap_s=float("nan"))
    with pytest.raises(InvalidArgument, match=r"^--timeout=nan"):
        replay(LiveTarget(repeat_case(), "case", None, None), "http://127.0.0.1:9", timeout_s=float("nan"))


def test_json_report_path_is_checked_before_anything_is_sent(tmp_path, capsys):
    path = write_case(tmp_path, repeat_case())
    afile = tmp_path / "f"
    afile.write_text("x")
    with StubVllm() as stub:
        assert cli_main(["replay", path, "--server", stub.url, "--json", str(afile / "r.json")]) == 2
        assert cli_main(["replay", path, "--server", stub.url, "--json", str(tmp_path)]) == 2
        assert stub.completions == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and all(line.startswith("kvspec: --json=") for line in err.splitlines())


def test_an_odd_completion_stream_is_an_error_not_a_traceback():
    """Chunks that are JSON but not completion objects: no AttributeError."""
    from engine_adapter.live.client import _finish_reason

    assert _finish_reason([1, 2]) is None
    assert _finish_reason({"choices": "x"}) is None
    assert _finish_reason({"choices": [1, {"finish_reason": "length"}]}) == "length"


def test_errors_stay_kvspec_errors():
    case = make_case(hybrid(128, 128), [[("A", 10)]])
    with StubVllm(faults=Faults(metrics_garbage_after=0)) as stub:
        with pytest.raises(KvspecError, match=r"^metrics='<html>"):
            replay(LiveTarget(case, "case", None, None), stub.url, **FAST)
