"""The ``kvspec`` command: a thin layer that dispatches to kvspec/commands/.

Errors raised on purpose (``reference.errors.KvspecError``) print one line
``kvspec: <message>`` and exit 2; nothing else is caught here.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import kvspec.commands as commands
from reference.errors import KvspecError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvspec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"kvspec.commands.{info.name}")
        name = getattr(module, "NAME", info.name)
        cmd = sub.add_parser(name, help=getattr(module, "HELP", None), description=getattr(module, "HELP", None))
        module.configure(cmd)
        cmd.set_defaults(_main=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._main(args) or 0)
    except KvspecError as e:
        print(f"kvspec: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvspec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
