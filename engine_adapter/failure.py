"""A vLLM failure on a case: what vLLM raised, in which phase, at which request.

It is a result, not a crash: the driver returns it as ``"error": {"kind":
"vllm", ...}`` beside the requests that finished before it. Only this kind
can become a finding; kvspec's own failures (``internal``, ``worker``) are
harness errors.
"""

from __future__ import annotations

import traceback

_TRACEBACK_LIMIT = 20000


class VllmFailure(Exception):
    """vLLM raised (or misbehaved) while running a case: a finding, not a crash."""

    def __init__(self, phase: str, exc: BaseException | None = None, message: str | None = None, request: int | None = None):
        self.phase = phase
        self.exc = exc
        self.request = request
        self.tb = "".join(traceback.format_exception(exc))[-_TRACEBACK_LIMIT:] if exc is not None else None
        super().__init__(message or f"{type(exc).__name__}: {exc}")

    def as_dict(self) -> dict:
        return {
            "kind": "vllm",
            "phase": self.phase,
            "request": self.request,
            "type": type(self.exc).__name__ if self.exc is not None else "EngineStall",
            "message": str(self)[:2000],
            "traceback": self.tb,
        }
