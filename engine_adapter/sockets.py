"""The warm wire's transport: one request line and one answer per Unix
socket connection, every read and write bounded by a deadline. Both sides
use it: the client in kvspec's interpreter (:mod:`engine_adapter.host.warm`)
and the server inside the engine's environment
(:mod:`engine_adapter.inside.warm_server`). The lines themselves are
:mod:`engine_adapter.protocol`'s."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

#: Longest request or response line, in bytes.
MAX_LINE_BYTES = 256 << 20


@contextlib.contextmanager
def address(path: Path) -> Iterator[str]:
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


def connect(path: Path, timeout: float) -> socket.socket:
    """A connection to the socket at ``path``; OSError if nobody listens."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(max(0.05, timeout))
    try:
        with address(path) as addr:
            sock.connect(addr)
    except BaseException:
        sock.close()
        raise
    return sock


def send_line(sock: socket.socket, data: bytes, deadline: float) -> None:
    sock.settimeout(max(0.05, deadline - time.monotonic()))
    sock.sendall(data)


class Lines:
    """The lines of one connection, read with a deadline each (a server
    may send an event line and its answer in one packet)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def next(self, deadline: float) -> bytes | None:
        """One line (without the newline), or None at EOF; socket.timeout past ``deadline``."""
        while True:
            end = self.buf.find(b"\n")
            if end >= 0:
                line = bytes(self.buf[:end])
                del self.buf[: end + 1]
                return line
            if len(self.buf) > MAX_LINE_BYTES:
                raise ValueError(f"a line longer than {MAX_LINE_BYTES} bytes")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("deadline")
            self.sock.settimeout(min(left, 1.0))
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            if not chunk:
                return None
            self.buf += chunk


def event_of(raw: bytes | None) -> dict | None:
    """An event line of the server (``{"event": ...}``), else None (an answer)."""
    if raw is None or not raw.startswith(b'{"event":'):
        return None
    try:
        event = json.loads(raw)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def read_line(sock: socket.socket, deadline: float) -> bytes | None:
    """One line (without the newline), or None at EOF; socket.timeout past ``deadline``."""
    return Lines(sock).next(deadline)


def hung_up(sock: socket.socket) -> bool:
    """Whether the peer of ``sock`` has closed its end (a queued client
    that gave up its wait)."""
    poller = select.poll()
    poller.register(sock, select.POLLHUP | getattr(select, "POLLRDHUP", 0))
    return bool(poller.poll(0))


def remove_if(path: Path, inode: int | None = None) -> None:
    """Unlink ``path`` (only if it still has ``inode``, when given)."""
    try:
        if inode is not None and os.stat(path).st_ino != inode:
            return
        path.unlink()
    except FileNotFoundError:
        pass
