"""kvspec engines install VERSION... | list [--json] [--size] | remove VERSION... | start VERSION [--idle-timeout S] | stop [VERSION...]

One isolated environment per vLLM version under ``$KVSPEC_HOME/engines``
(default ``<repo>/.kvspec/engines``), built from the lock shipped in
``engine_adapter/requirements/vllm-X.txt``. ``install`` is idempotent, shows
progress on stderr, and leaves no half-built environment that looks ready.

Warm engines (``engine_adapter.host.warm``): ``run``, ``replay --engine``,
``resolve`` and ``matrix`` start one per version and platform on first use
and reuse it; it exits after ``KVSPEC_WARM_IDLE_S`` idle seconds (default
600). ``list`` shows the warm ones (pid, idle seconds left), ``stop``
stops them, ``start`` starts one ahead of use; ``remove`` stops a
version's warm engines first.
"""

from __future__ import annotations

import json

from engine_adapter.host import environments
from engine_adapter.host.versions import DEFAULT_ENGINE, SUPPORTED_VERSIONS, engine_name, parse_engine

HELP = "install, list or remove the per-version vLLM engine environments"


def configure(parser) -> None:
    sub = parser.add_subparsers(dest="engines_command", metavar="SUBCOMMAND", required=True)
    p = sub.add_parser("install", help="build the environment of each vllm==X (idempotent)")
    p.add_argument(
        "versions",
        nargs="*",
        metavar="vllm==X",
        help=f"default: {DEFAULT_ENGINE}; supported: {', '.join('vllm==' + v for v in SUPPORTED_VERSIONS)}",
    )
    p.add_argument("--all", action="store_true", help="every supported version")
    p.add_argument("--force", action="store_true", help="rebuild even if ready")
    p = sub.add_parser("list", help="show each supported version's environment")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--size", action="store_true", help="measure sizes on disk now")
    p = sub.add_parser("remove", help="delete environments")
    p.add_argument("versions", nargs="+", metavar="vllm==X")
    p = sub.add_parser("start", help="start a warm engine (reused by run, replay --engine, resolve, matrix)")
    p.add_argument("versions", nargs="*", metavar="vllm==X", help=f"default: {DEFAULT_ENGINE}")
    p.add_argument(
        "--platform",
        choices=("cuda", "cpu"),
        default="cuda",
        help="the platform vLLM runs under (default: %(default)s)",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        metavar="S",
        help="exit after S idle seconds (default: KVSPEC_WARM_IDLE_S or 600)",
    )
    p = sub.add_parser(
        "stop", help="stop warm engines (all, or those of each vllm==X); with no engine named, the zygotes too"
    )
    p.add_argument("versions", nargs="*", metavar="vllm==X")


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
        from engine_adapter.host import warm

        for v in [parse_engine(s) for s in args.versions]:
            warm.stop(v)  # a warm engine never runs from a deleted environment
            removed = environments.remove(v)
            print(f"{engine_name(v)}: {'removed' if removed else 'not installed'}")
        return 0
    if cmd == "start":
        return _start(args)
    if cmd == "stop":
        from engine_adapter.host import warm

        versions = [parse_engine(s) for s in args.versions]
        stopped = [r for v in (versions or [None]) for r in warm.stop(v)]
        for r in stopped:
            print(f"{r['engine']} ({r['platform']}): warm engine pid {r['pid']} stopped ({r['how']})")
        if not stopped:
            print("no warm engine running")
        if not versions:  # every zygote too (each ends once the workers it forked have)
            from engine_adapter.host import zygote

            n = zygote.stop_all()
            if n:
                print(f"{n} zygote{'s' if n != 1 else ''} stopping (each once its workers have ended)")
        return 0
    from engine_adapter.host import warm

    warm_rows = warm.list_warm()
    rows = environments.list_engines(size=args.size)
    for r in rows:
        r["warm"] = [
            {k: w[k] for k in ("platform", "pid", "idle_left_s", "idle_timeout_s", "current", "socket")}
            for w in warm_rows
            if w["engine"] == r["engine"]
        ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.table import Table

    from ground.console import table_console

    table = Table(title=f"kvspec engines ({environments.engines_dir()})")
    for col in ("engine", "state", "built", "install", "size", "warm", "path"):
        table.add_column(col)
    for r in rows:
        install_s = r.get("install_seconds")
        table.add_row(
            r["engine"],
            r["state"],
            r.get("created") or "-",
            f"{install_s:.0f}s" if install_s else "-",
            _fmt_size(r.get("size_bytes")),
            _fmt_warm(r["warm"]),
            r["path"],
        )
    table_console().print(table)
    return 0


def _fmt_warm(rows: list[dict]) -> str:
    if not rows:
        return "-"
    return ", ".join(
        f"{w['platform']} pid {w['pid']}, {w['idle_left_s']:.0f}s" + ("" if w["current"] else " (stale sources)")
        for w in rows
    )


def _start(args) -> int:
    import time

    from engine_adapter.host.engine import WarmEngine
    from kvspec.options import seconds

    if args.idle_timeout is not None:
        seconds("--idle-timeout", args.idle_timeout)
    versions = [parse_engine(s) for s in (args.versions or [DEFAULT_ENGINE])]
    for v in versions:
        if not environments.is_ready(v):
            from ground.errors import EngineError

            raise EngineError(
                f"engine='vllm=={v}': environment {environments.status(v)['state']} at {environments.env_dir(v)}; run: kvspec engines install vllm=={v}"
            )
    for v in versions:
        t = time.monotonic()
        pong = WarmEngine(v, idle_timeout=args.idle_timeout).ping(args.platform)
        print(
            f"{engine_name(v)} ({args.platform}): warm engine pid {pong.get('pid')} ready in {time.monotonic() - t:.1f}s"
        )
    return 0
