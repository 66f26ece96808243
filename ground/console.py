"""kvspec's one way to tell the user a line while a command works.

On the ground floor (it imports only ``ground.printable``, and rich for
tables: :func:`table_console`), used by the
commands and by ``engine_adapter`` alike: progress and messages go to
stderr, one line at a time, flushed (stdout carries a command's result,
often JSON), without terminal control characters (a message may quote a
stranger's text: a finding's, vLLM's); a closed or broken stderr
(``kvspec ... 2>&1 | head -1``, a reader that went away) is no error.
"""

from __future__ import annotations

import sys

from ground.printable import printable


def say(line: str) -> None:
    """Print ``line`` on stderr, flushed, :func:`printable` (line breaks and
    tabs kept); ignore a closed stderr."""
    try:
        print(printable(line, keep="\n\t"), file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


#: The width of a console that is no terminal (a log, a pipe, ``make
#: check``'s output): a log is read whole, so a table's columns are never
#: cut ("rejec…"); rich tables take their natural width, not this one.
LOG_WIDTH = 4096


def table_console(*, stderr: bool = False, min_width: int | None = None):
    """A rich ``Console`` for a command's tables and lines. On a terminal:
    the terminal's width (at least ``min_width``). Elsewhere (a file, a
    pipe): :data:`LOG_WIDTH` columns, no colour codes, no highlighting, so
    a log shows every column name and value whole."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    try:
        tty = stream.isatty()
    except (OSError, ValueError, AttributeError):
        tty = False
    if tty:
        console = Console(file=stream)
        return console if min_width is None or console.width >= min_width else Console(file=stream, width=min_width)
    return Console(file=stream, width=LOG_WIDTH, color_system=None, highlight=False, force_terminal=False)
