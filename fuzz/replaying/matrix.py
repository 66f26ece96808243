"""The version matrix: hit patterns per case x engine version, as a table
(terminal, markdown or HTML) and a hits-per-request chart (PNG) to drop in a
bug report: per request, grouped bars (one per engine) with the promise as
a mark across the group.

A pattern reads like the #53504 report: ``miss/hit/hit``, with the hit
tokens beside it (``0/9600/9600``). Under each case the reference model's
promise is shown for comparison.

Each cell also carries the judge's verdict (:mod:`fuzz.judge.verdict`): for a
finding file, whether that engine reproduces it (a ``versions`` finding
needs its other engine among the matrix's); for a bare case, whether it
agrees with every oracle. A deployment case resolves per version, so each
cell shows the scheduler block that version resolved beside its hits
(``[block 1600]``), and the promise is that of the first engine's
resolution (per cell in the JSON rows).

Across engine families (``--engine vllm==X --engine sglang==Y``): a
deployment case is run on the other family's engine with the same model,
model overrides and trace and that engine's default serve flags (its own
resolution of the same model: the cell says ``defaults``), and each cell is
judged against the promise on what its engine resolved. A hand geometry
is vLLM's only.

A case's name, a finding's text and an engine's error are a stranger's:
each output writes them through its rule in ``ground.printable`` (the
terminal table as rich ``Text``, never markup; Markdown cells escaped;
HTML escaped). :func:`exit_code` is the command's exit status.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from engine_adapter.host.versions import engine_name, family_of
from fuzz.judge.oracle_resolution import trace_units
from fuzz.results.findings import load_finding
from ground.engines import FAMILIES, Capability
from ground.errors import Unsupported
from ground.printable import html_text, markdown_cell, printable, rich_text
from reference.case import Case
from reference.knobs import resolve_knobs
from reference.predict import predict_with_knobs


def pattern(hits: list[int]) -> str:
    return "/".join("hit" if h else "miss" for h in hits)


def _promise(case: Case, version: str) -> list[int] | None:
    if case.geometry is None:
        return None
    try:
        return predict_with_knobs(case, resolve_knobs(case, version), "promise")["hits"]
    except Unsupported:
        return None


def case_for(case: Case, family: str) -> tuple[Case, str | None]:
    """``case`` as ``family``'s engine runs it, and a note when it was
    retargeted: a deployment of another family keeps its model, overrides
    and trace and takes ``family``'s default flags. Unsupported for a hand
    geometry on an engine other than vLLM."""
    dep = case.deployment
    if dep is None:
        if not FAMILIES[family].supports(Capability.GEOMETRY):
            raise Unsupported(f"case: a hand geometry runs on vLLM only; allowed on {family}: a deployment case")
        return case, None
    if dep.engine == family:
        return case, None
    moved = replace(dep, engine=family, vllm_args=(), family_args=())
    return replace(case, geometry=None, speculative=None, deployment=moved, resolved_by=None), f"{family}'s defaults"


def load_cases(paths: list[str]) -> list[tuple[str, Case, dict | None]]:
    """Each case or finding file read once: (path, case, the finding or None)."""
    return [(path, *load_finding(path)) for path in paths]


def run_matrix(cases: list[tuple[str, Case, dict | None]], engines: list) -> list[dict]:
    """Every case (:func:`load_cases`) on every engine, each cell judged.
    ``engines``: objects with ``version`` and ``run(case)``."""
    from fuzz.judge.verdict import Claim, observe_and_judge

    by_version = {e.version: e for e in engines}
    rows = []
    for path, case, finding in cases:
        claim = Claim.of(finding) if finding else None
        cells = {}
        for engine in engines:
            c, other = claim, None
            if claim is not None and claim.oracle == "versions":
                if claim.other_version == engine.version:
                    c = claim.swapped()
                    other = by_version.get(str((finding.get("engine") or {}).get("version")))
                else:
                    other = by_version.get(claim.other_version)
            try:
                mine, note = case_for(case, family_of(engine.version))
            except Unsupported as e:
                cells[engine.version] = {"error": str(e), "promise": None}
                continue
            judged = observe_and_judge(mine, c if note is None else None, engine, other)
            obs = judged.observation
            cell: dict = {"verdict": judged.verdict.verdict, "reasons": judged.verdict.reasons}
            if note:
                cell["flags"] = note
            if "error" in obs:
                cell["error"] = f"{obs['error'].get('type')}: {obs['error'].get('message')}"
            else:
                cell.update({"hits": obs["hits"], "pattern": pattern(obs["hits"])})
            res = obs.get("resolution")
            if res is not None:
                cell["block"], cell["hash_block"] = trace_units(res)
            cell["promise"] = _promise(judged.case, engine.version)
            cells[engine.version] = cell
        first = cells[engines[0].version]
        promise = first.get("promise")
        if promise is None and case.geometry is not None:
            try:
                promise = predict_with_knobs(case, resolve_knobs(case, engines[0].version), "promise")["hits"]
            except Unsupported as e:
                cells["promise"] = {"error": str(e)}
        rows.append(
            {
                "case": str(path),
                "name": case.name or Path(path).stem,
                "requests": len(case.trace),
                "cells": cells,
                "promise": promise,
                "finding": claim.oracle if claim else None,
                "_case": case,
            }
        )
    return rows


def _cell_text(cell: dict, esc=str) -> str:
    """A cell as text; ``esc`` is applied to the stranger's parts (an
    engine's error, a flags note), kvspec's own words stay as they are."""
    text = (
        ("error: " + esc(cell["error"]))
        if "error" in cell
        else f"{cell['pattern']} ({'/'.join(map(str, cell['hits']))})"
    )
    if cell.get("block") is not None:
        text += f" [block {cell['block']}]"
    if cell.get("flags"):
        text += f" ({esc(cell['flags'])})"
    if cell.get("verdict"):
        text += f" {cell['verdict']}"
    return text


def _promise_text(r: dict) -> str:
    return f"{pattern(r['promise'])} ({'/'.join(map(str, r['promise']))})" if r["promise"] else "unsupported"


def to_markdown(rows: list[dict], versions: list[str]) -> str:
    """The matrix as a Markdown table; every stranger's text in it (a case
    name, an engine's error) :func:`markdown_cell`."""
    head = "| case | " + " | ".join(markdown_cell(engine_name(v)) for v in versions) + " | promise |"
    lines = [head, "|" + "---|" * (len(versions) + 2)]
    for r in rows:
        cells = [
            markdown_cell(r["name"]),
            *(_cell_text(r["cells"][v], markdown_cell) for v in versions),
            _promise_text(r),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def to_html(rows: list[dict], versions: list[str]) -> str:
    """The matrix as an HTML table; every cell :func:`html_text`."""
    head = "".join(f"<th>{html_text(engine_name(v))}</th>" for v in versions)
    body = []
    for r in rows:
        cells = "".join(f"<td>{html_text(_cell_text(r['cells'][v]))}</td>" for v in versions)
        body.append(f"<tr><td>{html_text(r['name'])}</td>{cells}<td>{html_text(_promise_text(r))}</td></tr>")
    return f"<table><thead><tr><th>case</th>{head}<th>promise</th></tr></thead><tbody>{''.join(body)}</tbody></table>\n"


def to_rich(rows: list[dict], versions: list[str]):
    """The matrix as a rich table; every cell :func:`rich_text` (text,
    never markup: a case named ``[/]`` or ``[link=...]`` is shown as is)."""
    from rich.table import Table

    table = Table(title="prefix-cache hits per request")
    table.add_column("case")
    for v in versions:
        table.add_column(rich_text(engine_name(v)))
    table.add_column("promise")
    for r in rows:
        table.add_row(
            rich_text(r["name"]), *(rich_text(_cell_text(r["cells"][v])) for v in versions), rich_text(_promise_text(r))
        )
    return table


#: A cell whose engine departs from the promise: a bare case that diverges,
#: or a finding that engine reproduces.
_DEPARTS = ("diverges", "reproduced")
#: A cell judged either way (the rest are errors or inconclusive).
_JUDGED = ("agrees", "diverges", "reproduced", "not reproduced")


def exit_code(rows: list[dict], versions: list[str]) -> int:
    """``kvspec matrix``'s exit status, the convention of ``fuzz`` and
    ``replay``: 1 when a cell departs from the promise (a bare case that
    diverges, a finding that engine reproduces), else 3 when a cell could
    not be judged (an error, inconclusive: no silent all-clear, and a matrix
    of nothing but errors is 3), else 0 (every cell agrees or does not
    reproduce the finding)."""
    verdicts = [r["cells"].get(v, {}).get("verdict") for r in rows for v in versions]
    if any(v in _DEPARTS for v in verdicts):
        return 1
    if not verdicts or any(v not in _JUDGED for v in verdicts):
        return 3
    return 0


#: Requests up to which each bar is labelled with its hit tokens.
LABEL_BARS_UP_TO = 12


def _plain(text: object) -> str:
    """A stranger's text for a matplotlib label: :func:`printable`, and
    ``$`` escaped (matplotlib reads ``$...$`` as mathtext, which can raise)."""
    return printable(text).replace("$", r"\$")


def _contain_matplotlib() -> None:
    """matplotlib's config and font cache in kvspec's home: ``MPLCONFIGDIR``
    (read when matplotlib is first imported), as ``ground.home.cache_env``."""
    import os

    from ground.home import cache_dir

    os.environ["MPLCONFIGDIR"] = str(cache_dir("matplotlib"))


def figure(rows: list[dict], versions: list[str]):
    """The matrix chart as a matplotlib figure (Agg), one panel per case:
    per request a group of bars, one per engine, its height the hit tokens
    (a miss is a labelled zero), and the promise as a black mark across
    the group. Requests are discrete, so nothing joins one to the next.
    matplotlib's config and font cache stay in kvspec's home
    (``MPLCONFIGDIR``, as ``ground.home.cache_env`` sets for engines),
    never under ``$HOME/.cache`` or ``$HOME/.config``."""
    _contain_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(rows)
    most = max((r["requests"] for r in rows), default=1)
    width = min(20.0, max(6.0, 0.35 * most * max(1, len(versions)) + 2.0))
    fig, axes = plt.subplots(n, 1, figsize=(width, 2.8 * n), squeeze=False)
    group = 0.8  # of the space between two requests
    bar = group / max(1, len(versions))
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0", "C1", "C2", "C3"])
    for ax, r in zip(axes[:, 0], rows):
        x = list(range(r["requests"]))
        for j, v in enumerate(versions):
            cell = r["cells"][v]
            label = engine_name(v) + (f" [block {cell['block']}]" if cell.get("block") is not None else "")
            if "hits" not in cell:
                ax.bar(
                    [],
                    [],
                    width=bar,
                    color=colors[j % len(colors)],
                    label=_plain(f"{label}: {cell.get('error', 'no hits')}"[:80]),
                )
                continue
            offset = -group / 2 + bar * (j + 0.5)
            bars = ax.bar([i + offset for i in x], cell["hits"], width=bar, color=colors[j % len(colors)], label=label)
            if r["requests"] <= LABEL_BARS_UP_TO:
                ax.bar_label(bars, labels=[str(h) if h else "miss" for h in cell["hits"]], fontsize=7, padding=1)
        if r["promise"]:
            ax.hlines(
                r["promise"],
                [i - group / 2 for i in x],
                [i + group / 2 for i in x],
                colors="black",
                linewidths=2,
                label="promise",
                zorder=3,
            )
        ax.set_title(_plain(r["name"]), fontsize=10)
        ax.set_xlabel("request")
        ax.set_ylabel("hit tokens")
        ax.set_xticks(x)
        ax.set_xlim(-0.6, max(0, r["requests"] - 1) + 0.6)
        ax.margins(y=0.15)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    return fig


def chart(rows: list[dict], versions: list[str], path: str | Path) -> Path:
    """Write :func:`figure` as a PNG (atomically) to ``path``."""
    import io

    _contain_matplotlib()
    import matplotlib.pyplot as plt

    from ground.files import write_bytes_atomic

    fig = figure(rows, versions)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    path = Path(path)
    write_bytes_atomic(path, buf.getvalue())
    return path
