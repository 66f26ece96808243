"""Warm engines: one long-lived worker per engine environment and platform,
started on first use and reused by later commands.

Importing vLLM takes ~25 s in every process; a warm engine pays it once.
It is ``python -m engine_adapter.worker --socket ...`` (this module's
:func:`serve_socket`) in the version's environment, listening on a Unix
socket under kvspec's home::

    $KVSPEC_HOME/warm/vllm-0.33.0-cuda.sock    mode 0600, in a 0700 folder
    $KVSPEC_HOME/warm/vllm-0.33.0-cuda.json    its state: pid, fingerprint, idle timeout, ...
    $KVSPEC_HOME/warm/vllm-0.33.0-cuda.log     its stderr
    $KVSPEC_HOME/warm/vllm-0.33.0-cuda.lock    held while a client starts one

(``KVSPEC_WARM_DIR`` moves the folder.) The wire format is
:mod:`engine_adapter.protocol`'s, one request per connection; the server
carries out requests one at a time, so concurrent clients queue (each with
its own bounded wait), and every ``run`` builds a fresh ``Scheduler`` as
the pipe worker does.

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
* a request that times out kills the server (a hung engine serves no one);
  the next request starts a fresh one. A server that dies mid-request gives
  that request a ``worker`` error: kvspec's failure, never vLLM's.

``KVSPEC_WARM=0`` turns warm engines off for the commands that use them
(``run``, ``replay --engine``, ``resolve``, ``matrix``): each then starts
its own worker, as fuzz campaigns always do.

The client side never imports vLLM.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engine_adapter.venvs import wait_flock
from kvspec.home import REPO_ROOT, kvspec_home
from reference.case import write_json_atomic
from reference.errors import EngineError, invalid

#: Default idle seconds before a warm engine exits by itself.
IDLE_TIMEOUT_S = 600.0
#: Seconds a warm engine waits for the request line of a connection it accepted.
REQUEST_READ_TIMEOUT_S = 30.0
#: Seconds a warm engine may take to hand over one response.
RESPONSE_SEND_TIMEOUT_S = 60.0
#: Longest request or response line, in bytes.
MAX_LINE_BYTES = 256 << 20
#: Seconds ``stop`` waits for each step (shutdown, SIGTERM) before the next.
STOP_WAIT_S = 10.0
#: Sources a warm engine runs: a change to any of them makes it stale.
FINGERPRINT_SOURCES = ("engine_adapter/**/*.py", "engine_adapter/models/**/*", "reference/**/*.py", "kvspec/__init__.py", "kvspec/home.py")


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
    """Where warm engines keep their sockets (``KVSPEC_WARM_DIR``, else ``$KVSPEC_HOME/warm``)."""
    env = os.environ.get("KVSPEC_WARM_DIR")
    return Path(env).expanduser().resolve() if env else kvspec_home() / "warm"


@dataclass(frozen=True)
class Paths:
    """The files of one warm engine."""

    sock: Path
    state: Path
    log: Path
    lock: Path

    @classmethod
    def of(cls, version: str, platform: str, directory: Path | None = None) -> Paths:
        return cls.named((directory or warm_dir()) / f"vllm-{version}-{platform}")

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
    from engine_adapter import environments
    from engine_adapter.protocol import PROTOCOL_VERSION

    python = python or str(environments.env_python(version))
    key = (version, platform, python)
    if key not in _FINGERPRINTS:
        h = hashlib.sha256(f"kvspec-warm\0{PROTOCOL_VERSION}\0{version}\0{platform}\0{python}\0".encode())
        files = sorted({p for pattern in FINGERPRINT_SOURCES for p in REPO_ROOT.glob(pattern) if p.is_file() and "__pycache__" not in p.parts})
        for path in files:
            h.update(path.relative_to(REPO_ROOT).as_posix().encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
        try:
            h.update(b"marker\0" + environments.marker_path(version).read_bytes())
        except OSError:
            h.update(b"no marker\0")
        _FINGERPRINTS[key] = h.hexdigest()
    return _FINGERPRINTS[key]


# ------------------------------------------------------------------ sockets


@contextlib.contextmanager
def _address(path: Path) -> Iterator[str]:
    """An address for ``path`` that fits a Unix socket's ~107 bytes: the
    path itself, or the same file through ``/proc/self/fd`` (Linux) when
    kvspec's home is deep."""
    text = str(path)
    if len(text.encode()) < 100:
        yield text
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def _connect(path: Path, timeout: float) -> socket.socket:
    """A connection to the socket at ``path``; OSError if nobody listens."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(max(0.05, timeout))
    try:
        with _address(path) as addr:
            sock.connect(addr)
    except BaseException:
        sock.close()
        raise
    return sock


def _send_line(sock: socket.socket, data: bytes, deadline: float) -> None:
    sock.settimeout(max(0.05, deadline - time.monotonic()))
    sock.sendall(data)


def _read_line(sock: socket.socket, deadline: float) -> bytes | None:
    """One line (without the newline), or None at EOF; socket.timeout past ``deadline``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("deadline")
        sock.settimeout(min(left, 1.0))
        try:
            chunk = sock.recv(1 << 20)
        except socket.timeout:
            continue
        if not chunk:
            return None
        end = chunk.find(b"\n")
        if end >= 0:
            chunks.append(chunk[:end])
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_LINE_BYTES:
            raise ValueError(f"a line longer than {MAX_LINE_BYTES} bytes")


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
    return "engine_adapter.worker" in cmd and "--socket" in cmd and str(sock) in cmd


def _wait_gone(pid: int, sock: Path, seconds: float) -> bool:
    """Wait until ``pid`` has exited (its files, the socket among them,
    closed: :func:`_exited`) or is no longer the server of ``sock``."""

    def gone() -> bool:
        if _exited(pid):
            return True
        cmd = _cmdline(pid)
        return bool(cmd) and not ("engine_adapter.worker" in cmd and str(sock) in cmd)  # the pid was reused

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


def _remove_if(path: Path, inode: int | None = None) -> None:
    """Unlink ``path`` (only if it still has ``inode``, when given)."""
    try:
        if inode is not None and os.stat(path).st_ino != inode:
            return
        path.unlink()
    except FileNotFoundError:
        pass


def _clean(paths: Paths, pid: int | None) -> None:
    """Remove a gone server's socket and state file (a live server's, or
    another server's, are left alone)."""
    state = read_state(paths)
    if state is not None and state.get("pid") == pid:
        if state.get("socket_inode") is not None:
            _remove_if(paths.sock, state.get("socket_inode"))
        _remove_if(paths.state)


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
    """Hold the start lock of one warm engine; wait (polling) until ``deadline``."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
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

    def __init__(self, version: str, platform: str = "cuda", *, idle_timeout: float | None = None, start_timeout: float = 180.0, directory: Path | None = None, python: str | None = None) -> None:
        from engine_adapter import environments
        from engine_adapter.versions import engine_name

        self.version, self.platform = version, platform
        self.engine = engine_name(version)
        self.python = python or str(environments.env_python(version))
        self.paths = Paths.of(version, platform, directory)
        self.idle_timeout = idle_timeout if idle_timeout is not None else idle_timeout_default()
        self.start_timeout = start_timeout
        self.fingerprint = fingerprint(version, platform, self.python)
        self.started: int | None = None  # pid of a server this client started
        self.restarts = 0
        self._next_id = 0

    # ----------------------------------------------------------- requests

    def request(self, op: str, timeout: float, **fields) -> dict:
        """One request; the server's response, or ``ok: false`` of kind
        ``worker`` when the server died or timed out (a server that timed
        out is killed: the next request starts a fresh one)."""
        from engine_adapter.protocol import encode

        deadline = time.monotonic() + timeout
        self._next_id += 1
        rid = self._next_id
        line = encode({"id": rid, "op": op, "fingerprint": self.fingerprint, **fields}).encode()
        for _attempt in range(3):
            sock = self.connect(deadline)
            try:
                try:
                    _send_line(sock, line, deadline)
                    raw = _read_line(sock, deadline)
                except socket.timeout:
                    return self._timed_out(rid, timeout)
                except (OSError, ValueError) as e:
                    raw, why = None, f"{type(e).__name__}: {e}"
                else:
                    why = "closed the connection without an answer"
            finally:
                sock.close()
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

    def _timed_out(self, rid: int, timeout: float) -> dict:
        state = read_state(self.paths)
        if state is not None and isinstance(state.get("pid"), int):
            _kill(self.paths, state["pid"])
        self.restarts += 1
        return {"id": rid, "ok": False, "error": {"kind": "worker", "message": f"timed out after {timeout:.0f}s (warm engine {self.engine} killed): {_log_tail(self.paths)}"}}

    # ----------------------------------------------------------- the server

    def connect(self, deadline: float) -> socket.socket:
        """A connection to a live server (maybe of other sources: the
        request's fingerprint tells); starts one when none answers."""
        try:
            return _connect(self.paths.sock, deadline - time.monotonic())
        except OSError:
            pass
        with _locked(self.paths.lock, min(deadline, time.monotonic() + self.start_timeout), self.engine):
            with contextlib.suppress(OSError):
                return _connect(self.paths.sock, deadline - time.monotonic())
            self._start(deadline)
            return _connect(self.paths.sock, deadline - time.monotonic())

    def replace(self, deadline: float) -> None:
        """Start a server of this client's sources unless one already took
        over the socket (under the start lock)."""
        with _locked(self.paths.lock, min(deadline, time.monotonic() + self.start_timeout), self.engine):
            state = read_state(self.paths)
            if state is not None and state.get("fingerprint") == self.fingerprint and _is_server(state.get("pid"), self.paths.sock):
                return
            self._start(deadline)

    def _start(self, deadline: float) -> None:
        """Start a server (the caller holds the start lock) and wait until
        it answers on the socket."""
        from engine_adapter import environments

        if not os.path.exists(self.python):
            raise EngineError(f"engine={self.engine!r}: not installed (no {self.python}); run: kvspec engines install {self.engine}")
        paths = self.paths
        paths.sock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(OSError):
            os.chmod(paths.sock.parent, 0o700)
        state = read_state(paths)
        if state is not None and not _is_server(state.get("pid"), paths.sock):
            _clean(paths, state.get("pid"))  # a dead server's files
        if paths.sock.exists():
            # A live server of other sources keeps its socket until the new
            # one takes its path over; one nobody listens on is stale.
            try:
                _connect(paths.sock, 1.0).close()
            except OSError:
                _remove_if(paths.sock)
        cmd = [self.python, "-m", "engine_adapter.worker", "--socket", str(paths.sock), "--state", str(paths.state), "--fingerprint", self.fingerprint, "--idle-timeout", repr(float(self.idle_timeout))]
        with open(paths.log, "wb") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=environments.worker_env(self.version, self.platform), cwd=str(REPO_ROOT), start_new_session=True)
        end = min(deadline, time.monotonic() + self.start_timeout)
        while True:
            rc = proc.poll()
            if rc is not None:
                raise EngineError(f"engine={self.engine!r}: warm engine exited (status {rc}) before it answered: {_log_tail(paths)}")
            state = read_state(paths)
            if state is not None and state.get("pid") == proc.pid:
                with contextlib.suppress(OSError):
                    _connect(paths.sock, 1.0).close()
                    self.started = proc.pid
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
    folder = directory or warm_dir()
    try:
        return sorted(p for p in folder.glob("vllm-*.json") if p.is_file())
    except OSError:
        return []


def _paths_of_state(path: Path) -> Paths:
    return Paths.named(path.with_name(path.name.removesuffix(".json")))


def _version_of(path: Path, state: dict) -> str:
    """The engine version a state file is named after (``vllm-X-PLATFORM.json``;
    a build's ``X+LABEL.HASH`` as the client named it), else the server's vLLM."""
    stem, platform = path.name.removesuffix(".json"), str(state.get("platform"))
    if stem.startswith("vllm-") and stem.endswith("-" + platform):
        return stem[len("vllm-"):-len(platform) - 1]
    return str(state.get("version"))


def list_warm(directory: Path | None = None) -> list[dict]:
    """The warm engines now running (a dead one's files are removed):
    engine, platform, pid, idle seconds left, whether it runs this
    checkout's sources."""
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
            "engine": f"vllm=={version}", "version": version, "platform": platform, "pid": pid,
            "socket": str(paths.sock), "idle_timeout_s": idle,
            "idle_left_s": round(max(0.0, idle - (now - last_used)), 1),
            "started": state.get("started"), "current": current,
        })
    return rows


def stop(version: str | None = None, directory: Path | None = None) -> list[dict]:
    """Stop the warm engines (of ``version``, or all): ``shutdown`` over the
    socket (after the request in progress), then SIGTERM, then SIGKILL, each
    wait bounded; by pid, checked on its command line."""
    from engine_adapter.protocol import encode

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
                sock = _connect(paths.sock, 2.0)
                try:
                    _send_line(sock, encode({"id": 0, "op": "shutdown"}).encode(), time.monotonic() + 2.0)
                    _read_line(sock, time.monotonic() + STOP_WAIT_S)
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


# ------------------------------------------------------------------ the server


def serve_socket(sock_path: str, state_path: str | None, fp: str, idle_timeout: float) -> int:
    """The warm engine's main loop (``python -m engine_adapter.worker
    --socket PATH``): import vLLM, take over the socket (0600), write the
    state file, serve one connection at a time until idle, replaced,
    stopped or its environment changes."""
    import selectors

    from engine_adapter.driver import get_driver  # imports vLLM
    from engine_adapter.venvs import marker_path

    from engine_adapter.worker import settle

    t0 = time.time()
    driver = get_driver()
    settle()
    sock_file = Path(sock_path)
    state_file = Path(state_path) if state_path else sock_file.with_name(sock_file.name.removesuffix(".sock") + ".json")
    marker = marker_path(Path(sys.prefix))

    def marker_sig():
        with contextlib.suppress(OSError):
            st = os.stat(marker)
            return (st.st_ino, st.st_mtime_ns, st.st_size)
        return None

    env_sig = marker_sig()
    # Take over the socket path: a server of other sources still bound to it
    # sees its socket file gone and leaves; the client that started this one
    # holds the start lock, so other clients wait for it rather than race.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    _remove_if(sock_file)
    old_umask = os.umask(0o177)
    try:
        with _address(sock_file) as addr:
            listener.bind(addr)
    finally:
        os.umask(old_umask)
    os.chmod(sock_file, 0o600)
    listener.listen(64)
    inode = os.stat(sock_file).st_ino
    write_json_atomic(state_file, {
        "pid": os.getpid(), "version": driver.version, "engine": f"vllm=={driver.version}",
        "platform": os.environ.get("KVSPEC_PLATFORM", "cuda"), "fingerprint": fp, "python": sys.executable,
        "socket": str(sock_file), "socket_inode": inode, "idle_timeout_s": idle_timeout,
        "started": t0, "ready": time.time(),
    })
    stopping = [False]
    signal.signal(signal.SIGTERM, lambda *_: stopping.__setitem__(0, True))
    signal.signal(signal.SIGINT, lambda *_: stopping.__setitem__(0, True))
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    last = time.monotonic()
    served = 0

    def ours() -> bool:
        try:
            return os.stat(sock_file).st_ino == inode
        except OSError:
            return False

    while not stopping[0]:
        left = idle_timeout - (time.monotonic() - last)
        if left <= 0 or not ours() or marker_sig() != env_sig:
            break
        if not sel.select(timeout=min(1.0, left)):
            continue
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            continue
        what = _serve_connection(conn, driver, fp, lambda: {"pid": os.getpid(), "fingerprint": fp, "served": served, "idle_left_s": round(max(0.0, idle_timeout - (time.monotonic() - last)), 1), "version": driver.version})
        if what == "used":
            served += 1
            last = time.monotonic()
            with contextlib.suppress(OSError):
                if ours():
                    os.utime(sock_file)  # `kvspec engines list` reads the idle time here
        elif what == "shutdown":
            break
    # Leave: no new client finds the socket, then serve those already queued.
    if ours():
        _remove_if(sock_file, inode)
    state = None
    with contextlib.suppress(OSError, ValueError):
        state = json.loads(state_file.read_text())
    if isinstance(state, dict) and state.get("pid") == os.getpid():
        _remove_if(state_file)
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            break
        _serve_connection(conn, driver, fp, lambda: {"pid": os.getpid(), "fingerprint": fp, "served": served, "idle_left_s": 0.0, "version": driver.version})
    listener.close()
    return 0


def _serve_connection(conn: socket.socket, driver, fp: str, status) -> str:
    """Read one request line, answer it, close. Returns ``used``,
    ``status``, ``shutdown`` or ``none`` (nothing read)."""
    from engine_adapter.protocol import decode, encode
    from engine_adapter.worker import _error, handle

    what = "none"
    try:
        conn.setblocking(True)
        raw = _read_line(conn, time.monotonic() + REQUEST_READ_TIMEOUT_S)
        if raw is None:
            return what
        rid = None
        try:
            msg = decode(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            resp = {"ok": False, "error": _error("protocol", f"bad request line: {e}")}
        else:
            rid = msg.get("id")
            op = msg.get("op")
            if op == "shutdown":
                resp, what = {"ok": True, "result": {"bye": True}}, "shutdown"
            elif op == "status":
                resp, what = {"ok": True, "result": status()}, "status"
            else:
                resp, what = handle(driver, msg, fp), "used"
        resp["id"] = rid
        try:
            data = encode(resp)
        except ValueError as e:  # e.g. NaN in a result
            data = encode({"id": rid, "ok": False, "error": _error("internal", f"result not encodable: {e}")})
        _send_line(conn, data.encode(), time.monotonic() + RESPONSE_SEND_TIMEOUT_S)
    except (OSError, ValueError) as e:  # the client went away or sent too much
        if isinstance(e, OSError) and e.errno not in (None, errno.EPIPE, errno.ECONNRESET):
            print(f"kvspec warm engine: connection: {e}", file=sys.stderr, flush=True)
    finally:
        conn.close()
    return what
