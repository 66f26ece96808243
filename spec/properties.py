"""The properties, as queries: premises plus a claim over one geometry class.

R1 and R2 are issue 4's promise, for a prompt of N tokens sent first to an
empty cache under sparse retention (interval 0):

* **R1** (identical resend): let r be where the resend resumes under dense
  retention and T = floor_to(kept_state(r, U), M) the Mamba state block r
  lands on. R1 holds when T = 0 (nothing to keep) or the rule keeps a state
  p with T <= p <= r. For replay and legacy, whose states are whole Mamba
  blocks, that is "T is kept"; the promise keeps r itself (a partial tail
  when U < M). Equivalently: the first identical repeat hits at least T.
* **R2** (longer sibling): the same for e, where a later prompt of any
  N2 > N tokens extending this one resumes under dense retention.

Each comes at three levels:

* ``mask``: the retention mask keeps the state (every Mamba block state is
  assumed written: what issue 4 states);
* ``oneshot``: the state is also written: in Mamba align mode vLLM writes a
  state only where a prefill chunk ends (``reference.serial.chunk_ends``),
  here for a one-shot prefill (budget >= N);
* ``chunked``: as oneshot, with a chunk budget c*S for any c >= 1.

Other properties: ``chunked`` (chunked prefill fails nowhere one-shot does
not), ``sibling_any_length`` (e does not depend on N2, which lets the
fidelity tests use one N2), ``eagle_off`` (replay and legacy keep the same
states without the drop), ``unitary_unshifted`` (a single-group Mamba layout
is not shifted by the EAGLE flag), ``no_over_retention`` (at interval 0 a
cache call keeps only the rule's own boundaries plus junctions) and
``within_replay`` (what the rule keeps is among the replay boundaries plus
junctions: the promise costs no more than vLLM's rule).

The junction properties (issue 10), for a request with hit 0, one-shot or
chunked prefill, under sparse, periodic (symbolic c >= 1) or dense
retention: ``junction_observed`` (after a request split its prefill at the
junction J, the state a sibling diverging at J needs is kept) and
``junction_unobserved`` (before that, the promise keeps the state at a
divergence point only where a chunk ended on the Mamba grid or at its own
boundaries).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import z3

from spec import rules as R
from spec.geometry import Geo, Mode
from spec.radix import AND, OR, Count, to_z3

LEVELS = ("mask", "oneshot", "chunked")


@dataclass
class Query:
    """One proof obligation and how to read its counterexamples back."""

    prop: str
    rule: str | None
    mode: Mode | None
    g: Geo
    claim: z3.BoolRef
    base: list  # premises besides g.premises and the side constraints
    counts: dict[str, Count] = field(default_factory=dict)
    ints: dict[str, z3.ArithRef] = field(default_factory=dict)

    @property
    def premises(self) -> list:
        return [*self.g.premises, *self.base, *self.g.sp.side]

    def decode(self, model: z3.ModelRef) -> dict[str, Any]:
        geo = self.g.concrete(model)
        out: dict[str, Any] = {"class": geo.cls, "A": geo.A, "M": geo.M, "S": geo.S, "H": geo.H, "U": geo.U}
        for name, c in self.counts.items():
            out[name] = self.g.sp.value(c, model)
        for name, v in self.ints.items():
            out[name] = model.eval(v, model_completion=True).as_long()
        out["geometry"] = geo
        return out


def _start(g: Geo) -> tuple[Count, list]:
    N = g.sp.count(f"{g.sp.tag}.N")
    return N, [to_z3(N >= 1)]


def _holds(g: Geo, mode: Mode, rule: str, N: Count, target: Count, reach: Count, level: str, chunk=None) -> z3.BoolRef:
    """T == 0, or the rule keeps a state p with T <= p <= reach."""
    witnesses, keep = R.retained(g, mode, rule, N, level="mask" if level == "mask" else "oneshot", chunk=chunk)
    return to_z3(OR(target == 0, *[AND(target <= k, k <= reach, keep(k)) for k in witnesses]))


def _target(g: Geo, b: Count) -> Count:
    return R.floor_to(R.kept_state(g, b), g.M)


def resend_claim(g: Geo, mode: Mode, rule: str, N: Count, level: str, chunk=None) -> z3.BoolRef:
    r = R.resend_boundary(g, mode, N)
    return _holds(g, mode, rule, N, _target(g, r), r, level, chunk)


def sibling_claim(g: Geo, mode: Mode, rule: str, N: Count, N2: Count, level: str, chunk=None) -> z3.BoolRef:
    e = R.extension_boundary(g, mode, N, N2)
    return _holds(g, mode, rule, N, _target(g, e), e, level, chunk)


def _chunk_budget(g: Geo, level: str, base: list) -> tuple[z3.ArithRef | None, dict]:
    """R1/R2's chunk budget: at level "chunked" a symbolic chunk count >= 1
    (its premise appended to ``base``, reported as ``chunk_blocks``); at
    any other level none."""
    if level != "chunked":
        return None, {}
    chunk = z3.Int(f"{g.sp.tag}.chunk")
    base.append(chunk >= 1)
    return chunk, {"chunk_blocks": chunk}


def r1(g: Geo, mode: Mode, rule: str, level: str = "mask") -> Query:
    N, base = _start(g)
    chunk, ints = _chunk_budget(g, level, base)
    claim = resend_claim(g, mode, rule, N, level, chunk)
    r = R.resend_boundary(g, mode, N)
    return Query(f"R1/{level}", rule, mode, g, claim, base, {"N": N, "resend": r}, ints)


def r2(g: Geo, mode: Mode, rule: str, level: str = "mask") -> Query:
    N, base = _start(g)
    N2 = g.sp.count(f"{g.sp.tag}.N2")
    base.append(to_z3(N2 > N))
    chunk, ints = _chunk_budget(g, level, base)
    claim = sibling_claim(g, mode, rule, N, N2, level, chunk)
    e = R.extension_boundary(g, mode, N, N2)
    return Query(f"R2/{level}", rule, mode, g, claim, base, {"N": N, "N2": N2, "sibling": e}, ints)


def chunked(g: Geo, mode: Mode, rule: str, which: str = "R1") -> Query:
    """Chunked prefill fails nowhere one-shot does not: for every chunk
    budget c*S, R (oneshot) implies R (chunked)."""
    N, base = _start(g)
    chunk = z3.Int(f"{g.sp.tag}.chunk")
    base.append(chunk >= 1)
    counts: dict[str, Count] = {"N": N}
    if which == "R1":
        one = resend_claim(g, mode, rule, N, "oneshot")
        many = resend_claim(g, mode, rule, N, "chunked", chunk)
    else:
        N2 = g.sp.count(f"{g.sp.tag}.N2")
        base.append(to_z3(N2 > N))
        counts["N2"] = N2
        one = sibling_claim(g, mode, rule, N, N2, "oneshot")
        many = sibling_claim(g, mode, rule, N, N2, "chunked", chunk)
    return Query(f"chunked/{which}", rule, mode, g, z3.Implies(one, many), base, counts, {"chunk_blocks": chunk})


def chunk_ends_nested(g: Geo, mode: Mode, rule: str) -> Query:
    """Every state a one-shot prefill writes is written by a prefill in
    chunks of any c*S tokens (the chunk ends of one contain the other's).
    R1 and R2 only ask whether some state is written, so with this lemma
    chunked prefill fails nowhere the one-shot prefill does not, for every
    rule (``chunked`` checks that per rule directly, slower)."""
    N, base = _start(g)
    chunk = z3.Int(f"{g.sp.tag}.chunk")
    base.append(chunk >= 1)
    p = g.sp.count(f"{g.sp.tag}.p")
    one = R.chunk_end(g, mode, rule, N)
    many = R.chunk_end(g, mode, rule, N, chunk)
    claim = z3.Implies(to_z3(AND(p > 0, one(p))), to_z3(many(p)))
    return Query("chunk-ends-nested", rule, mode, g, claim, base, {"N": N, "p": p}, {"chunk_blocks": chunk})


def sibling_any_length(g: Geo, mode: Mode) -> Query:
    """Every longer sibling resumes at the same boundary: e(N2) equals e at
    N + S + L + 1 (the sibling ``reference.serial.promise_boundaries`` uses)."""
    N, base = _start(g)
    N2 = g.sp.count(f"{g.sp.tag}.N2")
    base.append(to_z3(N2 > N))
    claim = to_z3(R.extension_boundary(g, mode, N, N2) == R.extension_boundary(g, mode, N))
    return Query("sibling-any-length", None, mode, g, claim, base, {"N": N, "N2": N2})


def junction_grid(g: Geo):
    """The unit an attention junction lies on: A (= U) in every class but
    ``hashed``, where full attention also stops at a partial tail, minus one
    hash unit under the drop: any multiple of H = U."""
    return g.U if g.fine else g.A


def _junction(g: Geo, N: Count, base: list) -> Count:
    """A junction J: 0, or a multiple of the junction grid (A; H in
    ``hashed``) in (0, N-1] (the attention hit of this request when the
    Mamba hit fell short)."""
    J = g.sp.count(f"{g.sp.tag}.J")
    base.append(to_z3(OR(J == 0, AND(J > 0, J <= N - 1, junction_grid(g).divides(J) if g.A is not None else J == 0))))
    return J


def _kept_at(g: Geo, mode: Mode, rule: str, N: Count, J: Count, interval):
    """(witnesses, keep) of a cache call with junction J at the mask level."""
    return R.retained(g, mode, rule, N, level="mask", junction=J, interval=interval)


def _interval(g: Geo, base: list, value: int | None = 0) -> z3.ArithRef:
    """The retention interval as c (interval c*S), fixed to ``value`` by a
    premise: the mask formula itself handles every c >= 0."""
    c = z3.Int(f"{g.sp.tag}.interval")
    base.append(c >= 0 if value is None else c == value)
    return c


def eagle_off(g: Geo, mode: Mode) -> Query:
    """Replay and legacy keep the same states (any junction, any interval)."""
    N, base = _start(g)
    J = _junction(g, N, base)
    P = _interval(g, base, None)
    p = g.sp.count(f"{g.sp.tag}.p")
    _, replay = _kept_at(g, mode, "replay", N, J, P)
    _, legacy = _kept_at(g, mode, "legacy", N, J, P)
    return Query(
        "eagle-off",
        None,
        mode,
        g,
        to_z3(replay(p)) == to_z3(legacy(p)),
        base,
        {"N": N, "J": J, "p": p},
        {"interval_blocks": P},
    )


def unitary_unshifted(g: Geo, mode: Mode) -> Query:
    """The EAGLE flag does not move a lookup: the resend and every longer
    sibling resume where they would with the drop off (for a unitary Mamba
    layout: floor((N-1)/S)*S and floor(N/S)*S)."""
    from dataclasses import replace

    N, base = _start(g)
    N2 = g.sp.count(f"{g.sp.tag}.N2")
    base.append(to_z3(N2 > N))
    off = replace(mode, eagle_drop=False)
    claim = to_z3(
        AND(
            R.resend_boundary(g, mode, N) == R.resend_boundary(g, off, N),
            R.extension_boundary(g, mode, N, N2) == R.extension_boundary(g, off, N, N2),
        )
    )
    return Query(
        "unitary-unshifted", None, mode, g, claim, base, {"N": N, "N2": N2, "resend": R.resend_boundary(g, mode, N)}
    )


def no_over_retention(g: Geo, mode: Mode, rule: str, against: str | None = None) -> Query:
    """At interval 0 every state a cache call keeps is one of the rule's own
    boundaries, junctions or its tail checkpoint (``against`` a rule: one of
    that rule's). The interval is a symbolic c with a premise c = 0, so the
    mask's own handling of 0 is what is checked."""
    N, base = _start(g)
    J = _junction(g, N, base)
    P = _interval(g, base, 0)
    p = g.sp.count(f"{g.sp.tag}.p")
    _, kept = _kept_at(g, mode, rule, N, J, P)
    allowed, _ = _kept_at(g, mode, against or rule, N, J, P)
    claim = z3.Implies(to_z3(kept(p)), to_z3(OR(*[p == k for k in allowed])))
    name = "within-replay" if against else "no-over-retention"
    return Query(name, rule, mode, g, claim, base, {"N": N, "J": J, "p": p})


# ------------------------------------------------------------- the junction

RETENTIONS = ("sparse", "periodic", "dense")


def _chunking(g: Geo, base: list, level: str) -> tuple[Any, dict]:
    """The chunk budget of a level: None (one-shot prefill) or a z3 Int
    c >= 1 (budget c*S, ``level="chunked"``)."""
    if level == "oneshot":
        return None, {}
    if level != "chunked":
        raise ValueError(f"level {level!r}: oneshot or chunked")
    chunk = z3.Int(f"{g.sp.tag}.chunk")
    base.append(chunk >= 1)
    return chunk, {"chunk_blocks": chunk}


def _retention(g: Geo, base: list, retention: str) -> tuple[Any, dict]:
    """The retention interval argument of ``rules.retained``: ``sparse`` 0
    (a literal, so the query stays linear; ``no_over_retention`` checks the
    mask's handling of a symbolic c = 0), ``periodic`` a symbolic c >= 1
    (interval c*S), ``dense`` None."""
    if retention == "dense":
        return None, {}
    if retention == "sparse":
        return 0, {}
    if retention != "periodic":
        raise ValueError(f"retention {retention!r}: one of {RETENTIONS}")
    c = z3.Int(f"{g.sp.tag}.interval")
    base.append(c >= 1)
    return c, {"interval_blocks": c}


def _divergence(g: Geo, N: Count, base: list, name: str) -> Count:
    """A divergence point on the attention grid inside the prompt: a
    multiple of A (of H in ``hashed``) in (0, N-1] (what a later sibling's
    attention lookup, or this request's own, can stop at). Hybrid classes
    only: a unitary layout has no attention group, hence no junction."""
    if g.A is None:
        raise ValueError("a unitary Mamba layout has no attention group: no junction")
    J = g.sp.count(f"{g.sp.tag}.{name}")
    base.append(to_z3(AND(J > 0, J <= N - 1, junction_grid(g).divides(J))))
    return J


def junction_observed(g: Geo, mode: Mode, rule: str, level: str = "oneshot", retention: str = "sparse") -> Query:
    """Junction observed (issue 10): a request of N tokens whose lookup
    reached the attention junction J (0 < J <= N-1, a multiple of A; of H in
    ``hashed``) with no
    Mamba state (hit 0) splits its prefill at J, so the state a later sibling
    with the same divergence point needs is written and kept: T = 0, or the
    rule keeps a state p with T <= p <= kept_state(J), where T =
    floor_to(kept_state(J), M) is the Mamba block that sibling's
    dense-retention hit lands on (R1/R2's target; the sibling's attention
    lookup stops at J, and its Mamba lookup takes the deepest kept state
    <= J).

    Candidates for p: the rule's marks and tail checkpoint (``retained``'s
    witnesses) plus T and kept_state(J) themselves. That is every state that
    can be kept in [T, kept_state(J)]: U divides J (U = A; in ``hashed`` J
    is a multiple of H = U, and T = floor_to(J, B) is where the prefill
    split), so kept_state(J) = J, and the only Mamba-block boundary in
    [T, J] is T (a periodic multiple or a dense retention's written state
    is one); any other kept state is a promise boundary (a mark) or the
    tail."""
    N, base = _start(g)
    J = _divergence(g, N, base, "J")
    chunk, ints = _chunking(g, base, level)
    interval, more = _retention(g, base, retention)
    witnesses, keep = R.retained(g, mode, rule, N, level="oneshot", chunk=chunk, junction=J, interval=interval)
    reach = R.kept_state(g, J)
    T = _target(g, J)
    candidates = {k.key: k for k in [T, reach, *witnesses]}.values()
    claim = to_z3(OR(T == 0, *[AND(T <= k, k <= reach, keep(k)) for k in candidates]))
    return Query(
        f"junction-observed/{level}/{retention}",
        rule,
        mode,
        g,
        claim,
        base,
        {"N": N, "J": J, "target": T},
        {**ints, **more},
    )


def junction_unobserved(g: Geo, mode: Mode, level: str = "oneshot", retention: str = "dense") -> Query:
    """Before the junction is observed the promise does not claim the
    divergence point: for the first request of N tokens (no junction yet) and
    any divergence point D (a multiple of A, of H in ``hashed``, in
    (0, N-1]) where a later
    sibling's attention lookup stops, the promise keeps the state at D only
    if this request wrote it (a prefill chunk ended at D on the Mamba grid)
    or D is one of the promise's own boundaries. So the first sibling's
    promised hit is the deepest state actually written at or below D, as in
    vLLM (issue 10: 0/0/640, not 0/640/640); before the fix the promise
    assumed every Mamba block written and claimed D under dense and periodic
    retention."""
    N, base = _start(g)
    D = _divergence(g, N, base, "D")
    chunk, ints = _chunking(g, base, level)
    interval, more = _retention(g, base, retention)
    _, keep = R.retained(g, mode, "promise", N, level="oneshot", chunk=chunk, interval=interval)
    ends = R.chunk_end(g, mode, "promise", N, chunk)
    own = R.promise_boundaries(g, mode, N)
    claim = z3.Implies(to_z3(keep(D)), to_z3(OR(AND(g.M.divides(D), ends(D)), *[D == b for b in own])))
    return Query(
        f"junction-unobserved/{level}/{retention}", "promise", mode, g, claim, base, {"N": N, "D": D}, {**ints, **more}
    )
