"""A live replay's report: what :func:`fuzz.replaying.live_replay.replay` measured and
concluded (:class:`LiveReport`, its ``--json`` form), the same with the API key
redacted (:func:`redact_report`) and printed as a per-request table with the
verdict (:func:`render`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from engine_adapter.live.client import redact
from engine_adapter.live.measure import LiveRow, number_text
from fuzz.judge.verdict import AGREES, DIVERGES, INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED


@dataclass
class LiveReport:
    name: str | None
    kind: str
    server: str
    model: str
    server_version: str | None
    rows: list[LiveRow]
    verdict: str
    reasons: list[str]
    differences: list[str]
    unverified: list[str]
    notes: list[str]
    server_knobs: dict
    rule: str = "promise"
    implemented_rule: str | None = None
    #: The case as replayed (a deployment case with the geometry its vLLM resolved; a rescaled case).
    case: dict | None = None
    #: A concurrent trace's waves as measured: requests, summed hits and queries.
    waves: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "server": self.server,
            "model": self.model,
            "server_version": self.server_version,
            "verdict": self.verdict,
            "reasons": self.reasons,
            "differences": self.differences,
            "unverified": self.unverified,
            "notes": self.notes,
            "server_knobs": self.server_knobs,
            "rule": self.rule,
            "implemented_rule": self.implemented_rule,
            "case": self.case,
            "waves": self.waves,
            "requests": [
                {
                    "index": r.index,
                    "prompt_tokens": r.prompt_tokens,
                    "expected": r.expected,
                    "target": r.target,
                    "implemented": r.implemented,
                    "bound": r.bound,
                    "hits": r.hits,
                    "queries": r.queries,
                    "ttft_s": r.ttft_s,
                    "latency_s": r.latency_s,
                    "issues": r.issues,
                    # the output oracle's (--outputs), else absent
                    **(
                        {
                            "output_ids": r.output_ids,
                            "top_logprobs": r.top_logprobs,
                            "cold_output_ids": r.cold_output_ids,
                            "cold_top_logprobs": r.cold_top_logprobs,
                        }
                        if r.output_ids is not None
                        else {}
                    ),
                }
                for r in self.rows
            ],
        }


def redact_report(report: LiveReport, secret: str | None) -> LiveReport:
    """The report with the API key (and any ``Bearer`` token) replaced by
    ``[redacted]`` in every string it holds: what is printed and what
    ``--json`` writes."""

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return redact(value, secret)
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, dict):
            return {clean(k): clean(v) for k, v in value.items()}
        if isinstance(value, LiveRow):
            return replace(value, **{f.name: clean(getattr(value, f.name)) for f in fields(value)})
        return value

    return replace(report, **{f.name: clean(getattr(report, f.name)) for f in fields(report)})


def render(report: LiveReport, console=None) -> None:
    """Print the per-request table and the verdict with rich. Every string
    from the case or the server (its name, URL, model, version, knobs,
    notes, reasons) is text, never rich markup (``ground.printable.rich_text``)."""
    from rich.table import Table
    from rich.text import Text

    from ground.console import table_console
    from ground.printable import rich_text

    console = console or table_console()
    title = (
        f"replay {report.name or '(unnamed)'} on {report.server} (model {report.model}, vLLM {report.server_version})"
    )
    table = Table(title=rich_text(title), title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("prompt", justify="right")
    table.add_column("expected hits" + (f" ({report.rule})" if report.kind == "case" else ""), justify="right")
    if report.implemented_rule:
        table.add_column(f"{report.implemented_rule} rule", justify="right")
    if report.kind == "finding":
        table.add_column("finding observed", justify="right")
    table.add_column("observed hits", justify="right")
    table.add_column("queries", justify="right")
    table.add_column("TTFT s", justify="right")
    table.add_column("latency s", justify="right")
    table.add_column("", justify="left")
    for r in report.rows:
        mark = ""
        if r.issues:
            mark = "! " + "; ".join(r.issues)
        elif r.hits is not None and r.target is not None:
            mark = "ok" if r.hits == r.target else "differs"
        elif r.hits is not None and r.bound is not None:
            mark = "ok" if r.hits <= r.bound else "above its bound"
        elif r.bound is not None and r.sent:
            mark = "in a wave"
        elif not r.sent:
            mark = "not sent"
        cells = [
            str(r.index),
            str(r.prompt_tokens),
            number_text(r.expected) if r.bound is None else f"<= {number_text(r.bound)}",
        ]
        if report.implemented_rule:
            cells.append(number_text(r.implemented))
        if report.kind == "finding":
            cells.append(number_text(r.target))
        cells += [
            number_text(r.hits),
            number_text(r.queries),
            "-" if r.ttft_s is None else f"{r.ttft_s:.3f}",
            "-" if r.latency_s is None else f"{r.latency_s:.3f}",
            mark,
        ]
        table.add_row(*(rich_text(c) for c in cells))
    console.print(table)
    for w in report.waves:
        idx = w["requests"]
        cap = sum(report.rows[i].bound or 0 for i in idx)
        state = "-" if w["hits"] is None else ("ok" if w["hits"] <= cap else "above the bounds")
        console.print(
            rich_text(
                f"wave {idx[0]}-{idx[-1]} ({len(idx)} requests sharing the server): hits {number_text(w['hits'])} (<= {number_text(cap)}: {state}), queries {number_text(w['queries'])}"
            ),
            highlight=False,
        )
    knobs = ", ".join(f"{k}={v}" for k, v in report.server_knobs.items())
    console.print(rich_text(f"server knobs: {knobs}"), highlight=False)
    for n in report.notes:
        console.print(rich_text(f"note: {n}"), highlight=False)
    for u in report.unverified:
        console.print(rich_text(f"assumed (unverified): {u}"), highlight=False)
    # a reproduced finding is a bug present; a bare case that diverges is one too
    style = {
        REPRODUCED: "bold red",
        NOT_REPRODUCED: "bold green",
        AGREES: "bold green",
        DIVERGES: "bold red",
        INCONCLUSIVE: "bold yellow",
    }[report.verdict]
    console.print(Text.assemble("verdict: ", rich_text(report.verdict, style)))
    for reason in report.reasons[:20]:
        console.print(rich_text(f"  - {reason}"), highlight=False)
    if len(report.reasons) > 20:
        console.print(rich_text(f"  ... {len(report.reasons) - 20} more"), highlight=False)
