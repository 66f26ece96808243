"""z3-derived boundary cases for the fuzzer's corpus."""

from __future__ import annotations

import pytest

from reference.case import Case, case_to_dict, parse_case
from spec.geometry import NAMED_BY
from spec.seeds import aligned_lengths, boundary_cases, rules_differ


def test_boundary_cases_small() -> None:
    cases = list(boundary_cases(["A32/M16"], modes=("drop/0.30",), all_counterexamples=False))
    assert cases and all(isinstance(c, Case) for c in cases)
    for c in cases:
        assert parse_case(case_to_dict(c)) == c
    lengths = {c.trace[0].num_prompt_tokens for c in cases}
    assert {31, 32, 33, 63, 64, 65} <= lengths  # kS-1, kS, kS+1
    assert 65 in lengths  # legacy's minimal R1 counterexample
    names = {c.name for c in cases}
    assert any(n.startswith("spec-R1-mask-legacy") for n in names)


def test_rules_differ() -> None:
    geo = NAMED_BY["1600"]
    # replay keeps the resend's state from the first refuted length on
    assert rules_differ(geo, "drop/0.30", "R1", "replay", "legacy") == 3201
    assert rules_differ(geo, "drop/0.30", "R1", "legacy", "replay") is None
    assert aligned_lengths(geo, (1,)) == [1599, 1600, 1601]


@pytest.mark.slow
def test_boundary_cases_all_encodable_for_the_fuzzer() -> None:
    from fuzz.draw.codec import encode

    cases = list(boundary_cases())
    hybrid = [c for c in cases if len(c.geometry.groups) == 2]
    assert len(hybrid) > 100
    for c in hybrid:
        encode(c)  # raises ValueError outside the fuzzer's literal domain
