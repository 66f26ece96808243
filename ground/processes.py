"""Starting kvspec's long-lived helper processes: a warm engine, a zygote,
the live server. One rule for all three: its own session (its process
group is its pid, so it is stopped by pid and outlives no one's terminal),
no standard input, standard output and error into the log file it was
given."""

from __future__ import annotations

import subprocess
from typing import IO


def start_detached(cmd: list[str], log: IO, *, env: dict[str, str], cwd: str) -> subprocess.Popen:
    """``cmd`` started in its own session, stdin from /dev/null, stdout
    and stderr into ``log`` (an open file)."""
    return subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
