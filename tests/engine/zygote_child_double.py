"""A test double of a worker for tests/engine/test_zygote.py (never an
engine): run by a zygote as ``python -m tests.engine.zygote_child_double
MODE``. ``echo``: read one line, answer it with what the process sees (its
environment variable KVSPEC_DOUBLE, folder, session, parent), exit 7;
``sleep``: wait for a line that never comes."""

from __future__ import annotations

import json
import os
import sys

if __name__ == "__main__":
    mode = sys.argv[1]
    print("double on stderr", file=sys.stderr, flush=True)
    line = sys.stdin.readline()
    if mode == "echo":
        seen = {
            "line": line.strip(),
            "env": os.environ.get("KVSPEC_DOUBLE"),
            "cwd": os.getcwd(),
            "own_session": os.getsid(0) == os.getpid(),
            "ppid": os.getppid(),
            "argv": sys.argv[1:],
        }
        print(json.dumps(seen), flush=True)
        sys.exit(7)
