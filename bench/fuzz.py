"""Fuzzing benchmarks, measured side by side in one run (printed, never asserted).

0. **atheris vs random** on one engine (default vllm==0.33.0, deployments,
   every oracle, the z3 seeds first), each as ``kvspec fuzz --driver X
   --max-time B`` runs it, alternated over ``--rounds`` rounds, medians:
   cases per second and engine runs per second of fuzzing (start-up
   apart: vLLM's import, the seeds mapped onto deployments), the ratio
   atheris/random in both units, and the coverage each reached in the
   budget, counted the same way: libFuzzer's ``cov`` (edges) under the
   instrumentation atheris fuzzes with (the vLLM functions under test,
   ``engine_adapter.vllm_engine.coverage``); for the random driver, its very cases
   (the seeds, then ``random_cases(seed)``, as many as it checked) replayed
   by libFuzzer (``KVSPEC_FUZZ_GENERATOR=random``, ``-runs=N``).
   ``--also-core`` adds atheris instrumenting all of ``vllm.v1.core`` (how
   it ran before). A case is one input; its engine runs are the case, the
   oracles' variants (sparse/dense, speculation off) and the confirmation
   and shrinking of a finding.
1. Time to the first #53504-class finding on vLLM 0.29.0 (an identical
   resend that misses under MTP: oracle ``promise``, request kind
   ``resend``): z3-seeded vs unseeded random vs plain Hypothesis, median
   of 5 seeds each.
2. Cases per second through the in-process engine vs the worker engine.
3. RSS of an in-process campaign at start and after ``--soak`` seconds.
4. ``--vs-bare N``: the campaign beside the bare scheduler loop on one
   drawn list of N deployment cases (``random_cases(seed)`` with the
   engine's resolver; vllm==0.33.0 by default, ``--bare-engine``): cases/s
   of ``Campaign.check`` (every oracle, their variant runs, confirming and
   shrinking findings) and of ``engine_adapter.vllm_engine.baseline.bare_run`` (the
   same vLLM calls, nothing observed, nothing judged), in-process, each
   case built from its deployment in both, in one run; the ratio.

Part 0 runs from kvspec's interpreter; 1-3 run inside the 0.29.0 engine
environment (``kvspec engines install vllm==0.29.0`` first), where vLLM
imports in-process.

    python bench/fuzz.py [--rounds 2] [--budget 60] [--also-core] [--only-drivers | --no-drivers] [--seeds 5] [--soak 600]
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
VERSION = os.environ.get("KVSPEC_BENCH_FUZZ_VERSION", "0.29.0")


def _reexec_in_engine_env() -> None:
    from engine_adapter.host import environments
    from engine_adapter.host.engine import inprocess_vllm_version

    if inprocess_vllm_version() == VERSION:
        return
    if not environments.is_ready(VERSION):
        sys.exit(f"bench/fuzz.py: run `kvspec engines install vllm=={VERSION}` first")
    from fuzz.draw.seeds import seed_dir
    from ground.home import kvspec_home

    seed_dir(kvspec_home())  # computed here, where z3 is installed
    env = dict(environments.worker_env(VERSION), KVSPEC_BENCH_FUZZ_INNER="1", KVSPEC_BENCH_FUZZ_VERSION=VERSION)
    os.execve(
        str(environments.env_python(VERSION)), [str(environments.env_python(VERSION)), __file__, *sys.argv[1:]], env
    )


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _is_53504(finding_path: str) -> bool:
    f = json.loads(Path(finding_path).read_text())
    return f["oracle"] == "promise" and "(resend)" in f["summary"]


#: Rounds of a driver (each at most 2 s) a time-to-first search may take,
#: a bound by steps beside its time budget.
MAX_ROUNDS = 10_000


def time_to_first(engine, driver: str, seed: int, budget: float, seeds) -> float | None:
    from fuzz.driving.campaign import Campaign
    from fuzz.driving.drivers import run_hypothesis, run_random

    with tempfile.TemporaryDirectory() as out:
        found = []
        campaign = Campaign(
            engine, out, oracles=("promise",), seed=seed, shrink_calls=0, on_finding=lambda p, f: found.append(p)
        )
        start = time.monotonic()
        deadline = start + budget

        def done() -> bool:
            return any(_is_53504(p) for p in found)

        if driver == "z3-seeded":
            for case in seeds:
                campaign.check(case)
                if done() or time.monotonic() > deadline:
                    break
        rounds = 0
        while not done() and time.monotonic() < deadline and rounds < MAX_ROUNDS:  # bounded by rounds as well as time
            rounds += 1
            left = deadline - time.monotonic()
            if driver == "hypothesis":
                run_hypothesis(
                    campaign,
                    seed + int(time.monotonic() * 1000) % 1000,
                    max_time=min(left, 2.0),
                    stop_on_finding=True,
                    synthetic=True,
                )
            else:
                run_random(campaign, seed, max_time=min(left, 2.0), stop_on_finding=True, synthetic=True)
                seed += 1000
        return round(time.monotonic() - start, 2) if done() else None


def _fuzz(argv: list[str], env: dict, timeout: float) -> dict:
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "kvspec.cli", "fuzz", *argv, "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
    )
    if proc.returncode not in (0, 1):
        raise SystemExit(f"bench/fuzz.py: kvspec fuzz {' '.join(argv)}: exit {proc.returncode}: {proc.stderr[-1500:]}")
    return json.loads(proc.stdout)


def random_coverage(engine: str, seed: int, cases: int, folder: Path, budget: float) -> dict:
    """The coverage the random driver's first ``cases`` cases reach, counted
    by libFuzzer under atheris's instrumentation (see part 0)."""
    from fuzz.draw.seeds import seed_dir
    from fuzz.driving.atheris_runner import run_atheris
    from fuzz.driving.config import RunConfig
    from ground.home import kvspec_home

    return run_atheris(
        engine,
        RunConfig("atheris", seed, libfuzzer=(f"-runs={max(1, cases) + 200}",)),
        folder / "out",
        folder / "corpus",
        seed_dir(kvspec_home()),
        max(600.0, 10 * budget),
        env_extra={"KVSPEC_FUZZ_GENERATOR": "random", "KVSPEC_FUZZ_GENERATOR_CASES": str(cases)},
    ).to_dict()


def drivers(engine: str, budget: float, rounds: int, also_core: bool) -> dict:
    """Part 0: atheris vs random, alternated; the raw summaries."""
    import shutil

    from ground.home import kvspec_home

    tmp = kvspec_home() / f"bench-fuzz-{os.getpid()}"
    kinds = ["atheris", "random"] + (["atheris-core"] if also_core else [])
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    runs["random-coverage"] = []
    try:
        for r in range(rounds):
            for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
                folder = tmp / f"{kind}-{r}"
                argv = [
                    "--engine",
                    engine,
                    "--driver",
                    "random" if kind == "random" else "atheris",
                    "--max-time",
                    str(budget),
                    "--seed",
                    str(r + 1),
                    "--out",
                    str(folder / "out"),
                ]
                if kind != "random":
                    argv += ["--corpus", str(folder / "corpus")]
                env = dict(os.environ)
                env.pop("KVSPEC_FUZZ_INSTRUMENT", None)
                if kind == "atheris-core":
                    env["KVSPEC_FUZZ_INSTRUMENT"] = "core"
                summary = _fuzz(argv, env, timeout=budget + 120)
                runs[kind].append(summary)
                print(
                    f"  round {r}: {kind}: {summary.get('cases')} cases, {summary.get('engine_runs') or summary.get('execs')} engine runs, start-up {summary.get('startup_s')} s, cov {summary.get('coverage')}",
                    file=sys.stderr,
                )
                if kind == "random":
                    cov = random_coverage(engine, r + 1, summary["cases"], tmp / f"random-coverage-{r}", budget)
                    runs["random-coverage"].append(cov)
                    print(
                        f"  round {r}: random's {summary['cases']} cases replayed under libFuzzer: cov {cov.get('coverage')} ({cov.get('execs')} inputs)",
                        file=sys.stderr,
                    )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return runs


def print_drivers(runs: dict, engine: str, budget: float) -> None:
    med = statistics.median

    def m(kind: str, key: str):
        vals = [x.get(key) for x in runs.get(kind, []) if x.get(key) is not None]
        return med(vals) if vals else None

    print(
        f"# atheris vs random on {engine}: kvspec fuzz --max-time {budget:.0f}, deployments, every oracle, z3 seeds first (medians of {len(runs['random'])} alternated rounds)"
    )
    print(
        f"{'driver':14s} {'cases/s':>8s} {'engine runs/s':>14s} {'libFuzzer exec/s':>17s} {'start-up s':>11s} {'cov (edges) in ' + format(budget, '.0f') + ' s':>20s} {'first finding s':>16s}"
    )
    rows = [("atheris", "atheris"), ("random", "random")] + (
        [("atheris (core)", "atheris-core")] if runs.get("atheris-core") else []
    )
    for label, kind in rows:
        cov = m("random-coverage", "coverage") if kind == "random" else m(kind, "coverage")
        libfuzzer = "-" if kind == "random" else f"{m(kind, 'exec_per_s'):.1f}"
        first = m(kind, "first_finding_s")
        print(
            f"{label:14s} {m(kind, 'cases_per_s'):8.2f} {m(kind, 'engine_runs_per_s'):14.2f} {libfuzzer:>17s} {m(kind, 'startup_s'):11.1f} {cov if cov is not None else '-':>20} {first if first is not None else '-':>16}"
        )
    for label, kind in rows:
        if kind == "random":
            continue
        cases = m(kind, "cases_per_s") / m("random", "cases_per_s")
        engine_runs = m(kind, "engine_runs_per_s") / m("random", "engine_runs_per_s")
        cov_a, cov_r = m(kind, "coverage"), m("random-coverage", "coverage")
        print(
            f"{label} / random: cases/s {cases:.2f}, engine runs/s {engine_runs:.2f}, coverage per {budget:.0f} s {cov_a} vs {cov_r} ({cov_a / cov_r:.2f})"
            if cov_r
            else f"{label} / random: cases/s {cases:.2f}, engine runs/s {engine_runs:.2f}"
        )


def vs_bare(n: int, seed: int) -> None:
    """Part 4 (inside the engine environment)."""
    from engine_adapter.host.engine import open_engine
    from engine_adapter.vllm_engine.baseline import bare_run
    from fuzz.driving.campaign import Campaign
    from fuzz.driving.drivers import random_cases

    engine = open_engine(f"vllm=={VERSION}", mode="inprocess")
    with tempfile.TemporaryDirectory() as out:
        campaign = Campaign(engine, out, seed=seed)
        t = time.monotonic()
        cases = [c for _, c in zip(range(n), random_cases(seed, resolver=campaign.resolver))]
        drawn = time.monotonic() - t
        driver = engine.driver
        bare, bare_ok = None, 0
        for _ in range(2):  # twice, the faster counted: the campaign's second pass is warm too
            t = time.monotonic()
            bare_ok = 0
            for c in cases:
                try:
                    bare_run(driver, c)
                    bare_ok += 1
                except Exception:  # noqa: BLE001 - a case vLLM refuses or crashes on costs its attempt in both loops
                    pass
            bare = min(bare or 1e9, time.monotonic() - t)
        t = time.monotonic()
        for c in cases:
            campaign.check(c)
        full = time.monotonic() - t
        s = campaign.stats
        found, execs, shrink_execs, shrink_s = len(s.findings), s.execs, s.shrink_execs, s.shrink_s
        # a second pass over the same cases: every finding is known now, so
        # nothing is confirmed or shrunk: a campaign past its first findings
        t = time.monotonic()
        for c in cases:
            campaign.check(c)
        known = time.monotonic() - t
        again = len(s.findings) - found
    print(
        f"# campaign vs bare scheduler loop on the same {n} drawn deployment cases (vllm=={VERSION}, seed {seed}, in-process; drawing them: {drawn:.1f} s)"
    )
    print(f"bare loop  {n / bare:8.1f} cases/s  ({bare_ok} ran, {bare:.1f} s; the faster of two passes)")
    print(
        f"campaign   {n / full:8.1f} cases/s  ({execs} engine runs, {found} findings, {s.harness_errors} harness errors, {full:.1f} s)"
    )
    checking = max(full - shrink_s, 1e-9)
    print(
        f"  of which confirming and shrinking {found} findings: {shrink_execs} engine runs, {shrink_s:.1f} s; checking alone {n / checking:.1f} cases/s"
    )
    print(
        f"campaign, second pass {n / known:8.1f} cases/s  (the same cases, every finding known: {again} new, {known:.1f} s)"
    )
    print(
        f"campaign / bare: {bare / full:.2f} (checking alone: {bare / checking:.2f}; second pass: {bare / known:.2f})"
    )
    print(
        json.dumps(
            {
                "bench": "fuzz-vs-bare",
                "engine": f"vllm=={VERSION}",
                "cases": n,
                "bare_cases_per_s": round(n / bare, 2),
                "campaign_cases_per_s": round(n / full, 2),
                "ratio": round(bare / full, 3),
                "checking_ratio": round(bare / checking, 3),
                "second_pass_ratio": round(bare / known, 3),
                "second_pass_cases_per_s": round(n / known, 2),
                "second_pass_findings": again,
                "campaign_engine_runs": execs,
                "shrink_engine_runs": shrink_execs,
                "shrink_s": round(shrink_s, 2),
                "findings": found,
            }
        )
    )


def main() -> None:
    global VERSION
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per search (part 0: per campaign)")
    parser.add_argument("--soak", type=float, default=600.0, help="seconds of the RSS soak")
    parser.add_argument("--engine", default="vllm==0.33.0", help="part 0's engine (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=2, help="part 0's alternated rounds (default: %(default)s)")
    parser.add_argument(
        "--also-core", action="store_true", help="part 0: also atheris instrumenting all of vllm.v1.core"
    )
    parts = parser.add_mutually_exclusive_group()
    parts.add_argument("--only-drivers", action="store_true", help="part 0 only")
    parts.add_argument("--no-drivers", action="store_true", help="skip part 0")
    parts.add_argument(
        "--vs-bare",
        type=int,
        default=0,
        metavar="N",
        help="part 4 only: the campaign beside the bare scheduler loop on N drawn cases",
    )
    parser.add_argument("--bare-engine", default="vllm==0.33.0", help="part 4's engine (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="part 4's seed (default: %(default)s)")
    args = parser.parse_args()
    if args.vs_bare:
        from ground.engines import Capability, EngineSpec
        from ground.errors import KvspecError

        try:
            spec = EngineSpec.parse(args.bare_engine, "--bare-engine")
        except KvspecError as e:
            parser.exit(2, f"bench/fuzz.py: {e}\n")
        if not spec.family_entry.supports(Capability.IN_PROCESS):
            sys.exit(f"bench/fuzz.py: --bare-engine={spec.name}: its family is not driven in kvspec's own process")
        VERSION = spec.version
        if os.environ.get("KVSPEC_BENCH_FUZZ_INNER") != "1":
            _reexec_in_engine_env()
        vs_bare(args.vs_bare, args.seed)
        return
    if not args.no_drivers and os.environ.get("KVSPEC_BENCH_FUZZ_INNER") != "1":
        runs = drivers(args.engine, args.budget, args.rounds, args.also_core)
        print_drivers(runs, args.engine, args.budget)
        print(json.dumps({"drivers": runs}, default=str)[:200000])
        sys.stdout.flush()
        if args.only_drivers:
            return
    _reexec_in_engine_env()

    from engine_adapter.host.engine import open_engine
    from fuzz.draw.seeds import load_seed_cases, seed_dir
    from fuzz.driving.drivers import random_cases
    from ground.home import kvspec_home

    engine = open_engine(f"vllm=={VERSION}", mode="inprocess")
    seeds = load_seed_cases(seed_dir(kvspec_home()))
    engine.run(seeds[0])  # warm: config construction is slow once

    print(
        f"# time to the first #53504-class finding on vllm=={VERSION} (median of {args.seeds} seeds; budget {args.budget:.0f}s)"
    )
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

    from fuzz.driving.campaign import Campaign
    from fuzz.driving.drivers import run_random

    with tempfile.TemporaryDirectory() as out:
        campaign = Campaign(engine, out, seed=1)
        run_random(campaign, 1, max_time=min(30.0, args.soak), synthetic=True)
        rss0 = _rss_mb()
        run_random(campaign, 2, max_time=args.soak, synthetic=True)
        rss1 = _rss_mb()
    print(
        f"# RSS: {rss0:.0f} MB after warm-up, {rss1:.0f} MB after {args.soak:.0f}s more ({campaign.stats.execs} execs); growth {100 * (rss1 - rss0) / rss0:+.1f}%"
    )


if __name__ == "__main__":
    main()
