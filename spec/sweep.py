"""The concrete sweep: every S that is a multiple of 16 up to 4096, with every
valid (A, M) of 16-multiples, and symbolic N.

4,142 geometries: 256 uniform (A = M = S), 1,210 aligned (A = S, M | S,
M < S), 1,210 partial (M = S, A | S, A < S), 1,210 hashed (A = M = S, a hash
unit H | S, H < S) and 256 unitary (a single Mamba group). One solver call
per row covers a whole class: the geometry digits
``(m, u)`` are constrained to the swept set (``u = 16*d`` and
``m <= 256 // d``, a disjunction over d, so everything stays linear).

* A row expected **proved** must be unsatisfiable over the whole set.
* A row expected **refuted** is checked to be refuted on *every* swept
  geometry, without one query per geometry: z3's optimiser finds the
  counterexample with the smallest digits ``(n, j, s)`` of N (N = n*S + j*u
  + s), then one more query shows that N with those digits refutes the claim
  on every geometry of the set (the digits are valid on all of them:
  ``j < m`` and ``s < u`` for the smallest m and u).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import z3

from spec.catalogue import CLASSES, EXPECT, MODE_NAMES, Row, _letter
from spec.geometry import sweep_geometries

LIMIT, STEP = 4096, 16
MIN_M = {"uniform": 1, "aligned": 2, "partial": 2, "hashed": 2, "unitary": 1}


def domain(g, cls: str, limit: int = LIMIT, step: int = STEP) -> z3.BoolRef:
    """The swept geometries of a class, as a premise over (m, u): u = step*d
    with 1 <= d <= limit/step and m*d <= limit/step, written as a disjunction
    over the ranges of d that share the bound floor((limit/step)/d), so it
    stays linear and short."""
    m, u = g.sp.m, g.sp.u
    top = limit // step
    d = z3.Int(f"{g.sp.tag}.sweep_d")
    base = [u == step * d, d >= 1, d <= top]
    if cls in ("uniform", "unitary"):
        return z3.And(*base)
    lo = MIN_M[cls]
    groups: dict[int, list[int]] = {}
    for dd in range(1, top + 1):
        if top // dd >= lo:
            groups.setdefault(top // dd, []).append(dd)
    return z3.And(
        *base, m >= lo, z3.Or(*[z3.And(d >= min(ds), d <= max(ds), m <= bound) for bound, ds in groups.items()])
    )


def count(cls: str, limit: int = LIMIT, step: int = STEP) -> int:
    return len(sweep_geometries(limit, step, (cls,)))


@dataclass
class SweepResult:
    row: Row
    geometries: int
    verdict: str  # proved | refuted | unknown
    everywhere: bool | None  # refuted rows: the family refutes every geometry
    seconds: float
    family: tuple[int, int, int] | None = None
    witness: dict[str, Any] | None = None
    reason: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        if self.verdict != self.row.expect:
            return False
        return self.verdict == "proved" or bool(self.everywhere)


def sweep_row(row: Row, *, seed: int = 0, timeout_ms: int = 30000, limit: int = LIMIT, step: int = STEP) -> SweepResult:
    t0 = time.perf_counter()
    q = row.build()
    cls = row.geometry
    dom = domain(q.g, cls, limit, step)
    n_geo = count(cls, limit, step)
    N = q.counts["N"]
    # One optimiser call: unsat proves the row over the set; sat gives the
    # counterexample with the smallest digits of N.
    o = z3.Optimize()
    o.set("timeout", timeout_ms)
    z3.set_param("smt.random_seed", seed)
    o.add(*q.premises, dom, z3.Not(q.claim))
    for dig in (N.n, N.j, N.s):
        if not isinstance(dig, int):
            o.minimize(dig)
    res = o.check()
    if res == z3.unknown:
        return SweepResult(row, n_geo, "unknown", None, time.perf_counter() - t0, reason=o.reason_unknown())
    if res == z3.unsat:
        return SweepResult(row, n_geo, "proved", None, time.perf_counter() - t0)
    model = o.model()
    fam = tuple(d if isinstance(d, int) else model.eval(d, model_completion=True).as_long() for d in (N.n, N.j, N.s))
    witness = q.decode(model)
    witness["geometry"] = witness["geometry"].label()
    # Does N = (n, j, s) refute the claim on every swept geometry?
    valid = fam[1] < MIN_M[cls] and fam[2] < step
    everywhere = False
    if valid:
        f = z3.SolverFor("QF_LIA")
        f.set("timeout", timeout_ms)
        pins = [d == v for d, v in zip((N.n, N.j, N.s), fam) if not isinstance(d, int)]
        f.add(*q.premises, dom, *pins, q.claim)
        everywhere = f.check() == z3.unsat
    return SweepResult(row, n_geo, "refuted", everywhere, time.perf_counter() - t0, fam, witness)


def sweep_rows() -> list[Row]:
    """R1 and R2 (every state written) for every rule, mode and class."""
    out = []
    for cls in CLASSES:
        for (prop, rule), verdicts in EXPECT["mask"][cls].items():
            for mode, v in zip(MODE_NAMES, verdicts):
                out.append(Row(prop, cls, mode, rule, "mask", _letter(v)))
    return out


def _work(args):
    row, seed = args
    return sweep_row(row, seed=seed)


def run_sweep(rows=None, *, jobs: int | None = None, seed: int = 0) -> list[SweepResult]:
    from spec.parallel import pmap

    return pmap(_work, [(r, seed) for r in (rows or sweep_rows())], jobs, chunksize=2)
