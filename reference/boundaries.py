"""Boundary arithmetic: where a later request resumes, and which Mamba states
each retention rule keeps. Small pure functions over integers; ``spec/``
encodes the same functions in z3.

Vocabulary (one letter each, as in ``spec/``):

* ``N``: prompt length in tokens; ``S``: scheduler block; ``A``: attention
  block; ``M``: Mamba block; ``H``: hash block; ``U``: hit alignment unit
  (``S``, or ``H`` with partial hash hits); ``L``: hash lookahead tokens.
* A *boundary* is a token count b: "the state after the first b tokens".
  A boundary of 0 is no boundary (a hit of 0 is a miss).
"""

from __future__ import annotations


def floor_to(x: int, unit: int) -> int:
    """The largest multiple of ``unit`` that is <= x (x >= 0)."""
    return x // unit * unit


# ------------------------------------------------------------- the scheduler


def attention_lookup(
    candidate: int,
    reach: int,
    A: int,
    U: int,
    eagle_drop: bool,
    ceiling: int,
    tails: tuple[int, ...] = (),
    H: int | None = None,
) -> int:
    """One full-attention group's answer to a candidate hit length
    (``FullAttentionManager.find_longest_cache_hit``, vLLM 0.29.0-0.33.0).

    With the EAGLE drop the lookup may read one unit past the candidate,
    ``min(candidate + min(U, A), ceiling)`` (``eagle_proof_margin``: a hash
    unit when hits are finer than the block, else the block); without it, up
    to the candidate. It matches the longest run of cached A-blocks within
    that limit and ``reach`` (how far cached blocks go); with partial hash
    hits (U < A) it then probes, inside the next block only, the earlier
    prompts' partial tails (``tails``: hash boundaries not on the A grid,
    each keyed by its own prompt) up to ``floor(limit/H)*H``. With the drop
    it finally drops ``min(U, A)`` tokens so the drafter's hidden state is
    recomputed. ``ceiling`` is N-1 (0.29.0/0.30.0) or the request's hashed
    length (0.32.0+).
    """
    unit = min(U, A)
    limit = min(candidate + unit, ceiling) if eagle_drop else candidate
    matched = floor_to(max(min(limit, reach), 0), A)
    if tails and H is not None and H < A:
        top = min(matched + A - H, floor_to(max(limit, 0), H))
        inside = [t for t in tails if matched < t <= top and t % A]
        if inside:
            matched = max(inside)
    if eagle_drop and matched > 0:
        matched -= unit
    return matched


def fa_tail(N: int, H: int, L: int, eagle_drop: bool, rule: str) -> int:
    """Where a prompt's full-attention partial tail is keyed, with partial
    hash hits (``FullAttentionManager._cache_partial_tail_block``): the last
    hash boundary at or below N (``n``: 0.29.0, 0.30.0), or below N-1 unless
    the drop is on (``cap``: 0.32.0), also capped at the hashed length
    floor((N-L)/H)*H (``cap_hashed``: 0.33.0). 0 for none."""
    top = N if (rule == "n" or eagle_drop) else N - 1
    t = floor_to(max(top, 0), H)
    if rule == "cap_hashed":
        t = min(t, floor_to(max(N - L, 0), H))
    return max(t, 0)


def mamba_checkpoint_position(N: int, unit: int, eagle_drop: bool, L: int = 0) -> int:
    """vLLM 0.32.0+ ``get_mamba_prefill_checkpoint_position``: the last
    ``unit`` boundary leaving a token to recompute and the lookahead the hash
    covers (floor((N - max(1, L))/unit)*unit), or, under the drop, one unit
    below floor(N/unit)*unit. Never below 0."""
    if eagle_drop:
        return max(floor_to(N, unit) - unit, 0)
    return max(floor_to(N - max(1, L), unit), 0)


def internal_checkpoint_valid(start: int, end: int, position: int, H: int, B: int, grid: int | None) -> bool:
    """vLLM 0.32.0+ ``is_mamba_prefill_checkpoint_valid``: can the kernel
    export the state at ``position`` from inside the chunk [start, end)? The
    chunk starts on a hash boundary, reaches at least two Mamba blocks past
    the one holding its initial state, the position lies strictly inside it
    at least a hash unit past the start, on the grid counted from the start."""
    if grid is None:
        return False
    return (
        start % H == 0
        and -(-end // B) - 2 > (start - 1) // B
        and start + H <= position
        and start < position < end
        and (position - start) % grid == 0
    )


def resend_boundary(N: int, S: int, eagle_drop: bool, *, L: int = 0, ceiling: str = "n_minus_1") -> int:
    """Where an identical resend of an N-token prompt resumes under dense
    retention, for a uniform hybrid geometry only (A = M = S, hits on S);
    ``serial.dense_hit`` states it for every geometry.

    Capped at N-1, floored to S; the EAGLE drop then backs off one block. With
    lookahead hashes a block counts only if L more tokens follow it. With the
    0.33.0 ceiling the drop's lookup may reach the last full block, so a
    block-aligned prompt lands one block higher than under 0.29.0/0.30.0.
    """
    cap = N - 1
    reach = floor_to(N - L, S)
    top = floor_to(N - L, S) if ceiling == "hashed" else cap
    return floor_to(max(attention_lookup(cap, reach, S, S, eagle_drop, top), 0), S)


def extension_boundary(N: int, S: int, eagle_drop: bool, *, L: int = 0) -> int:
    """Where a longer sibling (a later prompt that extends this one) resumes
    under dense retention (uniform hybrid geometry, A = M = S): the last full block of the prompt (one that L more
    tokens follow), minus one block with the EAGLE drop."""
    reach = floor_to(N - L, S)
    if eagle_drop:
        return max(reach - S, 0)
    return reach


# ------------------------------------------------------------ the retention


def legacy_boundaries(N: int) -> tuple[int, ...]:
    """vLLM <= 0.29.0 (``MambaManager.cache_blocks``): keep the state at N-1
    (aligned down by the mask), with no EAGLE adjustment."""
    return (N - 1,)


def replay_boundaries(N: int, S: int, eagle_drop: bool) -> tuple[int, ...]:
    """vLLM 0.30.0-0.33.0 (``kv_cache_coordinator.replay_boundaries``).

    Without the drop: N-1. With it: the resend's floor((N-1)/S)*S and the
    extension's floor(N/S)*S, each backed off one block (never below 0).
    """
    if not eagle_drop:
        return (N - 1,)
    resend = floor_to(N - 1, S)
    extension = floor_to(N, S)
    return tuple(sorted({max(resend - S, 0), max(extension - S, 0)}))


def promise_boundaries(N: int, S: int, eagle_drop: bool, *, L: int = 0, ceiling: str = "n_minus_1") -> tuple[int, ...]:
    """The promise for a uniform hybrid geometry (A = M = S): keep exactly
    where this prompt's identical resend and its longer siblings resume under
    dense retention. ``serial.promise_boundaries`` is the general form."""
    return tuple(
        sorted({resend_boundary(N, S, eagle_drop, L=L, ceiling=ceiling), extension_boundary(N, S, eagle_drop, L=L)})
    )


def kept_state(boundary: int, U: int) -> int:
    """The state a boundary marks: the boundary aligned down to the hit unit
    U. Without partial hash hits U = S, a multiple of M, so this is the state
    in block ``floor(b/S)*S/M - 1``. The promise keeps it as is; the vLLM
    rules (``serial.retained_states``) floor it further to a Mamba block, and
    keep sub-block states only as the prompt's tail checkpoint. 0: none."""
    return floor_to(max(boundary, 0), U)


def tail_checkpoint(N: int, H: int, eagle_drop: bool, L: int, rule: str) -> int:
    """With partial hash hits, the prompt's own checkpoint state, kept at hash
    granularity as a partial block (``MambaManager._cache_partial_tail_block``).

    ``floor`` (0.29.0): the last hash boundary, floor(N/H)*H. ``floor_drop``
    (0.30.0): one hash unit lower under the EAGLE drop. ``checkpoint``
    (0.32.0+, ``get_mamba_prefill_checkpoint_position``): under the drop
    floor(N/H)*H - H, else floor((N - max(1, L))/H)*H, leaving a token to
    recompute and the lookahead the hash covers.
    """
    if rule == "floor":
        return floor_to(N, H)
    if rule == "floor_drop" or eagle_drop:
        return max(floor_to(N, H) - (H if eagle_drop else 0), 0)
    return max(floor_to(N - max(1, L), H), 0)


def resumable_states(N: int, S: int, U: int, H: int, M: int, eagle_drop: bool, L: int) -> frozenset[int]:
    """Every state of an N-token prompt a later request can resume at under
    the promise or vLLM 0.30.0-0.33.0's replay rule, whichever alignment it
    is kept at: the resend's and the longer sibling's boundaries (both
    ceilings), the replay rule's, the prompt's checkpoint (tail and
    ``get_mamba_prefill_checkpoint_position`` on each grid), each aligned
    down to the hit unit U, the hash block H and the Mamba block M. Sparse retention exists to keep nothing else (0 excluded)."""
    marks = {resend_boundary(N, S, eagle_drop, L=L, ceiling=c) for c in ("n_minus_1", "hashed")}
    marks.add(extension_boundary(N, S, eagle_drop, L=L))
    marks.update(replay_boundaries(N, S, eagle_drop))
    marks.update(mamba_checkpoint_position(N, u, eagle_drop, L) for u in {S, U, H})
    marks.update(tail_checkpoint(N, H, eagle_drop, L, rule) for rule in ("floor_drop", "checkpoint"))
    out = {floor_to(max(b, 0), u) for b in marks for u in {U, H, M}}
    return frozenset(out - {0})


def junction_states(J: int, U: int, M: int, eagle: bool) -> frozenset[int]:
    """The states a later sibling can resume at for a shared-prefix junction
    J (a request's observed divergence point from an earlier prompt): J
    itself (where the shared-prefix checkpoint writes it), and, since a
    state inside a Mamba block has no slot of its own, the block ending at
    or below J aligned down to the hit unit U; with speculative decoding
    also the one for J less a Mamba block (a sibling diverging right after
    the junction has no block past it to peek at, so its hit lands one
    block lower). As vLLM 0.33.0 keeps them under sparse retention
    (``MambaManager.cache_blocks`` passes the junction, and under EAGLE the
    junction less a block, to ``reachable_block_mask``). 0 excluded."""
    if J <= 0:
        return frozenset()
    marks = {J, floor_to(floor_to(J, U), M)}
    if eagle:
        marks.add(floor_to(floor_to(max(J - M, 0), U), M))
    return frozenset(marks - {0})


def retention_period(interval: int, M: int) -> int:
    """The period, in tokens, of the Mamba states periodic retention keeps
    on Mamba block M (interval > 0): the block ending at every multiple of
    ``interval // M`` blocks, every block when that is under two (vLLM
    ``MambaManager.reachable_block_mask``, 0.33.0
    single_type_kv_cache_manager.py:1584-1594, 0.32.0 :1568-1577). vLLM
    accepts only intervals that are multiples of the scheduler block
    (kv_cache_coordinator.py:57-61 in 0.32.0 and 0.33.0; kvspec's case
    parser says the same), itself a multiple of M: there the period is the
    interval itself."""
    per_segment = interval // M
    return M if per_segment <= 1 else per_segment * M
