"""Top-level task functions for tests/distribute (imported by name on the
workers, so they live in an importable module)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ground.errors import EngineError
from ground.files import write_text_atomic


def square(task: dict) -> dict:
    """A quick task: the square of ``x``, and where it ran."""
    return {"x": task["x"], "square": task["x"] ** 2, "pid": os.getpid()}


def record_pid_and_wait(task: dict) -> dict:
    """Write this worker's pid to ``DIR/<id>.<n>.pid`` (n: how many attempts
    ran before, counted by the files), then wait until ``DIR/release``
    exists (at most ``wait_s``): a test kills the pid meanwhile."""
    folder = Path(task["dir"])
    n = len(list(folder.glob(f"{task['id']}.*.pid")))
    write_text_atomic(folder / f"{task['id']}.{n}.pid", str(os.getpid()))
    end = time.monotonic() + task.get("wait_s", 30)
    while not (folder / "release").exists() and time.monotonic() < end:
        time.sleep(0.05)
    return {"id": task["id"], "pid": os.getpid(), "attempts_seen": n + 1}


def harness_error(task: dict) -> dict:
    """A task that raises kvspec's harness error (counted in ``DIR``)."""
    folder = Path(task["dir"])
    n = len(list(folder.glob(f"{task['id']}.*.run")))
    write_text_atomic(folder / f"{task['id']}.{n}.run", str(os.getpid()))
    raise EngineError(f"engine=vllm==9.9.9: worker did not start (test {task['id']})")


def sleep(task: dict) -> dict:
    time.sleep(task["seconds"])
    return {"slept": task["seconds"]}


def run_like_a_mutant(mutant: dict, budget: float, options: dict) -> dict:
    """The shape of ``mutate``'s ``run_mutant(mutant, budget, options)``."""
    return {"mutant": mutant["id"], "budget": budget, "killed": options.get("kill", False)}
