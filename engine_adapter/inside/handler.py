"""What a worker does with one decoded request, whichever way it came
(a pipe: :mod:`engine_adapter.inside.worker`; a warm engine's socket:
:mod:`engine_adapter.inside.warm_server`): ``run`` and ``resolve`` go to the
family's driver, ``ping`` answers, anything else is a ``protocol`` error.
kvspec's own refusal is ``kind: "kvspec"``; a bug of the adapter is
``kind: "internal"`` with its traceback; the worker keeps serving."""

from __future__ import annotations

import gc
import os
import traceback

from engine_adapter.protocol import OPS, encode
from ground.errors import KvspecError


def error(kind: str, message: str, cls: str | None = None, tb: str | None = None) -> dict:
    err = {"kind": kind, "message": message}
    if cls:
        err["class"] = cls
    if tb:
        err["traceback"] = tb[-20000:]
    return err


def handle(driver, msg: dict, fingerprint: str | None = None) -> dict:
    """Carry out one decoded request (``run``, ``resolve``, ``ping``); the
    response without its ``id``. A warm server (``fingerprint`` set) refuses
    a request that names another fingerprint (``kind: "stale"``): the client
    then starts a server of its own sources."""
    try:
        op = msg.get("op")
        want = msg.get("fingerprint")
        if fingerprint is not None and want is not None and want != fingerprint:
            return {
                "ok": False,
                "error": error(
                    "stale", f"this warm server runs fingerprint {fingerprint[:12]}, the client {str(want)[:12]}"
                ),
            }
        if op not in OPS:
            return {"ok": False, "error": error("protocol", f"op={op!r}: allowed: {', '.join(OPS)}")}
        if op == "ping":
            pong = {"pong": True, "vllm_version": driver.version}
            if fingerprint is not None:
                pong.update(pid=os.getpid(), fingerprint=fingerprint)
            return {"ok": True, "result": pong}
        if op == "resolve":
            return {"ok": True, "result": driver.resolve(msg.get("case"))}
        if op == "run":
            options = msg.get("options") or {}
            if not isinstance(options, dict):
                raise TypeError("options must be an object")
            return {"ok": True, "result": driver.run(msg.get("case"), options)}
        return {"ok": False, "error": error("protocol", f"op={op!r}: not served here")}
    except KvspecError as e:
        return {"ok": False, "error": error("kvspec", str(e), type(e).__name__)}
    except Exception as e:  # an adapter bug: report it, keep serving
        return {"ok": False, "error": error("internal", f"{type(e).__name__}: {e}", tb=traceback.format_exc())}


def settle() -> None:
    """After vLLM's import: move everything allocated so far out of the
    garbage collector's reach (``gc.freeze``), so that the collections a
    long-lived engine process triggers case after case walk only what the
    cases allocate, not vLLM's and torch's modules."""
    gc.collect()
    gc.freeze()


def response_line(resp: dict, rid: object) -> str:
    """A response as its protocol line, with the request's ``id``; a result
    JSON cannot carry (NaN) becomes an ``internal`` error instead."""
    resp["id"] = rid
    try:
        return encode(resp)
    except ValueError as e:
        return encode({"id": rid, "ok": False, "error": error("internal", f"result not encodable: {e}")})
