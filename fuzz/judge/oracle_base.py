"""What every oracle returns, and the words they share: an oracle compares
one engine observation with what must hold and says which requests
diverge (a :class:`Divergence`; none when it holds). The list of oracles
is :mod:`fuzz.judge.oracle_registry`; the dispatch :func:`fuzz.judge.oracles.check_all`.

An observation is the dict an engine returns (``hits``, ``queries``,
``knobs``, ``explain``) or ``{"error": {...}}``; the oracle that reads
the error lives here, since a variant run's error is judged by it too:

* ``engine_error``: vLLM raised on a case the model accepts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine_adapter.interface import Observation
from ground.engines import EngineSpec, engine_key
from reference.case import Case, prompt_tokens

Run = Callable[[Case], Observation]


@dataclass
class Divergence:
    """One oracle firing on one case."""

    oracle: str
    #: the engine's version key; an oracle may hand the typed engine
    #: (``ground.engines.EngineSpec``), recorded as its key
    version: str
    requests: list[int]  # the diverging requests, first first
    expected: list
    observed: list
    detail: str = ""
    context: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.version = engine_key(self.version)

    @property
    def first(self) -> int | None:
        return self.requests[0] if self.requests else None


def first_load(obs: Observation) -> int | None:
    """The first request a KV connector loaded for (its ``external_hit``),
    or None. A connector's lookup is its own: vLLM asks it beyond the
    block-aligned local hit and lets a longer load supersede a local
    partial tail (0.32.0 ``sched/scheduler.py:970-1027``), and 0.30.0's and
    0.32.0's offloading connector serves past the EAGLE drop when no
    KV-cache group is annotated as the drafter's, by design
    (``offloading/scheduler.py:238``, ``:236-251``). What it loads is in the
    local cache afterwards, which the reference model does not know: the
    oracles declared ``local`` (``fuzz.judge.oracle_registry``) judge the
    requests before it (``fuzz.judge.oracles.check_all``)."""
    explain = obs.get("explain") or []
    return next((i for i, e in enumerate(explain) if int((e or {}).get("external_hit") or 0)), None)


def reference_divergence(
    version: str, bad: list[int], expected: list, observed: list, detail: str, model_explain: list
) -> list[Divergence]:
    """A ``reference`` divergence: the hits of ``bad`` differ from the rule
    the engine implements (``detail`` names it), with the model's explain."""
    return [Divergence("reference", version, bad, expected, observed, detail, {"model_explain": model_explain})]


def request_kinds(case: Case) -> list[str]:
    """For each request: ``fresh``, ``resend`` (identical to an earlier
    prompt), ``extension`` (an earlier prompt is a strict prefix) or
    ``sibling`` (shares a prefix with an earlier prompt, neither of the two)."""
    seen: list[list[int]] = []
    kinds = []
    for request in case.trace:
        tokens = prompt_tokens(request)
        kind = "fresh"
        for earlier in seen:
            if earlier == tokens:
                kind = "resend"
                break
            if len(earlier) < len(tokens) and tokens[: len(earlier)] == earlier:
                kind = "extension"
            elif kind == "fresh" and earlier[:1] == tokens[:1]:
                kind = "sibling"
        kinds.append(kind)
        seen.append(tokens)
    return kinds


def promised(case: Case) -> list[int]:
    return [i for i, k in enumerate(request_kinds(case)) if k in ("resend", "extension")]


def differing(expected: list, observed: list, only: list[int] | None = None) -> list[int]:
    idx = range(len(expected)) if only is None else only
    return [i for i in idx if i >= len(observed) or expected[i] != observed[i]]


def same_hits(
    oracle: str, version: str, hits: list, context: dict[str, list], detail: Callable[[int], str]
) -> list[Divergence]:
    """The divergence of an oracle that judges something other than the
    hits (which it carries unchanged): the requests with a non-empty entry
    in any of the per-request lists of ``context`` (the divergence's
    context), ``detail`` of the first."""
    bad = [i for i, xs in enumerate(zip(*context.values())) if any(xs)]
    if not bad:
        return []
    return [Divergence(oracle, version, bad, list(hits), list(hits), detail(bad[0]), context)]


def check_engine_error(case: Case, version: EngineSpec | str, obs: Observation) -> list[Divergence]:
    if "error" not in obs:
        return []
    err = obs["error"]
    return [
        Divergence(
            "engine_error",
            version,
            [int(err.get("request", 0) or 0)],
            [],
            [],
            f"{err.get('type', 'Error')}: {err.get('message', '')}".strip(),
            {"traceback": err.get("traceback", "")},
        )
    ]
