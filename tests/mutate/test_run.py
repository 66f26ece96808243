"""The loop: with --ray the mutants go to fuzz.driving.distribute.run_tasks as one
task each (keyword tasks of run_mutant, keyed by the mutant's id); a task
that ends without a result is counted as a harness failure, never a kill.
Ray itself is stood in for here (tests/distribute runs the real cluster)."""

from __future__ import annotations

import pytest

import fuzz.driving.distribute
import mutate.kill
from mutate import report
from mutate import run as runmod

pytestmark = pytest.mark.engine  # selects mutants from vllm==0.33.0's installed source


def test_ray_gets_one_keyword_task_per_mutant_and_a_lost_task_is_no_kill(tmp_path, monkeypatch):
    from tests.engine.conftest import ensure_env

    ensure_env("0.33.0")
    seen = {}

    def fake_run_tasks(fn, tasks, *, ray_address, out, retries, timeout_s, progress=None, **kw):
        seen.update(
            fn=fn, ids=[t["id"] for t in tasks], address=ray_address, retries=retries, kwargs=tasks[0]["kwargs"]
        )
        envs = []
        for i, t in enumerate(tasks):
            if i == 0:  # the first worker died past its retries
                envs.append({"id": t["id"], "status": "lost", "error": "worker died"})
                continue
            res = {
                "schema": mutate.kill.RESULT_SCHEMA,
                "id": t["id"],
                **{
                    k: t["kwargs"]["mutant"][k]
                    for k in ("area", "file", "function", "line", "operator", "before", "after")
                },
                "status": "ran",
                "kvspec": {"killed": True, "seconds_to_kill": 1.0},
                "vllm_tests": {"killed": False},
            }
            mutate.kill.write_json_atomic(mutate.kill.result_path(out.parent, t["id"]), res)
            envs.append({"id": t["id"], "status": "ok", "result": res})
        return envs

    monkeypatch.setattr(fuzz.driving.distribute, "run_tasks", fake_run_tasks)
    monkeypatch.setattr(mutate.kill, "fixed_cases", lambda release, out, progress=None: out / "cases.json")
    monkeypatch.setattr(
        runmod, "base_engine", lambda release, patches: "vllm==0.33.0"
    )  # mutants of the release's own source
    monkeypatch.setattr(runmod, "control", lambda *a, **k: {"killed": False, "execs": 0})
    results = runmod.run("0.33.0", out=tmp_path, budget=5.0, n=3, seed=2, vllm_tests=False, ray="auto")
    assert seen["fn"] is mutate.kill.run_mutant and seen["address"] == "auto" and seen["retries"] >= 1
    assert set(seen["kwargs"]) == {"mutant", "budget", "options"} and len(seen["ids"]) == 3 == len(set(seen["ids"]))
    assert [r["status"] for r in results] == ["harness", "ran", "ran"]
    s = report.summarize(results, equivalent={})
    assert s["counts"]["harness"] == 1 and s["kvspec_killed"] == 2 and s["scored"] == 2
