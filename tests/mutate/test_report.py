"""The report's count: every mutant in exactly one class, crash / harness /
equivalent apart and in no score (no engine)."""

from __future__ import annotations

import json

from ground.files import write_json_atomic
from mutate import report
from mutate.kill import RESULT_SCHEMA, result_path


def _res(
    mid,
    status="ran",
    k=None,
    v=None,
    secs=None,
    area="replay",
    fn="replay_boundaries",
    file="v1/core/kv_cache_coordinator.py",
):
    r = {
        "schema": RESULT_SCHEMA,
        "id": mid,
        "area": area,
        "file": file,
        "function": fn,
        "line": 84,
        "operator": "core/NumberReplacer",
        "before": "a",
        "after": "b",
        "status": status,
    }
    if status == "ran":
        r["kvspec"] = {"killed": k, "seconds_to_kill": secs}
        r["vllm_tests"] = {"killed": v}
    else:
        r["reason"] = "why"
    return r


RESULTS = [
    _res("a-1", k=True, v=True, secs=2.0),
    _res("a-2", k=True, v=False, secs=4.0),
    _res("a-3", k=True, v=False, secs=9.0),
    _res(
        "b-1",
        k=False,
        v=True,
        area="split",
        fn="Scheduler._mamba_block_aligned_split",
        file="v1/core/sched/scheduler.py",
    ),
    _res(
        "b-2",
        k=False,
        v=False,
        area="split",
        fn="Scheduler._mamba_block_aligned_split",
        file="v1/core/sched/scheduler.py",
    ),
    _res("c-1", status="crash"),
    _res("c-2", status="harness"),
    _res("e-1", k=False, v=False),
]


def test_counts_add_up_and_apart_classes_are_in_no_score():
    s = report.summarize(RESULTS, equivalent={"e-1": {"id": "e-1", "argument": "x"}})
    c = s["counts"]
    assert c == {
        "both": 1,
        "kvspec only": 2,
        "vLLM tests only": 1,
        "neither": 1,
        "equivalent": 1,
        "crash": 1,
        "harness": 1,
    }
    assert sum(c.values()) == s["mutants"] == len(RESULTS)
    assert s["scored"] == c["both"] + c["kvspec only"] + c["vLLM tests only"] + c["neither"] == 5
    assert (s["kvspec_killed"], s["vllm_tests_killed"]) == (3, 2)
    assert (s["kvspec_score"], s["vllm_tests_score"]) == (0.6, 0.4)
    assert s["median_seconds_to_kill"] == 4.0
    assert [r["id"] for r in s["survivors"]] == ["b-2"]
    assert sum(v["scored"] for v in s["by_file"].values()) == s["scored"]
    assert s["by_function"]["Scheduler._mamba_block_aligned_split"] == {
        "scored": 2,
        "kvspec_killed": 0,
        "vllm_tests_killed": 1,
        "kvspec_score": 0.0,
        "vllm_tests_score": 0.5,
    }


def test_a_harness_failure_is_never_a_kill_even_with_a_finding_recorded():
    r = _res("h-1", status="harness")
    r["kvspec"] = {"killed": True, "seconds_to_kill": 1.0}  # a finding before the harness gave up
    s = report.summarize([r], equivalent={})
    assert (
        s["counts"]["harness"] == 1
        and s["scored"] == 0
        and s["kvspec_killed"] == 0
        and s["median_seconds_to_kill"] is None
    )


def test_write_reads_results_from_the_run_folder_and_writes_md_json_png(tmp_path):
    for r in RESULTS:
        write_json_atomic(result_path(tmp_path, r["id"]), r)
    s = report.write(tmp_path)
    assert s["mutants"] == len(RESULTS)
    assert json.loads((tmp_path / "report.json").read_text())["counts"]["crash"] == 1
    md = (tmp_path / "report.md").read_text()
    assert "| **kvspec** kills | both: 1 | kvspec only: 2 |" in md and "`b-2`" in md.split("## Survivors")[1]
    assert (tmp_path / "report.png").read_bytes()[:4] == b"\x89PNG"


def test_the_reviewed_equivalent_list_has_an_argument_for_every_entry():
    from mutate.equivalent import REVIEWED

    for e in json.loads(REVIEWED.read_text()):
        assert set(e) >= {"id", "kind", "argument", "check"} and e["argument"].strip() and "\n" not in e["argument"]
        assert e["kind"] in ("equivalent", "out of scope")


def test_equivalence_compares_behaviour_not_the_recorded_arguments_of_internal_calls():
    """mutate.equivalent.behaviour: what ran it and the arguments of vLLM's
    internal calls (the mutated code restated) are aside; hits and the
    retained states are not."""
    from mutate.equivalent import behaviour

    def obs(engine, boundaries, retained):
        return {
            "engine": engine,
            "timing": {"total_s": 1},
            "hits": [0, 544],
            "explain": [
                {
                    "boundaries": boundaries,
                    "cache_blocks": boundaries,
                    "chunk_ends": [544, 1088],
                    "written": [544, 1088],
                    "retained_mamba_blocks": retained,
                }
            ],
        }

    assert behaviour(obs("vllm==a", [543], {"544": [0]})) == behaviour(obs("vllm==b", [1087], {"544": [0]}))
    assert behaviour(obs("vllm==a", [543], {"544": [0]})) != behaviour(obs("vllm==a", [543], {"544": [0, 1]}))


def test_an_out_of_scope_mutant_stays_scored_and_a_second_score_leaves_it_out():
    rows = [
        {
            "id": "o-1",
            "status": "ran",
            "file": "f",
            "function": "g",
            "kvspec": {"killed": False},
            "vllm_tests": {"killed": True},
        },
        {
            "id": "k-1",
            "status": "ran",
            "file": "f",
            "function": "g",
            "kvspec": {"killed": True, "seconds_to_kill": 1.0},
            "vllm_tests": {"killed": False},
        },
        {
            "id": "e-1",
            "status": "ran",
            "file": "f",
            "function": "g",
            "kvspec": {"killed": False},
            "vllm_tests": {"killed": False},
        },
    ]
    s = report.summarize(
        rows, equivalent={"o-1": {"id": "o-1", "kind": "out of scope"}, "e-1": {"id": "e-1", "kind": "equivalent"}}
    )
    assert (
        s["counts"]["equivalent"] == 1 and s["scored"] == 2 and s["kvspec_killed"] == 1 and s["vllm_tests_killed"] == 1
    )
    assert s["out_of_scope"] == 1 and s["in_scope"] == {
        "scored": 1,
        "kvspec_killed": 1,
        "vllm_tests_killed": 0,
        "kvspec_score": 1.0,
        "vllm_tests_score": 0.0,
    }
    assert "within kvspec's scope" in report.markdown(s)


def test_a_survivor_reviewed_out_of_scope_says_why_among_the_candidates_for_a_new_oracle():
    rows = [
        {
            "id": "o-1",
            "status": "ran",
            "file": "f",
            "function": "g",
            "kvspec": {"killed": False},
            "vllm_tests": {"killed": False},
        },
        {
            "id": "n-1",
            "status": "ran",
            "file": "f",
            "function": "g",
            "kvspec": {"killed": False},
            "vllm_tests": {"killed": False},
        },
    ]
    s = report.summarize(
        rows,
        equivalent={
            "o-1": {"id": "o-1", "kind": "out of scope", "argument": "only DeepSeek-V4's compressed specs reach it"}
        },
    )
    survivors = report.markdown(s).split("## Survivors")[1].split("##")[0].strip().splitlines()
    (o1,) = [x for x in survivors if "`o-1`" in x]
    (n1,) = [x for x in survivors if "`n-1`" in x]
    assert o1.endswith("(out of scope: only DeepSeek-V4's compressed specs reach it)")
    assert "out of scope" not in n1


def test_vllm_tests_verdicts_are_reused_only_for_the_same_build(tmp_path):
    """--vllm-tests-from: an earlier run's verdict is taken where it judged
    the same mutant diff in the same base (the same engine name), and the
    report counts it; any other diff or engine runs vLLM's tests again."""
    from mutate.kill import reused_vllm_tests

    earlier = tmp_path / "earlier"
    verdict = {"killed": True, "killing_test": "tests/v1/core/test_x.py::test_y", "seconds": 20.0}
    write_json_atomic(
        result_path(earlier, "m-1"),
        {
            "schema": RESULT_SCHEMA,
            "id": "m-1",
            "status": "ran",
            "engine": "vllm==0.33.0+base.mutant.abc",
            "vllm_tests": verdict,
        },
    )
    (earlier / "mutants" / "m-1" / "mutant.diff").write_text("--- a\n+++ b\n")
    mutant = {"id": "m-1", "diff": "--- a\n+++ b\n"}
    options = {"vllm_tests_from": str(earlier)}
    got = reused_vllm_tests(mutant, "vllm==0.33.0+base.mutant.abc", options)
    assert got["killed"] is True and got["reused_from"].endswith("m-1/result.json")
    assert reused_vllm_tests({**mutant, "diff": "--- a\n+++ c\n"}, "vllm==0.33.0+base.mutant.abc", options) is None
    assert reused_vllm_tests(mutant, "vllm==0.33.0+other.mutant.abc", options) is None
    assert reused_vllm_tests(mutant, "vllm==0.33.0+base.mutant.abc", {}) is None
    s = report.summarize(
        [{"id": "m-1", "status": "ran", "kvspec": {"killed": False}, "vllm_tests": got}], equivalent={}
    )
    assert s["vllm_tests_reused"] == 1 and "taken from an earlier run" in report.markdown(s)
