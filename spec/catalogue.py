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
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from spec import properties as P
from spec.geometry import MODE, MODES, NAMED_BY, Concrete, Geo
from spec.solve import DEFAULT_TIMEOUT_MS, decide

MODE_NAMES = tuple(m.name for m in MODES)
RULE_NAMES = ("promise", "replay", "legacy")

# --------------------------------------------------------------- R1 and R2
# EXPECT[level][class][(property, rule)] = verdicts per mode.
EXPECT: dict[str, dict[str, dict[tuple[str, str], str]]] = {
    # Every Mamba state written; the retention rule alone decides.
    "mask": {
        # legacy under drop/0.33 (a hypothetical pairing: legacy is <= 0.29.0)
        # is rescued by the 0.32.0+ prompt checkpoint, keyed whatever the mask
        # says, on every uniform geometry but not when M < A.
        "uniform": {
            ("R1", "promise"): "PPPPP", ("R1", "replay"): "PPPPP", ("R1", "legacy"): "PPRPP",
            ("R2", "promise"): "PPPPP", ("R2", "replay"): "RRPPP", ("R2", "legacy"): "RRRPP",
        },
        "aligned": {
            ("R1", "promise"): "PPPPP", ("R1", "replay"): "PPPPP", ("R1", "legacy"): "PPRRP",
            ("R2", "promise"): "PPPPP", ("R2", "replay"): "RRPPP", ("R2", "legacy"): "RRRRP",
        },
        "partial": {
            ("R1", "promise"): "PPPPP", ("R1", "replay"): "PPRPP", ("R1", "legacy"): "PPRPP",
            ("R2", "promise"): "PPPPP", ("R2", "replay"): "RRRPP", ("R2", "legacy"): "RRRPP",
        },
        "unitary": {
            ("R1", "promise"): "PPPPP", ("R1", "replay"): "PPRRP", ("R1", "legacy"): "PPPPP",
            ("R2", "promise"): "PPPPP", ("R2", "replay"): "RRRRP", ("R2", "legacy"): "RRRRP",
        },
    },
    # One-shot prefill: a Mamba state exists only where a chunk ended.
    "oneshot": {
        "uniform": {
            ("R1", "promise"): "PPPPP", ("R1", "replay"): "RPRPP", ("R1", "legacy"): "RPRPP",
            ("R2", "promise"): "PPPPP", ("R2", "replay"): "RRPPP", ("R2", "legacy"): "RRRPP",
        },
        "aligned": {
            ("R1", "promise"): "PPPPP", ("R1", "replay"): "RRRRR", ("R1", "legacy"): "RRRRR",
            ("R2", "promise"): "PPPPP", ("R2", "replay"): "RRRRR", ("R2", "legacy"): "RRRRR",
        },
        "partial": {
            ("R1", "promise"): "PPPPP", ("R1", "replay"): "RPRPP", ("R1", "legacy"): "RPRPP",
            ("R2", "promise"): "PPPPP", ("R2", "replay"): "RRRPP", ("R2", "legacy"): "RRRPP",
        },
        "unitary": {
            ("R1", "promise"): "PPPPP", ("R1", "replay"): "RPRRP", ("R1", "legacy"): "RPRRP",
            ("R2", "promise"): "PPPPP", ("R2", "replay"): "RRRRP", ("R2", "legacy"): "RRRRP",
        },
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
    "partial": {"promise": "RRRRR", "replay": "PPPPP", "legacy": "PPRRP"},
    "unitary": {"promise": "RRRRP", "replay": "PPPPP", "legacy": "PPRRP"},
}

CLASSES = ("uniform", "aligned", "partial", "unitary")


@dataclass(frozen=True)
class Row:
    prop: str  # R1, R2, chunked, sibling-any-length, eagle-off, unitary-unshifted, no-over-retention, within-replay
    geometry: str  # a class of spec.geometry, or "named:<name>"
    mode: str
    rule: str | None = None
    level: str | None = None  # R1/R2: mask | oneshot; chunked: R1 | R2 | ends
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


def rows(tier: str = "full") -> list[Row]:
    """The catalogue.

    ``tier="fast"``: what ``pytest spec/`` runs by default (R1/R2 with every
    state written, per class and per named geometry, and the other
    properties); ``"full"``: also the one-shot-prefill level, within-replay
    and the mamba-only named geometry (``kvspec prove``; pytest ``slow``);
    ``"all"``: also chunked prefill per rule (nonlinear, about half a second
    a row; ``kvspec prove --all``)."""
    if tier not in ("fast", "full", "all"):
        raise ValueError(tier)
    out: list[Row] = []
    for level in ("mask", "oneshot"):
        for cls in CLASSES:
            for (prop, rule), verdicts in EXPECT[level][cls].items():
                for mode, v in zip(MODE_NAMES, verdicts):
                    out.append(Row(prop, cls, mode, rule, level, _letter(v), slow=level == "oneshot"))
    for name, geo in NAMED_BY.items():
        for level in ("mask", "oneshot"):
            for prop in ("R1", "R2"):
                for rule in RULE_NAMES:
                    for mode in MODE_NAMES:
                        slow = level == "oneshot" or geo.cls == "unitary" or prop == "R2"
                        out.append(Row(prop, f"named:{name}", mode, rule, level, expected_named(prop, level, name, rule, mode), slow=slow))
    for cls in CLASSES:
        for mode in MODE_NAMES:
            out.append(Row("sibling-any-length", cls, mode))
            drop = MODE[mode].eagle_drop
            out.append(Row("eagle-off", cls, mode, expect="refuted" if drop else "proved"))
            if drop:
                out.append(Row("unitary-unshifted", cls, mode, expect="proved" if cls == "unitary" else "refuted"))
            for rule in RULE_NAMES:
                out.append(Row("no-over-retention", cls, mode, rule, slow=rule != "replay"))
                if rule != "replay":
                    out.append(Row("within-replay", cls, mode, rule, expect=_letter(WITHIN_REPLAY[cls][rule][MODE_NAMES.index(mode)]), slow=True))
            for rule in ("replay", "legacy"):
                out.append(Row("chunked", cls, mode, rule, "ends", slow=rule == "legacy"))
                for which in ("R1", "R2"):
                    out.append(Row("chunked", cls, mode, rule, which, slow=True))
    if tier == "fast":
        return [r for r in out if not r.slow]
    if tier == "full":
        return [r for r in out if not (r.prop == "chunked" and r.level in ("R1", "R2"))]
    return out


# ------------------------------------------------------------------ running


def run_row(row: Row, seed: int = 0, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> Result:
    t0 = time.perf_counter()
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


def run_rows(rows_: Iterable[Row], *, jobs: int | None = None, seed: int = 0, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> list[Result]:
    """Run rows in ``jobs`` processes (default: the CPU count). Results come
    back in row order."""
    from spec.parallel import pmap

    return pmap(_work, [(r, seed, timeout_ms) for r in rows_], jobs, chunksize=4)
