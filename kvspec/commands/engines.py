"""kvspec engines install VERSION... | list [--json] [--size] | remove VERSION...

One isolated environment per vLLM version under ``$KVSPEC_HOME/engines``
(default ``<repo>/.kvspec/engines``), built from the lock shipped in
``engine_adapter/requirements/vllm-X.txt``. ``install`` is idempotent, shows
progress on stderr, and leaves no half-built environment that looks ready.
"""

from __future__ import annotations

import json

from engine_adapter import environments
from engine_adapter.versions import DEFAULT_ENGINE, SUPPORTED_VERSIONS, parse_engine

HELP = "install, list or remove the per-version vLLM engine environments"


def configure(parser) -> None:
    sub = parser.add_subparsers(dest="engines_command", metavar="SUBCOMMAND", required=True)
    p = sub.add_parser("install", help="build the environment of each vllm==X (idempotent)")
    p.add_argument("versions", nargs="*", metavar="vllm==X", help=f"default: {DEFAULT_ENGINE}; supported: {', '.join('vllm==' + v for v in SUPPORTED_VERSIONS)}")
    p.add_argument("--all", action="store_true", help="every supported version")
    p.add_argument("--force", action="store_true", help="rebuild even if ready")
    p = sub.add_parser("list", help="show each supported version's environment")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--size", action="store_true", help="measure sizes on disk now")
    p = sub.add_parser("remove", help="delete environments")
    p.add_argument("versions", nargs="+", metavar="vllm==X")


def _fmt_size(n: int | None) -> str:
    return "-" if not n else f"{n / 2**30:.2f} GiB"


def main(args) -> int:
    cmd = args.engines_command
    if cmd == "install":
        specs = list(SUPPORTED_VERSIONS) if args.all else (args.versions or [DEFAULT_ENGINE])
        versions = [parse_engine(s) for s in specs]  # all names checked before any work
        for v in versions:
            environments.install(v, force=args.force)
        return 0
    if cmd == "remove":
        for v in [parse_engine(s) for s in args.versions]:
            removed = environments.remove(v)
            print(f"vllm=={v}: {'removed' if removed else 'not installed'}")
        return 0
    rows = environments.list_engines(size=args.size)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"kvspec engines ({environments.engines_dir()})")
    for col in ("engine", "state", "built", "install", "size", "path"):
        table.add_column(col)
    for r in rows:
        install_s = r.get("install_seconds")
        table.add_row(r["engine"], r["state"], r.get("created") or "-", f"{install_s:.0f}s" if install_s else "-", _fmt_size(r.get("size_bytes")), r["path"])
    Console().print(table)
    return 0
