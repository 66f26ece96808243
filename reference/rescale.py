"""A case with one block size mapped onto another: one rule for the three
places that move a case across blocks (the shrinker's smaller block,
a z3 boundary case on a real deployment's block, a replay on a live
server's block).

The rule: a length ``q*old + r`` becomes ``q*new + r'`` with r' in the same
boundary class (0, +1/+2, -1/-2, else proportional, kept clear of those
classes), so a boundary rule that reads the residue reads the same class
after the move; a chunk budget or a retention interval that is a multiple
of the block scales with it (one that is not, proportionally); an output
segment keeps its request's ``max_tokens``. The geometry keeps every field
that is not a block (the prefill checkpoint grid, the shared-prefix
checkpoint). Pure arithmetic over ``reference.case``; whether a moved case
keeps its pattern is the caller's question (the shrinker's predicate, the
reference prediction compared in blocks).
"""

from __future__ import annotations

from dataclasses import replace

from reference.case import DEFAULT_MAX_NUM_BATCHED_TOKENS, Case, Group, Request, Segment


def rescale_length(length: int, old: int, new: int) -> int:
    """Map ``q*old + r`` to ``q*new + r'`` keeping the boundary class of r:
    0 stays 0, +1/+2 stay +1/+2, -1/-2 (old-1, old-2) stay -1/-2, anything
    else moves proportionally, kept clear of those classes."""
    q, r = divmod(length, old)
    if r == 0:
        r2 = 0
    elif r <= 2:
        r2 = r
    elif old - r <= 2:
        r2 = new - (old - r)
    else:
        r2 = min(max(round(r * new / old), 3), new - 3)
    return q * new + r2


def rescale_trace(trace: tuple[Request, ...], old: int, new: int) -> tuple[Request, ...]:
    """Each stream segment's length moved by :func:`rescale_length` (at
    least 1 token); an output segment is kept as it is."""
    return tuple(
        replace(
            r,
            prompt=tuple(
                s if s.output is not None else Segment(s.segment, max(1, rescale_length(s.length, old, new)))
                for s in r.prompt
            ),
        )
        for r in trace
    )


def rescale_budget(budget: int, old: int, new: int) -> int:
    """A chunk budget on the new block: a multiple of the old block scales
    exactly, any other budget proportionally; never under one new block."""
    scaled = budget // old * new if budget % old == 0 else round(budget * new / old)
    return max(new, scaled)


def rescale_interval(interval: int | None, old: int, new: int) -> int | None:
    """A periodic retention interval scaled by whole blocks; dense (None)
    and sparse (0) stay as they are."""
    return interval // old * new if interval else interval


def rescale_case(case: Case, old: int, new: int) -> Case:
    """``case`` (a hand geometry whose groups all have block ``old``) on
    block ``new``: groups, hash and scheduler blocks on ``new`` (no finer
    match unit), lengths, interval and budget moved by the rules above; the
    default budget stays the default."""
    g = case.geometry
    budget = g.max_num_batched_tokens
    if budget != DEFAULT_MAX_NUM_BATCHED_TOKENS:
        budget = rescale_budget(budget, old, new)
    groups = tuple(Group(x.kind, new, x.count) for x in g.groups)
    interval = rescale_interval(g.retention_interval, old, new)
    geometry = replace(
        g,
        groups=groups,
        hash_block_size=new,
        scheduler_block_size=new,
        prefix_match_unit=None,
        retention_interval=interval,
        max_num_batched_tokens=budget,
    )
    return replace(case, geometry=geometry, trace=rescale_trace(case.trace, old, new))
