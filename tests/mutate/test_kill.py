"""One mutant, one task, on the real engine: a planted fault in the Mamba
lookup is killed by kvspec within its budget; a fault that stalls the
prefill is killed by kvspec's ``engine_error`` oracle (vLLM still imports,
so it is no crash); a reviewed equivalent mutant survives and is counted
apart (the real survivor); a mutant that breaks vLLM's import is counted
apart; a patch kvspec cannot build is a harness failure, never a kill; a
finished mutant is not run twice."""

from __future__ import annotations

import json

import pytest

from ground.files import write_json_atomic
from mutate import report
from mutate.generate import positions, select, unified_diff
from mutate.kill import read_result, run_mutant
from mutate.run import base_engine, default_base_patches
from mutate.targets import release_vllm_root
from reference.case import case_to_dict

pytestmark = pytest.mark.engine

FILE = "v1/core/kv_cache_coordinator.py"


@pytest.fixture(scope="module")
def base():
    """0.33.0 with kvspec's fixes: the base mutants are planted in (the
    release alone fails R2, which would 'kill' any mutant)."""
    from tests.engine.conftest import ensure_env

    ensure_env("0.33.0")
    patches = default_base_patches("0.33.0")
    assert [p.rsplit("/", 1)[1] for p in patches] == [
        "vllm-0.33.0-admission-cow-block.diff",
        "vllm-0.33.0-async-self-preemption.diff",
        "vllm-0.33.0-hash-unit-tail-beside-checkpoint.diff",
        "vllm-0.33.0-longer-sibling-of-aligned-prompt.diff",
        "vllm-0.33.0-stale-state-after-partial-hit.diff",
    ]
    return base_engine("0.33.0", patches), patches


@pytest.fixture(scope="module")
def root(base):
    return release_vllm_root(base[0].split("==", 1)[1])


#: A block-aligned prompt resent under MTP with the EAGLE drop (Qwen3-Next on
#: an A100 resolves B = 560 on 0.33.0): 11200 = 20 B. Only an aligned prompt
#: tells the two replay boundaries apart (otherwise resend and extension
#: floor to the same block and each covers the other's mutant).
ALIGNED_EAGLE_RESEND = {
    "schema": 1,
    "name": "aligned-eagle-resend-qwen3-next-a100",
    "deployment": {
        "model": "qwen3_next",
        "platform": "cuda",
        "device": "a100",
        "vllm_args": [
            "--enable-prefix-caching",
            "--speculative-config",
            '{"method":"mtp","num_speculative_tokens":2,"disable_lookahead_block_hashes":true}',
        ],
    },
    "trace": [{"prompt": [{"segment": "A", "length": 11200}]}] * 3,
}


@pytest.fixture()
def options(tmp_path, base):
    from fuzz.replaying.checkbuild import example_cases

    cases = tmp_path / "cases.json"  # no proof seeds to map in a test: one aligned EAGLE resend, then the examples
    write_json_atomic(cases, [ALIGNED_EAGLE_RESEND, *(case_to_dict(c) for _n, c in example_cases())])
    return {
        "out": str(tmp_path / "run"),
        "release": "0.33.0",
        "seed": 1,
        "vllm_tests": False,
        "cases": str(cases),
        "base_patches": base[1],
        "base_engine": base[0],
    }


def _hand_mutant(root, mid: str, after: str) -> dict:
    before = (root / FILE).read_text()
    return {
        "id": mid,
        "area": "replay",
        "file": FILE,
        "function": "replay_boundaries",
        "operator": "test",
        "occurrence": 0,
        "line": 1,
        "before": "",
        "after": "",
        "diff": unified_diff(FILE, before, after),
    }


def test_a_mamba_lookup_mutant_is_killed_by_kvspec_and_its_build_removed(root, options, monkeypatch):
    from engine_adapter.host import builds, environments

    cands = [
        m
        for m in positions(root)
        if m["function"] == "MambaManager.find_longest_cache_hit" and m["operator"] == "core/ReplaceBreakWithContinue"
    ]
    (m,) = [
        x
        for x in select(root, cands, only=[c["id"] for c in cands])
        if x["before"].startswith("break  # we just need the last match")
    ]
    # the right-to-left search goes on past the longest match: the Mamba hit falls to the shortest one
    res = run_mutant(m, 25.0, options)
    kv = res["kvspec"]
    assert res["status"] == "ran", res
    assert kv["killed"] is True and 0 <= kv["seconds_to_kill"] <= 25.0, kv
    assert kv["promise"] in ("R1", "R2") and kv["oracle"] in ("promise", "sparse_dense"), kv
    assert res["engine"].split("==")[1] not in environments.list_builds()
    # idempotent: a retried task returns the stored result and builds nothing
    monkeypatch.setattr(builds, "prepare", lambda *a, **k: pytest.fail("rebuilt a judged mutant"))
    assert run_mutant(m, 25.0, options) == res == read_result(options["out"], m["id"])
    s = report.summarize([res], equivalent={})
    assert s["counts"]["kvspec only"] == 1 and s["kvspec_score"] == 1.0


@pytest.mark.slow  # over a minute on 2 cores: `make test-slow` (Makefile, test tiers)
def test_a_mutant_that_stalls_the_prefill_imports_and_is_killed_by_an_oracle(root, options):
    """Cosmic Ray's Add -> Sub on the split's chunk end: vLLM imports (the
    build's self-test only imports), then its scheduler schedules nothing;
    kvspec's step loop bounds that and the engine_error oracle kills it."""
    cands = [
        m
        for m in positions(root)
        if m["function"] == "Scheduler._mamba_block_aligned_split"
        and m["operator"] == "core/ReplaceBinaryOperator_Add_Sub"
    ]
    (m,) = [
        x
        for x in select(root, cands, only=[c["id"] for c in cands])
        if x["before"].strip() == "end = start + num_new_tokens"
    ]
    res = run_mutant(m, 10.0, options)
    kv = res["kvspec"]
    assert res["status"] == "ran" and kv["killed"] is True, res
    assert kv["oracle"] == "engine_error" and kv["promise"] == "errors" and "no progress" in kv["summary"], kv
    assert report.summarize([res], equivalent={})["counts"]["kvspec only"] == 1


@pytest.mark.slow  # over a minute on 2 cores: `make test-slow` (Makefile, test tiers)
def test_a_reviewed_equivalent_mutant_survives_and_is_counted_apart(root, options):
    """``resend * block`` in replay_boundaries' EAGLE branch: 0.33.0 keeps
    the state a resend needs through the prompt checkpoint's back-off, so
    no oracle can kill it (mutate/equivalent.json), and it is no score."""
    from mutate.equivalent import reviewed

    cands = [
        m
        for m in positions(root)
        if m["function"] == "replay_boundaries" and m["operator"] == "core/ReplaceBinaryOperator_Sub_Mul"
    ]
    (m,) = [x for x in select(root, cands, only=[c["id"] for c in cands]) if "max(resend * block, 0)" in x["after"]]
    res = run_mutant(m, 8.0, options)
    assert res["status"] == "ran" and res["kvspec"]["killed"] is False and res["kvspec"]["execs"] > 0, res
    assert reviewed()[m["id"]]["kind"] == "equivalent"
    s = report.summarize([res])
    assert s["counts"]["equivalent"] == 1 and s["scored"] == 0


def test_a_mutant_that_breaks_the_import_is_counted_apart(root, options):
    source = (root / FILE).read_text()
    m = _hand_mutant(root, "crash-test", "import kvspec_no_such_module\n" + source)
    res = run_mutant(m, 10.0, options)
    assert res["status"] == "crash" and "self-test failed" in res["reason"], res
    assert "kvspec" not in res
    s = report.summarize([res], equivalent={})
    assert s["counts"]["crash"] == 1 and s["scored"] == 0


def test_a_patch_kvspec_cannot_build_is_a_harness_failure_not_a_kill(root, options):
    m = _hand_mutant(root, "harness-test", "x = 1\n")
    m["diff"] = m["diff"].replace(
        "def replay_boundaries", "def replay_boundaries_not_in_the_release", 1
    )  # context no release has
    res = run_mutant(m, 10.0, options)
    assert res["status"] == "harness" and res["reason"].startswith("build:"), res
    s = report.summarize([res], equivalent={})
    assert s["counts"]["harness"] == 1 and s["kvspec_killed"] == 0 and s["scored"] == 0
    assert (
        json.loads((report.Path(options["out"]) / "mutants" / "harness-test" / "result.json").read_text())["status"]
        == "harness"
    )
