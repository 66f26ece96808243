"""In-process drivers: feed a Campaign with cases until a time or exec budget.

* ``run_cases``: a given list (z3 seeds, a corpus), then stop.
* ``run_random``: seeded ``random.Random`` choices through the shared
  generator (``boundary_bias=False`` gives plain uniform lengths).
* ``run_hypothesis``: Hypothesis draws through the same generator, seeded,
  generate phase only (findings are shrunk by our shrinker, which keeps the
  trace's structure, not by Hypothesis).

The atheris (libFuzzer) driver lives in ``fuzz.atheris_runner``.
"""

from __future__ import annotations

import random
import time
from typing import Iterable

from reference.case import Case

from fuzz.campaign import Campaign, Stats
from fuzz.generate import RandomChooser, build_case


class BoundedEngine:
    """An engine whose every run ends by ``deadline`` (``time.monotonic()``):
    a worker engine gets the time left as its start-up and run timeouts (a
    run cut off there comes back as a worker error, which the campaign,
    past its deadline, counts as cut rather than as a harness error); an
    in-process engine runs as is."""

    def __init__(self, engine, deadline: float):
        self.engine, self.deadline = engine, deadline
        self.version = engine.version

    def run(self, case: Case) -> dict:
        if getattr(self.engine, "mode", None) != "worker":
            return self.engine.run(case)
        left = max(0.1, self.deadline - time.monotonic())
        for proc in getattr(self.engine, "processes", {}).values():
            proc.start_timeout = min(proc.start_timeout, left)
        return self.engine.run(case, timeout=left)

    def resolve(self, case: Case) -> dict:
        if getattr(self.engine, "mode", None) != "worker":
            return self.engine.resolve(case)
        return self.engine.resolve(case, timeout=max(0.1, self.deadline - time.monotonic()))


def run_cases(campaign: Campaign, cases: Iterable[Case], *, max_time: float | None = None, stop_on_finding: bool = False) -> Stats:
    deadline = None if max_time is None else time.monotonic() + max_time
    for case in cases:
        if deadline is not None and time.monotonic() > deadline:
            break
        if campaign.check(case) and stop_on_finding:
            break
    return campaign.stats


def random_cases(seed: int, **pinned) -> Iterable[Case]:
    """Endless seeded cases; keyword arguments go to ``build_case``."""
    rng = random.Random(seed)
    while True:
        yield build_case(RandomChooser(rng), **pinned)


def run_random(campaign: Campaign, seed: int, *, max_time: float = 60.0, max_execs: int | None = None, stop_on_finding: bool = False, synthetic: bool = False, **pinned) -> Stats:
    """Seeded random cases: deployments the engine resolves (default), or
    hand geometries with ``synthetic``."""
    deadline = time.monotonic() + max_time
    synthetic = synthetic or "geometry" in pinned or "speculative" in pinned  # a pinned hand geometry
    if not synthetic and "resolver" not in pinned:
        pinned["resolver"] = campaign.resolver
    for case in random_cases(seed, **pinned):
        if time.monotonic() > deadline or (max_execs is not None and campaign.stats.execs >= max_execs):
            break
        if campaign.check(case) and stop_on_finding:
            break
    return campaign.stats


def run_hypothesis(campaign: Campaign, seed: int, *, max_time: float = 60.0, max_examples: int = 10_000, stop_on_finding: bool = False, batch: int = 100, synthetic: bool = False) -> Stats:
    """Hypothesis generation in seeded batches of ``batch`` examples until
    the time or example budget is spent. The step never raises, so
    Hypothesis never replays or shrinks: a finding is shrunk by ours."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    from fuzz.generate import hypothesis_cases

    deadline = time.monotonic() + max_time
    done = [0, False]  # examples run, stop requested

    def step(case: Case) -> None:
        if done[1] or time.monotonic() > deadline or done[0] >= max_examples:
            return
        done[0] += 1
        if campaign.check(case) and stop_on_finding:
            done[1] = True

    n = 0
    while not done[1] and done[0] < max_examples and time.monotonic() < deadline:
        run = hseed(seed * 1_000_003 + n)(
            settings(max_examples=batch, deadline=None, database=None, phases=(Phase.generate,), suppress_health_check=list(HealthCheck))(given(hypothesis_cases(None if synthetic else campaign.resolver))(step))
        )
        run()
        n += 1
    return campaign.stats
