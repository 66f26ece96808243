"""Planted mutations: each copy of a rule with a plausible slip must turn a
proved row into a refuted one (a proof that cannot fail proves nothing)."""

from __future__ import annotations

import pytest

from spec import rules as R
from spec.catalogue import run_row
from spec.fidelity import term_disagreements
from spec.geometry import MODE
from spec.mutations import MUTATIONS, Mutation, planted


def _terms(mutation: Mutation) -> list[str]:
    """The first term disagreement with the reference on each of the
    mutation's (geometry, mode) pairs (with the real rules there is none:
    ``spec.test_fidelity.test_terms_match_reference`` compares every mode on
    the same hashed geometry)."""
    return [d for geo, mode in mutation.terms for d in term_disagreements(geo, modes=(MODE[mode],), first=True)]


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.name)
def test_mutation_is_caught(mutation: Mutation) -> None:
    for row in mutation.catches:
        assert run_row(row).verdict == "proved", f"{row.id} must hold with the real rule"
    with planted(mutation):
        assert getattr(R, mutation.target) is mutation.mutant
        for row in mutation.catches:
            result = run_row(row)
            assert result.verdict == "refuted", f"{mutation.name}: {row.id} still {result.verdict}"
            assert result.counterexample
        if mutation.terms:
            assert len(_terms(mutation)) == len(mutation.terms), (
                f"{mutation.name}: the terms still match the reference somewhere"
            )
    assert getattr(R, mutation.target) is not mutation.mutant


def test_every_mutation_targets_a_rule() -> None:
    names = {m.name for m in MUTATIONS}
    assert len(names) == len(MUTATIONS) >= 10
    for m in MUTATIONS:
        assert callable(getattr(R, m.target))
        assert m.catches or m.terms
