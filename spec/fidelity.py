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
from spec.radix import to_z3
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


# ---------------------------------------------------------------- batched


@dataclass
class BatchDisagreement:
    claim: str
    N: int
    reference: bool

    def __str__(self) -> str:
        return f"{self.claim}: at N={self.N} the reference says {'holds' if self.reference else 'fails'}, the encoding the opposite"


def compare_batch(geo, mode, levels, n_max: int, *, rules=("promise", "replay", "legacy"), props=("R1", "R2"), chunk: int | None = None, timeout_ms: int = 60000) -> list[BatchDisagreement]:
    """R1/R2 of several rules and levels on one concrete geometry and mode
    against the reference, for N in [1, n_max], in a single solver call: the
    encoding and the reference must agree on every run of every claim. (The
    sibling length N2 is left free: ``sibling-any-length`` proves it does not
    matter; the reference uses N + S + L + 1.) ``chunk``: the budget in
    scheduler blocks for the ``chunked`` level."""
    from spec import properties as P
    from spec.oracle import Oracle

    if isinstance(levels, str):
        levels = (levels,)
    g = geo.geo(f"fid{geo.cls}{geo.m}x{geo.u}")
    N, base = P._start(g)
    N2 = g.sp.count(f"{g.sp.tag}.N2")
    base.append(to_z3(N2 > N))
    c = None
    if "chunked" in levels:
        c = z3.Int(f"{g.sp.tag}.chunk")
        base.append(c == chunk)
    claims: dict[str, z3.BoolRef] = {}
    truths: dict[str, list[bool]] = {}
    for rule in rules:
        o = Oracle(geo, mode, rule)
        for level in levels:
            cc = c if level == "chunked" else None
            for prop in props:
                name = f"{prop}/{level} {rule}"
                claims[name] = P.resend_claim(g, mode, rule, N, level, cc) if prop == "R1" else P.sibling_claim(g, mode, rule, N, N2, level, cc)
                truths[name] = [o.holds(n, prop, level, chunk) for n in range(1, n_max + 1)]
    q = Query("batch", None, mode, g, z3.BoolVal(True), base, {"N": N})
    Nt = tokens(q, N)
    wrong = []
    for name, claim in claims.items():
        spans = [(lo, hi) for lo, hi, v in runs(truths[name]) if v]
        true_spans = z3.Or(*[z3.And(Nt >= lo, Nt <= hi) for lo, hi in spans]) if spans else z3.BoolVal(False)
        wrong.append(z3.If(true_spans, z3.Not(claim), claim))
    s = z3.SolverFor("QF_LIA")
    s.set("timeout", timeout_ms)
    s.add(*q.premises, Nt >= 1, Nt <= n_max, z3.Or(*wrong))
    res = s.check()
    if res == z3.unsat:
        return []
    if res == z3.unknown:
        return [BatchDisagreement("solver: " + s.reason_unknown(), -1, True)]
    model = s.model()
    n = model.eval(Nt).as_long()
    return [BatchDisagreement(name, n, truths[name][n - 1]) for name, w in zip(claims, wrong) if z3.is_true(model.eval(w, model_completion=True))]
