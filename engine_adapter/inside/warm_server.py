"""A warm engine's server loop, inside the engine's environment
(``python -m engine_adapter.inside.worker --socket PATH``): import the
engine once, take over the socket, serve one connection at a time with
each request's own bound, leave when idle, replaced, stopped or when the
environment changes. The client and the lifetime rules are in
:mod:`engine_adapter.host.warm`."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import selectors
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from engine_adapter.inside.handler import error, handle, response_line, settle
from engine_adapter.interface import get_driver
from engine_adapter.protocol import KILLED_MARK, READY_MARKER, decode, encode
from engine_adapter.sockets import address, hung_up, read_line, remove_if, send_line
from ground.files import write_json_atomic

#: Seconds a warm engine waits for the request line of a connection it accepted.
REQUEST_READ_TIMEOUT_S = 30.0
#: Seconds a warm engine may take to hand over one response.
RESPONSE_SEND_TIMEOUT_S = 60.0
#: Seconds a request may run past its own bound before its server ends itself.
OVERRUN_GRACE_S = 2.0
#: Seconds after that when the kernel ends a server whose watchdog thread
#: could not run (a request holding the GIL): SIGALRM, default action.
HARD_GRACE_S = 5.0


def serve_socket(sock_path: str, state_path: str | None, fp: str, idle_timeout: float, family: str = "vllm") -> int:
    """The warm engine's main loop (``python -m engine_adapter.inside.worker
    --socket PATH``): import vLLM, take over the socket (0600), write the
    state file, serve one connection at a time until idle, replaced,
    stopped or its environment changes."""
    t0 = time.time()
    driver = get_driver(family)  # imports the engine
    settle()
    sock_file = Path(sock_path)
    state_file = Path(state_path) if state_path else sock_file.with_name(sock_file.name.removesuffix(".sock") + ".json")
    marker = Path(sys.prefix) / READY_MARKER

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
    remove_if(sock_file)
    old_umask = os.umask(0o177)
    try:
        with address(sock_file) as addr:
            listener.bind(addr)
    finally:
        os.umask(old_umask)
    os.chmod(sock_file, 0o600)
    listener.listen(64)
    inode = os.stat(sock_file).st_ino
    write_json_atomic(
        state_file,
        {
            "pid": os.getpid(),
            "version": driver.version,
            "engine": f"vllm=={driver.version}",
            "platform": os.environ.get("KVSPEC_PLATFORM", "cuda"),
            "fingerprint": fp,
            "python": sys.executable,
            "socket": str(sock_file),
            "socket_inode": inode,
            "idle_timeout_s": idle_timeout,
            "started": t0,
            "ready": time.time(),
        },
    )
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

    def leave() -> None:
        """No new client finds this engine: its socket and state go."""
        if ours():
            remove_if(sock_file, inode)
        state = None
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(state_file.read_text())
        if isinstance(state, dict) and state.get("pid") == os.getpid():
            remove_if(state_file)

    def overrun(bound: float) -> None:
        """A request ran past its own bound: this engine serves no one
        else; it leaves and exits (the next command starts a fresh one)."""
        with contextlib.suppress(Exception):
            print(
                f"{KILLED_MARK} a request ran past its time limit of {bound:.0f}s (+{OVERRUN_GRACE_S:.0f}s); this warm engine exits",
                file=sys.stderr,
                flush=True,
            )
            leave()
        os._exit(70)

    def status(idle_left_s: float) -> dict:
        """What a status request answers (``served`` and the idle time as they are now)."""
        return {
            "pid": os.getpid(),
            "fingerprint": fp,
            "served": served,
            "idle_left_s": idle_left_s,
            "version": driver.version,
        }

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
        what = _serve_connection(
            conn,
            driver,
            fp,
            lambda: status(round(max(0.0, idle_timeout - (time.monotonic() - last)), 1)),
            overrun,
        )
        if what == "used":
            served += 1
            last = time.monotonic()
            with contextlib.suppress(OSError):
                if ours():
                    os.utime(sock_file)  # `kvspec engines list` reads the idle time here
        elif what == "shutdown":
            break
    # Leave: no new client finds the socket, then serve those already queued.
    leave()
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            break
        _serve_connection(
            conn,
            driver,
            fp,
            lambda: status(0.0),
            overrun,
        )
    listener.close()
    return 0


def _request_bound(msg: dict) -> float | None:
    """The request's ``timeout_s`` (its client's time left), None when it
    has none (an older client); ValueError when it is not a bound."""
    bound = msg.get("timeout_s")
    if bound is None:
        return None
    if (
        isinstance(bound, bool)
        or not isinstance(bound, (int, float))
        or not (math.isfinite(bound) and 0 < bound <= 86400 * 7)
    ):
        raise ValueError(f"timeout_s={bound!r}: allowed: seconds, 0 < S <= 604800")
    return float(bound)


def _serve_connection(conn: socket.socket, driver, fp: str, status, overrun=None) -> str:
    """Read one request line, answer it, close. Returns ``used``,
    ``status``, ``shutdown`` or ``none`` (nothing read, or a request whose
    client hung up while it waited in the queue: skipped). A request with a
    bound (``timeout_s``) is answered ``{"event": "started"}`` first and
    watched: ``overrun(bound)`` runs if it is still running
    :data:`OVERRUN_GRACE_S` past its bound."""
    what = "none"
    try:
        conn.setblocking(True)
        raw = read_line(conn, time.monotonic() + REQUEST_READ_TIMEOUT_S)
        if raw is None:
            return what
        rid = None
        try:
            msg = decode(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            resp = {"ok": False, "error": error("protocol", f"bad request line: {e}")}
        else:
            rid = msg.get("id")
            op = msg.get("op")
            try:
                bound = _request_bound(msg)
            except ValueError as e:
                bound, resp = None, {"ok": False, "error": error("protocol", str(e))}
            else:
                resp = None
            if resp is not None:
                pass
            elif hung_up(conn):
                return what  # its client gave up waiting: run nothing for no one
            elif op == "shutdown":
                resp, what = {"ok": True, "result": {"bye": True}}, "shutdown"
            elif op == "status":
                resp, what = {"ok": True, "result": status()}, "status"
            else:
                watch = None
                if bound is not None:
                    send_line(
                        conn,
                        encode({"event": "started", "id": rid, "pid": os.getpid()}).encode(),
                        time.monotonic() + RESPONSE_SEND_TIMEOUT_S,
                    )
                    if overrun is not None:
                        watch = threading.Timer(bound + OVERRUN_GRACE_S, overrun, (bound,))
                        watch.daemon = True
                        watch.start()
                        # the backstop, for a request that holds the GIL (the
                        # thread above never runs): SIGALRM's default action
                        signal.signal(signal.SIGALRM, signal.SIG_DFL)
                        signal.setitimer(signal.ITIMER_REAL, bound + OVERRUN_GRACE_S + HARD_GRACE_S)
                try:
                    resp, what = handle(driver, msg, fp), "used"
                finally:
                    if watch is not None:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                        watch.cancel()
        send_line(conn, response_line(resp, rid).encode(), time.monotonic() + RESPONSE_SEND_TIMEOUT_S)
    except (OSError, ValueError) as e:  # the client went away or sent too much
        if isinstance(e, OSError) and e.errno not in (None, errno.EPIPE, errno.ECONNRESET):
            print(f"kvspec warm engine: connection: {e}", file=sys.stderr, flush=True)
    finally:
        conn.close()
    return what
