"""The advice's chart: hit share per request for each retention setting.

Requests are discrete: grouped bars (one bar per setting at each request)
up to ``BARS_UP_TO`` requests, step lines up to ``LINES_UP_TO``, and above
that a heat map (a row per setting, a column per request: thousands of
step lines take seconds to draw and cannot be told apart). The promise
(dense) is drawn as a black outline, a dashed line or the top row.
matplotlib's Agg backend, written atomically.
"""

from __future__ import annotations

import io
import os
import textwrap
from pathlib import Path

from ground.files import write_bytes_atomic
from ground.home import cache_dir
from ground.printable import printable

BARS_UP_TO = 40
LINES_UP_TO = 1500


def chart(advice: dict, title: str, path: Path) -> Path:
    """Draw and write the PNG; returns its path."""

    os.environ.setdefault("MPLCONFIGDIR", str(cache_dir("matplotlib")))
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # no pyplot: its import is a third of the chart's time

    def subplots(figsize, dpi):
        fig = Figure(figsize=figsize, dpi=dpi)
        FigureCanvasAgg(fig)
        return fig, fig.add_subplot()

    tokens = [r["prompt_tokens"] for r in advice["requests"]]
    n = len(tokens)
    settings = advice["retention"]["settings"]
    outcomes = advice["outcomes"]
    promise_shares = [h / t for h, t in zip(advice["promise_outcome"].hits, tokens)]
    labels = [
        f"{row['setting']}: {row['hit_share']:.1%}, {row['states']} states" + (" (current)" if row["current"] else "")
        for row in settings
    ]
    shares = [[h / t for h, t in zip(outcomes[row["interval"]].hits, tokens)] for row in settings]
    if n > LINES_UP_TO:
        fig, ax = subplots(figsize=(12, 1.6 + 0.45 * (len(settings) + 1)), dpi=110)
        image = ax.imshow(
            [promise_shares, *shares], aspect="auto", interpolation="nearest", cmap="viridis", vmin=0, vmax=1
        )
        ax.set_yticks(range(len(settings) + 1))
        ax.set_yticklabels(["promise (dense)", *labels], fontsize=7)
        ax.set_xlabel("request")
        fig.colorbar(image, ax=ax, label="hit share of its prompt")
    else:
        fig, ax = subplots(figsize=(max(9, min(16, 6 + 0.25 * min(n, BARS_UP_TO) * len(settings) / 4)), 4.8), dpi=110)
        xs = list(range(n))
        colors = colormaps["viridis"]
        width = 0.8 / max(len(settings), 1)
        for j, (label, ys) in enumerate(zip(labels, shares)):
            color = colors(j / max(len(settings) - 1, 1))
            if n <= BARS_UP_TO:
                ax.bar([x - 0.4 + width * (j + 0.5) for x in xs], ys, width, label=label, color=color)
            else:
                ax.step(xs, ys, where="mid", label=label, color=color, linewidth=1)
        if n <= BARS_UP_TO:
            ax.bar(xs, promise_shares, 0.84, fill=False, edgecolor="black", linewidth=0.8, label="promise (dense)")
            ax.set_xticks(xs)
        else:
            ax.step(
                xs, promise_shares, where="mid", color="black", linewidth=0.6, linestyle="--", label="promise (dense)"
            )
        ax.set_xlabel("request")
        ax.set_ylabel("hit share of its prompt")
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("\n".join(textwrap.wrap(printable(title), 110)), fontsize=8)  # a case's name: no control characters
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    write_bytes_atomic(path, buf.getvalue())
    return path
