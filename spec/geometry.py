"""The vocabulary the proofs quantify over: geometry classes and serving modes.

Letters as in ``reference/``: ``S`` scheduler block, ``A`` attention block,
``M`` Mamba block, ``H`` hash block, ``U`` hit alignment unit, ``L`` hash
lookahead tokens, ``bs`` the smallest group block (``cache_config.block_size``,
what the Mamba prefill split aligns to).

**Geometry classes.** One attention group of block A and one Mamba block size
M (any number of Mamba groups), hash block H dividing both, ``S = lcm(A, M)``
(``reference.knobs.resolve_knobs`` refuses any other S). Without partial
hash hits ``resolve_knobs`` also refuses an attention block above the hit
unit U. That leaves these hybrid shapes (``spec.test_fidelity`` checks this
against ``resolve_knobs`` on every small geometry):

* ``uniform``: ``A = M = S = H = U`` (``m = 1``): the production layouts
  (1600, 1568), every block a scheduler block.
* ``aligned``: ``M`` divides ``A`` strictly: ``S = A = U``, ``H = M``, hits
  land on S. With ``S = m*u``: ``A = S``, ``M = u``, ``bs = u``, ``m >= 2``.
* ``partial``: ``A`` divides ``M`` strictly: partial hash hits are on,
  ``A = H = U = u``, ``M = S = m*u`` (``m >= 2``), ``bs = u``.

With partial hash hits the attention block may also exceed the hit unit, if
the hash block divides it (reference 2243658: full attention then matches
whole blocks plus an earlier prompt's partial tail). Of those geometries
vLLM's deployments build one shape (Mamba align mode: every group has the
block B, ``reference.reachability``), the fourth hybrid class:

* ``hashed``: ``A = M = S = B = m*u``, ``H = U = u`` with ``m >= 2``
  (``--prefix-match-unit`` H below the block), ``bs = B``: Qwen3-Next on an
  A100 at 544 with a match unit of 16 or 32. Full attention matches whole
  blocks, then the prompt's own partial tail inside the next block
  (``rules.fa_tail``), reads one hash unit past the candidate and drops one
  under the EAGLE drop; hits land on H; Mamba states are kept at block
  boundaries and at the prompt's checkpoint (the tail, on H).

The geometries ``resolve_knobs`` supports outside every class are hand
geometries no deployment reaches: two block sizes and a hash block below
both (``spec.test_fidelity`` lists them).

plus ``unitary``: a single Mamba group (UnitaryKVCacheCoordinator), ``M = S =
H = U = bs`` (``m = 1``), no attention group. ``hybrid`` is aligned or partial
with the choice left to the solver (uniform, aligned or partial).

**Serving modes.** What a vLLM version resolves from the speculative settings
(``reference.knobs``): the EAGLE drop on or off, the lookahead tokens L, and
the EAGLE lookup ceiling (``n_minus_1``: 0.29.0/0.30.0; ``hashed``: 0.32.0+)
and, with partial hash hits, where a prompt's full-attention partial tail is
keyed (``Mode.fa_tail_kind``).
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from reference.case import Case, parse_case
from spec.radix import Space, Unit, to_z3

MTP_DROP = {"method": "mtp", "num_speculative_tokens": 2, "disable_lookahead_block_hashes": True}
MTP = {"method": "mtp", "num_speculative_tokens": 2}

CLASSES = ("uniform", "aligned", "partial", "hashed", "unitary", "hybrid")


@dataclass(frozen=True)
class Mode:
    """A serving configuration: the knobs that move boundaries."""

    name: str
    eagle_drop: bool
    L: int
    ceiling: str  # "n_minus_1" | "hashed"
    #: The vLLM version a case file of this mode is run as, per rule
    #: (legacy is vLLM <= 0.29.0; replay 0.30.0-0.33.0).
    version: str
    legacy_version: str
    speculative: dict | None
    junction_back_off: bool
    doc: str

    def version_for(self, rule: str) -> str:
        return self.legacy_version if rule == "legacy" else self.version

    def on_engine(self, rule: str) -> bool:
        """Does some vLLM version run this rule with these knobs? (legacy is
        vLLM <= 0.29.0: only the 0.29.0/0.30.0 modes; replay is 0.30.0-0.33.0;
        the promise is kvspec's.) Other pairings are hypothetical: their
        verdicts say what the rule would do, no engine can confirm them."""
        if rule == "legacy":
            return self.legacy_version == "0.29.0"
        return rule == "replay"

    def tail_kind(self, rule: str) -> str:
        """``Knobs.tail_checkpoint`` of the version a rule is run as."""
        v = tuple(int(x) for x in self.version_for(rule).split("."))
        return "checkpoint" if v >= (0, 32, 0) else ("floor_drop" if v >= (0, 30, 0) else "floor")

    @property
    def fa_tail_kind(self) -> str:
        """``Knobs.fa_tail`` of this mode's versions (legacy's 0.29.0 and
        replay's 0.30.0 agree: ``n``; 0.33.0 ``cap_hashed``)."""
        v = tuple(int(x) for x in self.version.split("."))
        return "cap_hashed" if v >= (0, 33, 0) else ("cap" if v >= (0, 32, 0) else "n")

    def speculative_for(self, S: int) -> dict | None:
        """The speculative settings of a case; K=2 as the fuzzer's, or K=1
        where the scheduler block is a single token (vLLM refuses K > S with
        the drop)."""
        if self.speculative is None:
            return None
        return {**self.speculative, "num_speculative_tokens": min(2, S)}


MODES = (
    Mode(
        "plain/0.30",
        False,
        0,
        "n_minus_1",
        "0.30.0",
        "0.29.0",
        None,
        False,
        "no speculative decoding, vLLM 0.29.0/0.30.0",
    ),
    Mode(
        "plain/0.33", False, 0, "hashed", "0.33.0", "0.33.0", None, False, "no speculative decoding, vLLM 0.32.0/0.33.0"
    ),
    Mode(
        "drop/0.30",
        True,
        0,
        "n_minus_1",
        "0.30.0",
        "0.29.0",
        MTP_DROP,
        False,
        "EAGLE/MTP with the block drop, lookup ceiling N-1 (0.29.0/0.30.0)",
    ),
    # junction_back_off False everywhere: 0.33.0 keeps J - bs only in an EAGLE
    # group's Mamba manager, which vLLM's models never have (reference 2243658).
    Mode(
        "drop/0.33",
        True,
        0,
        "hashed",
        "0.33.0",
        "0.33.0",
        MTP_DROP,
        False,
        "EAGLE/MTP with the block drop, ceiling = hashed length (0.33.0 disable_lookahead_block_hashes; 0.32.0 MTP)",
    ),
    Mode(
        "lookahead/0.33",
        False,
        1,
        "hashed",
        "0.33.0",
        "0.33.0",
        MTP,
        False,
        "EAGLE/MTP with lookahead block hashes, no drop (0.33.0 default)",
    ),
)
MODE = {m.name: m for m in MODES}


class Geo:
    """A geometry class over a digit ``Space``: the units A, M, H, U, S, bs
    as ``Unit`` objects, and the premises that make the geometry valid."""

    def __init__(self, cls: str, m=None, u=None, tag: str = ""):
        if cls not in CLASSES:
            raise ValueError(f"geometry class {cls!r}: one of {CLASSES}")
        self.cls = cls
        tag = tag or cls
        mm = z3.Int(f"{tag}.m") if m is None else m
        uu = z3.Int(f"{tag}.u") if u is None else u
        if cls in ("unitary", "uniform"):
            mm = 1
        self.sp = Space(mm, uu, tag)
        self.unitary = cls == "unitary"
        self.premises: list[z3.BoolRef] = [to_z3(self.sp.m >= 1), to_z3(self.sp.u >= 1)]
        self.partial_flag = None
        #: Partial hash hits (U = H < M): False, True or the solver's choice.
        self.partial_hits = cls in ("partial", "hashed")
        #: Full attention above the hit unit (``hashed``): whole blocks plus
        #: the prompt's partial tail, margin and drop of one hash unit.
        self.fine = cls == "hashed"
        if cls == "hashed":
            a_is_S = None
            self.premises.append(to_z3(self.sp.m >= 2))
        elif cls in ("aligned", "uniform"):
            a_is_S = True
            if cls == "aligned":
                self.premises.append(to_z3(self.sp.m >= 2))
        elif cls == "partial":
            a_is_S = False
            self.premises.append(to_z3(self.sp.m >= 2))
        elif cls == "hybrid":
            self.partial_flag = z3.Bool(f"{tag}.partial")
            self.partial_hits = self.partial_flag
            a_is_S = z3.Not(self.partial_flag)
            self.premises.append(z3.Implies(self.partial_flag, to_z3(self.sp.m >= 2)))
        else:
            a_is_S = None
        self.S = Unit("S", True)
        self.bs = Unit("bs", self.unitary or self.fine)  # u; S when unitary (= u) or hashed (every block B)
        if self.unitary:
            self.A = None
            self.M = self.H = self.U = Unit("S", True)
        elif self.fine:
            self.A, self.M = Unit("A", True), Unit("M", True)
            self.U, self.H = Unit("U", False), Unit("H", False)
        else:
            self.A = Unit("A", a_is_S)
            self.U = Unit("U", a_is_S)  # U = A in every supported hybrid
            self.M = Unit("M", z3.Not(a_is_S) if not isinstance(a_is_S, bool) else not a_is_S)
            self.H = Unit("H", False)  # H = u in both hybrid shapes

    # -- reading a model back -------------------------------------------
    def concrete(self, model: z3.ModelRef) -> Concrete:
        def ev(e):
            return e if isinstance(e, int) else model.eval(e, model_completion=True).as_long()

        m, u = ev(self.sp.m), ev(self.sp.u)
        cls = self.cls
        if cls == "hybrid":
            cls = "partial" if z3.is_true(model.eval(self.partial_flag, model_completion=True)) else "aligned"
        return Concrete.from_class(cls, m, u)


@dataclass(frozen=True)
class Concrete:
    """A concrete geometry: block sizes plus its class and digits."""

    cls: str
    A: int | None
    M: int
    m: int
    u: int
    name: str = ""

    @property
    def S(self) -> int:
        return self.m * self.u

    @property
    def H(self) -> int:
        return self.S if self.cls == "unitary" else self.u

    @property
    def U(self) -> int:
        return self.u if self.cls in ("partial", "hashed") else self.S

    @property
    def bs(self) -> int:
        """The smallest group block (``cache_config.block_size``)."""
        return self.S if self.cls == "hashed" else self.u

    @classmethod
    def from_class(cls_, cls: str, m: int, u: int, name: str = "") -> Concrete:
        if cls in ("aligned", "uniform"):
            cls = "uniform" if m == 1 else "aligned"
            return cls_(cls, m * u, u, m, u, name)
        if cls == "partial":
            return cls_(cls, u, m * u, m, u, name)
        if cls == "hashed":
            if m < 2:
                raise ValueError("hashed: the hash unit is below the block (m >= 2)")
            return cls_(cls, m * u, m * u, m, u, name)
        if cls == "unitary":
            return cls_(cls, None, u, 1, u, name)
        raise ValueError(cls)

    @classmethod
    def hashed(cls_, B: int, H: int, name: str = "") -> Concrete:
        """Attention = Mamba = scheduler block B, hash unit (``prefix_match_unit``) H < B dividing it."""
        if H >= B or B % H:
            raise ValueError(f"B={B}, H={H}: the hash unit must divide the block and be smaller")
        return cls_("hashed", B, B, B // H, H, name)

    @classmethod
    def from_blocks(cls_, A: int | None, M: int, name: str = "", H: int | None = None) -> Concrete:
        """Attention block A (None: a single Mamba group), Mamba block M and,
        for A = M, a hash unit H below the block (the ``hashed`` class)."""
        if A is None:
            return cls_("unitary", None, M, 1, M, name)
        if A == M and H is not None and H != A:
            return cls_.hashed(A, H, name)
        if A == M:
            return cls_("uniform", A, M, 1, M, name)
        if A % M == 0:
            return cls_("aligned", A, M, A // M, M, name)
        if M % A == 0:
            return cls_("partial", A, M, M // A, A, name)
        raise ValueError(f"A={A}, M={M}: one must divide the other (the only supported hybrid shapes)")

    def label(self) -> str:
        if self.name:
            return self.name
        if self.cls == "hashed":
            return f"B{self.S}/H{self.H}"
        return f"M{self.M}" if self.A is None else f"A{self.A}/M{self.M}"

    def geometry_dict(self, *, mamba_count: int = 1, budget: int = 8192, interval: int | None = 0) -> dict:
        groups = [] if self.A is None else [{"kind": "full_attention", "block_size": self.A}]
        groups.append({"kind": "mamba", "block_size": self.M, "count": mamba_count if self.A is not None else 1})
        out = {"groups": groups, "retention_interval": interval, "max_num_batched_tokens": budget}
        if self.cls == "hashed":
            out["prefix_match_unit"] = self.H
        return out

    def case(
        self,
        prompts: list[list[tuple[str, int]]],
        speculative: dict | None,
        *,
        name: str | None = None,
        budget: int = 8192,
        mamba_count: int = 1,
        interval: int | None = 0,
    ) -> Case:
        return parse_case(
            {
                "schema": 1,
                "name": name,
                "geometry": self.geometry_dict(mamba_count=mamba_count, budget=budget, interval=interval),
                "speculative": speculative,
                "trace": [{"prompt": [{"segment": s, "length": n} for s, n in p]} for p in prompts],
            }
        )

    def geo(self, tag: str = "") -> Geo:
        """This geometry as a ``Geo`` with concrete digits (N stays symbolic)."""
        return Geo(self.cls, self.m, self.u, tag or f"{self.cls}{self.m}x{self.u}")


#: The named geometries of issue 4 (and the fuzzer's NAMED_GEOMETRIES), and
#: the deployments of issue 9 that resolve to a block with a smaller hash unit
#: (``kvspec resolve --model qwen3_next --device D -- --enable-prefix-caching
#: --prefix-match-unit H``, vLLM 0.33.0): Qwen3-Next on an A100 (TP 1/2, KV
#: auto) at B = 544 with H = 16 or 32, no internal prefill checkpoints; on an
#: H100 at 576 (H = 576 by default, or 32), where vLLM 0.33.0's FlashInfer
#: GDN prefill adds internal checkpoints (grid 576, or lcm(H, 64) = 64) that
#: the z3 encoding leaves out (``spec.test_fidelity`` checks on the reference
#: that they do not change R1/R2 there).
NAMED = (
    Concrete.from_blocks(1600, 1600, "1600"),
    Concrete.from_blocks(1568, 1568, "1568"),
    Concrete.from_blocks(32, 16, "A32/M16"),
    Concrete.from_blocks(16, 32, "A16/M32"),
    Concrete.from_blocks(None, 1600, "mamba-only 1600"),
    Concrete.hashed(544, 16, "qwen3-next a100 544/16"),
    Concrete.hashed(544, 32, "qwen3-next a100 544/32"),
    Concrete.from_blocks(576, 576, "qwen3-next h100 576"),
    Concrete.hashed(576, 32, "qwen3-next h100 576/32"),
)
NAMED_BY = {g.name: g for g in NAMED}
#: The named geometries of issue 4, the ones the fuzzer's literal cases can
#: hold (no ``prefix_match_unit``): ``spec.seeds.boundary_cases``' default.
ISSUE_4_NAMED = ("1600", "1568", "A32/M16", "A16/M32", "mamba-only 1600")


def sweep_geometries(
    limit: int = 4096, step: int = 16, classes=("uniform", "aligned", "partial", "hashed", "unitary")
) -> list[Concrete]:
    """Every S that is a multiple of ``step`` up to ``limit`` with every valid
    (A, M) whose blocks are multiples of ``step``: uniform (A = M = S),
    aligned (A = S, M | S, M < S), partial (M = S, A | S, A < S), hashed
    (A = M = S, a hash unit H | S, H < S, a multiple of ``step``) and
    unitary (a single Mamba group of S)."""
    out = []
    for S in range(step, limit + 1, step):
        divs = [d for d in range(step, S + 1, step) if S % d == 0]
        if "uniform" in classes:
            out.append(Concrete("uniform", S, S, 1, S))
        if "aligned" in classes:
            out += [Concrete("aligned", S, d, S // d, d) for d in divs if d < S]
        if "partial" in classes:
            out += [Concrete("partial", d, S, S // d, d) for d in divs if d < S]
        if "hashed" in classes:
            out += [Concrete("hashed", S, S, S // d, d) for d in divs if d < S]
        if "unitary" in classes:
            out.append(Concrete("unitary", None, S, 1, S))
    return out
