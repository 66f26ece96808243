"""Encoding vs reference, by interval splitting.

For one concrete geometry the Python reference gives a property's truth for
every N in [1, N_max]. Rather than enumerate models one by one, cut that
range into maximal runs of equal truth and ask z3 once per run: on a run
where the reference says "holds" the encoding must admit no N with the
negated claim, on a run where it says "fails" no N with the claim. Two
answers per run (formula and negation), a few dozen runs per property.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import z3

from spec.properties import Query
from spec.radix import Count, to_z3


@dataclass
class Disagreement:
    lo: int
    hi: int
    reference: bool
    witness: int  # an N in [lo, hi] where the encoding disagrees

    def __str__(self) -> str:
        return f"N in [{self.lo}, {self.hi}]: reference says {'holds' if self.reference else 'fails'}, the encoding disagrees at N={self.witness}"


def runs(values: list[bool], start: int = 1) -> list[tuple[int, int, bool]]:
    """Maximal runs of equal values: (lo, hi, value) with N = start + index."""
    out: list[tuple[int, int, bool]] = []
    for i, v in enumerate(values):
        N = start + i
        if out and out[-1][2] == v and out[-1][1] == N - 1:
            out[-1] = (out[-1][0], N, v)
        else:
            out.append((N, N, v))
    return out


def tokens(q: Query, c: Count) -> z3.ArithRef:
    """The token count of ``c`` as a linear term (concrete geometry only)."""
    sp = q.g.sp
    return c.n * (sp.m * sp.u) + c.j * sp.u + c.s


def compare(q: Query, truth: Callable[[int], bool], n_max: int, *, timeout_ms: int = 20000) -> list[Disagreement]:
    """Check query ``q`` (over a concrete geometry, N symbolic) against the
    reference predicate ``truth(N)`` for N in [1, n_max].

    Two solver calls, whatever the number of runs: the claim on the runs
    where the reference says "fails", and its negation on the runs where it
    says "holds", must both be unsatisfiable. A model is a disagreement; its
    run is reported."""
    N = tokens(q, q.counts["N"])
    table = runs([truth(n) for n in range(1, n_max + 1)])
    bad: list[Disagreement] = []
    for want in (True, False):
        spans = [(lo, hi) for lo, hi, v in table if v == want]
        if not spans:
            continue
        s = z3.SolverFor("QF_LIA")
        s.set("timeout", timeout_ms)
        s.add(*q.premises)
        s.add(z3.Or(*[z3.And(N >= lo, N <= hi) for lo, hi in spans]))
        s.add(z3.Not(q.claim) if want else q.claim)
        res = s.check()
        if res == z3.sat:
            w = s.model().eval(N).as_long()
            lo, hi = next((lo, hi) for lo, hi in spans if lo <= w <= hi)
            bad.append(Disagreement(lo, hi, want, w))
        elif res == z3.unknown:
            bad.append(Disagreement(1, n_max, want, -1))
    return bad


# ---------------------------------------------------------------- batched


@dataclass
class BatchDisagreement:
    claim: str
    N: int
    reference: bool

    def __str__(self) -> str:
        return f"{self.claim}: at N={self.N} the reference says {'holds' if self.reference else 'fails'}, the encoding the opposite"


def compare_batch(
    geo,
    mode,
    levels,
    n_max: int,
    *,
    rules=("promise", "replay", "legacy"),
    props=("R1", "R2"),
    chunk: int | None = None,
    timeout_ms: int = 60000,
) -> list[BatchDisagreement]:
    """R1/R2 of several rules and levels on one concrete geometry and mode
    against the reference, for N in [1, n_max], in a single solver call: the
    encoding and the reference must agree on every run of every claim. (The
    sibling length N2 is left free: ``sibling-any-length`` proves it does not
    matter; the reference uses N + S + L + 1.) ``chunk``: the budget in
    scheduler blocks for the ``chunked`` level."""
    from spec import properties as P
    from spec.oracle import Oracle

    if isinstance(levels, str):
        levels = (levels,)
    g = geo.geo(f"fid{geo.cls}{geo.m}x{geo.u}")
    N, base = P._start(g)
    N2 = g.sp.count(f"{g.sp.tag}.N2")
    base.append(to_z3(N2 > N))
    c = None
    if "chunked" in levels:
        c = z3.Int(f"{g.sp.tag}.chunk")
        base.append(c == chunk)
    claims: dict[str, z3.BoolRef] = {}
    truths: dict[str, list[bool]] = {}
    for rule in rules:
        o = Oracle(geo, mode, rule)
        for level in levels:
            cc = c if level == "chunked" else None
            for prop in props:
                name = f"{prop}/{level} {rule}"
                claims[name] = (
                    P.resend_claim(g, mode, rule, N, level, cc)
                    if prop == "R1"
                    else P.sibling_claim(g, mode, rule, N, N2, level, cc)
                )
                truths[name] = [o.holds(n, prop, level, chunk) for n in range(1, n_max + 1)]
    q = Query("batch", None, mode, g, z3.BoolVal(True), base, {"N": N})
    Nt = tokens(q, N)
    wrong = []
    for name, claim in claims.items():
        spans = [(lo, hi) for lo, hi, v in runs(truths[name]) if v]
        true_spans = z3.Or(*[z3.And(Nt >= lo, Nt <= hi) for lo, hi in spans]) if spans else z3.BoolVal(False)
        wrong.append(z3.If(true_spans, z3.Not(claim), claim))
    s = z3.SolverFor("QF_LIA")
    s.set("timeout", timeout_ms)
    s.add(*q.premises, Nt >= 1, Nt <= n_max, z3.Or(*wrong))
    res = s.check()
    if res == z3.unsat:
        return []
    if res == z3.unknown:
        return [BatchDisagreement("solver: " + s.reason_unknown(), -1, True)]
    model = s.model()
    n = model.eval(Nt).as_long()
    return [
        BatchDisagreement(name, n, truths[name][n - 1])
        for name, w in zip(claims, wrong)
        if z3.is_true(model.eval(w, model_completion=True))
    ]


# ------------------------------------------------------------- the junction


@dataclass
class JunctionDisagreement:
    claim: str
    N: int
    J: int
    reference: bool

    def __str__(self) -> str:
        return f"{self.claim}: at N={self.N}, J={self.J} the reference says {'holds' if self.reference else 'fails'}, the encoding the opposite"


def _cells(table: dict[int, list[bool]], Nt, Jt, want: bool) -> z3.BoolRef:
    """The (N, J) cells of a truth table whose value is ``want``, as runs of
    N per J."""
    out = []
    for j, values in table.items():
        spans = [(lo, hi) for lo, hi, v in runs(values) if v == want]
        if spans:
            out.append(z3.And(Jt == j, z3.Or(*[z3.And(Nt >= lo, Nt <= hi) for lo, hi in spans])))
    return z3.Or(*out) if out else z3.BoolVal(False)


def compare_junction(
    geo,
    mode,
    n_max: int,
    *,
    chunk: int = 2,
    period: int = 1,
    rules=("promise", "replay", "legacy"),
    timeout_ms: int = 60000,
) -> list[JunctionDisagreement]:
    """junction-observed (every rule) and junction-unobserved (the promise)
    on one concrete hybrid geometry and mode against the reference
    (``Oracle.junction_holds`` / ``unobserved_holds``), for every N in
    [1, n_max] and every junction J (a multiple of A in (0, N-1]; of H in
    ``hashed``), at both
    levels (one-shot; chunks of ``chunk`` scheduler blocks) and every
    retention (sparse; periodic every ``period`` scheduler blocks; dense),
    in one solver call: the claims are built over the same symbolic N and J
    (the chunk budget and the interval pinned), and a model is a cell where
    some claim disagrees with the reference."""
    from spec import properties as P
    from spec.oracle import Oracle
    from spec.solve import solver

    g = geo.geo(f"fidj{geo.cls}{geo.m}x{geo.u}")
    if g.A is None:
        raise ValueError("no junction without an attention group")
    # Junctions lie on A, which is U in every class but ``hashed``, where
    # full attention also stops at a partial tail: on U = H.
    S, A = geo.S, geo.U
    settings = [(level, retention) for level in ("oneshot", "chunked") for retention in P.RETENTIONS]
    interval_tokens = {"sparse": 0, "periodic": period * S, "dense": None}
    claims: dict[str, z3.BoolRef] = {}
    truths: dict[str, dict[int, list[bool]]] = {}
    premises: list = []
    pins: dict[str, z3.ArithRef] = {}

    def add(name: str, q, truth) -> None:
        claims[name] = q.claim
        premises.extend(q.base)
        pins.update(q.ints)
        # table[J] = truth at N = 1..n_max (False padding where J > N-1: those
        # cells are outside the premises)
        truths[name] = {j: [n - 1 >= j and truth(n, j) for n in range(1, n_max + 1)] for j in range(A, n_max, A)}

    for level, retention in settings:
        c = chunk if level == "chunked" else None
        iv = interval_tokens[retention]
        for rule in rules:
            o = Oracle(geo, mode, rule)
            q = P.junction_observed(g, mode, rule, level, retention)
            add(
                f"junction-observed/{level}/{retention} {rule}",
                q,
                lambda n, j, o=o, lv=level, c=c, iv=iv: o.junction_holds(n, j, lv, c, iv),
            )
        o = Oracle(geo, mode, "promise")
        q = P.junction_unobserved(g, mode, level, retention)
        add(
            f"junction-unobserved/{level}/{retention}",
            q,
            lambda n, j, o=o, lv=level, c=c, iv=iv: o.unobserved_holds(n, j, lv, c, iv),
        )
    N, J, D = (g.sp.count(f"{g.sp.tag}.{x}") for x in ("N", "J", "D"))
    q = Query("junction-batch", None, mode, g, z3.BoolVal(True), [], {"N": N})
    Nt, Jt, Dt = tokens(q, N), tokens(q, J), tokens(q, D)
    fixed = [pins[k] == v for k, v in (("chunk_blocks", chunk), ("interval_blocks", period)) if k in pins]
    wrong = []
    for name, claim in claims.items():
        point = Dt if name.startswith("junction-unobserved") else Jt
        holds = _cells(truths[name], Nt, point, True)
        wrong.append(z3.If(holds, z3.Not(claim), claim))
    s = solver(0, timeout_ms)  # the pins make every product linear; solve-eqs substitutes them
    s.add(*premises, *g.premises, *g.sp.side, *fixed, Nt >= 1, Nt <= n_max, Dt == Jt, z3.Or(*wrong))
    res = s.check()
    if res == z3.unsat:
        return []
    if res == z3.unknown:
        return [JunctionDisagreement("solver: " + s.reason_unknown(), -1, -1, True)]
    model = s.model()
    n, j = model.eval(Nt).as_long(), model.eval(Jt).as_long()
    return [
        JunctionDisagreement(name, n, j, truths[name][j][n - 1])
        for name, w in zip(claims, wrong)
        if z3.is_true(model.eval(w, model_completion=True))
    ]


# ------------------------------------------------------------------ terms

#: The prompt lengths ``term_disagreements`` compares at.
SAMPLE_N = tuple(range(1, 72))


def _int(c: Count) -> int:
    """The token count of a Count whose digits folded to Python ints."""
    assert all(isinstance(d, int) for d in (c.n, c.j, c.s)), c
    return c.n * c.sp.m * c.sp.u + c.j * c.sp.u + c.s


def _bool(b) -> bool:
    assert isinstance(b, bool), b
    return b


def term_disagreements(
    geo, every_junction_below: int = 0, sample=SAMPLE_N, modes=None, *, kept: bool = True, first: bool = False
) -> list[str]:
    """Each encoded function of ``spec.rules`` against its reference function
    on one concrete geometry, at concrete N (every digit folds to a Python
    int, so no solver is involved), for every N in ``sample`` and every mode:
    the resend and sibling boundaries, the hashed length, the last cache
    position, every rule's boundaries, the tail checkpoint, the
    full-attention partial tail (``hashed``), and from token 0 with no
    junction and with junctions J (a multiple of the junction grid below N:
    the lowest two, the middle one and the highest): the one-shot chunk ends
    (at every junction for N below ``every_junction_below``) and
    (``kept``) the states each rule keeps at the one-shot level (sparse).
    Compared on the hash-unit
    grid (u: every chunk end and kept state lies on it, and so do the
    callers' queries). Returns the disagreements (``first``: only the
    first one found)."""
    from reference.boundaries import floor_to, tail_checkpoint
    from reference.serial import chunk_ends, prompt_fa_tail
    from spec import rules as R
    from spec.geometry import MODES
    from spec.oracle import Oracle

    u = geo.u
    bad = []
    for mode in modes or MODES:
        for rule in ("replay", "legacy"):
            o = Oracle(geo, mode, rule)
            L, bs = o.knobs.hash_lookahead_tokens, o.bs
            for n in sample:
                g = geo.geo()

                def count(x: int) -> Count:
                    return Count(g.sp, x // geo.S, (x % geo.S) // u, x % u)

                N = count(n)
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
                if geo.cls == "hashed":
                    got["fa_tail"] = _int(R.fa_tail(g, mode, N))
                    want["fa_tail"] = prompt_fa_tail(n, o.geometry, o.knobs)
                if first and bad:
                    return bad[:1]
                if got != want:
                    bad.append(f"{geo.label()} {mode.name} {rule} N={n}: {got} != {want}")
                    continue
                if geo.cls in ("partial", "hashed") or o.knobs.tail_checkpoint == "checkpoint":
                    if _int(R.tail_checkpoint(g, mode, rule, N)) != tail_checkpoint(
                        n, geo.H, mode.eagle_drop, L, o.knobs.tail_checkpoint
                    ):
                        bad.append(f"{geo.label()} {mode.name} {rule} N={n}: tail")
                grid = geo.U  # the junction grid: A, or H in ``hashed``
                junctions = [0] if geo.A is None else [0, *range(grid, n, grid)]
                some = sorted(set(junctions[:2] + junctions[len(junctions) // 2 :][:1] + junctions[-1:]))
                if n >= every_junction_below:
                    junctions = some
                points = range(u, n + 1, u)
                for j in junctions:
                    J = None if j == 0 else count(j)
                    ends = R.chunk_end(g, mode, rule, N, junction=J)
                    ref_ends = set(chunk_ends(n, 0, j, replace(o.geometry, max_num_batched_tokens=n), o.knobs))
                    got_ends = {p for p in points if _bool(ends(count(p)))}
                    if got_ends != {p for p in ref_ends if p % u == 0} or not ref_ends <= set(points) | {n}:
                        bad.append(
                            f"{geo.label()} {mode.name} {rule} N={n} J={j}: chunk ends {sorted(got_ends)} != {sorted(ref_ends)}"
                        )
                        continue
                    for kept_rule in ("promise", rule) if kept and j in some else ():
                        witnesses, keep = R.retained(g, mode, kept_rule, N, level="oneshot", junction=J)
                        ref_kept = o.kept(n, "oneshot", rule=kept_rule, junction=j)
                        # keep(p) can hold only on the Mamba grid or at a witness (a mark, the tail)
                        candidates = set(range(geo.M, n + 1, geo.M)) | {_int(w) for w in witnesses} | ref_kept
                        got_kept = {p for p in candidates if p > 0 and _bool(keep(count(p)))}
                        if got_kept != ref_kept:
                            bad.append(
                                f"{geo.label()} {mode.name} {kept_rule} N={n} J={j}: kept {sorted(got_kept)} != {sorted(ref_kept)}"
                            )
    return bad[:1] if first else bad
