"""``kvspec prove``: the table, --json, counterexample case files, exit code."""

from __future__ import annotations

import json

from kvspec.cli import main
from reference.case import load_case


def test_prove_json_and_case_files(tmp_path, capsys) -> None:
    rc = main(["prove", "--json", "--only", "R1/mask named:1600 legacy", "--out", str(tmp_path), "--jobs", "1"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"]
    verdicts = {r["mode"]: r["verdict"] for r in out["results"]}
    assert verdicts == {
        "plain/0.30": "proved",
        "plain/0.33": "proved",
        "drop/0.30": "refuted",
        "drop/0.33": "proved",
        "lookahead/0.33": "proved",
    }
    cex = {c["id"]: c for c in out["counterexamples"]}
    c = cex["R1/mask named:1600 legacy drop/0.30"]
    assert c["N"] == 3201 and c["reference"]["confirmed"]
    case = load_case(c["case"])
    assert [r.num_prompt_tokens for r in case.trace] == [3201] * 3
    assert case.speculative is not None and case.speculative.option("disable_lookahead_block_hashes")


def test_prove_table(tmp_path, capsys) -> None:
    rc = main(["prove", "--only", "eagle-off uniform", "--out", str(tmp_path), "--jobs", "1"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "eagle-off" in text and "proved" in text and "counterexample" in text
    assert "every expected verdict holds" in text
