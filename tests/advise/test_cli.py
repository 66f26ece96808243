"""``kvspec advise`` on the command line: a hand geometry end to end
without an engine (--no-confirm), and bad input as one line with exit 2
before any engine starts."""

from __future__ import annotations

import json

import pytest

from ground.engines import EngineSpec
from kvspec.cli import main

SEED = "examples/seed-53504.json"  # a hand geometry: no engine needed to resolve it


def _run(capsys, *argv):
    code = main(["advise", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_hand_geometry_without_engine_writes_json_and_chart(capsys, tmp_path):
    code, out, err = _run(capsys, SEED, "--engine", "vllm==0.29.0", "--no-confirm", "--out", str(tmp_path), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [r["implemented"] for r in doc["requests"]] == [0, 0, 9600]  # the case's own trace: 11910 x 3 (#53504)
    assert doc["confirm"] is None and doc["confirm_skipped"] == "--no-confirm"
    assert json.loads((tmp_path / "advice.json").read_text()) == doc
    assert (tmp_path / "advice.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rich_output_names_the_recommendation(capsys, tmp_path):
    code, out, err = _run(
        capsys,
        SEED,
        "--engine",
        "vllm==0.29.0",
        "--workload",
        "resend",
        "--requests",
        "3",
        "--prompt-tokens",
        "11910",
        "--no-confirm",
        "--out",
        str(tmp_path),
    )
    assert code == 0, err
    assert "Recommended: --prefix-cache-retention-interval 3200" in out
    assert "Lost reuse: 9,600 tokens" in out
    assert (
        "Cost (fuzz/results/cost.py, docs/cost.md): lost reuse: 9,600 token(s) recomputed (no model: tokens only); memory: per retention setting"
        in " ".join(out.split())
    )


def test_the_workload_cost_is_a_finding_s_cost(capsys, tmp_path):
    """tokens recomputed, seconds on a named GPU and severity per workload,
    by fuzz/results/cost.py's arithmetic (the #53504 trace on a hand geometry:
    tokens only; a deployment: the hand-checked 1,360 tokens of docs/cost.md)."""
    from fuzz.results.impact import workload_cost

    code, out, err = _run(capsys, SEED, "--engine", "vllm==0.29.0", "--no-confirm", "--out", str(tmp_path), "--json")
    cost = json.loads(out)["cost"]
    assert (
        code == 0
        and cost["severity"] == "lost reuse"
        and cost["tokens_total"] == 9600
        and cost["prefill_seconds"] is None
    )
    assert [r["request"] for r in cost["tokens_per_request"]] == [1]
    cost = workload_cost([0, 0], [0, 1360], {"model": "qwen3_next", "vllm_args": [], "device": "a100"}, {})
    assert cost["tokens_total"] == 1360 and cost["flops"] == 9_024_975_667_200 and cost["device"] == "a100"
    assert cost["prefill_seconds"]["h100"] == pytest.approx(0.022813, rel=1e-4) and cost["prefill_seconds"][
        "a100"
    ] == pytest.approx(9_024_975_667_200 / (312e12 * 0.4))
    assert (
        workload_cost([0, 1360], [0, 1360], {"model": "qwen3_next", "vllm_args": ["-tp", "2"]}, {})["severity"]
        == "none"
    )
    assert (
        workload_cost([0, 1360], [0, 1360], {"model": "qwen3_next", "vllm_args": ["-tp", "2"]}, {})["tensor_parallel"]
        == 2
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        ((SEED, "--workload", "chats"), "kvspec: --workload='chats': allowed: resend, chat, agent, rag, interleaved"),
        ((SEED, "--workload", "chat", "--documents", "2"), "kvspec: --documents=2: not an option of --workload chat"),
        (
            (SEED, "--workload", "resend", "--requests", "5000", "--confirm"),
            "kvspec: --confirm=True: the workload has 5,000 requests; confirmed at most 1,000",
        ),
        (("--model", "qwen3_next"), "kvspec: --workload=None: give a workload"),
        (
            ("--server", "http://127.0.0.1:9", "--engine", "vllm==0.33.0", "--workload", "resend"),
            "kvspec: --engine='vllm==0.33.0': with --server the server's own vLLM version applies",
        ),
        ((SEED, "--model", "qwen3_next", "--workload", "resend"), "kvspec: source="),
        (
            (SEED, "--workload", "resend", "--timeout", "nan"),
            "kvspec: --timeout=nan: must be a finite number of seconds",
        ),
        (
            (SEED, "--engine", "vllm==0.31.0", "--workload", "resend", "--no-confirm"),
            "kvspec: --engine='vllm==0.31.0': vLLM 0.31.0 has no kvspec engine environment",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, tmp_path, argv, message):
    code, out, err = _run(capsys, *argv, "--out", str(tmp_path))
    assert code == 2
    assert err.startswith(message), err
    assert err.count("\n") == 1 and out == ""


def test_malformed_trace_file(capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"tokens": 100}\n{"tokens": 50, "shares": {"request": 0, "tokens": 80}}\n')
    code, out, err = _run(capsys, SEED, "--trace", str(trace), "--out", str(tmp_path))
    assert code == 2
    assert err == "kvspec: --trace line 2.shares.tokens=80: must be an integer in [0, 50]\n"


def test_server_unreachable(capsys, tmp_path):
    code, out, err = _run(
        capsys, "--server", "http://127.0.0.1:9", "--workload", "resend", "--timeout", "5", "--out", str(tmp_path)
    )
    assert code == 2
    assert err.startswith("kvspec: --server=http://127.0.0.1:9: ") and "refused" in err
    assert err.count("\n") == 1


def test_a_prompt_longer_than_max_model_len(capsys, tmp_path, monkeypatch):
    """A request vLLM would refuse is refused here too (the server's or the
    deployment's max_model_len)."""
    from advise import source

    real = source.Source

    def fake_server(url, **kw):
        case = __import__("reference.case", fromlist=["load_case"]).load_case(SEED)
        return real(
            "server",
            EngineSpec("vllm", "0.33.0"),
            case.geometry,
            case.speculative,
            {"max_model_len": 4096},
            [],
            describe="stub",
        )

    monkeypatch.setattr(source, "from_server", fake_server)
    code, out, err = _run(capsys, "--server", "http://127.0.0.1:9", "--workload", "resend", "--no-confirm")
    assert code == 2
    assert err.startswith(
        "kvspec: workload request 0='<8,001 tokens with max_tokens>': above the deployment's max_model_len=4,096"
    )


def test_a_server_geometry_end_to_end(capsys, tmp_path):
    """``--server``: the geometry read from a (stub) server's /metrics, its
    version from /version; what the server does not expose is listed as
    assumed; no engine when --no-confirm."""
    from tests.live.stub_server import StubVllm, cache_config_labels

    with StubVllm(
        cache_config=cache_config_labels(block_size="256", prefix_cache_retention_interval="0"), version="0.33.0"
    ) as stub:
        code, out, err = _run(
            capsys,
            "--server",
            stub.url,
            "--workload",
            "resend",
            "--prompt-tokens",
            "1000",
            "--no-confirm",
            "--out",
            str(tmp_path),
            "--json",
        )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["source"]["kind"] == "server" and doc["source"]["engine"] == "vllm==0.33.0"
    assert doc["source"]["geometry"]["scheduler_block_size"] == 256
    assert any("max_num_batched_tokens" in a for a in doc["source"]["assumptions"])
    assert [r["implemented"] for r in doc["requests"]] == [0, 768, 768]
    assert doc["retention"]["memory"]["per_gpu"] is None  # a server exposes no Mamba page


# ------------------------------------------------------------ the API key, read-only and full disks (issue 29)

SECRET = "sk-advise-test-4f1c9"


@pytest.mark.parametrize(
    "argv",
    [
        ("--server", "http://127.0.0.1:9", "--workload", "resend", "--api-key", SECRET),
        ("--server", "http://127.0.0.1:9", "--workload", "resend", f"--api-key={SECRET}"),
        (SEED, "--workload", "resend", "--api-key", SECRET),
    ],
)
def test_a_key_on_the_command_line_is_refused_without_showing_it(capsys, tmp_path, argv):
    code, out, err = _run(capsys, *argv, "--out", str(tmp_path))
    assert code == 2 and out == ""
    assert (
        err.startswith("kvspec: --api-key: a key on the command line is readable by every local user")
        and "--api-key-env NAME" in err
    )
    assert SECRET not in err and err.count("\n") == 1


def test_the_key_comes_from_the_environment_variable_named(capsys, tmp_path, monkeypatch):
    """--api-key-env NAME: the server gets the key; without it, or with the
    variable unset, the server refuses / kvspec says so in one line naming
    the variable, never a value."""
    from tests.live.stub_server import StubVllm, cache_config_labels

    monkeypatch.setenv("ADVISE_TEST_KEY", SECRET)
    monkeypatch.delenv("ADVISE_TEST_UNSET", raising=False)
    with StubVllm(
        cache_config=cache_config_labels(block_size="256", prefix_cache_retention_interval="0"),
        version="0.33.0",
        api_key=SECRET,
    ) as stub:
        base = (
            "--server",
            stub.url,
            "--workload",
            "resend",
            "--prompt-tokens",
            "1000",
            "--no-confirm",
            "--out",
            str(tmp_path),
            "--json",
        )
        code, out, err = _run(capsys, *base, "--api-key-env", "ADVISE_TEST_KEY")
        assert code == 0, err
        assert json.loads(out)["source"]["geometry"]["scheduler_block_size"] == 256
        assert SECRET not in out + (tmp_path / "advice.json").read_text()
        code, out, err = _run(capsys, *base, "--api-key-env", "ADVISE_TEST_UNSET")
        assert (
            (code, out) == (2, "")
            and err
            == "kvspec: --api-key-env=ADVISE_TEST_UNSET: the variable is unset or empty; allowed: a set, non-empty variable\n"
        )
        code, out, err = _run(capsys, *base, "--timeout", "5")
        assert code == 2 and SECRET not in err and err.count("\n") == 1


def test_api_key_env_needs_a_server(capsys, tmp_path):
    code, out, err = _run(capsys, SEED, "--workload", "resend", "--api-key-env", "X", "--out", str(tmp_path))
    assert code == 2 and err == "kvspec: --api-key-env='X': only with --server\n"


def _refusing_writer(err):
    """A test double for the atomic writer: the disk refuses (full, read-only)."""

    def write(path, data):
        raise OSError(err, __import__("os").strerror(err))

    return write


@pytest.mark.parametrize(
    "flag, err",
    [
        ("--out", __import__("errno").ENOSPC),
        ("--out", __import__("errno").EROFS),
        ("--chart", __import__("errno").ENOSPC),
    ],
)
def test_a_full_or_read_only_disk_is_one_line_and_nothing_half_written(capsys, tmp_path, monkeypatch, flag, err):
    import os

    import advise.chart
    import ground.files

    monkeypatch.setattr(ground.files, "write_bytes_atomic", _refusing_writer(err))
    monkeypatch.setattr(advise.chart, "write_bytes_atomic", _refusing_writer(err))
    out = tmp_path / "out"
    chart = tmp_path / "c.png"
    argv = [SEED, "--engine", "vllm==0.29.0", "--no-confirm", "--out", str(out)] + (
        ["--chart", str(chart)] if flag == "--chart" else []
    )
    code, stdout, stderr = _run(capsys, *argv)
    assert code == 2 and stdout == ""
    path = chart if flag == "--chart" else out / "advice.png"
    assert (
        stderr
        == f"kvspec: {flag}={str(path)!r}: cannot be written ({os.strerror(err)}); allowed: a writable folder with room\n"
    )
    assert not (out / "advice.json").exists() and not path.exists()


def test_a_case_s_text_reaches_the_terminal_without_control_characters(capsys, tmp_path, recwarn):
    """A case file's name (shown as the source) with a screen clear, an OSC 8
    hyperlink and a bidi override: printed without them."""
    import re

    case = json.loads(open(SEED).read())
    case["name"] = "seed\x1b[2J\x1b]8;;http://evil.example/\x1b\\link\x1b]8;;\x1b\\\u202eevil"
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(case))
    code, out, err = _run(capsys, str(path), "--engine", "vllm==0.29.0", "--no-confirm", "--out", str(tmp_path / "out"))
    assert code == 0, err
    assert "seedlinkevil" in out
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", out + err)
    assert not [w for w in recwarn if "missing from font" in str(w.message)], (
        "a control character reached the chart's title"
    )
