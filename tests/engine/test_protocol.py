"""The worker's line protocol, spoken directly."""

from __future__ import annotations

import json
import subprocess

import pytest

from engine_adapter.host import environments
from engine_adapter.protocol import PROTOCOL_VERSION
from reference.case import case_to_dict
from tests.conftest import MTP_DROP, hybrid, make_case
from tests.engine.conftest import ensure_env

pytestmark = pytest.mark.engine


def test_protocol_round_trip_and_bad_lines():
    ensure_env("0.33.0")
    case = case_to_dict(make_case(hybrid(16, 16, mamba_count=1), [[("A", 200)]] * 2, MTP_DROP))
    lines = [
        "this is not json",
        json.dumps({"id": 1, "op": "frobnicate"}),
        json.dumps({"id": 2, "op": "ping"}),
        json.dumps({"id": 3, "op": "run", "case": {"schema": 1, "geometry": {"groups": []}, "trace": []}}),
        json.dumps({"id": 4, "op": "run", "case": case}),
        json.dumps({"id": 5, "op": "shutdown"}),
    ]
    proc = subprocess.run(
        [str(environments.env_python("0.33.0")), "-m", "engine_adapter.inside.worker"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=300,
        env=environments.worker_env("0.33.0"),
        cwd=str(environments.REPO_ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = [json.loads(x) for x in proc.stdout.splitlines()]  # stdout carries protocol lines only
    hello, *responses = out
    assert hello["protocol"] == PROTOCOL_VERSION and hello["event"] == "hello" and hello["vllm_version"] == "0.33.0"
    by_id = {r["id"]: r for r in responses}
    assert responses[0]["ok"] is False and responses[0]["error"]["kind"] == "protocol"
    assert by_id[1]["error"]["kind"] == "protocol" and "frobnicate" in by_id[1]["error"]["message"]
    assert by_id[2] == {"id": 2, "ok": True, "result": {"pong": True, "vllm_version": "0.33.0"}}
    assert by_id[3]["ok"] is False and by_id[3]["error"]["class"] == "InvalidArgument"
    assert by_id[3]["error"]["message"] == "trace=[]: must be a non-empty list of requests"
    assert by_id[4]["ok"] is True and by_id[4]["result"]["hits"][0] == 0 and by_id[4]["result"]["hits"][1] > 0
    assert by_id[5]["result"] == {"bye": True}
