"""The verdict machinery itself: vacuous premises are an error, a solver
that gives up is unknown (and an unknown row fails its test)."""

from __future__ import annotations

import z3

from spec.catalogue import Result, Row
from spec.solve import decide


def test_vacuous_premises_are_an_error() -> None:
    x = z3.Int("x")
    out = decide([x > 1, x < 0], x == 5)
    assert out.verdict == "error" and "vacuous" in out.reason


def test_proved_and_refuted() -> None:
    x = z3.Int("x")
    assert decide([x > 1], x > 0).verdict == "proved"
    out = decide([x > 1], x > 5)
    assert out.verdict == "refuted" and out.model.eval(x).as_long() <= 5


def test_timeout_is_unknown_and_fails_the_row() -> None:
    x, y, z = z3.Ints("x y z")
    # Fermat for cubes: nonlinear, far beyond a 50 ms budget.
    out = decide([x > 0, y > 0, z > 0], x * x * x + y * y * y != z * z * z, timeout_ms=50, logic="QF_NIA")
    assert out.verdict == "unknown"
    assert not Result(Row("R1", "uniform", "drop/0.30", "replay", "mask"), out.verdict, out.seconds).ok
