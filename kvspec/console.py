"""kvspec's one way to tell the user a line while a command works.

A neutral module (imports nothing of kvspec's), used by the commands and by
``engine_adapter`` alike: progress and messages go to stderr, one line at a
time, flushed (stdout carries a command's result, often JSON); a closed or
broken stderr (``kvspec ... 2>&1 | head -1``, a reader that went away) is
no error.
"""

from __future__ import annotations

import sys


def say(line: str) -> None:
    """Print ``line`` on stderr, flushed; ignore a closed stderr."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
