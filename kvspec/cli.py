"""The ``kvspec`` command: a thin layer that dispatches to kvspec/commands/.

Errors raised on purpose (``ground.errors.KvspecError``) print one line
``kvspec: <message>`` and exit 2 (a line break inside a message is printed
as ``\\n``, so it stays one line); nothing else is caught here, except:

* a closed stdout (``kvspec predict CASE | head -1``): the command stops
  quietly, without a traceback, and exits 141 (128 + SIGPIPE, what a shell
  reports for a tool killed by SIGPIPE, so ``set -o pipefail`` sees the same
  as for ``cat``);
* Ctrl-C: ``kvspec: interrupted``, exit 130.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

import kvspec.commands as commands
from ground.console import say as _say
from ground.errors import KvspecError
from ground.home import REPO_ROOT, foreign_packages
from ground.printable import printable


class Parser(argparse.ArgumentParser):
    """kvspec's argument parser: no abbreviations (``--api-key X`` would be
    read as ``--api-key-env X``), and an error shows the options it could
    not place by name only, never the values beside them (a key typed on
    the command line by mistake is not echoed), and without terminal
    control (``ground.printable``: an option named ``--\\x1b[2J`` is shown
    without its escape)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        for lead in ("unrecognized arguments: ", "ambiguous option: "):
            if message.startswith(lead):
                message = lead + redact_values(message[len(lead) :])
        super().error(printable(message))


def redact_values(text: str) -> str:
    """``--flag=value`` as ``--flag=...`` and every word that is not an
    option as ``...``: what an argparse error about unplaced arguments may
    show."""
    words = []
    for word in text.split(" "):
        if word.startswith("-") and not word[1:2].isdigit():
            words.append(word.split("=", 1)[0] + ("=..." if "=" in word else ""))
        else:
            words.append("..." if word else word)
    return " ".join(words)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="kvspec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=Parser)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"kvspec.commands.{info.name}")
        name = getattr(module, "NAME", info.name)
        cmd = sub.add_parser(name, help=getattr(module, "HELP", None), description=getattr(module, "HELP", None))
        module.configure(cmd)
        cmd.set_defaults(_main=module.main)
    return parser


#: Exit status when stdout was closed by the reader (128 + SIGPIPE).
EXIT_BROKEN_PIPE = 141


def escape_line_breaks(message: str) -> str:
    """A message as one line: CR and LF shown as ``\\r`` and ``\\n``."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def _silence_stdout() -> None:
    """Point stdout's descriptor at /dev/null, so that the interpreter's
    final flush of what is still buffered cannot raise BrokenPipeError again
    (Python's documented recipe for SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real descriptor (captured in tests)
        pass


def main(argv: list[str] | None = None) -> int:
    clash = foreign_packages()
    if clash:
        name, where = clash[0]
        _say(
            f"kvspec: package={name!r} imports from {where}, not from kvspec's checkout {REPO_ROOT}: another installed package has that name; allowed: kvspec in a virtual environment of its own (make venv)"
        )
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args._main(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler
        return code
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KvspecError as e:
        _say(f"kvspec: {escape_line_breaks(str(e))}")
        return 2
    except KeyboardInterrupt:
        _say("kvspec: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
