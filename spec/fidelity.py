"""Encoding vs reference, by interval splitting.

For one concrete geometry the Python reference gives a property's truth for
every N in [1, N_max]. Rather than enumerate models one by one, cut that
range into maximal runs of equal truth and ask z3 once per run: on a run
where the reference says "holds" the encoding must admit no N with the
negated claim, on a run where it says "fails" no N with the claim. Two
answers per run (formula and negation), a few dozen runs per property.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import z3

from spec.properties import Query
from spec.radix import Count


@dataclass
class Disagreement:
    lo: int
    hi: int
    reference: bool
    witness: int  # an N in [lo, hi] where the encoding disagrees

    def __str__(self) -> str:
        return f"N in [{self.lo}, {self.hi}]: reference says {'holds' if self.reference else 'fails'}, the encoding disagrees at N={self.witness}"


def runs(values: list[bool], start: int = 1) -> list[tuple[int, int, bool]]:
    """Maximal runs of equal values: (lo, hi, value) with N = start + index."""
    out: list[tuple[int, int, bool]] = []
    for i, v in enumerate(values):
        N = start + i
        if out and out[-1][2] == v and out[-1][1] == N - 1:
            out[-1] = (out[-1][0], N, v)
        else:
            out.append((N, N, v))
    return out


def tokens(q: Query, c: Count) -> z3.ArithRef:
    """The token count of ``c`` as a linear term (concrete geometry only)."""
    sp = q.g.sp
    return c.n * (sp.m * sp.u) + c.j * sp.u + c.s


def compare(q: Query, truth: Callable[[int], bool], n_max: int, *, timeout_ms: int = 20000) -> list[Disagreement]:
    """Check query ``q`` (over a concrete geometry, N symbolic) against the
    reference predicate ``truth(N)`` for N in [1, n_max].

    Two solver calls, whatever the number of runs: the claim on the runs
    where the reference says "fails", and its negation on the runs where it
    says "holds", must both be unsatisfiable. A model is a disagreement; its
    run is reported."""
    N = tokens(q, q.counts["N"])
    table = runs([truth(n) for n in range(1, n_max + 1)])
    bad: list[Disagreement] = []
    for want in (True, False):
        spans = [(lo, hi) for lo, hi, v in table if v == want]
        if not spans:
            continue
        s = z3.SolverFor("QF_LIA")
        s.set("timeout", timeout_ms)
        s.add(*q.premises)
        s.add(z3.Or(*[z3.And(N >= lo, N <= hi) for lo, hi in spans]))
        s.add(z3.Not(q.claim) if want else q.claim)
        res = s.check()
        if res == z3.sat:
            w = s.model().eval(N).as_long()
            lo, hi = next((lo, hi) for lo, hi in spans if lo <= w <= hi)
            bad.append(Disagreement(lo, hi, want, w))
        elif res == z3.unknown:
            bad.append(Disagreement(1, n_max, want, -1))
    return bad
