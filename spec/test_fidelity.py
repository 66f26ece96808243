"""Encodings vs the Python reference (``reference/``), so the two cannot
drift: the reference is ground truth, the encodings are checked against it.

* knobs: every serving mode is what ``resolve_knobs`` gives its version;
* geometry classes: exactly the geometries ``resolve_knobs`` supports;
* properties: R1/R2 for every rule, mode and level, by interval splitting
  over N (``spec.fidelity.compare_batch``);
* terms: resend/sibling boundaries, rule boundaries, last cache position,
  tail checkpoint, hashed length and chunk ends (with and without a
  junction) at sampled N;
* the junction (issue 10): junction-observed (every rule) and
  junction-unobserved (the promise), every level and retention, over every
  N and junction J (``spec.fidelity.compare_junction``).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from reference.boundaries import floor_to, tail_checkpoint
from reference.errors import KvspecError
from reference.case import parse_case
from reference.knobs import resolve_knobs
from reference.serial import chunk_ends
from spec import rules as R
from spec.fidelity import compare_batch, compare_junction
from spec.geometry import MODE, MODES, NAMED, Concrete
from spec.oracle import Oracle, knobs_match, resolved
from spec.parallel import pmap
from spec.radix import Count

RULES = ("promise", "replay", "legacy")

#: One geometry per class, small enough for N to cover several blocks.
FAST_GEOMETRIES = (
    Concrete.from_blocks(16, 16),  # uniform
    Concrete.from_blocks(32, 16),  # aligned
    Concrete.from_blocks(16, 32),  # partial
    Concrete.from_blocks(None, 16),  # unitary
)
#: The slow domain: every shape with S <= 64 whose blocks are multiples of 8,
#: plus odd and tiny blocks (u = 1, 2, 3: every carry of the digit code).
SLOW_GEOMETRIES = tuple(
    [Concrete.from_blocks(a, m) for S in range(8, 65, 8) for a in range(8, S + 1, 8) for m in range(8, S + 1, 8) if math.lcm(a, m) == S and (a % m == 0 or m % a == 0)]
    + [Concrete.from_blocks(None, S) for S in range(8, 65, 8)]
    + [Concrete.from_blocks(a, m) for a, m in ((1, 1), (2, 1), (3, 1), (1, 3), (2, 6), (3, 3), (6, 2), (4, 12), (5, 5))]
    + [Concrete.from_blocks(None, 1), Concrete.from_blocks(None, 3)]
)


@pytest.mark.parametrize("geo", [*NAMED, *FAST_GEOMETRIES], ids=lambda g: g.label())
def test_modes_are_what_versions_resolve(geo: Concrete) -> None:
    for mode in MODES:
        for rule in RULES:
            _, knobs = resolved(geo, mode.name, rule)
            assert knobs_match(mode, knobs), (mode.name, rule, knobs)
            assert knobs.tail_checkpoint == mode.tail_kind(rule)
            assert knobs.junction_back_off == mode.junction_back_off


def _outside_classes(limit: int) -> list[tuple[int, int, int, bool, int]]:
    """Every (A, M, hash block H) with blocks up to ``limit``: checks that
    each geometry of a class is supported by resolve_knobs with the class's
    S, H, U and smallest block, and returns the supported geometries that
    are in no class, as (A, M, H, partial hash hits, U)."""
    outside = []
    for A in range(1, limit + 1):
        for M in range(1, limit + 1):
            for H in [d for d in range(1, min(A, M) + 1) if A % d == 0 and M % d == 0]:
                raw = {"schema": 1, "geometry": {"groups": [{"kind": "full_attention", "block_size": A}, {"kind": "mamba", "block_size": M}], "prefix_match_unit": H}, "trace": [{"prompt": [{"segment": "A", "length": 1}]}]}
                try:
                    case = parse_case(raw)
                    knobs = resolve_knobs(case, "0.33.0")
                    supported = True
                except KvspecError:
                    supported = False
                try:
                    geo = Concrete.from_blocks(A, M)
                    in_class = H == geo.H
                except ValueError:
                    in_class = False
                if in_class:
                    assert supported, (A, M, H)
                    assert (case.geometry.scheduler_block_size, case.geometry.hash_block_size, knobs.alignment) == (geo.S, geo.H, geo.U)
                    assert min(A, M) == geo.u
                elif supported:
                    outside.append((A, M, H, knobs.partial_hash_hits, knobs.alignment))
    return outside


@pytest.mark.parametrize("limit", [48])
def test_geometry_classes_are_the_supported_geometries(limit: int) -> None:
    """Every class geometry is one resolve_knobs supports, with the class's
    S, H, U and smallest block (this is why the encodings may take U = A and
    H = u); and every supported geometry outside the classes is vLLM's
    align-mode layout that reference 2243658 added (partial hash hits with
    an attention block above the hit unit U = H: full attention then matches
    whole blocks plus an earlier prompt's partial tail), which spec/ does
    not restate yet."""
    outside = _outside_classes(limit)
    assert outside, "the align-mode layout is in no class yet: see test_every_supported_geometry_is_in_a_class"
    assert [g for g in outside if not (g[3] and g[0] > g[4])] == []


@pytest.mark.xfail(strict=True, reason="reference 2243658 supports the align-mode layout (partial hash hits, attention block above U, fa_tail); no spec class covers it yet")
def test_every_supported_geometry_is_in_a_class() -> None:
    """The classes are every geometry resolve_knobs supports (blocks up to
    24). Strict: it fails (XPASS) once a class covers the align-mode layout,
    to be turned back into a plain test."""
    assert _outside_classes(24) == []


def _batch(args):
    geo, mode_name, levels, n_max, chunk = args
    mode = next(m for m in MODES if m.name == mode_name)
    return geo.label(), mode_name, levels, [str(d) for d in compare_batch(geo, mode, levels, n_max, chunk=chunk)]


def _run(geometries, levels, n_max, chunk=None, modes=MODES, extra=()):
    tasks = [(g, m.name, levels, n_max, chunk) for g in geometries for m in modes] + list(extra)
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
    after the last cache position) in both. The slow tier takes every
    geometry in every mode."""
    tasks = [(g, FAST_MODES[i % 2].name, ("mask", "oneshot"), 112, None) for i, g in enumerate(FAST_GEOMETRIES)]
    chunked = [(FAST_GEOMETRIES[2], m.name, ("chunked",), 128, 2) for m in FAST_MODES]
    assert _run([], ("mask", "oneshot"), 112, extra=tasks + chunked) == []


@pytest.mark.slow
def test_properties_match_reference_every_mode() -> None:
    assert _run(FAST_GEOMETRIES, ("mask", "oneshot"), 400) == []


@pytest.mark.slow
def test_properties_match_reference_small_domain() -> None:
    """Every geometry of the slow domain (every rule, mode, level): N <= 1000
    (at least 15 scheduler blocks) on blocks of 8-multiples up to 64, N <= 300
    on the tiny blocks."""
    tiny = [g for g in SLOW_GEOMETRIES if g.u < 8]
    big = [g for g in SLOW_GEOMETRIES if g.u >= 8]
    assert _run(big, ("mask", "oneshot"), 1000, extra=[(g, m.name, ("mask", "oneshot"), 300, None) for g in tiny for m in MODES]) == []


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_chunked_properties_match_reference_small_domain(chunk: int) -> None:
    """Chunk budgets of 1-3 scheduler blocks, every mode, S <= 32."""
    assert _run([g for g in SLOW_GEOMETRIES if g.S <= 32], ("chunked",), 400, chunk=chunk) == []


# ----------------------------------------------------------------- terms


SAMPLE_N = tuple(range(1, 72))


def _int(c) -> int:
    """The token count of a Count whose digits folded to Python ints."""
    assert all(isinstance(d, int) for d in (c.n, c.j, c.s)), c
    return c.n * c.sp.m * c.sp.u + c.j * c.sp.u + c.s


def _bool(b) -> bool:
    assert isinstance(b, bool), b
    return b


def _terms(geo: Concrete, every_junction_below: int = 0) -> list[str]:
    """Each encoded function against its reference function for every N
    below 72, returning the disagreements. Chunk ends are compared with no
    junction and with the lowest and the highest junction below N (every
    junction for N below ``every_junction_below``)."""
    bad = []
    for mode in MODES:
        for rule in ("replay", "legacy"):
            o = Oracle(geo, mode, rule)
            L, bs = o.knobs.hash_lookahead_tokens, o.bs
            for n in SAMPLE_N:
                g = geo.geo()
                N = Count(g.sp, n // geo.S, (n % geo.S) // geo.u, n % geo.u)
                got = {
                    "resend": _int(R.resend_boundary(g, mode, N)),
                    "sibling": _int(R.extension_boundary(g, mode, N)),
                    "hashed": _int(R.hashed_length(g, mode, N)),
                    "last": _int(R.last_cache_position(g, mode, N)),
                    "bounds": sorted({_int(b) for b in R.rule_boundaries(g, mode, rule, N)}),
                    "promise": sorted({_int(b) for b in R.rule_boundaries(g, mode, "promise", N)}),
                }
                if mode.eagle_drop:
                    last = floor_to(n, bs) - bs
                elif mode.ceiling == "hashed":
                    last = floor_to(n - max(1, L), bs)
                else:
                    last = floor_to(n, bs)
                want = {
                    "resend": o.resend(n),
                    "sibling": o.sibling(n),
                    "hashed": floor_to(max(n - L, 0), geo.H),
                    "last": last,
                    "bounds": sorted(set(o.boundaries(n))),
                    "promise": sorted(set(o.boundaries(n, rule="promise"))),
                }
                if got != want:
                    bad.append(f"{geo.label()} {mode.name} {rule} N={n}: {got} != {want}")
                    continue
                if geo.cls == "partial" or o.knobs.tail_checkpoint == "checkpoint":
                    if _int(R.tail_checkpoint(g, mode, rule, N)) != tail_checkpoint(n, geo.H, mode.eagle_drop, L, o.knobs.tail_checkpoint):
                        bad.append(f"{geo.label()} {mode.name} {rule} N={n}: tail")
                junctions = [0] if geo.A is None else [0, *range(geo.A, n, geo.A)]
                if n >= every_junction_below:
                    junctions = sorted(set(junctions[:2] + junctions[-1:]))
                for j in junctions:
                    J = None if j == 0 else Count(g.sp, j // geo.S, (j % geo.S) // geo.u, j % geo.u)
                    ends = R.chunk_end(g, mode, rule, N, junction=J)
                    ref_ends = set(chunk_ends(n, 0, j, replace(o.geometry, max_num_batched_tokens=n), o.knobs))
                    got_ends = {p for p in range(bs, n + 1, bs) if _bool(ends(Count(g.sp, p // geo.S, (p % geo.S) // geo.u, p % geo.u)))}
                    if got_ends != {p for p in ref_ends if p % bs == 0} or not ref_ends <= set(range(bs, n + 1, bs)) | {n}:
                        bad.append(f"{geo.label()} {mode.name} {rule} N={n} J={j}: chunk ends {sorted(got_ends)} != {sorted(ref_ends)}")
    return bad


def test_terms_match_reference() -> None:
    """The encodings run on a concrete geometry and a concrete N, where every
    digit folds to a Python int (the symbolic path is what
    ``test_properties_match_reference`` checks), for every N below 72, every
    mode: the resend and sibling boundaries, the hashed length, the last
    cache position, every rule's boundaries, the tail checkpoint and the
    one-shot chunk ends, from token 0 with no junction and with a junction
    J (a multiple of A below N: the lowest and the highest)."""
    assert [b for bad in pmap(_terms, FAST_GEOMETRIES, chunksize=1) for b in bad] == []


def _terms_every_junction(geo: Concrete) -> list[str]:
    return _terms(geo, every_junction_below=72 if geo.u >= 8 else 36)


@pytest.mark.slow
def test_terms_match_reference_tiny_blocks() -> None:
    """The same on blocks of 1, 2, 3, 5, 6, 12 tokens (every digit carry),
    and on the fast geometries, with every junction below N (on the tiny
    blocks for N below 36)."""
    assert [b for bad in pmap(_terms_every_junction, [*SLOW_GEOMETRIES[-11:], *FAST_GEOMETRIES], chunksize=1) for b in bad] == []


# --------------------------------------------------------------- junction


def _junction(args):
    geo, mode_name, n_max, chunk, period = args
    return geo.label(), mode_name, [str(d) for d in compare_junction(geo, MODE[mode_name], n_max, chunk=chunk, period=period)]


def _run_junction(tasks):
    return [r for r in pmap(_junction, tasks, chunksize=1) if r[2]]


def test_junction_matches_reference() -> None:
    """junction-observed and junction-unobserved (every rule, level and
    retention) against the reference for every N <= 80 and junction J, one
    geometry per hybrid class, each in a different mode: the issue 10 server
    (no speculative decoding, 0.32.0+) on the uniform one, the 0.30.0 drop
    on the aligned one, the 0.33.0 drop (junction back-off, prompt
    checkpoint) on the partial one; chunks of 2 scheduler blocks, an
    interval of 1."""
    modes = ("plain/0.33", "drop/0.30", "drop/0.33")
    assert _run_junction([(g, m, 80, 2, 1) for g, m in zip(FAST_GEOMETRIES[:3], modes)]) == []


@pytest.mark.slow
def test_junction_matches_reference_small_domain() -> None:
    """The same for every hybrid geometry of the slow domain with S <= 32
    and the tiny blocks, every mode, N <= 128 (N <= 48 on the tiny blocks),
    chunks of 1 scheduler block with an interval of 2, or of 3 with an
    interval of 1 (alternating over the modes)."""
    hybrid = [g for g in SLOW_GEOMETRIES if g.A is not None and g.S <= 32]
    settings = ((1, 2), (3, 1))
    tasks = [(g, m.name, 128 if g.u >= 8 else 48, *settings[i % 2]) for g in hybrid for i, m in enumerate(MODES)]
    assert _run_junction(tasks) == []
