"""Run independent tasks here or on a Ray cluster, results in one folder.

The rule
--------
A *task* is a JSON-able dict with a unique ``"id"`` (letters, digits,
``.``, ``_``, ``-``), run by a *top-level importable function*
``fn(task) -> dict`` whose result is JSON-able (or, when the task has
``"kwargs"``, ``fn(**task["kwargs"])``). :func:`run_tasks` runs every
task once and writes its result, atomically, to ``OUT/<id>.json``: the file
is keyed by the task id, so a task that ran twice (its worker died, Ray ran
it again) still has one result file and is counted once; only the driver
(the process that calls :func:`run_tasks`) writes there, so ``OUT`` need not
be on a shared filesystem. Each result file is an envelope::

    {"id": "...", "status": "ok" | "error" | "lost" | "timeout",
     "result": <fn's dict, when ok>, "error": "<one line, otherwise>",
     "error_type": "EngineError", "attempt": 0, "pid": 1234, "host": "...",
     "elapsed_s": 1.2, "mode": "ray" | "inline" | "process"}

* **What is retried**: a task whose *worker died* (killed, out of memory,
  its node lost): Ray runs it again, up to ``retries`` more times (Ray's
  ``max_retries``, system failures only); past that its status is ``lost``.
  ``attempt`` is the attempt that produced the result (0: the first).
* **What is not retried**: a task that *raised* (any exception, a
  :class:`ground.errors.KvspecError` such as a harness ``EngineError``
  included) ends with status ``error`` and its message in one line: the
  same input would raise again, so retrying it would never end.
* **Every wait is bounded**: the whole call ends by ``timeout_s``; a task
  still running then is cancelled (its worker killed) and its status is
  ``timeout``. Connecting to a cluster is bounded too (a TCP probe of the
  address, ``fuzz.driving.ray_cluster.CONNECT_TIMEOUT_S``): an unreachable ``--ray`` address is one
  line (:class:`ground.errors.InvalidArgument`, exit 2 in the CLI).
* **Resume**: a task whose ``OUT/<id>.json`` already says ``ok`` is not run
  again (``resume=True``); its file is returned as it is.

Where it runs (``ray_address``)
-------------------------------
* ``None``: here, one task after another (``local="inline"``, in this
  process; a running task is not interrupted, so ``fn`` must honour its own
  budget), or each in a fresh child process (``local="process"``: killed at
  the deadline, retried when it dies like a Ray worker);
* ``"local"``: a Ray cluster of ``num_cpus`` CPUs started for this call on
  127.0.0.1 and shut down after;
* ``"auto"``: the cluster named by ``RAY_ADDRESS``, else the last one
  ``ray start`` started with kvspec's Ray folder (``RAY_TMPDIR`` =
  ``$KVSPEC_HOME``, so ``$KVSPEC_HOME/ray/ray_current_cluster``);
* ``"HOST:PORT"``: that cluster's GCS address.

If Ray is already initialised in this process (a test's cluster), it is
used as it is and left running. Each task takes ``task_cpus`` of the
cluster's CPUs. The workers import ``fn`` by module and name, so the module
must be importable on every node (kvspec installed there, or the repository
as the working directory). Where Ray keeps its files, its token and the
length its sockets allow are ``fuzz.driving.ray_cluster``'s (which also holds
:class:`~fuzz.driving.ray_cluster.RaySession` and ``python -m fuzz.driving.distribute head``).

The API for callers (``kvspec fuzz --ray``, ``kvspec mutate --ray``)::

    from fuzz.driving.distribute import run_tasks
    from mutate.kill import run_mutant       # run_mutant(mutant: dict, budget: float, options: dict) -> dict
    tasks = [{"id": m["id"], "kwargs": {"mutant": m, "budget": 60.0, "options": opts}} for m in mutants]
    results = run_tasks(run_mutant, tasks, ray_address=args.ray,   # None: here, one after another
                        out=out / "tasks", retries=2, timeout_s=len(tasks) * 120 + 60,
                        num_cpus=2, task_cpus=1, progress=lambda env: print(env["id"], env["status"]))
    for r in results:   # one envelope per task, in the tasks' order
        if r["status"] == "ok": use(r["result"])
        else: count_apart(r)   # "error" (raised, one line), "lost" (worker died > retries), "timeout"

A task is counted by its id: the result file ``OUT/<id>.json`` is written
once per call, by the driver, and a rerun with ``resume=True`` skips the
ids already ``ok`` (an interrupted ``kvspec mutate`` goes on where it
stopped).
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import re
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from fuzz.driving.ray_cluster import RaySession, main
from ground.errors import KvspecError, invalid
from ground.files import load_json, write_json_atomic

STATUSES = ("ok", "error", "lost", "timeout")
_ID = re.compile(r"^[A-Za-z0-9._-]{1,120}$")
_LOCAL_MODES = ("inline", "process")


# ------------------------------------------------------------------ the task


def _fn_ref(fn: Callable) -> tuple[str, str]:
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or not name or "." in name or "<" in name:
        raise invalid(
            "fn",
            getattr(fn, "__qualname__", fn),
            "must be a top-level function of an importable module (the workers import it by name)",
        )
    return module, name


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return (f"{type(e).__name__}: {text}" if not isinstance(e, KvspecError) else text)[:500]


def _attempt() -> int | None:
    try:
        import ray

        return int(ray._private.worker.global_worker.core_worker.get_current_task_attempt_number())
    except Exception:
        return None


def invoke(module: str, name: str, task: dict, mode: str = "inline") -> dict:
    """Run ``module.name(task)`` and wrap what it returns or raises in an
    envelope (an exception is a result, status ``error``: never retried)."""
    started = time.monotonic()
    envelope = {
        "id": task["id"],
        "status": "ok",
        "result": None,
        "error": None,
        "error_type": None,
        "attempt": _attempt() if mode == "ray" else None,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "elapsed_s": None,
        "mode": mode,
    }
    try:
        fn = getattr(importlib.import_module(module), name)
        result = fn(**task["kwargs"]) if "kwargs" in task else fn(task)
        json.dumps(result)  # JSON-able, or an error here rather than in the driver
        envelope["result"] = result
    except Exception as e:
        envelope.update(
            status="error", error=_one_line(e), error_type=type(e).__name__, traceback=traceback.format_exc()[-4000:]
        )
    envelope["elapsed_s"] = round(time.monotonic() - started, 3)
    return envelope


def _validate(tasks: list[dict], out: Path, retries: int, timeout_s: float, local: str) -> None:
    seen: set[str] = set()
    for i, task in enumerate(tasks):
        if not isinstance(task, dict):
            raise invalid(f"tasks[{i}]", task, "must be a dict")
        tid = task.get("id")
        if not isinstance(tid, str) or not _ID.match(tid):
            raise invalid(
                f"tasks[{i}].id", tid, "must be 1-120 letters, digits, '.', '_' or '-' (it names the result file)"
            )
        if tid in seen:
            raise invalid(f"tasks[{i}].id", tid, "must be unique (results are keyed by task id)")
        seen.add(tid)
        try:
            json.dumps(task)
        except (TypeError, ValueError):
            raise invalid(f"tasks[{i}]", tid, "must be JSON-able") from None
    if not isinstance(retries, int) or not 0 <= retries <= 100:
        raise invalid("retries", retries, "must be an integer from 0 to 100")
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise invalid("timeout_s", timeout_s, "must be a positive number of seconds")
    if local not in _LOCAL_MODES:
        raise invalid("local", local, f"must be one of {', '.join(_LOCAL_MODES)}")


def _read_done(path: Path) -> dict | None:
    try:
        data = load_json(path, "task result")
    except (KvspecError, OSError):
        return None
    return data if isinstance(data, dict) and data.get("status") == "ok" else None


def _missing(tid: str, status: str, error: str, mode: str) -> dict:
    return {
        "id": tid,
        "status": status,
        "result": None,
        "error": error,
        "error_type": None,
        "attempt": None,
        "pid": None,
        "host": None,
        "elapsed_s": None,
        "mode": mode,
    }


def run_tasks(
    fn: Callable[[dict], dict],
    tasks: list[dict],
    *,
    ray_address: str | None,
    out: Path,
    retries: int = 2,
    timeout_s: float,
    num_cpus: int | None = None,
    task_cpus: float = 1.0,
    local: str = "inline",
    resume: bool = True,
    progress: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Run ``fn(task)`` for every task and return one envelope per task, in
    the tasks' order, each also written atomically to ``out/<id>.json``.

    * ``fn``: a top-level function of an importable module, ``task -> dict``
      (JSON-able); ``tasks``: JSON-able dicts, each with a unique ``"id"``;
    * ``ray_address``: ``None`` (here, see ``local``), ``"local"`` (a Ray
      cluster of ``num_cpus`` started for this call), ``"auto"`` or
      ``"HOST:PORT"`` (a running cluster); an already initialised Ray is used;
    * ``retries``: how many more times a task whose worker died is run
      (exceptions are never retried);
    * ``timeout_s``: the whole call's wall limit; tasks unfinished then are
      cancelled, status ``timeout``;
    * ``task_cpus``: the cluster CPUs one task takes;
    * ``resume``: a task whose result file says ``ok`` is not run again;
    * ``progress``: called with each envelope as it is written.

    Raises :class:`ground.errors.InvalidArgument` (one line) for a bad
    argument or an unreachable or unusable cluster."""
    out = Path(out)
    _validate(tasks, out, retries, timeout_s, local)
    module, name = _fn_ref(fn)
    deadline = time.monotonic() + timeout_s
    results: dict[str, dict] = {}
    todo = []
    for task in tasks:
        done = _read_done(out / f"{task['id']}.json") if resume else None
        if done is not None:
            results[task["id"]] = {**done, "resumed": True}
        else:
            todo.append(task)

    def record(envelope: dict) -> None:
        write_json_atomic(out / f"{envelope['id']}.json", envelope)
        results[envelope["id"]] = envelope
        if progress is not None:
            progress(envelope)

    out.mkdir(parents=True, exist_ok=True)
    if todo:
        if ray_address is None:
            _run_here(module, name, todo, record, deadline, retries, local)
        else:
            with RaySession(ray_address, num_cpus=num_cpus):
                _run_on_ray(module, name, todo, record, deadline, retries, task_cpus)
    return [results[t["id"]] for t in tasks]


# ------------------------------------------------------------------- runners


def _run_here(module: str, name: str, todo: list[dict], record, deadline: float, retries: int, local: str) -> None:
    for task in todo:
        if time.monotonic() >= deadline:
            record(_missing(task["id"], "timeout", "not started before the deadline", local))
            continue
        if local == "inline":
            record(invoke(module, name, task, "inline"))
        else:
            record(_in_child(module, name, task, deadline, retries))


def _child(module: str, name: str, task: dict, conn) -> None:
    conn.send(invoke(module, name, task, "process"))
    conn.close()


def _in_child(module: str, name: str, task: dict, deadline: float, retries: int) -> dict:
    """One task in a fresh (spawned) child; a child that dies is run again
    up to ``retries`` times, one still running at the deadline is killed."""
    ctx = multiprocessing.get_context("spawn")
    for attempt in range(retries + 1):
        left = deadline - time.monotonic()
        if left <= 0:
            return _missing(task["id"], "timeout", "not finished before the deadline", "process")
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(module, name, task, child), daemon=True)
        proc.start()
        child.close()
        envelope = None
        try:
            if parent.poll(max(0.0, deadline - time.monotonic())):
                envelope = parent.recv()
        except (EOFError, OSError):
            envelope = None  # the child died before sending
        if envelope is None and proc.is_alive() and time.monotonic() >= deadline:
            proc.kill()
            proc.join(5)
            return _missing(task["id"], "timeout", "killed at the deadline", "process")
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        parent.close()
        if envelope is not None:
            envelope["attempt"] = attempt
            return envelope
    return _missing(task["id"], "lost", f"its worker process died {retries + 1} time(s)", "process")


def _run_on_ray(
    module: str, name: str, todo: list[dict], record, deadline: float, retries: int, task_cpus: float
) -> None:
    import ray
    from ray.exceptions import GetTimeoutError, RayError, RayTaskError, TaskCancelledError

    remote = ray.remote(invoke).options(
        max_retries=retries, retry_exceptions=False, num_cpus=task_cpus, name=f"kvspec:{module}.{name}"
    )
    pending = {remote.remote(module, name, task, "ray"): task for task in todo}
    while pending and time.monotonic() < deadline:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.05, min(2.0, deadline - time.monotonic())))
        for ref in ready:
            task = pending.pop(ref)
            try:
                envelope = ray.get(ref, timeout=max(1.0, deadline - time.monotonic()))
            except GetTimeoutError:
                pending[ref] = task
                continue
            except RayTaskError as e:  # invoke() catches the task's exceptions: this is Ray's own
                envelope = _missing(task["id"], "error", _one_line(e.cause if getattr(e, "cause", None) else e), "ray")
            except TaskCancelledError:
                envelope = _missing(task["id"], "timeout", "cancelled", "ray")
            except RayError as e:  # the worker died more than `retries` times, its node is gone, ...
                envelope = _missing(
                    task["id"],
                    "lost",
                    f"{type(e).__name__} after {retries} retr{'y' if retries == 1 else 'ies'}: {' '.join(str(e).split())[:300]}",
                    "ray",
                )
                envelope["error_type"] = type(e).__name__
            record(envelope)
    for ref, task in pending.items():  # past the deadline: kill what still runs
        try:
            ray.cancel(ref, force=True)
        except Exception:
            pass
        record(_missing(task["id"], "timeout", "still running at the deadline; cancelled", "ray"))


if __name__ == "__main__":  # python -m fuzz.driving.distribute env|head: the Ray environment's commands
    sys.exit(main(sys.argv[1:]))
