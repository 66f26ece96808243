"""The serial multi-request model: what every request of a trace hits.

Requests run one after another; each finishes before the next starts, and
nothing is evicted. For each request R of N prompt tokens the model states:

1. **Lookup** (``KVCacheManager.get_computed_blocks`` and the hybrid
   coordinator's fixed point, vLLM 0.29.0-0.33.0). The candidate starts at
   the cap N-1. Each full-attention group answers with its cached blocks
   (``boundaries.attention_lookup``, EAGLE drop included); the Mamba groups
   then answer with the deepest cached state at or below that, aligned to
   the hit unit U. The hit is the fixed point. If attention reached further
   than the hit, that attention length is the *junction* (vLLM's
   ``shared_prefix_boundary``).
2. **Prefill chunks** (``Scheduler._mamba_block_aligned_split``). In Mamba
   "align" mode a state is written only where a prefill chunk ends. A chunk
   ends at the token budget (rounded down to the block), or earlier at the
   last cacheable position, at the junction, or at the next block boundary
   when it started mid-block.
3. **Retention**. Of the states written, the retention rule keeps those at
   its boundaries (sparse), at its boundaries and every interval (periodic),
   or all (dense). Rules: ``promise`` (kvspec's: the resend and extension
   boundaries under dense retention, every kept state assumed written),
   ``replay`` (vLLM 0.30.0-0.33.0) and ``legacy`` (vLLM <= 0.29.0).

A block is matched through its hash, which with lookahead hashes also covers
the L tokens after it: a boundary p is usable by R only if p + L tokens are
shared with the request that cached it and R has p + L tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reference.boundaries import (
    attention_lookup,
    floor_to,
    kept_state,
    legacy_boundaries,
    replay_boundaries,
    tail_checkpoint,
)
from reference.case import Case, Geometry, Segment, prompt_tokens
from reference.errors import invalid
from reference.knobs import Knobs

RULES = ("promise", "replay", "legacy")


@dataclass
class Cached:
    """What one finished request left in the cache."""

    tokens: list[int]
    prompt: tuple[Segment, ...]
    #: Mamba states kept, per Mamba block size: token counts p.
    states: dict[int, set[int]] = field(default_factory=dict)


def common_prefix(a: list[int], b: list[int], skip: int = 0) -> int:
    """Length of the longest common prefix of two token lists, given that
    their first ``skip`` tokens are known to be equal."""
    i, n = skip, min(len(a), len(b))
    while i < n and a[i] == b[i]:
        i += 1
    return i


def related(index: dict[int, list[int]], tokens: list[int], n: int) -> list[int]:
    """Positions (among ``n`` cached prompts, indexed by first token id) of
    those that may share a prefix with ``tokens``: the ones with the same
    first token. Any other shares no token, and a prompt sharing no token
    reaches no cached state and no attention block, so leaving it out
    changes no result; it only makes a trace of unrelated prompts cost
    linear, not quadratic, time."""
    return index.get(tokens[0], []) if tokens else []


def known_common(a: tuple[Segment, ...], b: tuple[Segment, ...]) -> int:
    """Tokens two prompts share by construction: identical leading segments,
    then the shorter of a first differing pair from the same stream."""
    shared = 0
    for x, y in zip(a, b):
        if x.segment != y.segment:
            break
        shared += min(x.length, y.length)
        if x.length != y.length:
            break
    return shared


@dataclass(frozen=True)
class Lookup:
    cap: int
    attention: int  # the attention groups' EAGLE-adjusted answer
    hit: int
    junction: int


def lookup(N: int, shared: list[int], cache: list[Cached], geometry: Geometry, knobs: Knobs) -> Lookup:
    """Steps 1 of the module docstring. ``shared[i]`` is the common prefix of
    R with ``cache[i]``; dense Mamba (every aligned state) when cache is None."""
    L, U = knobs.hash_lookahead_tokens, knobs.alignment
    cap = max(N - 1, 0)
    best = max(shared, default=0)
    ceiling = floor_to(N - L, geometry.hash_block_size) if knobs.eagle_lookup_ceiling == "hashed" else cap
    c = cap
    longest = 0
    for A in dict.fromkeys(geometry.attention_block_sizes):
        reach = floor_to(max(best - L, 0), A)
        c = attention_lookup(c, reach, A, U, knobs.eagle_drop, ceiling)
        longest = max(longest, c)
    attention = c
    mamba_sizes = list(dict.fromkeys(geometry.mamba_block_sizes))
    while mamba_sizes:
        start = c
        for M in mamba_sizes:
            c = _deepest_state(c, N, M, U, L, shared, cache)
        if c >= start:
            break
    unitary = geometry.num_groups == 1
    junction = longest if (longest > c and not unitary) else 0
    return Lookup(cap, attention, c, junction)


def _deepest_state(limit: int, N: int, M: int, U: int, L: int, shared: list[int], cache: list[Cached] | None) -> int:
    """The deepest cached Mamba state p <= limit (p a multiple of U)."""
    best = 0
    for i, entry in enumerate(cache or ()):
        top = min(limit, shared[i] - L, N - L)
        for p in entry.states.get(M, ()):
            if best < p <= top and p % U == 0:
                best = p
    if cache is None:  # dense and ideal: every aligned state of the shared prefix
        best = floor_to(max(min(limit, max(shared, default=0) - L, N - L), 0), U)
    return best


def dense_hit(N: int, shared: int, geometry: Geometry, knobs: Knobs) -> int:
    """Where a request of N tokens sharing ``shared`` tokens with a cached
    prompt resumes under dense retention (every aligned state kept)."""
    return lookup(N, [shared], None, geometry, knobs).hit  # type: ignore[arg-type]


def promise_boundaries(N: int, geometry: Geometry, knobs: Knobs) -> tuple[int, ...]:
    """The promise: where the identical resend and a longer sibling of an
    N-token prompt resume under dense retention."""
    resend = dense_hit(N, N, geometry, knobs)
    extension = dense_hit(N + geometry.scheduler_block_size + knobs.hash_lookahead_tokens + 1, N, geometry, knobs)
    return tuple(sorted({resend, extension}))


def rule_boundaries(rule: str, N: int, junction: int, geometry: Geometry, knobs: Knobs) -> list[int]:
    """The boundaries whose states a retention rule keeps for a prompt."""
    S = geometry.scheduler_block_size
    if rule == "promise":
        out = list(promise_boundaries(N, geometry, knobs))
    elif rule == "replay":
        out = list(replay_boundaries(N, S, knobs.eagle_drop))
    elif rule == "legacy":
        out = list(legacy_boundaries(N))
    else:
        raise invalid("rule", rule, f"allowed: {', '.join(RULES)}")
    if junction:
        out.append(junction)
        if rule == "replay" and knobs.junction_back_off:
            out.append(junction - min(b.block_size for b in geometry.groups))  # 0.33.0 also keeps J - bs
    return out


def chunk_ends(N: int, start: int, junction: int, geometry: Geometry, knobs: Knobs) -> list[int]:
    """Step 2: where the prefill chunks of a request starting at ``start`` end."""
    bs = min(g.block_size for g in geometry.groups)  # cache_config.block_size
    budget = geometry.max_num_batched_tokens
    if knobs.eagle_drop:
        last = floor_to(N, bs) - bs
    elif knobs.eagle_lookup_ceiling == "hashed":  # 0.32.0+: get_mamba_prefill_checkpoint_position
        last = floor_to(N - max(1, knobs.hash_lookahead_tokens), bs)
    else:
        last = floor_to(N, bs)
    tail = 0
    if knobs.partial_hash_hits:
        tail = tail_checkpoint(N, geometry.hash_block_size, knobs.eagle_drop, knobs.hash_lookahead_tokens, knobs.tail_checkpoint)
    ends = []
    while start < N:
        end = min(start + budget, N)
        if end < N:
            aligned = floor_to(end, bs)
            if aligned > start or bs <= budget:
                end = aligned
        stops = [
            floor_to(start, bs) + bs if start % bs else 0,
            last,
            tail if last < tail < N else 0,
            start + floor_to(junction - start, bs) if start < junction < end else 0,
        ]
        end = min((s for s in stops if start < s < end), default=end)
        ends.append(end)
        start = end
    return ends


@dataclass
class Step:
    """The model's account of one request (the ``explain`` record)."""

    request: int
    prompt_tokens: int
    shared_prefix: int
    hit_cap: int
    scheduler_boundary: int
    hit: int
    junction: int
    boundaries: list[int]
    chunk_ends: list[int]
    retained: dict[int, list[int]]

    def as_dict(self) -> dict:
        return {
            "request": self.request,
            "prompt_tokens": self.prompt_tokens,
            "shared_prefix": self.shared_prefix,
            "hit_cap": self.hit_cap,
            "scheduler_boundary": self.scheduler_boundary,
            "hit": self.hit,
            "junction": self.junction,
            "boundaries": self.boundaries,
            "chunk_ends": self.chunk_ends,
            "retained_mamba_blocks": {str(m): v for m, v in self.retained.items()},
        }


def cacheable_tokens(end: int, M: int, geometry: Geometry, knobs: Knobs) -> int:
    """How far a cache call after a chunk ending at ``end`` reaches
    (``get_num_cacheable_tokens``): rounded down to the scheduler block, or
    not at all with partial hash hits; an EAGLE group may add one block of
    its own past that (vLLM flags every group of a GDN+MTP model)."""
    if knobs.partial_hash_hits:
        return end
    aligned = floor_to(end, geometry.scheduler_block_size)
    if knobs.eagle_drop and aligned > 0:
        return min(end, aligned + M)
    return aligned


def retained_states(rule: str, N: int, hit: int, junction: int, geometry: Geometry, knobs: Knobs) -> tuple[list[int], list[int], dict[int, set[int]]]:
    """Step 3: the Mamba states a request keeps, per Mamba block size."""
    U, L, interval = knobs.alignment, knobs.hash_lookahead_tokens, geometry.retention_interval
    hashed = floor_to(max(N - L, 0), geometry.hash_block_size)
    bounds = rule_boundaries(rule, N, junction, geometry, knobs)
    ends = chunk_ends(N, hit, junction, geometry, knobs)
    kept: dict[int, set[int]] = {}
    tails: set[int] = set()
    for M in dict.fromkeys(geometry.mamba_block_sizes):
        written = {e for e in ends if e % M == 0 and e <= hashed}
        if rule == "promise":
            # The promise's own boundaries are written by definition; any other
            # state exists only where a prefill chunk ended, as in vLLM. So a
            # sibling diverging inside an earlier prompt finds a state at the
            # divergence point only once a request has split its prefill
            # there (the junction has been observed), under every retention.
            written |= {b for b in bounds if 0 < b <= hashed}
        else:
            if knobs.partial_hash_hits or knobs.tail_checkpoint == "checkpoint":
                # The prompt's checkpoint is keyed as a (partial) block whatever
                # the mask says, by the cache call that covers exactly up to it;
                # before 0.32.0 only a partial one (a full block takes the mask).
                tail = tail_checkpoint(N, geometry.hash_block_size, knobs.eagle_drop, L, knobs.tail_checkpoint)
                covered = {cacheable_tokens(e, M, geometry, knobs) for e in ends}
                if tail > 0 and tail in covered and tail <= hashed and (tail % M or knobs.tail_checkpoint == "checkpoint"):
                    written.add(tail)
                    tails.add(tail)
        if interval is None:
            keep = written
        else:
            marks = {floor_to(kept_state(b, U), M) for b in bounds}
            if rule == "promise":
                marks = {kept_state(b, U) for b in bounds}
            if interval:
                step = M if interval <= M else interval
                marks |= set(range(step, hashed + 1, step))
            keep = {p for p in written if p in marks or p in tails}
        kept[M] = keep - {0}
    return bounds, ends, kept


def simulate(case: Case, knobs: Knobs, rule: str = "promise") -> list[Step]:
    """Run the serial model over the case's trace."""
    if rule not in RULES:
        raise invalid("rule", rule, f"allowed: {', '.join(RULES)}")
    g = case.geometry
    cache: list[Cached] = []
    by_first: dict[int, list[int]] = {}  # first token id -> positions in cache
    steps = []
    for i, request in enumerate(case.trace):
        tokens = prompt_tokens(request)
        N = len(tokens)
        near = [cache[j] for j in related(by_first, tokens, len(cache))]
        shared = [common_prefix(e.tokens, tokens, known_common(e.prompt, request.prompt)) for e in near]
        look = lookup(N, shared, near, g, knobs)
        bounds, ends, kept = retained_states(rule, N, look.hit, look.junction, g, knobs)
        by_first.setdefault(tokens[0], []).append(len(cache))
        cache.append(Cached(tokens, request.prompt, kept))
        steps.append(
            Step(
                request=i,
                prompt_tokens=N,
                shared_prefix=max(shared, default=0),
                hit_cap=look.cap,
                scheduler_boundary=look.attention,
                hit=look.hit,
                junction=look.junction,
                boundaries=sorted(b for b in set(bounds) if b > 0),
                chunk_ends=ends,
                retained={M: sorted(p // M - 1 for p in s) for M, s in kept.items()},
            )
        )
    return steps
