"""Running a query: seeded solvers, a timeout, vacuity checks, verdicts.

A query is premises (what a valid geometry and prompt are, plus the side
constraints that name intermediate digits) and a claim. ``decide`` first
checks that the premises are satisfiable (an ``unsat`` under contradictory
premises proves nothing), then asks for a model of premises and not-claim:

* ``proved``: unsat, the claim holds for every model of the premises;
* ``refuted``: sat, with the counterexample model;
* ``unknown``: the solver gave up or hit the timeout (a failure in tests:
  a slow proof fails instead of hanging);
* ``error``: the premises are unsatisfiable, or z3 raised.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import z3

VERDICTS = ("proved", "refuted", "unknown", "error")
DEFAULT_TIMEOUT_MS = 5000


@dataclass
class Outcome:
    verdict: str
    seconds: float
    model: z3.ModelRef | None = None
    reason: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


def solver(seed: int = 0, timeout_ms: int = DEFAULT_TIMEOUT_MS, logic: str | None = None) -> z3.Solver:
    """A fresh, seeded solver with a timeout. The default pipeline
    (simplify, solve-eqs, elim-term-ite, then the SMT core) is about 40%
    faster than ``SolverFor("QF_LIA")`` on these queries; ``logic`` picks
    z3's own solver for that logic instead."""
    if logic:
        s = z3.SolverFor(logic)
        s.set("random_seed", seed)
    else:
        s = z3.Then("simplify", "solve-eqs", "elim-term-ite", z3.With("smt", random_seed=seed)).solver()
    s.set("timeout", timeout_ms)
    return s


def decide(
    premises: list,
    claim: z3.BoolRef,
    *,
    seed: int = 0,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    logic: str | None = None,
    vacuity: bool = True,
) -> Outcome:
    """Prove ``claim`` under ``premises``; see the module docstring.

    Two fresh solvers (z3's incremental mode is several times slower on
    these queries): premises and not-claim; then, only when that is unsat,
    the premises alone must be sat (a sat answer already shows it)."""
    t0 = time.perf_counter()
    try:
        s = solver(seed, timeout_ms, logic)
        s.add(*premises)
        s.add(z3.Not(claim))
        res = s.check()
        if res == z3.sat:
            return Outcome("refuted", time.perf_counter() - t0, s.model())
        if res == z3.unknown:
            return Outcome("unknown", time.perf_counter() - t0, reason=s.reason_unknown())
        if vacuity:
            p = solver(seed, timeout_ms, logic)
            p.add(*premises)
            first = p.check()
            if first == z3.unsat:
                return Outcome(
                    "error", time.perf_counter() - t0, reason="premises are unsatisfiable: the proof would be vacuous"
                )
            if first == z3.unknown:
                return Outcome("unknown", time.perf_counter() - t0, reason=f"premises: {p.reason_unknown()}")
        return Outcome("proved", time.perf_counter() - t0)
    except z3.Z3Exception as e:  # pragma: no cover - z3 internal failure
        return Outcome("error", time.perf_counter() - t0, reason=str(e))


def minimize(premises: list, claim: z3.BoolRef, objectives: list, *, seed: int = 0, timeout_ms: int = 20000) -> Outcome:
    """The lexicographically smallest counterexample (``z3.Optimize``):
    minimise each objective in turn. ``refuted`` with the model, ``proved``
    when there is none."""
    t0 = time.perf_counter()
    o = z3.Optimize()
    o.set("timeout", timeout_ms)
    z3.set_param("smt.random_seed", seed)
    o.add(*premises)
    o.add(z3.Not(claim))
    for obj in objectives:
        o.minimize(obj)
    res = o.check()
    dt = time.perf_counter() - t0
    if res == z3.sat:
        return Outcome("refuted", dt, o.model())
    if res == z3.unsat:
        return Outcome("proved", dt)
    return Outcome("unknown", dt, reason=o.reason_unknown())
