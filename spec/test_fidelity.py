"""Encodings vs the Python reference (``reference/``), so the two cannot
drift: the reference is ground truth, the encodings are checked against it.

* knobs: every serving mode is what ``resolve_knobs`` gives its version;
* geometry classes: exactly the geometries ``resolve_knobs`` supports
  that a deployment can build (the rest: hand geometries with two block
  sizes and a hash unit below both);
* properties: R1/R2 for every rule, mode and level, by interval splitting
  over N (``spec.fidelity.compare_batch``);
* terms: resend/sibling boundaries, rule boundaries, last cache position,
  tail checkpoint, hashed length, the full-attention partial tail, chunk
  ends and kept states (with and without a junction) at sampled N
  (``spec.fidelity.term_disagreements``);
* internal prefill checkpoints, which the encoding leaves out: on the
  named H100 geometries (where vLLM 0.33.0 has them) the reference's R1/R2
  and junction-observed truth does not change with them;
* the junction (issue 10): junction-observed (every rule) and
  junction-unobserved (the promise), every level and retention, over every
  N and junction J (``spec.fidelity.compare_junction``).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from ground.errors import KvspecError
from reference.case import parse_case
from reference.knobs import resolve_knobs
from reference.reachability import geometry_reachability
from spec.fidelity import compare_batch, compare_junction, term_disagreements
from spec.geometry import MODE, MODES, NAMED, NAMED_BY, Concrete
from spec.oracle import Oracle, knobs_match, resolved
from spec.parallel import pmap, sharded

RULES = ("promise", "replay", "legacy")

#: One geometry per class, small enough for N to cover several blocks.
FAST_GEOMETRIES = (
    Concrete.from_blocks(16, 16),  # uniform
    Concrete.from_blocks(32, 16),  # aligned
    Concrete.from_blocks(16, 32),  # partial
    Concrete.from_blocks(None, 16),  # unitary
    Concrete.hashed(32, 8),  # hashed (attention = Mamba = 32, hash unit 8)
)
HASHED = FAST_GEOMETRIES[4]
#: Odd and tiny blocks (u = 1, 2, 3: every carry of the digit code).
TINY_GEOMETRIES = tuple(
    [Concrete.from_blocks(a, m) for a, m in ((1, 1), (2, 1), (3, 1), (1, 3), (2, 6), (3, 3), (6, 2), (4, 12), (5, 5))]
    + [Concrete.from_blocks(None, 1), Concrete.from_blocks(None, 3)]
    + [Concrete.hashed(b, h) for b, h in ((2, 1), (6, 2), (6, 3))]
)
#: The slow domain: every shape with S <= 64 whose blocks are multiples of 8
#: (hashed: a few, each H | B: 16/8, 24/8, 48/16, 64/16, 64/32), plus the
#: tiny blocks.
SLOW_GEOMETRIES = tuple(
    [
        Concrete.from_blocks(a, m)
        for S in range(8, 65, 8)
        for a in range(8, S + 1, 8)
        for m in range(8, S + 1, 8)
        if math.lcm(a, m) == S and (a % m == 0 or m % a == 0)
    ]
    + [Concrete.from_blocks(None, S) for S in range(8, 65, 8)]
    + [Concrete.hashed(b, h) for b, h in ((16, 8), (24, 8), (48, 16), (64, 16), (64, 32))]
    + list(TINY_GEOMETRIES)
)


@pytest.mark.parametrize("geo", [*NAMED, *FAST_GEOMETRIES], ids=lambda g: g.label())
def test_modes_are_what_versions_resolve(geo: Concrete) -> None:
    for mode in MODES:
        for rule in RULES:
            _, knobs = resolved(geo, mode.name, rule)
            assert knobs_match(mode, knobs), (mode.name, rule, knobs)
            assert knobs.tail_checkpoint == mode.tail_kind(rule)
            assert knobs.junction_back_off == mode.junction_back_off
            assert knobs.fa_tail == mode.fa_tail_kind
            assert knobs.partial_hash_hits == (geo.cls in ("partial", "hashed"))
            assert (knobs.alignment, knobs.hash_block_size) == (geo.U, geo.H)


def _outside_classes(limit: int) -> list[tuple[int, int, int, bool, int, bool | None]]:
    """Every (A, M, hash block H) with blocks up to ``limit``: checks that
    each geometry of a class is supported by resolve_knobs with the class's
    S, H, U and smallest block, and returns the supported geometries that
    are in no class, as (A, M, H, partial hash hits, U, reachable: whether
    a deployment could build it, ``reference.reachability``)."""
    outside = []
    for A in range(1, limit + 1):
        for M in range(1, limit + 1):
            for H in [d for d in range(1, min(A, M) + 1) if A % d == 0 and M % d == 0]:
                raw = {
                    "schema": 1,
                    "geometry": {
                        "groups": [{"kind": "full_attention", "block_size": A}, {"kind": "mamba", "block_size": M}],
                        "prefix_match_unit": H,
                    },
                    "trace": [{"prompt": [{"segment": "A", "length": 1}]}],
                }
                try:
                    case = parse_case(raw)
                    knobs = resolve_knobs(case, "0.33.0")
                    supported = True
                except KvspecError:
                    supported = False
                try:
                    geo = Concrete.from_blocks(A, M, H=H)
                    in_class = H == geo.H
                except ValueError:
                    in_class = False
                if in_class:
                    assert supported, (A, M, H)
                    assert (case.geometry.scheduler_block_size, case.geometry.hash_block_size, knobs.alignment) == (
                        geo.S,
                        geo.H,
                        geo.U,
                    )
                    assert min(A, M) == geo.bs
                elif supported:
                    reachable, _ = geometry_reachability(case.geometry, "0.33.0")
                    outside.append((A, M, H, knobs.partial_hash_hits, knobs.alignment, reachable))
    return outside


@pytest.mark.parametrize("limit", [48])
def test_geometry_classes_are_the_supported_geometries(limit: int) -> None:
    """Every class geometry is one resolve_knobs supports, with the class's
    S, H, U and smallest block (this is why the encodings may take U = A,
    or U = H in ``hashed``, and H = u); and every supported geometry outside
    the classes is a hand geometry no deployment builds: two block sizes
    (vLLM's align mode gives every group the block B) with a hash unit below
    both (partial hash hits, full attention above the hit unit), which
    spec/ does not restate."""
    outside = _outside_classes(limit)
    assert outside, "two block sizes with a hash unit below both: supported by the reference, in no class"
    assert [
        g for g in outside if not (g[0] != g[1] and g[2] < min(g[0], g[1]) and g[3] and g[0] > g[4] and g[5] is False)
    ] == []


def test_every_deployment_geometry_is_in_a_class() -> None:
    """Every geometry resolve_knobs supports that a deployment can build
    (blocks up to 24) is in a class: the ``hashed`` class covers vLLM's
    align-mode layout with a smaller hash unit (reference 2243658; until it
    existed this was a strict xfail over every supported geometry)."""
    assert [g for g in _outside_classes(24) if g[5] is not False] == []


def _batch(args):
    geo, mode_name, levels, n_max, chunk = args
    mode = next(m for m in MODES if m.name == mode_name)
    return geo.label(), mode_name, levels, [str(d) for d in compare_batch(geo, mode, levels, n_max, chunk=chunk)]


def _run(geometries, levels, n_max, chunk=None, modes=MODES, extra=(), shard=False):
    """The disagreements of R1/R2 over these tasks (``shard``: this
    session's share of them, ``spec.parallel.sharded``; the slow tier's)."""
    tasks = [(g, m.name, levels, n_max, chunk) for g in geometries for m in modes] + list(extra)
    tasks = sharded(tasks) if shard else tasks
    return [r for r in pmap(_batch, tasks, chunksize=1) if r[3]]


#: The two modes furthest apart (drop with the N-1 ceiling; lookahead hashes,
#: no drop, the hashed ceiling); the slow test takes every mode.
FAST_MODES = [m for m in MODES if m.name in ("drop/0.30", "lookahead/0.33")]


def test_properties_match_reference() -> None:
    """R1/R2, every rule and level (every state written; one-shot prefill),
    N <= 112 (three and a half scheduler blocks), one geometry per class,
    each in one of the two modes furthest apart (alternating); and the closed
    form of the chunk loop, through R1/R2 with a budget of 2S, on the
    geometry with the most chunk stops (partial hash hits: a tail checkpoint
    after the last cache position) in both, and on the hashed one in the
    mode its one-shot check does not take. The slow tier takes every
    geometry in every mode."""
    tasks = [(g, FAST_MODES[i % 2].name, ("mask", "oneshot"), 112, None) for i, g in enumerate(FAST_GEOMETRIES)]
    # hashed (a mid-block tail and the block boundary after it): chunked in the other mode
    chunked = [(FAST_GEOMETRIES[2], m.name, ("chunked",), 128, 2) for m in FAST_MODES] + [
        (HASHED, FAST_MODES[1].name, ("chunked",), 128, 2)
    ]
    assert _run([], ("mask", "oneshot"), 112, extra=tasks + chunked) == []


@pytest.mark.slow
def test_properties_match_reference_every_mode() -> None:
    assert _run(FAST_GEOMETRIES, ("mask", "oneshot"), 400, shard=True) == []


@pytest.mark.slow
def test_properties_match_reference_small_domain() -> None:
    """Every geometry of the slow domain (every rule, mode, level): N <= 1000
    (at least 15 scheduler blocks) on blocks of 8-multiples up to 64, N <= 300
    on the tiny blocks."""
    tiny = [g for g in SLOW_GEOMETRIES if g.u < 8]
    big = [g for g in SLOW_GEOMETRIES if g.u >= 8]
    assert (
        _run(
            big,
            ("mask", "oneshot"),
            1000,
            extra=[(g, m.name, ("mask", "oneshot"), 300, None) for g in tiny for m in MODES],
            shard=True,
        )
        == []
    )


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_chunked_properties_match_reference_small_domain(chunk: int) -> None:
    """Chunk budgets of 1-3 scheduler blocks, every mode, S <= 32."""
    assert (
        _run(
            [g for g in SLOW_GEOMETRIES if g.S <= 32 and g.cls != "hashed"] + [HASHED],
            ("chunked",),
            400,
            chunk=chunk,
            shard=True,
        )
        == []
    )


# ----------------------------------------------------------------- terms


def _terms(geo: Concrete, every_junction_below: int = 0, kept: bool = True) -> list[str]:
    return term_disagreements(geo, every_junction_below, kept=kept)


def _terms_fast(geo: Concrete) -> list[str]:
    """Kept states are compared on the hashed geometry only (the other
    classes' kept states are R1/R2's and the junction properties', compared
    over N by the tests above, as they were before the hashed class), in
    the two modes furthest apart (the slow tier: every mode)."""
    if geo.cls != "hashed":
        return _terms(geo, kept=False)
    rest = [m for m in MODES if m not in FAST_MODES]
    return term_disagreements(geo, modes=FAST_MODES) + term_disagreements(geo, modes=rest, kept=False)


def test_terms_match_reference() -> None:
    """The encodings run on a concrete geometry and a concrete N, where every
    digit folds to a Python int (the symbolic path is what
    ``test_properties_match_reference`` checks), for every N below 72, every
    mode: the resend and sibling boundaries, the hashed length, the last
    cache position, every rule's boundaries, the tail checkpoint, the
    full-attention partial tail (hashed), and the one-shot chunk ends and
    kept states (hashed; every class in the slow tier), from token 0 with no
    junction and with a junction J (a multiple of A, of H in hashed, below
    N: the lowest two, the middle one and the highest)."""
    assert [b for bad in pmap(_terms_fast, FAST_GEOMETRIES, chunksize=1) for b in bad] == []


def _terms_every_junction(geo: Concrete) -> list[str]:
    return _terms(geo, every_junction_below=72 if geo.u >= 8 else 36, kept=geo.cls == "hashed")


@pytest.mark.slow
def test_terms_match_reference_tiny_blocks() -> None:
    """The same on blocks of 1, 2, 3, 5, 6, 12 tokens (every digit carry),
    and on the fast geometries, with every junction below N for the chunk
    ends (on the tiny blocks for N below 36)."""
    assert [
        b
        for bad in pmap(_terms_every_junction, sharded([*TINY_GEOMETRIES, *FAST_GEOMETRIES]), chunksize=1)
        for b in bad
    ] == []


# --------------------------------------------------------------- junction


def _junction(args):
    geo, mode_name, n_max, chunk, period = args
    return (
        geo.label(),
        mode_name,
        [str(d) for d in compare_junction(geo, MODE[mode_name], n_max, chunk=chunk, period=period)],
    )


def _run_junction(tasks):
    return [r for r in pmap(_junction, tasks, chunksize=1) if r[2]]


def test_junction_matches_reference() -> None:
    """junction-observed and junction-unobserved (every rule, level and
    retention) against the reference for every N <= 80 and junction J, one
    geometry per hybrid class, each in a different mode: the issue 10 server
    (no speculative decoding, 0.32.0+) on the uniform one, the 0.30.0 drop
    on the aligned one, the 0.33.0 drop (junction back-off, prompt
    checkpoint) on the partial one, and the 0.30.0 drop on the hashed one
    (junctions on every hash unit, a mid-block tail); chunks of 2 scheduler
    blocks, an interval of 1."""
    pairs = zip((*FAST_GEOMETRIES[:3], HASHED), ("plain/0.33", "drop/0.30", "drop/0.33", "drop/0.30"))
    assert _run_junction([(g, m, 80, 2, 1) for g, m in pairs]) == []


@pytest.mark.slow
def test_junction_matches_reference_small_domain() -> None:
    """The same for every hybrid geometry of the slow domain with S <= 32
    and the tiny blocks, every mode, N <= 128 (N <= 48 on the tiny blocks),
    chunks of 1 scheduler block with an interval of 2, or of 3 with an
    interval of 1 (alternating over the modes)."""
    hybrid = [g for g in SLOW_GEOMETRIES if g.A is not None and g.S <= 32 and g.cls != "hashed"] + [
        HASHED,
        *[g for g in TINY_GEOMETRIES if g.cls == "hashed"],
    ]
    settings = ((1, 2), (3, 1))
    tasks = [(g, m.name, 128 if g.u >= 8 else 48, *settings[i % 2]) for g in hybrid for i, m in enumerate(MODES)]
    assert _run_junction(sharded(tasks)) == []


# ---------------------------------------------- internal prefill checkpoints


def _with_grid(o: Oracle, grid: int) -> Oracle:
    o.geometry = replace(o.geometry, prefill_checkpoint_grid=grid)
    o.knobs = replace(o.knobs, prefill_checkpoint_grid=grid)
    return o


def _grid_insensitive(args) -> tuple[list[str], int]:
    """R1/R2 (one-shot; chunks of 1 and 3 blocks) and junction-observed
    (one-shot, sparse and dense, every junction) of one geometry and mode in
    the reference, with and without internal prefill checkpoints on
    ``grid``: the N where they differ, and how many N the checkpoints
    change the one-shot kept states at (so the comparison is not vacuous)."""
    geo, mode_name, grid, n_max, j_max = args
    mode = MODE[mode_name]
    plain, ckpt = Oracle(geo, mode, "replay"), _with_grid(Oracle(geo, mode, "replay"), grid)
    bad, moved = [], 0
    for n in range(1, n_max + 1):
        moved += plain.kept(n, "oneshot") != ckpt.kept(n, "oneshot")
        for which in ("R1", "R2"):
            for level, chunk in (("oneshot", None), ("chunked", 1), ("chunked", 3)):
                if plain.holds(n, which, level, chunk) != ckpt.holds(n, which, level, chunk):
                    bad.append(f"{geo.label()} {mode_name} grid {grid} N={n}: {which}/{level} {chunk}")
        if n <= j_max:
            for j in range(geo.U, n, geo.U):
                for interval in (0, None):
                    if plain.junction_holds(n, j, interval=interval) != ckpt.junction_holds(n, j, interval=interval):
                        bad.append(f"{geo.label()} {mode_name} grid {grid} N={n} J={j}: junction-observed {interval}")
    return bad, moved


H100 = (("qwen3-next h100 576", 576), ("qwen3-next h100 576/32", 64))


def test_internal_checkpoints_change_no_verdict_on_h100() -> None:
    """The encoding leaves out internal prefill checkpoints (a kernel
    exporting the prompt's checkpoint from inside the last chunk, vLLM
    0.33.0's FlashInfer GDN prefill on Hopper: Qwen3-Next at 576 on an H100
    has them on grid 576, or lcm(H, 64) = 64 with a prefix match unit H =
    32). On 576/32, plain/0.33, the reference's R1/R2 (one-shot, chunks of
    1 and 3 blocks) and junction-observed (one-shot, sparse and dense)
    truth is the same with and without them for every N up to two blocks
    and a bit (junctions up to 700), although they change the states kept
    (the last cache position's state is no longer written: neither the
    resend nor the sibling needs it; both land on the checkpoint, which the
    kernel exports). The slow tier: both H100 geometries, every 0.33.0
    mode, N up to five blocks."""
    bad, moved = _grid_insensitive((NAMED_BY["qwen3-next h100 576/32"], "plain/0.33", 64, 2 * 576 + 40, 700))
    assert bad == [] and moved > 0


@pytest.mark.slow
def test_internal_checkpoints_change_no_verdict_on_h100_every_mode() -> None:
    tasks = sharded(
        [
            (NAMED_BY[name], m.name, grid, 5 * 576, 2 * 576)
            for name, grid in H100
            for m in MODES
            if m.version == "0.33.0"
        ]
    )
    out = pmap(_grid_insensitive, tasks, chunksize=1)
    assert [b for bad, _ in out for b in bad] == []
    assert all(moved for (bad, moved), (g, *_) in zip(out, tasks) if g.cls == "hashed")
