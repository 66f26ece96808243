"""``kvspec findings`` uses the one finding loader's checks (issue 40 item
10): a finding whose oracle kvspec does not have, or whose signature is not
hex, is listed among the malformed files with its one-line reason, never
as a class, as ``kvspec report`` refuses it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kvspec.cli import main as kvspec

ROOT = Path(__file__).resolve().parents[2]
BASE = json.loads((ROOT / "tests/engine/data/finding-longer-sibling-qwen3-next.json").read_text())

#: (field, hostile value, what the refusal names)
PROBES = [
    ("oracle", "no-such-oracle", "oracle="),
    ("oracle", "[/]\x1b[2J", "oracle="),
    ("signature", "not-hex!", "signature="),
    ("signature", "ABCDEF01", "signature="),
    ("signature", "../../x", "signature="),
    ("signature", 12345678, "signature="),
]


@pytest.mark.parametrize("field,value,named", PROBES, ids=lambda x: repr(x)[:20])
def test_a_finding_report_refuses_is_not_listed_as_a_class(tmp_path, capsys, field, value, named):
    f = copy.deepcopy(BASE)
    f[field] = value
    (tmp_path / "bad.json").write_text(json.dumps(f))
    (tmp_path / "good.json").write_text(json.dumps(BASE))
    assert kvspec(["findings", str(tmp_path), "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["findings"] == 1 and sum(c["count"] for c in listing["classes"]) == 1
    bad = [m for m in listing["malformed"] if m["path"].endswith("bad.json")]
    assert len(bad) == 1 and named in bad[0]["reason"]
    # report refuses the same file
    assert kvspec(["report", str(tmp_path / "bad.json"), "--out", str(tmp_path / "out")]) == 2
