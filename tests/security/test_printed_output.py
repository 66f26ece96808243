"""What kvspec prints and sends (issue 40): a stranger's text stays text,
exit codes say what happened.

The corpus :data:`HOSTILE_NAMES` (rich markup that closes a tag or plants a
hyperlink, terminal escapes, a bidi override, Markdown that makes a
``javascript:`` link, raw HTML, ``|`` and a line break that would add a
column or a row) is put in a case's name, a server's model id and a
finding's text. For each one:

* ``kvspec replay --server`` (a loopback stub server) reports its verdict,
  exits with the verdict's code and writes its ``--json``;
* ``kvspec matrix`` (test doubles for the engines) prints the name as text
  on a terminal (no rich markup read, no OSC 8 hyperlink, no control
  character), and its Markdown and HTML tables keep their shape and hold
  no link, no HTML and no control character from the name;
* ``kvspec report`` writes no Markdown link from a finding's summary or
  assumptions; argparse's "unrecognized arguments" holds no escape.

``kvspec matrix`` exits 1 when a cell departs from the promise, 3 when
nothing (or not everything) could be judged, 0 otherwise; its chart writes
nothing under ``$HOME``.
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.cli import main as kvspec
from reference.case import case_to_dict
from tests.fuzz.doubles import ReferenceDouble
from tests.live.stub_server import StubVllm
from tests.live.test_replay_unit import follows, predicted, repeat_case

ROOT = Path(__file__).resolve().parents[2]

#: Characters no terminal line or report may hold (``\n`` separates lines).
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")

#: {probe: hostile name} for a case, a model id, a finding's text.
HOSTILE_NAMES = {
    "close-tag": "[/]",
    "rich-link": "[link=https://evil.example/x]looks-fine[/link]",
    "rich-style": "[bold red]x[/bold red][/",
    "clear-screen": "\x1b[2Jgone",
    "osc8": "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\",
    "bidi": "a\u202eevil\u2066b\u2069",
    "md-link": "[a](javascript:alert(1))",
    "md-image": "![x](https://evil.example/p.png)",
    "html": "<script>alert(1)</script>",
    "pipe-row": "a | b\n| c | d |",
    "autolink": "<javascript:alert(1)>",
}

NAME_IDS = list(HOSTILE_NAMES)


def _no_markdown_link(text: str) -> None:
    """No unescaped ``[`` (a link or image), no raw ``<``."""
    assert not re.search(r"(?<!\\)\[[^\]]*\]\(", text), text
    assert "<script" not in text and "<javascript" not in text, text
    assert not CONTROL.search(text), text


# ------------------------------------------------------------ item 1: replay


def _case_file(tmp_path: Path, name: str) -> Path:
    case = repeat_case()
    data = case_to_dict(case)
    data["name"] = name
    path = tmp_path / "case.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("probe", ["close-tag", "rich-link", "rich-style", "clear-screen", "md-link"])
def test_replay_of_a_hostile_case_name_reports_its_verdict_and_json(tmp_path, capsys, probe):
    name = HOSTILE_NAMES[probe]
    path = _case_file(tmp_path, name)
    report = tmp_path / "report.json"
    with StubVllm(follows(predicted(repeat_case()))) as stub:
        rc = kvspec(["replay", str(path), "--server", stub.url, "--gap", "0", "--timeout", "5", "--json", str(report)])
    out = capsys.readouterr()
    saved = json.loads(report.read_text())
    assert saved["verdict"] == "agrees" and rc == 0, (rc, out.err[-400:])
    assert "verdict: agrees" in out.out
    assert not CONTROL.search(out.out) and not CONTROL.search(out.err)
    if probe == "close-tag":
        assert "replay [/]" in out.out  # the name shown as it is, not read as markup


def test_replay_against_a_server_whose_model_id_is_markup(tmp_path, capsys):
    path = _case_file(tmp_path, "plain")
    report = tmp_path / "report.json"
    with StubVllm(follows(predicted(repeat_case())), models=("[/]",)) as stub:
        rc = kvspec(["replay", str(path), "--server", stub.url, "--gap", "0", "--timeout", "5", "--json", str(report)])
    out = capsys.readouterr()
    assert rc == 0 and json.loads(report.read_text())["verdict"] == "agrees", out.err[-400:]
    assert "model [/]" in out.out


# ------------------------------------------------------ item 1, 2: matrix


def _doubles(monkeypatch, *engines):
    """``kvspec matrix``'s engines replaced by test doubles (the reference
    model under a rule, named as a vLLM version)."""
    import engine_adapter

    by_version = {e.version: e for e in engines}
    monkeypatch.setattr(engine_adapter, "open_engine", lambda spec, warm=False: by_version[spec.version])


def _seed_named(tmp_path: Path, name: str) -> Path:
    data = json.loads((ROOT / "examples/seed-53504.json").read_text())
    data["name"] = name
    path = tmp_path / "named.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("probe", NAME_IDS)
def test_matrix_prints_a_hostile_case_name_as_text(tmp_path, monkeypatch, capsys, probe):
    name = HOSTILE_NAMES[probe]
    _doubles(monkeypatch, ReferenceDouble("0.33.0", "promise"))
    path = _seed_named(tmp_path, name)
    rc = kvspec(["matrix", str(path), "--engine", "vllm==0.33.0"])
    out = capsys.readouterr()
    assert rc == 0, out.err[-400:]
    assert not CONTROL.search(out.out) and "Traceback" not in out.err
    if probe in ("close-tag", "rich-link", "rich-style"):
        assert name[:6] in out.out  # shown as text, not taken as markup


@pytest.mark.parametrize("probe", ["rich-link", "osc8", "close-tag"])
def test_the_matrix_table_plants_no_hyperlink_on_a_terminal(probe):
    from rich.console import Console

    from fuzz.replaying.matrix import to_rich

    rows = [
        {
            "name": HOSTILE_NAMES[probe],
            "cells": {"0.33.0": {"error": HOSTILE_NAMES[probe], "verdict": None}},
            "promise": None,
        }
    ]
    buf = io.StringIO()
    Console(file=buf, force_terminal=True, width=200).print(to_rich(rows, ["0.33.0"]))
    text = buf.getvalue()
    assert "\x1b]8;" not in text  # no OSC 8 hyperlink
    assert "evil.example" not in text or "[link=" in text  # the link text is shown, not made a link


@pytest.mark.parametrize("probe", NAME_IDS)
def test_matrix_markdown_and_html_keep_a_hostile_name_inside_its_cell(tmp_path, monkeypatch, capsys, probe):
    name = HOSTILE_NAMES[probe]
    _doubles(monkeypatch, ReferenceDouble("0.33.0", "promise"))
    path = _seed_named(tmp_path, name)
    assert kvspec(["matrix", str(path), "--engine", "vllm==0.33.0", "--markdown"]) == 0
    md = capsys.readouterr().out
    lines = md.splitlines()
    assert len(lines) == 3  # head, rule, one row: no row added
    assert len(re.findall(r"(?<!\\)\|", lines[2])) == len(re.findall(r"\|", lines[0]))  # no column added
    _no_markdown_link(md)
    assert kvspec(["matrix", str(path), "--engine", "vllm==0.33.0", "--html"]) == 0
    page = capsys.readouterr().out
    assert "<script" not in page and "<javascript" not in page and not CONTROL.search(page)
    assert page.count("<td>") == 3


# ------------------------------------------------------- item 2: report, argparse


BASE = json.loads((ROOT / "tests/engine/data/finding-longer-sibling-qwen3-next.json").read_text())


@pytest.mark.parametrize("probe", ["md-link", "md-image", "autolink", "html"])
@pytest.mark.parametrize("field", ["summary", "assumptions"])
def test_report_writes_no_markdown_link_from_a_finding(tmp_path, capsys, probe, field):
    f = copy.deepcopy(BASE)
    f["oracle"] = "reference"  # no known class: the summary is the title too
    if field == "summary":
        f["summary"] = HOSTILE_NAMES[probe]
    else:
        f.setdefault("resolution", {}).setdefault("assumptions", []).append(HOSTILE_NAMES[probe])
    path = tmp_path / "f.json"
    path.write_text(json.dumps(f))
    out = tmp_path / "out"
    assert kvspec(["report", str(path), "--out", str(out)]) == 0, capsys.readouterr().err[-400:]
    issue = (out / "ISSUE.md").read_text()
    prose = "\n".join(line for line in issue.splitlines() if not line.startswith("    ") and "`" not in line)
    _no_markdown_link(prose)


@pytest.mark.parametrize("probe", ["clear-screen", "osc8", "bidi"])
def test_an_unrecognized_argument_is_echoed_without_escapes(capsys, probe):
    with pytest.raises(SystemExit) as e:
        kvspec(["predict", "x.json", "--" + HOSTILE_NAMES[probe]])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err
    assert not CONTROL.search(err), repr(err)


# ------------------------------------------------------ item 3: matrix exit


def test_matrix_exits_1_when_a_cell_diverges(monkeypatch, capsys):
    _doubles(monkeypatch, ReferenceDouble("0.29.0", "legacy"), ReferenceDouble("0.33.0", "promise"))
    assert (
        kvspec(["matrix", "examples/seed-53504.json", "--engine", "vllm==0.29.0", "--engine", "vllm==0.33.0", "--json"])
        == 1
    )
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["cells"]["0.29.0"]["verdict"] == "diverges"


def test_matrix_exits_0_when_every_cell_agrees(monkeypatch, capsys):
    _doubles(monkeypatch, ReferenceDouble("0.33.0", "promise"))
    assert kvspec(["matrix", "examples/seed-53504.json", "--engine", "vllm==0.33.0", "--json"]) == 0


class _Broken(ReferenceDouble):
    """A test double whose engine fails every run (a harness error)."""

    def run(self, case):
        return {"hits": [], "error": {"kind": "worker", "type": "RuntimeError", "message": "[/] broke"}}


def test_matrix_of_nothing_but_errors_exits_3(monkeypatch, capsys):
    _doubles(monkeypatch, _Broken("0.33.0", "promise"))
    rc = kvspec(["matrix", "examples/seed-53504.json", "--engine", "vllm==0.33.0"])
    out = capsys.readouterr().out
    assert rc == 3
    assert "[/] broke" in out


def test_matrix_exit_rule():
    from fuzz.replaying.matrix import exit_code

    def rows(*verdicts):
        return [{"cells": {str(i): ({"verdict": v} if v else {"error": "x"}) for i, v in enumerate(verdicts)}}]

    assert exit_code(rows("agrees", "not reproduced"), ["0", "1"]) == 0
    assert exit_code(rows("agrees", "diverges"), ["0", "1"]) == 1
    assert exit_code(rows("reproduced", None), ["0", "1"]) == 1
    assert exit_code(rows("agrees", "inconclusive"), ["0", "1"]) == 3
    assert exit_code(rows(None, None), ["0", "1"]) == 3
    assert exit_code([], ["0"]) == 3


# ------------------------------------------------------ item 11: the chart


def test_the_chart_writes_nothing_under_home(tmp_path):
    home, kv = tmp_path / "home", tmp_path / "kvhome"
    home.mkdir()
    script = (
        "from fuzz.replaying.matrix import chart\n"
        "rows=[{'name':'$x[/]', 'requests':2, 'promise':[0,5], 'cells':{'0.33.0':{'hits':[0,5]}}}]\n"
        f"chart(rows, ['0.33.0'], {str(tmp_path / 'c.png')!r})\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME")}
    env.update(HOME=str(home), KVSPEC_HOME=str(kv))
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, check=True, timeout=120, capture_output=True)
    assert (tmp_path / "c.png").stat().st_size > 0
    assert list(home.rglob("*")) == []
    assert (kv / "cache" / "matplotlib").is_dir()


def test_matrix_help_states_its_exit_codes(capsys):
    with pytest.raises(SystemExit):
        kvspec(["matrix", "--help"])
    out = capsys.readouterr().out
    assert "1  a cell departs from it" in out and "3  a cell could not be judged" in out
