"""The one campaign summary (fuzz.driving.summary): each runner's JSON written as it
was, read back, added up across workers, and turned into the exit code."""

from __future__ import annotations

import json
import time

import pytest

from fuzz.driving.config import RunConfig
from fuzz.driving.outcome import EXIT_FINDINGS, EXIT_HARNESS, EXIT_OK
from fuzz.driving.summary import ATHERIS_KEYS, EMPTY_KEYS, IN_PROCESS_KEYS, RAY_KEYS, CampaignSummary


def _in_process(**kw) -> dict:
    d = {k: None for k in IN_PROCESS_KEYS}
    d.update(
        engine="vllm==0.33.0",
        driver="random",
        elapsed_s=2.0,
        execs=10,
        exec_per_s=5.0,
        cases=4,
        cases_per_s=2.0,
        engine_runs_per_s=5.5,
        unsupported=1,
        rejected=0,
        harness_errors=0,
        cut_at_deadline=0,
        duplicates=2,
        workers_died=0,
        findings=[{"path": "a.json", "summary": "s"}],
        reach={"deployment_classes": 1},
        case_files=None,
    )
    d.update(kw)
    return d


def _atheris(**kw) -> dict:
    d = {k: 0 for k in ATHERIS_KEYS}
    d.update(
        engine="vllm==0.33.0",
        in_process=True,
        execs=40,
        exec_per_s=7,
        engine_runs=33,
        cases=20,
        cases_per_s=2.5,
        engine_runs_per_s=4.25,
        coverage=17,
        findings=[],
        first_finding_s=None,
        worker_exit_codes=[0],
        stopped_at_deadline=True,
        worker_tail=[],
    )
    d.update(kw)
    return d


@pytest.mark.parametrize("keys", [IN_PROCESS_KEYS, ATHERIS_KEYS, RAY_KEYS, EMPTY_KEYS])
def test_each_runners_json_is_read_back_and_written_as_it_was(keys):
    data = {k: f"value of {k}" for k in keys}
    back = CampaignSummary.from_dict(json.loads(json.dumps(data))).to_dict()
    assert back == data and list(back) == list(keys)  # the same keys, in the same order


def test_a_key_that_is_no_field_is_refused():
    with pytest.raises(ValueError, match="not fields"):
        CampaignSummary(("execs", "speed"))
    assert CampaignSummary.from_dict({"execs": 3, "speed": 9}).to_dict() == {"execs": 3}


def test_merge_adds_counts_and_rates_and_keeps_the_best_coverage():
    a = CampaignSummary.from_dict(_in_process())
    b = CampaignSummary.from_dict(_atheris(workers_died=1, harness_errors=2))
    total = CampaignSummary(RAY_KEYS, engine="vllm==0.33.0").merge(a, b)
    assert (
        total.execs,
        total.engine_runs,
        total.cases,
        total.unsupported,
        total.duplicates,
        total.harness_errors,
        total.workers_died,
    ) == (50, 33, 24, 1, 2, 2, 1)
    assert (total.exec_per_s, total.engine_runs_per_s, total.cases_per_s) == (12.0, 9.75, 4.5)
    assert total.coverage == 17 and list(total.to_dict()) == list(RAY_KEYS)
    assert CampaignSummary(RAY_KEYS).merge(a, a).coverage is None  # no worker had coverage
    assert (a.execs, a.coverage) == (10, None)  # the summaries merged are left as they were


def test_the_exit_code_reads_the_summary():
    assert CampaignSummary.from_dict(_in_process(findings=[])).outcome() == (EXIT_OK, "ran; no finding")
    assert CampaignSummary.from_dict(_in_process()).outcome()[0] == EXIT_FINDINGS
    assert CampaignSummary.from_dict(_atheris(workers_died=1)).outcome()[0] == EXIT_HARNESS
    assert (
        CampaignSummary.from_dict(_in_process(findings=[], harness_errors=3, execs=10)).outcome(limit=0.5)[0] == EXIT_OK
    )
    assert (
        CampaignSummary.from_dict(_in_process(findings=[], harness_errors=3, execs=10)).outcome(limit=0.1)[0]
        == EXIT_HARNESS
    )


def test_ray_adds_up_its_workers_in_ray_keys(tmp_path):
    from fuzz.driving.ray_runner import _empty, _merge

    now = time.time()
    from ground.engines import EngineSpec

    engine = EngineSpec("vllm", "0.33.0")
    empty = _empty({"engine": engine.to_json(), "driver": "random"}).to_dict()
    assert empty["engine"] == "vllm==0.33.0"
    assert list(empty) == list(EMPTY_KEYS)
    results = [
        {
            "id": "job-0",
            "status": "ok",
            "attempt": 0,
            "host": "h1",
            "pid": 1,
            "error": None,
            "result": {
                "summary": _in_process(startup_s=0.5, first_finding_s=0.75),
                "started_unix": now + 1,
                "findings": [{"name": "promise-abc.json", "data": {"summary": "found"}}],
                "harness_errors": [],
                "corpus": [],
            },
        },
        {
            "id": "job-1",
            "status": "ok",
            "attempt": 1,
            "host": "h2",
            "pid": 2,
            "error": None,
            "result": {
                "summary": _atheris(startup_s=1.5),
                "started_unix": now + 2,
                "findings": [],
                "harness_errors": [],
                "corpus": [],
            },
        },
        {
            "id": "job-2",
            "status": "ok",
            "attempt": 0,
            "host": "h1",
            "pid": 3,
            "error": None,
            "result": {"summary": empty, "started_unix": now, "findings": [], "harness_errors": [], "corpus": []},
        },
        {"id": "job-3", "status": "lost", "attempt": None, "host": None, "pid": None, "error": "died", "result": None},
    ]
    config = RunConfig("random", 1, jobs=4)
    s = _merge(results, config, "local", [], [engine], tmp_path, None, set(), time.monotonic(), now - 10).to_dict()
    assert list(s) == list(RAY_KEYS)
    assert (s["execs"], s["engine_runs"], s["cases"], s["coverage"], s["duplicates"], s["workers_died"]) == (
        50,
        33,
        24,
        17,
        2,
        1,
    )  # the lost worker died
    assert (s["exec_per_s"], s["startup_s"], s["first_finding_s"]) == (12.0, 13.5, 11.75)
    assert (
        s["findings"] == [{"path": str(tmp_path / "promise-abc.json"), "summary": "found"}] and s["case_files"] is None
    )
    assert [(t["id"], t["execs"], t["findings_reported"], t["duplicates"]) for t in s["ray_tasks"]] == [
        ("job-0", 10, 1, 2),
        ("job-1", 40, 0, 0),
        ("job-2", 0, 0, 0),
        ("job-3", None, 0, None),
    ]
    assert (s["ray_retried"], s["ray_nodes"]) == (1, ["h1", "h2"])
