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
import fcntl
import hashlib
import json
import math
import os
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engine_adapter.host import environments
from engine_adapter.host.venvs import wait_flock
from engine_adapter.host.versions import engine_name
from engine_adapter.protocol import KILLED_MARK, PROTOCOL_VERSION, encode
from engine_adapter.sockets import Lines, connect, event_of, read_line, remove_if, send_line
from ground.console import say as console_say
from ground.home import REPO_ROOT, kvspec_home
from ground.files import hash_files
from ground.errors import EngineError, invalid

#: Default idle seconds before a warm engine exits by itself.
IDLE_TIMEOUT_S = 600.0
#: Seconds ``stop`` waits for each step (shutdown, SIGTERM) before the next.
STOP_WAIT_S = 10.0
#: Seconds a client waits for the warm engine to begin its request (busy
#: with another command's) before it starts a fresh engine of its own.
QUEUE_WAIT_S = 30.0
#: Environment variables that are part of a warm engine's identity:
#: these prefixes and names (:func:`identity_env`) ...
IDENTITY_PREFIXES = ("VLLM_", "KVSPEC_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TORCH", "PYTORCH_", "CUDA_", "NCCL_", "OMP_", "MKL_", "OPENBLAS_", "PYTHON", "LD_")
IDENTITY_NAMES = ("HOME", "TMPDIR", "XDG_CACHE_HOME", "LANG", "LC_ALL", "TZ")
#: ... but for the warm engines' own settings, read by the client only.
NOT_IDENTITY = ("KVSPEC_WARM", "KVSPEC_WARM_DIR", "KVSPEC_WARM_IDLE_S")
#: Sources a warm engine runs: a change to any of them makes it stale.
FINGERPRINT_SOURCES = ("engine_adapter/**/*.py", "engine_adapter/models/**/*", "reference/**/*.py", "ground/**/*.py", "kvspec/__init__.py")


def enabled() -> bool:
    """Whether the commands use warm engines (``KVSPEC_WARM``, default on)."""
    return os.environ.get("KVSPEC_WARM", "1").strip().lower() not in ("0", "false", "no", "off")


def idle_timeout_default() -> float:
    """``KVSPEC_WARM_IDLE_S`` (seconds, > 0, at most a day), else :data:`IDLE_TIMEOUT_S`."""
    raw = os.environ.get("KVSPEC_WARM_IDLE_S")
    if raw is None or not raw.strip():
        return IDLE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= 86400):
        raise invalid("KVSPEC_WARM_IDLE_S", raw, "must be a finite number of seconds, 0 < S <= 86400")
    return value


def warm_dir() -> Path:
    """The folder asked for (``KVSPEC_WARM_DIR``, else ``$KVSPEC_HOME/warm``);
    the sockets live there or in its private subfolder (:func:`private_dir`)."""
    env = os.environ.get("KVSPEC_WARM_DIR")
    return Path(env).expanduser().resolve() if env else kvspec_home() / "warm"


def _dir_label(folder: Path) -> str:
    return "KVSPEC_WARM_DIR" if os.environ.get("KVSPEC_WARM_DIR") else "warm engine folder"


def _private_enough(st: os.stat_result) -> bool:
    """A folder of this user that neither group nor others can write."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def private_dir(folder: Path, create: bool = False) -> Path:
    """Where the warm engines of ``folder`` live. The rule: kvspec never
    chmods a folder it did not create. ``folder`` itself when it is missing
    (``create``: made 0700) or is a folder this user owns that neither
    group nor others can write; otherwise its subfolder
    ``kvspec-warm-<uid>`` (``create``: made 0700), used only if it is a real
    folder (not a link) of this user with no group or other access. Any
    other case is refused in one line (``InvalidArgument``)."""
    label = _dir_label(folder)
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        if not create:
            return folder
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)  # created here: never wider than 0700
        st = os.stat(folder)
    except OSError as e:
        raise invalid(label, str(folder), f"a folder kvspec can use ({e.strerror or e})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise invalid(label, str(folder), "a folder")
    if _private_enough(st):
        return folder
    sub = folder / f"kvspec-warm-{os.geteuid()}"
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(sub, 0o700)
    try:
        sst = os.lstat(sub)
    except FileNotFoundError:
        if not create:
            return sub
        raise invalid(label, str(folder), f"a folder where kvspec can create its private subfolder {sub.name}") from None
    if not (stat.S_ISDIR(sst.st_mode) and not stat.S_ISLNK(sst.st_mode) and sst.st_uid == os.geteuid() and not sst.st_mode & 0o077):
        raise invalid(label, str(folder), f"a folder of yours that others cannot write, or one whose {sub.name} is a private folder of yours (yours, mode 0700, not a link)")
    return sub


def identity_env(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that are part of a warm engine's identity
    (:data:`IDENTITY_PREFIXES`, :data:`IDENTITY_NAMES`, less :data:`NOT_IDENTITY`)."""
    return {k: v for k, v in env.items() if (k.startswith(IDENTITY_PREFIXES) or k in IDENTITY_NAMES) and k not in NOT_IDENTITY}


def env_id(env: dict[str, str]) -> str:
    """12 hex digits of sha256 over :func:`identity_env` of ``env`` (names
    and values; only the hash is ever shown)."""
    h = hashlib.sha256(b"kvspec-warm-env\0")
    for k, v in sorted(identity_env(env).items()):
        h.update(k.encode(errors="surrogateescape") + b"=" + v.encode(errors="surrogateescape") + b"\0")
    return h.hexdigest()[:12]


@dataclass(frozen=True)
class Paths:
    """The files of one warm engine."""

    sock: Path
    state: Path
    log: Path
    lock: Path

    @classmethod
    def of(cls, version: str, platform: str, directory: Path | None = None, env: str | None = None) -> Paths:
        """The files of the warm engine of ``version`` on ``platform`` in
        the environment ``env`` (:func:`env_id`; default: the one this
        process would start it with), in ``directory``'s private folder."""
        if env is None:
            env = env_id(environments.worker_env(version, platform))
        return cls.named(private_dir(directory or warm_dir()) / f"vllm-{version}-{platform}-{env}")

    @classmethod
    def named(cls, base: Path) -> Paths:
        """``base`` + ``.sock`` / ``.json`` / ``.log`` / ``.lock``."""
        return cls(*(base.with_name(base.name + ext) for ext in (".sock", ".json", ".log", ".lock")))


_FINGERPRINTS: dict[tuple, str] = {}


def fingerprint(version: str, platform: str, python: str | None = None) -> str:
    """sha256 of what a warm engine of ``version`` on ``platform`` runs:
    kvspec's engine-side sources (:data:`FINGERPRINT_SOURCES`), the
    environment's ready marker (rewritten by every install), the
    interpreter and the platform. Computed once per process."""
    python = python or str(environments.env_python(version))
    key = (version, platform, python)
    if key not in _FINGERPRINTS:
        h = hashlib.sha256(f"kvspec-warm\0{PROTOCOL_VERSION}\0{version}\0{platform}\0{python}\0".encode())
        hash_files(h, REPO_ROOT, FINGERPRINT_SOURCES)
        try:
            h.update(b"marker\0" + environments.marker_path(version).read_bytes())
        except OSError:
            h.update(b"no marker\0")
        _FINGERPRINTS[key] = h.hexdigest()
    return _FINGERPRINTS[key]


# ------------------------------------------------------------------ processes


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [x.decode(errors="replace") for x in raw.split(b"\0") if x]


def _proc_state(pid: int) -> str | None:
    """The state letter of ``/proc/PID/stat`` (``Z``: a zombie), None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    tail = raw[raw.rfind(b")") + 1:].split()
    return tail[0].decode() if tail else None


def _exited(pid: int) -> bool:
    """Whether ``pid`` has exited and closed its files: no such process, or
    a zombie leader with no other thread left. A multithreaded process's
    leader shows ``Z`` as soon as it exits while its other threads still
    run their exit and hold the shared file table, the listening socket
    among it: a client connecting then is reset (seen in CI: the warm
    stand-in has two threads)."""
    state = _proc_state(pid)
    if state not in ("Z", "X"):
        return state is None
    try:
        return os.listdir(f"/proc/{pid}/task") in ([], [str(pid)])
    except OSError:
        return True


def _is_server(pid: object, sock: Path) -> bool:
    """Whether ``pid`` is alive and is the warm engine of ``sock`` (checked
    on its command line, so a reused pid is never signalled)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    cmd = _cmdline(pid)
    if not cmd or _proc_state(pid) in (None, "Z", "X"):
        return False  # gone or exiting: it serves no one
    return "engine_adapter.inside.worker" in cmd and "--socket" in cmd and str(sock) in cmd


def _wait_gone(pid: int, sock: Path, seconds: float) -> bool:
    """Wait until ``pid`` has exited (its files, the socket among them,
    closed: :func:`_exited`) or is no longer the server of ``sock``."""

    def gone() -> bool:
        if _exited(pid):
            return True
        cmd = _cmdline(pid)
        return bool(cmd) and not ("engine_adapter.inside.worker" in cmd and str(sock) in cmd)  # the pid was reused

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if gone():
            return True
        time.sleep(0.05)
    return gone()


def read_state(paths: Paths) -> dict | None:
    try:
        state = json.loads(paths.state.read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _clean(paths: Paths, pid: int | None) -> None:
    """Remove a gone server's socket and state file (a live server's, or
    another server's, are left alone)."""
    state = read_state(paths)
    if state is not None and state.get("pid") == pid:
        if state.get("socket_inode") is not None:
            remove_if(paths.sock, state.get("socket_inode"))
        remove_if(paths.state)


def _kill(paths: Paths, pid: int, sig: int = signal.SIGKILL, wait_s: float = STOP_WAIT_S) -> bool:
    """Signal the warm engine ``pid`` of ``paths`` (only if it is one) and
    wait for it to go; clean its files. True when it is gone."""
    if _is_server(pid, paths.sock):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    gone = _wait_gone(pid, paths.sock, wait_s)
    if gone:
        _clean(paths, pid)
    return gone


@contextlib.contextmanager
def _locked(path: Path, deadline: float, label: str) -> Iterator[None]:
    """Hold the start lock of one warm engine (its folder made by
    :meth:`WarmClient.folder_ready`); wait (polling) until ``deadline``."""
    with open(path, "a") as f:
        wait_flock(f, deadline, 0.1, f"{label}: warm engine start lock {path} held by another client past the time limit; allowed: a free lock")
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _log_tail(paths: Paths) -> str:
    try:
        with open(paths.log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = [x for x in f.read().decode(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "(no log)"
    return lines[-1][:300] if lines else "(empty log)"


# ------------------------------------------------------------------ the client


class WarmClient:
    """Requests to the warm engine of one version and platform, starting
    (or replacing) it when needed."""

    def __init__(self, version: str, platform: str = "cuda", *, idle_timeout: float | None = None, start_timeout: float = 180.0, directory: Path | None = None, python: str | None = None, queue_wait: float = QUEUE_WAIT_S, say=None) -> None:
        self.version, self.platform = version, platform
        self.engine = engine_name(version)
        self.python = python or str(environments.env_python(version))
        self.env = environments.worker_env(version, platform)  # what a server it starts runs with
        self.env_id = env_id(self.env)
        self.folder = directory or warm_dir()
        self.paths = Paths.of(version, platform, self.folder, self.env_id)
        self.idle_timeout = idle_timeout if idle_timeout is not None else idle_timeout_default()
        self.start_timeout = start_timeout
        self.queue_wait = queue_wait
        self.say = say if say is not None else console_say  # one line on stderr (ground.console.say) when this client starts a fresh engine for a reason
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
            line = encode({"id": rid, "op": op, "fingerprint": self.fingerprint, "timeout_s": round(max(0.05, deadline - time.monotonic()), 3), **fields}).encode()
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
                except socket.timeout:
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
                    return {"id": rid, "ok": False, "error": {"kind": "worker", "message": f"timed out after {timeout:.0f}s waiting for the warm engine {self.engine}, busy with another command's request (left running)"}}
                self.take_over(deadline, behind)
                continue
            if raw is None and serving is None and _attempt < 3:
                continue  # the engine left (or was killed) before it began this request: a fresh one will
            if raw is None:
                self.restarts += 1
                return {"id": rid, "ok": False, "error": {"kind": "worker", "message": f"warm engine {self.engine} ({self.platform}) {why}: {_log_tail(self.paths)}"}}
            try:
                resp = json.loads(raw)
            except ValueError:
                return {"id": rid, "ok": False, "error": {"kind": "worker", "message": f"warm engine {self.engine} answered a non-protocol line: {raw[:200]!r}"}}
            err = resp.get("error") if isinstance(resp, dict) else None
            if isinstance(err, dict) and err.get("kind") == "stale":
                self.replace(deadline)
                continue
            return resp
        return {"id": rid, "ok": False, "error": {"kind": "worker", "message": f"warm engine {self.engine}: no server of this kvspec's sources answered"}}

    def _timed_out(self, rid: int, timeout: float, pid: int) -> dict:
        """This client's own request ran past its bound on the engine
        ``pid``: kill that engine (only it), mark its log so that the next
        command says why it starts a fresh one."""
        tail = _log_tail(self.paths)
        state = read_state(self.paths)
        if state is not None and state.get("pid") == pid:
            with contextlib.suppress(OSError), open(self.paths.log, "a") as log:
                log.write(f"\n{KILLED_MARK} a request ran past its time limit of {timeout:.0f}s (killed by its client)\n")
        _kill(self.paths, pid)
        self.restarts += 1
        return {"id": rid, "ok": False, "error": {"kind": "worker", "message": f"timed out after {timeout:.0f}s (warm engine {self.engine} killed): {tail}"}}

    def take_over(self, deadline: float, behind: object) -> None:
        """The warm engine ``behind`` stayed busy with another command's
        request: start a fresh one that takes over the socket path (the busy
        one finishes its request, then leaves), unless another client
        already did; say so in one line."""
        self.folder_ready()
        with _locked(self.paths.lock, min(deadline, time.monotonic() + self.start_timeout), self.engine):
            state = read_state(self.paths)
            pid = state.get("pid") if state is not None else None
            if state is not None and pid != behind and state.get("fingerprint") == self.fingerprint and _is_server(pid, self.paths.sock):
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
            if state is not None and state.get("fingerprint") == self.fingerprint and _is_server(state.get("pid"), self.paths.sock):
                return
            self._start(deadline)

    def _start(self, deadline: float, announce: bool = True) -> None:
        """Start a server (the caller holds the start lock) and wait until
        it answers on the socket. When the previous one was killed for a
        request past its bound (its log ends with :data:`KILLED_MARK`), say
        so in one line (``announce``)."""
        if not os.path.exists(self.python):
            raise EngineError(f"engine={self.engine!r}: not installed (no {self.python}); run: kvspec engines install {self.engine}")
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
        cmd = [self.python, "-m", "engine_adapter.inside.worker", "--socket", str(paths.sock), "--state", str(paths.state), "--fingerprint", self.fingerprint, "--idle-timeout", repr(float(self.idle_timeout))]
        with open(paths.log, "wb") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=str(REPO_ROOT), start_new_session=True)
        end = min(deadline, time.monotonic() + self.start_timeout)
        while True:
            rc = proc.poll()
            if rc is not None:
                raise EngineError(f"engine={self.engine!r}: warm engine exited (status {rc}) before it answered: {_log_tail(paths)}")
            state = read_state(paths)
            if state is not None and state.get("pid") == proc.pid:
                with contextlib.suppress(OSError):
                    connect(paths.sock, 1.0).close()
                    self.started = proc.pid
                    if killed and announce:
                        self.say(f"kvspec: the warm engine {self.engine} was killed (a request ran past its time limit); started a fresh one")
                    return
            if time.monotonic() > end:
                _kill(paths, proc.pid)
                with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                    proc.kill()
                    proc.wait(timeout=5)
                raise EngineError(f"engine={self.engine!r}: warm engine did not answer within {self.start_timeout:.0f}s: {_log_tail(paths)}")
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
        return stem[len("vllm-"):-len(platform) - 1]
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
        rows.append({
            "engine": f"vllm=={version}", "version": version, "platform": platform, "env": _env_of(path), "pid": pid,
            "socket": str(paths.sock), "idle_timeout_s": idle,
            "idle_left_s": round(max(0.0, idle - (now - last_used)), 1),
            "started": state.get("started"), "current": current,
        })
    return rows


def stop(version: str | None = None, directory: Path | None = None) -> list[dict]:
    """Stop the warm engines (of ``version``, or all): ``shutdown`` over the
    socket (after the request in progress), then SIGTERM, then SIGKILL, each
    wait bounded; by pid, checked on its command line."""
    stopped = []
    for path in _state_files(directory):
        paths = _paths_of_state(path)
        state = read_state(paths)
        if state is None or (version is not None and _version_of(path, state) != version):
            continue
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
        stopped.append({"engine": f"vllm=={_version_of(path, state)}", "platform": state.get("platform"), "pid": pid, "how": how})
    return stopped
