"""KV connector deployments on vLLM 0.33.0's real scheduler (issue 27, item 1).

``--kv-offloading-size`` makes vLLM configure its CPU offloading connector
(``OffloadingConnector``, the ``native`` backend), whose scheduler side
vLLM's own ``Scheduler`` builds; kvspec stands in the worker side
(``engine_adapter/vllm_engine/connector.py``: every transfer completes in
the step that asked for it). With any connector vLLM 0.33.0 keeps the legacy
block hashes (``VllmConfig.num_hash_lookahead_tokens`` is 0), so an MTP
deployment is back on the EAGLE drop.

What the tests hold, each from a run:

- the connector is built (the ``kv_connector`` knob and resolution fact),
  the lookahead is 0 and the resolved speculative settings say so
  (``disable_lookahead_block_hashes``), so the reference model takes the
  drop as vLLM does;
- the stood-in worker's transfers are reported: the engine keeps stepping
  while the connector has pending work (``Scheduler.has_requests``), so a
  run whose store jobs were never reported complete stalls (an
  ``EngineStall``: checked by hand with the stand-in's report emptied);
- every open vLLM class reaches a connector deployment (the
  ``examples/connector-*.json`` cases, judged by the one judge): R1 (resend
  beside a checkpoint) and dense-below-sparse only because of the
  connector (the same deployment without it keeps the promise), the longer
  sibling, its hashed form and the stale state as without it;
- on 0.32.0 the connector serves past the EAGLE drop where no group is
  annotated as the drafter's, and ``reference`` does not judge that load.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from fuzz.judge.verdict import observe_and_judge
from fuzz.results.findings import make_finding
from fuzz.results.known_classes import classify
from reference.case import parse_case

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FLAG = "--kv-offloading-size"

# example -> (the known class its finding belongs to, whether the same
# deployment without the connector keeps the promise)
CLASSES = {
    "connector-resend-beside-checkpoint-qwen3_5": ("resend-beside-checkpoint", True),
    "connector-dense-below-sparse-qwen3_next": ("dense-below-sparse", True),
    "connector-longer-sibling-qwen3_next": ("longer-sibling", False),
    "connector-hashed-longer-sibling-jamba": ("hashed-longer-sibling", False),
    "connector-stale-state-falcon_h1": ("stale-state", False),
}


def _load(name: str) -> dict:
    return json.loads((EXAMPLES / f"{name}.json").read_text())


def _without_connector(case: dict) -> dict:
    case = copy.deepcopy(case)
    args = case["deployment"]["vllm_args"]
    i = args.index(FLAG)
    del args[i : i + 2]
    return case


def test_the_connector_is_built_and_keeps_the_legacy_hashes(engine_033):
    case = _load("connector-resend-beside-checkpoint-qwen3_5")
    res = engine_033.resolve(case)
    assert res["facts"]["kv_connector"] == "OffloadingConnector", res["facts"]
    assert res["facts"]["num_hash_lookahead_tokens"] == 0
    assert res["speculative"]["disable_lookahead_block_hashes"] is True
    plain = engine_033.resolve(_without_connector(case))
    assert plain["facts"]["kv_connector"] is None
    assert plain["facts"]["num_hash_lookahead_tokens"] == 1
    assert "disable_lookahead_block_hashes" not in plain["speculative"]
    obs = engine_033.run(case)
    assert "error" not in obs, obs.get("error")
    assert obs["knobs"]["kv_connector"] == "OffloadingConnector"
    assert obs["knobs"]["eagle_drop"] is True and obs["knobs"]["hash_lookahead_tokens"] == 0


def _classes(engine, case: dict) -> set:
    """The known classes of the findings the one judge makes of ``case``
    (every single-engine oracle, as ``kvspec replay`` judges a bare case)."""
    judged = observe_and_judge(parse_case(case), None, engine)
    assert "error" not in judged.observation, judged.observation.get("error")
    return {classify(make_finding(judged.case, d, judged.observation)) for d in judged.divergences} - {None} | (
        {"any"} if judged.divergences else set()
    )


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_open_class_reaches_a_connector_deployment(engine_033, name):
    known, only_with_connector = CLASSES[name]
    case = _load(name)
    found = _classes(engine_033, case)
    assert known in found, found
    plain = _classes(engine_033, _without_connector(case))
    if only_with_connector:
        assert not plain, plain  # the same deployment without the connector keeps every promise
    else:
        assert known in plain, plain


def test_0_32_s_connector_serves_past_the_drop_and_reference_does_not_judge_its_load(engines):
    """vLLM 0.32.0 flags no group as the EAGLE drafter's here, and its
    offloading connector then serves past the drop by design
    (``offloading/scheduler.py:236-251``): A:576 then A:555+B:1 hits 288,
    all of it loaded, where the local lookup dropped to 0. ``reference``
    judges the local cache's model, so not that request
    (``fuzz.judge.oracle_base.first_load``); without the connector the hit
    is 0, as the model gives."""
    engine = engines("0.32.0")
    case = json.loads(
        (Path(__file__).parent / "data" / "case-connector-past-the-drop-qwen3_next-0.32.0.json").read_text()
    )
    judged = observe_and_judge(parse_case(case), None, engine)
    obs = judged.observation
    assert "error" not in obs, obs.get("error")
    assert obs["hits"] == [0, 288] and obs["explain"][1]["external_hit"] == 288, obs["hits"]
    assert obs["explain"][1]["scheduler_hit"] == 0
    assert "reference" not in {d.oracle for d in judged.divergences}
    plain = observe_and_judge(parse_case(_without_connector(case)), None, engine)
    assert plain.observation["hits"] == [0, 0]
    assert not plain.divergences, [d.oracle for d in plain.divergences]
