"""Fuzzing benchmarks, measured side by side in one run (printed, never asserted).

1. Time to the first #53504-class finding on vLLM 0.29.0 (an identical
   resend that misses under MTP: oracle ``promise``, request kind
   ``resend``): z3-seeded vs unseeded random vs plain Hypothesis, median
   of 5 seeds each.
2. Cases per second through the in-process engine vs the worker engine.
3. RSS of an in-process campaign at start and after ``--soak`` seconds.

Runs itself inside the 0.29.0 engine environment (``kvspec engines install
vllm==0.29.0`` first), where vLLM imports in-process.

    python bench/fuzz.py [--seeds 5] [--budget 60] [--soak 600]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)  # bench/ must not shadow the packages
VERSION = "0.29.0"


def _reexec_in_engine_env() -> None:
    from engine_adapter import environments
    from engine_adapter.engine import inprocess_vllm_version

    if inprocess_vllm_version() == VERSION:
        return
    if not environments.is_ready(VERSION):
        sys.exit(f"bench/fuzz.py: run `kvspec engines install vllm=={VERSION}` first")
    from kvspec.home import kvspec_home

    from fuzz.seeds import seed_dir

    seed_dir(kvspec_home())  # computed here, where z3 is installed
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    os.execve(str(environments.env_python(VERSION)), [str(environments.env_python(VERSION)), __file__, *sys.argv[1:]], env)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _is_53504(finding_path: str) -> bool:
    f = json.loads(Path(finding_path).read_text())
    return f["oracle"] == "promise" and "(resend)" in f["summary"]


def time_to_first(engine, driver: str, seed: int, budget: float, seeds) -> float | None:
    from fuzz.campaign import Campaign
    from fuzz.drivers import run_cases, run_hypothesis, run_random

    with tempfile.TemporaryDirectory() as out:
        found = []
        campaign = Campaign(engine, out, oracles=("promise",), seed=seed, shrink_calls=0, on_finding=lambda p, f: found.append(p))
        start = time.monotonic()
        deadline = start + budget

        def done() -> bool:
            return any(_is_53504(p) for p in found)

        if driver == "z3-seeded":
            for case in seeds:
                campaign.check(case)
                if done() or time.monotonic() > deadline:
                    break
        while not done() and time.monotonic() < deadline:
            left = deadline - time.monotonic()
            if driver == "hypothesis":
                run_hypothesis(campaign, seed + int(time.monotonic() * 1000) % 1000, max_time=min(left, 2.0), stop_on_finding=True, synthetic=True)
            else:
                run_random(campaign, seed, max_time=min(left, 2.0), stop_on_finding=True, synthetic=True)
                seed += 1000
        return round(time.monotonic() - start, 2) if done() else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per search before giving up")
    parser.add_argument("--soak", type=float, default=600.0, help="seconds of the RSS soak")
    args = parser.parse_args()
    _reexec_in_engine_env()

    from engine_adapter.engine import open_engine
    from kvspec.home import kvspec_home

    from fuzz.drivers import random_cases
    from fuzz.seeds import load_seed_cases, seed_dir

    engine = open_engine(f"vllm=={VERSION}", mode="inprocess")
    seeds = load_seed_cases(seed_dir(kvspec_home()))
    engine.run(seeds[0])  # warm: config construction is slow once

    print(f"# time to the first #53504-class finding on vllm=={VERSION} (median of {args.seeds} seeds; budget {args.budget:.0f}s)")
    for driver in ("z3-seeded", "random", "hypothesis"):
        times = [time_to_first(engine, driver, s, args.budget, seeds) for s in range(1, args.seeds + 1)]
        ok = [t for t in times if t is not None]
        med = statistics.median(ok) if ok else None
        print(f"{driver:11s} median {med if med is not None else '-'} s  runs {times}")

    cases = [c for _, c in zip(range(60), random_cases(7))]
    start = time.monotonic()
    for c in cases:
        engine.run(c)
    inproc = len(cases) / (time.monotonic() - start)
    with open_engine(f"vllm=={VERSION}", mode="worker") as worker:
        worker.run(cases[0])
        start = time.monotonic()
        for c in cases:
            worker.run(c)
        work = len(cases) / (time.monotonic() - start)
    print(f"# cases/s: in-process {inproc:.1f}, worker {work:.1f}, ratio {inproc / work:.2f}")

    from fuzz.campaign import Campaign
    from fuzz.drivers import run_random

    with tempfile.TemporaryDirectory() as out:
        campaign = Campaign(engine, out, seed=1)
        run_random(campaign, 1, max_time=min(30.0, args.soak), synthetic=True)
        rss0 = _rss_mb()
        run_random(campaign, 2, max_time=args.soak, synthetic=True)
        rss1 = _rss_mb()
    print(f"# RSS: {rss0:.0f} MB after warm-up, {rss1:.0f} MB after {args.soak:.0f}s more ({campaign.stats.execs} execs); growth {100 * (rss1 - rss0) / rss0:+.1f}%")


if __name__ == "__main__":
    main()
