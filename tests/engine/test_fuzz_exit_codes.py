"""``kvspec fuzz`` exit codes against the REAL vLLM 0.33.0 scheduler: a
campaign over a pinned case list that finds something exits 1 and triages
it into one class; one that finds nothing exits 0. (A broken engine exits 3:
tests/fuzz/test_worker_lifecycle.py.) No test double here."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engine.conftest import ensure_env

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[2]
MAX_TIME = 240


def _fuzz_cases(case: str, out: Path) -> tuple[subprocess.CompletedProcess, float]:
    ensure_env("0.33.0")
    cmd = [
        sys.executable,
        "-m",
        "kvspec.cli",
        "fuzz",
        "--engine",
        "vllm==0.33.0",
        "--driver",
        "cases",
        "--case",
        str(ROOT / "examples" / case),
        "--no-z3-seeds",
        "--max-time",
        str(MAX_TIME),
        "--out",
        str(out),
        "--json",
    ]
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=MAX_TIME + 60)
    return done, time.monotonic() - start


def test_a_campaign_that_finds_a_033_discrepancy_exits_1_with_one_class(tmp_path):
    # vLLM 0.33.0 misses the resend of a 49-token prompt at attention 32 / Mamba 16.
    done, wall = _fuzz_cases("synthetic/mixed-a32-m16-resend.json", tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    assert summary["exit_code"] == 1 and summary["harness_errors"] == 0
    assert len(summary["findings"]) == 1
    (cls,) = summary["classes"]
    assert (cls["oracle"], cls["request_kind"], cls["geometry"], cls["count"], cls["new"]) == (
        "promise",
        "resend",
        "mixed",
        1,
        1,
    )
    assert cls["hint"].startswith("resend low")
    assert "kvspec fuzz: exit 1: 1 finding(s) written this run" in done.stderr
    assert wall < MAX_TIME


def test_a_campaign_that_finds_nothing_exits_0(tmp_path):
    # The #53504 seed keeps the promise on 0.33.0 (the fix is in).
    done, _ = _fuzz_cases("seed-53504.json", tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    assert summary["execs"] > 0 and summary["findings"] == [] and summary["classes"] == []
    assert "kvspec fuzz: exit 0: ran; no finding" in done.stderr
