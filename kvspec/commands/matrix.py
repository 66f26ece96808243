"""kvspec matrix CASES... --engine E1 --engine E2 ... [--markdown|--html] [--chart PNG]

Each ``--engine`` is a release or a build of any family (``vllm==X``,
``sglang==X``, ``sglang==X --patch FIX.diff``, a build made earlier): the
releases of one family side by side (SGLang: 0.5.23 and its fixed builds),
or families side by side (a deployment case of the other family runs with
that engine's default flags).

Exit status (``fuzz.replaying.matrix.exit_code``): 0 every cell agrees with the
promise (a finding: not reproduced); 1 a cell departs from it (a bare case
diverges, a finding reproduces); 3 a cell could not be judged (an error,
inconclusive) and none departs; 2 bad input, before any engine starts.
"""

from __future__ import annotations

from pathlib import Path

from kvspec.epilog import set_epilog

HELP = "hit patterns per case x engine (releases and builds of any family), as a table and a chart"


EPILOG = """\
exit codes:
  0  every cell agrees with the promise (a finding: not reproduced)
  1  a cell departs from it (a bare case diverges, a finding reproduces)
  2  bad input (one line naming it), before any engine starts
  3  a cell could not be judged (an error, inconclusive) and none departs
"""


def configure(parser) -> None:

    set_epilog(parser, EPILOG)
    parser.add_argument("cases", nargs="+", help="case or finding files")
    from kvspec.engine_options import add_engine_arguments

    add_engine_arguments(
        parser,
        required=True,
        metavar="ENGINE",
        help="an engine, repeated: a release (vllm==X, sglang==X) or a build (ENGINE --patch FILE.diff, NAME==X+LABEL.HASH, path:DIR, wheel:FILE.whl); a deployment case of another family runs there with that engine's default flags",
    )
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true", help="print a markdown table")
    fmt.add_argument("--html", action="store_true", help="print an HTML table")
    fmt.add_argument(
        "--json", action="store_true", help="print the rows as JSON (each cell: hits, verdict, block, promise)"
    )
    parser.add_argument("--chart", default=None, help="write a hits-per-request chart (PNG) here")


def main(args) -> int:
    from ground.console import table_console
    from kvspec.options import output_file

    if args.chart:
        output_file("--chart", args.chart)  # before any engine work

    from engine_adapter import open_engine
    from engine_adapter.host import warm
    from engine_adapter.models.served import check_case_model
    from fuzz.replaying.matrix import chart, exit_code, load_cases, run_matrix, to_html, to_markdown, to_rich
    from kvspec.engine_options import engine_specs

    cases = load_cases(args.cases)
    for _path, case, _finding in cases:
        check_case_model(case)  # a config naming code: one line before any engine starts
    specs = engine_specs(args)  # each name parsed once, there
    versions = [spec.version for spec in specs]
    engines = [open_engine(spec, warm=warm.enabled()) for spec in specs]
    try:
        rows = run_matrix(cases, engines)
    finally:
        for e in engines:
            if hasattr(e, "close"):
                e.close()
    if args.json:
        import json

        print(json.dumps([{k: v for k, v in r.items() if k != "_case"} for r in rows], indent=1))
    elif args.markdown:
        print(to_markdown(rows, versions), end="")
    elif args.html:
        print(to_html(rows, versions), end="")
    else:
        table_console().print(to_rich(rows, versions))
    if args.chart:
        print(f"chart: {chart(rows, versions, Path(args.chart))}")
    return exit_code(rows, versions)
