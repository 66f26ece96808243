"""Planted mutations: a proof that cannot fail proves nothing.

Each mutation is a copy of one rule of ``spec.rules`` with a plausible slip
(the kind the vLLM history has: N instead of N-1, a missing EAGLE shift, one
boundary instead of two, interval 0 read as dense). ``planted`` swaps it in
for the duration of a ``with`` block; the rows listed with it are proved
with the real rules and must come out refuted with the mutant. A slip no
row can see (R1/R2 target the Mamba block a boundary lands on, so a
``hashed`` boundary one hash unit lower often keeps the same verdict) lists
instead the (geometry, mode) pairs on which ``spec.fidelity``'s comparison
of the terms with the reference must find it (and finds nothing with the
real rules).

The rule: each mutant declares itself with ``@mutation(name, target,
*rows, terms=...)``: the ``spec.rules`` function it replaces, then the
catalogue rows it must refute (and the term comparisons that must find it).
``MUTATIONS`` is the registry in declaration order, so the order of the
functions below is the order the mutations are run and listed in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from spec import rules as R
from spec.catalogue import Row
from spec.geometry import Concrete, Geo, Mode
from spec.radix import AND, NOT, OR, Count

#: The real rules, taken before any mutant is planted.
_REAL = {
    name: getattr(R, name)
    for name in ("replay_boundaries", "lookup", "retained", "chunk_end", "attention_lookup", "chunk_anchors")
}

# ---------------------------------------------------------- the declaration


@dataclass(frozen=True)
class Mutation:
    name: str
    target: str  # the spec.rules function replaced
    mutant: Callable
    catches: tuple[Row, ...]  # rows proved with the real rule, refuted with the mutant
    #: (geometry, mode name) pairs where ``spec.fidelity.term_disagreements``
    #: finds the mutant (and nothing with the real rule).
    terms: tuple[tuple[Concrete, str], ...] = ()


def _r(prop: str, geometry: str, rule: str | None, mode: str, level: str | None = "mask") -> Row:
    return Row(prop, geometry, mode, rule, level)


#: The hashed geometry the term comparisons of the issue 9 mutations run on.
HASHED = Concrete.hashed(32, 8)


#: The registry, filled by ``@mutation`` in declaration order.
_DECLARED: list[Mutation] = []


def mutation(name: str, target: str, *catches: Row, terms: tuple[tuple[Concrete, str], ...] = ()):
    """Declare the decorated function a mutant of ``spec.rules.<target>``
    that the rows ``catches`` (and the ``terms`` comparisons) must refute;
    the function itself is returned unchanged. Stack it to declare one function
    under several names (the decorator nearest the ``def`` declares first)."""

    def declare(mutant: Callable) -> Callable:
        _DECLARED.append(Mutation(name, target, mutant, catches, terms))
        return mutant

    return declare


# ------------------------------------------------------------- the mutants


@mutation("replay: N instead of N-1", "replay_boundaries", _r("R1", "uniform", "replay", "drop/0.30"))
def replay_N_not_N_minus_1(g: Geo, N: Count, eagle_drop: bool) -> list[Count]:
    """replay_boundaries with floor(N/S) where vLLM has floor((N-1)/S)."""
    sp, S = g.sp, g.S
    if not eagle_drop:
        return [N]
    return [sp.max(R.floor_to(N, S) - S, sp.zero), sp.max(R.floor_to(N, S) - S, sp.zero)]


@mutation(
    "replay: no EAGLE shift",
    "replay_boundaries",
    _r("R1", "aligned", "replay", "drop/0.30"),
    _r("R2", "uniform", "replay", "drop/0.30"),
)
def replay_no_shift(g: Geo, N: Count, eagle_drop: bool) -> list[Count]:
    """replay_boundaries without the EAGLE back-off of one block."""
    if not eagle_drop:
        return [N - 1]
    return [R.floor_to(N - 1, g.S), R.floor_to(N, g.S)]


@mutation("replay: only the extension boundary", "replay_boundaries", _r("R1", "uniform", "replay", "drop/0.30"))
def replay_only_extension(g: Geo, N: Count, eagle_drop: bool) -> list[Count]:
    """replay_boundaries keeping only the extension boundary."""
    sp, S = g.sp, g.S
    if not eagle_drop:
        return [N - 1]
    return [sp.max(R.floor_to(N, S) - S, sp.zero)]


@mutation("replay: only the resend boundary", "replay_boundaries", _r("R2", "uniform", "replay", "drop/0.30"))
def replay_only_resend(g: Geo, N: Count, eagle_drop: bool) -> list[Count]:
    """replay_boundaries keeping only the resend boundary."""
    sp, S = g.sp, g.S
    if not eagle_drop:
        return [N - 1]
    return [sp.max(R.floor_to(N - 1, S) - S, sp.zero)]


@mutation(
    "replay: shift without the drop",
    "replay_boundaries",
    _r("R1", "aligned", "replay", "plain/0.33"),
    _r("eagle-off", "uniform", None, "plain/0.30", None),
)
def replay_shift_always(g: Geo, N: Count, eagle_drop: bool) -> list[Count]:
    """replay_boundaries shifting even without the drop."""
    return _REAL["replay_boundaries"](g, N, True)


@mutation("legacy: N instead of N-1", "legacy_boundaries", _r("R1", "uniform", "legacy", "plain/0.30"))
def legacy_N(g: Geo, N: Count) -> list[Count]:
    """legacy_boundaries with N where vLLM has N-1."""
    return [N]


@mutation(
    "lookup: EAGLE drop forgotten",
    "attention_lookup",
    _r("R1", "uniform", "replay", "drop/0.30"),
    _r("R2", "aligned", "replay", "drop/0.33"),
)
def attention_no_drop(g: Geo, candidate: Count, reach: Count, eagle_drop: bool, ceiling: Count, tail=None) -> Count:
    """attention_lookup that forgets to drop the last block (and, in
    ``hashed``, the partial tail)."""
    sp = g.sp
    limit = sp.min(candidate + g.A, ceiling) if eagle_drop else candidate
    return R.floor_to(sp.max(sp.min(limit, reach), sp.zero), g.A)


@mutation(
    "lookup: cap N instead of N-1",
    "lookup",
    _r("R1", "uniform", "legacy", "plain/0.30"),
    _r("R1", "unitary", "replay", "plain/0.33"),
)
def lookup_cap_N(g: Geo, mode: Mode, N: Count, shared: Count) -> tuple[Count, Count]:
    """lookup capped at N where vLLM caps at N-1."""
    sp, L = g.sp, mode.L
    cap = N
    if g.unitary:
        c = cap
    else:
        ceiling = R.floor_to(N - L, g.H) if mode.ceiling == "hashed" else cap
        reach = R.floor_to(sp.max(shared - L, sp.zero), g.A)
        c = R.attention_lookup(g, cap, reach, mode.eagle_drop, ceiling)  # no partial tail: an issue 4 class slip
    hit = R.floor_to(sp.max(sp.min(sp.min(c, shared - L), N - L), sp.zero), g.U)
    return c, hit


@mutation("lookup: lookahead tokens ignored", "lookup", _r("R2", "uniform", "replay", "lookahead/0.33"))
def lookup_no_lookahead(g: Geo, mode: Mode, N: Count, shared: Count) -> tuple[Count, Count]:
    """lookup that matches the shared blocks without the L tokens their
    hashes also cover."""
    from dataclasses import replace

    return _REAL["lookup"](g, replace(mode, L=0), N, shared)


@mutation("lookup: unitary Mamba shifted", "lookup", _r("unitary-unshifted", "unitary", None, "drop/0.30", None))
def lookup_unitary_shifted(g: Geo, mode: Mode, N: Count, shared: Count) -> tuple[Count, Count]:
    """lookup that applies the EAGLE drop to a unitary Mamba layout too."""
    c, hit = _REAL["lookup"](g, mode, N, shared)
    if g.unitary and mode.eagle_drop:
        hit = g.sp.ite(hit > 0, hit - g.S, hit)
    return c, hit


@mutation(
    "mask: interval 0 read as dense", "retention_mask", _r("no-over-retention", "uniform", "replay", "drop/0.30", None)
)
def mask_zero_is_dense(g: Geo, rule: str, marks: list[Count], hashed: Count, interval):
    """reachable_block_mask computing interval // M <= 1 without the
    interval > 0 guard: interval 0 reads as dense."""

    def keep(p: Count):
        marked = OR(*[p == k for k in marks])
        if interval is None:
            return True
        if isinstance(interval, int):
            return True
        return OR(marked, interval <= 1, AND(interval > 0, g.sp.divisible(p, interval)))

    return keep


@mutation(
    "chunks: no stop at the last cache position",
    "chunk_end",
    _r("R2", "uniform", "replay", "drop/0.30", "oneshot"),
    _r("R1", "partial", "replay", "plain/0.33", "oneshot"),
)
def chunks_skip_last(g: Geo, mode: Mode, rule: str, N: Count, chunk=None, level: str = "oneshot", junction=None):
    """chunk_ends that never stops at the last cache position."""
    if level == "mask":
        return lambda p: AND(p > 0, p <= N)
    return lambda p: p == N


@mutation(
    "retention: no partial-tail checkpoint",
    "retained",
    _r("R1", "partial", "replay", "drop/0.33"),
    _r("R1", "partial", "replay", "plain/0.33", "oneshot"),
)
def no_tail_checkpoint(g: Geo, mode: Mode, rule: str, N: Count, **kw):
    """retained_states without the prompt's checkpoint (the tail), neither
    the partial-hash-hit one nor the 0.32.0+ one."""
    from dataclasses import replace

    real = _REAL["retained"]
    saved = g.partial_hits
    g.partial_hits = False
    try:  # a version before 0.32.0 keys no checkpoint without partial hits
        return real(g, replace(mode, version="0.31.0", legacy_version="0.31.0"), rule, N, **kw)
    finally:
        g.partial_hits = saved


@mutation(
    "chunks: no stop at the junction",
    "chunk_end",
    _r("junction-observed", "uniform", "replay", "plain/0.33", "oneshot/sparse"),
    _r("junction-observed", "aligned", "legacy", "drop/0.30", "oneshot/dense"),
)
def chunks_skip_junction(g: Geo, mode: Mode, rule: str, N: Count, chunk=None, level: str = "oneshot", junction=None):
    """chunk_ends without the stop at the junction (the prefill is not split
    where the sibling diverged)."""
    return _REAL["chunk_end"](g, mode, rule, N, chunk, level)


@mutation(
    "promise: every Mamba block written (issue 10)",
    "retained",
    _r("junction-unobserved", "uniform", "promise", "plain/0.33", "oneshot/dense"),
    _r("junction-unobserved", "aligned", "promise", "drop/0.33", "oneshot/periodic"),
)
def promise_every_block_written(g: Geo, mode: Mode, rule: str, N: Count, **kw):
    """retained_states as before issue 10: the promise assumes every Mamba
    block state written, not only the chunk ends (so under dense or periodic
    retention it claims a divergence point no request has observed)."""
    if rule == "promise":
        kw = {**kw, "level": "mask", "chunk": None}
    return _REAL["retained"](g, mode, rule, N, **kw)


# ------------------------------------------- the hashed class (issue 9)


@mutation(
    "fine lookup: the hash unit read past the candidate is not dropped",
    "attention_lookup",
    _r("R1", "hashed", "replay", "drop/0.33"),
    _r("R2", "hashed", "legacy", "drop/0.33", "oneshot"),
    terms=((HASHED, "drop/0.30"),),
)
def fine_lookup_no_drop(g: Geo, candidate: Count, reach: Count, eagle_drop: bool, ceiling: Count, tail=None) -> Count:
    """attention_lookup with partial hash hits (``hashed``) that reads one
    hash unit past the candidate, as vLLM's margin does, but forgets to drop
    it again."""
    if not g.fine:
        return _REAL["attention_lookup"](g, candidate, reach, eagle_drop, ceiling, tail)
    sp = g.sp
    limit = sp.min(candidate + g.U, ceiling) if eagle_drop else candidate
    matched = R.floor_to(sp.max(sp.min(limit, reach), sp.zero), g.A)
    if tail is not None:
        usable, t = tail
        top = sp.min(matched + g.A - g.H, R.floor_to(sp.max(limit, sp.zero), g.H))
        matched = sp.ite(AND(usable, matched < t, t <= top, NOT(g.A.divides(t))), t, matched)
    return matched


@mutation(
    "fine lookup: whole blocks only (no partial tail)",
    "attention_lookup",
    terms=((HASHED, "plain/0.33"), (HASHED, "lookahead/0.33")),
)
def fine_lookup_whole_blocks(
    g: Geo, candidate: Count, reach: Count, eagle_drop: bool, ceiling: Count, tail=None
) -> Count:
    """attention_lookup (``hashed``) that matches whole blocks only, as
    without partial hash hits: the cached prompt's partial tail is never
    probed."""
    return _REAL["attention_lookup"](g, candidate, reach, eagle_drop, ceiling, None)


@mutation("fine lookup: partial tail keyed at floor(N/H)*H from 0.32.0 on", "fa_tail", terms=((HASHED, "plain/0.33"),))
def fa_tail_uncapped(g: Geo, mode: Mode, N: Count) -> Count:
    """fa_tail keyed at floor(N/H)*H in every version (0.29.0/0.30.0's key;
    0.32.0+ keys floor((N-1)/H)*H without the drop)."""
    return R.floor_to(N, g.H)


@mutation("chunks: no stop at the block after a mid-block tail", "chunk_anchors", terms=((HASHED, "drop/0.33"),))
def anchors_no_following_block(g: Geo, mode: Mode, rule: str, N: Count, junction=None):
    """chunk_anchors (``hashed``) without the stop at the block boundary that
    follows a mid-block tail checkpoint (a chunk starting mid-block runs on
    to the budget)."""
    out = _REAL["chunk_anchors"](g, mode, rule, N, junction)
    if not g.fine:
        return out
    return out[:2] + out[3:]  # last, tail, [following], [junction]


@mutation(
    "chunks: junction stop not floored to the block",
    "chunk_anchors",
    _r("junction-observed", "hashed", "replay", "plain/0.33", "oneshot/sparse"),
    _r("junction-observed", "hashed", "legacy", "drop/0.30", "chunked/dense"),
    terms=((HASHED, "plain/0.30"),),
)
def anchors_junction_unfloored(g: Geo, mode: Mode, rule: str, N: Count, junction=None):
    """chunk_anchors (``hashed``) stopping at the junction J itself, as with
    every junction on the block grid, where vLLM floors it to the block
    (``start + floor_to(J - start, B)``; J itself only with the
    shared-prefix checkpoint)."""
    out = _REAL["chunk_anchors"](g, mode, rule, N, None)
    if junction is not None:
        out.append((AND(junction > 0, junction < N), junction))
    return out


# ------------------------------------------------------------- the catalogue

#: Every declared mutation, in declaration order.
MUTATIONS = tuple(_DECLARED)
MUTATION = {m.name: m for m in MUTATIONS}
assert len(MUTATION) == len(MUTATIONS), "two mutations share a name"


@contextmanager
def planted(mutation: Mutation) -> Iterator[None]:
    """Swap the mutant in for ``mutation.target`` (``spec.rules`` calls its
    functions through module globals, so every caller sees it)."""
    real = getattr(R, mutation.target)
    setattr(R, mutation.target, mutation.mutant)
    try:
        yield
    finally:
        setattr(R, mutation.target, real)
