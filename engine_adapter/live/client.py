"""HTTP client for a vLLM OpenAI-compatible server (httpx; no vllm import).

Every call is bounded: a per-request timeout, and a bounded number of retries
for failures that cannot have reached the engine (connection refused or reset
before a response, 429/503). A completion that failed any other way is not
retried: it may have been admitted, and sending it again would change the
cache the next request sees. Replay re-checks every request's query delta, so
even a retried request that did reach the engine is caught there.

The API key is sent as a bearer header and is never put in an error message,
a log line, a repr or a file.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx

from engine_adapter.live.metrics import Snapshot, parse_metrics
from reference.errors import EngineError

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_RETRIES = 2
RETRY_STATUS = (429, 503)
_BACKOFF_S = (0.5, 1.0, 2.0, 4.0)


class LiveError(EngineError):
    """A request to the server failed (after the bounded retries, if any)."""


class LiveTimeout(LiveError):
    """A request to the server ran past its timeout."""


@dataclass(frozen=True)
class Completion:
    ttft_s: float | None
    latency_s: float
    finish_reason: str | None
    chunks: int
    attempts: int


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:120]}" if str(exc) else type(exc).__name__


class LiveClient:
    """``base_url`` like ``http://127.0.0.1:8000``; ``api_key`` or None."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, retries: int = DEFAULT_RETRIES):
        self.base_url = base_url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.retries = max(0, int(retries))
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # trust_env=False: no proxy from the environment may see the key or
        # the traffic; replay talks to the URL it was given, nothing else.
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=httpx.Timeout(self.timeout_s), trust_env=False)

    def __repr__(self) -> str:  # never shows headers
        return f"LiveClient({self.base_url!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "LiveClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------- plumbing

    def _get(self, path: str) -> httpx.Response:
        """GET with bounded retries (reads are safe to repeat)."""
        last = ""
        for attempt in range(self.retries + 1):
            try:
                r = self._http.get(path)
            except httpx.TimeoutException as e:
                last = _describe(e)
                if attempt == self.retries:
                    raise LiveTimeout(f"timeout_s={self.timeout_s}: GET {path} timed out after {attempt + 1} attempt(s); allowed: a response in time") from None
            except httpx.HTTPError as e:
                last = _describe(e)
            else:
                if r.status_code == 200:
                    return r
                last = f"HTTP {r.status_code}"
                if r.status_code in (401, 403):
                    raise LiveError(f"status={r.status_code}: GET {path} was refused (check --api-key-env); allowed: 200")
                if r.status_code == 404:
                    raise LiveError(f"status=404: GET {path} not found (is this a vLLM server?); allowed: 200")
            if attempt < self.retries:
                time.sleep(_BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)])
        raise LiveError(f"GET {path}: {last} after {self.retries + 1} attempt(s); allowed: HTTP 200")

    # ------------------------------------------------------------- endpoints

    def metrics_text(self) -> str:
        return self._get("/metrics").text

    def metrics(self, model: str | None = None) -> Snapshot:
        return parse_metrics(self.metrics_text(), model)

    def models(self) -> list[dict]:
        try:
            data = self._get("/v1/models").json()
        except ValueError:
            raise LiveError("GET /v1/models: body is not JSON; allowed: an OpenAI model list") from None
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise LiveError("GET /v1/models: no 'data' list; allowed: an OpenAI model list")
        return [m for m in items if isinstance(m, dict)]

    def version(self) -> str | None:
        try:
            v = self._get("/version").json().get("version")
        except (LiveError, ValueError, AttributeError):
            return None
        return v if isinstance(v, str) else None

    def complete(self, model: str, prompt: list[int], max_tokens: int) -> Completion:
        """One streamed ``/v1/completions`` request with a token-id prompt,
        read to its end. TTFT = time to the first data chunk."""
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
        }
        last = ""
        for attempt in range(self.retries + 1):
            t0 = time.monotonic()
            ttft = None
            chunks = 0
            finish = None
            try:
                with self._http.stream("POST", "/v1/completions", json=body) as r:
                    if r.status_code != 200:
                        r.read()
                        detail = _error_detail(r)
                        if r.status_code in RETRY_STATUS and attempt < self.retries:
                            last = f"HTTP {r.status_code}"
                            time.sleep(_BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)])
                            continue
                        raise LiveError(f"status={r.status_code}: POST /v1/completions failed ({detail}); allowed: 200")
                    for line in r.iter_lines():
                        if time.monotonic() - t0 > self.timeout_s:
                            raise LiveTimeout(f"timeout_s={self.timeout_s}: completion stream still open; allowed: a finished stream in time")
                        if not line.startswith("data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == "[DONE]":
                            break
                        if ttft is None:
                            ttft = time.monotonic() - t0
                        chunks += 1
                        try:
                            event = json.loads(payload)
                        except ValueError:
                            raise LiveError("stream: a data line is not JSON; allowed: OpenAI completion chunks") from None
                        if isinstance(event, dict) and "error" in event:
                            raise LiveError(f"stream: server sent an error ({str(event['error'])[:120]}); allowed: completion chunks")
                        for choice in event.get("choices") or []:
                            if choice.get("finish_reason"):
                                finish = choice["finish_reason"]
                return Completion(ttft, time.monotonic() - t0, finish, chunks, attempt + 1)
            except httpx.TimeoutException:
                raise LiveTimeout(f"timeout_s={self.timeout_s}: POST /v1/completions timed out; allowed: a finished stream in time") from None
            except (httpx.ConnectError, httpx.RemoteProtocolError) as e:
                # Connect errors never reached the engine; a protocol error
                # mid-stream may have: replay's query-delta check catches that.
                last = _describe(e)
                if isinstance(e, httpx.RemoteProtocolError) or attempt == self.retries:
                    raise LiveError(f"POST /v1/completions: {last}; allowed: a finished stream") from None
                time.sleep(_BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)])
            except httpx.HTTPError as e:
                raise LiveError(f"POST /v1/completions: {_describe(e)}; allowed: a finished stream") from None
        raise LiveError(f"POST /v1/completions: {last} after {self.retries + 1} attempt(s); allowed: HTTP 200")


def _error_detail(r: httpx.Response) -> str:
    try:
        data = r.json()
        if isinstance(data, dict):
            err = data.get("error", data.get("detail", data))
            if isinstance(err, dict):
                err = err.get("message", err)
            return str(err)[:160]
    except ValueError:
        pass
    return (r.text or "")[:160].replace("\n", " ")
