"""Shared fixtures: the proof rows selected for this session are solved once,
in parallel (one process per CPU), and each row's test reads its result."""

from __future__ import annotations

import pytest

from spec.catalogue import Result, run_rows


def _selected_rows(session, fixture: str):
    rows = []
    for item in session.items:
        if fixture in getattr(item, "fixturenames", ()) and hasattr(item, "callspec"):
            row = item.callspec.params.get("row")
            if row is not None:
                rows.append(row)
    return list(dict.fromkeys(rows))


def _results(request, fixture: str) -> dict[str, Result]:
    rows = _selected_rows(request.session, fixture)
    return {r.row.id: r for r in run_rows(rows)}


@pytest.fixture(scope="session")
def proof_results(request) -> dict[str, Result]:
    return _results(request, "proof_results")


@pytest.fixture(scope="session")
def slow_proof_results(request) -> dict[str, Result]:
    return _results(request, "slow_proof_results")
