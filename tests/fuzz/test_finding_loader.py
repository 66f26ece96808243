"""One finding loader (fuzz.results.findings.load_finding): kvspec fuzz --case,
replay, report, matrix, ``kvspec findings`` (triage) and live replay decide
"is this a finding?" by one rule and refuse a bad file in one line."""

from __future__ import annotations

import json

import pytest

from fuzz.replaying.live_replay import load_target
from fuzz.results.findings import is_finding, load_finding
from fuzz.results.triage import read_findings
from ground.errors import InvalidArgument, KvspecError
from reference.case import case_to_dict
from tests.conftest import hybrid, make_case


def _finding(**kw) -> dict:
    case = make_case(hybrid(16, 16), [[("A", 40)], [("A", 40)]])
    data = {
        "kvspec_finding": 1,
        "oracle": "reference",
        "engine": {"version": "0.29.0", "knobs": {}},
        "expected": {"hits": [0, 32], "detail": ""},
        "observed": {"hits": [0, 16], "queries": [], "error": None},
        "first_divergence": 1,
        "summary": "s",
        "case": case_to_dict(case),
    }
    data.update(kw)
    return data


def _write(tmp_path, name, data) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_every_reader_takes_a_finding_for_a_finding_and_a_case_for_a_case(tmp_path):
    finding = _finding()
    bare = finding["case"]
    # a finding whose top level also has a key a case has: still a finding, for every reader
    odd = _finding(geometry={"note": "not the case's"})
    for name, data, want in (("f.json", finding, True), ("odd.json", odd, True), ("case.json", bare, False)):
        path = _write(tmp_path, name, data)
        assert is_finding(data) is want
        assert bool(load_finding(path)[1]) is want
        assert (load_target(path).kind == "finding") is want
    described, malformed = read_findings(tmp_path)
    assert sorted(d["path"].rsplit("/", 1)[1] for d in described) == ["f.json", "odd.json"]
    assert [m[0].rsplit("/", 1)[1] for m in malformed] == ["case.json"]  # a bare case is no finding


def test_a_bad_finding_file_is_one_line_naming_the_field_for_every_reader(tmp_path):
    listed = _write(tmp_path, "list.json", [1, 2])
    future = _write(tmp_path, "future.json", _finding(kvspec_finding=99))
    for path, needle in ((listed, "finding file="), (future, "kvspec_finding=99")):
        for read in (load_finding, load_target):
            with pytest.raises(InvalidArgument) as e:
                read(path)
            assert needle in str(e.value) and "\n" not in str(e.value) and isinstance(e.value, KvspecError)
    reasons = dict(read_findings(tmp_path)[1])
    assert "finding file=" in reasons[listed] and "kvspec_finding=99" in reasons[future]
