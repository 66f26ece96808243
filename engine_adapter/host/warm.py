"""Warm engines: one long-lived worker per engine environment and platform,
started on first use and reused by later commands.

Importing vLLM takes ~25 s in every process; a warm engine pays it once.
It is ``python -m engine_adapter.inside.worker --socket ...`` (its loop is
:func:`engine_adapter.inside.warm_server.serve_socket`) in the version's environment, listening on a Unix
socket under kvspec's home::

    $KVSPEC_HOME/warm/vllm-0.33.0-cuda-ENVID.sock    mode 0600
    $KVSPEC_HOME/warm/vllm-0.33.0-cuda-ENVID.json    its state: pid, fingerprint, idle timeout, ...
    $KVSPEC_HOME/warm/vllm-0.33.0-cuda-ENVID.log     its stderr
    $KVSPEC_HOME/warm/vllm-0.33.0-cuda-ENVID.lock    held while a client starts one

``ENVID`` (:func:`env_id`) hashes the environment the engine runs with: the
variables that change its behaviour (:func:`identity_env`: every
``VLLM_*``, ``KVSPEC_*`` but the warm engines' own settings, the Hugging
Face, torch, thread and Python ones, and what ``environments.worker_env``
sets), so a command with another environment starts and uses an engine of
its own. Only the hash is written anywhere, never a value.

The folder (:func:`warm_dir`; ``KVSPEC_WARM_DIR`` moves it): kvspec never
chmods a folder it did not create. A missing one is created 0700; an
existing one is used as it is if this user owns it and neither group nor
others can write it; otherwise (a shared ``/tmp``, someone else's folder)
kvspec uses the subfolder ``kvspec-warm-<uid>`` inside, created 0700 and
checked (a real folder, not a link, owned by this user, no group or other
access), and refuses in one line when that check fails
(:func:`private_dir`).

The wire format is :mod:`engine_adapter.protocol`'s, one request per
connection; the server carries out requests one at a time, and every
``run`` builds a fresh ``Scheduler`` as the pipe worker does.

One command's request at a time, with that command's own bound:

* a request carries its client's time left (``timeout_s``); the server
  answers ``{"event": "started"}`` when it begins it, and ends itself
  (removing its socket, then exiting) if the request runs
  :data:`OVERRUN_GRACE_S` past that bound (a request that holds the GIL:
  SIGALRM ends it :data:`HARD_GRACE_S` later, its files left for the next
  client to clean); the client whose own request
  ran past its bound kills that engine (by the pid that started it), and
  no one else ever does;
* a client queued behind another command's request (no ``started`` within
  :data:`QUEUE_WAIT_S`, or within its own time) never kills the engine: it
  closes its connection (the server skips a request whose client hung up)
  and, with time left, starts a fresh engine that takes over the socket
  path, saying so in one line on stderr; the busy one finishes its request
  and leaves; without time left it gives up its own wait;
* the next command after an engine killed for a request past its bound
  starts a fresh one within its own time and says so (the killed engine's
  log ends with :data:`KILLED_MARK`).

Lifetime:

* it exits by itself after ``idle_timeout`` seconds without a request
  (default :data:`IDLE_TIMEOUT_S`, ``KVSPEC_WARM_IDLE_S``), when its socket
  file is removed or replaced, when its environment's ready marker changes
  (a reinstall, ``kvspec engines remove``), on ``shutdown`` and on SIGTERM;
* at most :func:`max_warm` run at once (``KVSPEC_WARM_MAX``, default
  :data:`MAX_WARM`): starting one more stops the least recently used
  (:func:`make_room`), saying so in one line;
* ``kvspec engines list`` shows the warm ones (pid, idle seconds left),
  ``kvspec engines stop [vllm==X]`` stops them (by pid);
* a client that finds a socket nobody answers on, or a state file whose pid
  is gone, removes them and starts a fresh server;
* a client sends its :func:`fingerprint` (kvspec's engine-side sources, the
  environment's ready marker, the interpreter, the platform) with every
  request; a server started from other sources refuses (``stale``) and the
  client starts a fresh one, which takes over the socket path (the old one
  exits once it sees its socket file gone or replaced);
* a server that dies mid-request gives that request a ``worker`` error:
  kvspec's failure, never vLLM's.

``KVSPEC_WARM=0`` turns warm engines off for the commands that use them
(``run``, ``replay --engine``, ``resolve``, ``matrix``): each then starts
its own worker, as fuzz campaigns always do.

The client side never imports vLLM.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from engine_adapter.host import environments
from engine_adapter.host.versions import EngineSpec, engine_name, spec_of
from engine_adapter.host.warm_state import (
    IDLE_TIMEOUT_S,
    STOP_WAIT_S,
    Paths,
    _clean,
    _is_server,
    _kill,
    _locked,
    _log_tail,
    _wait_gone,
    enabled,  # noqa: F401 - part of the warm-engine API (kvspec's commands read it here)
    env_id,
    fingerprint,
    idle_timeout_default,
    private_dir,
    read_state,
    warm_dir,
)
from engine_adapter.protocol import KILLED_MARK, encode
from engine_adapter.sockets import Lines, connect, event_of, read_line, remove_if, send_line
from ground.console import say as console_say
from ground.errors import EngineError, invalid
from ground.home import REPO_ROOT
from ground.processes import start_detached

#: Seconds a client waits for the warm engine to begin its request (busy
#: with another command's) before it starts a fresh engine of its own.
QUEUE_WAIT_S = 30.0


# ------------------------------------------------------------------ the client


def _worker_error(rid: int, message: str) -> dict:
    """The protocol's answer for a request the warm engine did not serve:
    ``ok`` false with a ``worker`` error saying why."""
    return {"id": rid, "ok": False, "error": {"kind": "worker", "message": message}}


class WarmClient:
    """Requests to the warm engine of one version and platform, starting
    (or replacing) it when needed."""

    def __init__(
        self,
        version: str | EngineSpec,
        platform: str = "cuda",
        *,
        idle_timeout: float | None = None,
        start_timeout: float = 180.0,
        directory: Path | None = None,
        python: str | None = None,
        queue_wait: float = QUEUE_WAIT_S,
        say=None,
    ) -> None:
        self.spec = spec_of(version)  # the server it starts receives it serialized (--engine JSON)
        version = self.version = self.spec.version
        self.platform = platform
        self.engine = self.spec.name
        self.python = python or str(environments.env_python(version))
        self.env = environments.worker_env(version, platform)  # what a server it starts runs with
        self.env_id = env_id(self.env)
        self.folder = directory or warm_dir()
        self.paths = Paths.of(version, platform, self.folder, self.env_id)
        self.idle_timeout = idle_timeout if idle_timeout is not None else idle_timeout_default()
        self.start_timeout = start_timeout
        self.queue_wait = queue_wait
        self.say = (
            say if say is not None else console_say
        )  # one line on stderr (ground.console.say) when this client starts a fresh engine for a reason
        self.fingerprint = fingerprint(version, platform, self.python)
        self.started: int | None = None  # pid of a server this client started
        self.restarts = 0
        self._next_id = 0

    def folder_ready(self) -> None:
        """Create (0700) or check the warm engines' folder (:func:`private_dir`)."""
        if private_dir(self.folder, create=True) != self.paths.sock.parent:  # created or changed since
            self.paths = Paths.of(self.version, self.platform, self.folder, self.env_id)

    # ----------------------------------------------------------- requests

    def request(self, op: str, timeout: float, **fields) -> dict:
        """One request within ``timeout`` seconds; the server's response, or
        ``ok: false`` of kind ``worker`` when the server died, when this
        request ran past ``timeout`` (the engine serving it is killed: the
        next request starts a fresh one), or when the engine stayed busy
        with another command's request and no fresh one could be started in
        time (nothing is killed then)."""
        deadline = time.monotonic() + timeout
        self._next_id += 1
        rid = self._next_id
        for _attempt in range(4):
            sock = self.connect(deadline)
            state = read_state(self.paths)
            behind = state.get("pid") if state is not None else None
            line = encode(
                {
                    "id": rid,
                    "op": op,
                    "fingerprint": self.fingerprint,
                    "timeout_s": round(max(0.05, deadline - time.monotonic()), 3),
                    **fields,
                }
            ).encode()
            lines = Lines(sock)
            serving: int | None = None
            try:
                try:
                    send_line(sock, line, deadline)
                    raw = lines.next(min(deadline, time.monotonic() + self.queue_wait))
                    event = event_of(raw)
                    if event is not None and event.get("event") == "started":
                        serving = event.get("pid") if isinstance(event.get("pid"), int) else behind
                        raw = lines.next(deadline)
                except TimeoutError:
                    if serving is not None:
                        return self._timed_out(rid, timeout, serving)
                    raw, why = b"", "queued"
                except (OSError, ValueError) as e:
                    raw, why = None, f"{type(e).__name__}: {e}"
                else:
                    why = "closed the connection without an answer"
            finally:
                sock.close()  # a queued request whose client hung up is skipped
            if why == "queued":
                if deadline - time.monotonic() < 1.0:
                    return _worker_error(
                        rid,
                        f"timed out after {timeout:.0f}s waiting for the warm engine {self.engine}, busy with another command's request (left running)",
                    )
                self.take_over(deadline, behind)
                continue
            if raw is None and serving is None and _attempt < 3:
                continue  # the engine left (or was killed) before it began this request: a fresh one will
            if raw is None:
                self.restarts += 1
                return _worker_error(rid, f"warm engine {self.engine} ({self.platform}) {why}: {_log_tail(self.paths)}")
            try:
                resp = json.loads(raw)
            except ValueError:
                return _worker_error(rid, f"warm engine {self.engine} answered a non-protocol line: {raw[:200]!r}")
            err = resp.get("error") if isinstance(resp, dict) else None
            if isinstance(err, dict) and err.get("kind") == "stale":
                self.replace(deadline)
                continue
            return resp
        return _worker_error(rid, f"warm engine {self.engine}: no server of this kvspec's sources answered")

    def _timed_out(self, rid: int, timeout: float, pid: int) -> dict:
        """This client's own request ran past its bound on the engine
        ``pid``: kill that engine (only it), mark its log so that the next
        command says why it starts a fresh one."""
        tail = _log_tail(self.paths)
        state = read_state(self.paths)
        if state is not None and state.get("pid") == pid:
            with contextlib.suppress(OSError), open(self.paths.log, "a") as log:
                log.write(
                    f"\n{KILLED_MARK} a request ran past its time limit of {timeout:.0f}s (killed by its client)\n"
                )
        _kill(self.paths, pid)
        self.restarts += 1
        return _worker_error(rid, f"timed out after {timeout:.0f}s (warm engine {self.engine} killed): {tail}")

    def take_over(self, deadline: float, behind: object) -> None:
        """The warm engine ``behind`` stayed busy with another command's
        request: start a fresh one that takes over the socket path (the busy
        one finishes its request, then leaves), unless another client
        already did; say so in one line."""
        self.folder_ready()
        with _locked(self.paths.lock, min(deadline, time.monotonic() + self.start_timeout), self.engine):
            state = read_state(self.paths)
            pid = state.get("pid") if state is not None else None
            if (
                state is not None
                and pid != behind
                and state.get("fingerprint") == self.fingerprint
                and _is_server(pid, self.paths.sock)
            ):
                return
            self._start(deadline, announce=False)
        self.say(f"kvspec: the warm engine {self.engine} is busy with another command; started a fresh one")

    # ----------------------------------------------------------- the server

    def connect(self, deadline: float) -> socket.socket:
        """A connection to a live server (maybe of other sources: the
        request's fingerprint tells); starts one when none answers."""
        try:
            return connect(self.paths.sock, deadline - time.monotonic())
        except OSError:
            pass
        self.folder_ready()
        with _locked(self.paths.lock, min(deadline, time.monotonic() + self.start_timeout), self.engine):
            with contextlib.suppress(OSError):
                return connect(self.paths.sock, deadline - time.monotonic())
            self._start(deadline)
            return connect(self.paths.sock, deadline - time.monotonic())

    def replace(self, deadline: float) -> None:
        """Start a server of this client's sources unless one already took
        over the socket (under the start lock)."""
        self.folder_ready()
        with _locked(self.paths.lock, min(deadline, time.monotonic() + self.start_timeout), self.engine):
            state = read_state(self.paths)
            if (
                state is not None
                and state.get("fingerprint") == self.fingerprint
                and _is_server(state.get("pid"), self.paths.sock)
            ):
                return
            self._start(deadline)

    def _start(self, deadline: float, announce: bool = True) -> None:
        """Start a server (the caller holds the start lock) and wait until
        it answers on the socket. When the previous one was killed for a
        request past its bound (its log ends with :data:`KILLED_MARK`), say
        so in one line (``announce``)."""
        if not os.path.exists(self.python):
            raise EngineError(
                f"engine={self.engine!r}: not installed (no {self.python}); run: kvspec engines install {self.engine}"
            )
        paths = self.paths
        killed = _log_tail(paths).startswith(KILLED_MARK)
        state = read_state(paths)
        if state is not None and not _is_server(state.get("pid"), paths.sock):
            _clean(paths, state.get("pid"))  # a dead server's files
        if paths.sock.exists():
            # A live server of other sources keeps its socket until the new
            # one takes its path over; one nobody listens on is stale.
            try:
                connect(paths.sock, 1.0).close()
            except OSError:
                remove_if(paths.sock)
        make_room(
            paths, max_warm(), self.folder, self.say
        )  # at most KVSPEC_WARM_MAX resident, least recently used goes
        cmd = [
            self.python,
            "-m",
            "engine_adapter.inside.worker",
            "--engine",
            self.spec.to_json(),
            "--socket",
            str(paths.sock),
            "--state",
            str(paths.state),
            "--fingerprint",
            self.fingerprint,
            "--idle-timeout",
            repr(float(self.idle_timeout)),
        ]
        with open(paths.log, "wb") as log:
            proc = start_detached(cmd, log, env=self.env, cwd=str(REPO_ROOT))
        end = min(deadline, time.monotonic() + self.start_timeout)
        while True:
            rc = proc.poll()
            if rc is not None:
                raise EngineError(
                    f"engine={self.engine!r}: warm engine exited (status {rc}) before it answered: {_log_tail(paths)}"
                )
            state = read_state(paths)
            if state is not None and state.get("pid") == proc.pid:
                with contextlib.suppress(OSError):
                    connect(paths.sock, 1.0).close()
                    self.started = proc.pid
                    if killed and announce:
                        self.say(
                            f"kvspec: the warm engine {self.engine} was killed (a request ran past its time limit); started a fresh one"
                        )
                    return
            if time.monotonic() > end:
                _kill(paths, proc.pid)
                with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                    proc.kill()
                    proc.wait(timeout=5)
                raise EngineError(
                    f"engine={self.engine!r}: warm engine did not answer within {self.start_timeout:.0f}s: {_log_tail(paths)}"
                )
            time.sleep(0.1)


# ------------------------------------------------------------------ list / stop / start


def _state_files(directory: Path | None = None) -> list[Path]:
    folder = private_dir(directory or warm_dir())
    try:
        return sorted(p for p in folder.glob("vllm-*.json") if p.is_file())
    except OSError:
        return []


def _paths_of_state(path: Path) -> Paths:
    return Paths.named(path.with_name(path.name.removesuffix(".json")))


def _version_of(path: Path, state: dict) -> str:
    """The engine version a state file is named after (``vllm-X-PLATFORM-ENVID.json``;
    a build's ``X+LABEL.HASH`` as the client named it), else the server's vLLM."""
    stem, platform = path.name.removesuffix(".json"), str(state.get("platform"))
    if _env_of(path) is not None:
        stem = stem.rpartition("-")[0]
    if stem.startswith("vllm-") and stem.endswith("-" + platform):
        return stem[len("vllm-") : -len(platform) - 1]
    return str(state.get("version"))


def _env_of(path: Path) -> str | None:
    """The environment id (:func:`env_id`) a state file is named after."""
    env = path.name.removesuffix(".json").rpartition("-")[2]
    return env if len(env) == 12 and all(c in "0123456789abcdef" for c in env) else None


def list_warm(directory: Path | None = None) -> list[dict]:
    """The warm engines now running (a dead one's files are removed):
    engine, platform, environment id, pid, idle seconds left, whether it
    runs this checkout's sources."""
    rows = []
    now = time.time()
    for path in _state_files(directory):
        paths = _paths_of_state(path)
        state = read_state(paths)
        if state is None:
            continue
        pid = state.get("pid")
        if not _is_server(pid, paths.sock):
            _clean(paths, pid)
            continue
        try:
            last_used = os.stat(paths.sock).st_mtime
        except OSError:
            last_used = state.get("started", now)
        idle = float(state.get("idle_timeout_s") or IDLE_TIMEOUT_S)
        version, platform = _version_of(path, state), str(state.get("platform"))
        try:
            current = state.get("fingerprint") == fingerprint(version, platform, state.get("python"))
        except Exception:  # noqa: BLE001 - an unknown version's files
            current = False
        rows.append(
            {
                "engine": engine_name(version),
                "version": version,
                "platform": platform,
                "env": _env_of(path),
                "pid": pid,
                "socket": str(paths.sock),
                "idle_timeout_s": idle,
                "idle_left_s": round(max(0.0, idle - (now - last_used)), 1),
                "started": state.get("started"),
                "current": current,
            }
        )
    return rows


def _stop_one(paths: Paths, state: dict) -> str:
    """Stop one warm engine: ``shutdown`` over its socket (after the request
    in progress), then SIGTERM, then SIGKILL, each wait bounded; by pid,
    checked on its command line. How it went."""
    pid = state.get("pid")
    how = "gone"
    if _is_server(pid, paths.sock):
        how = "shutdown"
        with contextlib.suppress(OSError, ValueError, socket.timeout):
            sock = connect(paths.sock, 2.0)
            try:
                send_line(sock, encode({"id": 0, "op": "shutdown"}).encode(), time.monotonic() + 2.0)
                read_line(sock, time.monotonic() + STOP_WAIT_S)
            finally:
                sock.close()
        if not _wait_gone(pid, paths.sock, STOP_WAIT_S):
            how = "SIGTERM"
            if not _kill(paths, pid, signal.SIGTERM, 5.0):
                how = "SIGKILL"
                _kill(paths, pid, signal.SIGKILL, 5.0)
    _clean(paths, pid)
    return how


def stop(version: str | None = None, directory: Path | None = None) -> list[dict]:
    """Stop the warm engines (of ``version``, or all) (:func:`_stop_one`)."""
    stopped = []
    for path in _state_files(directory):
        paths = _paths_of_state(path)
        state = read_state(paths)
        if state is None or (version is not None and _version_of(path, state) != version):
            continue
        how = _stop_one(paths, state)
        stopped.append(
            {
                "engine": engine_name(_version_of(path, state)),
                "platform": state.get("platform"),
                "pid": state.get("pid"),
                "how": how,
            }
        )
    return stopped


#: Warm engines that may run at once, by default (``KVSPEC_WARM_MAX``):
#: each holds an engine's memory (about 570 MB on CPU) for its idle timeout.
MAX_WARM = 3
#: The most ``KVSPEC_WARM_MAX`` may say.
MAX_WARM_LIMIT = 64


def max_warm() -> int:
    """``KVSPEC_WARM_MAX`` (an integer 1-64), else :data:`MAX_WARM`; a bad
    value is one line naming it."""
    raw = os.environ.get("KVSPEC_WARM_MAX")
    if raw is None or not raw.strip():
        return MAX_WARM
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_WARM_LIMIT:
        raise invalid(
            "KVSPEC_WARM_MAX", raw, f"allowed: an integer in 1-{MAX_WARM_LIMIT} (warm engines running at once)"
        )
    return value


def make_room(keep: Paths, cap: int, directory: Path | None = None, say=None) -> list[dict]:
    """Before a warm engine starts at ``keep``: stop the least recently used
    others (by their socket's last use) until fewer than ``cap`` run, so that
    with the new one at most ``cap`` stay resident. The ones stopped."""
    live = []
    for path in _state_files(directory):
        paths = _paths_of_state(path)
        if paths.sock == keep.sock:
            continue
        state = read_state(paths)
        if state is None or not _is_server(state.get("pid"), paths.sock):
            continue
        try:
            used = os.stat(paths.sock).st_mtime
        except OSError:
            used = float(state.get("started") or 0.0)
        live.append((used, path, paths, state))
    live.sort(key=lambda x: x[0])
    stopped = []
    for _used, path, paths, state in live[: max(0, len(live) - (cap - 1))]:
        how = _stop_one(paths, state)
        row = {
            "engine": engine_name(_version_of(path, state)),
            "platform": state.get("platform"),
            "pid": state.get("pid"),
            "how": how,
        }
        stopped.append(row)
        if say is not None:
            say(
                f"kvspec: stopped the warm engine {row['engine']} ({row['platform']}, pid {row['pid']}), the least recently used: at most {cap} run at once (KVSPEC_WARM_MAX)"
            )
    return stopped
