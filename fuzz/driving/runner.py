"""One campaign in this process, as ``kvspec fuzz`` runs it with the
random, Hypothesis or cases driver, and as each Ray worker runs it
(``fuzz.driving.ray_runner``): the user's case files first, then the z3 boundary
cases, then the driver's own cases, until the deadline; its summary (``fuzz.driving.summary``).
(atheris runs libFuzzer processes instead: ``fuzz.driving.atheris_runner``.)"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from engine_adapter import open_engine
from fuzz.driving.atheris_runner import STOP_GRACE_S
from fuzz.driving.campaign import Campaign
from fuzz.driving.config import RunConfig
from fuzz.driving.drivers import BoundedEngine, engine_down, run_cases, run_given, run_hypothesis, run_random
from fuzz.driving.progress import Heartbeat, progress_line
from fuzz.driving.summary import IN_PROCESS_KEYS, CampaignSummary
from ground.console import say as say_line
from ground.engines import FAMILIES, Capability, family_of, load
from ground.errors import EngineError


def run_in_process(
    config: RunConfig,
    engines: list,
    out: Path,
    seeds: list,
    given: list,
    started: float,
    deadline: float,
    say: Callable[[str], None] = say_line,
) -> CampaignSummary:
    """``engines``: names, or engines parsed at the command line's edge
    (``EngineSpec``: opened without parsing again). ``given``: the user's --case files as ``(name, case)`` pairs, run
    first and as they are (a hand geometry among them is labelled synthetic
    in its finding), each accounted for (``fuzz.driving.drivers.run_given``: the
    summary's ``case_files``); then ``seeds``, the z3 boundary cases
    (mapped onto deployments unless --synthetic-geometry), then the driver's
    own cases, all until the deadline. The engine's worker is started once,
    within the deadline; one that cannot start is not started again."""
    stop_at = deadline - STOP_GRACE_S
    opened = [open_engine(name) for name in engines]
    bounded = [BoundedEngine(e, stop_at) for e in opened]
    try:
        for e in bounded:  # start a worker now (within the deadline), so its start-up is measured apart
            try:
                e.start()
            except EngineError:
                pass  # remembered: the first run reports it (a harness error, or cut past the deadline)
        ready, ready_at = time.monotonic(), time.time()
        engine, other = bounded[0], (bounded[1] if len(bounded) > 1 else None)
        twin = FAMILIES[family_of(engine.version)].twin
        if (
            other is None and twin is not None
        ):  # a second engine the family is held to (SGLang's two tree cores: the same hits)
            other = load(twin)(engine)
        campaign = Campaign(engine, out, other=other, seed=config.seed, deadline=stop_at)
        s = campaign.stats
        synthetic = config.synthetic

        def line() -> str:
            elapsed = time.monotonic() - started
            return progress_line(
                elapsed, s.execs, round(s.execs / max(elapsed, 1e-9), 1), None, len(s.findings), s.harness_errors
            )

        with Heartbeat(line, say):
            case_files = run_given(campaign, list(given), deadline=stop_at)
            if not FAMILIES[family_of(engine.version)].supports(
                Capability.BOUNDARY_SEEDS
            ):  # the z3 seeds are mapped onto vLLM deployments
                seeds = []
            elif not synthetic:  # the z3 boundary cases, mapped onto real deployments (none past the deadline)
                from fuzz.draw.seeds import on_deployments

                mappable = [c for c in seeds if c.deployment is None] if not engine_down(campaign) else []
                seeds = on_deployments(mappable, campaign.resolver, stop=campaign.past_deadline) + [
                    c for c in seeds if c.deployment is not None
                ]
            run_cases(campaign, seeds, max_time=max(0.0, stop_at - time.monotonic()))
            left = max(0.0, stop_at - time.monotonic())
            if config.driver == "hypothesis":
                run_hypothesis(campaign, config.seed, max_time=left, synthetic=synthetic)
            elif config.driver == "random":
                run_random(
                    campaign,
                    config.seed,
                    max_time=left,
                    synthetic=synthetic,
                    **({} if synthetic else {"connector": config.connector, "pressure": config.pressure}),
                )
    finally:
        for e in opened:
            e.close()
    findings = []
    for path in s.findings:
        data = json.loads(Path(path).read_text())
        findings.append({"path": path, "summary": data["summary"]})
    end = time.monotonic()
    elapsed = end - started
    fuzzing = max(end - ready, 1e-9)
    return CampaignSummary(
        IN_PROCESS_KEYS,
        engine=getattr(engines[0], "name", engines[0]),
        driver=config.driver,
        elapsed_s=round(elapsed, 2),
        exec_per_s=round(s.execs / max(elapsed, 1e-9), 1),
        startup_s=round(ready - started, 2),
        ready_at=ready_at,
        cases_per_s=round(s.cases / fuzzing, 2),
        engine_runs_per_s=round(s.execs / fuzzing, 2),
        coverage=None,
        workers_died=0,
        findings=findings,
        reach=s.reach.as_dict(),
        case_files=case_files,
        **s.counted(),
    )
