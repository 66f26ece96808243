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
   boundaries under dense retention, every kept state assumed written, and
   an observed junction's Mamba block, :func:`promise_junction_state`),
   ``replay`` (vLLM 0.30.0-0.33.0) and ``legacy`` (vLLM <= 0.29.0).

A block is matched through its hash, which with lookahead hashes also covers
the L tokens after it: a boundary p is usable by R only if p + L tokens are
shared with the request that cached it and R has p + L tokens.

4. **Outputs** (:func:`output_states`). A request of N prompt tokens and
   ``max_tokens`` m computes C = N + m - 1 tokens (its last output token is
   sampled, never fed back), and the cache holds them as it holds a
   prompt's: full attention every full block of them, Mamba the states its
   decode steps leave on the block grid, as retention says. A later prompt
   that quotes the output (``{"output": j}``, the chat shape) shares up to
   :func:`cached_length` tokens with it (C, and with lookahead hashes the
   last sampled token, which the last block's hash covers); a prompt of streams alone never reaches past N (the
   output token is in no stream), so a trace without output segments has
   the answers it had before outputs were modelled.

Over 500 lines on purpose: the serial model's lookup, chunking, retention
and steps are one simulation, read top to bottom.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ground.errors import invalid
from reference.boundaries import (
    attention_lookup,
    fa_tail,
    floor_to,
    internal_checkpoint_valid,
    kept_state,
    legacy_boundaries,
    mamba_checkpoint_position,
    replay_boundaries,
    retention_period,
    tail_checkpoint,
)
from reference.case import Case, Geometry, Segment, output_tokens, prompt_tokens
from reference.knobs import Knobs
from reference.radix import TOKEN_BYTES, PrefixIndex, common_prefix, output_bytes, prompt_bytes

RULES = ("promise", "replay", "legacy")


@dataclass
class Cached:
    """What one finished request left in the cache."""

    tokens: list[int]
    prompt: tuple[Segment, ...]
    #: Mamba states kept, per Mamba block size: token counts p.
    states: dict[int, set[int]] = field(default_factory=dict)
    #: Its full-attention partial tail (``boundaries.fa_tail``; 0: none).
    fa_tail: int = 0


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


def prompt_fa_tail(N: int, geometry: Geometry, knobs: Knobs) -> int:
    """The full-attention partial tail an N-token prompt keys (0 without
    partial hash hits: every hash boundary is then a block boundary)."""
    if not knobs.partial_hash_hits:
        return 0
    return fa_tail(N, geometry.hash_block_size, knobs.hash_lookahead_tokens, knobs.eagle_drop, knobs.fa_tail)


def lookup(
    N: int,
    shared: list[int],
    cache: list[Cached] | None,
    geometry: Geometry,
    knobs: Knobs,
    *,
    tails: tuple[int, ...] | None = None,
) -> Lookup:
    """Steps 1 of the module docstring. ``shared[i]`` is the common prefix of
    R with ``cache[i]``; dense Mamba (every aligned state) when cache is None,
    with ``tails`` the full-attention partial tails of the cached prompts."""
    L, U = knobs.hash_lookahead_tokens, knobs.alignment
    H = geometry.hash_block_size
    cap = max(N - 1, 0)
    best = max(shared, default=0)
    hashed = floor_to(max(N - L, 0), H)
    ceiling = hashed if knobs.eagle_lookup_ceiling == "hashed" else cap
    if tails is None:
        tails = tuple(e.fa_tail for e, s in zip(cache or (), shared) if e.fa_tail and e.fa_tail + L <= s)
    tails = tuple(t for t in tails if t <= hashed)
    c = cap
    longest = 0
    for A in dict.fromkeys(geometry.attention_block_sizes):
        reach = floor_to(max(min(best - L, hashed), 0), A)
        c = attention_lookup(c, reach, A, U, knobs.eagle_drop, ceiling, tails, H)
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
    prompt of ``shared`` tokens resumes under dense retention (every aligned
    Mamba state kept; attention holds that prompt's full blocks and its own
    partial tail, as vLLM caches them)."""
    tail = prompt_fa_tail(shared, geometry, knobs)
    usable = (tail,) if tail and tail + knobs.hash_lookahead_tokens <= shared else ()
    return lookup(N, [shared], None, geometry, knobs, tails=usable).hit


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


def promise_junction_state(junction: int, M: int, knobs: Knobs) -> int:
    """The state the promise keeps for a junction J a request observed (its
    lookup reached J in attention with no Mamba state there; 0: none): the
    state a prefill split at J can leave. A state inside a Mamba block has
    no slot of its own, so without a sub-block checkpoint the split, and the
    state, is the Mamba block ending at or below J (``floor_to(J, M)``, 0:
    none); with the shared-prefix checkpoint it is J itself. As vLLM
    0.33.0 splits: ``Scheduler._mamba_block_aligned_split`` stops at
    ``start + (junction - start) // block_size * block_size`` ("a sub-block
    junction's state is not separately cacheable", sched/scheduler.py:632-642)
    unless ``--enable-mamba-shared-prefix-checkpoint``, whose junction the
    Mamba manager keys as a partial block (single_type_kv_cache_manager.py:2097-2103).
    Dense retention keeps no more, so neither does the promise (the
    ``junction`` oracle's cap). Engine-neutral: J, M and whether a sub-block
    junction checkpoint exists are the case's geometry, as its knobs resolve it."""
    if junction <= 0:
        return 0
    state = kept_state(junction, knobs.alignment)
    return state if knobs.shared_prefix_checkpoint else floor_to(state, M)


@dataclass(frozen=True)
class Chunk:
    """One prefill chunk [start, end); ``internal`` is the prompt checkpoint
    a kernel exported from inside it (0: none)."""

    start: int
    end: int
    internal: int = 0


def chunks(
    N: int, start: int, junction: int, geometry: Geometry, knobs: Knobs, *, block_stop_always: bool = False
) -> list[Chunk]:
    """Step 2: the prefill chunks of a request starting at ``start``
    (``Scheduler._mamba_block_aligned_split``, with the Mamba manager's
    internal checkpoint, 0.32.0+).

    A chunk ends at the token budget (rounded down to the block), or earlier
    at the first stop strictly inside it: the next block boundary when it
    started mid-block, the last cacheable position, the prompt's checkpoint
    (partial hash hits), the junction (block-floored from the start, or the
    junction itself with the shared-prefix checkpoint). With internal
    checkpoints a chunk that reaches the end of the prompt, and can export
    the checkpoint (``boundaries.internal_checkpoint_valid``), has no stop
    but the junction, and writes the checkpoint's state from inside."""
    bs = geometry.split_block  # cache_config.block_size, as the split reads it
    H = geometry.hash_block_size
    budget = geometry.max_num_batched_tokens
    L, drop = knobs.hash_lookahead_tokens, knobs.eagle_drop
    if drop:
        last = floor_to(N, bs) - bs
    elif knobs.eagle_lookup_ceiling == "hashed":  # 0.32.0+: get_mamba_prefill_checkpoint_position
        last = floor_to(N - max(1, L), bs)
    else:
        last = floor_to(N, bs)
    tail = 0
    if knobs.partial_hash_hits:
        tail = tail_checkpoint(N, H, drop, L, knobs.tail_checkpoint)
    grid = knobs.prefill_checkpoint_grid
    checkpoint = mamba_checkpoint_position(N, H if knobs.partial_hash_hits else bs, drop, L) if grid is not None else 0
    out: list[Chunk] = []
    while start < N:
        end = min(start + budget, N)
        internal = end >= N and internal_checkpoint_valid(start, end, checkpoint, H, bs, grid)
        if end < N:
            aligned = floor_to(end, bs)
            if aligned > start or bs <= budget:
                end = aligned
        if knobs.shared_prefix_checkpoint and junction <= N:
            junction_stop = junction
        else:
            junction_stop = start + floor_to(junction - start, bs)
        stops = [
            floor_to(start, bs) + bs if start % bs and (block_stop_always or not internal) else 0,
            0 if internal else last,
            tail if (not internal and last < tail < N) else 0,
            junction_stop if start < junction < end else 0,
        ]
        end = min((x for x in stops if start < x < end), default=end)
        out.append(Chunk(start, end, checkpoint if internal and end >= N else 0))
        start = end
    return out


def chunk_ends(N: int, start: int, junction: int, geometry: Geometry, knobs: Knobs) -> list[int]:
    """Where the prefill chunks of a request starting at ``start`` end."""
    return [c.end for c in chunks(N, start, junction, geometry, knobs)]


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
    #: Kept states as token counts, when one is not a whole Mamba block.
    retained_tokens: dict[int, list[int]] | None = None
    #: Kept states inside its output (token counts past the prompt).
    output_states: list[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        out = {
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
            "retained_mamba_tokens": None
            if self.retained_tokens is None
            else {str(m): v for m, v in self.retained_tokens.items()},
        }
        if self.output_states:  # only a request whose output keeps a state (a trace of max_tokens 1 reads as before)
            out["retained_output_states"] = list(self.output_states)
        return out


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


def _interim_checkpoints(parts: list[Chunk], N: int, geometry: Geometry, knobs: Knobs) -> dict[int, int]:
    """Under dense or periodic retention the Mamba manager also has the
    kernel export a checkpoint from inside every other chunk that can
    (vLLM 0.32.0+ ``MambaManager.get_num_blocks_to_allocate``: the prefill
    end is ignored unless retention is sparse), at the chunk's own
    checkpoint position, into a slot no chunk end filled. Returns
    ``{chunk end: checkpoint position}``: the cache call after such a chunk
    keys neither the prompt's checkpoint nor the junction at its end
    (:func:`retained_states`)."""
    grid = knobs.prefill_checkpoint_grid
    if grid is None or geometry.retention_interval == 0:
        return {}
    bs = geometry.split_block
    H = geometry.hash_block_size
    unit = H if knobs.partial_hash_hits else bs
    ends = {c.end for c in parts}
    out = {}
    for c in parts:
        if c.internal:
            continue
        p = mamba_checkpoint_position(c.end, unit, knobs.eagle_drop, knobs.hash_lookahead_tokens)
        slot_end = (-(-c.end // bs) - 1) * bs  # the state slot cdiv(end, bs) - 2 holds
        if p and internal_checkpoint_valid(c.start, c.end, p, H, bs, grid) and slot_end not in ends:
            out[c.end] = p
    return out


def _interval_keeps(p: int, M: int, interval: int | None) -> bool:
    """Does the retention interval alone keep the state at ``p``, a
    multiple of the Mamba block M? ``MambaManager.reachable_block_mask``
    with no reachable boundaries (0.33.0 single_type_kv_cache_manager.py:1549-1604):
    dense (None) keeps every block, periodic one every
    :func:`reference.boundaries.retention_period`, sparse (0) none."""
    if interval is None:
        return True
    return interval > 0 and p % retention_period(interval, M) == 0


def output_states(N: int, max_tokens: int, geometry: Geometry, knobs: Knobs) -> dict[int, set[int]]:
    """Step 4: the Mamba states a request's decode leaves keyed at or past
    the end of its prompt, per Mamba block size M (token counts p, N <= p
    <= C, C = N + max_tokens - 1), the same under every rule (vLLM 0.33.0;
    0.29.0 and 0.30.0 read the same way on the cases checked):

    * every decode step ends one token further (drafts the stood-in
      sampler rejects roll back), so the running state passes every
      position up to C, and the state block ending at each multiple of M is
      left behind when the next block is allocated
      (``MambaManager.allocate_new_blocks``, single_type_kv_cache_manager.py:1797);
    * a block is cached once it is computed and its hash exists
      (:func:`cached_length`): p + L <= the request's cached length. That
      also reaches the prompt's own last block (p = N) when its hash, with
      lookahead, waited for the first output token: the prompt rule keeps
      only states within ``floor(N - L, H)``;
    * the keep mask (``MambaManager.reachable_block_mask``,
      single_type_kv_cache_manager.py:1549) is dense (``None``: every
      block), sparse (0: only ``replay_boundaries(num_prompt_tokens)``,
      kv_cache_coordinator.py:65, and the junction, which lie below N, so
      no state here) or periodic (every ``retention_interval``-th token, an
      interval at or below the block keeping every block).

    Full attention needs no rule here: it caches every full block of the
    cached length (``SingleTypeKVCacheManager.cache_blocks``, mask None,
    single_type_kv_cache_manager.py:477), which a later lookup reaches
    through the common prefix."""
    C = computed_tokens(N, max_tokens)
    L = knobs.hash_lookahead_tokens
    interval = geometry.retention_interval
    top = min(C, cached_length(N, max_tokens, knobs) - L)
    prompt_top = floor_to(max(N - L, 0), geometry.hash_block_size)  # the prompt rule's states
    out: dict[int, set[int]] = {}
    if interval == 0 or top <= prompt_top:
        return out
    for M in dict.fromkeys(geometry.mamba_block_sizes):
        step = M if interval is None else retention_period(interval, M)
        first = max(-(-N // step), prompt_top // step + 1) * step
        kept = set(range(first, top + 1, step))
        if kept:
            out[M] = kept
    return out


def computed_tokens(N: int, max_tokens: int) -> int:
    """The tokens a request of N prompt tokens computes: its prompt and
    every output token but the last (sampled, never fed back)."""
    return N + max(max_tokens - 1, 0)


def cached_length(N: int, max_tokens: int, knobs: Knobs) -> int:
    """How many of a request's tokens (prompt, then output) a later prompt
    can share with the blocks it cached: its computed tokens C, and with
    lookahead hashes (L > 0, speculative decoding) the token after them. A
    block ending at e is cached once computed and hashed: ``allocate_slots``
    caches up to ``min(computed + new, request.num_tokens)``
    (kv_cache_manager.py:621), and with speculative decoding
    ``update_from_output`` caches again after appending the sampled tokens
    (sched/scheduler.py:2412), when the hash of a block ending at C covers
    the last sampled token (``get_request_block_hasher``: e + L <=
    ``request.num_tokens``, kv_cache_utils.py:975). A block ending at e is
    reachable when e + L tokens are shared, so the cached path is C +
    min(L, 1) tokens long."""
    return computed_tokens(N, max_tokens) + min(knobs.hash_lookahead_tokens, 1)


def retained_states(
    rule: str, N: int, hit: int, junction: int, geometry: Geometry, knobs: Knobs
) -> tuple[list[int], list[int], dict[int, set[int]]]:
    """Step 3: the Mamba states a request keeps, per Mamba block size.

    Written: states at chunk ends (within the hashed length), the prompt's
    checkpoint when a cache call reaches exactly it (partial hash hits, or
    0.32.0+), a checkpoint exported from inside a chunk, and with the
    shared-prefix checkpoint the junction. The prompt's checkpoint and the
    junction's are keyed whatever the retention mask says; every other
    written state is kept where the rule's boundaries (sparse), also its
    interval multiples (periodic), or everything (dense) say. The promise
    writes its own boundaries and the junction's state
    (:func:`promise_junction_state`, above the hit) by definition."""
    U, L, interval = knobs.alignment, knobs.hash_lookahead_tokens, geometry.retention_interval
    hashed = floor_to(max(N - L, 0), geometry.hash_block_size)
    bounds = rule_boundaries(rule, N, junction, geometry, knobs)
    own = rule_boundaries(rule, N, 0, geometry, knobs) if rule == "promise" else []  # the promise's, junction apart
    parts = chunks(N, hit, junction, geometry, knobs, block_stop_always=rule == "promise")
    ends = [c.end for c in parts]
    interim = _interim_checkpoints(parts, N, geometry, knobs) if rule != "promise" else {}
    kept: dict[int, set[int]] = {}
    tails: set[int] = set()
    for M in dict.fromkeys(geometry.mamba_block_sizes):
        written = {e for e in ends if e % M == 0 and e <= hashed}
        if rule == "promise":
            # The promise's own boundaries are written by definition; any other
            # state exists only where a prefill chunk ended, as in vLLM. So a
            # sibling diverging inside an earlier prompt finds a state at the
            # divergence point only once a request has split its prefill
            # there (the junction has been observed), under every retention:
            # at the junction's Mamba block, or the junction itself with the
            # shared-prefix checkpoint (:func:`promise_junction_state`).
            own_junction = promise_junction_state(junction, M, knobs)
            if own_junction <= hit:  # its prefill starts past it: no split of this request writes it
                own_junction = 0
            written |= {b for b in [*own, own_junction] if 0 < b <= hashed}
        else:
            if knobs.partial_hash_hits or knobs.tail_checkpoint == "checkpoint":
                # The prompt's checkpoint is keyed as a (partial) block whatever
                # the mask says, by the cache call that covers exactly up to it;
                # before 0.32.0 only a partial one (a full block takes the mask).
                tail = tail_checkpoint(N, geometry.hash_block_size, knobs.eagle_drop, L, knobs.tail_checkpoint)
                covered = {cacheable_tokens(e, M, geometry, knobs) for e in ends}
                # ... and only where a prefill chunk ended: align mode writes a
                # state nowhere else (a split block below the KV block, vLLM's
                # CPU engine core up to 0.32.0, ends chunks off the block grid).
                # Not where that chunk also exported an interim checkpoint: the
                # cache call then re-keys or evicts the checkpoint's slot and
                # returns before keying the chunk end (0.32.0+
                # ``MambaManager._cache_partial_tail_block``, 0.33.0
                # single_type_kv_cache_manager.py:2036-2085; 0.32.0 :2019-2066).
                if (
                    tail > 0
                    and tail in covered
                    and tail in ends
                    and tail not in interim
                    and tail <= hashed
                    and (tail % M or knobs.tail_checkpoint == "checkpoint")
                ):
                    written.add(tail)
                    tails.add(tail)
            for c in parts:
                if c.internal and c.internal <= hashed:
                    written.add(c.internal)
                    tails.add(c.internal)
            # An interim checkpoint is re-keyed at its position only when it is
            # the junction, a block the retention interval alone keeps (the
            # mask asked without the replay boundaries) or the prompt's
            # checkpoint (which the scheduler ends a chunk at, so no interim
            # one lands there: ``c.internal`` above); otherwise its slot is
            # evicted, with the full block the boundaries' mask cached there
            # (0.32.0+ ``MambaManager._cache_partial_tail_block``, 0.33.0
            # single_type_kv_cache_manager.py:2045-2084; 0.32.0 :2028-2066).
            for p in interim.values():
                if p <= hashed and (p == junction or (p % M == 0 and _interval_keeps(p, M, interval))):
                    written.add(p)
                    tails.add(p)
            # The junction is keyed by the same cache call after that branch,
            # which returns first: so not where the chunk ending at it also
            # exported an interim checkpoint (0.33.0 :2097-2103 after :2036-2084).
            if (
                knobs.shared_prefix_checkpoint
                and hit < junction <= N
                and junction in ends
                and junction not in interim
                and junction <= hashed
            ):
                written.add(junction)
                tails.add(junction)
        if interval is None:
            keep = written
        else:
            marks = {floor_to(kept_state(b, U), M) for b in bounds}
            if rule == "promise":
                marks = {kept_state(b, U) for b in own} | {own_junction}
            if interval:
                step = retention_period(interval, M)
                marks |= set(range(step, hashed + 1, step))
            keep = {p for p in written if p in marks or p in tails}
        kept[M] = keep - {0}
    return bounds, ends, kept


def _explained(bounds: list[int], ends: list[int], kept: dict[int, set[int]]) -> tuple:
    """The explain fields that depend only on what a request wrote and kept:
    (boundaries, chunk ends, retained blocks, retained tokens or None)."""
    return (
        sorted(b for b in set(bounds) if b > 0),
        ends,
        {M: sorted(p // M - 1 for p in s if p % M == 0) for M, s in kept.items()},
        {M: sorted(s) for M, s in kept.items()} if any(p % M for M, s in kept.items() for p in s) else None,
    )


def _step(
    i: int, N: int, shared: int, look: Lookup, explained: tuple, outputs: dict[int, set[int]] | None = None
) -> Step:
    """The explain record of request ``i`` (its own copies of the lists)."""
    boundaries, ends, retained, tokens = explained
    return Step(
        request=i,
        prompt_tokens=N,
        shared_prefix=shared,
        hit_cap=look.cap,
        scheduler_boundary=look.attention,
        hit=look.hit,
        junction=look.junction,
        boundaries=list(boundaries),
        chunk_ends=list(ends),
        retained={M: list(v) for M, v in retained.items()},
        retained_tokens=None if tokens is None else {M: list(v) for M, v in tokens.items()},
        output_states=sorted(p for p in set().union(*outputs.values()) if p > N)
        if outputs
        else [],  # past the prompt, as an engine reports them
    )


def simulate(case: Case, knobs: Knobs, rule: str = "promise", *, index: PrefixIndex | None = None) -> list[Step]:
    """Run the serial model over the case's trace.

    The cache is a radix tree of the earlier prompts (``reference.radix``):
    one walk down a request's tokens gives its longest shared prefix and
    every kept state and partial tail it can reach, so a trace whose
    requests share a system prompt costs time linear in its requests, not
    quadratic. The answers are exactly :func:`simulate_pairwise`'s (the
    definition; ``tests/reference/test_serial_radix.py`` checks them on
    seeded cases). ``index``: an empty :class:`~reference.radix.PrefixIndex`
    to fill (the caller may read it afterwards, e.g. its state count)."""
    return simulate_many(case, knobs, [(case.geometry.retention_interval, rule)], index=index)[0]


def simulate_many(
    case: Case, knobs: Knobs, runs: list[tuple[int | None, str]], *, index: PrefixIndex | None = None
) -> list[list[Step]]:
    """Several runs of the model over one trace that differ only in the
    retention interval and the rule (``runs``: (interval, rule) pairs), in
    one pass: the radix tree of the prompts is shared, each run marks its
    kept states in a channel of its own. Run r's answers are exactly
    :func:`simulate`'s for the case under interval r (the knobs do not
    depend on the interval). ``index``: an empty PrefixIndex with a channel
    per run."""
    for _, rule in runs:
        if rule not in RULES:
            raise invalid("rule", rule, f"allowed: {', '.join(RULES)}")
    geometries = [replace(case.geometry, retention_interval=interval) for interval, _ in runs]
    if index is None:
        index = PrefixIndex(knobs.hash_lookahead_tokens, len(runs))
    elif index.prompts or index.lookahead != knobs.hash_lookahead_tokens or index.channels != len(runs):
        raise invalid(
            "index",
            index.prompts,
            f"must be an empty PrefixIndex with lookahead {knobs.hash_lookahead_tokens} and {len(runs)} channel(s)",
        )
    steps: list[list[Step]] = [[] for _ in runs]
    written: list[dict[tuple[int, int, int], tuple]] = [
        {} for _ in runs
    ]  # retained_states is pure: once per (N, hit, junction)
    for i, request in enumerate(case.trace):
        data = prompt_bytes(request)
        N = len(data) // TOKEN_BYTES
        match = index.query(data)
        C = cached_length(N, request.max_tokens, knobs)
        if C > N:  # its output is cached too: placed as one path with the prompt
            full = data + output_bytes(C - N)
            placed = index.place(full, index.query(full))
        else:
            placed = index.place(
                data, match
            )  # the marks below are this request's own: none is read before the next request
        looked: list[
            tuple[dict, list, Lookup]
        ] = []  # the lookup reads no retention: runs that reach the same states share it
        for r, (g, (_, rule)) in enumerate(zip(geometries, runs)):
            states, tails = match.channel_states[r], match.channel_tails[r]
            look = next((x for s, t, x in looked if s == states and t == tails), None)
            if look is None:
                reach = Cached([], (), states)  # every reachable state, as one entry sharing `shared`
                look = lookup(N, [match.shared], [reach], g, knobs, tails=tuple(tails))
                looked.append((states, tails, look))
            key = (N, look.hit, look.junction)
            memo = written[r].get(key)
            if memo is None:
                bounds, ends, kept = retained_states(rule, N, look.hit, look.junction, g, knobs)
                memo = written[r][key] = (kept, prompt_fa_tail(N, g, knobs), _explained(bounds, ends, kept))
            kept, tail, explained = memo
            outputs = output_states(N, request.max_tokens, g, knobs) if C > N else {}
            if outputs:
                kept = {M: kept.get(M, set()) | outputs.get(M, set()) for M in {*kept, *outputs}}
            index.mark(placed, r, kept, tail)
            steps[r].append(_step(i, N, match.shared, look, explained, outputs))
    return steps


def simulate_pairwise(case: Case, knobs: Knobs, rule: str = "promise") -> list[Step]:
    """The serial model by its definition: each request compared token by
    token with every earlier prompt sharing its first token (quadratic over
    a trace sharing a system prompt). :func:`simulate` gives the same answers
    faster."""
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
        outputs = output_states(N, request.max_tokens, g, knobs)
        held = {M: kept.get(M, set()) | outputs.get(M, set()) for M in {*kept, *outputs}}
        by_first.setdefault(tokens[0], []).append(len(cache))
        computed = tokens + output_tokens(cached_length(N, request.max_tokens, knobs) - N)
        cache.append(Cached(computed, request.prompt, held, prompt_fa_tail(N, g, knobs)))
        steps.append(_step(i, N, max(shared, default=0), look, _explained(bounds, ends, kept), outputs))
    return steps
