"""Workloads: the requests ``kvspec advise`` predicts, as a case's trace.

Built-in shapes (every length jittered uniformly in [n/2, 3n/2] by a
``random.Random(seed)``, except the system prompt, the documents and the
resend's prompt; the same options and seed give the same requests on every
machine):

==============  ====================================================  ==========================================
shape           requests                                              defaults
==============  ====================================================  ==========================================
``resend``      one prompt of P tokens, sent R times (#53504)         R 3, P 8,000
``chat``        conversations one after another, T turns each; turn   R 32, T 8, S 1,000, P 400, turn 600
                0 is the system prompt S plus a first message P,
                every later turn extends the last by a turn
``agent``       tasks one after another, T steps each: a long         R 64, T 4, S 6,000, P 300, turn 250
                shared system prompt S plus a short task tail P,
                each step extends the last by a tool result
``rag``         the system prompt S, one of D documents of P tokens   R 64, D 8, S 500, P 3,000, turn 60
                (drawn by the seed), then a question of ``turn``
``interleaved`` C conversations whose turns interleave (turn t of     R 24, C 4, S 12,000, P 400, turn 800
                every conversation, then turn t+1: #58303's shape)
==============  ====================================================  ==========================================

A recorded trace (``--trace FILE``) is JSON lines, one request a line, all
lines of one form:

* a prompt as a case writes it: ``{"prompt": [{"segment": "A", "length":
  500}, ...], "max_tokens": 1}``;
* token counts with prefix relations, no text needed: ``{"tokens": 1200}``
  (a prompt sharing nothing), ``{"tokens": 1800, "shares": {"request": 0,
  "tokens": 1200}}`` (its first 1,200 tokens are request 0's first 1,200,
  the rest its own). Each is turned into segments: the shared request's
  segments cut to the shared length, then new tokens, continuing that
  prompt's last stream when nobody continued it yet (so a long chain of
  turns stays two segments, as a case needs), else a stream of its own.

Limits (one line naming the option or line otherwise): at most
``MAX_REQUESTS`` requests, each prompt at most the case format's 1,048,576
tokens, at most ``MAX_STREAM_TOKENS`` distinct tokens in all (the model holds
each token stream), a trace file of at most ``MAX_TRACE_BYTES``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from ground.errors import InvalidArgument, invalid
from ground.files import decode_utf8, parse_json, read_bounded
from reference.case import MAX_PROMPT_TOKENS, Request, Segment, parse_request

WORKLOADS = ("resend", "chat", "agent", "rag", "interleaved")
#: The size options, as ``--flag`` -> parameter name.
OPTIONS = {
    "--requests": "requests",
    "--prompt-tokens": "prompt_tokens",
    "--turn-tokens": "turn_tokens",
    "--system-tokens": "system_tokens",
    "--turns": "turns",
    "--conversations": "conversations",
    "--documents": "documents",
}
DEFAULTS: dict[str, dict[str, int]] = {
    "resend": {"requests": 3, "prompt_tokens": 8000},
    "chat": {"requests": 32, "turns": 8, "system_tokens": 1000, "prompt_tokens": 400, "turn_tokens": 600},
    "agent": {"requests": 64, "turns": 4, "system_tokens": 6000, "prompt_tokens": 300, "turn_tokens": 250},
    "rag": {"requests": 64, "documents": 8, "system_tokens": 500, "prompt_tokens": 3000, "turn_tokens": 60},
    "interleaved": {
        "requests": 24,
        "conversations": 4,
        "system_tokens": 12000,
        "prompt_tokens": 400,
        "turn_tokens": 800,
    },
}
MAX_REQUESTS = 100_000
MAX_STREAM_TOKENS = 1 << 23
MAX_TRACE_BYTES = 32 << 20
#: A count option (requests, turns, conversations, documents) is at most this.
MAX_COUNT = MAX_REQUESTS


@dataclass(frozen=True)
class Workload:
    """The requests of a workload and what built them."""

    name: str
    params: dict = field(default_factory=dict)
    requests: tuple[Request, ...] = ()

    @property
    def prompt_tokens(self) -> int:
        return sum(r.num_prompt_tokens for r in self.requests)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "params": dict(self.params),
            "requests": len(self.requests),
            "prompt_tokens": self.prompt_tokens,
        }


def jitter(rng: random.Random, n: int) -> int:
    """A length drawn uniformly in [max(1, n - n//2), n + n//2]."""
    return rng.randint(max(1, n - n // 2), n + n // 2)


def sizes(name: str, given: dict[str, int | None]) -> dict[str, int]:
    """The shape's parameters: its defaults, overridden by the options
    given. An option the shape does not take, or a value out of range, is
    one line naming the option."""
    if name not in DEFAULTS:
        raise invalid("--workload", name, f"allowed: {', '.join(WORKLOADS)} (or --trace FILE)")
    flags = {v: k for k, v in OPTIONS.items()}
    out = dict(DEFAULTS[name])
    for key, value in given.items():
        if value is None:
            continue
        if key not in out:
            takes = ", ".join(flags[k] for k in DEFAULTS[name])
            raise invalid(flags[key], value, f"not an option of --workload {name}; allowed: {takes}")
        top = MAX_COUNT if key in ("requests", "turns", "conversations", "documents") else MAX_PROMPT_TOKENS
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            raise invalid(flags[key], value, f"must be an integer in [1, {top:,}]")
        out[key] = value
    return out


def build(name: str, given: dict[str, int | None] | None = None, seed: int = 0) -> Workload:
    """A built-in workload (module docstring), deterministic in its options and seed."""
    params = sizes(name, given or {})
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise invalid("--seed", seed, "must be an integer in [0, 2**63)")
    rng = random.Random(seed)
    requests = _BUILDERS[name](rng, params)
    workload = Workload(name, {**params, "seed": seed}, tuple(requests))
    check(workload)
    return workload


def _resend(rng: random.Random, p: dict) -> list[Request]:
    return [Request((Segment("A", p["prompt_tokens"]),))] * p["requests"]


def _turns(rng: random.Random, p: dict, stream: str, steps: int) -> list[Request]:
    """One conversation (or agent task): the system prompt, a first
    message, then each turn extends the last."""
    length = jitter(rng, p["prompt_tokens"])
    out = []
    for t in range(steps):
        if t:
            length += jitter(rng, p["turn_tokens"])
        out.append(Request((Segment("sys", p["system_tokens"]), Segment(stream, length))))
    return out


def _chat(rng: random.Random, p: dict, stream: str = "c") -> list[Request]:
    out: list[Request] = []
    for c in range(math.ceil(p["requests"] / p["turns"])):
        out += _turns(rng, p, f"{stream}{c}", p["turns"])
    return out[: p["requests"]]


def _agent(rng: random.Random, p: dict) -> list[Request]:
    return _chat(rng, p, "task")


def _rag(rng: random.Random, p: dict) -> list[Request]:
    out = []
    for i in range(p["requests"]):
        doc = rng.randrange(p["documents"])
        out.append(
            Request(
                (
                    Segment("sys", p["system_tokens"]),
                    Segment(f"doc{doc}", p["prompt_tokens"]),
                    Segment(f"q{i}", jitter(rng, p["turn_tokens"])),
                )
            )
        )
    return out


def _interleaved(rng: random.Random, p: dict) -> list[Request]:
    conversations = p["conversations"]
    turns = math.ceil(p["requests"] / conversations)
    lengths = [jitter(rng, p["prompt_tokens"]) for _ in range(conversations)]
    out = []
    for t in range(turns):
        for c in range(conversations):
            if t:
                lengths[c] += jitter(rng, p["turn_tokens"])
            out.append(Request((Segment("sys", p["system_tokens"]), Segment(f"c{c}", lengths[c]))))
    return out[: p["requests"]]


_BUILDERS = {"resend": _resend, "chat": _chat, "agent": _agent, "rag": _rag, "interleaved": _interleaved}


def check(workload: Workload, where: str = "workload") -> None:
    """The limits of the module docstring."""
    if not workload.requests:
        raise invalid(where, 0, "has no request; allowed: at least one")
    if len(workload.requests) > MAX_REQUESTS:
        raise invalid(where, f"<{len(workload.requests):,} requests>", f"at most {MAX_REQUESTS:,} requests")
    streams: dict[str, int] = {}
    for i, r in enumerate(workload.requests):
        if r.num_prompt_tokens > MAX_PROMPT_TOKENS:
            raise invalid(
                f"{where} request {i}",
                f"<{r.num_prompt_tokens:,} tokens>",
                f"a prompt has at most {MAX_PROMPT_TOKENS:,} tokens (vLLM's max_model_len)",
            )
        for s in r.prompt:
            if s.length > streams.get(s.segment, 0):
                streams[s.segment] = s.length
    distinct = sum(streams.values())
    if distinct > MAX_STREAM_TOKENS:
        raise invalid(
            where,
            f"<{distinct:,} distinct tokens>",
            f"at most {MAX_STREAM_TOKENS:,} distinct tokens in all (the model holds every token stream)",
        )


# ---------------------------------------------------------------- trace files


def load_trace(path: str) -> Workload:
    """A recorded trace (JSON lines, module docstring)."""
    data = read_bounded(path, "--trace", path, MAX_TRACE_BYTES)
    text = decode_utf8(data, "--trace", path)
    requests: list[Request] = []
    claimed: dict[str, int] = {}  # stream -> the longest prefix of it any request uses
    form = None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"--trace line {n}"
        raw = parse_json(line, where, path)
        kind = "prompt" if isinstance(raw, dict) and "prompt" in raw else "tokens"
        if form is None:
            form = kind
        elif kind != form:
            raise invalid(where, line[:60], f"a {kind} line in a file of {form} lines; allowed: one form per file")
        if len(requests) >= MAX_REQUESTS:
            raise invalid("--trace", path, f"has more than {MAX_REQUESTS:,} requests")
        if kind == "prompt":
            try:
                request = parse_request(raw, len(requests))
            except InvalidArgument as e:
                raise InvalidArgument(f"{where}: {e}") from None
        else:
            request = _counted(raw, requests, claimed, where)
        for s in request.prompt:
            claimed[s.segment] = max(claimed.get(s.segment, 0), s.length)
        requests.append(request)
    workload = Workload("trace", {"file": path, "form": form}, tuple(requests))
    check(workload, "--trace")
    return workload


def _count(raw: dict, key: str, where: str, lo: int, hi: int) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise invalid(f"{where}.{key}", value, f"must be an integer in [{lo:,}, {hi:,}]")
    return value


def _counted(raw, earlier: list[Request], claimed: dict[str, int], where: str) -> Request:
    """A token-count line as segments (module docstring)."""
    if not isinstance(raw, dict):
        raise invalid(
            where,
            raw,
            'must be a JSON object: {"tokens": N} or {"tokens": N, "shares": {"request": J, "tokens": K}}, or a case prompt',
        )
    for key in raw:
        if key not in ("tokens", "shares", "max_tokens"):
            raise invalid(
                f"{where}.{key}", raw[key], "unknown field; allowed: tokens, shares, max_tokens (or prompt, max_tokens)"
            )
    n = _count(raw, "tokens", where, 1, MAX_PROMPT_TOKENS)
    max_tokens = _count(raw, "max_tokens", where, 1, MAX_PROMPT_TOKENS) if "max_tokens" in raw else 1
    i = len(earlier)
    own = f"t{i}"
    shares = raw.get("shares")
    if shares is None:
        return Request((Segment(own, n),), max_tokens)
    sw = f"{where}.shares"
    if not isinstance(shares, dict) or set(shares) - {"request", "tokens"}:
        raise invalid(sw, shares, 'must be {"request": J, "tokens": K}')
    if i == 0:
        raise invalid(f"{sw}.request", shares.get("request"), "the first request shares with none; allowed: no shares")
    j = _count(shares, "request", sw, 0, i - 1)
    k = _count(shares, "tokens", sw, 0, min(n, earlier[j].num_prompt_tokens))
    prompt = _cut(earlier[j].prompt, k)
    rest = n - k
    if rest:
        if prompt and claimed.get(prompt[-1].segment) == prompt[-1].length:
            last = prompt[-1]
            prompt = prompt[:-1] + [Segment(last.segment, last.length + rest)]
        else:
            prompt.append(Segment(own, rest))
    return Request(tuple(prompt), max_tokens)


def _cut(prompt: tuple[Segment, ...], length: int) -> list[Segment]:
    """The segments of a prompt's first ``length`` tokens."""
    out, left = [], length
    for s in prompt:
        if left <= 0:
            break
        out.append(Segment(s.segment, min(s.length, left)))
        left -= s.length
    return out
