"""The shrinker: the smallest case that still satisfies a predicate.

It knows nothing of oracles or engines: it takes a case and a predicate
(``Case -> bool``: "still interesting") and greedily tries smaller cases, in
the manner of Hypothesis' ``conjecture/shrinker.py``. Passes, each keeping
the trace's structure (an identical resend stays identical, a prefix stays a
prefix, because every change applies to a segment stream everywhere):

1. drop requests (a run of them, then single ones); then send a concurrent
   request once the earlier ones finished, or sooner (a smaller ``arrival``);
2. simplify the geometry: one Mamba group, the default chunk budget, a
   smaller block size, the case moved onto it by ``reference.rescale`` (each
   length's block residue keeps its boundary class);
3. shorten a segment stream everywhere by whole blocks, then by fewer tokens;
   then one request's last segment alone (the predicate decides whether the
   trace still shows the divergence); each by as many units as
   ``find_integer`` finds (Hypothesis' way of shrinking an integer), in
   logarithmically many calls;
4. simplify the speculative settings (fewer speculative tokens).

A candidate is accepted only if it is strictly smaller by ``size`` and the
predicate holds. The number of predicate calls is bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from ground.errors import KvspecError
from reference.case import Case, Segment, case_to_dict, parse_case, resync_outputs
from reference.rescale import rescale_case

Predicate = Callable[[Case], bool]
#: a length to cut: the case cut by k units, and the most units it can lose
Ladder = tuple[Callable[[int], Case], int]


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
                # an output segment follows its request to its new index; a
                # request whose quoted output is gone is not a candidate
                synced = resync_outputs(rest, [*range(start), *range(start + width, n)])
                if synced is not None:
                    yield replace(case, trace=synced)
        width //= 2


def _map_lengths(case: Case, fn: Callable[[str, int], int]) -> Case:
    """Each stream segment's length mapped; an output segment keeps its
    request's ``max_tokens``."""
    trace = tuple(
        replace(
            r,
            prompt=tuple(s if s.output is not None else Segment(s.segment, fn(s.segment, s.length)) for s in r.prompt),
        )
        for r in case.trace
    )
    return replace(case, trace=trace)


def _one_token_outputs(case: Case) -> Case:
    """Every request generating one token (output segments follow)."""
    return replace(case, trace=resync_outputs(tuple(replace(r, max_tokens=1) for r in case.trace)))


def _simplify_geometry(case: Case) -> Iterator[Case]:
    if case.deployment is not None:  # vLLM resolves a deployment's geometry
        if any(r.max_tokens != 1 for r in case.trace):
            yield _one_token_outputs(case)
        return
    g = case.geometry
    if any(x.count > 1 for x in g.groups):
        yield replace(case, geometry=replace(g, groups=tuple(replace(x, count=1) for x in g.groups)))
    if g.max_num_batched_tokens != 8192:
        yield replace(case, geometry=replace(g, max_num_batched_tokens=8192))
    if any(r.max_tokens != 1 for r in case.trace):
        yield _one_token_outputs(case)
    sizes = {x.block_size for x in g.groups}
    if len(sizes) == 1:
        (block,) = sizes
        for smaller in (16, 32, 64, 128, 256, 512):
            if smaller >= block:
                break
            yield rescale_case(case, block, smaller)


def _units(block: int | None) -> tuple[tuple[int, int | None], ...]:
    """What a length is cut by, coarse to fine, each unit with the most
    tokens it may take at once (None: no bound): whole scheduler blocks
    (keeping the block residue, which most boundary rules read), then
    16-token hash units below a block, then single tokens below a hash unit.
    Without a known block: 16-token units, then single tokens below one."""
    if block is None or block <= 1:
        return ((16, None), (1, 15))
    units = [(block, None)]
    if block > 16 and block % 16 == 0:
        units += [(16, block - 1), (1, 15)]
    else:
        units.append((1, block - 1))
    return tuple(units)


def _most(shortest: int, unit: int, below: int | None) -> int:
    """How many units a length of ``shortest`` can lose and stay >= 1."""
    most = (shortest - 1) // unit
    return most if below is None else min(most, below // unit)


def _shorten_segments(case: Case, block: int | None) -> list[Ladder]:
    """Shorten one segment stream everywhere (every request holding it), by
    k units."""
    ladders = []
    for name in dict.fromkeys(s.segment for r in case.trace for s in r.prompt if s.output is None):
        shortest = min(s.length for r in case.trace for s in r.prompt if s.segment == name)
        for unit, below in _units(block):

            def step(k: int, name=name, unit=unit) -> Case:
                return _map_lengths(case, lambda n, length: length - k * unit if n == name else length)

            ladders.append((step, _most(shortest, unit, below)))
    return ladders


def _shorten_one_request(case: Case, block: int | None) -> list[Ladder]:
    """Shorten the last segment of one request alone (a longer sibling's
    tail, say) by k units."""
    ladders = []
    for i, request in enumerate(case.trace):
        last = request.prompt[-1]
        if last.output is not None:  # its length is the quoted request's max_tokens
            continue
        for unit, below in _units(block):

            def step(k: int, i=i, request=request, last=last, unit=unit) -> Case:
                prompt = request.prompt[:-1] + (Segment(last.segment, last.length - k * unit),)
                return replace(case, trace=case.trace[:i] + (replace(request, prompt=prompt),) + case.trace[i + 1 :])

            ladders.append((step, _most(last.length, unit, below)))
    return ladders


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


#: passes that offer candidates one by one, in order
PASSES = (_drop_requests, _serialize, _simplify_geometry)
#: passes that offer ladders: one length to cut by k units, k found by search
LADDERS = (_shorten_segments, _shorten_one_request)
#: offered last
LAST = (_simplify_speculative,)


def find_integer(holds: Callable[[int], bool], most: int) -> int:
    """The largest k in [0, most] found with ``holds(k)`` (``holds(0)`` taken
    as true), in about 2 log2(most) calls, as Hypothesis' ``find_integer``:
    all of it first, then 1, 2, 4, ... while it holds, then bisection
    between the last k that held and the first that did not. Greedy: a
    predicate that is not monotone in k gets a k that holds, not the
    largest."""
    if most <= 0:
        return 0
    if holds(most):
        return most
    lo, hi = 0, 1
    while hi < most and holds(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, most)  # holds(hi) is false: asked, or hi == most
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if holds(mid):
            lo = mid
        else:
            hi = mid
    return lo


class _OutOfCalls(Exception):
    pass


def shrink(case: Case, predicate: Predicate, max_calls: int = 300, block: int | None = None) -> tuple[Case, int]:
    """Greedy fixed point over the passes. Returns (smallest case, calls).
    ``block``: the scheduler block a deployment's case resolves to, when the
    caller knows it (a hand geometry names its own); lengths are cut by it
    first.

    A candidate pass that made the case smaller runs again at once (its
    candidates from the smaller case) before the next pass, as Hypothesis'
    shrinker runs a pass to its own fixed point. A ladder pass cuts each of
    its lengths by the most units ``find_integer`` finds, so a length that
    can lose n units costs about 2 log2(n) calls, not n. The rounds over all
    passes repeat until one round changes nothing. A candidate is asked
    once: one that did not hold is never asked again."""
    calls = 0
    seen: set = set()

    def ask(candidate: Case, than: Case) -> Case | None:
        """The candidate as validated when it is smaller than ``than`` and
        the predicate holds on it; else None."""
        nonlocal calls
        candidate = _valid(candidate)
        if candidate is None or size(candidate) >= size(than):
            return None
        key = repr(candidate)
        if key in seen:  # asked already, and it did not hold
            return None
        if calls >= max_calls:
            raise _OutOfCalls
        seen.add(key)
        calls += 1
        return candidate if predicate(candidate) else None

    def candidates(best: Case, shrink_pass) -> Case:
        progress = True
        while progress:
            progress = False
            for candidate in shrink_pass(best):
                smaller = ask(candidate, best)
                if smaller is not None:
                    best, progress = smaller, True
                    break
        return best

    def ladders(best: Case, shrink_pass) -> Case:
        i = 0
        while i < len(rungs := shrink_pass(best, block)):
            step, most = rungs[i]
            base, held = best, {}

            def holds(k: int) -> bool:
                smaller = ask(step(k), base)
                if smaller is not None:
                    held[k] = smaller
                return smaller is not None

            k = find_integer(holds, most)
            if k:
                best = held[k]
            i += 1
        return best

    block = case.geometry.scheduler_block_size if case.geometry is not None else block
    best = case
    try:
        while True:
            before = best
            for shrink_pass in PASSES:
                best = candidates(best, shrink_pass)
            for shrink_pass in LADDERS:
                best = ladders(best, shrink_pass)
            for shrink_pass in LAST:
                best = candidates(best, shrink_pass)
            if best == before:
                return best, calls
    except _OutOfCalls:
        return best, calls
