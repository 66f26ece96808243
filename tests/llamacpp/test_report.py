"""``kvspec report`` on a llama.cpp finding (the family's reporter,
fuzz/results/report_llamacpp.py), from the shipped L1 finding: llama.cpp's bug
template, a regression test in the style of its tools/server/tests/unit
(parses; the rule's cache_n per request; the server's own n_ubatch), the
fix diff (stated, not built), text from the finding escaped."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from fuzz.results.report_llamacpp import bundle, classify, segment_runs
from reference.case import parse_case

FINDING = Path(__file__).resolve().parents[2] / "examples" / "llamacpp" / "findings" / "L1-checkpoint-offsets.json"


def test_l1_report_is_llamacpp_style_with_test_and_fix():
    finding = json.loads(FINDING.read_text())
    assert classify(finding) == "llamacpp-static-checkpoint-offsets"
    files = bundle(finding, finding_path=FINDING.name)
    assert sorted(files) == ["ISSUE.md", "finding.json", "fix.diff", "test_static_checkpoint_offsets.py"]
    issue = files["ISSUE.md"]
    for heading in (
        "### Name and Version",
        "### Operating systems",
        "### Which llama.cpp modules do you know to be affected?",
        "### Command line",
        "### Problem description & steps to reproduce",
        "### First Bad Commit",
        "### Relevant log output",
    ):
        assert heading in issue
    assert "static const int checkpoint_offsets[]" in issue and "stated, not built" in issue
    test = files["test_static_checkpoint_offsets.py"]
    tree = ast.parse(test)
    assert "from utils import *" in test and "ServerPreset." in test and '"/completion"' in test
    values = {
        n.targets[0].id: ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
    }
    assert values["EXPECTED_CACHE_N"] == [0, 684] and values["PROMPTS"] == [[[100, 1200]], [[100, 800], [1300, 100]]]
    assert "server.n_ubatch = 512" in test
    assert "-                            static const int" in files["fix.diff"]
    assert "+                            const int checkpoint_offsets[]" in files["fix.diff"]


def test_segments_keep_the_shared_prefixes_and_hostile_text_is_escaped():
    case = parse_case(
        {
            "schema": 1,
            "deployment": {"model": "nemotron_h", "engine": "llamacpp", "llamacpp_args": []},
            "trace": [
                {"prompt": [{"segment": "A", "length": 10}, {"segment": "B", "length": 5}]},
                {"prompt": [{"segment": "A", "length": 7}]},
                {"prompt": [{"segment": "C", "length": 3}]},
            ],
        }
    )
    assert segment_runs(case) == [[[100, 10], [110, 5]], [[100, 7]], [[115, 3]]]
    finding = json.loads(FINDING.read_text())
    finding["summary"] = "<script>x</script> [a](javascript:1) ```"
    issue = bundle(finding)["ISSUE.md"]
    assert "<script>" not in issue and "&lt;script" in issue and "\\[a\\](javascript" in issue  # no tag, no link
