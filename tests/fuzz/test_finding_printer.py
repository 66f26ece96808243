"""One finding printer (issue 41, item 5) for every family and segment kind:
a prompt quoting an earlier output (``{"output": j}``) and an SGLang
deployment (``sglang_args``) print, in ``fuzz.results.findings.render`` (``kvspec
findings``, ``check-build``'s counterexamples), ``fuzz.draw.generate.describe``
and ``fuzz.results.report``'s ISSUE.md. Before, check-build crashed printing such a
counterexample (``KeyError: 'segment'``, ``KeyError: 'vllm_args'``)."""

from __future__ import annotations

import json

import pytest

from fuzz.replaying.checkbuild import EXIT_FAIL, BuildReport
from fuzz.replaying.checkbuild import render as render_build
from fuzz.results.finding_text import deployment_text, prompt_text
from fuzz.results.findings import render
from reference.case import case_to_dict, parse_case

CHAT_TRACE = [
    {"prompt": [{"segment": "A", "length": 40}], "max_tokens": 30},
    {"prompt": [{"segment": "A", "length": 40}, {"output": 0}, {"segment": "B", "length": 20}]},
]
DEPLOYMENTS = {
    "vllm": {"model": "qwen3_next", "vllm_args": ["--enable-prefix-caching"], "platform": "cuda", "device": "a100"},
    "sglang": {
        "model": "qwen3_next",
        "engine": "sglang",
        "sglang_args": ["--mamba-radix-cache-strategy", "extra_buffer"],
    },
}
ENGINES = {"vllm": ("0.33.0", "vllm==0.33.0"), "sglang": ("sglang==0.5.23", "sglang==0.5.23")}


def chat_finding(family: str) -> dict:
    """A finding as kvspec writes one (the fields render reads), on a chat
    trace of ``family``'s deployment."""
    case = parse_case({"schema": 1, "name": "chat", "deployment": DEPLOYMENTS[family], "trace": CHAT_TRACE})
    version, name = ENGINES[family]
    return {
        "kvspec_finding": 2,
        "signature": "0123456789abcdef",
        "oracle": "promise",
        "summary": "request 1 (extension) hit 0, spec says 64",
        "engine": {"name": name, "version": version, "knobs": {}},
        "first_divergence": 1,
        "diverging_requests": [1],
        "expected": {"hits": [0, 64], "detail": ""},
        "observed": {"hits": [0, 0]},
        "case": case_to_dict(case),
    }


@pytest.mark.parametrize("family", ["vllm", "sglang"])
def test_a_chat_finding_of_either_family_prints_its_inputs(family):
    text = render(chat_finding(family))
    assert f"on {ENGINES[family][1]}" in text.splitlines()[0]
    assert "request 1: A:40 + out0 + B:20" in text
    serve = {
        "vllm": "vllm serve --enable-prefix-caching",
        "sglang": "python -m sglang.launch_server --mamba-radix-cache-strategy extra_buffer",
    }[family]
    assert "deployment: qwen3_next on cuda/" in text and serve in text
    assert text.index("inputs:") < text.index("request  expected  observed") < text.index("<- first divergence")


def test_the_part_printers_name_every_segment_kind():
    prompt = CHAT_TRACE[1]["prompt"]
    assert prompt_text(prompt) == "A:40 + out0 + B:20"
    assert prompt_text(prompt, style="prose") == "A[:40] + output of 0 + B[:20]"
    assert deployment_text(DEPLOYMENTS["sglang"] | {"platform": "cuda", "device": "h100"}).endswith(
        "python -m sglang.launch_server --mamba-radix-cache-strategy extra_buffer"
    )


@pytest.mark.parametrize("family", ["vllm", "sglang"])
def test_check_build_prints_a_chat_counterexample(family, tmp_path):
    """check-build's text report with a failing promise whose first
    counterexample quotes an earlier output: the counterexample is printed
    whole (it crashed with KeyError before)."""
    path = tmp_path / "promise-0123456789abcdef.json"
    path.write_text(json.dumps(chat_finding(family)))
    report = BuildReport(
        engine=ENGINES[family][1],
        rows=[{"promise": "R2", "name": "longer sibling", "verdict": "FAIL"}],
        counterexamples={"R2": str(path)},
        exit_code=EXIT_FAIL,
        reason="promise(s) broken: R2",
    )
    text = "\n".join(render_build(report))
    assert "cannot read it" not in text
    assert "first counterexample for R2" in text and "  request 1: A:40 + out0 + B:20" in text
    assert text.rstrip().endswith("verdict: exit 1: promise(s) broken: R2")


def test_kvspec_check_build_prints_the_chat_counterexample_and_exits_1(tmp_path, monkeypatch, capsys):
    """The command itself: ``kvspec check-build`` with the campaign replaced
    by a test double (``check_build_double``, returning a report whose R2
    failed on a chat case) prints the counterexample and exits 1, not
    through a traceback."""
    import fuzz.replaying.checkbuild
    from kvspec.cli import main

    path = tmp_path / "promise-0123456789abcdef.json"
    path.write_text(json.dumps(chat_finding("vllm")))

    def check_build_double(name, **_):
        return BuildReport(
            engine=name,
            rows=[{"promise": "R2", "name": "longer sibling", "verdict": "FAIL"}],
            counterexamples={"R2": str(path)},
            exit_code=EXIT_FAIL,
            reason="promise(s) broken: R2",
        )

    monkeypatch.setattr(fuzz.replaying.checkbuild, "check_build", check_build_double)
    code = main(["check-build", "--engine", "vllm==0.33.0", "--out", str(tmp_path / "out"), "--max-time", "1"])
    out = capsys.readouterr().out
    assert code == EXIT_FAIL, out
    assert "first counterexample for R2" in out and "request 1: A:40 + out0 + B:20" in out
