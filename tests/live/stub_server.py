"""A small loopback HTTP stand-in for a vLLM OpenAI server, for unit tests.

It speaks the four endpoints replay uses (``/v1/models``, ``/version``,
``/metrics`` in Prometheus text, streamed ``/v1/completions``) and counts
prefix-cache queries and hits like vLLM does (queries += prompt length, hits
+= what ``hits_fn`` says at admission). Faults are injected per completion
index through :class:`Faults`. It binds 127.0.0.1 on a free port and stops
when the test ends; every wait in it is bounded.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "stub-model"


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up (a deadline, a test that stops early) is not
    an error worth a traceback on the test's stderr."""

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)


def cache_config_labels(**over) -> dict[str, str]:
    labels = {
        "block_size": "128",
        "enable_prefix_caching": "True",
        "mamba_cache_mode": "align",
        "mamba_block_size": "16",
        "prefix_match_unit": "None",
        "hash_block_size": "None",
        "prefix_cache_retention_interval": "0",
        "engine": "0",
    }
    labels.update({k: str(v) for k, v in over.items()})
    return labels


@dataclass
class Faults:
    """Per-completion-index faults (index = order of arrival at the stub)."""

    status: dict[int, list[int]] = field(default_factory=dict)  # i -> statuses to answer before succeeding
    delay_s: dict[int, float] = field(default_factory=dict)  # i -> sleep before the first chunk
    stall_s: dict[int, float] = field(default_factory=dict)  # i -> sleep between chunks
    extra_queries_during: dict[int, int] = field(default_factory=dict)  # foreign tokens counted with request i
    reset_during: set[int] = field(default_factory=set)  # counters -> 0 as request i arrives
    metrics_status: int | None = None  # answer /metrics with this status
    metrics_lag_s: float = 0.0  # counters appear this long after the stream ends
    drop_connection: set[int] = field(default_factory=set)  # close the socket before answering
    trickle_s: dict[str, float] = field(default_factory=dict)  # path -> pause before each byte of its body
    status_body: dict[int, str] = field(default_factory=dict)  # i -> body of the injected error status
    metrics_garbage_after: int | None = None  # /metrics answers 200 + garbage once this many completions arrived
    metrics_garbage: str = "<html>this is not Prometheus text</html>\n"


class StubVllm:
    def __init__(
        self,
        hits_fn: Callable[[int, list[int]], int] | None = None,
        *,
        cache_config: dict[str, str] | None = None,
        spec_positions: int | None = None,
        max_model_len: int = 16384,
        models: tuple[str, ...] = (MODEL,),
        version: str | None = "0.32.0",
        api_key: str | None = None,
        faults: Faults | None = None,
        outputs_fn: Callable[[list[int], bool], list[int]] | None = None,
    ):
        self.hits_fn = hits_fn or (lambda i, prompt: 0)
        #: (prompt, cold) -> the generated ids a request with ``logprobs``
        #: reports (cold: it carries a ``cache_salt``, as vLLM's cold twin)
        self.outputs_fn = outputs_fn or (lambda prompt, cold: [7] * 64)
        self.salted: list[list[int]] = []  # prompts sent with a cache_salt (hit 0, counted as queries)
        self.cache_config = cache_config or cache_config_labels()
        self.spec_positions = spec_positions
        self.max_model_len = max_model_len
        self.models = models
        self.version = version
        self.api_key = api_key
        self.faults = faults or Faults()
        self.lock = threading.Lock()
        self.queries = 0.0
        self.hits = 0.0
        self.running = 0
        self.finished = 0.0
        self.start_time = 1.7e9
        self.completions = 0  # arrivals (attempts)
        self.admitted: list[list[int]] = []  # prompts that were counted
        self.seen_auth: list[str | None] = []
        self._pending: list[tuple[float, float, float]] = []  # (due, queries, hits); +1 finished
        self._status_left: dict[int, list[int]] = {k: list(v) for k, v in self.faults.status.items()}
        self.httpd = _QuietServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    # ------------------------------------------------------------- lifecycle

    def __enter__(self) -> StubVllm:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)

    # ------------------------------------------------------------- state

    def _flush(self) -> None:
        now = time.monotonic()
        keep = []
        for due, q, h in self._pending:
            if due <= now:
                self.queries += q
                self.hits += h
                self.finished += 1
            else:
                keep.append((due, q, h))
        self._pending = keep

    # Between-request events, called from replay's after_request hook so that
    # they land after request i was measured and before request i+1.

    def add_foreign(self, tokens: int) -> None:
        with self.lock:
            self.queries += tokens

    def add_uncounted_foreign(self) -> None:
        """A foreign request that skipped the prefix-cache lookup
        (prompt_logprobs): it finishes but is no prefix-cache query."""
        with self.lock:
            self.finished += 1

    def reset(self) -> None:
        with self.lock:
            self._flush()
            self._pending = []
            self.queries = 0.0
            self.hits = 0.0
            self.finished = 0.0

    def restart(self) -> None:
        self.reset()
        with self.lock:
            self.start_time += 100.0

    def set_running(self, n: int) -> None:
        with self.lock:
            self.running = n

    def change_config(self, **labels) -> None:
        with self.lock:
            self.cache_config = {**self.cache_config, **{k: str(v) for k, v in labels.items()}}

    def metrics_text(self) -> str:
        with self.lock:
            self._flush()
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(self.cache_config.items()))
            lines = [
                "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
                "# TYPE process_start_time_seconds gauge",
                f"process_start_time_seconds {self.start_time}",
                "# HELP vllm:num_requests_running Number of requests in model execution batches.",
                "# TYPE vllm:num_requests_running gauge",
                f'vllm:num_requests_running{{engine="0",model_name="{self.models[0]}"}} {float(self.running)}',
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
                "# TYPE vllm:num_requests_waiting gauge",
                f'vllm:num_requests_waiting{{engine="0",model_name="{self.models[0]}"}} 0.0',
                "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.",
                "# TYPE vllm:prefix_cache_queries_total counter",
                f'vllm:prefix_cache_queries_total{{engine="0",model_name="{self.models[0]}"}} {self.queries}',
                f'vllm:prefix_cache_queries_created{{engine="0",model_name="{self.models[0]}"}} {self.start_time}',
                "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.",
                "# TYPE vllm:prefix_cache_hits_total counter",
                f'vllm:prefix_cache_hits_total{{engine="0",model_name="{self.models[0]}"}} {self.hits}',
                "# HELP vllm:request_success_total Count of successfully processed requests.",
                "# TYPE vllm:request_success_total counter",
                f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{self.models[0]}"}} {self.finished}',
                f'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="{self.models[0]}"}} 0.0',
                "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                "# TYPE vllm:cache_config_info gauge",
                f"vllm:cache_config_info{{{labels}}} 1.0",
            ]
            if self.spec_positions is not None:
                lines += [
                    "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
                    "# TYPE vllm:spec_decode_num_drafts_total counter",
                    f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="{self.models[0]}"}} 0.0',
                    "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.",
                    "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
                ]
                lines += [
                    f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="{self.models[0]}",position="{p}"}} 0.0'
                    for p in range(self.spec_positions)
                ]
            return "\n".join(lines) + "\n"

    # ------------------------------------------------------------- HTTP

    def _handler(self):
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self._write(body)

            def _write(self, data: bytes) -> None:
                pause = stub.faults.trickle_s.get(self.path.split("?")[0])
                if not pause:
                    self.wfile.write(data)
                    return
                try:  # one byte at a time, until the client gives up
                    for k in range(len(data)):
                        time.sleep(pause)
                        self.wfile.write(data[k : k + 1])
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError, OSError):
                    self.close_connection = True

            def _authorized(self) -> bool:
                auth = self.headers.get("Authorization")
                stub.seen_auth.append(auth)
                if stub.api_key is None or auth == f"Bearer {stub.api_key}":
                    return True
                self._send(401, json.dumps({"error": "Unauthorized"}).encode())
                return False

            def do_GET(self):
                if not self._authorized():
                    return
                if self.path == "/metrics":
                    if stub.faults.metrics_status:
                        self._send(stub.faults.metrics_status, b"boom", "text/plain")
                        return
                    after = stub.faults.metrics_garbage_after
                    if after is not None and stub.completions >= after:
                        self._send(200, stub.faults.metrics_garbage.encode(), "text/plain")
                        return
                    self._send(200, stub.metrics_text().encode(), "text/plain; version=0.0.4")
                elif self.path == "/v1/models":
                    data = [{"id": m, "object": "model", "max_model_len": stub.max_model_len} for m in stub.models]
                    self._send(200, json.dumps({"object": "list", "data": data}).encode())
                elif self.path == "/version" and stub.version is not None:
                    self._send(200, json.dumps({"version": stub.version}).encode())
                elif self.path == "/health":
                    self._send(200, b"")
                else:
                    self._send(404, b'{"detail":"Not Found"}')

            def do_POST(self):
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self._authorized():
                    return
                if self.path != "/v1/completions":
                    self._send(404, b'{"detail":"Not Found"}')
                    return
                with stub.lock:
                    i = stub.completions
                    stub.completions += 1
                    left = stub._status_left.get(i)
                    status = left.pop(0) if left else None
                f = stub.faults
                if i in f.drop_connection:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if status is not None:
                    body = f.status_body.get(i) or json.dumps({"error": {"message": f"injected {status}"}})
                    # A retried index keeps its number: the next attempt is the same request.
                    # Counted back before answering: once the client has the status it may
                    # return, and a test reading `completions` must not race this thread.
                    with stub.lock:
                        stub.completions -= 1
                    self._send(status, body.encode())
                    return
                prompt = body.get("prompt")
                if not isinstance(prompt, list) or body.get("temperature") != 0 or body.get("stream") is not True:
                    self._send(400, b'{"error":{"message":"bad request"}}')
                    return
                if i in f.reset_during:
                    stub.reset()
                salted = body.get("cache_salt") is not None
                with stub.lock:
                    if salted:  # vLLM salts its block keys: no cached block is shared
                        hit = 0
                        stub.salted.append(prompt)
                    else:
                        hit = stub.hits_fn(len(stub.admitted), prompt)
                        stub.admitted.append(prompt)
                    extra = f.extra_queries_during.get(i, 0)
                    stub._pending.append((time.monotonic() + f.metrics_lag_s, float(len(prompt) + extra), float(hit)))
                    stub.running = 1
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                ids = stub.outputs_fn(prompt, salted) if body.get("logprobs") else None
                try:
                    time.sleep(f.delay_s.get(i, 0.0))
                    for k in range(int(body.get("max_tokens", 1))):
                        if k:
                            time.sleep(f.stall_s.get(i, 0.0))
                        chunk = {
                            "choices": [
                                {
                                    "index": 0,
                                    "text": "x",
                                    "finish_reason": "length" if k == body["max_tokens"] - 1 else None,
                                }
                            ]
                        }
                        if ids is not None:
                            tok = f"token_id:{ids[k]}"
                            chunk["choices"][0]["logprobs"] = {
                                "tokens": [tok],
                                "token_logprobs": [-0.5],
                                "top_logprobs": [{tok: -0.5, f"token_id:{ids[k] + 1}": -1.5}],
                            }
                        self._chunk(f"data: {json.dumps(chunk)}\n\n")
                    with stub.lock:
                        stub.running = 0
                    self._chunk("data: [DONE]\n\n")
                    self._chunk("")
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with stub.lock:
                        stub.running = 0

            def _chunk(self, text: str) -> None:
                data = text.encode()
                self._write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        return Handler
