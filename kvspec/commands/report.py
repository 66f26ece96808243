"""kvspec report FINDING [--out DIR] [--matrix vllm==X ...] [--live REPORT.json]

An upstream-ready bundle from a finding (``fuzz.report``): ``ISSUE.md`` in
vLLM's issue style, ``test_<name>.py`` (a self-contained regression test
driving vLLM's Scheduler as ``tests/v1/core`` does; it fails on the buggy
release and passes on a fixed build), ``fix.diff`` when kvspec has a fix for
the finding's class, and the finding itself. ``--matrix`` adds each engine's
hits for the case; ``--live`` a live replay report (``kvspec replay --server
URL --json REPORT.json``).
"""

from __future__ import annotations

import json
from pathlib import Path

from reference.errors import invalid

HELP = "write an upstream-ready report (ISSUE.md, a vLLM regression test, the fix) for a finding"


def configure(parser) -> None:
    parser.add_argument("finding", help="a finding file")
    parser.add_argument("--out", default=None, help="folder to write (default: report-<signature> beside the finding)")
    from kvspec.engine_options import add_engine_arguments

    add_engine_arguments(parser, dest="matrix", flag="--matrix", metavar="vllm==X", help="also run the case on this engine (repeatable); also a build: vllm==X --patch FILE.diff (the --patch after it), vllm==X+LABEL.HASH, path:DIR, wheel:FILE.whl")
    parser.add_argument("--live", default=None, metavar="REPORT.json", help="a live replay report to quote")


def main(args) -> int:
    from fuzz.findings import load_finding
    from fuzz.report import bundle
    from reference.case import load_json, write_text_atomic

    case, finding = load_finding(args.finding)
    if not finding:
        raise invalid("finding", args.finding, "a finding file (a bare case has no expected/observed hits to report)")
    matrix = []
    if args.matrix:
        from engine_adapter import open_engine
        from engine_adapter.versions import engine_name, parse_engine

        from kvspec.engine_options import engine_names

        for name in engine_names(args, dest="matrix", flag="--matrix"):
            engine = engine_name(parse_engine(name, "--matrix"))
            with open_engine(engine) as e:
                obs = e.run(case)
            matrix.append({"engine": engine, "hits": obs.get("hits"), "error": (obs.get("error") or {}).get("message")})
    live = None
    if args.live:
        from fuzz.report import live_summary

        live = live_summary(load_json(args.live, "--live"), args.live, len(case.trace))
    out = Path(args.out) if args.out else Path(args.finding).with_name(f"report-{finding.get('signature', 'finding')}")
    files = bundle(finding, matrix=matrix or None, live=live, finding_path=Path(args.finding).name)
    for name, text in files.items():
        write_text_atomic(out / name, text)
    print(json.dumps({"out": str(out), "files": sorted(files)}, indent=2))
    return 0
