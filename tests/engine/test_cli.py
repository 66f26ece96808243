"""`kvspec run` and `kvspec run --compare` on the real engines."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine_adapter.home import REPO_ROOT
from tests.engine.conftest import ensure_env

pytestmark = pytest.mark.engine

SEED = str(REPO_ROOT / "examples" / "seed-53504.json")


def kvspec(*argv, timeout=600):
    return subprocess.run([sys.executable, "-m", "kvspec.cli", *argv], capture_output=True, text=True, cwd=REPO_ROOT, timeout=timeout, env=dict(os.environ))


@pytest.mark.parametrize("version, hits", [("0.29.0", [0, 0, 9600]), ("0.33.0", [0, 9600, 9600])])
def test_run_prints_the_predict_shape(version, hits):
    ensure_env(version)
    proc = kvspec("run", SEED, "--engine", f"vllm=={version}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["hits"] == hits
    assert out["queries"] == [11910] * 3
    assert {"hits", "queries", "knobs", "explain"} <= set(out)
    assert [e["request"] for e in out["explain"]] == [0, 1, 2]


@pytest.mark.parametrize("version", ["0.29.0", "0.33.0"])
def test_compare_seed_agrees_with_the_version_rule(version):
    ensure_env(version)
    proc = kvspec("run", SEED, "--engine", f"vllm=={version}", "--compare", "--json")
    out = json.loads(proc.stdout)
    assert out["rule"] == ("legacy" if version == "0.29.0" else "replay")
    assert out["mismatches"] == [], out["mismatches"]
    assert proc.returncode == 0


def test_compare_exits_1_on_a_mismatch_and_renders_a_table():
    ensure_env("0.29.0")
    # the promise says the first repeat hits 9600; vLLM 0.29.0 misses it
    proc = kvspec("run", SEED, "--engine", "vllm==0.29.0", "--compare", "--rule", "promise")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "MISMATCH" in proc.stdout
    assert "mismatch(es)" in proc.stdout


def test_run_vllm_error_exits_1_with_the_error_json(tmp_path):
    ensure_env("0.33.0")
    case = {"schema": 1, "geometry": {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}]},
            "speculative": {"method": "eagle", "num_speculative_tokens": 2}, "trace": [{"prompt": [{"segment": "A", "length": 64}]}]}
    path = tmp_path / "eagle.json"
    path.write_text(json.dumps(case))
    proc = kvspec("run", str(path), "--engine", "vllm==0.33.0")
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    assert out["error"]["kind"] == "vllm" and out["error"]["type"] == "ValidationError"
