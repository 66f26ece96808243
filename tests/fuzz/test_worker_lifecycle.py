"""``kvspec fuzz`` with a broken engine environment (its python crashes on
start): the atheris campaign ends by --max-time with exit 3, every failure
a harness error and none a finding; and its libFuzzer workers die with the
runner on ``kill -9``, of the runner alone or of its process group.

No vLLM runs here: the engine is broken on purpose, so what is under test is
the harness (the runner, its workers, the exit code), never a verdict."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine_adapter.host.environments import MARKER_NAME, fingerprint

ROOT = Path(__file__).resolve().parents[2]
VERSION = "0.33.0"


def _broken_home(home: Path) -> Path:
    """A KVSPEC_HOME whose vllm==0.33.0 environment looks ready but whose
    python kills itself (SIGSEGV) on every start."""
    env = home / "engines" / f"vllm-{VERSION}"
    (env / "bin").mkdir(parents=True)
    python = env / "bin" / "python"
    python.write_text('#!/bin/sh\necho "broken engine python" >&2\nkill -SEGV $$\n')
    python.chmod(0o755)
    (env / MARKER_NAME).write_text(json.dumps({"fingerprint": fingerprint(VERSION)}))
    return home


def _cmd(out: Path, max_time: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "kvspec.cli",
        "fuzz",
        "--driver",
        "atheris",
        "--engine",
        f"vllm=={VERSION}",
        "--no-z3-seeds",
        "--max-time",
        str(max_time),
        "--seed",
        "1",
        "--out",
        str(out),
        "--json",
    ]


def _env(home: Path) -> dict:
    return {**os.environ, "KVSPEC_HOME": str(home)}


def fuzz_workers(marker: str) -> list[int]:
    """Pids of fuzz_engine.py processes whose command line names ``marker``
    (the run's own out folder, in libFuzzer's -artifact_prefix)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"fuzz_engine.py" in cmdline and marker.encode() in cmdline:
            pids.append(int(entry.name))
    return pids


def _wait_for(predicate, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def test_a_crashing_engine_exits_3_within_max_time_and_files_no_finding(tmp_path):
    home, out = _broken_home(tmp_path / "home"), tmp_path / "out"
    start = time.monotonic()
    done = subprocess.run(_cmd(out, 8), cwd=ROOT, env=_env(home), capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - start
    assert done.returncode == 3, done.stderr[-2000:]
    assert wall <= 8 + 4, f"--max-time 8 took {wall:.1f}s"
    summary = json.loads(done.stdout)
    assert summary["exit_code"] == 3 and "harness failed" in summary["outcome"]
    assert summary["harness_errors"] > 0 and summary["findings"] == []
    assert not list(out.glob("*.json")), "a harness error was filed as a finding"
    assert list((out / "harness-errors").glob("*.json"))
    assert "kvspec fuzz: exit 3: harness failed" in done.stderr
    assert not fuzz_workers(str(out))


@pytest.mark.parametrize("target", ["runner", "group"])
def test_libfuzzer_workers_die_with_the_runner_on_kill_9(tmp_path, target):
    home, out = _broken_home(tmp_path / "home"), tmp_path / "out"
    proc = subprocess.Popen(
        _cmd(out, 120),
        cwd=ROOT,
        env=_env(home),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        # The worker is up and fuzzing once it has recorded a harness error.
        assert _wait_for(lambda: fuzz_workers(str(out)) and list((out / "harness-errors").glob("*.json")), 90), (
            "the worker never started fuzzing"
        )
        if target == "runner":
            os.kill(proc.pid, signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert _wait_for(lambda: not fuzz_workers(str(out)), 10), f"workers left running: {fuzz_workers(str(out))}"
        # ... and went without a word: no crash artifact of a broken pipe.
        assert not list((out / "libfuzzer-artifacts").glob("crash-*"))
    finally:
        for pid in fuzz_workers(str(out)):  # never leave one behind, even when failing
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


PARENT = """
import os, subprocess, sys, time
env = {**os.environ, "KVSPEC_FUZZ_PARENT": str(os.getpid())}
child = subprocess.Popen([sys.executable, "-c", "import fuzz.driving.fuzz_engine, time; print('ready', flush=True); time.sleep(120)"], env=env, stdout=subprocess.PIPE, text=True)
print(child.pid, flush=True)
print(child.stdout.readline().strip(), flush=True)
time.sleep(120)
"""


def test_a_quiet_worker_dies_with_its_parent():
    """The worker asks the kernel for SIGKILL when its parent dies
    (PR_SET_PDEATHSIG): even one that writes nothing (a long case) goes."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        child = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "ready"
        assert _alive(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        assert _wait_for(lambda: not _alive(child), 10), "the worker outlived its parent"
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait(timeout=10)
