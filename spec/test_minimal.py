"""Minimal counterexamples (z3 Optimize) on the named geometries, and the
case files they become, replayed on the reference serial model."""

from __future__ import annotations

import pytest

from reference.case import case_to_dict, parse_case
from spec.catalogue import Row
from spec.geometry import NAMED_BY
from spec.minimal import case_for, confirm, minimal, tokens
from spec.solve import decide

# Issue 4: legacy (vLLM <= 0.29.0: keep N-1, no EAGLE adjustment) refutes R1
# with the drop; the smallest prompt per named geometry.
LEGACY_R1 = {"1600": 3201, "1568": 3137, "A32/M16": 65, "A16/M32": 65}


@pytest.mark.parametrize("name,expected", LEGACY_R1.items())
def test_legacy_r1_minimal_counterexample(name: str, expected: int) -> None:
    row = Row("R1", f"named:{name}", "drop/0.30", "legacy", "mask", "refuted")
    m = minimal(row)
    assert m.outcome.verdict == "refuted"
    assert m.N == expected
    case = case_for(row, m.values)
    assert parse_case(case_to_dict(case)) == case  # a valid case file
    ref = confirm(row, case)
    assert ref["confirmed"], ref  # the serial model misses where the promise hits


def test_seed_11910_is_a_counterexample() -> None:
    """The fuzzer's seed (#53504): 11910 tokens at 1600 is one counterexample."""
    row = Row("R1", "named:1600", "drop/0.30", "legacy", "mask", "refuted")
    q = row.build()
    pin = tokens(q, q.counts["N"]) == 11910
    assert decide([*q.premises, pin], q.claim).verdict == "refuted"
    assert decide(q.premises, q.claim).verdict == "refuted"


@pytest.mark.parametrize(
    "row,expected",
    [
        # Without speculative decoding replay keeps floor((N-1)/S)*S only: a
        # longer sibling of a block-aligned prompt (dense: kS) gets (k-1)S.
        (Row("R2", "named:1600", "plain/0.30", "replay", "mask", "refuted"), 1600),
        (Row("R2", "named:1600", "plain/0.33", "replay", "mask", "refuted"), 1600),
        # Partial hash hits (attention 16 / Mamba 32, hash 16), drop, 0.30.0:
        # the resend lands on an attention block replay's S-aligned marks miss.
        (Row("R1", "named:A16/M32", "drop/0.30", "replay", "mask", "refuted"), 49),
        # A single Mamba group: the lookup is not shifted, replay's marks are.
        (Row("R1", "named:mamba-only 1600", "drop/0.30", "replay", "mask", "refuted"), 1601),
        # One-shot prefill writes no state at (k-2)S: 0.30.0 drop, N = 3S.
        (Row("R1", "named:1600", "drop/0.30", "replay", "oneshot", "refuted"), 4800),
        # Qwen3-Next on an A100 with --prefix-match-unit 16 (B = 544, H = 16):
        # the longer sibling of a block-aligned prompt resumes at N under dense
        # retention; sparse keeps N - H and N - B (0.33.0: the sibling hits 528).
        (Row("R2", "named:qwen3-next a100 544/16", "plain/0.33", "replay", "mask", "refuted"), 544),
        # 0.30.0 drop: the resend lands on f_H(N) - H = B, a block boundary the
        # marks (one block lower) miss and the 0.30.0 tail rule refuses: N = B + H + 1.
        (Row("R1", "named:qwen3-next a100 544/16", "drop/0.30", "replay", "mask", "refuted"), 561),
        # 0.30.0 without speculative decoding, one chunk: N = 2B writes only N.
        (Row("R1", "named:qwen3-next a100 544/32", "plain/0.30", "replay", "oneshot", "refuted"), 1088),
    ],
)
def test_findings_minimal_and_confirmed(row: Row, expected: int) -> None:
    m = minimal(row)
    assert m.N == expected, m.values
    ref = confirm(row, case_for(row, m.values))
    assert ref["confirmed"], ref


# Issue 10 on the reference serial model, and the same instances in z3.
ISSUE_10 = [[("A", 700), (x, 300)] for x in "BCD"]  # siblings diverging at 700, block 128


@pytest.mark.parametrize("interval", [0, 128, None], ids=["sparse", "periodic", "dense"])
def test_issue_10_siblings_on_the_serial_model(interval) -> None:
    """Three siblings [A:700,B:300], [A:700,C:300], [A:700,D:300] at block 128
    (the issue 10 server: no speculative decoding, 0.32.0+): the first
    sibling finds no state at 640 and splits its prefill there, so only the
    next one hits 640, under every retention (0/0/640, as vLLM); and in z3
    the promise's first request (N = 1000) does not keep the divergence point
    640 (junction-unobserved at that instance), which the pre-issue-10
    promise (every Mamba block written) did under dense and periodic
    retention."""
    from reference.knobs import resolve_knobs
    from reference.serial import simulate
    from spec import properties as P
    from spec.geometry import MODE, Concrete
    from spec.mutations import MUTATION, planted

    geo = Concrete.from_blocks(128, 128)
    mode = MODE["plain/0.33"]
    case = geo.case(ISSUE_10, None, interval=interval)
    knobs = resolve_knobs(case, mode.version)
    for rule in ("promise", "replay"):
        assert [s.hit for s in simulate(case, knobs, rule)] == [0, 0, 640], rule
    retention = {0: "sparse", 128: "periodic", None: "dense"}[interval]

    def verdict() -> str:
        q = P.junction_unobserved(geo.geo(), mode, "oneshot", retention)
        pins = [tokens(q, q.counts["N"]) == 1000, tokens(q, q.counts["D"]) == 640]
        if "interval_blocks" in q.ints:
            pins.append(q.ints["interval_blocks"] == 1)
        return decide([*q.premises, *pins], q.claim).verdict

    assert verdict() == "proved"
    with planted(MUTATION["promise: every Mamba block written (issue 10)"]):
        assert verdict() == ("proved" if interval == 0 else "refuted")


def test_partial_junction_refutation_on_the_serial_model() -> None:
    """junction-observed is refuted for replay with partial hash hits
    (A16/M32): siblings [A:50,B:30], [A:50,C:30], [A:50,D:30], 0.33.0, dense
    retention: the second request (N = 80) reaches the junction 48, off the
    Mamba grid, and splits there, but no chunk ends at T = 32, so the third
    hits 0 where the promise (which keeps the junction's Mamba block T,
    ``reference.serial.promise_junction_state``) hits 32. The z3 row is
    refuted at exactly that instance (N = 80, J = 48) and proved for the
    promise."""
    from reference.knobs import resolve_knobs
    from reference.serial import simulate
    from spec.geometry import MODE

    geo = NAMED_BY["A16/M32"]
    mode = MODE["plain/0.33"]
    case = geo.case([[("A", 50), (x, 30)] for x in "BCD"], None, interval=None)
    knobs = resolve_knobs(case, mode.version)
    replay, promise = simulate(case, knobs, "replay"), simulate(case, knobs, "promise")
    assert [(s.hit, s.junction) for s in replay] == [(0, 0), (0, 48), (0, 48)]
    assert [s.hit for s in promise] == [0, 0, 32]
    for rule, want in (("replay", "refuted"), ("promise", "proved")):
        q = Row("junction-observed", "named:A16/M32", "plain/0.33", rule, "oneshot/dense").build()
        pins = [tokens(q, q.counts["N"]) == 80, tokens(q, q.counts["J"]) == 48]
        assert decide([*q.premises, *pins], q.claim).verdict == want, rule


def test_hashed_closed_forms_on_the_serial_model() -> None:
    """The hashed class (Qwen3-Next on an A100, B = 544, --prefix-match-unit
    16), vLLM 0.33.0 without speculative decoding, on the reference serial
    model, as ``.kvspec/notes/partial-hits.md`` §1.4 states and the
    catalogue's R1/R2 rows encode: an identical resend of N resumes at
    T = f_H(N-1), which sparse retention keeps (R1 proved); a longer sibling
    of a block-aligned prompt resumes at N under dense retention, while
    sparse keeps N - H (R2 refuted, the promise keeps N). In z3 the R2 row is
    refuted at exactly N = 1088 and holds at N = 1000."""
    from reference.knobs import resolve_knobs
    from reference.serial import simulate
    from spec.geometry import MODE

    geo = NAMED_BY["qwen3-next a100 544/16"]
    resend = geo.case([[("A", 1000)]] * 2, None)
    knobs = resolve_knobs(resend, "0.33.0")
    assert [s.hit for s in simulate(resend, knobs, "replay")] == [0, 992]
    for interval, want in ((0, 1072), (None, 1088)):
        sibling = geo.case([[("A", 1088)], [("A", 1200)]], None, interval=interval)
        assert [s.hit for s in simulate(sibling, resolve_knobs(sibling, "0.33.0"), "replay")] == [0, want], interval
    sparse = geo.case([[("A", 1088)], [("A", 1200)]], None)
    assert [s.hit for s in simulate(sparse, knobs, "promise")] == [0, 1088]
    row = Row("R2", "named:qwen3-next a100 544/16", "plain/0.33", "replay", "mask", "refuted")
    q = row.build()
    assert MODE[row.mode].version == "0.33.0"
    for n, want in ((1088, "refuted"), (1000, "proved")):
        assert decide([*q.premises, tokens(q, q.counts["N"]) == n], q.claim).verdict == want, n
