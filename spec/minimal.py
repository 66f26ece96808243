"""Minimal counterexamples (z3 ``Optimize``) and the case files they become.

On a concrete geometry a token count is linear in its digits
(``n*S + j*u + s``), so the optimiser can minimise N exactly; a sibling's N2
is minimised next. The counterexample becomes a case (``reference.case``):
two or three requests that ``kvspec run`` / ``kvspec replay`` take directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3

from reference.case import Case
from spec.catalogue import Row
from spec.geometry import MODE, NAMED_BY, Concrete
from spec.properties import Query
from spec.radix import Count
from spec.solve import Outcome, minimize


def tokens(q: Query, c: Count) -> z3.ArithRef:
    sp = q.g.sp
    if not (isinstance(sp.m, int) and isinstance(sp.u, int)):
        raise ValueError("minimal counterexamples need a concrete geometry (a named one)")
    return c.n * (sp.m * sp.u) + c.j * sp.u + c.s


@dataclass
class Minimal:
    row: Row
    outcome: Outcome
    values: dict[str, Any]

    @property
    def N(self) -> int | None:
        return self.values.get("N")


def minimal(row: Row, *, seed: int = 0, timeout_ms: int = 20000) -> Minimal:
    """The counterexample of ``row`` with the least N (then least N2)."""
    q = row.build()
    objectives = [tokens(q, q.counts[k]) for k in ("N", "N2") if k in q.counts]
    out = minimize(q.premises, q.claim, objectives, seed=seed, timeout_ms=timeout_ms)
    values: dict[str, Any] = {}
    if out.model is not None:
        values = q.decode(out.model)
        values.pop("geometry")
    return Minimal(row, out, values)


def case_for(row: Row, values: dict[str, Any]) -> Case:
    """The case that exhibits a counterexample: prompt A:N first, then the
    identical resend (R1, twice: the second repeat shows the junction
    recovery) or the longer sibling A:N2 (R2)."""
    geo: Concrete = NAMED_BY[row.geometry[6:]] if row.geometry.startswith("named:") else Concrete.from_class(values["class"], values["S"] // (values["M"] if values["class"] == "aligned" else values["A"] or values["S"]), values["M"] if values["class"] == "aligned" else (values["A"] or values["S"]))
    mode = MODE[row.mode]
    N = values["N"]
    if row.prop == "R1":
        prompts = [[("A", N)]] * 3
    else:
        prompts = [[("A", N)], [("A", values["N2"])]]
    budget = max(8192, geo.S, N if row.level == "oneshot" else 0)
    version = mode.version_for(row.rule or "replay")
    name = f"spec-{row.prop}-{row.level}-{row.rule}-vllm{version}-{geo.label().replace('/', '-').replace(' ', '-')}-N{N}"
    mamba_count = 3 if geo.A is not None and geo.A == geo.M else 1
    return geo.case(prompts, mode.speculative_for(geo.S), name=name, budget=budget, mamba_count=mamba_count)
