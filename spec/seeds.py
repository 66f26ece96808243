"""z3-derived boundary cases for the fuzzer's corpus.

``boundary_cases()`` yields ``reference.case.Case`` objects around the
lengths the proofs revolve around, on issue 4's named geometries (by
default; the deployments of issue 9 carry a prefix match unit, which the
fuzzer's literal cases do not hold):

* the minimal counterexample of every refuted R1/R2 row (z3 ``Optimize``),
  as the two- or three-request trace that shows it;
* block-aligned lengths N in {kS-1, kS, kS+1} (k = 1..4) as identical
  resends and as a prompt followed by a longer sibling;
* the smallest lengths where two rules disagree on R1 or R2 (z3: the claim
  of one rule and the negated claim of the other).

Every case is valid (``parse_case``); with the default speculative settings
(the fuzzer's own: MTP K=2 with and without the block drop, none) the hybrid
ones lie in the fuzzer's literal domain (``fuzz.draw.codec.encode``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import lru_cache

import z3

from reference.case import Case, case_to_dict
from spec import properties as P
from spec.catalogue import MODE_NAMES, RULE_NAMES, Row, expected_named
from spec.geometry import ISSUE_4_NAMED, MODE, NAMED_BY, Concrete
from spec.minimal import case_for, minimal, tokens
from spec.parallel import pmap
from spec.radix import to_z3

LEVELS = ("mask", "oneshot")


def _named_rows(names, modes=MODE_NAMES) -> list[Row]:
    out = []
    for name in names:
        for level in LEVELS:
            for prop in ("R1", "R2"):
                for rule in RULE_NAMES:
                    for mode in modes:
                        out.append(
                            Row(prop, f"named:{name}", mode, rule, level, expected_named(prop, level, name, rule, mode))
                        )
    return out


def _minimal_case(row: Row) -> Case | None:
    m = minimal(row)
    return case_for(row, m.values) if m.outcome.verdict == "refuted" else None


def minimal_counterexamples(names=None, modes=MODE_NAMES, jobs: int | None = None) -> list[tuple[Row, Case]]:
    """(row, case) for the minimal counterexample of every refuted named row."""
    rows = [r for r in _named_rows(names or NAMED_BY, modes) if r.expect == "refuted"]
    return [(r, c) for r, c in zip(rows, pmap(_minimal_case, rows, jobs)) if c is not None]


def aligned_lengths(geo: Concrete, ks=(1, 2, 3, 4)) -> list[int]:
    return sorted({max(1, k * geo.S + d) for k in ks for d in (-1, 0, 1)})


def rules_differ(geo: Concrete, mode_name: str, prop: str, a: str, b: str, level: str = "mask") -> int | None:
    """The smallest N where rule ``a`` keeps the promise ``prop`` and rule
    ``b`` does not (None if there is none)."""
    g = geo.geo(f"diff{geo.m}x{geo.u}")
    mode = MODE[mode_name]
    N, base = P._start(g)
    if prop == "R1":
        ca, cb = P.resend_claim(g, mode, a, N, level), P.resend_claim(g, mode, b, N, level)
    else:
        N2 = g.sp.count(f"{g.sp.tag}.N2")
        base.append(to_z3(N2 > N))
        ca, cb = P.sibling_claim(g, mode, a, N, N2, level), P.sibling_claim(g, mode, b, N, N2, level)
    q = P.Query("differ", None, mode, g, z3.BoolVal(True), base, {"N": N})
    o = z3.Optimize()
    o.set("timeout", 10000)
    o.add(*q.premises, ca, z3.Not(cb))
    Nt = tokens(q, N)
    o.minimize(Nt)
    if o.check() != z3.sat:
        return None
    return o.model().eval(Nt).as_long()


def _differ(args) -> int | None:
    return rules_differ(*args)


@lru_cache(maxsize=4)
def _cached(names: tuple[str, ...], speculative_modes: tuple[str, ...], full_minimal: bool) -> tuple[Case, ...]:
    out: dict[str, Case] = {}
    pairs = (("promise", "replay"), ("replay", "legacy"), ("legacy", "replay"))
    asks = [
        (NAMED_BY[name], mode, prop, a, b)
        for name in names
        for mode in speculative_modes
        for prop in ("R1", "R2")
        for a, b in pairs
    ]
    differ = dict(zip(asks, pmap(_differ, asks)))

    def add(case: Case) -> None:
        key = json.dumps({k: v for k, v in case_to_dict(case).items() if k != "name"}, sort_keys=True)
        out.setdefault(key, case)

    for _, case in minimal_counterexamples(names, MODE_NAMES if full_minimal else speculative_modes):
        add(case)
    for name in names:
        geo = NAMED_BY[name]
        count = 3 if geo.cls == "uniform" else 1
        for mode_name in speculative_modes:
            mode = MODE[mode_name]
            spec = mode.speculative_for(geo.S)
            tag = geo.label().replace("/", "-").replace(" ", "-")
            lengths = set(aligned_lengths(geo))
            for prop in ("R1", "R2"):
                for a, b in pairs:
                    n = differ[(geo, mode_name, prop, a, b)]
                    if n is not None:
                        lengths.add(n)
            for n in sorted(lengths):
                budget = max(8192, geo.S)
                add(
                    geo.case(
                        [[("A", n)]] * 3,
                        spec,
                        name=f"seed-resend-{tag}-{mode_name.split('/')[0]}-N{n}",
                        budget=budget,
                        mamba_count=count,
                    )
                )
                add(
                    geo.case(
                        [[("A", n)], [("A", n + geo.S + 2)]],
                        spec,
                        name=f"seed-sibling-{tag}-{mode_name.split('/')[0]}-N{n}",
                        budget=budget,
                        mamba_count=count,
                    )
                )
    return tuple(out.values())


def boundary_cases(
    geometries=None, *, modes=("plain/0.30", "drop/0.30", "lookahead/0.33"), all_counterexamples: bool = True
) -> Iterator[Case]:
    """The boundary cases (see the module docstring). ``geometries``: names
    from ``spec.geometry.NAMED`` (default: issue 4's, ``ISSUE_4_NAMED``, the
    ones the fuzzer's literal cases hold; the fuzzer draws the deployments
    with a prefix match unit itself); ``modes``: which speculative
    settings the block-aligned traces use (their cases differ only in that;
    the 0.30/0.33 halves of a mode name are the same case).
    ``all_counterexamples``: minimal counterexamples of every mode's refuted
    rows (else only of ``modes``)."""
    names = tuple(geometries or ISSUE_4_NAMED)
    yield from _cached(names, tuple(modes), all_counterexamples)
