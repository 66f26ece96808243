"""An engine environment's zygote (``python -m engine_adapter.inside.zygote
--socket PATH --engine JSON``): import the family's engine once, then fork
one fresh worker per request, so that a worker starts in a fraction of a
second instead of re-importing the engine (vLLM 0.33.0's ``import vllm``
alone is about 22 s of CPU; a cold worker about 35 s on 2 cores).

The rule, which the host side (:mod:`engine_adapter.host.zygote`) relies
on: a forked worker is the process ``python -m MODULE ARGV`` would be once
its imports are done. The zygote imports the family's driver and nothing
else, builds no engine object and runs no case; a child takes the
request's environment (the whole of it), working folder, standard streams
(three descriptors passed over the socket) and, when asked, a new session;
then runs ``MODULE`` as ``__main__``. Variables the engine reads while it
is imported are fixed in the zygote: the host keys each zygote by its
environment's identity and kvspec's engine-side sources (the warm
engines' rule, ``engine_adapter.host.warm_state``), so a child never runs
under an import-time environment other than the one it asked for.

Forking after ``import torch`` is what PyTorch's own DataLoader workers and
vLLM's multiprocessing (``VLLM_WORKER_MULTIPROC_METHOD=fork``) do; the
zygote refuses to serve (exit 3, the host falls back to a plain start) if
the import left a second Python thread running.

The wire: one JSON request line per connection, the descriptors on its
first bytes (``SCM_RIGHTS``); the answer ``{"pid": N}``, then, when the
child ends, ``{"exit": CODE}`` (``subprocess``'s convention: minus the
signal's number when a signal ended it). ``{"op": "stop"}`` ends the zygote
once it has no child left. It exits by itself after ``--idle-timeout``
seconds without a request or a living child, or when its socket file is
replaced or removed."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

from engine_adapter.sockets import address, remove_if

#: The modules a zygote runs (``--allow`` adds one, for kvspec's own tests).
ALLOWED_MODULES = ("engine_adapter.inside.worker",)
#: Longest request line, in bytes (an environment of a few kilobytes).
MAX_REQUEST_BYTES = 1 << 20
#: Seconds a zygote waits for the request line of a connection it accepted.
REQUEST_READ_TIMEOUT_S = 10.0
#: Seconds between two looks at the socket, the children and the clock.
POLL_S = 0.2
#: The longest a zygote lives (its loop's bound in steps: this over POLL_S).
MAX_LIFETIME_S = 86400.0


def _read_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """The request line and the descriptors that came with it (ValueError
    on a line that is not a JSON object, too long or cut short)."""
    conn.settimeout(REQUEST_READ_TIMEOUT_S)
    buf = bytearray()
    fds: list[int] = []
    for _ in range(MAX_REQUEST_BYTES // 4096 + 2):
        data, got, _flags, _addr = socket.recv_fds(conn, 65536, 3)
        fds.extend(got)
        if not data:
            break
        buf += data
        if b"\n" in buf or len(buf) > MAX_REQUEST_BYTES:
            break
    if b"\n" not in buf or len(buf) > MAX_REQUEST_BYTES:
        _close_all(fds)
        raise ValueError("no request line within the size bound")
    req = json.loads(bytes(buf).split(b"\n", 1)[0])
    if not isinstance(req, dict):
        _close_all(fds)
        raise ValueError("the request is not a JSON object")
    return req, fds


def spawn_error(req: dict, fds: list[int], allowed: tuple[str, ...]) -> str | None:
    """Why a ``spawn`` request is refused, or None: three descriptors, an
    allowed module, a list of text arguments, an environment of text, a
    working folder."""
    if len(fds) != 3:
        return f"fds={len(fds)}: three descriptors (stdin, stdout, stderr)"
    if req.get("module") not in allowed:
        return f"module={req.get('module')!r}: one of {', '.join(allowed)}"
    argv, env = req.get("argv"), req.get("env")
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
        return "argv: a list of strings"
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        return "env: an object of strings"
    if not isinstance(req.get("cwd"), str):
        return "cwd: a folder"
    return None


def _close_all(fds) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _child(req: dict, fds: list[int], closing: list) -> None:
    """In the forked child: become ``python -m MODULE ARGV`` under the
    request's streams, environment and folder; never returns."""
    code = 1
    try:
        for thing in closing:
            with contextlib.suppress(OSError):
                thing.close()
        if req.get("new_session"):
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        _close_all({fd for fd in fds if fd > 2})
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = [req["module"], *req["argv"]]
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code & 0xFF)


def _send(conn: socket.socket, obj: dict) -> None:
    with contextlib.suppress(OSError):
        conn.settimeout(REQUEST_READ_TIMEOUT_S)
        conn.sendall(json.dumps(obj).encode() + b"\n")


class Zygote:
    """The serving loop's state: the listening socket, the living children
    (pid -> the connection that asked for it, where its exit is sent)."""

    def __init__(self, sock_path: Path, idle_timeout: float, allowed: tuple[str, ...]) -> None:
        self.sock_path = sock_path
        self.idle_timeout = idle_timeout
        self.allowed = allowed
        self.children: dict[int, socket.socket] = {}
        self.stopping = False
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        remove_if(sock_path)  # a stale one (the host holds the start lock: no other zygote of it starts)
        with address(sock_path) as addr:
            self.listener.bind(addr)
        os.chmod(sock_path, 0o600)  # in a 0700 folder already: this user's alone
        self.listener.listen(16)
        self.inode = os.stat(sock_path).st_ino
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)

    def serve(self) -> int:
        idle_since = time.monotonic()
        for _ in range(int(MAX_LIFETIME_S / POLL_S)):
            for _key, _ev in self.selector.select(POLL_S):
                with contextlib.suppress(OSError):
                    conn, _ = self.listener.accept()
                    self.handle(conn)
            self.reap()
            now = time.monotonic()
            if self.children:
                idle_since = now
                continue
            if self.stopping or now - idle_since > self.idle_timeout or not self._still_mine():
                break
        self.close()
        return 0

    def _still_mine(self) -> bool:
        try:
            return os.stat(self.sock_path).st_ino == self.inode
        except OSError:
            return False

    def handle(self, conn: socket.socket) -> None:
        try:
            req, fds = _read_request(conn)
        except (OSError, ValueError) as e:
            _send(conn, {"error": f"request: {e}"})
            conn.close()
            return
        op = req.get("op")
        if op == "stop":
            self.stopping = True
            remove_if(self.sock_path, self.inode)  # the next client starts a fresh zygote
            _close_all(fds)
            _send(conn, {"stopping": True, "children": len(self.children)})
            conn.close()
            return
        why = spawn_error(req, fds, self.allowed) if op == "spawn" else f"op={op!r}: spawn or stop"
        if why is not None or self.stopping:
            _close_all(fds)
            _send(conn, {"error": why or "stopping"})
            conn.close()
            return
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            _child(req, fds, [self.selector, self.listener, conn, *self.children.values()])
        _close_all(fds)
        _send(conn, {"pid": pid})
        self.children[pid] = conn

    def reap(self) -> None:
        """Send each ended child's exit code to the connection that asked for it."""
        for _ in range(len(self.children) + 1):
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
                conn.close()

    def close(self) -> None:
        remove_if(self.sock_path, self.inode)
        self.selector.close()
        self.listener.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine_adapter.inside.zygote")
    parser.add_argument("--socket", required=True, help="the Unix socket to serve on")
    parser.add_argument("--engine", default=None, help="the engine (a serialized EngineSpec); none: import nothing")
    parser.add_argument("--idle-timeout", type=float, default=600.0)
    parser.add_argument("--allow", action="append", default=[], help="one more module a child may run")
    args = parser.parse_args(argv)
    if args.engine:
        from engine_adapter.interface import get_driver
        from ground.engines import EngineSpec

        get_driver(EngineSpec.from_json(args.engine).family)  # imports the engine, once
    if threading.active_count() != 1:
        print(f"kvspec zygote: {threading.active_count()} Python threads after the imports: not forking", flush=True)
        return 3
    zygote = Zygote(Path(args.socket), args.idle_timeout, ALLOWED_MODULES + tuple(args.allow))
    print(f"kvspec zygote ready pid={os.getpid()}", flush=True)
    return zygote.serve()


if __name__ == "__main__":
    sys.exit(main())
