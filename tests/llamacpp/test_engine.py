"""llama.cpp's server through kvspec's worker (the real ``xllamacpp`` wheel
in its own environment, real forward passes of kvspec's tiny GGUF models):
the rule equals the engine on the examples of three architectures, the
output oracle agrees on a correct run and reports the planted restore fault
(a TEST DOUBLE of the restore step: the wheel cannot be patched here), and a
process that kept another server's checkpoint offsets is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine_adapter.host.engine import WorkerEngine
from fuzz.driving.campaign import Campaign
from fuzz.judge.oracle_outputs import check_outputs
from fuzz.judge.verdict import divergences, judge
from reference.case import parse_case
from reference.llamacpp import Settings, predict
from tests.engine.conftest import ensure_env

VERSION = "llamacpp==2026.10.11549"
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "llamacpp").glob("*.json"))


@pytest.fixture(scope="module")
def llamacpp():
    """One worker for the module: each case runs in a child process of its own."""
    ensure_env(VERSION)
    engine = WorkerEngine(VERSION)
    engine.start()
    yield engine
    engine.close()


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_rule_equals_engine_and_outputs_equal_a_cold_server(llamacpp, path):
    case = json.loads(path.read_text())
    obs = llamacpp.run(case, {"cold": True})
    assert "error" not in obs, obs.get("error")
    res = obs["resolution"]
    assert res["server"]["n_slots"] == 1 and res["server"]["n_ubatch"] == 512  # what the server resolved, read back
    ref = predict(parse_case(case), Settings.of(res["server"], res["params"]))
    assert obs["hits"] == ref["hits"] == [0, 1196, 1196, 684, 684]
    assert [e["checkpoints_held"] for e in obs["explain"]] == [e["checkpoints_held"] for e in ref["explain"]]
    assert [e["checkpoint_restored"] for e in obs["explain"]] == [e["checkpoint_restored"] for e in ref["explain"]]
    assert all(len(e["output_ids"]) == 4 and len(e["top_logprobs"][0]) == 5 for e in obs["explain"])
    assert check_outputs(parse_case(case), VERSION, obs) == []
    divs = divergences(parse_case(case), VERSION, obs)  # the one judge's oracles for this family
    assert divs == [] and judge(None, obs, divs).verdict == "agrees"


class StaleRestoreEngine:
    """TEST DOUBLE: the real engine with the stale-restore double of its
    restore step (engine_adapter/llamacpp_engine/doubles.py)."""

    version = VERSION

    def __init__(self, engine):
        self.engine = engine

    def run(self, case):
        return self.engine.run(case, {"cold": True, "test_double": "stale_restore"})

    def resolve(self, case):
        return self.engine.resolve(case)


def test_campaign_writes_findings_the_one_judge_replays(llamacpp, tmp_path):
    """The common campaign (fuzz.driving.campaign) on llama.cpp: the planted fault
    becomes findings of the outputs, promise and reference oracles; each
    replays from its JSON alone on the real engine, whose restore path is
    right: not reproduced."""
    from fuzz.replaying.replay import replay_case
    from fuzz.results.findings import load_finding

    case = parse_case(
        {
            "schema": 1,
            "deployment": {"model": "granitemoehybrid", "engine": "llamacpp", "llamacpp_args": ["--ubatch-size", "64"]},
            "trace": [{"prompt": [{"segment": "A", "length": 300}], "max_tokens": 2}] * 2,
        }
    )
    campaign = Campaign(StaleRestoreEngine(llamacpp), tmp_path, shrink_calls=0)
    written = campaign.check(case)
    assert campaign.stats.harness_errors == 0
    oracles = {json.loads(p.read_text())["oracle"] for p in written}
    assert "outputs" in oracles and "promise" in oracles
    case_of, finding = load_finding(next(p for p in written if "outputs" in p.name))
    assert finding["first_divergence"] == 1 and finding["observed"]["hits"][1] < 296
    result = replay_case(case_of, finding, llamacpp)
    assert result["verdict"] == "not reproduced" and "outputs does not fire" in result["reasons"]


def test_planted_stale_restore_is_reported_as_different_outputs(llamacpp):
    case = json.loads(EXAMPLES[0].read_text())
    obs = llamacpp.run(case, {"cold": True, "test_double": "stale_restore"})
    assert obs["harness"]["test_double"] == "stale_restore"
    div = check_outputs(parse_case(case), VERSION, obs)
    assert div and div[0].requests[0] == 1  # the first request that shares a prefix
    assert 0 not in div[0].requests  # the first request shares nothing: served as it is


def test_each_case_places_checkpoints_with_its_own_n_ubatch_in_one_worker(llamacpp):
    """L1 (a function-static of llama.cpp) cannot reach a later case: each
    runs in a child process of its own (engine_adapter/llamacpp_engine/isolate.py)."""

    def case(ubatch):
        return {
            "schema": 1,
            "deployment": {
                "model": "nemotron_h",
                "engine": "llamacpp",
                "llamacpp_args": ["--ubatch-size", str(ubatch)],
            },
            "trace": [{"prompt": [{"segment": "A", "length": 400}]}],
        }

    first = llamacpp.run(case(128), {"cold": False})
    assert first["explain"][0]["checkpoints_created"] == [268, 396]  # 400 - 4 - 128, 400 - 4
    again = llamacpp.run(case(256), {"cold": False})
    assert "error" not in again, again.get("error")
    assert again["explain"][0]["checkpoints_created"] == [140, 396]  # 400 - 4 - 256: its own n_ubatch


def test_l1_reproduced_in_one_process_and_its_finding_replays(llamacpp, tmp_path):
    """Finding L1: a first server of n_ubatch 128 in the case's process
    (run option ``first_server_n_ubatch``) makes the case's server place its
    checkpoints 4 + 128 tokens before the end, not 4 + 512: the rule oracle
    fires and the diverging sibling recomputes its whole prompt. The finding
    carries the option, so it replays from its JSON alone."""
    from fuzz.replaying.replay import replay_case
    from fuzz.results.findings import load_finding
    from fuzz.results.report_llamacpp import reproduce_l1

    path = reproduce_l1(llamacpp, tmp_path)
    assert path is not None
    case_of, finding = load_finding(path)
    assert finding["oracle"] == "reference" and finding["harness"]["options"] == {"first_server_n_ubatch": 128}
    assert finding["explain"]["engine"][0]["checkpoints_held"] == [1068, 1196]  # 1200 - 4 - 128, not 1200 - 4 - 512
    assert finding["observed"]["hits"] == [0, 0] and finding["expected"]["hits"] == [0, 684]
    assert replay_case(case_of, finding, llamacpp)["verdict"] == "reproduced"
