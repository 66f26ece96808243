"""The proofs: every catalogue row must come out as ``spec.catalogue``
expects (proved / refuted), within the solver timeout; unknown fails.

A refuted row is a finding about a retention rule (its minimal
counterexample is in ``test_minimal`` and in ``kvspec prove``'s case files),
not a broken test."""

from __future__ import annotations

import pytest

from spec.catalogue import Row, rows, run_row
from spec.geometry import MODE

FAST = rows("fast")


def _check(result, row: Row) -> None:
    assert result.verdict != "unknown", (
        f"{row.id}: solver gave up ({result.reason}); a slow proof fails instead of hanging"
    )
    assert result.verdict != "error", f"{row.id}: {result.reason}"
    assert result.verdict == row.expect, (
        f"{row.id}: expected {row.expect}, got {result.verdict}; counterexample {result.counterexample}"
    )


@pytest.mark.parametrize("row", FAST, ids=lambda r: r.id)
def test_row(row: Row, proof_results) -> None:
    _check(proof_results[row.id], row)


@pytest.mark.slow
def test_slow_row(slow_row: Row, slow_proof_results) -> None:
    """Every other row of ``rows("all")`` (parametrized by the conftest only
    when the slow tier is asked for)."""
    _check(slow_proof_results[slow_row.id], slow_row)


def test_catalogue_covers_issue_4() -> None:
    """R1 and R2, for promise/replay/legacy, with and without the EAGLE drop,
    both lookup ceilings, on every geometry class (issue 9's hashed too), are all in the catalogue
    (``kvspec prove``, which CI runs); the fast tier has each of them per
    class in #53504's mode, and in every mode on the #53504 geometry."""
    from spec.catalogue import FAST_MODE, FAST_NAMED

    full = {(r.prop, r.rule, r.mode, r.geometry) for r in rows("full") if r.level == "mask"}
    fast = {(r.prop, r.rule, r.mode, r.geometry) for r in FAST if r.level == "mask"}
    for prop in ("R1", "R2"):
        for rule in ("promise", "replay", "legacy"):
            for mode in MODE:
                assert (prop, rule, mode, f"named:{FAST_NAMED}") in fast
                for cls in ("uniform", "aligned", "partial", "hashed", "unitary"):
                    assert (prop, rule, mode, cls) in full
            for cls in ("uniform", "aligned", "partial", "hashed", "unitary"):
                assert (prop, rule, FAST_MODE, cls) in fast
    assert {m.eagle_drop for m in MODE.values()} == {True, False}
    assert {m.ceiling for m in MODE.values() if m.eagle_drop} == {"n_minus_1", "hashed"}


def test_catalogue_covers_issue_10() -> None:
    """junction-observed (every rule) and junction-unobserved, on every
    hybrid class, every mode, one-shot and chunked prefill, sparse, periodic
    and dense retention, are all in ``kvspec prove --all``; the fast tier has
    every class and rule for the issue 10 server."""
    from spec.catalogue import JUNCTION_FAST

    have = {(r.prop, r.rule, r.mode, r.geometry, r.level) for r in rows("all") if r.prop.startswith("junction-")}
    fast = {(r.prop, r.rule, r.mode, r.geometry, r.level) for r in FAST if r.prop.startswith("junction-")}
    mode, setting = JUNCTION_FAST
    for cls in ("uniform", "aligned", "partial", "hashed"):
        for m in MODE:
            for level in ("oneshot", "chunked"):
                for retention in ("sparse", "periodic", "dense"):
                    assert ("junction-unobserved", "promise", m, cls, f"{level}/{retention}") in have
                    for rule in ("promise", "replay", "legacy"):
                        assert ("junction-observed", rule, m, cls, f"{level}/{retention}") in have
        assert ("junction-unobserved", "promise", mode, cls, setting) in fast
        for rule in ("promise", "replay", "legacy"):
            assert ("junction-observed", rule, mode, cls, setting) in fast


@pytest.mark.parametrize("seed", range(8))
def test_unbounded_replay_proof_is_stable_over_seeds(seed: int) -> None:
    """The headline proof (replay keeps the resend's state, every geometry
    with hits on S, no bounds) gives the same verdict under 8 solver seeds."""
    for cls in ("uniform", "aligned"):
        row = Row("R1", cls, "drop/0.30", "replay", "mask")
        result = run_row(row, seed=seed)
        assert result.verdict == "proved", (seed, result.reason)


def test_refutations_are_real_models() -> None:
    """A refuted row's model is a valid geometry and prompt (the premises
    were satisfiable: not a vacuous answer)."""
    result = run_row(Row("R1", "uniform", "drop/0.30", "legacy", "mask", "refuted"))
    c = result.counterexample
    assert c and c["N"] >= 1 and c["S"] >= 1 and c["resend"] > 0


def test_catalogue_covers_issue_9() -> None:
    """The hashed class (attention = Mamba = B above the hash unit) has every
    property the other hybrid classes have (R1/R2 at both levels, chunked
    prefill, the other properties, both junction properties at every level
    and retention), and ``kvspec prove`` reports the deployments that
    resolve to it (Qwen3-Next on an A100 at 544 with a match unit of 16 or
    32, on an H100 at 576/32) and the H100's default 576."""
    from spec.geometry import NAMED_BY

    props = {
        cls: {(r.prop, r.level, r.rule, r.mode) for r in rows("all") if r.geometry == cls}
        for cls in ("partial", "hashed")
    }
    assert props["hashed"] == props["partial"]
    named = {r.geometry for r in rows("full")}
    for name in ("qwen3-next a100 544/16", "qwen3-next a100 544/32", "qwen3-next h100 576/32"):
        assert NAMED_BY[name].cls == "hashed" and f"named:{name}" in named
    assert NAMED_BY["qwen3-next h100 576"].cls == "uniform" and "named:qwen3-next h100 576" in named
