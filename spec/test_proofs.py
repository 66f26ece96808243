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
SLOW = [r for r in rows("all") if r.slow]


def _check(result, row: Row) -> None:
    assert result.verdict != "unknown", f"{row.id}: solver gave up ({result.reason}); a slow proof fails instead of hanging"
    assert result.verdict != "error", f"{row.id}: {result.reason}"
    assert result.verdict == row.expect, f"{row.id}: expected {row.expect}, got {result.verdict}; counterexample {result.counterexample}"


@pytest.mark.parametrize("row", FAST, ids=lambda r: r.id)
def test_row(row: Row, proof_results) -> None:
    _check(proof_results[row.id], row)


@pytest.mark.slow
@pytest.mark.parametrize("row", SLOW, ids=lambda r: r.id)
def test_slow_row(row: Row, slow_proof_results) -> None:
    _check(slow_proof_results[row.id], row)


def test_catalogue_covers_issue_4() -> None:
    """R1 and R2, for promise/replay/legacy, with and without the EAGLE drop,
    both lookup ceilings, on every geometry class, are all in the fast tier."""
    have = {(r.prop, r.rule, r.mode, r.geometry) for r in FAST if r.level == "mask"}
    for prop in ("R1", "R2"):
        for rule in ("promise", "replay", "legacy"):
            for mode in MODE:
                for cls in ("uniform", "aligned", "partial", "unitary"):
                    assert (prop, rule, mode, cls) in have
    assert {m.eagle_drop for m in MODE.values()} == {True, False}
    assert {m.ceiling for m in MODE.values() if m.eagle_drop} == {"n_minus_1", "hashed"}


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
