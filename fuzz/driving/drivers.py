"""In-process drivers: feed a Campaign with cases until a time or exec budget.

* ``run_cases``: a given list (z3 seeds, a corpus), then stop.
* ``run_given``: the user's ``--case`` files, each accounted for (run, cut
  at the deadline, a harness error, not started).
* ``run_random``: seeded ``random.Random`` choices through the shared
  generator (``boundary_bias=False`` gives plain uniform lengths).
* ``run_hypothesis``: Hypothesis draws through the same generator, seeded,
  generate phase only (findings are shrunk by our shrinker, which keeps the
  trace's structure, not by Hypothesis).

The atheris (libFuzzer) driver lives in ``fuzz.driving.atheris_runner``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Sequence

from fuzz.draw.choosers import RandomChooser
from fuzz.draw.generate import another_trace, build_case, class_schedule, hypothesis_cases
from fuzz.driving.campaign import Campaign, Stats
from ground.engines import DEFAULT_FAMILY, FAMILIES, family_of, load
from ground.errors import EngineError
from reference.case import Case

#: Traces the random driver draws on each deployment it draws.
TRACES_PER_DEPLOYMENT = 4


class BoundedEngine:
    """An engine whose every run ends by ``deadline`` (``time.monotonic()``):
    a worker engine gets the time left as its start-up and run timeouts (a
    run cut off there comes back as a worker error, which the campaign,
    past its deadline, counts as cut rather than as a harness error); an
    in-process engine runs as is.

    Past the deadline nothing is started: a run or a resolution raises
    EngineError at once (the campaign counts it as cut). A worker that
    could not start is not started again by this campaign: every later
    call raises the same EngineError at once (without this, each z3 seed's
    resolution spawned a fresh worker and waited out its start-up)."""

    def __init__(self, engine, deadline: float):
        self.engine, self.deadline = engine, deadline
        self.version = engine.version
        self.failed: dict[str, str] = {}  # platform -> why its worker could not start

    def _worker(self) -> bool:
        return getattr(self.engine, "mode", None) == "worker"

    def start(self, platform: str = "cuda") -> None:
        """Start ``platform``'s worker now, within the deadline (a no-op for
        an in-process engine or a running worker); EngineError when it
        cannot, remembered for the later calls."""
        if not self._worker():
            return
        if platform in self.failed:
            raise EngineError(self.failed[platform])
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise EngineError(f"engine={self.engine.version!r}: not started: past the campaign's deadline")
        proc = self.engine.process(platform)
        proc.start_timeout = min(proc.start_timeout, left)
        try:
            proc.start()
        except EngineError as e:
            self.failed[platform] = str(e)
            raise

    def _left(self, case: Case) -> float:
        self.start(case.deployment.platform if case.deployment is not None else "cuda")
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise EngineError(f"engine={self.engine.version!r}: not run: past the campaign's deadline")
        return left

    def run(self, case: Case, options: dict | None = None) -> dict:
        if not self._worker():
            return self.engine.run(case) if options is None else self.engine.run(case, options)
        return self.engine.run(case, options, timeout=self._left(case))

    def resolve(self, case: Case) -> dict:
        if not self._worker():
            return self.engine.resolve(case)
        return self.engine.resolve(case, timeout=self._left(case))


class TreeCoreTwin:
    """The same SGLang engine on its other tree core (Rust), as the
    campaign's second engine: the ``versions`` oracle then holds SGLang's
    two tree cores to the same hits on every case (issue 26)."""

    tree_core = "rust"

    def __init__(self, bounded: BoundedEngine) -> None:
        self.bounded, self.version = bounded, bounded.version
        self.failed = bounded.failed

    def run(self, case: Case) -> dict:
        return self.bounded.run(case, {"tree_core": self.tree_core})

    def resolve(self, case: Case) -> dict:
        return self.bounded.resolve(case)


def engine_down(campaign: Campaign) -> str | None:
    """Why the campaign's engines cannot run anything more (a worker that
    could not start, see ``BoundedEngine``), or None: a driver stops then,
    rather than file one harness error per drawn case."""
    for engine in (campaign.engine, campaign.other):
        failed = getattr(engine, "failed", None)
        if failed:
            return next(iter(failed.values()))
    return None


def run_cases(
    campaign: Campaign, cases: Iterable[Case], *, max_time: float | None = None, stop_on_finding: bool = False
) -> Stats:
    deadline = None if max_time is None else time.monotonic() + max_time
    for case in cases:
        if (deadline is not None and time.monotonic() > deadline) or engine_down(campaign):
            break
        if campaign.check(case) and stop_on_finding:
            break
    return campaign.stats


def run_given(campaign: Campaign, cases: Sequence[tuple[str, Case]], *, deadline: float) -> dict:
    """Run the user's ``--case`` files (``(name, case)`` pairs), in order,
    each to completion or not, and account for every one: ``run`` (judged:
    a verdict, a finding, unsupported or rejected by the engine), ``cut_at_deadline``
    (its run was cut off by the deadline), ``harness_error`` (the harness
    failed on it: not judged) or ``not_started`` (the deadline came first).
    ``unfinished`` names each file not run, with why: a campaign that did
    not run every given file must say so (``fuzz.driving.outcome``)."""
    counts = {"given": len(cases), "run": 0, "cut_at_deadline": 0, "harness_error": 0, "not_started": 0}
    unfinished = []
    for name, case in cases:
        if time.monotonic() >= deadline or campaign.past_deadline():
            why = "not_started"
        else:
            cut, errors = campaign.stats.cut_at_deadline, campaign.stats.harness_errors
            campaign.check(case)
            why = (
                "cut_at_deadline"
                if campaign.stats.cut_at_deadline > cut
                else "harness_error"
                if campaign.stats.harness_errors > errors
                else "run"
            )
        counts[why] += 1
        if why != "run":
            unfinished.append({"path": name, "why": why})
    return {**counts, "unfinished": unfinished}


def random_cases(seed: int, family: str = DEFAULT_FAMILY, **pinned) -> Iterable[Case]:
    """Endless seeded cases; keyword arguments go to ``build_case``. A
    deployment case (a ``resolver`` given) takes the next deployment class
    of a seeded schedule (``fuzz.draw.generate.class_schedule``; one
    deployment in four a unit class of a model this campaign saw a hash unit
    straddle the checkpoint grid on, ``fuzz.draw.straddle``), and
    ``TRACES_PER_DEPLOYMENT`` traces are drawn on each drawn deployment
    (vLLM's resolution of a deployment costs more than a run). A
    ``family`` with a generator of its own (its registry entry's
    ``generator``: SGLang's ``fuzz.draw.generate_sglang``) draws its deployments
    instead, the same number of traces on each."""
    rng = random.Random(seed)
    generator = FAMILIES[family].generator
    if generator is not None:  # the family's own deployments, the same traces
        own = load(generator)
        chooser = RandomChooser(rng)
        while True:
            case = own.build_case(chooser, pinned["resolver"])
            yield case
            info = pinned["resolver"](case.deployment.as_dict())
            for _ in range(TRACES_PER_DEPLOYMENT - 1 if info else 0):
                yield own.case_on(chooser, case.deployment.as_dict(), info, None)
    if pinned.get("resolver") is None:
        while True:
            yield build_case(RandomChooser(rng), **pinned)
    favoured: set[str] = set()  # models seen to straddle a checkpoint grid (fuzz.draw.straddle)
    classes = class_schedule(random.Random(rng.randrange(2**32)), favoured)
    chooser = RandomChooser(rng)
    while True:
        case = build_case(chooser, cls=next(classes), noted=favoured, **pinned)
        yield case
        for _ in range(TRACES_PER_DEPLOYMENT - 1):
            if case.deployment is None:
                break
            more = another_trace(chooser, case, pinned["resolver"], pinned.get("pressure", "drawn"))
            if more is None:
                break
            yield more


def _own_builder(version: str):
    """The case builder of the family's own generator, else None (vLLM's)."""
    generator = FAMILIES[family_of(version)].generator
    return None if generator is None else load(generator).build_case


def run_random(
    campaign: Campaign,
    seed: int,
    *,
    max_time: float = 60.0,
    max_execs: int | None = None,
    stop_on_finding: bool = False,
    synthetic: bool = False,
    **pinned,
) -> Stats:
    """Seeded random cases: deployments the engine resolves (default), or
    hand geometries with ``synthetic``."""
    deadline = time.monotonic() + max_time
    synthetic = synthetic or "geometry" in pinned or "speculative" in pinned  # a pinned hand geometry
    if not synthetic and "resolver" not in pinned:
        pinned["resolver"] = campaign.resolver
    cases = iter(random_cases(seed, family_of(campaign.engine.version), **pinned))
    # checked before each case is drawn: drawing one asks the engine to resolve deployments
    while not (
        time.monotonic() > deadline
        or (max_execs is not None and campaign.stats.execs >= max_execs)
        or engine_down(campaign)
    ):
        if campaign.check(next(cases)) and stop_on_finding:
            break
    return campaign.stats


def run_hypothesis(
    campaign: Campaign,
    seed: int,
    *,
    max_time: float = 60.0,
    max_examples: int = 10_000,
    stop_on_finding: bool = False,
    batch: int = 100,
    synthetic: bool = False,
) -> Stats:
    """Hypothesis generation in seeded batches of ``batch`` examples until
    the time or example budget is spent. The step never raises, so
    Hypothesis never replays or shrinks: a finding is shrunk by ours."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    deadline = time.monotonic() + max_time
    done = [0, False]  # examples run, stop requested

    def step(case: Case) -> None:
        if done[1] or time.monotonic() > deadline or done[0] >= max_examples or engine_down(campaign):
            done[1] = done[1] or engine_down(campaign) is not None
            return
        done[0] += 1
        if campaign.check(case) and stop_on_finding:
            done[1] = True

    n = 0
    while not done[1] and done[0] < max_examples and time.monotonic() < deadline and not engine_down(campaign):
        run = hseed(seed * 1_000_003 + n)(
            settings(
                max_examples=batch,
                deadline=None,
                database=None,
                phases=(Phase.generate,),
                suppress_health_check=list(HealthCheck),
            )(
                given(
                    hypothesis_cases(None if synthetic else campaign.resolver, _own_builder(campaign.engine.version))
                )(step)
            )
        )
        run()
        n += 1
    return campaign.stats
