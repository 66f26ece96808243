"""The reference model's boundary rules, restated over digit counts.

Each function here mirrors the ``reference/`` function of the same name,
line for line where it can; the differences are only in how numbers are
written (``spec.radix``): ``floor_to(x, g.S)`` instead of ``x // S * S``,
``sp.max(a, b)`` instead of ``max(a, b)``. ``spec.test_fidelity`` checks
every one of them against the Python functions on a small domain.

Scope (what a request with hit 0 does: the first of a trace, or one whose
lookup found attention blocks up to a junction J but no Mamba state): the
lookup is ``reference.serial.lookup`` with one attention group and dense,
ideal Mamba (``dense_hit``); retention is ``reference.serial.retained_states``
for a request with hit 0; prefill chunk ends are ``reference.serial.chunk_ends``
from token 0, with or without a junction stop, for a one-shot prefill
(budget >= N) or a chunk budget that is any positive multiple of S.

The ``hashed`` class (A = M = S = B above the hash unit H = U): the
attention lookup of ``reference.boundaries.attention_lookup`` with partial
hash hits (whole blocks, then the cached prompt's own partial tail
``fa_tail`` inside the next block; margin and drop of one hash unit), the
prompt's checkpoint (``tail_checkpoint``, on H) as a chunk stop followed by
the next block boundary (a chunk that starts mid-block ends there), and the
junction stop floored to the block. Left out: internal prefill checkpoints
(``Geometry.prefill_checkpoint_grid``: a kernel exporting the checkpoint
from inside the last chunk, ``reference.serial.chunks``) and the
shared-prefix checkpoint; the rules here are the reference's with both off.
"""

from __future__ import annotations

from collections.abc import Callable

import z3  # noqa: F401 - the proofs need z3: a missing solver fails at import, not mid-proof

from spec.geometry import Geo, Mode
from spec.radix import AND, NOT, OR, Count, Unit, _key

RULES = ("promise", "replay", "legacy")


def floor_to(x: Count, unit: Unit) -> Count:
    """``reference.boundaries.floor_to``."""
    return unit.floor(x)


# ------------------------------------------------------------- the scheduler


def attention_lookup(
    g: Geo, candidate: Count, reach: Count, eagle_drop: bool, ceiling: Count, tail: tuple[object, Count] | None = None
) -> Count:
    """``reference.boundaries.attention_lookup`` for the attention block A.

    ``unit`` is ``min(U, A)``: A in every other class (U = A there), the
    hash unit H in ``hashed``, where the lookup also probes the
    cached prompt's partial tail: ``tail`` = (usable, t), t taken when it
    lies past the whole blocks matched, within the next block and the hash
    floor of the limit, and off the block grid (``reference``'s ``tails``,
    here the one prompt ``dense_hit`` caches)."""
    sp = g.sp
    unit = g.U if g.fine else g.A
    limit = sp.min(candidate + unit, ceiling) if eagle_drop else candidate
    matched = floor_to(sp.max(sp.min(limit, reach), sp.zero), g.A)
    if tail is not None and g.fine:
        usable, t = tail
        top = sp.min(matched + g.A - g.H, floor_to(sp.max(limit, sp.zero), g.H))
        matched = sp.ite(AND(usable, matched < t, t <= top, NOT(g.A.divides(t))), t, matched)
    if eagle_drop:
        matched = sp.ite(matched > 0, matched - unit, matched)
    return matched


def fa_tail(g: Geo, mode: Mode, N: Count) -> Count:
    """``reference.boundaries.fa_tail`` (``hashed``): where an N-token
    prompt keys its full-attention partial tail, by the mode's kind
    (``Mode.fa_tail_kind``): the hash floor of N (``n``: 0.29.0, 0.30.0),
    of N-1 unless the drop is on (``cap``: 0.32.0), also capped at the
    hashed length (``cap_hashed``: 0.33.0). 0: none."""
    sp, H = g.sp, g.H
    kind = mode.fa_tail_kind
    top = N if (kind == "n" or mode.eagle_drop) else N - 1
    t = floor_to(sp.max(top, sp.zero), H)
    if kind == "cap_hashed":
        t = sp.min(t, floor_to(sp.max(N - mode.L, sp.zero), H))
    return sp.max(t, sp.zero)


def lookup(g: Geo, mode: Mode, N: Count, shared: Count) -> tuple[Count, Count]:
    """``reference.serial.lookup`` against one cached prompt of ``shared``
    tokens sharing all of them, dense ideal Mamba (``cache=None``; the
    ``tails`` of ``reference.serial.dense_hit``: that prompt's own
    full-attention partial tail, usable when its hash covers the L tokens
    after it and within the request's hashed length): (attention, hit).

    N >= 1, so the cap ``max(N-1, 0)`` is N-1. The Mamba fixed point settles
    after one pass (``_deepest_state`` is idempotent)."""
    sp, L = g.sp, mode.L
    cap = N - 1
    if g.unitary:
        c = cap
    elif g.fine:
        hashed = hashed_length(g, mode, N)
        ceiling = hashed if mode.ceiling == "hashed" else cap
        reach = floor_to(sp.max(sp.min(shared - L, hashed), sp.zero), g.A)
        t = fa_tail(g, mode, shared)
        c = attention_lookup(g, cap, reach, mode.eagle_drop, ceiling, (AND(t > 0, t + L <= shared, t <= hashed), t))
    else:
        ceiling = floor_to(N - L, g.H) if mode.ceiling == "hashed" else cap
        reach = floor_to(sp.max(shared - L, sp.zero), g.A)
        c = attention_lookup(g, cap, reach, mode.eagle_drop, ceiling)
    hit = floor_to(sp.max(sp.min(sp.min(c, shared - L), N - L), sp.zero), g.U)
    return c, hit


def dense_hit(g: Geo, mode: Mode, N: Count, shared: Count) -> Count:
    """``reference.serial.dense_hit``."""
    return lookup(g, mode, N, shared)[1]


def resend_boundary(g: Geo, mode: Mode, N: Count) -> Count:
    """Where an identical resend resumes under dense retention."""
    return dense_hit(g, mode, N, N)


def sibling_length(g: Geo, mode: Mode, N: Count) -> Count:
    """The longer sibling ``reference.serial.promise_boundaries`` uses:
    N + S + L + 1 tokens."""
    return (N + g.S) + (mode.L + 1)


def extension_boundary(g: Geo, mode: Mode, N: Count, N2: Count | None = None) -> Count:
    """Where a longer sibling of N2 > N tokens sharing all N resumes under
    dense retention (N2 defaults to ``sibling_length``)."""
    return dense_hit(g, mode, sibling_length(g, mode, N) if N2 is None else N2, N)


# ------------------------------------------------------------ the retention


def legacy_boundaries(g: Geo, N: Count) -> list[Count]:
    """``reference.boundaries.legacy_boundaries``: (N-1,)."""
    return [N - 1]


def replay_boundaries(g: Geo, N: Count, eagle_drop: bool) -> list[Count]:
    """``reference.boundaries.replay_boundaries``."""
    sp, S = g.sp, g.S
    if not eagle_drop:
        return [N - 1]
    resend = floor_to(N - 1, S)
    extension = floor_to(N, S)
    return [sp.max(resend - S, sp.zero), sp.max(extension - S, sp.zero)]


def promise_boundaries(g: Geo, mode: Mode, N: Count) -> list[Count]:
    """``reference.serial.promise_boundaries``: the resend and the longer
    sibling under dense retention."""
    return [resend_boundary(g, mode, N), extension_boundary(g, mode, N)]


def rule_boundaries(g: Geo, mode: Mode, rule: str, N: Count, junction: Count | None = None) -> list[Count]:
    """``reference.serial.rule_boundaries``. ``junction`` None means 0 (the
    first request of a trace); a Count J may be 0 (then adds nothing)."""
    if rule == "promise":
        out = promise_boundaries(g, mode, N)
    elif rule == "replay":
        out = replay_boundaries(g, N, mode.eagle_drop)
    elif rule == "legacy":
        out = legacy_boundaries(g, N)
    else:
        raise ValueError(f"rule {rule!r}: one of {RULES}")
    if junction is not None:
        out.append(junction)  # J = 0 marks block -1: nothing
        if rule == "replay" and mode.junction_back_off:
            out.append(junction - g.bs)
    return out


def kept_state(g: Geo, b: Count) -> Count:
    """``reference.boundaries.kept_state``: the boundary aligned down to U."""
    return floor_to(g.sp.max(b, g.sp.zero), g.U)


def mark(g: Geo, rule: str, b: Count) -> Count:
    """The Mamba state a boundary marks for keeping
    (``reference.serial.retained_states``): the kept state, aligned down to
    the Mamba block (the promise keeps it as is: a partial tail when U < M)."""
    k = kept_state(g, b)
    return k if rule == "promise" else floor_to(k, g.M)


def hashed_length(g: Geo, mode: Mode, N: Count) -> Count:
    """Tokens covered by the prompt's block hashes: floor((N-L)/H)*H."""
    return floor_to(g.sp.max(N - mode.L, g.sp.zero), g.H)


def tail_checkpoint(g: Geo, mode: Mode, rule: str, N: Count) -> Count:
    """``reference.boundaries.tail_checkpoint``: with partial hash hits, the
    prompt's own checkpoint, kept at hash granularity as a partial block.
    The kind (floor / floor_drop / checkpoint) is the version's
    (``Mode.tail_kind``)."""
    sp, H = g.sp, g.H
    kind = mode.tail_kind(rule)
    if kind == "floor":
        return floor_to(N, H)
    if kind == "floor_drop" or mode.eagle_drop:
        top = floor_to(N, H)
        return sp.max(top - H, sp.zero) if mode.eagle_drop else sp.max(top, sp.zero)
    return sp.max(floor_to(N - max(1, mode.L), H), sp.zero)


def last_cache_position(g: Geo, mode: Mode, N: Count) -> Count:
    """``last`` of ``reference.serial.chunk_ends``."""
    if mode.eagle_drop:
        return floor_to(N, g.bs) - g.bs
    if mode.ceiling == "hashed":
        return floor_to(N - max(1, mode.L), g.bs)
    return floor_to(N, g.bs)


def chunk_anchors(g: Geo, mode: Mode, rule: str, N: Count, junction: Count | None = None) -> list[tuple[object, Count]]:
    """The stops of ``reference.serial.chunk_ends`` from token 0 (hit 0) that
    do not depend on the chunk budget, as (present, position) pairs:
    ``last`` (present when 0 < last < N), the tail checkpoint (partial hash
    hits, when last < tail < N) and the junction J (when 0 < J < N; J is a
    multiple of A, hence of bs, so ``start + floor_to(J - start, bs)`` is J
    itself). Every anchor is then a multiple of bs, so no chunk starts
    mid-block and the mid-block stop never applies.

    ``hashed`` (bs = B above H): the tail checkpoint may lie mid-block; the
    chunk that starts there ends at the next block boundary (the mid-block
    stop; every budget end from there is past it), an anchor when it is
    below N. J is a multiple of H; its stop is ``floor_to(J, B)``, present
    when that is past 0 and J < N: the chunk holding J starts on the block
    grid below it (a chunk starting at the mid-block tail ends within the
    tail's block, and budget ends are on the block grid), so either an
    earlier stop ends that chunk, and the next one again starts on the grid
    at or below ``floor_to(J, B)``, or the junction stop ends it there."""
    last = last_cache_position(g, mode, N)
    out: list[tuple[object, Count]] = [(AND(last > 0, last < N), last)]
    if g.partial_hits is not False:
        tail = tail_checkpoint(g, mode, rule, N)
        present = AND(g.partial_hits, tail > 0, last < tail, tail < N)
        out.append((present, tail))
        if g.fine:
            following = floor_to(tail, g.bs) + g.bs
            out.append((AND(present, NOT(g.bs.divides(tail)), following < N), following))
    if junction is not None:
        if g.fine:
            stop = floor_to(junction, g.bs)
            out.append((AND(stop > 0, junction < N), stop))
        else:
            out.append((AND(junction > 0, junction < N), junction))
    return out


def _after(anchors: list[tuple[object, Count]], i: int | None, lo: Count, e: Count):
    """No present anchor other than the i-th lies strictly between lo and e:
    a chunk run that starts at lo reaches e unbroken."""
    return AND(*[NOT(AND(c, lo < a, a < e)) for k, (c, a) in enumerate(anchors) if k != i])


def run_start(g: Geo, anchors: list[tuple[object, Count]], p: Count) -> Count:
    """Where the run of c*S-token chunks that may end at p starts: the
    greatest present anchor below p, or 0. Built once per (p, anchors), so
    every caller asking about the same p shares one divisibility term."""
    sp = g.sp

    def build() -> Count:
        lo = sp.zero
        for c, a in anchors:
            lo = sp.ite(AND(c, a < p, lo < a), a, lo)
        return lo

    key = ("run-start", p.key, tuple((_key(c), a.key) for c, a in anchors))
    return sp.memo(key, build)


def chunk_end(
    g: Geo, mode: Mode, rule: str, N: Count, chunk=None, level: str = "oneshot", junction: Count | None = None
) -> Callable[[Count], object]:
    """A predicate: p is where a prefill chunk of a request with hit 0 ends
    (``reference.serial.chunk_ends(N, 0, J, ...)``; ``junction`` None is J = 0).

    The loop stops at every present anchor (``chunk_anchors``: ``last``, the
    tail checkpoint, the junction) and at N. ``level="oneshot"``: budget >= N,
    so those are the ends. ``chunk`` a z3 Int c >= 1: budget c*S, and between
    consecutive anchors the chunks end every c*S tokens counted from the
    anchor before (closed form of the loop: the budget and the anchors are
    multiples of bs, so no rounding or mid-block stop applies; in
    ``hashed`` the one mid-block anchor, the tail, is followed by the next
    block boundary or N, and p - tail is never a multiple of S): p < N is
    an end when p - lo is a positive multiple of c*S for an anchor lo (or 0)
    with no present anchor strictly between lo and p. ``level="mask"``: a
    chunk ends at every block (budget bs), i.e. at every multiple of bs up
    to N, and at the tail checkpoint (the callers only ask at such p)."""
    sp = g.sp
    if level == "mask":
        return lambda p: AND(p > 0, p <= N)
    anchors = chunk_anchors(g, mode, rule, N, junction)

    def is_end(p: Count):
        alts = [p == N] + [AND(c, p == a) for c, a in anchors]
        if chunk is not None:
            alts.append(AND(p > 0, p < N, sp.divisible(p - run_start(g, anchors, p), chunk)))
        return OR(*alts)

    return is_end


def cacheable_tokens(g: Geo, mode: Mode, end: Count) -> Count:
    """``reference.serial.cacheable_tokens`` without partial hash hits: how
    far a cache call after a chunk ending at ``end`` reaches, the end
    rounded down to S; an EAGLE group may add one Mamba block of its own."""
    sp = g.sp
    aligned = floor_to(end, g.S)
    if mode.eagle_drop:
        return sp.ite(aligned > 0, sp.min(end, aligned + g.M), aligned)
    return aligned


def covered(
    g: Geo, mode: Mode, rule: str, N: Count, chunk=None, level: str = "oneshot", junction: Count | None = None
) -> Callable[[Count], object]:
    """A predicate: some cache call of a request with hit 0 reaches exactly p
    (``{cacheable_tokens(e) for e in chunk_ends(...)}``). With partial hash
    hits a call reaches its chunk end, so this is ``chunk_end``. Without:

    * ``mask`` (a chunk ends at every block): p in (0, N] with
      ``cacheable_tokens(p) == p`` (an end beyond p reaches p only when p is
      such a fixed point too);
    * ``oneshot``: the ends are the present anchors (``last``, the junction)
      and N;
    * chunked (budget c*S): a chunk end ``lo + k*c*S`` (k >= 1, lo an anchor
      or 0, no anchor in between) reaches ``base(lo) + k*c*S``, base(lo)
      being ``cacheable_tokens(lo)`` without the ``aligned > 0`` guard (the
      cap moves with whole scheduler blocks; with the drop the cap is then
      always past 0: one block of M), so p is reached when p - base(lo) is a
      positive multiple of c*S whose end is below N and unbroken by another
      anchor, or p is an anchor's or N's own reach."""
    sp = g.sp
    ends = chunk_end(g, mode, rule, N, chunk, level, junction)
    if g.partial_hits is True:
        return ends

    def base(lo: Count) -> Count:
        top = floor_to(lo, g.S)
        return top + sp.min(lo - top, sp.zero + g.M) if mode.eagle_drop else top

    def nonpartial(p: Count):
        if level == "mask":
            return AND(p > 0, p <= N, cacheable_tokens(g, mode, p) == p)
        anchors = chunk_anchors(g, mode, rule, N, junction)
        alts = [cacheable_tokens(g, mode, N) == p] + [AND(c, cacheable_tokens(g, mode, a) == p) for c, a in anchors]
        if chunk is not None:
            starts = [(True, sp.zero, None)] + [(c, a, i) for i, (c, a) in enumerate(anchors)]
            for c, lo, i in starts:
                step = p - base(lo)
                end = lo + step
                alts.append(AND(c, step > 0, sp.divisible(step, chunk), end < N, _after(anchors, i, lo, end)))
        return OR(*alts)

    if g.partial_hits is False:
        return nonpartial
    return lambda p: OR(AND(g.partial_hits, ends(p)), AND(NOT(g.partial_hits), nonpartial(p)))


def retained(
    g: Geo,
    mode: Mode,
    rule: str,
    N: Count,
    *,
    level: str = "oneshot",
    chunk=None,
    junction: Count | None = None,
    interval=0,
):
    """``reference.serial.retained_states`` for a request with hit 0:
    (witnesses, keep). ``keep(p)``: the state after p tokens is kept;
    ``witnesses``: every p that can be kept apart from periodic multiples
    and, at denser retention, other written states (the marks and the tail
    checkpoint).

    Written: chunk ends (``chunk_end``, with the junction's stop) at Mamba
    block boundaries within the hashed length; the promise also writes its
    own boundaries and the junction's Mamba block floor_to(J, M) (a state
    inside a block has no slot of its own), by definition, and nothing
    else: a state exists only where a prefill chunk ended, under every
    retention, so a sibling diverging inside an earlier prompt is promised
    the divergence point only once a request has split its prefill there.
    For replay and legacy, with partial hash hits or from 0.32.0 on, also
    the prompt's checkpoint (the tail) when a cache call reaches exactly it
    (before 0.32.0 only when it is not a whole Mamba block). Kept: the
    written states among the marks (sparse: ``interval`` 0; periodic: a z3
    Int c, interval c*S, c = 0 meaning sparse; dense: None), plus the tail,
    which is keyed whatever the mask says."""
    hashed = hashed_length(g, mode, N)
    bounds = rule_boundaries(g, mode, rule, N, junction)
    if rule == "promise" and junction is not None:
        # ``reference.serial.promise_junction_state`` without the
        # shared-prefix checkpoint (left out here): the junction's Mamba block.
        bounds = rule_boundaries(g, mode, rule, N) + [floor_to(kept_state(g, junction), g.M)]
    marks = [mark(g, rule, b) for b in bounds]
    ends = chunk_end(g, mode, rule, N, chunk, level, junction)

    def written(p: Count):
        on_grid = AND(g.M.divides(p), ends(p))
        if rule == "promise":
            return AND(p > 0, p <= hashed, OR(on_grid, *[p == b for b in bounds]))
        return AND(p > 0, p <= hashed, on_grid)

    mask = retention_mask(g, rule, marks, hashed, interval)
    tail_kept = False
    witnesses = list(marks)
    tail = None
    checkpoint = mode.tail_kind(rule) == "checkpoint"
    applies = OR(g.partial_hits, checkpoint)
    if applies is not False and rule != "promise":
        tail = tail_checkpoint(g, mode, rule, N)
        reach = covered(g, mode, rule, N, chunk, level, junction)
        tail_kept = AND(applies, tail > 0, tail <= hashed, reach(tail), OR(NOT(g.M.divides(tail)), checkpoint))
        witnesses.append(tail)

    def keep(p: Count):
        by_tail = AND(tail_kept, p == tail) if tail is not None else False
        return OR(AND(written(p), mask(p)), by_tail)

    return witnesses, keep


def retention_mask(g: Geo, rule: str, marks: list[Count], hashed: Count, interval) -> Callable[[Count], object]:
    """The marks of ``reference.serial.retained_states`` (vLLM's
    ``MambaManager.reachable_block_mask``): ``interval`` None keeps every
    written state (dense); otherwise the marks, and with a positive interval
    c*S (``interval`` a z3 Int c; 0 = sparse) its multiples within the hashed
    length. (The reference's "an interval at or below M keeps every block" is
    the same set: an interval is a multiple of S >= M, so it is at or below M
    only when it equals M.)"""

    def keep(p: Count):
        marked = OR(*[p == k for k in marks])
        if interval is None:
            return True
        if isinstance(interval, int):
            if interval != 0:
                raise ValueError("a positive interval is a z3 Int c (interval c*S)")
            return marked
        return OR(marked, AND(interval > 0, p > 0, p <= hashed, g.sp.divisible(p, interval)))

    return keep
