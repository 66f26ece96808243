"""The version matrix renders (table, markdown, HTML, PNG) from engine rows;
fed here by test doubles standing in for two versions."""

from __future__ import annotations

from fuzz.replaying.matrix import chart, load_cases, pattern, run_matrix, to_html, to_markdown
from tests.fuzz.doubles import ReferenceDouble


def test_matrix_of_the_seed(tmp_path):
    engines = [ReferenceDouble("0.29.0", "legacy"), ReferenceDouble("0.33.0", "replay")]
    rows = run_matrix(load_cases(["examples/seed-53504.json"]), engines)
    assert rows[0]["cells"]["0.29.0"]["hits"] == [0, 0, 9600]
    assert rows[0]["cells"]["0.33.0"]["pattern"] == "miss/hit/hit"
    md = to_markdown(rows, ["0.29.0", "0.33.0"])
    # each cell judged as a bare case: 0.29.0's legacy rule breaks the promise
    assert rows[0]["cells"]["0.29.0"]["verdict"] == "diverges" and rows[0]["cells"]["0.33.0"]["verdict"] == "agrees"
    assert (
        "| seed-53504 | miss/miss/hit (0/0/9600) diverges | miss/hit/hit (0/9600/9600) agrees | miss/hit/hit (0/9600/9600) |"
        in md
    )
    assert "<td>miss/miss/hit (0/0/9600) diverges</td>" in to_html(rows, ["0.29.0", "0.33.0"])
    png = chart(rows, ["0.29.0", "0.33.0"], tmp_path / "hits.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert pattern([0, 5, 0]) == "miss/hit/miss"


def test_the_chart_draws_one_bar_per_engine_per_request_and_the_promise(tmp_path):
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

    from fuzz.replaying.matrix import figure

    engines = [ReferenceDouble("0.29.0", "legacy"), ReferenceDouble("0.33.0", "replay")]
    rows = run_matrix(load_cases(["examples/seed-53504.json", "examples/synthetic/mixed-a32-m16-resend.json"]), engines)
    fig = figure(rows, ["0.29.0", "0.33.0"])
    try:
        axes = fig.get_axes()
        assert len(axes) == len(rows)
        for ax, row in zip(axes, rows):
            bars = [c for c in ax.containers if len(c)]  # one BarContainer per engine
            assert len(bars) == 2 and all(len(c) == row["requests"] for c in bars)
            for c, v in zip(bars, ("0.29.0", "0.33.0")):
                assert [p.get_height() for p in c] == row["cells"][v]["hits"]
            # the two bars of a request sit side by side, centred on it
            for i in range(row["requests"]):
                left, right = bars[0][i], bars[1][i]
                assert left.get_x() + left.get_width() <= right.get_x() + 1e-9
                assert abs((left.get_x() + right.get_x() + right.get_width()) / 2 - i) < 1e-9
            assert not ax.get_lines()  # nothing joins one request to the next
            (promise,) = [c for c in ax.collections if isinstance(c, LineCollection) and c.get_label() == "promise"]
            assert [seg[0][1] for seg in promise.get_segments()] == row["promise"]
        assert rows[0]["cells"]["0.29.0"]["hits"] == [0, 0, 9600]
    finally:
        plt.close(fig)
    png = chart(rows, ["0.29.0", "0.33.0"], tmp_path / "hits.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
