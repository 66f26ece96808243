"""A ``versions`` finding between the REAL vLLM 0.29.0 and 0.33.0 schedulers:
written in finding schema 2 (both engines, the digest of their vLLM files,
the harness) and replayed with ``kvspec replay FINDING --engine`` on both
engines, judged by the one judge (fuzz/judge/verdict.py)."""

from __future__ import annotations

import json

import pytest

from fuzz.judge.oracles import check_versions
from fuzz.results import findings as F
from kvspec.cli import main as cli_main
from reference.case import load_case
from tests.engine.test_cli import SEED

pytestmark = pytest.mark.engine


class _Borrowed:
    """The session's worker engine, lent to the command (not closed by it)."""

    def __init__(self, engine):
        self.engine = engine
        self.version = engine.version

    def run(self, case, options=None):
        return self.engine.run(case, options)

    def close(self):
        pass


@pytest.fixture
def versions_finding(engines, tmp_path):
    old, new = engines("0.29.0"), engines("0.33.0")
    case = load_case(SEED)
    obs, other = old.run(case), new.run(case)
    assert obs["hits"] == [0, 0, 9600] and other["hits"] == [0, 9600, 9600]
    (div,) = check_versions(case, "0.29.0", obs, "0.33.0", other)
    path = F.write_finding(F.make_finding(case, div, obs, other_observation=other), tmp_path)
    return path, obs, other


def test_a_versions_finding_records_both_real_engines(versions_finding):
    path, obs, other = versions_finding
    f = json.loads(path.read_text())
    assert f["kvspec_finding"] == 2 and f["oracle"] == "versions" and f["first_divergence"] == 1
    a, b = f["engine"], f["other_engine"]
    assert (a["name"], b["name"]) == ("vllm==0.29.0", "vllm==0.33.0")
    # each engine hashed its own vLLM files under test
    assert (
        len(a["vllm_files_sha256"]) == 64
        and len(b["vllm_files_sha256"]) == 64
        and a["vllm_files_sha256"] != b["vllm_files_sha256"]
    )
    assert a["vllm_files_sha256"] == obs["vllm_files_sha256"] and b["vllm_files_sha256"] == other["vllm_files_sha256"]
    assert f["harness"] == {"mode": "worker", "platform": "cuda"}


def test_kvspec_replay_engine_runs_a_versions_finding_on_both_engines(versions_finding, engines, monkeypatch, capsys):
    path, _, _ = versions_finding
    opened = []

    def open_engine(spec, **kw):  # the typed engine, handed down
        opened.append(spec.name)
        return _Borrowed(engines(spec.version))

    monkeypatch.setattr("engine_adapter.host.engine.open_engine", open_engine)
    assert cli_main(["replay", str(path), "--engine", "vllm==0.29.0"]) == 0
    out = capsys.readouterr().out
    assert opened == ["vllm==0.29.0", "vllm==0.33.0"]
    assert "vllm==0.29.0 vs vllm==0.33.0: reproduced" in out and "verdict: reproduced" in out
    # named from the other side: the finding's own engine is the other one
    assert cli_main(["replay", str(path), "--engine", "vllm==0.33.0"]) == 0
    assert opened[2:] == ["vllm==0.33.0", "vllm==0.29.0"]
    # the same two engines, a finding that claims the divergence one request later: not reproduced
    raw = json.loads(path.read_text())
    raw["first_divergence"] = 2
    path.write_text(json.dumps(raw))
    assert cli_main(["replay", str(path), "--engine", "vllm==0.29.0"]) == 1
    assert "versions fires first at request 1, the finding at request 2" in capsys.readouterr().out
