"""The live replay's transport: what a case's requests do on a running vLLM
server, measured, never judged (the verdict is :mod:`fuzz.replaying.live_replay`'s).

Each request is a streamed token-id ``/v1/completions`` read to its end;
around it (around a concurrent wave, the wave as a whole) ``/metrics`` is
scraped and the deltas of ``vllm:prefix_cache_queries_total`` and
``vllm:prefix_cache_hits_total`` taken, each bounded in time
(:data:`SETTLE_S`, :data:`IDLE_WAIT_S`). Anything that makes a
measurement untrustworthy (foreign traffic, a restart, a counter that went
down, a request that failed) is recorded on the request's :class:`LiveRow` as
an issue, for the judge to weigh.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine_adapter.live.client import Completion, LiveClient
from engine_adapter.live.geometry import ServerInfo
from engine_adapter.live.metrics import Snapshot
from ground.errors import EngineError, InvalidArgument, Unsupported
from reference.case import prompt_tokens

#: How long one scheduler step is taken to last when a concurrent wave's
#: ``arrival`` (in steps) is turned into a delay on a live server.
DEFAULT_STEP_S = 0.05
#: How long to wait for the counters to show a finished request.
SETTLE_S = 10.0
SETTLE_POLL_S = 0.05
IDLE_WAIT_S = 10.0


@dataclass
class LiveRow:
    index: int
    prompt_tokens: int
    max_tokens: int
    expected: int | None
    target: int | None
    hits: float | None = None
    queries: float | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    issues: list[str] = field(default_factory=list)
    sent: bool = False
    #: The prediction under the rule the server's vLLM version implements.
    implemented: int | None = None
    #: A finding's own expected hits (what the judge checks its oracle against).
    finding_expected: int | None = None
    #: A request the model does not predict (it shared the server): the
    #: most it can hit whatever the batching (``reference.predict.resume_bounds``).
    bound: int | None = None
    #: With the output oracle (``Sender(outputs=True)``): the generated ids
    #: and top log-probabilities of the request and of its cold twin (the
    #: same request with a fresh ``cache_salt``: no cached block shared).
    output_ids: list[int] | None = None
    top_logprobs: list | None = None
    cold_output_ids: list[int] | None = None
    cold_top_logprobs: list | None = None


def number_text(x: float | None) -> str:
    return "-" if x is None else str(int(x)) if float(x).is_integer() else f"{x:g}"


def pick_model(client: LiveClient, requested: str | None) -> tuple[str, int | None, tuple[str, ...]]:
    models = client.models()
    ids = tuple(str(m.get("id")) for m in models if m.get("id") is not None)
    if not ids:
        raise Unsupported("server /v1/models=[]: no model is served; allowed: one or more models")
    if requested is None:
        if len(ids) > 1:
            raise InvalidArgument(
                f"--model=None: the server serves {len(ids)} models ({', '.join(ids[:5])}); allowed: one of them"
            )
        requested = ids[0]
    elif requested not in ids:
        raise InvalidArgument(f"--model={requested!r}: not served; allowed: {', '.join(ids[:10])}")
    entry = next(m for m in models if m.get("id") == requested)
    max_len = entry.get("max_model_len")
    return requested, (int(max_len) if isinstance(max_len, int) else None), ids


def server_info(client: LiveClient, model: str | None) -> ServerInfo:
    name, max_len, ids = pick_model(client, model)
    snap = client.metrics(name)
    return ServerInfo(name, ids, max_len, client.version(), snap.cache_config, snap.spec_positions)


def wait_idle(client: LiveClient, model: str, deadline_s: float) -> Snapshot:
    t_end = time.monotonic() + deadline_s
    for _ in range(int(deadline_s / 0.5) + 1):
        snap = client.metrics(model)
        if not (snap.running or snap.waiting) or time.monotonic() >= t_end:
            return snap
        time.sleep(0.5)
    return snap


def settle(
    client: LiveClient, model: str, pre: Snapshot, prompt_len: int, settle_s: float, count: int = 1
) -> tuple[Snapshot, bool]:
    """Poll until the counters show our ``count`` request(s) of
    ``prompt_len`` tokens in all (bounded)."""
    t_end = time.monotonic() + settle_s
    snap = client.metrics(model)
    for _ in range(int(settle_s / SETTLE_POLL_S) + 1):
        if (
            snap.queries is None
            or pre.queries is None
            or snap.queries < pre.queries
            or (snap.hits or 0) < (pre.hits or 0)
        ):
            return snap, False  # missing or went down: the caller says which
        finished = pre.finished is None or (snap.finished is not None and snap.finished - pre.finished >= count)
        if snap.queries - pre.queries >= prompt_len and not snap.running and finished:
            return snap, True
        if time.monotonic() >= t_end:
            break
        time.sleep(SETTLE_POLL_S)
        snap = client.metrics(model)
    return snap, False


def counter_issue(before: Snapshot, after: Snapshot, when: str) -> str | None:
    if before.start_time is not None and after.start_time is not None and after.start_time != before.start_time:
        return f"server restarted {when} (process_start_time changed)"
    for name, a, b in (("queries", before.queries, after.queries), ("hits", before.hits, after.hits)):
        if a is None or b is None:
            return f"prefix_cache_{name}_total missing {when}"
        if b < a:
            return (
                f"prefix_cache_{name}_total went down {when} ({number_text(a)} -> {number_text(b)}: restart or reset)"
            )
    return None


#: Top log-probabilities the output oracle asks for (as llama.cpp's driver).
OUTPUT_LOGPROBS = 5


class Sender:
    """Sends the trace's waves and measures each around it. ``one`` sends a
    request alone (the rules of the module docstring); ``wave`` sends the
    requests of a concurrent wave, each ``arrival x step_s`` seconds after
    the previous one, every one read to its end on its own thread, and
    measures the wave as a whole (the counters cannot tell its requests
    apart): the query delta must be the sum of its prompt lengths (a
    request looked up twice, deferred or preempted, makes it inconclusive)
    and its finished count its size. Each returns False when the replay
    must stop (something failed after a request was sent). ``waves`` holds
    one entry per concurrent wave: its requests and their summed hits and
    queries."""

    def __init__(
        self,
        client: LiveClient,
        model: str,
        first: Snapshot,
        settle_s: float,
        notes: list[str],
        outputs_salt: str | None = None,
    ):
        self.client, self.model, self.first, self.settle_s, self.notes = client, model, first, settle_s, notes
        self.prev = first
        #: The output oracle: each request again with ``cache_salt`` = this + its index (None: off).
        self.outputs_salt = outputs_salt
        self.waves: list[dict] = []
        self.stopped = False

    def _before(self, row: LiveRow) -> Snapshot | None:
        """The counters before a send; the issues they show go to ``row``."""
        try:
            pre = self.client.metrics(self.model)
        except EngineError as e:  # unreachable, timed out, or not Prometheus text
            row.issues.append(f"metrics before the request unreadable: {e}")
            return None
        prev = self.prev
        issue = counter_issue(prev, pre, "between requests")
        if issue:
            row.issues.append(issue)
        elif (pre.queries, pre.hits) != (prev.queries, prev.hits):
            row.issues.append(
                f"counters moved between requests (queries +{number_text(pre.queries - prev.queries)}, hits +{number_text(pre.hits - prev.hits)}): foreign traffic"
            )
        elif pre.finished != prev.finished:
            row.issues.append(
                f"requests finished between ours (request_success_total +{number_text((pre.finished or 0) - (prev.finished or 0))}): foreign traffic"
            )
        if pre.running or pre.waiting:
            row.issues.append(
                f"foreign traffic: running={number_text(pre.running)} waiting={number_text(pre.waiting)} before the request"
            )
        if pre.cache_config != self.first.cache_config:
            row.issues.append("vllm:cache_config_info changed during the replay")
        return pre

    def _after(self, row: LiveRow, pre: Snapshot, prompt_len: int, count: int) -> tuple[float, float] | None:
        """The query and hit deltas of ``count`` requests of ``prompt_len``
        tokens in all, once the counters settled (None when they cannot be
        taken; ``stopped`` when the counters could not be read); issues go
        to ``row``."""
        try:
            post, settled = settle(self.client, self.model, pre, prompt_len, self.settle_s, count)
        except EngineError as e:  # something was sent: a verdict (inconclusive) with a report, not a refusal
            row.issues.append(f"metrics after the request unreadable: {e}")
            self.stopped = True
            return None
        measured = None
        issue = counter_issue(pre, post, "during the request")
        if issue:
            row.issues.append(issue)
        else:
            queries, hits = post.queries - pre.queries, post.hits - pre.hits
            measured = queries, hits
            if not settled and queries < prompt_len:
                row.issues.append(
                    f"metrics did not settle in {self.settle_s:g} s (query delta {number_text(queries)} of {prompt_len})"
                )
            elif queries != prompt_len:
                if count == 1:
                    row.issues.append(
                        f"query delta {number_text(queries)} != prompt length {prompt_len}: foreign traffic or preemption"
                    )
                else:
                    row.issues.append(
                        f"query delta {number_text(queries)} != the wave's prompt lengths {prompt_len}: foreign traffic, or a request looked up twice (deferred or preempted)"
                    )
            if hits > queries:
                row.issues.append(f"hit delta {number_text(hits)} > query delta {number_text(queries)}")
            if pre.finished is not None and post.finished is not None and post.finished - pre.finished != count:
                ours = "our one request" if count == 1 else f"our wave of {count} requests"
                row.issues.append(
                    f"request_success_total +{number_text(post.finished - pre.finished)} during {ours}: foreign traffic"
                )
        if post.cache_config != self.first.cache_config:
            row.issues.append("vllm:cache_config_info changed during the replay")
        self.prev = post
        return measured

    def _completed(self, row: LiveRow, done: Completion) -> None:
        row.ttft_s, row.latency_s = done.ttft_s, done.latency_s
        if done.attempts > 1:
            self.notes.append(f"request {row.index}: sent {done.attempts} times (connection retries)")

    def one(self, req, row: LiveRow) -> bool:
        pre = self._before(row)
        if pre is None:
            return False
        tokens = prompt_tokens(req)
        logprobs = OUTPUT_LOGPROBS if self.outputs_salt is not None else None
        try:
            row.sent = True
            done = self.client.complete(self.model, tokens, req.max_tokens, logprobs=logprobs)
        except EngineError as e:
            row.issues.append(str(e))
            return False
        self._completed(row, done)
        row.output_ids, row.top_logprobs = done.output_ids, done.top_logprobs
        measured = self._after(row, pre, len(tokens), 1)
        if measured is not None:
            row.queries, row.hits = measured
        if self.outputs_salt is not None and not self.stopped:
            return self._cold(req, row, tokens)
        return not self.stopped

    def _cold(self, req, row: LiveRow, tokens: list[int]) -> bool:
        """The request's cold twin (a fresh ``cache_salt``): its outputs,
        and the counters settled past it (it is our traffic, not foreign)."""
        try:
            cold = self.client.complete(
                self.model,
                tokens,
                req.max_tokens,
                logprobs=OUTPUT_LOGPROBS,
                cache_salt=f"{self.outputs_salt}-{row.index}",
            )
            post, _settled = settle(self.client, self.model, self.prev, len(tokens), self.settle_s, 1)
        except EngineError as e:
            row.issues.append(f"the cold twin (cache_salt) failed: {e}")
            return False
        row.cold_output_ids, row.cold_top_logprobs = cold.output_ids, cold.top_logprobs
        self.prev = post
        return True

    def wave(self, reqs: list, rows: list[LiveRow], step_s: float) -> bool:
        from concurrent.futures import ThreadPoolExecutor

        head = rows[0]
        pre = self._before(head)
        if pre is None:
            return False
        prompts = [prompt_tokens(r) for r in reqs]
        with ThreadPoolExecutor(max_workers=len(reqs), thread_name_prefix="kvspec-wave") as pool:
            futures = []
            for req, row, tokens in zip(reqs, rows, prompts):
                if futures and req.arrival:
                    time.sleep(req.arrival * step_s)
                row.sent = True
                futures.append(pool.submit(self.client.complete, self.model, tokens, req.max_tokens))
            failed = False
            for row, future in zip(rows, futures):
                try:  # each completion is bounded by the client's timeout
                    done = future.result()
                except EngineError as e:
                    row.issues.append(str(e))
                    failed = True
                    continue
                self._completed(row, done)
        if failed:
            return False
        total = sum(len(t) for t in prompts)
        measured = self._after(head, pre, total, len(reqs))
        entry = {"requests": [r.index for r in rows], "queries": None, "hits": None}
        self.waves.append(entry)
        if measured is not None:
            entry["queries"], entry["hits"] = measured
        return not self.stopped


def redact_url(url: str) -> str:
    """The URL without any ``user:password@`` part (never printed or saved)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
