"""The version matrix renders (table, markdown, HTML, PNG) from engine rows;
fed here by test doubles standing in for two versions."""

from __future__ import annotations

from fuzz.matrix import chart, pattern, run_matrix, to_html, to_markdown
from tests.fuzz.doubles import ReferenceDouble


def test_matrix_of_the_seed(tmp_path):
    engines = [ReferenceDouble("0.29.0", "legacy"), ReferenceDouble("0.33.0", "replay")]
    rows = run_matrix(["examples/seed-53504.json"], engines)
    assert rows[0]["cells"]["0.29.0"]["hits"] == [0, 0, 9600]
    assert rows[0]["cells"]["0.33.0"]["pattern"] == "miss/hit/hit"
    md = to_markdown(rows, ["0.29.0", "0.33.0"])
    # each cell judged as a bare case: 0.29.0's legacy rule breaks the promise
    assert rows[0]["cells"]["0.29.0"]["verdict"] == "diverges" and rows[0]["cells"]["0.33.0"]["verdict"] == "agrees"
    assert "| seed-53504 | miss/miss/hit (0/0/9600) diverges | miss/hit/hit (0/9600/9600) agrees | miss/hit/hit (0/9600/9600) |" in md
    assert "<td>miss/miss/hit (0/0/9600) diverges</td>" in to_html(rows, ["0.29.0", "0.33.0"])
    png = chart(rows, ["0.29.0", "0.33.0"], tmp_path / "hits.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert pattern([0, 5, 0]) == "miss/hit/miss"
