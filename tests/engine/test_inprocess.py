"""In-process mode: the Engine inside an interpreter that imports vLLM itself."""

from __future__ import annotations

import json
import subprocess

import pytest

from engine_adapter.host import environments
from tests.engine.conftest import ensure_env

pytestmark = pytest.mark.engine

SCRIPT = """
import json, sys
from engine_adapter.host.engine import open_engine, InProcessEngine
from reference.case import parse_case
def make(spec):
    return parse_case({"schema": 1, "speculative": spec,
        "geometry": {"groups": [{"kind": "full_attention", "block_size": 1600}, {"kind": "mamba", "block_size": 1600, "count": 3}], "retention_interval": 0},
        "trace": [{"prompt": [{"segment": "A", "length": 11910}]}] * 3})
engine = open_engine("vllm==0.33.0")
assert isinstance(engine, InProcessEngine), engine
assert "vllm.v1.core.sched.scheduler" in sys.modules
seed = make({"method": "mtp", "num_speculative_tokens": 2, "disable_lookahead_block_hashes": True})
off = make(None)
print(json.dumps({"mode": engine.mode, "drop": engine.run(seed)["hits"], "off": engine.run(off)["hits"]}))
"""


def test_inprocess_engine_in_the_engine_environment():
    ensure_env("0.33.0")
    proc = subprocess.run(
        [str(environments.env_python("0.33.0")), "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        env=environments.worker_env("0.33.0"),
        cwd=str(environments.REPO_ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"mode": "inprocess", "drop": [0, 9600, 9600], "off": [0, 11200, 11200]}
