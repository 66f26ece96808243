"""kvspec findings DIR [--json]: the finding files in DIR grouped into classes."""

from __future__ import annotations

import json
from pathlib import Path

from fuzz.results.impact import short
from ground.errors import invalid
from ground.printable import printable
from kvspec.epilog import set_epilog

HELP = "group the finding files in a folder into classes, one smallest representative each"
EPILOG = """\
A class is oracle x request kind x geometry class x root-cause hint; its
representative is its smallest case (fewest requests, then fewest tokens).
Classes are listed worst first: by severity (wrong output possible, crash,
draft acceptance, lost reuse, memory only), then by prefill tokens
recomputed; the last
column is the cost of the class's costliest finding (fuzz/results/cost.py: tokens,
and prefill time on the deployment's GPU at 40% of its dense BF16 peak;
docs/cost.md).
Files that are not findings are listed apart, one line each.

exit codes:
  0  listed (also when DIR holds no finding, or malformed files)
  2  usage: DIR is not a folder
"""


def configure(parser) -> None:
    set_epilog(parser, EPILOG)
    parser.add_argument("dir", metavar="DIR", help="a findings folder (kvspec fuzz --out)")
    parser.add_argument("--json", action="store_true", help="print the classes as JSON")


def render(classes: list[dict], malformed: list[tuple[str, str]], folder: str) -> list[str]:
    """The classes as text lines: a headline, then per class its key, its
    count and its representative. Every line is :func:`printable` (a
    finding's fields and file names are a stranger's text)."""
    total = sum(c["count"] for c in classes)
    lines = [f"{total} finding(s) in {len(classes)} class(es) in {folder}" if classes else f"no findings in {folder}"]
    for i, c in enumerate(classes, 1):
        rep = c["representative"]
        new = f", {c['new']} new" if c.get("new") else ""
        cost = f" | {short(c['cost'])}" if c.get("cost") else ""
        lines.append(
            f"{i:3d}. {c['oracle']} | {c['request_kind']} | {c['geometry']} | {c['hint']}{cost}  ({c['count']} file(s){new})"
        )
        if c.get("known"):
            unknown = f"; {c['unknown']} of {c['count']} file(s) in none" if c.get("unknown") else ""
            lines.append(f"     known class: {', '.join(c['known'])}{unknown}")
        lines.append(f"     smallest: {rep['path']} ({rep['requests']} request(s), {rep['tokens']} tokens)")
        if rep["summary"]:
            lines.append(f"     {rep['summary']}")
    if malformed:
        lines.append(f"{len(malformed)} malformed file(s), not findings:")
        lines += [f"  {path}: {why}" for path, why in malformed]
    return [printable(line) for line in lines]


def main(args) -> int:
    from fuzz.results.triage import read_findings, triage

    folder = Path(args.dir)
    if not folder.is_dir():
        raise invalid("DIR", args.dir, "must be a folder of finding files (kvspec fuzz --out)")
    described, malformed = read_findings(folder)
    classes = triage(described)
    if args.json:
        print(
            json.dumps(
                {
                    "dir": str(folder),
                    "findings": len(described),
                    "classes": classes,
                    "malformed": [{"path": p, "reason": r} for p, r in malformed],
                },
                indent=2,
            )
        )
    else:
        print("\n".join(render(classes, malformed, str(folder))))
    return 0
