"""Minimal counterexamples (z3 Optimize) on the named geometries, and the
case files they become, replayed on the reference serial model."""

from __future__ import annotations

import pytest

from reference.case import case_to_dict, parse_case
from spec.catalogue import Row
from spec.minimal import case_for, confirm, minimal, tokens
from spec.solve import decide

# Issue 4: legacy (vLLM <= 0.29.0: keep N-1, no EAGLE adjustment) refutes R1
# with the drop; the smallest prompt per named geometry.
LEGACY_R1 = {"1600": 3201, "1568": 3137, "A32/M16": 65, "A16/M32": 65}


@pytest.mark.parametrize("name,expected", LEGACY_R1.items())
def test_legacy_r1_minimal_counterexample(name: str, expected: int) -> None:
    row = Row("R1", f"named:{name}", "drop/0.30", "legacy", "mask", "refuted")
    m = minimal(row)
    assert m.outcome.verdict == "refuted"
    assert m.N == expected
    case = case_for(row, m.values)
    assert parse_case(case_to_dict(case)) == case  # a valid case file
    ref = confirm(row, case)
    assert ref["confirmed"], ref  # the serial model misses where the promise hits


def test_seed_11910_is_a_counterexample() -> None:
    """The fuzzer's seed (#53504): 11910 tokens at 1600 is one counterexample."""
    row = Row("R1", "named:1600", "drop/0.30", "legacy", "mask", "refuted")
    q = row.build()
    pin = tokens(q, q.counts["N"]) == 11910
    assert decide([*q.premises, pin], q.claim).verdict == "refuted"
    assert decide(q.premises, q.claim).verdict == "refuted"


@pytest.mark.parametrize("row,expected", [
    # Without speculative decoding replay keeps floor((N-1)/S)*S only: a
    # longer sibling of a block-aligned prompt (dense: kS) gets (k-1)S.
    (Row("R2", "named:1600", "plain/0.30", "replay", "mask", "refuted"), 1600),
    (Row("R2", "named:1600", "plain/0.33", "replay", "mask", "refuted"), 1600),
    # Partial hash hits (attention 16 / Mamba 32, hash 16), drop, 0.30.0:
    # the resend lands on an attention block replay's S-aligned marks miss.
    (Row("R1", "named:A16/M32", "drop/0.30", "replay", "mask", "refuted"), 49),
    # A single Mamba group: the lookup is not shifted, replay's marks are.
    (Row("R1", "named:mamba-only 1600", "drop/0.30", "replay", "mask", "refuted"), 1601),
    # One-shot prefill writes no state at (k-2)S: 0.30.0 drop, N = 3S.
    (Row("R1", "named:1600", "drop/0.30", "replay", "oneshot", "refuted"), 4800),
])
def test_findings_minimal_and_confirmed(row: Row, expected: int) -> None:
    m = minimal(row)
    assert m.N == expected, m.values
    ref = confirm(row, case_for(row, m.values))
    assert ref["confirmed"], ref
