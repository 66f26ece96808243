"""vLLM #52897's shape on the real schedulers of 0.29.0, 0.30.0, 0.32.0 and
0.33.0 (``examples/priority-52897-qwen3_5.json``).

#52897 reports that ``--scheduling-policy priority`` on a Qwen3.5-class
hybrid (48 GDN + 16 attention layers, MTP 3, align mode, block 1600) got no
prefix-cache hit, and that a block-aligned 6,592-token prompt (4 blocks of
1648) hit 3,296 where 4,944 was predicted. The example is that prompt,
sent three times, on Qwen3.5-27B's dimensions, TP 1, fp8 KV cache, MTP 3,
``--block-size 1648`` (6,592 = 4 x 1648) and ``--scheduling-policy
priority``.

What the tests hold (each from a run, not from the report):

- the flag reaches vLLM: its ``SchedulerConfig.policy``, which the
  ``Scheduler`` kvspec builds from the same config reads to pick its
  waiting queue (``vllm/v1/core/sched/scheduler.py`` ``create_request_queue
  (self.policy)``, line 232 on 0.33.0), is ``priority``; with ``fcfs`` it is
  ``fcfs``;
- the policy changes no hit: the same case under ``fcfs`` gives the same
  hits, chunk ends and kept Mamba blocks on every version. Only the waiting
  queue's order and the preemption victim depend on the policy
  (``scheduler.py`` lines 932-948 and 984 on 0.33.0); a serial trace has
  one request in the queue at a time, every kvspec request has priority 0
  (``engine_adapter/vllm_engine/steploop.py`` builds ``Request`` without
  one), and kvspec's pool is sized so nothing is evicted or preempted;
- the hits are the EAGLE drop, not the policy: 0.29.0 and 0.30.0 (the drop,
  no lookahead hashes) miss the resend and hit 3,296 = 4,944 - 1,648 on the
  third request (#53504's miss/miss/hit), where the promise gives 3,296 on
  the resend; 0.32.0 and 0.33.0 hit 4,944 on the resend, as the promise.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from fuzz.judge.oracle_resolution import resolved
from reference.case import parse_case
from reference.predict import predict

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "priority-52897-qwen3_5.json"
VERSIONS = ("0.29.0", "0.30.0", "0.32.0", "0.33.0")
# The default tier drives the two ends (0.29.0: the drop; 0.33.0: the
# lookahead hash); 0.30.0 (installed on demand, not by `make engines`) and
# 0.32.0 run in the slow tier (`make test-slow`), to keep `make test` short.
TIERED = [v if v in ("0.29.0", "0.33.0") else pytest.param(v, marks=pytest.mark.slow) for v in VERSIONS]
BLOCK = 1648
PROMPT = 6592  # 4 x 1648: block aligned, as in the report

# Observed on each version's real scheduler (2026-12, this example, both
# policies): 0.29.0 and 0.30.0 take the EAGLE drop (cap N-1 = 6591, floor to
# 4944, one block less: 3296) and the resend finds no Mamba state there
# (miss/miss/hit, #53504's class); 0.32.0 keeps it; 0.33.0 hashes one
# lookahead token instead of dropping a block (floor(6591 / 1648) x 1648).
OBSERVED = {
    "0.29.0": [0, 0, 3 * BLOCK - BLOCK],
    "0.30.0": [0, 0, 3 * BLOCK - BLOCK],
    "0.32.0": [0, 3 * BLOCK, 3 * BLOCK],
    "0.33.0": [0, 3 * BLOCK, 3 * BLOCK],
}


def _case(policy: str) -> dict:
    case = json.loads(EXAMPLE.read_text())
    args = case["deployment"]["vllm_args"]
    i = args.index("--scheduling-policy")
    assert args[i + 1] == "priority"
    case = copy.deepcopy(case)
    case["deployment"]["vllm_args"][i + 1] = policy
    return case


def _promise(case: dict, observed: dict, version: str) -> list[int]:
    """``kvspec run --compare --rule promise``'s reference: the promise on
    the geometry this engine resolved."""
    judged = resolved(parse_case(case), observed, version)
    return predict(judged, f"vllm=={version}", "promise")["hits"]


@pytest.mark.parametrize("version", TIERED)
def test_the_policy_reaches_vllm_and_changes_no_hit(engines, version):
    engine = engines(version)
    runs = {}
    for policy in ("priority", "fcfs"):
        case = _case(policy)
        res = engine.resolve(case)
        assert res["facts"]["scheduling_policy"] == policy, res["facts"]
        assert res["geometry"]["scheduler_block_size"] == res["geometry"]["hash_block_size"] == BLOCK
        obs = engine.run(case)
        assert "error" not in obs, obs.get("error")
        assert obs["queries"] == [PROMPT] * 3
        runs[policy] = obs
    pri, fcfs = runs["priority"], runs["fcfs"]
    assert pri["hits"] == fcfs["hits"]
    assert [e["chunk_ends"] for e in pri["explain"]] == [e["chunk_ends"] for e in fcfs["explain"]]
    assert [e["retained_mamba_blocks"] for e in pri["explain"]] == [e["retained_mamba_blocks"] for e in fcfs["explain"]]
    assert pri["hits"] == OBSERVED[version], pri["hits"]


# The promise per version, with the knobs that version resolves: 0.29.0 and
# 0.30.0 cap the lookup at N-1 and drop a block (eagle_lookup_ceiling
# n_minus_1), so the resend resumes at 3296, the report's observed number;
# 0.32.0 (the ceiling on hashed blocks) and 0.33.0 (one lookahead token
# hashed, no drop) resume at 4944, the report's "predicted".
PROMISE = {
    "0.29.0": [0, 2 * BLOCK, 2 * BLOCK],
    "0.30.0": [0, 2 * BLOCK, 2 * BLOCK],
    "0.32.0": [0, 3 * BLOCK, 3 * BLOCK],
    "0.33.0": [0, 3 * BLOCK, 3 * BLOCK],
}


@pytest.mark.parametrize("version", TIERED)
def test_the_promise_on_the_reported_shape(engines, version):
    case = _case("priority")
    obs = engines(version).run(case)
    assert "error" not in obs, obs.get("error")
    promise = _promise(case, obs, version)
    assert promise == PROMISE[version], promise
    if version in ("0.29.0", "0.30.0"):
        # the resend misses the state at 3296 the promise resumes at (the
        # first prefill kept only later ones); the second prefill stops a
        # chunk there, and the third request resumes (#53504's class)
        assert obs["hits"][1] == 0 < promise[1]
        assert obs["hits"][2] == promise[2]
        assert [e["chunk_ends"] for e in obs["explain"]][:2] == [[3 * BLOCK, PROMPT], [2 * BLOCK, 3 * BLOCK, PROMPT]]
    else:
        assert obs["hits"] == promise
