"""HTTP client for a vLLM OpenAI-compatible server (httpx; no vllm import).

Every call is bounded:

* in time: ``timeout_s`` is a wall-clock bound per request (a completion or
  one GET), connect, headers, the whole body and any retries included. Each
  phase's httpx timeout is what is left of it when the phase starts, and a
  timer shuts the socket down at the deadline, so a server that trickles its
  body a byte at a time cannot stretch it (httpx's own timeout is per read).
  Connections are not kept alive, so every request has its own socket;
* in size: a GET body (``/metrics``, ``/v1/models``, ``/version``) at most
  ``MAX_BODY_BYTES``, an error body read up to ``MAX_ERROR_BYTES``, one line
  of a completion stream at most ``MAX_LINE_BYTES``;
* in retries: a bounded number, within the same deadline, for failures that
  cannot have reached the engine (connection refused or reset before a
  response, 429/503). A completion that failed any other way is not retried:
  it may have been admitted, and sending it again would change the cache the
  next request sees. Replay re-checks every request's query delta, so even a
  retried request that did reach the engine is caught there.

The API key is sent as a bearer header and is never put in an error message,
a log line, a repr or a file: every body the server sends is passed through
:func:`redact` before anything reads it (a server may echo the key in an
error body or in ``/metrics``), and so is every message built here.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

import httpx

from engine_adapter.live.logprobs import logprobs_into
from engine_adapter.live.metrics import Snapshot, parse_metrics
from ground.errors import EngineError, invalid

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_RETRIES = 2
RETRY_STATUS = (429, 503)
_BACKOFF_S = (0.5, 1.0, 2.0, 4.0)
#: Largest GET body read (vLLM's /metrics is a few hundred KiB).
MAX_BODY_BYTES = 8 << 20
#: How much of an error body is read (only 160 characters are shown).
MAX_ERROR_BYTES = 64 << 10
#: Longest line of a completion stream (one event is a few hundred bytes).
MAX_LINE_BYTES = 1 << 20
REDACTED = "[redacted]"
_BEARER = re.compile(r"(?i)\bbearer(\s+)(?!\[redacted\])[^\s\"',;]+")


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
    #: With ``logprobs``: the generated token ids and, per token, its top
    #: ``[id, logprob]`` pairs (``return_tokens_as_token_ids``), else None.
    output_ids: list[int] | None = None
    top_logprobs: list[list[list]] | None = None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:120]}" if str(exc) else type(exc).__name__


def redact(text: str, secret: str | None) -> str:
    """``text`` with the API key replaced by ``[redacted]``: the key as is,
    stripped, JSON-, repr- and URL-escaped, and any ``Bearer <token>``.
    The one helper through which every live body, message and report goes."""
    if not text:
        return text
    if secret:
        forms = {secret, secret.strip(), json.dumps(secret)[1:-1], repr(secret)[1:-1], quote(secret, safe="")} - {""}
        for form in sorted(forms, key=len, reverse=True):
            text = text.replace(form, REDACTED)
    return _BEARER.sub(lambda m: f"Bearer{m.group(1)}{REDACTED}", text)


def _shown_url(url: str) -> str:
    """A URL as an error may show it: any ``user:password@`` part masked,
    without parsing (the URL may not parse)."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@", r"\1***@", url)


def check_base_url(url: object, field: str = "--server") -> str:
    """An http(s) base URL: scheme http or https, a host, a port (when
    given) an integer in 1-65535, a bracketed IPv6 host well-formed, no
    whitespace, query or fragment. Credentials in it are never shown."""
    if not isinstance(url, str) or not url:
        raise invalid(field, url, "must be an http:// or https:// URL")
    shown = _shown_url(url)
    if len(url) > 2048 or any(c.isspace() or not c.isprintable() for c in url):
        raise invalid(
            field, shown[:200], "must be an http:// or https:// URL of at most 2048 printable characters, no spaces"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
        host = parts.hostname
    except ValueError as e:
        raise invalid(
            field,
            shown,
            f"is not a valid URL ({e}); allowed: http(s)://HOST[:PORT], an IPv6 host in brackets, PORT 1-65535",
        ) from None
    if parts.scheme not in ("http", "https"):
        raise invalid(field, shown, "must be an http:// or https:// URL")
    if not host:
        raise invalid(field, shown, "has no host; allowed: http(s)://HOST[:PORT]")
    if port == 0:
        raise invalid(field, shown, "port 0; allowed: a port in 1-65535")
    if "[" in parts.netloc:
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise invalid(
                field, shown, "the bracketed host is not an IPv6 address; allowed: http://[::1]:8000"
            ) from None
    if parts.query or parts.fragment:
        raise invalid(field, shown, "has a query or fragment; allowed: a base URL such as http://127.0.0.1:8000")
    try:
        httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError) as e:
        raise invalid(field, shown, f"is not a valid URL ({str(e)[:80]})") from None
    return url


def split_lines(chunks: Iterable[bytes], limit: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The lines (``\\n`` or ``\\r\\n``) of a byte stream, decoded as UTF-8
    (invalid bytes replaced); a line longer than ``limit`` bytes raises."""
    buf = b""
    for chunk in chunks:
        buf += chunk
        while True:
            cut = buf.find(b"\n")
            if cut < 0:
                break
            line, buf = buf[:cut], buf[cut + 1 :]
            yield line.rstrip(b"\r").decode("utf-8", "replace")
        if len(buf) > limit:
            raise LiveError(f"stream: a line longer than {limit} bytes; allowed: server-sent events")
    if buf:
        yield buf.rstrip(b"\r").decode("utf-8", "replace")


class _Expired(Exception):
    """The request's deadline passed (raised between reads)."""


def is_loopback_host(host: str | None) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ``::1``)."""

    if not host:
        return False
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_key_transport(url: str, has_key: bool, *, in_clear_ok: bool = False, field: str = "--server") -> None:
    """A key goes over https, or over plain http to a loopback host only;
    plain http to any other host only when the user says so
    (``--send-key-in-clear``). Checked before any connection is made."""
    if not has_key or in_clear_ok:
        return
    parts = urlsplit(url)
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        raise invalid(
            field,
            _shown_url(url),
            "would send the API key in clear (plain http to a host that is not loopback); "
            "allowed: https://, http:// to 127.0.0.1/::1/localhost, or --send-key-in-clear to accept the risk",
        )


class LiveClient:
    """``base_url`` like ``http://127.0.0.1:8000``; ``api_key`` or None."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
    ):
        self.base_url = check_base_url(base_url, "base_url").rstrip("/")
        self.timeout_s = float(timeout_s)
        self.retries = max(0, int(retries))
        self._secret = api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # identity: no compressed body whose size we cannot bound as we read.
        headers["Accept-Encoding"] = "identity"
        # trust_env=False: no proxy from the environment may see the key or
        # the traffic; replay talks to the URL it was given, nothing else.
        # No keep-alive: every request opens its own socket, which the
        # deadline timer may shut down without touching another request.
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(self.timeout_s),
            trust_env=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    def __repr__(self) -> str:  # never shows headers
        return f"LiveClient({self.base_url!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LiveClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------- plumbing

    def _redact(self, text: str) -> str:
        """``text`` without this client's API key (:func:`redact`)."""
        return redact(text, self._secret)

    @contextmanager
    def _bounded(self, method: str, path: str, deadline: float, body: dict | None = None) -> Iterator[httpx.Response]:
        """A streamed request that ends by ``deadline`` (time.monotonic()).

        Each phase (connect, send, headers, body) gets as its httpx timeout
        what is left when it starts (httpcore's ``trace`` extension says
        when), and a timer shuts the socket down at the deadline, so that a
        read blocked mid-body returns at once."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Expired
        timeouts = {"connect": left, "read": left, "write": left, "pool": left}
        streams: list = []

        def trace(event: str, info: dict) -> None:
            if event.endswith(".started"):
                rest = max(deadline - time.monotonic(), 0.001)
                for k in timeouts:
                    timeouts[k] = rest
            elif event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
                streams.append(info.get("return_value"))

        def expire() -> None:
            for stream in list(streams):
                try:
                    stream.get_extra_info("socket").shutdown(socket.SHUT_RDWR)
                except (OSError, AttributeError):  # already closed, or not a socket
                    pass

        timer = threading.Timer(left, expire)
        timer.daemon = True
        timer.start()
        try:
            request = self._http.build_request(
                method, path, json=body, extensions={"timeout": timeouts, "trace": trace}
            )
            response = self._http.send(request, stream=True)
            try:
                yield response
            finally:
                response.close()
        finally:
            timer.cancel()

    @staticmethod
    def _body(response: httpx.Response, deadline: float, limit: int, *, cut: bool = False) -> bytes | None:
        """The body, read chunk by chunk until ``deadline``; None when it is
        longer than ``limit`` bytes (or, with ``cut``, its first ``limit``)."""
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                if cut:
                    return b"".join(chunks)[:limit]
                return None
            if time.monotonic() >= deadline:
                raise _Expired
        return b"".join(chunks)

    def _sleep(self, attempt: int, deadline: float) -> bool:
        """Back off before a retry; False when no time is left for one."""
        pause = _BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)]
        if time.monotonic() + pause >= deadline:
            return False
        time.sleep(pause)
        return True

    def _get(self, path: str, limit: int = MAX_BODY_BYTES) -> str:
        """GET with bounded retries (reads are safe to repeat), all within
        timeout_s of wall-clock time; the body (redacted) as text."""
        last = ""
        deadline = time.monotonic() + self.timeout_s
        for attempt in range(self.retries + 1):
            try:
                with self._bounded("GET", path, deadline) as r:
                    if r.status_code == 200:
                        data = self._body(r, deadline, limit)
                        if data is None:
                            raise LiveError(f"GET {path}: body larger than {limit} bytes; allowed: at most {limit}")
                        return self._redact(data.decode("utf-8", "replace"))
                    status = r.status_code
                    self._body(r, deadline, MAX_ERROR_BYTES, cut=True)  # read (bounded), so the socket closes cleanly
                last = f"HTTP {status}"
                if status in (401, 403):
                    raise LiveError(f"status={status}: GET {path} was refused (check --api-key-env); allowed: 200")
                if status == 404:
                    raise LiveError(f"status=404: GET {path} not found (is this a vLLM server?); allowed: 200")
            except (_Expired, httpx.TimeoutException):
                raise LiveTimeout(
                    f"timeout_s={self.timeout_s}: GET {path} did not finish in time ({attempt + 1} attempt(s)); allowed: a whole response in time"
                ) from None
            except httpx.HTTPError as e:
                if time.monotonic() >= deadline:  # the deadline timer shut the socket
                    raise LiveTimeout(
                        f"timeout_s={self.timeout_s}: GET {path} did not finish in time ({attempt + 1} attempt(s)); allowed: a whole response in time"
                    ) from None
                last = self._redact(_describe(e))
            if attempt < self.retries and not self._sleep(attempt, deadline):
                break
        raise LiveError(f"GET {path}: {last} after {attempt + 1} attempt(s); allowed: HTTP 200")

    # ------------------------------------------------------------- endpoints

    def metrics_text(self) -> str:
        return self._get("/metrics")

    def metrics(self, model: str | None = None) -> Snapshot:
        return parse_metrics(self.metrics_text(), model)

    def models(self) -> list[dict]:
        try:
            data = json.loads(self._get("/v1/models"))
        except (ValueError, RecursionError):
            raise LiveError("GET /v1/models: body is not JSON; allowed: an OpenAI model list") from None
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise LiveError("GET /v1/models: no 'data' list; allowed: an OpenAI model list")
        return [m for m in items if isinstance(m, dict)]

    def version(self) -> str | None:
        try:
            v = json.loads(self._get("/version")).get("version")
        except (LiveError, ValueError, AttributeError, RecursionError):
            return None
        return v if isinstance(v, str) else None

    def complete(
        self,
        model: str,
        prompt: list[int],
        max_tokens: int,
        *,
        logprobs: int | None = None,
        cache_salt: str | None = None,
    ) -> Completion:
        """One streamed ``/v1/completions`` request with a token-id prompt,
        read to its end within timeout_s of wall-clock time (retries
        included). TTFT = time to the first data chunk. ``logprobs``: also
        the generated ids and their top log-probabilities (the output
        oracle); ``cache_salt``: vLLM's per-request salt of the prefix-cache
        keys, so the request shares no cached block (a cold run)."""
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
        }
        if logprobs is not None:
            body |= {"logprobs": int(logprobs), "return_tokens_as_token_ids": True}
        if cache_salt is not None:
            body["cache_salt"] = str(cache_salt)
        last = ""
        deadline = time.monotonic() + self.timeout_s
        late = f"timeout_s={self.timeout_s}: POST /v1/completions did not finish in time; allowed: a finished stream in time"
        for attempt in range(self.retries + 1):
            t0 = time.monotonic()
            ttft = None
            chunks = 0
            finish = None
            ids: list[int] = []
            tops: list[list[list]] = []
            try:
                with self._bounded("POST", "/v1/completions", deadline, body) as r:
                    if r.status_code != 200:
                        status = r.status_code
                        detail = _error_detail(self._body(r, deadline, MAX_ERROR_BYTES, cut=True) or b"", self._secret)
                        if status in RETRY_STATUS and attempt < self.retries:
                            last = f"HTTP {status}"
                            if self._sleep(attempt, deadline):
                                continue
                        raise LiveError(f"status={status}: POST /v1/completions failed ({detail}); allowed: 200")
                    done = False
                    for line in split_lines(_until(r.iter_bytes(), deadline)):
                        if done or not line.startswith("data:"):
                            continue  # after [DONE]: read the body to its end, so the socket closes cleanly
                        payload = line[5:].strip()
                        if payload == "[DONE]":
                            done = True
                            continue
                        if ttft is None:
                            ttft = time.monotonic() - t0
                        chunks += 1
                        try:
                            event = json.loads(payload)
                        except (ValueError, RecursionError):
                            raise LiveError(
                                "stream: a data line is not JSON; allowed: OpenAI completion chunks"
                            ) from None
                        if isinstance(event, dict) and "error" in event:
                            raise LiveError(
                                f"stream: server sent an error ({self._redact(str(event['error']))[:120]}); allowed: completion chunks"
                            )
                        finish = _finish_reason(event) or finish
                        if logprobs is not None:
                            logprobs_into(event, ids, tops)
                return Completion(
                    ttft,
                    time.monotonic() - t0,
                    finish,
                    chunks,
                    attempt + 1,
                    ids if logprobs is not None else None,
                    tops if logprobs is not None else None,
                )
            except (_Expired, httpx.TimeoutException):
                raise LiveTimeout(late) from None
            except (httpx.ConnectError, httpx.RemoteProtocolError) as e:
                if time.monotonic() >= deadline:  # the deadline timer shut the socket
                    raise LiveTimeout(late) from None
                # Connect errors never reached the engine; a protocol error
                # mid-stream may have: replay's query-delta check catches that.
                last = self._redact(_describe(e))
                if isinstance(e, httpx.RemoteProtocolError) or attempt == self.retries:
                    raise LiveError(f"POST /v1/completions: {last}; allowed: a finished stream") from None
                if not self._sleep(attempt, deadline):
                    break
            except httpx.HTTPError as e:
                if time.monotonic() >= deadline:
                    raise LiveTimeout(late) from None
                raise LiveError(
                    f"POST /v1/completions: {self._redact(_describe(e))}; allowed: a finished stream"
                ) from None
        raise LiveError(f"POST /v1/completions: {last} after {attempt + 1} attempt(s); allowed: HTTP 200")


def _until(chunks: Iterable[bytes], deadline: float) -> Iterator[bytes]:
    """The chunks of a body while time.monotonic() < deadline."""
    for chunk in chunks:
        if time.monotonic() >= deadline:
            raise _Expired
        yield chunk


def _finish_reason(event: object) -> str | None:
    """The last finish_reason of an OpenAI completion chunk, if any."""
    choices = event.get("choices") if isinstance(event, dict) else None
    reason = None
    for choice in choices if isinstance(choices, list) else ():
        if isinstance(choice, dict) and choice.get("finish_reason"):
            reason = str(choice["finish_reason"])
    return reason


def _error_detail(body: bytes, secret: str | None) -> str:
    """What an error body says (its error message, else its text): redacted,
    one line, at most 160 characters."""
    text = redact(body.decode("utf-8", "replace"), secret)
    try:
        data = json.loads(text)
        if isinstance(data, dict):
            err = data.get("error", data.get("detail", data))
            if isinstance(err, dict):
                err = err.get("message", err)
            return redact(str(err), secret)[:160].replace("\n", " ")
    except (ValueError, RecursionError):
        pass
    return text[:160].replace("\n", " ")
