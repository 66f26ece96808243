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


def geometry_of(row: Row, values: dict[str, Any]) -> Concrete:
    """The concrete geometry of a row (named) or of a counterexample."""
    if row.geometry.startswith("named:"):
        return NAMED_BY[row.geometry[6:]]
    cls, S = values["class"], values["S"]
    u = {"aligned": values["M"], "partial": values["A"], "hashed": values["H"]}.get(cls, S)
    return Concrete.from_class(cls, S // u, u)


def case_for(row: Row, values: dict[str, Any]) -> Case:
    """The case that exhibits a counterexample: prompt A:N first, then the
    identical resend (R1; sent twice, the second repeat shows whether a
    junction recovers it) or the longer sibling A:N2 (R2). One-shot rows get
    a chunk budget of at least N (a prefill in one chunk)."""
    geo = geometry_of(row, values)
    mode = MODE[row.mode]
    N = values["N"]
    prompts = [[("A", N)]] * 3 if row.prop == "R1" else [[("A", N)], [("A", values["N2"])]]
    budget = max(8192, geo.S, N if row.level == "oneshot" else 0)
    version = mode.version_for(row.rule or "replay")
    label = geo.label().replace("/", "-").replace(" ", "-")
    name = f"spec-{row.prop}-{row.level}-{row.rule}-vllm{version}-{mode.name.split('/')[0]}-{label}-N{N}"
    mamba_count = 3 if geo.cls in ("uniform", "hashed") else 1  # a deployment's shape (Qwen3-Next: 3 Mamba groups)
    return geo.case(prompts, mode.speculative_for(geo.S), name=name, budget=budget, mamba_count=mamba_count)


def confirm(row: Row, case: Case) -> dict[str, Any]:
    """Replay a counterexample case on the reference serial model: the first
    repeat (R1) or the sibling (R2) must hit below the Mamba block T that
    dense retention's hit lands on (the rule's miss), while the promise rule
    reaches it."""
    from reference.boundaries import floor_to, kept_state
    from reference.knobs import resolve_knobs
    from reference.serial import dense_hit, simulate

    mode = MODE[row.mode]
    version = mode.version_for(row.rule or "replay")
    knobs = resolve_knobs(case, version)
    g = case.geometry
    N = case.trace[0].num_prompt_tokens
    N2 = case.trace[1].num_prompt_tokens  # = N for R1
    dense = dense_hit(N2, N, g, knobs)
    M = g.mamba_block_sizes[0]
    target = floor_to(kept_state(dense, knobs.alignment), M)
    hit = simulate(case, knobs, row.rule)[1].hit
    promised = simulate(case, knobs, "promise")[1].hit
    return {
        "version": version,
        "dense_hit": dense,
        "target": target,
        "hit": hit,
        "promise_hit": promised,
        "confirmed": hit < target <= promised,
    }
