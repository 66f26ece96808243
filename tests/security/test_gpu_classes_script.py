"""The GPU classes script (``engine_adapter/devcheck/gpu_classes.py``, issue
40 item 9) answers a bad ``--plan`` / ``--run`` folder (a file,
``/dev/null``, a path under a file) and a ``--python`` that does not run or
cannot import vLLM in one line, exit 2, never a traceback; nothing is
started (each probe runs the script as its own process, on CPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: One class: each probe is refused before any class is planned or run.
BY_ONE = "stale-state"


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "engine_adapter.devcheck.gpu_classes", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _one_line(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-800:])
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr[-800:]
    for n in needles:
        assert n in proc.stderr, proc.stderr


@pytest.mark.parametrize("where", ["file", "devnull", "under-a-file"])
@pytest.mark.parametrize("mode", ["--plan", "--run"])
def test_a_plan_folder_that_is_not_a_folder_is_one_line(tmp_path, where, mode):
    f = tmp_path / "f"
    f.write_text("x")
    value = {"file": str(f), "devnull": "/dev/null", "under-a-file": str(f / "sub")}[where]
    extra = ["--python", sys.executable] if mode == "--run" else []
    _one_line(_script(mode, value, "--classes", BY_ONE, *extra), f"{mode}=")


@pytest.mark.parametrize("python", ["/nonexistent/python3", "/dev/null", "__self__"])
def test_a_python_that_fails_is_one_line_before_any_server(tmp_path, python):
    # __self__: this interpreter, which runs but cannot import vLLM (kvspec's venv has no vLLM)
    py = sys.executable if python == "__self__" else python
    proc = _script("--run", str(tmp_path / "out"), "--python", py, "--classes", BY_ONE)
    _one_line(proc, "--python=")
    assert not (tmp_path / "out" / BY_ONE / "server.log").exists()
