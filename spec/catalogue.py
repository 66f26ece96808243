"""Every proof obligation with its expected verdict, written out by hand.

A row is a property, a geometry (a class, quantified symbolically with no
bounds, or a named concrete geometry with N symbolic), a retention rule and a
serving mode. ``EXPECT`` states what each row must come out as; a row whose
verdict differs (or is unknown) fails its test and makes ``kvspec prove``
exit 1. A refutation here is a finding (see the README of issue 4's note in
``spec/__init__.py``), not a test to delete.

Expected strings list the verdict per mode in ``MODES`` order
(plain/0.30, plain/0.33, drop/0.30, drop/0.33, lookahead/0.33):
``P`` proved, ``R`` refuted (a counterexample exists).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from spec import properties as P
from spec.geometry import MODE, MODES, NAMED_BY, Concrete, Geo
from spec.radix import fresh_context
from spec.solve import DEFAULT_TIMEOUT_MS, decide

MODE_NAMES = tuple(m.name for m in MODES)
RULE_NAMES = ("promise", "replay", "legacy")

# --------------------------------------------------------------- R1 and R2
#: The (property, rule) pairs of an EXPECT entry, in the order written.
PROPERTY_RULES = tuple((prop, rule) for prop in ("R1", "R2") for rule in RULE_NAMES)


def _verdicts(*per_pair: str) -> dict[tuple[str, str], str]:
    """One class's EXPECT entry: a verdict string per (property, rule), given
    in ``PROPERTY_RULES`` order (R1 promise/replay/legacy, then R2)."""
    return dict(zip(PROPERTY_RULES, per_pair, strict=True))


# EXPECT[level][class][(property, rule)] = verdicts per mode.
EXPECT: dict[str, dict[str, dict[tuple[str, str], str]]] = {
    # Every Mamba state written; the retention rule alone decides.
    "mask": {
        # legacy under drop/0.33 (a hypothetical pairing: legacy is <= 0.29.0)
        # is rescued by the 0.32.0+ prompt checkpoint, keyed whatever the mask
        # says, on every uniform geometry but not when M < A.
        "uniform": _verdicts("PPPPP", "PPPPP", "PPRPP", "PPPPP", "RRPPP", "RRRPP"),
        "aligned": _verdicts("PPPPP", "PPPPP", "PPRRP", "PPPPP", "RRPPP", "RRRRP"),
        "partial": _verdicts("PPPPP", "PPRPP", "PPRPP", "PPPPP", "RRRPP", "RRRPP"),
        # hashed (A = M = S = B, hits on H < B): derived by hand from the
        # reference's closed forms (``.kvspec/notes/partial-hits.md`` §1.4; f_X
        # is floor_to X), r the resend's and e the sibling's dense boundary,
        # T_r = f_B(r), T_e = f_B(e) the targets, t the prompt's checkpoint
        # (``tail_checkpoint``), kept as a (partial) state by replay and
        # legacy whatever the mask says from 0.32.0 on, only off the block
        # grid before:
        # * plain/0.30 (fa_tail f_H(N), t = f_H(N)): r = f_H(N), or f_B(N-1)
        #   when H | N (the tail N is past the N-1 cap); e = f_H(N). Replay
        #   and legacy mark f_B(N-1) and keep t off the grid: R1 proved; R2
        #   refuted when B | N (e = N = t on the grid; N - B marked): N = B.
        # * plain/0.33 (fa_tail f_H(N-1) = t): r = f_H(N-1) = t, kept; e = t,
        #   or N when B | N (attention reaches the full block N; sparse keeps
        #   N - B and N - H): R1 proved, R2 refuted at N = B.
        # * drop/0.30 (margin and drop one hash unit, ceiling N-1): r =
        #   f_H(N) - H (f_B(N-1) - H when H | N), e = f_H(N) - H. Replay
        #   marks f_B(N-1) - B, f_B(N) - B and keeps t = f_H(N) - H only off
        #   the grid: r = e = B at N = B + H + 1 is lost (R1 and R2 refuted).
        #   Legacy marks f_B(N-1) and keeps f_H(N) off the grid: R1 refuted
        #   at N = 2B + 1 (r = 2B - H, T_r = B, nothing kept in [B, 2B - H]),
        #   R2 refuted (N = 2B + 1 too).
        # * drop/0.33: r = e = f_H(N) - H = t, kept whatever the mask: proved.
        # * lookahead/0.33: r = e = f_H(N-1) = t (a block counts only with
        #   one more token: the full block N is out of reach), kept: proved.
        # The same letters as ``partial``: hits on H, states on the block.
        "hashed": _verdicts("PPPPP", "PPRPP", "PPRPP", "PPPPP", "RRRPP", "RRRPP"),
        "unitary": _verdicts("PPPPP", "PPRRP", "PPPPP", "PPPPP", "RRRRP", "RRRRP"),
    },
    # One-shot prefill: a Mamba state exists only where a chunk ended.
    "oneshot": {
        "uniform": _verdicts("PPPPP", "RPRPP", "RPRPP", "PPPPP", "RRPPP", "RRRPP"),
        "aligned": _verdicts("PPPPP", "RRRRR", "RRRRR", "PPPPP", "RRRRR", "RRRRR"),
        "partial": _verdicts("PPPPP", "RPRPP", "RPRPP", "PPPPP", "RRRPP", "RRRPP"),
        # hashed, one-shot: the chunk ends are P = the last cache position
        # (f_B(N) without the drop before 0.32.0, f_B(N-1) from 0.32.0,
        # f_B(N) - B with the drop), t when P < t < N, the next block
        # boundary after a mid-block t (drop, N mod B below H), and N. The
        # mask-level refutations stay; plain/0.30 adds R1 at N = 2B: the
        # prefill is one chunk (P = t = N), N is written but not marked, and
        # r = f_B(N-1) = B has no state. From 0.32.0 P = f_B(N-1) is the
        # mark and t an end: kept {P, t}, as vLLM (partial-hits.md §2.2).
        "hashed": _verdicts("PPPPP", "RPRPP", "RPRPP", "PPPPP", "RRRPP", "RRRPP"),
        "unitary": _verdicts("PPPPP", "RPRRP", "RPRRP", "PPPPP", "RRRRP", "RRRRP"),
    },
}

#: The named geometries are instances of a class; their verdicts are the
#: class's except where listed here (a class refutation that needs a shape
#: the geometry does not have).
NAMED_EXCEPTIONS: dict[tuple[str, str, str, str, str], str] = {}

# ------------------------------------------------------------ other rows
#: within-replay: what the rule keeps (every state written) is among what
#: replay keeps. Per class, rule: verdicts per mode.
WITHIN_REPLAY: dict[str, dict[str, str]] = {
    "uniform": {"promise": "RRPPP", "replay": "PPPPP", "legacy": "PPRRP"},
    "aligned": {"promise": "RRPPP", "replay": "PPPPP", "legacy": "PPRRP"},
    # partial and hashed: the promise keeps a junction J at its Mamba block
    # f_M(J), as replay marks it (``rules.retained``: a state inside a block
    # has no slot of its own), so only its own boundaries differ: without the
    # drop the extension at N on a block-aligned prompt where replay keeps
    # N-1's block (plain/0.33, hashed B4/H2 N = 12; partial A1/M3 N = 3), and
    # partial plain/0.30 (A1/M2 N = 6: 5) and the 0.30.0 drop (hashed B3/H1
    # N = 6: 2; partial A1/M4 N = 3: 1) a hash-unit boundary replay floors
    # to the block; hashed plain/0.30 and both 0.33.0 drop modes are proved.
    # legacy keeps f_B(N-1) where replay's drop marks one block lower (and,
    # 0.29.0, the tail f_H(N) where 0.30.0 keeps f_H(N) - H).
    "partial": {"promise": "RRRPP", "replay": "PPPPP", "legacy": "PPRRP"},
    "hashed": {"promise": "PRRPP", "replay": "PPPPP", "legacy": "PPRRP"},
    "unitary": {"promise": "RRRRP", "replay": "PPPPP", "legacy": "PPRRP"},
}

CLASSES = ("uniform", "aligned", "partial", "hashed", "unitary")

#: junction-observed (issue 10): after a request whose lookup reached the
#: attention junction J with no Mamba state split its prefill at J, the
#: state a later sibling diverging at J needs (T = floor_to(J, M), J being a
#: multiple of A = U) is written and kept. Per class, rule: verdicts per
#: mode, the same for every level (one-shot, chunked c*S) and retention
#: (sparse, periodic c*S, dense), as written out in ``rows``:
#:
#: * uniform and aligned: proved everywhere. J is a multiple of A, hence of
#:   M: the junction's own chunk end is a Mamba block boundary, written, and
#:   marked by every rule (the junction is a retention boundary of each).
#: * partial (A < M): the promise keeps its junction's Mamba block T
#:   (written by definition, ``reference.serial.promise_junction_state``):
#:   proved. replay and legacy
#:   keep only Mamba-block states (and the tail checkpoint), and with J off
#:   the Mamba grid (M does not divide J) the state at T = floor_to(J, M) is
#:   written only if a chunk happens to end there: refuted at every level and
#:   retention. The reference agrees (``spec.test_fidelity`` checks the rows
#:   against ``reference.serial.retained_states`` over N and J;
#:   ``spec.test_minimal`` pins one instance on the serial model: A16/M32,
#:   siblings [A:50,B:30], [A:50,C:30], [A:50,D:30], 0.33.0, dense: replay
#:   hits 0/0/0 where T = 32, the promise 0/0/32): a finding about vLLM's
#:   junction retention with partial hash hits, not a broken row. legacy
#:   gives the same verdicts as replay (its junction mark is the same).
#:
#: * hashed (A = M = B, H < B): J is any multiple of H (a partial tail,
#:   or a block or tail minus H under the drop). vLLM floors the junction
#:   stop to the block, so the prefill ends at T = floor_to(J, B), a block
#:   boundary every rule marks (replay's and legacy's junction mark is
#:   floor_to(J, B)): proved for every rule, mode, level and retention.
#:   The target is T, the Mamba block J lands on (as R1/R2's), so this says
#:   nothing of the H-granular rest: the next sibling diverging at J hits
#:   T, not J (vLLM's --enable-mamba-shared-prefix-checkpoint keeps J; not
#:   encoded), and so does the promise: it keeps J itself only with that
#:   checkpoint (``reference.serial.promise_junction_state``; a state inside
#:   a block has no slot of its own, and dense retention keeps no more).
#:
#: unitary: no attention group, hence no junction (no rows).
JUNCTION_OBSERVED: dict[str, dict[str, str]] = {
    "uniform": {"promise": "PPPPP", "replay": "PPPPP", "legacy": "PPPPP"},
    "aligned": {"promise": "PPPPP", "replay": "PPPPP", "legacy": "PPPPP"},
    "partial": {"promise": "PPPPP", "replay": "RRRRR", "legacy": "RRRRR"},
    "hashed": {"promise": "PPPPP", "replay": "PPPPP", "legacy": "PPPPP"},
}
#: junction-unobserved: before the junction is observed the promise keeps
#: the state at a divergence point only if a chunk of the first request
#: ended there on the Mamba grid or it is a promise boundary. Proved for
#: every hybrid class, mode, level and retention (the promise no longer
#: assumes every Mamba block written; ``spec.mutations`` plants that slip).
JUNCTION_UNOBSERVED: dict[str, str] = {"uniform": "PPPPP", "aligned": "PPPPP", "partial": "PPPPP", "hashed": "PPPPP"}
#: The (level, retention) pairs of both junction properties.
JUNCTION_SETTINGS = tuple(
    (level, retention) for level in ("oneshot", "chunked") for retention in ("sparse", "periodic", "dense")
)
HYBRID = ("uniform", "aligned", "partial", "hashed")


@dataclass(frozen=True)
class Row:
    prop: str  # R1, R2, chunked, sibling-any-length, eagle-off, unitary-unshifted, no-over-retention, within-replay, junction-observed, junction-unobserved
    geometry: str  # a class of spec.geometry, or "named:<name>"
    mode: str
    rule: str | None = None
    level: str | None = (
        None  # R1/R2: mask | oneshot; chunked: R1 | R2 | ends; junction-*: <oneshot|chunked>/<sparse|periodic|dense>
    )
    expect: str = "proved"
    slow: bool = False

    @property
    def id(self) -> str:
        parts = [self.prop + (f"/{self.level}" if self.level else ""), self.geometry, self.rule or "-", self.mode]
        return " ".join(parts)

    def geo(self) -> Geo:
        if self.geometry.startswith("named:"):
            return NAMED_BY[self.geometry[6:]].geo()
        return Geo(self.geometry)

    def build(self) -> P.Query:
        g, mode = self.geo(), MODE[self.mode]
        if self.prop == "R1":
            return P.r1(g, mode, self.rule, self.level)
        if self.prop == "R2":
            return P.r2(g, mode, self.rule, self.level)
        if self.prop == "chunked":
            if self.level == "ends":
                return P.chunk_ends_nested(g, mode, self.rule)
            return P.chunked(g, mode, self.rule, self.level)
        if self.prop == "sibling-any-length":
            return P.sibling_any_length(g, mode)
        if self.prop == "eagle-off":
            return P.eagle_off(g, mode)
        if self.prop == "unitary-unshifted":
            return P.unitary_unshifted(g, mode)
        if self.prop == "no-over-retention":
            return P.no_over_retention(g, mode, self.rule)
        if self.prop == "within-replay":
            return P.no_over_retention(g, mode, self.rule, against="replay")
        if self.prop == "junction-observed":
            level, retention = self.level.split("/")
            return P.junction_observed(g, mode, self.rule, level, retention)
        if self.prop == "junction-unobserved":
            level, retention = self.level.split("/")
            return P.junction_unobserved(g, mode, level, retention)
        raise ValueError(self.prop)


@dataclass
class Result:
    row: Row
    verdict: str
    seconds: float
    counterexample: dict[str, Any] | None = None
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.verdict == self.row.expect

    def as_dict(self) -> dict:
        return {
            "id": self.row.id,
            **{k: v for k, v in asdict(self.row).items()},
            "verdict": self.verdict,
            "ok": self.ok,
            "seconds": round(self.seconds, 4),
            "counterexample": self.counterexample,
            "reason": self.reason,
        }


def _letter(v: str) -> str:
    return {"P": "proved", "R": "refuted"}[v]


def expected_named(prop: str, level: str, name: str, rule: str, mode: str) -> str:
    geo = NAMED_BY[name]
    key = (prop, level, name, rule, mode)
    if key in NAMED_EXCEPTIONS:
        return NAMED_EXCEPTIONS[key]
    return _letter(EXPECT[level][geo.cls][(prop, rule)][MODE_NAMES.index(mode)])


# ------------------------------------------------------------------ tiers
#: The default tier (``pytest spec/``, seconds) is a representative sample:
#: one row per class, property and rule in FAST_MODE (vLLM #53504's serving
#: mode, where the rules differ most), every mode on the #53504 geometry
#: (FAST_NAMED), R1 on issue 4's other named geometries and on one of issue
#: 9's (FAST_R1_NAMED), and the junction rows of
#: the issue 10 server (JUNCTION_FAST: no speculative decoding, 0.32.0+,
#: dense retention, per class and rule) plus the partial named geometry,
#: where replay's refutation shows. Every other row (every mode per class,
#: the one-shot and chunked levels, within-replay in the other modes, the
#: other retentions) is in the slow tier: ``kvspec prove`` (``--all``) and
#: ``pytest spec/ --slow``.
FAST_MODE = "drop/0.30"
FAST_NAMED = "1600"
#: The named geometries whose R1 rows (FAST_MODE, every state written) are in
#: the default tier: issue 4's and one deployment of issue 9.
FAST_R1_NAMED = ("1600", "1568", "A32/M16", "A16/M32", "mamba-only 1600", "qwen3-next a100 544/16")
JUNCTION_FAST = ("plain/0.33", "oneshot/dense")
JUNCTION_FAST_NAMED = ("A16/M32", "drop/0.33", "oneshot/sparse")


def _junction_rows() -> list[Row]:
    out: list[Row] = []
    for cls in HYBRID:
        for level, retention in JUNCTION_SETTINGS:
            setting = f"{level}/{retention}"
            for mode_i, mode in enumerate(MODE_NAMES):
                fast = (mode, setting) == JUNCTION_FAST
                for rule in RULE_NAMES:
                    v = JUNCTION_OBSERVED[cls][rule][mode_i]
                    out.append(Row("junction-observed", cls, mode, rule, setting, _letter(v), slow=not fast))
                out.append(
                    Row(
                        "junction-unobserved",
                        cls,
                        mode,
                        "promise",
                        setting,
                        _letter(JUNCTION_UNOBSERVED[cls][mode_i]),
                        slow=not fast,
                    )
                )
    for name, geo in NAMED_BY.items():
        if geo.cls == "unitary":
            continue
        for mode in MODE_NAMES:
            for rule in RULE_NAMES:
                v = JUNCTION_OBSERVED[geo.cls][rule][MODE_NAMES.index(mode)]
                for setting in ("oneshot/sparse", "oneshot/dense"):
                    fast = (name, mode, setting) == JUNCTION_FAST_NAMED
                    out.append(
                        Row("junction-observed", f"named:{name}", mode, rule, setting, _letter(v), slow=not fast)
                    )
    return out


def _chunked_per_rule(r: Row) -> bool:
    """Rows only ``kvspec prove --all`` (and ``pytest spec/ --slow``) runs:
    chunked prefill per rule (a symbolic chunk budget: nonlinear)."""
    if r.prop == "chunked":
        return r.level in ("R1", "R2")
    return r.prop.startswith("junction-") and r.level.startswith("chunked/")


def rows(tier: str = "full") -> list[Row]:
    """The catalogue.

    ``tier="fast"``: what ``pytest spec/`` runs by default (see FAST_MODE);
    ``"full"``: every row but chunked prefill per rule: R1/R2 with every
    state written and with one-shot prefill in every mode, on every class
    and named geometry, the other properties, and the one-shot junction rows
    under every retention (``kvspec prove``); ``"all"``: also chunked prefill
    per rule and the chunked junction rows (nonlinear, up to a second or two a
    row; ``kvspec prove --all``). ``pytest spec/ --slow`` runs every row."""
    if tier not in ("fast", "full", "all"):
        raise ValueError(tier)
    out: list[Row] = []
    for level in ("mask", "oneshot"):
        for cls in CLASSES:
            for (prop, rule), verdicts in EXPECT[level][cls].items():
                for mode, v in zip(MODE_NAMES, verdicts):
                    out.append(
                        Row(prop, cls, mode, rule, level, _letter(v), slow=level == "oneshot" or mode != FAST_MODE)
                    )
    for name in NAMED_BY:
        for level in ("mask", "oneshot"):
            for prop in ("R1", "R2"):
                for rule in RULE_NAMES:
                    for mode in MODE_NAMES:
                        fast = level == "mask" and (
                            name == FAST_NAMED or (prop == "R1" and mode == FAST_MODE and name in FAST_R1_NAMED)
                        )
                        out.append(
                            Row(
                                prop,
                                f"named:{name}",
                                mode,
                                rule,
                                level,
                                expected_named(prop, level, name, rule, mode),
                                slow=not fast,
                            )
                        )
    # The other properties, the same on every class (hashed derived by hand
    # as the others: the sibling's boundary is f_H(N - L) or a partial tail
    # of this prompt, independent of N2; replay and legacy differ only in
    # the drop's marks and the 0.29.0/0.30.0 tail; the drop moves every
    # hybrid lookup; kept states are marks or the tail; a one-shot end is a
    # chunked one, the mid-block tail and the block after it included).
    for cls in CLASSES:
        for mode in MODE_NAMES:
            slow = mode != FAST_MODE
            out.append(Row("sibling-any-length", cls, mode, slow=slow))
            drop = MODE[mode].eagle_drop
            out.append(Row("eagle-off", cls, mode, expect="refuted" if drop else "proved", slow=slow))
            if drop:
                out.append(
                    Row("unitary-unshifted", cls, mode, expect="proved" if cls == "unitary" else "refuted", slow=slow)
                )
            for rule in RULE_NAMES:
                out.append(Row("no-over-retention", cls, mode, rule, slow=slow))
                if rule != "replay":
                    out.append(
                        Row(
                            "within-replay",
                            cls,
                            mode,
                            rule,
                            expect=_letter(WITHIN_REPLAY[cls][rule][MODE_NAMES.index(mode)]),
                            slow=slow,
                        )
                    )
            for rule in ("replay", "legacy"):
                out.append(Row("chunked", cls, mode, rule, "ends", slow=slow))
                for which in ("R1", "R2"):
                    out.append(Row("chunked", cls, mode, rule, which, slow=True))
    out += _junction_rows()
    if tier == "fast":
        return [r for r in out if not r.slow]
    if tier == "full":
        return [r for r in out if not _chunked_per_rule(r)]
    return out


# ------------------------------------------------------------------ running


def run_row(row: Row, seed: int = 0, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> Result:
    """Build and decide one row. A nonlinear row (a symbolic chunk budget or
    retention interval) is rebuilt in a fresh z3 context, so that its time,
    and so its verdict at the timeout, depend on the row and the seed only,
    not on what the process (a pool worker) built before: in a shared
    context such rows took from 0.02 s to the 5 s timeout depending on
    their predecessors."""
    t0 = time.perf_counter()
    q = row.build()
    if q.g.sp.nonlinear:
        fresh_context()
        q = row.build()
    out = decide(q.premises, q.claim, seed=seed, timeout_ms=timeout_ms)
    cex = None
    if out.model is not None:
        d = q.decode(out.model)
        geo: Concrete = d.pop("geometry")
        cex = {"geometry": geo.label(), **d}
    return Result(row, out.verdict, time.perf_counter() - t0, cex, out.reason)


def _work(args) -> Result:
    row, seed, timeout_ms = args
    return run_row(row, seed, timeout_ms)


def run_rows(
    rows_: Iterable[Row], *, jobs: int | None = None, seed: int = 0, timeout_ms: int = DEFAULT_TIMEOUT_MS
) -> list[Result]:
    """Run rows in ``jobs`` processes (default: the CPU count). Results come
    back in row order."""
    from spec.parallel import pmap

    return pmap(_work, [(r, seed, timeout_ms) for r in rows_], jobs, chunksize=4)
