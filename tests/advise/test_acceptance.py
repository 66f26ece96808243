"""Issue 13's acceptance, on the real engines (``@pytest.mark.engine``):

* #53504's deployment (Qwen3.5-27B dimensions, TP 2, fp8, MTP 2, block 1600,
  an 11,910-token prompt x3) on vLLM 0.29.0: miss/miss/hit predicted, and
  the recommended retention restores miss/hit/hit on the engine, with its
  memory cost; on 0.33.0 no loss;
* interleaved conversations (#58303's shape) on vLLM 0.33.0 (Qwen3-Next,
  H100, vLLM's defaults): lost reuse reported, and the recommended
  retention removes it on the engine;
* a disagreement between the model and the engine is a ``reference``
  finding on disk.
"""

from __future__ import annotations

import json

import pytest

from advise import confirm, model, source, workloads
from fuzz.results.findings import load_finding
from ground.engines import EngineSpec
from reference.case import load_case, parse_case

pytestmark = pytest.mark.engine

SEED_DEPLOYMENT = "examples/seed-53504-deployment.json"


def _advise(engines, version: str, case, workload, out):
    src = source.from_deployment(case, EngineSpec("vllm", version), lambda: engines(version), use_cache=False)
    resolved = src.case(workload.requests, workload.name)
    advice = model.advise(resolved, version, src.facts)
    checked = confirm.confirm(src, resolved, advice, engines(version), out)
    return src, advice, checked


def _by_interval(checked):
    return {r["interval"]: r for r in checked["settings"]}


def test_53504_on_0_29_0_restores_miss_hit_hit_with_its_memory_cost(engines, tmp_path):
    workload = workloads.build("resend", {"requests": 3, "prompt_tokens": 11910})
    src, advice, checked = _advise(engines, "0.29.0", load_case(SEED_DEPLOYMENT), workload, tmp_path)
    assert src.geometry.scheduler_block_size == 1600
    assert [r["implemented"] for r in advice["requests"]] == [0, 0, 9600]  # miss/miss/hit
    assert [r["promise"] for r in advice["requests"]] == [0, 9600, 9600]
    rec = advice["retention"]["recommended"]
    assert rec["interval"] == 3200
    per_state = src.facts["mamba_layers"] * src.facts["mamba_page_size_bytes"]
    assert src.facts["mamba_layers"] == 48 and per_state == 48 * 1638400
    assert rec["states"] == 1 and rec["bytes_per_gpu"] == per_state and rec["bytes_all_gpus"] == 2 * per_state
    assert checked["status"] == "confirmed" and checked["findings"] == []
    engine = _by_interval(checked)
    assert engine[0]["engine_hits"] == [0, 0, 9600]
    assert engine[3200]["engine_hits"] == [0, 9600, 9600]  # miss/hit/hit on the real engine
    assert engine[3200]["engine_states"] == 1


def test_53504_on_0_33_0_loses_nothing(engines, tmp_path):
    workload = workloads.build("resend", {"requests": 3, "prompt_tokens": 11910})
    src, advice, checked = _advise(engines, "0.33.0", load_case(SEED_DEPLOYMENT), workload, tmp_path)
    assert advice["totals"]["lost_tokens"] == 0
    assert advice["retention"]["recommended"]["interval"] == 0
    assert checked["status"] == "confirmed"
    assert _by_interval(checked)[0]["engine_hits"] == [r["implemented"] for r in advice["requests"]]


def test_interleaved_conversations_on_0_33_0_the_recommendation_removes_the_loss(engines, tmp_path):
    case = parse_case(
        {
            "schema": 1,
            "deployment": {
                "model": "qwen3_next",
                "vllm_args": ["--enable-prefix-caching"],
                "platform": "cuda",
                "device": "h100",
            },
            "trace": [{"prompt": [{"segment": "A", "length": 1}]}],
        }
    )
    workload = workloads.build("interleaved", {})
    src, advice, checked = _advise(engines, "0.33.0", case, workload, tmp_path)
    assert advice["totals"]["lost_tokens"] > 0
    losing = [r["request"] for r in advice["requests"] if r["lost_tokens"]]
    assert losing
    rec = advice["retention"]["recommended"]
    assert rec["interval"] not in (0, None)  # a periodic setting, cheaper than dense
    assert rec["states"] < next(r["states"] for r in advice["retention"]["settings"] if r["interval"] is None)
    assert checked["status"] == "confirmed" and checked["findings"] == []
    promise = [r["promise"] for r in advice["requests"]]
    engine = _by_interval(checked)
    assert engine[rec["interval"]]["engine_hits"] == promise  # no request loses on the engine
    assert all(engine[0]["engine_hits"][i] < promise[i] for i in losing)  # and the current setting does


def test_a_disagreement_is_a_reference_finding(engines, tmp_path):
    """A model answer that is wrong (made wrong here) is caught by the
    engine and written as a finding; nothing is averaged away."""
    case = parse_case(
        {
            "schema": 1,
            "geometry": {
                "groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}],
                "retention_interval": 0,
            },
            "trace": [{"prompt": [{"segment": "A", "length": 40}]}],
        }
    )
    src = source.Source("hand", EngineSpec("vllm", "0.33.0"), case.geometry, None, {}, [], describe="hand")
    workload = workloads.build("resend", {"requests": 3, "prompt_tokens": 40})
    resolved = src.case(workload.requests)
    advice = model.advise(resolved, "0.33.0", {})
    right = confirm.confirm(src, resolved, advice, engines("0.33.0"), tmp_path / "right")
    assert right["status"] == "confirmed"
    advice["outcomes"][0].hits[1] += 16  # the model "predicts" one block more
    wrong = confirm.confirm(src, resolved, advice, engines("0.33.0"), tmp_path / "wrong")
    assert wrong["status"] == "disagrees"
    (path,) = wrong["findings"]
    judged, finding = load_finding(path)
    assert finding["oracle"] == "reference" and finding["first_divergence"] == 1
    assert finding["expected"]["hits"][1] == finding["observed"]["hits"][1] + 16
    assert (
        json.loads(open(path).read())["case"]["trace"]
        == [{"prompt": [{"segment": "A", "length": 40}], "max_tokens": 1}] * 3
    )
