"""The concrete sweep: every S = 16k <= 4096 with every valid (A, M), N
symbolic; each class verdict must hold on every geometry of the class."""

from __future__ import annotations

import pytest

from spec.catalogue import Row
from spec.geometry import sweep_geometries
from spec.sweep import count, run_sweep, sweep_row, sweep_rows


def test_sweep_counts() -> None:
    """4,142 geometries: 256 uniform, 1,210 aligned, 1,210 partial, 1,210
    hashed and 256 unitary (uniform + aligned = the 1,466 pairs of issue 4;
    hashed: every block with every smaller hash unit, issue 9)."""
    assert [count(c) for c in ("uniform", "aligned", "partial", "hashed", "unitary")] == [256, 1210, 1210, 1210, 256]
    assert len(sweep_geometries()) == 4142


@pytest.mark.parametrize(
    "row",
    [
        Row("R1", "aligned", "drop/0.30", "replay", "mask", "proved"),
        Row("R1", "uniform", "drop/0.30", "legacy", "mask", "refuted"),
        Row("R1", "partial", "drop/0.30", "replay", "mask", "refuted"),
        Row("R2", "hashed", "plain/0.33", "replay", "mask", "refuted"),
    ],
    ids=lambda r: r.id,
)
def test_sweep_sample(row: Row) -> None:
    result = sweep_row(row)
    assert result.ok, (result.verdict, result.everywhere, result.family, result.witness)


@pytest.mark.slow
def test_full_sweep() -> None:
    bad = [(r.row.id, r.verdict, r.everywhere, r.family) for r in run_sweep(sweep_rows()) if not r.ok]
    assert bad == []
