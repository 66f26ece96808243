"""vLLM 0.33.0's own prefix-cache tests as a conformance source.

``manifest.json`` (built by ``tests.conformance.build``) lists every hybrid
serial-trace expectation of vLLM 0.33.0's ``tests/v1/core`` with its
``file:line``, as a kvspec case plus the values the test asserts, and every
test that cannot be expressed, with why. For each expressed entry:

* the reference model, with the knobs vLLM 0.33.0 resolves and the rule it
  implements (``replay``), gives the test's values;
* the real vLLM 0.33.0 scheduler (``@pytest.mark.engine``) gives them, run
  with the adapter options that reproduce the test's own KV cache manager;
* the reference and the engine agree on the same case (hits, junctions,
  chunk ends, the first request's kept states).

A disagreement that is understood is an ``xfail(strict=True)`` whose reason
is in the manifest (and in docs/conformance.md); anything else fails.
"""

from __future__ import annotations

import json
import re

import pytest

from ground.files import load_json
from tests.conformance import build, runner
from tests.conformance.runner import EngineRuns

EXPRESSED = runner.entries(True)
NOT_EXPRESSED = runner.entries(False)


def _params(side: str):
    out = []
    for e in EXPRESSED:
        reason = e["xfail"].get(side)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(e, id=e["id"], marks=marks))
    return out


def _case_params():
    known = runner.manifest()["reference_vs_engine_xfail"]
    return [
        pytest.param(p, id=p, marks=[pytest.mark.xfail(strict=True, reason=known[p])] if p in known else [])
        for p in runner.case_paths()
    ]


# --------------------------------------------------------- the manifest itself


def test_manifest_and_cases_are_what_build_writes():
    """The committed manifest and case files are current (regenerate with
    ``python -m tests.conformance.build``)."""
    cases, manifest = build.build()
    assert load_json(runner.MANIFEST, "manifest") == manifest
    on_disk = {f"cases/{p.name}" for p in (runner.HERE / "cases").glob("*.json")}
    assert on_disk == set(cases)
    for path, doc in cases.items():
        assert load_json(runner.HERE / path, "case file") == doc, path


def test_every_entry_is_expressed_or_says_why():
    categories = runner.manifest()["not_expressible_categories"]
    assert EXPRESSED and NOT_EXPRESSED
    for e in NOT_EXPRESSED:
        assert e["category"] in categories, e["id"]
        assert e["reason"].strip() and e["asserts"].strip(), e["id"]
    for e in EXPRESSED:
        assert any(c["role"] == "expect" for c in e["checks"]), e["id"]
        assert e["fidelity"] in ("exact", "adapted"), e["id"]
        assert (e["fidelity"] == "adapted") == bool(e["adaptation"]), e["id"]
        assert set(e["xfail"]) <= {"reference", "engine"}, e["id"]


@pytest.mark.engine  # fetches the sdist from PyPI on first use
def test_cited_lines_are_the_tests_asserts():
    """Each ``file:line`` points at the test function (``def test_``) and each
    expected value at an ``assert`` line of vLLM 0.33.0's sdist."""
    root = runner.sdist()
    lines: dict[str, list[str]] = {}

    def line(path: str, n: int) -> str:
        if path not in lines:
            lines[path] = (root / path).read_text().splitlines()
        return lines[path][n - 1]

    for e in runner.entries():
        path, n = e["vllm_test"].rsplit(":", 1)
        assert re.match(r"\s*(async )?def test_", line(path, int(n))), e["vllm_test"]
        for c in e.get("checks", ()):
            if c["role"] == "expect":
                assert "assert" in line(path, c["line"]), f"{e['id']}: {path}:{c['line']}"


# ------------------------------------------------------------- the reference


def test_vllm_0_33_0_implements_the_replay_rule():
    assert runner.rule() == "replay"


@pytest.mark.parametrize("entry", [pytest.param(e, id=e["id"]) for e in EXPRESSED])
def test_reference_reproduces_the_tests_setup(entry):
    """The case resolves to the test's knobs and reproduces its setup
    (chunking, the resume point) on the reference model."""
    case = runner.load(entry["case"])
    result = runner.reference(entry["case"])
    problems = runner.knob_failures(entry, result["knobs"], case, engine=False) + runner.failures(
        entry, result, "setup"
    )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("entry", _params("reference"))
def test_reference_gives_the_tests_expectation(entry):
    result = runner.reference(entry["case"])
    problems = runner.failures(entry, result)
    assert not problems, f"{entry['vllm_test']}: " + "; ".join(problems)


# ---------------------------------------------------------------- the engine


@pytest.fixture(scope="module")
def engine_runs(engines):
    return EngineRuns(lambda: engines(runner.VERSION))


@pytest.mark.engine
@pytest.mark.parametrize("entry", [pytest.param(e, id=e["id"]) for e in EXPRESSED])
def test_engine_reproduces_the_tests_setup(entry, engine_runs):
    case = runner.load(entry["case"])
    result = engine_runs.run(entry["case"], entry["engine_options"])
    problems = runner.knob_failures(
        entry, result["knobs"], case, engine=True, options=entry["engine_options"]
    ) + runner.failures(entry, result, "setup")
    assert not problems, "\n".join(problems)


@pytest.mark.engine
@pytest.mark.parametrize("entry", _params("engine"))
def test_engine_gives_the_tests_expectation(entry, engine_runs):
    result = engine_runs.run(entry["case"], entry["engine_options"])
    problems = runner.failures(entry, result)
    assert not problems, f"{entry['vllm_test']}: " + "; ".join(problems)


@pytest.mark.engine
@pytest.mark.parametrize("case_path", _case_params())
def test_reference_agrees_with_the_engine(case_path, engine_runs):
    """Same case, no adapter options: the reference's prediction is what the
    real 0.33.0 scheduler does. A disagreement is a kvspec model bug."""
    diffs = runner.compare(runner.reference(case_path), engine_runs.run(case_path))
    assert not diffs, f"{case_path}: " + "; ".join(diffs)


@pytest.mark.engine
def test_committed_table_is_current(engine_runs):
    """docs/conformance.md is what ``python -m tests.conformance.table``
    writes from the current manifest, reference and engine."""
    from tests.conformance import table

    assert table.render(engine_runs) == table.TABLE.read_text(), "regenerate with: python -m tests.conformance.table"


def test_runner_checks_can_fail():
    """The check evaluator rejects a wrong value of every kind (guards the
    harness against passing anything)."""
    result = {
        "hits": [0, 6],
        "explain": [
            {
                "prompt_tokens": 7,
                "junction": 0,
                "chunk_ends": [6, 7],
                "retained_mamba_blocks": {"4": []},
                "retained_mamba_tokens": {"4": [6]},
            },
            {
                "prompt_tokens": 8,
                "junction": 0,
                "chunk_ends": [8],
                "retained_mamba_blocks": {"4": [1]},
                "retained_mamba_tokens": None,
            },
        ],
    }
    good = [
        build.hit(1, 6, 1),
        build.junction(1, 0, 1),
        build.chunk_ends(0, [6, 7], 1),
        build.chunk(1, 6, 8, 1),
        build.states(0, 1, includes=[6]),
        build.states(1, 1, exactly=[8]),
    ]
    bad = [
        build.hit(1, 4, 1),
        build.junction(1, 32, 1),
        build.chunk_ends(0, [7], 1),
        build.chunk(1, 0, 8, 1),
        build.states(0, 1, excludes=[6]),
        build.states(1, 1, exactly=[4, 8]),
    ]
    entry = {"checks": good + bad}
    verdicts = [ok for _, _, ok in runner.evaluate(entry, result)]
    assert verdicts == [True] * len(good) + [False] * len(bad), json.dumps(verdicts)
