"""The same properties computed by the Python reference model (ground truth).

Nothing here restates a rule: every number comes from a ``reference/``
function (``serial.dense_hit``, ``serial.retained_states``,
``knobs.resolve_knobs``) on a real case, so the z3 encodings in ``spec/``
are checked against the reference, never the other way round.

Levels (as in ``spec.properties``) are chunk budgets given to
``retained_states``: ``mask`` uses a budget of one smallest block (a chunk
ends at every block, so every Mamba state is written and only the mask
decides), ``oneshot`` a budget of N, ``chunked`` the budget c*S.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from reference.boundaries import floor_to, kept_state
from reference.knobs import Knobs, resolve_knobs
from reference.serial import (
    chunk_ends,
    dense_hit,
    lookup,
    retained_states,
    rule_boundaries,
)
from spec.geometry import MODE, Concrete, Mode


@cache
def resolved(geo: Concrete, mode_name: str, rule: str = "replay"):
    """(Geometry, Knobs) of ``geo`` served in ``mode`` as the version the
    rule belongs to resolves it."""
    mode = MODE[mode_name]
    case = geo.case([[("A", 1)]], mode.speculative_for(geo.S))
    return case.geometry, resolve_knobs(case, mode.version_for(rule))


def knobs_match(mode: Mode, knobs: Knobs) -> bool:
    """The knobs a version resolves are the mode's."""
    return (knobs.eagle_drop, knobs.hash_lookahead_tokens, knobs.eagle_lookup_ceiling) == (
        mode.eagle_drop,
        mode.L,
        mode.ceiling,
    )


class Oracle:
    """Reference answers for one concrete geometry, mode and rule."""

    def __init__(self, geo: Concrete, mode: Mode, rule: str = "replay"):
        self.geo, self.mode, self.rule = geo, mode, rule
        self.geometry, self.knobs = resolved(geo, mode.name, rule)
        self.bs = min(g.block_size for g in self.geometry.groups)
        self._kept: dict = {}

    def resend(self, N: int) -> int:
        return dense_hit(N, N, self.geometry, self.knobs)

    def sibling(self, N: int, N2: int | None = None) -> int:
        if N2 is None:
            N2 = N + self.geometry.scheduler_block_size + self.knobs.hash_lookahead_tokens + 1
        return dense_hit(N2, N, self.geometry, self.knobs)

    def attention(self, N: int, shared: int | None = None) -> int:
        return lookup(N, [N if shared is None else shared], None, self.geometry, self.knobs).attention  # type: ignore[arg-type]

    def budget(self, N: int, level: str, chunk: int | None = None) -> int:
        if level == "mask":
            return self.bs
        if level == "oneshot":
            return max(N, 1)
        return chunk * self.geometry.scheduler_block_size  # type: ignore[operator]

    def kept(
        self,
        N: int,
        level: str = "mask",
        chunk: int | None = None,
        rule: str | None = None,
        junction: int = 0,
        interval: int | None = 0,
    ) -> set[int]:
        """The Mamba states (token counts) the first request keeps."""
        key = (N, level, chunk, rule, junction, interval)
        if key not in self._kept:
            geometry = replace(
                self.geometry, max_num_batched_tokens=self.budget(N, level, chunk), retention_interval=interval
            )
            _, _, kept = retained_states(rule or self.rule, N, 0, junction, geometry, self.knobs)
            self._kept[key] = kept[self.geo.M]
        return self._kept[key]

    def boundaries(self, N: int, junction: int = 0, rule: str | None = None) -> list[int]:
        return rule_boundaries(rule or self.rule, N, junction, self.geometry, self.knobs)

    def target(self, b: int) -> int:
        return floor_to(kept_state(b, self.knobs.alignment), self.geo.M)

    def holds(self, N: int, which: str, level: str = "mask", chunk: int | None = None) -> bool:
        """R1 (``which="R1"``) or R2 at a level."""
        b = self.resend(N) if which == "R1" else self.sibling(N)
        T = self.target(b)
        return T == 0 or any(T <= p <= b for p in self.kept(N, level, chunk))

    def repeat_hit(self, N: int, budget: int | None = None) -> int:
        """What the first identical repeat hits in the serial model (two
        requests A:N, A:N), for cross-checking R1's reading."""
        from reference.serial import simulate

        case = self.geo.case([[("A", N)]] * 2, self.mode.speculative_for(self.geo.S), budget=budget or max(N, 1))
        return simulate(case, self.knobs, self.rule)[1].hit

    # -- the junction (issue 10) ---------------------------------------
    def junction_holds(
        self, N: int, J: int, level: str = "oneshot", chunk: int | None = None, interval: int | None = 0
    ) -> bool:
        """junction-observed: a request of N tokens with hit 0 and junction
        J keeps a state p with T <= p <= kept_state(J), T the Mamba block of
        kept_state(J) (or T = 0). ``interval`` in tokens (0 sparse, None
        dense)."""
        reach = kept_state(J, self.knobs.alignment)
        T = floor_to(reach, self.geo.M)
        return T == 0 or any(T <= p <= reach for p in self.kept(N, level, chunk, junction=J, interval=interval))

    def unobserved_holds(
        self, N: int, D: int, level: str = "oneshot", chunk: int | None = None, interval: int | None = 0
    ) -> bool:
        """junction-unobserved (the promise): the first request keeps the
        state at D only if a chunk of its prefill ended there on the Mamba
        grid or D is a promise boundary."""
        if D not in self.kept(N, level, chunk, rule="promise", interval=interval):
            return True
        geometry = replace(self.geometry, max_num_batched_tokens=self.budget(N, level, chunk))
        on_grid = D % self.geo.M == 0 and D in chunk_ends(N, 0, 0, geometry, self.knobs)
        return on_grid or D in rule_boundaries("promise", N, 0, self.geometry, self.knobs)
