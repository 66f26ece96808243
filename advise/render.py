"""The advice printed with rich, and its JSON form.

The printed advice holds text kvspec did not write (a case's name, a
server's model and answers, vLLM's messages): every string of the document
is made :func:`~ground.printable.printable` before it is printed, so no
control character reaches the terminal (the JSON form escapes them).
"""

from __future__ import annotations

import sys

from advise.model import RESENDS
from ground.printable import printable

#: Request rows printed: the first ones, then those losing reuse, up to this many.
MAX_ROWS = 30


def size(n: int | None) -> str:
    """Bytes as B / KiB / MiB / GiB."""
    if n is None:
        return "unknown"
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):,.1f} {unit}"
    return f"{n} B"


def trace_text(trace: list) -> str:
    """A canonical trace as ``A:3200+B:1600 | ...``."""
    return " | ".join("+".join(f"{s}:{n}" for s, n in prompt) for prompt in trace)


def report(advice: dict, source: dict, workload: dict, confirm: dict | None, files: dict) -> dict:
    """The JSON document ``--json`` prints and OUT/advice.json holds."""
    out = {k: v for k, v in advice.items() if k not in ("outcomes", "promise_outcome")}
    if confirm is not None:
        by_interval = {r["interval"]: r for r in confirm["settings"]}
        current = by_interval.get(advice["current_retention"]["interval"], {})
        dense = by_interval.get(None, {})
        now, full = current.get("engine_hits") or [], dense.get("engine_hits") or []
        for row in out["requests"]:
            i = row["request"]
            row["engine"] = now[i] if i < len(now) else None
            row["engine_dense"] = full[i] if i < len(full) else None
        for row in out["retention"]["settings"]:
            c = by_interval.get(row["interval"], {})
            row["engine"] = {
                k: c.get(k) for k in ("status", "engine_hit_tokens", "engine_states", "finding", "reason") if k in c
            }
    return {"kvspec_advice": 1, "source": source, "workload": workload, **out, "confirm": confirm, "files": files}


def _mcp(m: dict, key: str) -> str:
    v = m.get(key)
    return (
        "none up to {:,} tokens".format(m["searched_up_to"])
        if v is None
        else f"{v['tokens']:,} tokens (hits {v['hits']})"
    )


def printable_doc(value):
    """``value`` with every string in it (keys too) :func:`printable`."""

    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_doc(k): printable_doc(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(printable_doc(v) for v in value)
    return value


def render(doc: dict, console=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    doc = printable_doc(doc)
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    src, g = doc["source"], doc["source"]["geometry"]
    f = src.get("facts") or {}
    groups = ", ".join(f"{x['count']}x {x['kind']} {x['block_size']}" for x in g["groups"])
    console.print(
        f"[bold]kvspec advise[/bold] {escape(src['describe'])} on {src['engine']} ({src['kind']}{', resolution cached' if src.get('resolution_cached') else ''})",
        highlight=False,
    )
    console.print(
        f"  groups: {groups}; scheduler block {g['scheduler_block_size']}, hash block {g['hash_block_size']}, hit unit {doc['knobs']['alignment']}, chunk budget {g['max_num_batched_tokens']}",
        highlight=False,
    )
    console.print(
        f"  retention {doc['current_retention']['setting']}; speculative {src['speculative']}; lookahead {doc['knobs']['hash_lookahead_tokens']}, EAGLE drop {doc['knobs']['eagle_drop']}; prefill checkpoints {g.get('prefill_checkpoint_grid')}; rule {doc['rule']}",
        highlight=False,
    )
    if f.get("mamba_layers"):
        console.print(
            f"  {f.get('attention_layers')} attention + {f.get('mamba_layers')} Mamba layers, TP {f.get('tensor_parallel_size')}, Mamba page {f.get('mamba_page_size_bytes') or f.get('mamba_page_size_padded')} bytes, max_model_len {f.get('max_model_len')}",
            highlight=False,
        )
    for a in src.get("assumptions") or []:
        console.print(f"  assumed: {a}", highlight=False, markup=False)
    m = doc["min_cacheable_prefix"]
    console.print(
        f"[bold]Minimum cacheable prefix[/bold]: first resend hits from {_mcp(m, 'first_resend')}; some resend of {RESENDS} sends from {_mcp(m, 'any_resend')}; promise (dense) from {_mcp(m, 'promise')}",
        highlight=False,
    )

    w = doc["workload"]
    t = doc["totals"]
    table = Table(
        title=escape(
            f"workload {w['name']} {w.get('params', {})}: {t['requests']:,} requests, {t['prompt_tokens']:,} prompt tokens"
        ),
        title_justify="left",
    )
    engine = doc.get("confirm") is not None and any(r.get("engine") is not None for r in doc["requests"])
    for col in (
        "#",
        "prompt",
        f"hits ({doc['rule']}, {doc['current_retention']['setting']})",
        "promise (dense)",
        "lost",
        "lost %",
        *(("vLLM", "vLLM dense") if engine else ()),
    ):
        table.add_column(col, justify="right")
    rows = doc["requests"]
    shown = rows[: MAX_ROWS // 2] + [r for r in rows[MAX_ROWS // 2 :] if r["lost_tokens"]][: MAX_ROWS // 2]
    for r in shown:
        cells = [
            str(r["request"]),
            f"{r['prompt_tokens']:,}",
            f"{r['implemented']:,}",
            f"{r['promise']:,}",
            f"{r['lost_tokens']:,}",
            f"{r['lost_share']:.1%}",
        ]
        if engine:
            cells += [_n(r.get("engine")), _n(r.get("engine_dense"))]
        table.add_row(*cells, style="red" if r["lost_tokens"] > 0 else None)
    console.print(table)
    if len(shown) < len(rows):
        console.print(f"  ({len(rows) - len(shown):,} more requests in the JSON)")
    console.print(
        f"[bold]Lost reuse[/bold]: {t['lost_tokens']:,} tokens = {t['lost_share']:.2%} of prefill ({t['requests_losing']:,} requests); hit share {t['implemented_hit_share']:.2%} vs promise {t['promise_hit_share']:.2%}",
        highlight=False,
    )
    if doc.get("cost"):
        from fuzz.results.impact import short

        console.print(
            f"[bold]Cost[/bold] (fuzz/results/cost.py, docs/cost.md): {escape(short(doc['cost']))}", highlight=False
        )

    ft = Table(
        title=f"Failure classes on this deployment ({doc['rule']} rule, {doc['current_retention']['setting']}) vs the promise",
        title_justify="left",
    )
    for col in ("class", "exposed", "minimal case", "hits", "promise"):
        ft.add_column(col)
    for c in doc["failure_classes"]:
        case = c.get("case")
        ft.add_row(
            c["class"],
            "[red]yes[/red]" if c["exposed"] else f"no ({c['checked']} cases)",
            escape(trace_text(case["trace"])) if case else "",
            escape(str(case["implemented"])) if case else "",
            escape(str(case["promise"])) if case else "",
        )
    console.print(ft)

    ret = doc["retention"]
    rt = Table(title="Retention", title_justify="left")
    for col in (
        "setting",
        "flag",
        "hit share",
        "Mamba states",
        "per GPU",
        "all GPUs",
        *(("vLLM",) if doc.get("confirm") else ()),
    ):
        rt.add_column(col)
    rec = ret["recommended"]
    for r in ret["settings"]:
        cells = [
            r["setting"] + (" (current)" if r["current"] else ""),
            r["flag"],
            f"{r['hit_share']:.2%}",
            f"{r['states']:,}",
            size(r["bytes_per_gpu"]),
            size(r["bytes_all_gpus"]),
        ]
        if doc.get("confirm"):
            e = r.get("engine") or {}
            cells.append(
                {"agrees": "[green]agrees[/green]", "disagrees": "[red]DISAGREES[/red]"}.get(
                    e.get("status"), e.get("status") or "-"
                )
            )
        rt.add_row(*cells, style="bold" if r["interval"] == rec["interval"] else None)
    console.print(rt)
    console.print(f"  memory: {ret['memory']['how']}; states: {ret['states_counted']}", highlight=False)
    console.print(
        f"[bold]Recommended[/bold]: {rec['flag']} ({rec['setting']}): hit share {rec['hit_share']:.2%}, {_states(rec['states'])} = {size(rec['bytes_per_gpu'])} per GPU, {size(rec['bytes_all_gpus'])} in all; {rec['rule']}",
        highlight=False,
    )

    c = doc.get("confirm")
    if c is None:
        console.print(
            "[yellow]not confirmed on the engine[/yellow]: " + (doc.get("confirm_skipped") or "--no-confirm"),
            highlight=False,
        )
    else:
        style = {"confirmed": "green", "disagrees": "bold red", "inconclusive": "yellow"}[c["status"]]
        console.print(
            f"[bold]Engine {c['engine']}[/bold]: [{style}]{c['status']}[/{style}] ({len(c['settings'])} settings run)",
            highlight=False,
        )
        for r in c["settings"]:
            if r["status"] != "agrees":
                console.print(
                    f"  {r['setting']}: {r['status']}: {r.get('detail') or r.get('reason') or ''} requests {r.get('diverging_requests', [])[:10]}",
                    highlight=False,
                    markup=False,
                )
        for path in c["findings"]:
            console.print(f"  finding: {path}", highlight=False, markup=False)
        for n in c["notes"]:
            console.print(f"  note: {n}", highlight=False, markup=False)
    for k, v in doc["files"].items():
        if v:
            console.print(f"{k}: {v}", highlight=False, markup=False)


def _states(n: int) -> str:
    return f"{n:,} Mamba state{'' if n == 1 else 's'}"


def _n(x) -> str:
    return "-" if x is None else f"{x:,}"
