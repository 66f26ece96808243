"""Worker starts by fork: the host side of an engine environment's zygote
(:mod:`engine_adapter.inside.zygote`, whose docstring states the rule).

:func:`spawn` starts ``python -m MODULE ARGV`` of an engine environment by
asking that environment's zygote to fork it, starting the zygote first when
none serves; the caller gets a :class:`ForkedProcess`, which answers the
part of ``subprocess.Popen`` kvspec uses. ``None`` means "start it the
plain way": zygotes are off (``KVSPEC_ZYGOTE=0``), or this one refused to
serve (a Python thread left running by the imports).

A zygote is keyed, as a warm engine is (``warm_state``), by the engine,
the interpreter, the identity of the environment (``env_id``) and kvspec's
engine-side sources (``fingerprint``): a change to any of them is another
zygote, and the old one exits when idle. Zygotes live in
``KVSPEC_ZYGOTE_DIR`` (default ``$KVSPEC_HOME/zygotes``, private as the warm
folder is), at most ``KVSPEC_ZYGOTE_MAX`` at once (default 4: the least
recently used idle one is asked to stop to make room), and each exits
after ``KVSPEC_ZYGOTE_IDLE_S`` seconds (default 300) without a request or a
living child."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from engine_adapter.host import warm_state
from engine_adapter.host.venvs import wait_flock
from engine_adapter.sockets import connect, remove_if
from ground.engines import EngineSpec
from ground.errors import EngineError, invalid
from ground.home import REPO_ROOT, kvspec_home
from ground.processes import start_detached

#: Seconds a zygote may take to answer a spawn with the child's pid.
SPAWN_ANSWER_TIMEOUT_S = 30.0
#: The module a worker runs.
WORKER_MODULE = "engine_adapter.inside.worker"
#: Longest line a zygote sends, in bytes.
MAX_ANSWER_BYTES = 4096


def enabled() -> bool:
    """Whether workers start by fork (``KVSPEC_ZYGOTE``, default on)."""
    return os.environ.get("KVSPEC_ZYGOTE", "1").strip().lower() not in ("0", "false", "no", "off")


def _number(name: str, default: float, low: float, high: float) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:
        raise invalid(name, raw, f"a number, {low:g} <= N <= {high:g}")
    return value


def idle_timeout() -> float:
    """``KVSPEC_ZYGOTE_IDLE_S``: seconds, 1..86400 (default 300)."""
    return _number("KVSPEC_ZYGOTE_IDLE_S", 300.0, 1.0, 86400.0)


def max_zygotes() -> int:
    """``KVSPEC_ZYGOTE_MAX``: zygotes alive at once in the folder, 1..64 (default 4)."""
    return int(_number("KVSPEC_ZYGOTE_MAX", 4, 1, 64))


def zygote_dir(create: bool = True) -> Path:
    """``KVSPEC_ZYGOTE_DIR``, else ``$KVSPEC_HOME/zygotes`` (its private
    folder, made 0700 when ``create``; the warm folder's rule)."""
    env = os.environ.get("KVSPEC_ZYGOTE_DIR")
    folder = Path(env).expanduser().resolve() if env else kvspec_home() / "zygotes"
    return warm_state.private_dir(folder, create=create)


def paths_of(spec: EngineSpec, python: str, env: dict[str, str]) -> warm_state.Paths:
    """The files of the zygote that serves ``spec`` from ``python`` under ``env``."""
    platform = env.get("KVSPEC_PLATFORM", "cuda")
    fp = warm_state.fingerprint(spec.version, platform, python)[:12]
    safe = "".join(c if c.isalnum() or c in ".-_" else "-" for c in spec.version)
    return warm_state.Paths.named(zygote_dir() / f"{spec.family}-{safe}-{platform}-{warm_state.env_id(env)}-{fp}")


@dataclass(frozen=True)
class Streams:
    """A forked child's standard streams, as ``Popen``'s arguments say them
    (``subprocess.PIPE``, ``DEVNULL`` or None, ``STDOUT`` for stderr, or an
    open file), and whether it gets a session of its own."""

    stdin: object = None
    stdout: object = None
    stderr: object = None
    new_session: bool = False


#: A pipe worker's: three pipes (engine_adapter.host.engine.WorkerProcess).
PIPES = Streams(subprocess.PIPE, subprocess.PIPE, subprocess.PIPE)


class ForkedProcess:
    """A worker forked by a zygote, behind the part of ``subprocess.Popen``
    kvspec uses: ``pid``, ``returncode``, ``stdin``/``stdout``/``stderr``,
    ``poll``, ``wait``, ``kill``, ``terminate``, ``send_signal``. Its exit
    code comes over the zygote's connection; a zygote gone before its child
    leaves the child's code unknown (255) once the child is gone too."""

    def __init__(self, args: list[str], pid: int, conn: socket.socket, streams: tuple) -> None:
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self.stdin, self.stdout, self.stderr = streams
        self._conn: socket.socket | None = conn
        self._buf = bytearray()

    def _take(self, data: bytes) -> None:
        """Read the zygote's lines in ``data`` (an ``exit`` sets the code)."""
        self._buf += data
        *lines, rest = bytes(self._buf).split(b"\n")
        self._buf = bytearray(rest if len(rest) <= MAX_ANSWER_BYTES else b"")
        for line in lines:
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                code = json.loads(line).get("exit")
                if isinstance(code, int):
                    self.returncode = code

    def _update(self, timeout: float) -> None:
        if self.returncode is not None:
            return
        if self._conn is None:  # the zygote went first: watch the pid itself
            if not _alive(self.pid):
                self.returncode = 255
            return
        readable, _, _ = select.select([self._conn], [], [], max(0.0, timeout))
        if not readable:
            return
        chunk = b""
        with contextlib.suppress(OSError):
            chunk = self._conn.recv(MAX_ANSWER_BYTES)
        if chunk:
            self._take(chunk)
            if self.returncode is None:
                return
        self._conn.close()
        self._conn = None
        if self.returncode is None and not _alive(self.pid):
            self.returncode = 255

    def poll(self) -> int | None:
        self._update(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        for _ in range(10**7):
            if self.poll() is not None:
                return self.returncode  # type: ignore[return-value]
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                break
            if self._conn is not None:
                self._update(min(left, 1.0))
            else:
                time.sleep(min(left, 0.1))
        raise subprocess.TimeoutExpired(self.args, timeout or 0.0)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has): warm_state's reading of ``/proc/PID/stat``."""
    return warm_state._proc_state(pid) not in (None, "Z", "X")


def _connect(sock: Path) -> socket.socket | None:
    try:
        return connect(sock, 2.0)
    except OSError:
        return None


def _ask(sock: socket.socket, request: dict, fds: list[int], timeout: float) -> dict:
    """Send one request (with ``fds``) and read the first answer line."""
    sock.settimeout(timeout)
    socket.send_fds(sock, [json.dumps(request).encode() + b"\n"], fds)
    buf = bytearray()
    deadline = time.monotonic() + timeout
    while b"\n" not in buf and len(buf) <= MAX_ANSWER_BYTES and time.monotonic() < deadline:
        chunk = sock.recv(MAX_ANSWER_BYTES)
        if not chunk:
            break
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    answer = json.loads(line) if line else {}
    if not isinstance(answer, dict):
        raise ValueError("the answer is not a JSON object")
    answer["_rest"] = rest
    return answer


def stop(sock: Path) -> bool:
    """Ask the zygote at ``sock`` to exit once it has no child; whether one answered."""
    conn = _connect(sock)
    if conn is None:
        return False
    with contextlib.closing(conn):
        try:
            return bool(_ask(conn, {"op": "stop"}, [], 5.0).get("stopping"))
        except (OSError, ValueError):
            return False


def stop_all(directory: Path | None = None) -> int:
    """Stop every zygote of ``directory`` (default: :func:`zygote_dir`); how many answered."""
    folder = directory or zygote_dir(create=False)
    return sum(stop(sock) for sock in sorted(folder.glob("*.sock"))) if folder.is_dir() else 0


def _make_room(keep: warm_state.Paths) -> None:
    """At most :func:`max_zygotes` in the folder: ask the least recently used to stop."""
    socks = [s for s in keep.sock.parent.glob("*.sock") if s != keep.sock]

    def used(sock: Path) -> float:
        with contextlib.suppress(OSError):
            return sock.stat().st_mtime
        return 0.0

    for sock in sorted(socks, key=used)[: max(0, len(socks) - max_zygotes() + 1)]:
        stop(sock)


def _start(paths: warm_state.Paths, python: str, spec: EngineSpec, env: dict[str, str], deadline: float) -> bool:
    """Start the zygote (the caller holds its lock); True once it listens,
    False when it exited (it refused to fork: start the plain way)."""
    _make_room(paths)
    remove_if(paths.sock)
    cmd = [python, "-m", "engine_adapter.inside.zygote", "--socket", str(paths.sock), "--engine", spec.to_json()]
    cmd += ["--idle-timeout", repr(idle_timeout())]
    with open(paths.log, "wb") as log:
        proc = start_detached(cmd, log, env=env, cwd=str(REPO_ROOT))
    for _ in range(10**6):
        if proc.poll() is not None:
            return False
        conn = _connect(paths.sock)
        if conn is not None:
            conn.close()
            return True
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    tail = paths.log.read_bytes()[-300:].decode(errors="replace").strip() if paths.log.exists() else ""
    raise EngineError(f"engine={spec.name!r}: worker did not start within its time (its zygote: {tail or 'no output'})")


def _child_fds(stdin, stdout, stderr) -> tuple[list[int], tuple, list[int]]:
    """The child's three descriptors, the host's ends (text, line-buffered,
    as ``Popen(text=True, bufsize=1)``), and the descriptors to close once sent."""
    sent: list[int] = []
    close: list[int] = []
    host: list = [None, None, None]
    for i, how in enumerate((stdin, stdout, stderr)):
        if how == subprocess.STDOUT:
            sent.append(sent[1])
            continue
        if how == subprocess.PIPE:
            r, w = os.pipe()
            mine, theirs = (w, r) if i == 0 else (r, w)
            host[i] = open(mine, "w" if i == 0 else "r", encoding="utf-8", buffering=1)  # noqa: SIM115
            sent.append(theirs)
            close.append(theirs)
        elif how is None or how == subprocess.DEVNULL:
            fd = os.open(os.devnull, os.O_RDWR)
            sent.append(fd)
            close.append(fd)
        else:
            sent.append(how if isinstance(how, int) else how.fileno())
    return sent, tuple(host), close


def ensure(spec: EngineSpec, python: str, env: dict[str, str], deadline: float) -> Path | None:
    """The socket of the zygote that serves ``spec`` from ``python`` under
    ``env``, started (under its lock) when none listens; None when it
    refused to serve (start the plain way)."""
    paths = paths_of(spec, python, env)
    conn = _connect(paths.sock)
    if conn is None:
        with open(paths.lock, "a") as lock:
            wait_flock(
                lock, deadline, 0.2, f"engine={spec.name!r}: its zygote's start lock was held past the start time"
            )
            conn = _connect(paths.sock)
            if conn is None and not _start(paths, python, spec, env, deadline):
                return None
    if conn is not None:
        conn.close()
    with contextlib.suppress(OSError):
        os.utime(paths.sock)  # recently used (make_room)
    return paths.sock


def fork_from(
    sock: Path, module: str, argv: list[str], *, env: dict[str, str], streams: Streams, label: str = "engine"
) -> ForkedProcess:
    """``python -m MODULE ARGV`` forked by the zygote at ``sock`` with
    ``streams``; EngineError when it did not fork."""
    conn = _connect(sock)
    if conn is None:
        raise EngineError(f"{label}: its zygote does not listen at {sock.name}")
    sent, ends, close = _child_fds(streams.stdin, streams.stdout, streams.stderr)
    request = {"op": "spawn", "module": module, "argv": argv, "env": env, "cwd": str(REPO_ROOT)}
    try:
        answer = _ask(conn, {**request, "new_session": streams.new_session}, sent, SPAWN_ANSWER_TIMEOUT_S)
    except (OSError, ValueError) as e:
        answer = {"error": str(e)}
    finally:
        for fd in close:
            os.close(fd)
    if not isinstance(answer.get("pid"), int):
        conn.close()
        for end in ends:
            if end is not None:
                end.close()
        raise EngineError(f"{label}: its zygote did not fork a worker: {answer.get('error', 'no answer')}")
    proc = ForkedProcess(["-m", module, *argv], answer["pid"], conn, ends)
    proc._take(answer.get("_rest", b""))
    return proc


def spawn(
    spec: EngineSpec,
    python: str,
    argv: list[str],
    *,
    env: dict[str, str],
    streams: Streams,
    start_timeout: float = 600.0,
) -> ForkedProcess | None:
    """``python -m engine_adapter.inside.worker ARGV`` forked by the zygote
    of ``spec`` (started first when none serves), or None: start it the
    plain way (zygotes off, or this environment's zygote refused to serve,
    is stopping or did not answer)."""
    if not enabled():
        return None
    sock = ensure(spec, python, env, time.monotonic() + start_timeout)
    if sock is None:
        return None
    try:
        return fork_from(sock, WORKER_MODULE, argv, env=env, streams=streams, label=f"engine={spec.name!r}")
    except EngineError:
        return None  # a zygote that stops or did not answer: the plain start decides
