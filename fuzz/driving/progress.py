"""What a campaign says while it runs, for a reader without a terminal.

* ``progress_line``: one line of counters (elapsed, execs, exec/s, coverage
  when known, findings, harness errors); ``kvspec fuzz`` prints one about
  every ``PROGRESS_EVERY_S`` seconds when stderr is not a TTY (a pipe, a CI
  log), where the live line of a terminal would be lost.
* ``Heartbeat``: a daemon thread that prints such a line on a fixed period
  for the in-process drivers, whose single steps (a shrink) can take long.
* ``resume_line``: on resume, how many findings and corpus inputs a
  campaign starts from.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

#: Seconds between two progress lines on a non-TTY.
PROGRESS_EVERY_S = 10.0


def progress_line(
    elapsed: float, execs: int, exec_per_s: float, coverage: int | None, findings: int, harness_errors: int
) -> str:
    """The counters of a running campaign as one line; coverage shows as
    ``-`` when the driver does not measure it."""
    cov = "-" if coverage is None else str(coverage)
    return f"kvspec fuzz: {elapsed:7.1f}s  execs {execs}  {exec_per_s:g} exec/s  cov {cov}  findings {findings}  harness errors {harness_errors}"


def count_files(folder: Path | None, pattern: str = "*") -> int:
    """Plain files in ``folder`` matching ``pattern`` (not recursive, no
    hidden or temporary ``.tmp`` files); 0 when the folder does not exist."""
    if folder is None or not folder.is_dir():
        return 0
    return sum(
        1 for p in folder.glob(pattern) if p.is_file() and not p.name.startswith(".") and not p.name.endswith(".tmp")
    )


def resume_line(out: Path, corpus: Path | None) -> str | None:
    """One line naming the prior findings in ``out`` and the inputs in
    ``corpus``; ``None`` for a fresh campaign (both empty)."""
    findings, inputs = count_files(out, "*.json"), count_files(corpus)
    if not findings and not inputs:
        return None
    parts = [f"{findings} prior finding(s) in {out} (not reported again)"]
    if corpus is not None:
        parts.append(f"{inputs} corpus input(s) in {corpus}")
    return "kvspec fuzz: resuming: " + ", ".join(parts)


class Heartbeat:
    """Call ``emit(line())`` every ``every`` seconds until stopped (a
    bounded wait on an Event; the thread is a daemon)."""

    def __init__(self, line: Callable[[], str], emit: Callable[[str], None], every: float = PROGRESS_EVERY_S):
        self.line, self.emit, self.every = line, emit, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvspec-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.emit(self.line())

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=self.every + 1.0)
