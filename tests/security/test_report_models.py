"""``kvspec report`` reads no folder a finding names (issue 40 item 13): a
finding's ``deployment.model`` that is not a model kvspec ships is a path
on its author's machine; the report does not read it (a test double for the
model reader fails the test if it is asked for that model) and ISSUE.md
says its figures do not come from it. A shipped model is read as before."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import fuzz.results.impact
from kvspec.cli import main as kvspec

ROOT = Path(__file__).resolve().parents[2]
BASE = json.loads((ROOT / "tests/engine/data/finding-longer-sibling-qwen3-next.json").read_text())


@pytest.fixture
def reads(monkeypatch):
    seen = []
    real = fuzz.results.impact.model_config_dict

    def reader(dep):
        seen.append(dep.model)
        if dep.model.startswith("/"):
            raise AssertionError(f"the report read {dep.model}")
        return real(dep)

    monkeypatch.setattr(fuzz.results.impact, "model_config_dict", reader)
    return seen


def _report(tmp_path, finding) -> str:
    path = tmp_path / "f.json"
    path.write_text(json.dumps(finding))
    assert kvspec(["report", str(path), "--out", str(tmp_path / "out")]) == 0
    return (tmp_path / "out" / "ISSUE.md").read_text()


def test_a_local_model_folder_is_not_read_into_a_shared_report(tmp_path, reads):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(
        (ROOT / "engine_adapter/models/qwen3_next.json").read_text()
    )  # a readable config
    f = copy.deepcopy(BASE)
    f["case"]["deployment"]["model"] = str(folder)
    issue = _report(tmp_path, f)
    assert str(folder) not in reads
    assert "is not one kvspec ships: its config was not read here" in issue
    assert "Prefill time lost per occurrence" not in issue


def test_a_shipped_model_is_read_as_before(tmp_path, reads):
    f = copy.deepcopy(BASE)
    issue = _report(tmp_path, f)
    assert f["case"]["deployment"]["model"] in reads
    assert "is not one kvspec ships" not in issue
