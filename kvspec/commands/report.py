"""kvspec report FINDING [--out DIR] [--matrix vllm==X ...] [--live REPORT.json]

An upstream-ready bundle from a finding (``fuzz.results.report``): ``ISSUE.md`` in
vLLM's issue style, ``test_<name>.py`` (a self-contained regression test
driving vLLM's Scheduler as ``tests/v1/core`` does; it fails on the buggy
release and passes on a fixed build), ``fix.diff`` when kvspec has a fix for
the finding's class, and the finding itself. ``--matrix`` adds each engine's
hits for the case; ``--live`` a live replay report (``kvspec replay --server
URL --json REPORT.json``).

A finding is a stranger's file: its fields are checked before anything runs
(``fuzz.results.findings.check_fields``; one line naming the field, exit 2), and
what the report holds of it is escaped (``fuzz.results.report``). The folder is
written whole or not at all (``ground.files.write_folder_atomic``): a
full or read-only disk is one line, exit 2, and leaves no half-written
folder. An existing ``--out`` is replaced only when it is empty or holds a
previous report (its files, and pytest's caches); a folder holding anything
else is refused.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

from ground.errors import invalid, shown

#: What a previous report folder may hold (it is replaced whole).
REPORT_FILES = ("ISSUE.md", "finding.json", "fix.diff", "test_*.py", "__pycache__", ".pytest_cache")

HELP = "write an upstream-ready report (ISSUE.md, a vLLM regression test, the fix) for a finding"


def configure(parser) -> None:
    parser.add_argument("finding", help="a finding file")
    parser.add_argument("--out", default=None, help="folder to write (default: report-<signature> beside the finding)")
    from kvspec.engine_options import add_engine_arguments

    add_engine_arguments(
        parser,
        dest="matrix",
        flag="--matrix",
        metavar="vllm==X",
        help="also run the case on this engine (repeatable); also a build: vllm==X --patch FILE.diff (the --patch after it), vllm==X+LABEL.HASH, path:DIR, wheel:FILE.whl",
    )
    parser.add_argument("--live", default=None, metavar="REPORT.json", help="a live replay report to quote")


def replaceable(out: Path) -> None:
    """``out`` may become the report folder: absent, empty, or a previous
    report (only :data:`REPORT_FILES`); else one line."""
    if not out.exists():
        return
    try:
        names = [p.name for p in out.iterdir()]
    except OSError as e:
        raise invalid(
            "--out", str(out), f"cannot be read ({e.strerror or e}); allowed: a new folder, or an earlier report's"
        ) from None
    other = sorted(n for n in names if not any(fnmatch.fnmatchcase(n, pattern) for pattern in REPORT_FILES))
    if other:
        raise invalid(
            "--out",
            str(out),
            f"holds {len(other)} file(s) that are not a report's ({shown(other[0])}, ...); allowed: a new or empty folder, or an earlier report's (it is replaced whole)",
        )


def main(args) -> int:
    from fuzz.results.findings import check_fields, load_finding
    from fuzz.results.report import bundle
    from ground.files import load_json, write_folder_atomic
    from kvspec.options import output_dir

    case, finding = load_finding(args.finding)
    if not finding:
        raise invalid("finding", args.finding, "a finding file (a bare case has no expected/observed hits to report)")
    check_fields(finding)
    out = Path(args.out) if args.out else Path(args.finding).parent / f"report-{finding['signature']}"
    output_dir("--out", out)
    replaceable(out)
    matrix = []
    if args.matrix:
        from engine_adapter import open_engine
        from kvspec.engine_options import engine_specs

        for spec in engine_specs(args, dest="matrix", flag="--matrix"):  # each name parsed once, there
            engine = spec.name
            with open_engine(spec) as e:
                obs = e.run(case)
            matrix.append({"engine": engine, "hits": obs.get("hits"), "error": (obs.get("error") or {}).get("message")})
    live = None
    if args.live:
        from fuzz.results.report import live_summary

        live = live_summary(load_json(args.live, "--live"), args.live, len(case.trace))
    from ground.engines import FAMILIES, family_of, load

    family = FAMILIES[family_of(str(finding["engine"]["version"]))]
    if family.reporter:  # the family's own issue template and test (SGLang: in the style of its mem_cache unit tests)
        if live:
            raise invalid(
                "--live", args.live, f"a live replay report is vLLM's; allowed with a {family.title} finding: none"
            )
        files = load(family.reporter).bundle(finding, matrix=matrix or None, finding_path=Path(args.finding).name)
    else:
        files = bundle(finding, matrix=matrix or None, live=live, finding_path=Path(args.finding).name)
    try:
        write_folder_atomic(out, files)
    except OSError as e:
        raise invalid(
            "--out",
            str(out),
            f"cannot be written ({e.strerror or e}); nothing was written; allowed: a writable folder with room for the report",
        ) from None
    print(json.dumps({"out": str(out), "files": sorted(files)}, indent=2))
    return 0
