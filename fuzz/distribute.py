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
  address, ``CONNECT_TIMEOUT_S``): an unreachable ``--ray`` address is one
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
as the working directory).

Ray keeps its sessions, logs and sockets under ``$KVSPEC_HOME/ray``
(``RAY_TMPDIR``), never in ``/tmp/ray`` or ``~``; a cluster kvspec starts
uses Ray's token authentication with the token in
``$KVSPEC_HOME/ray/auth_token`` (0600; never printed), not ``~/.ray``. Ray's
Unix sockets (``<tmp>/session_<date>_<pid>/sockets/plasma_store``) must fit
in 107 bytes, which bounds the folder to :data:`MAX_TEMP_DIR` characters: a
longer ``$KVSPEC_HOME`` is refused in one line (workaround: a shorter
``KVSPEC_HOME``; kvspec never falls back to ``/tmp``).

The API for callers (``kvspec fuzz --ray``, ``kvspec mutate --ray``)::

    from fuzz.distribute import run_tasks
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
import os
import re
import secrets
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

from ground.files import load_json, write_json_atomic, write_text_atomic
from ground.errors import KvspecError, invalid

#: Bound on reaching a cluster's address before ``ray.init``.
CONNECT_TIMEOUT_S = 5.0
#: Bound on ``ray.init`` connecting or starting a local cluster.
INIT_TIMEOUT_S = 60.0
#: Linux's limit on a Unix socket path (``sun_path``, 108 bytes with the NUL).
SOCKET_PATH_LIMIT = 107
#: What Ray appends to its temp folder for its longest socket (a session
#: name with a 7-digit pid).
_SOCKET_TAIL = "/session_2026-11-30_16-02-59_774033_4194304/sockets/plasma_store"
#: The longest Ray temp folder whose sockets fit.
MAX_TEMP_DIR = SOCKET_PATH_LIMIT - len(_SOCKET_TAIL)
STATUSES = ("ok", "error", "lost", "timeout")
_ID = re.compile(r"^[A-Za-z0-9._-]{1,120}$")
_LOCAL_MODES = ("inline", "process")


# --------------------------------------------------------------- Ray's home


def ray_temp_dir() -> Path:
    """Ray's folder: ``$KVSPEC_HOME/ray`` (what ``RAY_TMPDIR=$KVSPEC_HOME`` gives)."""
    from ground.home import kvspec_home

    return kvspec_home() / "ray"


def token_path() -> Path:
    return ray_temp_dir() / "auth_token"


def check_temp_dir(path: Path | None = None) -> Path:
    """The Ray folder, refused in one line when Ray's sockets under it would
    pass the 107-byte Unix socket limit."""
    path = Path(path or ray_temp_dir()).resolve()
    if len(str(path).encode()) > MAX_TEMP_DIR:
        raise invalid("ray temp dir", str(path), f"Ray's Unix sockets under it must fit in {SOCKET_PATH_LIMIT} bytes: at most {MAX_TEMP_DIR} bytes; set KVSPEC_HOME to a shorter folder")
    return path


def cluster_env(base: dict[str, str] | None = None, *, start: bool = False, loopback: bool = False) -> dict[str, str]:
    """The environment for Ray (a copy of ``base``, default ``os.environ``):
    ``RAY_TMPDIR`` = kvspec's home (Ray's folder is its ``ray/``), usage
    stats off, and the token file in kvspec's Ray folder unless the caller
    set ``RAY_AUTH_TOKEN``/``RAY_AUTH_TOKEN_PATH``. ``start``: for a
    cluster about to be started (``ray start --head``, ``"local"``): token
    authentication on (unless ``RAY_AUTH_MODE`` is set) and the token made
    when missing. Run ``ray start --head`` with this environment, and
    ``kvspec ... --ray auto`` finds it. ``loopback``: a one-node cluster
    on 127.0.0.1 (``"local"``, or an address on 127.0.0.1): Ray's servers
    listen on 127.0.0.1 only (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, Ray's
    switch for single-machine clusters; without it Ray replaces 127.0.0.1 by
    the machine's address and listens on every interface)."""
    from ground.home import kvspec_home

    env = dict(os.environ if base is None else base)
    env.setdefault("RAY_TMPDIR", str(kvspec_home()))
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.setdefault("RAY_DISABLE_DOCKER_CPU_WARNING", "1")
    if "RAY_AUTH_TOKEN" not in env and "RAY_AUTH_TOKEN_PATH" not in env:
        env["RAY_AUTH_TOKEN_PATH"] = str(token_path())
    if loopback:
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if env.get("RAY_AUTH_MODE") is None and (start or "RAY_AUTH_TOKEN" in env or Path(env.get("RAY_AUTH_TOKEN_PATH", "")).is_file()):
        env["RAY_AUTH_MODE"] = "token"  # a token at hand: use it (Ray's connecting driver does not by itself)
    if env.get("RAY_AUTH_MODE") == "token" and "RAY_AUTH_TOKEN" not in env:
        path = Path(env["RAY_AUTH_TOKEN_PATH"])
        if start and not path.exists():
            write_text_atomic(path, secrets.token_hex(32))  # mkstemp: 0600
    return env


def _apply_env(env: dict[str, str]) -> dict[str, str | None]:
    before = {k: os.environ.get(k) for k in env if os.environ.get(k) != env[k]}
    os.environ.update(env)
    return before


def _restore_env(before: dict[str, str | None]) -> None:
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def resolve_address(address: str) -> str:
    """``"auto"`` or ``HOST:PORT`` -> ``HOST:PORT``, probed within
    ``CONNECT_TIMEOUT_S``; one line when there is none or it is unreachable."""
    given = address
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS") or ""
        if not address:
            file = ray_temp_dir() / "ray_current_cluster"
            address = file.read_text().strip() if file.is_file() else ""
        if not address:
            raise invalid("--ray", given, f"no running cluster found (RAY_ADDRESS unset, no {ray_temp_dir() / 'ray_current_cluster'}); start one with `ray start --head` in kvspec's Ray environment (docs/distribute.md), or give HOST:PORT or 'local'")
    if address.startswith("ray://"):
        raise invalid("--ray", given, "Ray Client addresses (ray://) are not supported; give the cluster's GCS address HOST:PORT, 'auto' or 'local'")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise invalid("--ray", given, "must be 'local', 'auto' or a Ray cluster's GCS address HOST:PORT")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        raise invalid("--ray", given, f"must be a reachable Ray cluster: {host}:{port} did not answer within {CONNECT_TIMEOUT_S:g} s ({type(e).__name__})")
    return f"{host}:{port}"


def _reload_ray_config() -> None:
    """Ray reads ``RAY_AUTH_MODE`` and the token when it is imported: after
    the variables change, make this process's Ray read them again (what
    Ray's own ``ray.init`` does when it makes a token)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except Exception:  # an older Ray without token authentication
        pass


def _enable_cluster(value: bool | None) -> bool | None:
    """Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, at import, into
    ``ray_constants.ENABLE_RAY_CLUSTER``: set that constant in this process
    (``None``: leave it); return the value it had (to restore)."""
    if value is None:
        return None
    try:
        from ray._private import ray_constants
    except ImportError:
        return None
    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = value
    return before


def _ray_messages_to_stderr(restore=None):
    """Ray's driver prints the raylet's messages (a worker died, a task is
    retried) to stdout, where kvspec prints its JSON: send them to stderr
    (``restore``: put Ray's printer back). Returns Ray's printer."""
    try:
        from ray._private import worker
    except ImportError:
        return None
    if restore is not None:
        worker.print_to_stdstream = restore
        return None
    original = worker.print_to_stdstream

    def to_stderr(data, ignore_prefix):
        original({**data, "is_err": True}, ignore_prefix)

    worker.print_to_stdstream = to_stderr
    return original


class RaySession:
    """``with RaySession(address, num_cpus=N):`` Ray initialised in this
    process (started for ``"local"``, connected otherwise), shut down after
    unless it was already initialised. The Ray variables are set for the
    session and restored after."""

    def __init__(self, address: str, *, num_cpus: int | None = None):
        if address not in ("local", "auto") and ":" not in address:
            raise invalid("--ray", address, "must be 'local', 'auto' or a Ray cluster's GCS address HOST:PORT")
        if address == "local" and num_cpus is not None and num_cpus < 1:
            raise invalid("num_cpus", num_cpus, "must be at least 1")
        self.address, self.num_cpus = address, num_cpus
        self.owned = False
        self._env: dict[str, str | None] = {}
        self._cluster_flag: bool | None = None
        self._printer = None

    def __enter__(self):
        try:
            import ray
        except ImportError:
            raise invalid("--ray", self.address, "needs Ray: pip install 'kvspec[dist]' (make venv installs it)") from None
        if ray.is_initialized():
            return self
        local = self.address == "local"
        target = None if local else resolve_address(self.address)
        temp = check_temp_dir()
        loopback = local or target.rpartition(":")[0] in ("127.0.0.1", "localhost", "::1", "[::1]")
        self._env = _apply_env(cluster_env(start=local, loopback=loopback))
        _reload_ray_config()
        self._cluster_flag = _enable_cluster(False if loopback else None)
        try:
            kwargs = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR", configure_logging=True)
            if local:
                temp.mkdir(parents=True, exist_ok=True)
                # address="local": a new cluster, never the one `ray start` left in ray_current_cluster
                ray.init(address="local", num_cpus=self.num_cpus or os.cpu_count() or 1, _temp_dir=str(temp), _node_ip_address="127.0.0.1", **kwargs)
            else:
                kwargs.pop("include_dashboard")
                ray.init(address=target, **kwargs)
        except Exception as e:  # Ray's own refusal (auth, version skew), as one line
            _restore_env(self._env)
            _enable_cluster(self._cluster_flag)
            if isinstance(e, KvspecError):
                raise
            raise invalid("--ray", self.address, f"Ray could not {'start a local cluster' if local else 'connect'}: {type(e).__name__}: {' '.join(str(e).split())[:200]}") from None
        self.owned = True
        self._printer = _ray_messages_to_stderr()
        return self

    def __exit__(self, *exc):
        if self.owned:
            import ray

            ray.shutdown()
            self.owned = False
            if self._printer is not None:
                _ray_messages_to_stderr(restore=self._printer)
                self._printer = None
        _restore_env(self._env)
        self._env = {}
        _reload_ray_config()
        _enable_cluster(self._cluster_flag)
        self._cluster_flag = None


# ------------------------------------------------------------------ the task


def _fn_ref(fn: Callable) -> tuple[str, str]:
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or not name or "." in name or "<" in name:
        raise invalid("fn", getattr(fn, "__qualname__", fn), "must be a top-level function of an importable module (the workers import it by name)")
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
    envelope = {"id": task["id"], "status": "ok", "result": None, "error": None, "error_type": None, "attempt": _attempt() if mode == "ray" else None, "pid": os.getpid(), "host": socket.gethostname(), "elapsed_s": None, "mode": mode}
    try:
        fn = getattr(importlib.import_module(module), name)
        result = fn(**task["kwargs"]) if "kwargs" in task else fn(task)
        json.dumps(result)  # JSON-able, or an error here rather than in the driver
        envelope["result"] = result
    except Exception as e:
        envelope.update(status="error", error=_one_line(e), error_type=type(e).__name__, traceback=traceback.format_exc()[-4000:])
    envelope["elapsed_s"] = round(time.monotonic() - started, 3)
    return envelope


def _validate(tasks: list[dict], out: Path, retries: int, timeout_s: float, local: str) -> None:
    seen: set[str] = set()
    for i, task in enumerate(tasks):
        if not isinstance(task, dict):
            raise invalid(f"tasks[{i}]", task, "must be a dict")
        tid = task.get("id")
        if not isinstance(tid, str) or not _ID.match(tid):
            raise invalid(f"tasks[{i}].id", tid, "must be 1-120 letters, digits, '.', '_' or '-' (it names the result file)")
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
    return {"id": tid, "status": status, "result": None, "error": error, "error_type": None, "attempt": None, "pid": None, "host": None, "elapsed_s": None, "mode": mode}


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
    import multiprocessing

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


def _run_on_ray(module: str, name: str, todo: list[dict], record, deadline: float, retries: int, task_cpus: float) -> None:
    import ray
    from ray.exceptions import GetTimeoutError, RayError, RayTaskError, TaskCancelledError

    remote = ray.remote(invoke).options(max_retries=retries, retry_exceptions=False, num_cpus=task_cpus, name=f"kvspec:{module}.{name}")
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
                envelope = _missing(task["id"], "lost", f"{type(e).__name__} after {retries} retr{'y' if retries == 1 else 'ies'}: {' '.join(str(e).split())[:300]}", "ray")
                envelope["error_type"] = type(e).__name__
            record(envelope)
    for ref, task in pending.items():  # past the deadline: kill what still runs
        try:
            ray.cancel(ref, force=True)
        except Exception:
            pass
        record(_missing(task["id"], "timeout", "still running at the deadline; cancelled", "ray"))


def start_head(*, port: int = 6379, num_cpus: int | None = None, loopback: bool = True, say=print) -> int:
    """``ray start --head --block`` in kvspec's Ray environment (its folder
    and token under ``$KVSPEC_HOME/ray``; ``loopback``: on 127.0.0.1 only),
    in a process group of its own; SIGINT/SIGTERM stop that group (SIGKILL)
    and nothing else (``ray stop`` would stop every Ray of this user on the
    machine). Returns ray's exit status."""
    import signal
    import subprocess

    check_temp_dir()
    env = cluster_env(start=True, loopback=loopback)
    ray_bin = Path(sys.executable).with_name("ray")
    cmd = [str(ray_bin), "start", "--head", "--port", str(port), "--num-cpus", str(num_cpus or os.cpu_count() or 1), "--include-dashboard=false", "--disable-usage-stats", "--block"]
    if loopback:
        cmd += ["--node-ip-address", "127.0.0.1"]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)

    address_file = ray_temp_dir() / "ray_current_cluster"

    def stop(*_):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:  # what `ray stop` does: --ray auto no longer names this head
            if address_file.read_text().strip().endswith(f":{port}"):
                address_file.unlink()
        except OSError:
            pass

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    say(f"kvspec: Ray head {'127.0.0.1' if loopback else 'on this node'}:{port} (folder {ray_temp_dir()}, token {env.get('RAY_AUTH_TOKEN_PATH', 'RAY_AUTH_TOKEN')}); join with --ray auto; Ctrl-C stops it")
    try:
        return proc.wait()
    finally:
        stop()


def _main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m fuzz.distribute", description="kvspec's Ray environment")
    sub = parser.add_subparsers(dest="what", required=True)
    env = sub.add_parser("env", help="print the Ray variables as shell exports (no secret: the token's path)")
    env.add_argument("--loopback", action="store_true", help="a one-node cluster on 127.0.0.1")
    head = sub.add_parser("head", help="start a Ray head in kvspec's environment until Ctrl-C")
    head.add_argument("--port", type=int, default=6379)
    head.add_argument("--num-cpus", type=int, default=None)
    head.add_argument("--all-interfaces", action="store_true", help="reachable from other nodes (default: 127.0.0.1 only)")
    args = parser.parse_args(argv)
    if args.what == "env":
        values = cluster_env({}, start=True, loopback=args.loopback)
        for key in sorted(values):
            print(f"export {key}={values[key]}")
        return 0
    try:
        return start_head(port=args.port, num_cpus=args.num_cpus, loopback=not args.all_interfaces)
    except KvspecError as e:
        print(f"kvspec: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
