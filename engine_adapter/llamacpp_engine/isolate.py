"""One llama.cpp server per process, as ``llama-server`` runs it: every
case (and every resolution) runs in a forked child of the worker, so no
process-wide state of one server reaches the next.

Why: llama.cpp keeps process-wide state across servers. ``update_slots``
declares ``static const int checkpoint_offsets[] = {4 + n_ubatch, 4};``
(tools/server/server-context.cpp, snapshot 001d906a; finding L1,
docs/llamacpp.md): a function-local static, set by the first server of the
process that makes a checkpoint. A later server of another ``n_ubatch``
in the same process places its checkpoints with the first one's. The
worker never starts a server itself; a child that starts one exits after
its case (``os._exit``: the worker's buffered output is not flushed twice).

The child never destroys a server: ``xllamacpp.Server``'s destructor joins
the server thread after signalling it to stop, and a server deleted right
after it started can miss that signal and wait forever (seen here: the
join in ``xllamacpp::Server::~Server``, the server thread still in
``server_queue::start_loop``). A child keeps its servers (:data:`KEEP`)
and exits after its case; the process's exit frees them.

The child's answer comes back as JSON through a pipe, read bounded
(:data:`MAX_REPLY_BYTES`, :data:`CHILD_TIMEOUT_S`: a child that has not
answered by then is killed and reported). A ``KvspecError`` the child raises (a refusal:
``Unsupported``, ``InvalidArgument``) is raised again here, same class; a
child that dies without answering (a signal, an exit) is a harness error
of kind ``worker``: kvspec cannot tell llama.cpp's abort from its own.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
import traceback
from collections.abc import Callable

from ground import errors
from ground.printable import one_line

#: The most a child's answer may take (an observation of 64 requests with
#: top log-probabilities is far below).
MAX_REPLY_BYTES = 64 * 2**20
#: The most a case's child may take (a case of 64 requests of 16,384
#: tokens with its cold server is far below on one thread).
CHILD_TIMEOUT_S = 900.0
#: True in a case's child: servers are kept (:data:`KEEP`), never destroyed.
IN_CHILD = False
#: The servers a child keeps until it exits.
KEEP: list = []


def _reply(fn: Callable[[], dict]) -> bytes:
    try:
        return json.dumps({"ok": fn()}).encode()
    except errors.KvspecError as e:
        return json.dumps({"raise": type(e).__name__, "message": str(e)}).encode()
    except BaseException as e:  # noqa: BLE001 - carried to the worker as kvspec's own failure
        return json.dumps(
            {"internal": type(e).__name__, "message": one_line(e, 500), "traceback": traceback.format_exc()[-4000:]}
        ).encode()


def keep(server) -> None:
    """Keep ``server`` alive until the child exits (a no-op elsewhere)."""
    if IN_CHILD:
        KEEP.append(server)


def in_child(fn: Callable[[], dict], timeout_s: float = CHILD_TIMEOUT_S) -> dict:
    """``fn()`` run in a forked child; its result (a JSON-able dict), or its
    ``KvspecError`` raised again; a child that died, as an observation
    carrying a ``worker`` error."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer, then exit without running the worker's exit handlers
        global IN_CHILD
        IN_CHILD = True
        code = 0
        try:
            os.close(r)
            data = _reply(fn)
            with os.fdopen(w, "wb") as f:
                f.write(data)
        except BaseException:  # noqa: BLE001 - nothing to report to: the parent sees no answer
            code = 70
        finally:
            os._exit(code)
    os.close(w)
    data, timed_out = _read_bounded(r, timeout_s)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if timed_out:
        return _died(f"the case's child process did not answer within {timeout_s:g} s; killed")
    if not data or len(data) > MAX_REPLY_BYTES:
        why = (
            f"killed by signal {signal.Signals(-os.waitstatus_to_exitcode(status)).name}"
            if os.WIFSIGNALED(status)
            else f"exited {os.waitstatus_to_exitcode(status)}"
        )
        size = "no answer" if not data else f"an answer over {MAX_REPLY_BYTES} bytes"
        return _died(f"the case's child process {why} with {size}")
    reply = json.loads(data)
    if "ok" in reply:
        return reply["ok"]
    if "raise" in reply:
        cls = getattr(errors, reply["raise"], None)
        if not (isinstance(cls, type) and issubclass(cls, errors.KvspecError)):
            cls = errors.KvspecError
        raise cls(reply["message"])
    return _died(f"{reply['internal']}: {reply['message']}", reply.get("traceback"))


def _read_bounded(fd: int, timeout_s: float) -> tuple[bytes, bool]:
    """What the child writes until it closes the pipe, at most
    ``MAX_REPLY_BYTES + 1`` bytes, within ``timeout_s``; (data, timed out)."""
    deadline = time.monotonic() + timeout_s
    chunks, size = [], 0
    try:
        while size <= MAX_REPLY_BYTES:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return b"".join(chunks), True
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks), False


def _died(message: str, tb: str | None = None) -> dict:
    err = {"kind": "worker", "phase": "child", "request": None, "type": "ChildProcess", "message": message}
    if tb:
        err["traceback"] = tb
    return {"hits": [], "queries": [], "knobs": None, "explain": [], "error": err}
