"""The engine worker's wire protocol: line-delimited JSON over stdin/stdout.

Version 1. One JSON object per line, UTF-8, no pretty-printing.

Worker -> parent, once at start::

    {"protocol": 1, "event": "hello", "engine": "vllm==0.33.0",
     "vllm_version": "0.33.0", "pid": 123, "python": "3.11.7", "import_s": 16.2}

Parent -> worker, one request per line (``id`` is echoed back)::

    {"id": 1, "op": "run", "case": {...case_to_dict...}, "options": {}}
    {"id": 2, "op": "resolve", "case": {...a deployment case...}}
    {"id": 2, "op": "ping"}
    {"id": 3, "op": "shutdown"}

Worker -> parent, one response per request::

    {"id": 1, "ok": true, "result": {...}}
    {"id": 1, "ok": false, "error": {"kind": "kvspec", "class": "Unsupported", "message": "..."}}

The same lines serve a **warm engine** (``engine_adapter.host.warm``): a
worker listening on a Unix socket, one request per connection (the client
sends one line, reads one line, closes), requests served one at a time.
A warm request also carries ``"fingerprint"`` (the client's sources); a
server running other sources answers ``{"ok": false, "error": {"kind":
"stale"}}`` without running anything. ``status`` (warm only) reports the
server's pid, fingerprint and idle seconds left without counting as use.
A warm request may carry ``"timeout_s"``, its client's time left (seconds,
0 < S <= 604800; anything else is a ``protocol`` error): the server then
sends ``{"event": "started", "id": 1, "pid": 123}`` when it begins the
request (before that the client is queued behind another one) and ends
itself if the request runs past that bound (``engine_adapter.host.warm``). A
line that starts ``{"event":`` is never an answer. A request whose client
hung up before the server began it is skipped.

``ok: true`` means the request was carried out. A ``run`` whose case made
vLLM raise is still ``ok: true``: its result carries
``"error": {"kind": "vllm", "phase", "request", "type", "message", "traceback"}``
beside the hits of the requests that finished before it. ``ok: false`` is
for requests the worker could not carry out: a case kvspec rejects
(``kind: "kvspec"``, ``class`` one of ``ground.errors``' classes), a
malformed request (``kind: "protocol"``), or a bug in the adapter itself
(``kind: "internal"``, with a traceback). The worker keeps serving after
any of these. Everything else the worker's libraries print goes to stderr;
stdout carries protocol lines only.
"""

from __future__ import annotations

import json
from typing import Any

PROTOCOL_VERSION = 1
OPS = ("run", "resolve", "ping", "shutdown", "status")
#: How the log of a warm engine killed for a request past its bound ends.
#: The ready marker of every engine environment, written last by an install
#: (``engine_adapter.host.venvs``); a warm server leaves when it changes.
READY_MARKER = ".kvspec-ready.json"
#: How the log of a warm engine killed for a request past its bound ends.
KILLED_MARK = "kvspec warm engine: killed:"


def encode(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n"


def decode(line: str) -> dict[str, Any]:
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError("a protocol line must be a JSON object")
    return obj
