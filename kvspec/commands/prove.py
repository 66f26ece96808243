"""kvspec prove [--json] [--sweep] [--out DIR]: the z3 proofs of spec/."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

from kvspec.switches import add_switches

HELP = "prove the retention rules against the promise (z3), write counterexamples as case files"

SYMBOL = {"proved": "proved", "refuted": "counterexample", "unknown": "unknown", "error": "error"}


def configure(parser) -> None:
    add_switches(
        parser,
        {
            "--json": "print every result as one JSON object instead of tables",
            "--sweep": "also run the concrete sweep (every S = 16k <= 4096 with every valid A, M)",
            "--all": "also the slow rows (chunked prefill per rule, about 0.5 s each)",
        },
    )
    parser.add_argument(
        "--out",
        default=None,
        help="folder for counterexample case files (default: $KVSPEC_HOME/counterexamples, KVSPEC_HOME defaulting to .kvspec)",
    )
    parser.add_argument(
        "--only", default=None, help="only rows whose id contains this text (e.g. 'R1/mask named:1600')"
    )
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: the CPU count)")
    parser.add_argument("--seed", type=int, default=0, help="z3 random seed (default: %(default)s)")
    parser.add_argument("--timeout", type=int, default=5000, help="per solver call, in ms (default: %(default)s)")


def _out_dir(args) -> Path:
    if args.out:
        return Path(args.out)
    return Path(os.environ.get("KVSPEC_HOME", ".kvspec")) / "counterexamples"


def _counterexample_work(row):
    from spec.minimal import case_for, confirm, minimal

    m = minimal(row)
    if m.outcome.verdict != "refuted":
        return row, None, None, None
    case = case_for(row, m.values)
    return row, m.values, case, confirm(row, case)


def _check_options(args) -> None:
    """--timeout in [1 ms, one day], --jobs >= 1, --seed a z3 seed, --out writable."""
    from kvspec.options import output_dir, whole

    whole("--timeout", args.timeout, minimum=1, maximum=86_400_000)
    whole("--jobs", args.jobs, minimum=1, maximum=1024, none_ok=True)
    whole("--seed", args.seed, minimum=0, maximum=2**32 - 1)
    if args.out:
        output_dir("--out", args.out)


def main(args) -> int:
    _check_options(args)
    from reference.case import dump_case
    from spec.catalogue import MODE_NAMES, rows, run_rows
    from spec.parallel import pmap

    t0 = time.perf_counter()
    todo = rows("all" if args.all else "full")
    if args.only:
        todo = [r for r in todo if args.only in r.id]
    results = run_rows(todo, jobs=args.jobs, seed=args.seed, timeout_ms=args.timeout)

    # Minimal counterexamples on the named geometries, as case files.
    out = _out_dir(args)
    # Only pairings some vLLM version runs (legacy: 0.29.0; replay: 0.30.0+),
    # so that each file can be confirmed with ``kvspec run``.
    from spec.geometry import MODE

    named_refuted = [
        r.row
        for r in results
        if r.verdict == "refuted"
        and r.row.geometry.startswith("named:")
        and r.row.prop in ("R1", "R2")
        and MODE[r.row.mode].on_engine(r.row.rule)
    ]
    cexs = []
    for row, values, case, confirmation in pmap(_counterexample_work, named_refuted, args.jobs):
        if case is None:
            continue
        path = out / f"{case.name}.json"
        dump_case(case, path)
        cexs.append(
            {"id": row.id, "N": values["N"], "N2": values.get("N2"), "case": str(path), "reference": confirmation}
        )

    sweep = []
    if args.sweep:
        from spec.sweep import run_sweep, sweep_rows

        srows = sweep_rows()
        if args.only:
            srows = [r for r in srows if args.only in r.id]
        sweep = run_sweep(srows, jobs=args.jobs, seed=args.seed)

    ok = all(r.ok for r in results) and all(s.ok for s in sweep) and all(c["reference"]["confirmed"] for c in cexs)
    elapsed = time.perf_counter() - t0
    if args.json:
        print(
            json.dumps(
                {
                    "ok": ok,
                    "seconds": round(elapsed, 3),
                    "results": [r.as_dict() for r in results],
                    "counterexamples": cexs,
                    "sweep": [
                        {
                            "id": s.row.id,
                            "expect": s.row.expect,
                            "verdict": s.verdict,
                            "geometries": s.geometries,
                            "refuted_everywhere": s.everywhere,
                            "digits": s.family,
                            "witness": s.witness,
                            "seconds": round(s.seconds, 4),
                            "ok": s.ok,
                        }
                        for s in sweep
                    ],
                },
                indent=2,
                default=str,
            )
        )
        return 0 if ok else 1
    _print_tables(results, cexs, sweep, MODE_NAMES, elapsed, ok, out)
    return 0 if ok else 1


def _cell(r) -> str:
    text = f"{SYMBOL[r.verdict]} {r.seconds:.2f}s"
    if r.verdict == "refuted" and r.counterexample:
        c = r.counterexample
        text = f"{SYMBOL[r.verdict]} N={c['N']}" + (f" N2={c['N2']}" if "N2" in c else "") + f" {r.seconds:.2f}s"
    if not r.ok:
        text += f" (expected {SYMBOL[r.row.expect]})"
    return text


def _print_tables(results, cexs, sweep, modes, elapsed, ok, out) -> None:
    from rich.table import Table

    from ground.console import table_console

    console = table_console(min_width=160)
    groups: dict[tuple, dict[str, object]] = defaultdict(dict)
    for r in results:
        key = (r.row.prop + (f"/{r.row.level}" if r.row.level else ""), r.row.geometry, r.row.rule or "-")
        groups[key][r.row.mode] = r
    table = Table(
        title="kvspec prove: property x rule x verdict x time (one column per serving mode)", show_lines=False
    )
    for col in ("property", "geometry", "rule", *modes):
        table.add_column(col, overflow="fold")
    for (prop, geo, rule), cells in groups.items():
        row = [prop, geo.replace("named:", ""), rule]
        for mode in modes:
            r = cells.get(mode)
            if r is None:
                row.append("")
                continue
            style = "green" if r.verdict == "proved" else ("yellow" if r.verdict == "refuted" else "red")
            if not r.ok:
                style = "bold red"
            row.append(f"[{style}]{_cell(r)}[/{style}]")
        table.add_row(*row)
    console.print(table)
    if cexs:
        t = Table(
            title=f"minimal counterexamples (z3 Optimize) of the pairings an engine runs (legacy on 0.29.0, replay on 0.30.0+), as case files in {out}"
        )
        for col in ("row", "N", "N2", "reference: hit < block <= promise", "case file"):
            t.add_column(col, overflow="fold")
        for c in cexs:
            ref = c["reference"]
            t.add_row(
                c["id"],
                str(c["N"]),
                str(c["N2"] or ""),
                f"{ref['hit']} < {ref['target']} <= {ref['promise_hit']} ({'confirmed' if ref['confirmed'] else 'NOT confirmed'})",
                c["case"],
            )
        console.print(t)
    if sweep:
        t = Table(title="concrete sweep: every S = 16k <= 4096 with every valid A, M (N symbolic)")
        for col in ("row", "geometries", "verdict", "everywhere", "N digits (n,j,s)", "witness", "time"):
            t.add_column(col, overflow="fold")
        for s in sweep:
            w = s.witness or {}
            t.add_row(
                s.row.id,
                str(s.geometries),
                SYMBOL[s.verdict] + ("" if s.ok else f" (expected {SYMBOL[s.row.expect]})"),
                "" if s.everywhere is None else str(s.everywhere),
                str(s.family or ""),
                f"{w.get('geometry', '')} N={w.get('N', '')}" if w else "",
                f"{s.seconds:.2f}s",
            )
        console.print(t)
    bad = [r for r in results if not r.ok]
    console.print(
        f"{len(results)} rows, {sum(r.verdict == 'proved' for r in results)} proved, {sum(r.verdict == 'refuted' for r in results)} refuted, {len(bad)} unexpected; {elapsed:.1f}s. "
        + ("every expected verdict holds" if ok else "SOME EXPECTED VERDICTS FAIL")
    )
