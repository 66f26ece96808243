"""``kvspec check-build`` on SGLang 0.5.23: the fixed build keeps every
promise with no harness error, and each fault planted on SGLang's
tracking, chunking and match paths (``tests/engine/data/sglang-faults/``,
diffs applied on top of the fixes) is caught within the default budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXES = sorted(str(p) for p in (ROOT / "fixes").glob("sglang-0.5.23-*.diff"))
FAULTS = ROOT / "tests" / "engine" / "data" / "sglang-faults"
#: fault -> the promise it breaks (fuzz.replaying.checkbuild.PROMISES)
EXPECTED = {
    "tracking-keyed-a-grid-short": "no-stale",
    "chunking-first-cut-off-the-page": "no-stale",
    "match-without-a-state": ("no-stale", "R1", "R2", "junction"),
}

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def _check_build(patches: list[str], out: Path, *extra: str) -> tuple[int, dict]:
    cmd = [
        sys.executable,
        "-m",
        "kvspec.cli",
        "check-build",
        "--engine",
        "sglang==0.5.23",
        *[a for p in patches for a in ("--patch", p)],
        "--out",
        str(out),
        "--json",
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, cwd=ROOT)
    return proc.returncode, json.loads(proc.stdout)


def test_the_fixed_build_keeps_every_promise_without_harness_errors(tmp_path):
    assert len(FIXES) == 1  # keep-cut (chunk-on-grid went with its class: docs/sglang.md)
    code, report = _check_build(FIXES, tmp_path)
    assert (code, report["harness_errors"], report["counterexamples"]) == (0, 0, {}), report["reason"]
    assert [p["phase"] for p in report["phases"]][:2] == ["examples", "boundary cases"] and report["phases"][1][
        "cases"
    ] > 0


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_a_planted_fault_is_caught(fault, tmp_path):
    code, report = _check_build(FIXES + [str(FAULTS / f"{fault}.diff")], tmp_path, "--fail-fast")
    assert code == 1, report["reason"]
    want = EXPECTED[fault]
    assert set(report["counterexamples"]) & ({want} if isinstance(want, str) else set(want)), report["counterexamples"]
