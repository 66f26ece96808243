"""kvspec's one way to tell the user a line while a command works.

On the ground floor (it imports only ``ground.printable``), used by the
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
