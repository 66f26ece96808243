"""The reference model's advice for one resolved geometry and one workload.

Pure: imports only ``reference``. Every number comes from
``reference.serial.simulate`` with the knobs ``reference.knobs`` resolves
for the vLLM version, under one of two rules:

* the **implemented** rule (``reference.knobs.implemented_rule``: ``legacy``
  before 0.30.0, ``replay`` from 0.30.0): what that vLLM does;
* the **promise** (kvspec's rule) under dense retention: where the requests
  resume when every state a prefill writes is kept (``reference.serial``:
  states exist only where a prefill chunk ends, so a sibling diverging inside
  an earlier prompt finds its divergence point only once a request split its
  prefill there).

*Lost reuse* of a request is promise hits minus implemented hits; the *hit
share* of a setting is its hit tokens over the workload's prompt tokens (the
prefill the cache serves).

The model has no eviction (a serial trace with a cache big enough for it):
the capacity effect of #58303 (dense checkpoints crowding attention blocks
out of a full pool) is outside it; the memory each setting keeps is reported
instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ground.engines import EngineSpec, engine_key
from reference.case import Case, Geometry, Request, Segment, Speculative
from reference.knobs import Knobs, implemented_rule, resolve_knobs
from reference.radix import TOKEN_BYTES, PrefixIndex, prompt_bytes
from reference.serial import Step, simulate, simulate_many

#: A retention setting is within this share of the best hit share to be
#: recommended (relative: hit tokens >= (1 - WITHIN) * the best's).
WITHIN = 0.01
#: Periodic settings tried: k x scheduler block for k = 1, 2, 4, ... while
#: the interval is at most the longest prompt (a longer one keeps what
#: sparse keeps), at most this many.
MAX_PERIODIC = 16
#: Sends of one prompt when asking whether it can ever hit (#53504 needed 3).
RESENDS = 3


# ---------------------------------------------------------------- settings


def retention_label(interval: int | None, block: int) -> str:
    """``sparse (0)``, ``periodic 3200 (2 x block)``, ``dense (None)``."""
    if interval is None:
        return "dense (None)"
    if interval == 0:
        return "sparse (0)"
    k = interval // block
    return f"periodic {interval} ({k} x block)"


def flag_value(interval: int | None) -> str:
    """The ``--prefix-cache-retention-interval`` value of a setting."""
    return "None" if interval is None else str(interval)


def retention_settings(block: int, longest: int, current: int | None = 0) -> list[int | None]:
    """Sparse, periodic k x block (k = 1, 2, 4, ...; module constants), the
    deployment's own setting if periodic, and dense, in that order."""
    out: list[int | None] = [0]
    k = 1
    while k * block <= longest and len(out) <= MAX_PERIODIC:
        out.append(k * block)
        k *= 2
    if current and current not in out:
        out.append(current)
        out = [0, *sorted(x for x in out if x)]
    out.append(None)
    return out


def with_interval(case: Case, interval: int | None) -> Case:
    """The case under another retention interval (the geometry only)."""
    return replace(case, geometry=replace(case.geometry, retention_interval=interval))


# ---------------------------------------------------------------- one run


@dataclass
class RuleOutcome:
    """One simulation of the workload: per-request hits and junctions, and
    the distinct Mamba states cached at the end."""

    interval: int | None
    rule: str
    hits: list[int]
    junctions: list[int]
    states: int
    steps: list[Step]

    @property
    def hit_tokens(self) -> int:
        return sum(self.hits)


def run(case: Case, knobs: Knobs, runs: list[tuple[int | None, str]]) -> list[RuleOutcome]:
    """Simulate the workload under several (retention interval, rule) runs
    in one pass (``serial.simulate_many``); count the distinct states each
    run's channel of the shared radix tree holds."""
    index = PrefixIndex(knobs.hash_lookahead_tokens, len(runs))
    all_steps = simulate_many(case, knobs, runs, index=index)
    return [
        RuleOutcome(
            interval,
            rule,
            [s.hit for s in steps],
            [s.junction for s in steps],
            sum(index.state_count(r).values()),
            steps,
        )
        for r, ((interval, rule), steps) in enumerate(zip(runs, all_steps))
    ]


def kept_positions(step: Step) -> set[int]:
    """The token counts p of the states a model step kept (every Mamba size)."""
    if step.retained_tokens is not None:
        return {p for v in step.retained_tokens.values() for p in v}
    return {(b + 1) * M for M, v in step.retained.items() for b in v}


def held_on_path(requests: tuple[Request, ...], kept: list[set[int]], lookahead: int) -> tuple[list[list[int]], int]:
    """After each request, the cached states on its own prompt's path (what
    an engine's ``retained_mamba_*`` reports), from the states each request
    kept; and the distinct states at the end. A state kept at p is on a
    prompt's path when the prompt shares p + lookahead tokens with its keeper."""
    index = PrefixIndex(lookahead)
    out = []
    for request, positions in zip(requests, kept):
        data = prompt_bytes(request)
        index.insert(data, index.query(data), {0: set(positions)}, 0)
        n = len(data) // TOKEN_BYTES
        out.append(sorted(p for p in index.query(data).states.get(0, ()) if p + lookahead <= n))
    return out, sum(index.state_count().values())


# ------------------------------------------------------- minimum cacheable prefix


def _resend_case(geometry: Geometry, speculative: Speculative | None, n: int, sends: int = RESENDS) -> Case:
    return Case(geometry, speculative, (Request((Segment("A", n),)),) * sends)


def breakpoints(geometry: Geometry, limit: int) -> list[int]:
    """Prompt lengths where a resend's hits can change, up to ``limit``.

    Every boundary the model computes for an identical resend is a multiple
    of g = gcd(hash block, every group block, scheduler block) (hash units,
    blocks, budget-floored chunk ends) compared with N, N-1 or N minus the
    lookahead, or a chunk start plus the token budget. So hits are constant
    between consecutive lengths m*g + c and m*g + budget + c (c in 0..3), and
    the shortest prompt that hits is one of them
    (``tests/advise/test_model.py`` checks it against every length on small
    geometries)."""
    g = math.gcd(geometry.hash_block_size, geometry.scheduler_block_size, *(x.block_size for x in geometry.groups))
    budget = geometry.max_num_batched_tokens
    out = set()
    for m in range(limit // g + 1):
        for base in (m * g, m * g + budget):
            for c in range(4):
                if 1 <= base + c <= limit:
                    out.add(base + c)
    return sorted(out)


def first_hitting(
    geometry: Geometry,
    speculative: Speculative | None,
    version: EngineSpec | str,
    rule: str,
    limit: int,
    *,
    first_resend: bool,
) -> tuple[int, list[int]] | None:
    """The shortest prompt (of at most ``limit`` tokens) whose identical
    resend hits: the first resend (``first_resend``), or any of RESENDS - 1;
    with its hits. None when none does."""
    knobs = None
    for n in breakpoints(geometry, limit):
        case = _resend_case(geometry, speculative, n, 2 if first_resend else RESENDS)
        knobs = knobs or resolve_knobs(case, version)
        hits = [s.hit for s in simulate(case, knobs, rule)]
        if any(hits[1:]):
            return n, hits
    return None


def search_limit(geometry: Geometry, max_model_len: int | None) -> int:
    """How far the minimum-prefix search looks: 8 scheduler blocks past the
    chunk budget (far beyond where any rule first hits), within max_model_len."""
    limit = 8 * geometry.scheduler_block_size + geometry.max_num_batched_tokens + 8
    return min(limit, max_model_len) if max_model_len else limit


def min_cacheable_prefix(
    geometry: Geometry, speculative: Speculative | None, version: EngineSpec | str, max_model_len: int | None = None
) -> dict:
    """The shortest prompt that can ever hit on this deployment: under its
    retention with the rule the version implements (first resend, and any of
    RESENDS - 1 resends) and under the promise (dense)."""
    rule = implemented_rule(version)
    limit = search_limit(geometry, max_model_len)
    dense = replace(geometry, retention_interval=None)
    out = {"searched_up_to": limit, "rule": rule}
    for key, geo, r, first in (
        ("first_resend", geometry, rule, True),
        ("any_resend", geometry, rule, False),
        ("promise", dense, "promise", True),
    ):
        found = first_hitting(geo, speculative, version, r, limit, first_resend=first)
        out[key] = None if found is None else {"tokens": found[0], "hits": found[1]}
    return out


# ---------------------------------------------------------------- failure classes


def _prompt(*parts: tuple[str, int]) -> Request:
    return Request(tuple(Segment(s, n) for s, n in parts if n > 0))


def _class_traces(geometry: Geometry, knobs: Knobs) -> dict[str, tuple[int | None, list[tuple[Request, ...]]]]:
    """Small canonical traces per failure class, shortest first, with the
    request each class judges (None: every request after the first)."""
    S, U = geometry.scheduler_block_size, knobs.alignment
    L = knobs.hash_lookahead_tokens
    budget = geometry.max_num_batched_tokens
    offsets = sorted({0, 1, 2, min(U, S) - 1, S // 2 + 1, S - 2, S - 1})
    lengths = sorted(
        {k * S + r for k in range(1, 9) for r in offsets if k * S + r > 0}
        | {budget + r for r in (0, 1, S - 1, S + 1)}
        | {2 * budget + r for r in (1, S + 1)}
    )
    aligned = [k * S for k in range(1, 7)]
    extras = sorted({1, 2, L + 1, min(U, S), S})
    siblings_before, siblings_after = [], []
    for d in sorted({k * S + r for k in range(1, 6) for r in (0, 1, S // 2 + 1, S - 1)} | {budget + 1, budget + S + 1}):
        for n in sorted({d + 1, d + S, d + budget}):
            siblings_before.append((_prompt(("A", n)), _prompt(("A", d), ("B", S))))
            siblings_after.append((_prompt(("A", n)), _prompt(("A", d), ("B", S)), _prompt(("A", d), ("C", S))))
    classes = {
        "identical resend (#53504 class)": (None, [(_prompt(("A", n)),) * RESENDS for n in lengths]),
        "block-aligned prompt, then a longer sibling (R2 class)": (
            1,
            [(_prompt(("A", n)), _prompt(("A", n + x))) for n in aligned for x in extras],
        ),
        "unaligned prompt, then a longer sibling": (
            1,
            [(_prompt(("A", n)), _prompt(("A", n + x))) for n in lengths if n % S for x in (1, S)],
        ),
        "sibling diverging inside a prompt, junction not yet observed": (1, siblings_before),
        "sibling diverging inside a prompt, after its junction was observed": (2, siblings_after),
    }
    for _, traces in classes.values():
        traces.sort(key=lambda t: (sum(r.num_prompt_tokens for r in t), len(t)))
    return classes


def failure_classes(geometry: Geometry, speculative: Speculative | None, version: EngineSpec | str) -> list[dict]:
    """For each class: whether this deployment's retention, under the rule
    the version implements, hits less than the promise (dense) at the
    request the class judges, on one of its canonical traces; the shortest
    such trace with both hit lists."""
    rule = implemented_rule(version)
    probe = _resend_case(geometry, speculative, geometry.scheduler_block_size + 1)
    knobs = resolve_knobs(probe, version)
    dense = replace(geometry, retention_interval=None)
    out = []
    for name, (judged, traces) in _class_traces(geometry, knobs).items():
        row = {"class": name, "exposed": False, "checked": len(traces), "case": None}
        for trace in traces:
            implemented = [s.hit for s in simulate(Case(geometry, speculative, trace), knobs, rule)]
            promise = [s.hit for s in simulate(Case(dense, speculative, trace), knobs, "promise")]
            worse = [
                i for i, (a, b) in enumerate(zip(implemented, promise)) if a < b and (judged is None or i == judged)
            ]
            if worse:
                row.update(
                    exposed=True,
                    case={
                        "trace": [[[s.segment, s.length] for s in r.prompt] for r in trace],
                        "implemented": implemented,
                        "promise": promise,
                        "first_request": worse[0],
                    },
                )
                break
        out.append(row)
    return out


# ---------------------------------------------------------------- memory


def state_bytes(facts: dict | None) -> dict:
    """Bytes of one cached Mamba state, per GPU and in all.

    A state kept at a prefix is one block in every Mamba KV-cache group; a
    group's block holds one page per layer of the group: the Mamba spec's
    page (``mamba_page_size_bytes`` of the resolution: the MambaSpec's
    ``page_size_bytes``, padded to the attention page where vLLM pads it,
    ``mamba_page_size_padded``). So one state is ``mamba_layers`` pages on
    each GPU; tensor parallelism shards the state, so every GPU holds its
    shard: ``tensor_parallel_size`` times that in all."""
    facts = facts or {}
    page = facts.get("mamba_page_size_bytes") or facts.get("mamba_page_size_padded")
    layers = facts.get("mamba_layers")
    tp = facts.get("tensor_parallel_size") or 1
    if not page or not layers:
        return {
            "per_gpu": None,
            "all_gpus": None,
            "how": "unknown: the Mamba page size or layer count was not resolved (a live server exposes neither)",
        }
    per_gpu = int(page) * int(layers)
    return {
        "per_gpu": per_gpu,
        "all_gpus": per_gpu * int(tp),
        "page_bytes": int(page),
        "mamba_layers": int(layers),
        "tensor_parallel_size": int(tp),
        "how": f"one state = {layers} Mamba layers x {int(page):,} bytes (the Mamba page, padding included) = {per_gpu:,} bytes per GPU; x {tp} GPUs (tensor parallel) = {per_gpu * int(tp):,} bytes",
    }


# ---------------------------------------------------------------- the advice


def share(hit_tokens: int, prompt_tokens: int) -> float:
    return hit_tokens / prompt_tokens if prompt_tokens else 0.0


def recommend(rows: list[dict]) -> dict:
    """The cheapest setting (fewest states kept; the sparser on a tie)
    whose hit tokens are within WITHIN of the best setting's."""
    best = max(r["hit_tokens"] for r in rows)
    good = [r for r in rows if r["hit_tokens"] >= (1 - WITHIN) * best]
    pick = min(good, key=lambda r: (r["states"], rows.index(r)))
    return {
        **pick,
        "best_hit_tokens": best,
        "rule": f"fewest Mamba states among the settings with hit tokens >= {1 - WITHIN:.0%} of the best ({best:,})",
    }


def advise(case: Case, version: EngineSpec | str, facts: dict | None = None) -> dict:
    """The advice for a resolved case whose trace is the workload (items 1-4
    of ``kvspec advise``), as a JSON-able dict; ``outcomes`` (per retention
    setting, the RuleOutcome of the implemented rule) and ``promise`` are kept
    beside it for confirmation and the chart. ``version``: the typed engine
    (its knobs resolved without reading a name again) or a version key."""
    g = case.geometry
    knobs = resolve_knobs(case, version)
    rule = implemented_rule(version)
    tokens = [r.num_prompt_tokens for r in case.trace]
    total = sum(tokens)
    current = g.retention_interval
    settings = retention_settings(g.scheduler_block_size, max(tokens), current)
    *swept, promise = run(case, knobs, [*((interval, rule) for interval in settings), (None, "promise")])
    outcomes: dict[int | None, RuleOutcome] = {o.interval: o for o in swept}
    implemented = outcomes[current]
    memory = state_bytes(facts)
    per_state = memory["per_gpu"]
    rows = []
    for interval, o in outcomes.items():
        rows.append(
            {
                "interval": interval,
                "setting": retention_label(interval, g.scheduler_block_size),
                "flag": f"--prefix-cache-retention-interval {flag_value(interval)}",
                "hit_tokens": o.hit_tokens,
                "hit_share": share(o.hit_tokens, total),
                "states": o.states,
                "bytes_per_gpu": None if per_state is None else o.states * per_state,
                "bytes_all_gpus": None if per_state is None else o.states * memory["all_gpus"],
                "current": interval == current,
            }
        )
    requests = []
    for i, n in enumerate(tokens):
        lost = promise.hits[i] - implemented.hits[i]
        requests.append(
            {
                "request": i,
                "prompt_tokens": n,
                "implemented": implemented.hits[i],
                "promise": promise.hits[i],
                "lost_tokens": lost,
                "lost_share": share(lost, n),
            }
        )
    lost_total = promise.hit_tokens - implemented.hit_tokens
    return {
        "version": engine_key(version),
        "rule": rule,
        "knobs": knobs.as_dict(),
        "current_retention": {"interval": current, "setting": retention_label(current, g.scheduler_block_size)},
        "min_cacheable_prefix": min_cacheable_prefix(g, case.speculative, version, (facts or {}).get("max_model_len")),
        "requests": requests,
        "totals": {
            "requests": len(tokens),
            "prompt_tokens": total,
            "implemented_hit_tokens": implemented.hit_tokens,
            "promise_hit_tokens": promise.hit_tokens,
            "lost_tokens": lost_total,
            "lost_share": share(lost_total, total),
            "requests_losing": sum(1 for r in requests if r["lost_tokens"] > 0),
            "implemented_hit_share": share(implemented.hit_tokens, total),
            "promise_hit_share": share(promise.hit_tokens, total),
        },
        "failure_classes": failure_classes(g, case.speculative, version),
        "retention": {
            "settings": rows,
            "memory": memory,
            "recommended": recommend(rows),
            "within": WITHIN,
            "states_counted": "distinct cached Mamba states at the end of the workload (one per prefix, lookahead included, as vLLM's block hash names it; a copy a later request recomputes at the same prefix counts once); nothing is evicted",
        },
        "outcomes": outcomes,
        "promise_outcome": promise,
    }
