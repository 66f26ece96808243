"""The shrinker: the smallest case that still satisfies a predicate.

It knows nothing of oracles or engines: it takes a case and a predicate
(``Case -> bool``: "still interesting") and greedily tries smaller cases, in
the manner of Hypothesis' ``conjecture/shrinker.py``. Passes, each keeping
the trace's structure (an identical resend stays identical, a prefix stays a
prefix, because every change applies to a segment stream everywhere):

1. drop requests (a run of them, then single ones); then send a concurrent
   request once the earlier ones finished, or sooner (a smaller ``arrival``);
2. simplify the geometry: one Mamba group, the default chunk budget, a
   smaller block size with every length rescaled and its block residue kept;
3. shorten a segment stream everywhere by whole blocks, then by fewer tokens;
   then one request's last segment alone (the predicate decides whether the
   trace still shows the divergence);
4. simplify the speculative settings (fewer speculative tokens).

A candidate is accepted only if it is strictly smaller by ``size`` and the
predicate holds. The number of predicate calls is bounded.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterator

from reference.case import Case, Group, Segment, parse_case, case_to_dict
from reference.errors import KvspecError

Predicate = Callable[[Case], bool]


def size(case: Case) -> tuple:
    """The shrink order: fewer requests, smaller blocks, fewer tokens, simpler.
    A deployment's geometry is vLLM's to resolve, so only its trace counts."""
    g = case.geometry if case.deployment is None else None
    return (
        len(case.trace),
        g.scheduler_block_size if g else 0,
        sum(r.num_prompt_tokens for r in case.trace),
        sum(x.count for x in g.groups) if g else 0,
        (g.max_num_batched_tokens != 8192) if g else False,
        case.speculative.num_speculative_tokens if (case.speculative and g) else 0,
        sum(len(r.prompt) for r in case.trace),
        sum(r.arrival is not None for r in case.trace),
        sum(r.arrival or 0 for r in case.trace),
    )


def _block(case: Case) -> int | None:
    """The scheduler block to shorten by: the geometry's (a resolved
    deployment's too), None for an unresolved deployment."""
    return case.geometry.scheduler_block_size if case.geometry is not None else None


def _steps(block: int | None) -> list[int]:
    if block is None:
        return [4096, 2048, 1024, 512, 256, 128, 64, 32, 16, 8, 2, 1]
    return [k * block for k in (8, 4, 2, 1)] + [block // 2, block // 4, 8, 2, 1]


def _valid(case: Case) -> Case | None:
    """Round-trip through the validator; None if the candidate is invalid."""
    try:
        return parse_case(case_to_dict(case))
    except KvspecError:
        return None


def _drop_requests(case: Case) -> Iterator[Case]:
    n = len(case.trace)
    width = n // 2
    while width >= 1:
        for start in range(0, n - width + 1):
            rest = case.trace[:start] + case.trace[start + width :]
            if rest:
                if rest[0].arrival is not None:  # the first request arrives after none
                    rest = (replace(rest[0], arrival=None),) + rest[1:]
                yield replace(case, trace=rest)
        width //= 2


def _map_lengths(case: Case, fn: Callable[[str, int], int]) -> Case:
    trace = tuple(replace(r, prompt=tuple(Segment(s.segment, fn(s.segment, s.length)) for s in r.prompt)) for r in case.trace)
    return replace(case, trace=trace)


def _simplify_geometry(case: Case) -> Iterator[Case]:
    if case.deployment is not None:  # vLLM resolves a deployment's geometry
        if any(r.max_tokens != 1 for r in case.trace):
            yield replace(case, trace=tuple(replace(r, max_tokens=1) for r in case.trace))
        return
    g = case.geometry
    if any(x.count > 1 for x in g.groups):
        yield replace(case, geometry=replace(g, groups=tuple(replace(x, count=1) for x in g.groups)))
    if g.max_num_batched_tokens != 8192:
        yield replace(case, geometry=replace(g, max_num_batched_tokens=8192))
    if any(r.max_tokens != 1 for r in case.trace):
        yield replace(case, trace=tuple(replace(r, max_tokens=1) for r in case.trace))
    sizes = {x.block_size for x in g.groups}
    if len(sizes) == 1:
        (block,) = sizes
        for smaller in (16, 32, 64, 128, 256, 512):
            if smaller >= block:
                break

            def rescale(_name: str, length: int, b=block, s=smaller) -> int:
                q, r = divmod(length, b)
                if r:
                    r = {1: 1, b - 1: s - 1}.get(r, max(1, min(s - 1, round(r * s / b))))
                return max(1, q * s + r)

            groups = tuple(Group(x.kind, smaller, x.count) for x in g.groups)
            interval = g.retention_interval
            if interval:
                interval = interval // block * smaller
            geometry = replace(g, groups=groups, hash_block_size=smaller, scheduler_block_size=smaller, prefix_match_unit=None, retention_interval=interval, max_num_batched_tokens=g.max_num_batched_tokens if g.max_num_batched_tokens == 8192 else max(smaller, g.max_num_batched_tokens // block * smaller))
            yield _map_lengths(replace(case, geometry=geometry), rescale)


def _shorten_segments(case: Case) -> Iterator[Case]:
    names = list(dict.fromkeys(s.segment for r in case.trace for s in r.prompt))
    steps = _steps(_block(case))
    for name in names:
        shortest = min(s.length for r in case.trace for s in r.prompt if s.segment == name)
        for d in steps:
            if 0 < d < shortest:
                yield _map_lengths(case, lambda n, length, d=d, name=name: length - d if n == name else length)


def _shorten_one_request(case: Case) -> Iterator[Case]:
    """Shorten the last segment of one request alone (a longer sibling's
    tail, say), halving first, then by whole blocks."""
    block = _block(case) or 256
    for i, request in enumerate(case.trace):
        last = request.prompt[-1]
        for new in (last.length // 2, last.length - 4 * block, last.length - block, last.length - 1):
            if 0 < new < last.length:
                prompt = request.prompt[:-1] + (Segment(last.segment, new),)
                yield replace(case, trace=case.trace[:i] + (replace(request, prompt=prompt),) + case.trace[i + 1 :])


def _serialize(case: Case) -> Iterator[Case]:
    """Send a concurrent request once the earlier ones finished (the trace
    serial there), else sooner (a smaller ``arrival``)."""
    for i, request in enumerate(case.trace):
        if request.arrival is None:
            continue
        for arrival in (None, 0, request.arrival // 2, request.arrival - 1):
            if arrival is None or 0 <= arrival < request.arrival:
                yield replace(case, trace=case.trace[:i] + (replace(request, arrival=arrival),) + case.trace[i + 1 :])


def _simplify_speculative(case: Case) -> Iterator[Case]:
    spec = case.speculative
    if case.deployment is None and spec is not None and spec.num_speculative_tokens > 1:
        yield replace(case, speculative=replace(spec, num_speculative_tokens=1))


PASSES = (_drop_requests, _serialize, _simplify_geometry, _shorten_segments, _shorten_one_request, _simplify_speculative)


def shrink(case: Case, predicate: Predicate, max_calls: int = 300) -> tuple[Case, int]:
    """Greedy fixed point over the passes. Returns (smallest case, calls).

    A pass that made the case smaller runs again at once (its candidates
    from the smaller case) before the next pass, as Hypothesis' shrinker
    runs a pass to its own fixed point; the rounds over all passes repeat
    until one round changes nothing. What comes out is the same kind of
    local minimum as restarting from the first pass after every success
    (no candidate of any pass holds), without asking the passes that just
    failed again after each small step of another."""
    calls = 0
    best = case
    seen: set = set()
    improved = True
    while improved and calls < max_calls:
        improved = False
        for shrink_pass in PASSES:
            progress = True
            while progress:
                progress = False
                for candidate in shrink_pass(best):
                    candidate = _valid(candidate)
                    if candidate is None or size(candidate) >= size(best):
                        continue
                    key = repr(candidate)
                    if key in seen:  # asked already, and it did not hold
                        continue
                    seen.add(key)
                    calls += 1
                    if predicate(candidate):
                        best, improved, progress = candidate, True, True
                        break
                    if calls >= max_calls:
                        return best, calls
    return best, calls
