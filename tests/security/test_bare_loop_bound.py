"""The bench's bare loop ends (issue 40 item 12): ``bench/fuzz.py
--vs-bare`` spun for ever in ``baseline.bare_run`` (a request vLLM's
scheduler kept waiting, re-queued every step, never finished). Run in vLLM
0.33.0's environment:

* a TEST DOUBLE scheduler that never finishes its request (it schedules
  nothing, for ever): ``bare_run`` stops within its step bound with
  ``BareLoopStuck`` instead of looping without end;
* one real deployment with vLLM's CPU offloading connector (the real
  scheduler, the driver's own stand-ins): ``bare_run`` ends with the hits
  the driver observes on the same case."""

from __future__ import annotations

import json
import subprocess

import pytest

from engine_adapter.host import environments

SCRIPT = r"""
import json, sys
from engine_adapter.vllm_engine.driver import VllmDriver
from engine_adapter.vllm_engine.baseline import bare_run
from reference.case import parse_case
case = parse_case({"schema": 1, "name": "bare-connector",
    "deployment": {"model": "qwen3_next", "vllm_args": ["--enable-prefix-caching", "--kv-offloading-size", "1"]},
    "trace": [{"prompt": [{"segment": "A", "length": 3000}]}, {"prompt": [{"segment": "A", "length": 3000}]}]})
driver = VllmDriver()
hits, *_ = bare_run(driver, case)
observed = driver.run(case)["hits"]
print(json.dumps({"bare": hits, "driver": observed}))
"""


STUCK = r"""
import json
from types import SimpleNamespace
from engine_adapter.vllm_engine.baseline import BareLoopStuck, bare_run
from reference.case import parse_case

class NeverFinishes:
    # A test double for vLLM's Scheduler: holds every request, schedules nothing.
    connector = None
    num_spec_tokens = 0
    def __init__(self):
        self.requests = {}
    def add_request(self, req):
        self.requests[req.request_id] = req
    def has_unfinished_requests(self):
        return True
    def schedule(self):
        return SimpleNamespace(num_scheduled_tokens={})
    def update_from_output(self, so, out):
        return {}

class Driver:
    # A test double for VllmDriver: builds the stuck scheduler.
    def build(self, case, options):
        return {"scheduler": NeverFinishes(), "hasher": None}

case = parse_case({"schema": 1, "geometry": {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}]},
                   "trace": [{"prompt": [{"segment": "A", "length": 32}]}]})
try:
    bare_run(Driver(), case)
    print(json.dumps({"ended": "returned"}))
except BareLoopStuck as e:
    print(json.dumps({"ended": "stuck", "why": str(e)}))
"""


def _in_vllm(script: str, timeout: float) -> subprocess.CompletedProcess:
    python = environments.env_python("0.33.0")
    if not python.exists():
        pytest.fail("vLLM 0.33.0's environment is missing: run kvspec engines install vllm==0.33.0")
    return subprocess.run(
        [str(python), "-c", script],
        cwd=str(environments.REPO_ROOT),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=environments.worker_env("0.33.0", "cuda"),
    )


@pytest.mark.timeout(400)
def test_the_bare_loop_is_bounded_by_steps():
    try:
        proc = _in_vllm(STUCK, 240)
    except subprocess.TimeoutExpired:
        pytest.fail("bare_run looped past 240 s on a scheduler that never finishes (no step bound)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["ended"] == "stuck" and "request 0: still unfinished after" in got["why"]


@pytest.mark.timeout(900)
def test_the_bare_loop_ends_on_a_kv_connector_deployment():
    python = environments.env_python("0.33.0")
    if not python.exists():
        pytest.fail("vLLM 0.33.0's environment is missing: run kvspec engines install vllm==0.33.0")
    try:
        proc = subprocess.run(
            [str(python), "-c", SCRIPT],
            cwd=str(environments.REPO_ROOT),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env=environments.worker_env("0.33.0", "cuda"),
        )
    except subprocess.TimeoutExpired:
        pytest.fail("bare_run did not end within 600 s on a KV connector deployment")
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["bare"] == got["driver"] and len(got["bare"]) == 2
