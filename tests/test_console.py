"""Logs a person can read (issue 41, item 6): where stdout is no terminal
(``make check``'s log, a pipe), a command's tables show every column name
and value whole, not cut to 80 columns ("rejec…", "harne…")."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from rich.table import Table

from ground.console import LOG_WIDTH, table_console
from ground.engines import EngineSpec

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = (
    "driver",
    "execs",
    "exec/s",
    "coverage",
    "unsupported",
    "rejected by the engine",
    "harness errors",
    "new findings",
    "first finding (s)",
)


def _wide_table() -> Table:
    table = Table(title="a table wider than 80 columns")
    for col in COLUMNS:
        table.add_column(col, justify="right")
    table.add_row("random", "1234", "5.6", "-", "0", "12", "0", "3", "7.25")
    return table


def test_a_table_console_off_a_terminal_never_cuts_a_column(monkeypatch):
    out = io.StringIO()  # no terminal
    monkeypatch.setattr(sys, "stdout", out)
    console = table_console()
    assert console.width == LOG_WIDTH and not console.is_terminal
    console.print(_wide_table())
    text = out.getvalue()
    assert "…" not in text and "\x1b[" not in text  # nothing cut, no colour codes
    for col in COLUMNS:
        assert col in text, col
    assert max(len(line) for line in text.splitlines()) > 80


def test_kvspec_fuzz_prints_full_column_names_into_a_log(capsys):
    """The summary table of ``kvspec fuzz`` (what ``make check`` logs)."""
    from argparse import Namespace

    from kvspec.commands.fuzz import _print

    summary = {
        "execs": 1234,
        "exec_per_s": 5.6,
        "coverage": None,
        "unsupported": 0,
        "rejected": 12,
        "harness_errors": 0,
        "findings": [],
        "first_finding_s": None,
        "classes": [],
        "malformed": [],
    }
    _print(summary, Namespace(json=False, driver="random"), [EngineSpec.parse("vllm==0.33.0")], Path("out"))
    text = capsys.readouterr().out
    assert "…" not in text
    for col in COLUMNS:
        assert col in text, col


def test_kvspec_engines_list_in_a_pipe_keeps_its_column_names():
    """A real command through a pipe (the way ``make check`` runs it)."""
    proc = subprocess.run(
        [sys.executable, "-m", "kvspec.cli", "engines", "list"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**__import__("os").environ, "COLUMNS": "80"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "…" not in proc.stdout
    for col in ("engine", "state", "built", "install", "size", "warm", "path"):
        assert col in proc.stdout, col
