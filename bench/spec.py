"""spec/ timings (printed; no timed assertions).

* the unbounded proof (replay keeps the identical resend's state, every
  geometry with hits on S, no bounds): solver time min/median/max over 8
  seeds, build time beside it;
* the full concrete sweep (4,142 geometries, 150 rows: the hashed class of
  issue 9 added 1,210 and 30);
* ``pytest spec/`` (the default tier), wall time of a fresh process, with
  one worker per CPU (KVSPEC_JOBS = the CPUs) and in one process (the
  default, KVSPEC_JOBS=1, whose CPU time is then the whole work), alternated
  REPS times so that both see the same load: medians and their ratio;
* ``kvspec prove`` (the full catalogue plus its minimal counterexamples)
  and ``kvspec prove --all`` (also chunked prefill per rule and the chunked
  junction rows);
* with ``--slow``: ``pytest spec/ --slow`` (everything), once.

Targets (issues 4 and 10, on 2 cores): the unbounded proof <= 0.1 s, stable
over seeds; pytest spec/ <= 10 s; the full sweep <= 10 s. The load average
is printed with the numbers: on a shared machine wall times scale with it.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

# Run as a script, bench/ would be first on sys.path: put the repository root there.
ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)
REPS = 3


def unbounded(cls: str, seeds=range(8)) -> tuple[list[float], list[float], set[str]]:
    from spec.catalogue import Row
    from spec.solve import decide

    solve, build, verdicts = [], [], set()
    for seed in seeds:
        t0 = time.perf_counter()
        q = Row("R1", cls, "drop/0.30", "replay", "mask").build()
        t1 = time.perf_counter()
        out = decide(q.premises, q.claim, seed=seed)
        build.append(t1 - t0)
        solve.append(out.seconds)
        verdicts.add(out.verdict)
    return solve, build, verdicts


def fmt(xs: list[float]) -> str:
    return f"min {min(xs) * 1000:7.1f} ms  median {statistics.median(xs) * 1000:7.1f} ms  max {max(xs) * 1000:7.1f} ms"


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, float, int, str]:
    """Wall time, CPU time of the child (complete when it runs in one
    process: KVSPEC_JOBS=1), exit code, last line."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    tail = (p.stdout or p.stderr).strip().splitlines()[-1:] or [""]
    return wall, cpu, p.returncode, tail[0]


def main() -> None:
    print(
        f"cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.2f} (wall times scale with load on a shared machine)"
    )
    for cls in ("uniform", "aligned", "hybrid"):
        solve, build, verdicts = unbounded(cls)
        print(
            f"unbounded proof R1 replay drop/0.30 [{cls:7s}]  solve {fmt(solve)}   build {fmt(build)}   verdicts {sorted(verdicts)}"
        )

    from spec.geometry import sweep_geometries
    from spec.sweep import run_sweep

    t0 = time.perf_counter()
    cpu0 = time.process_time()
    results = run_sweep()
    wall = time.perf_counter() - t0
    print(
        f"full sweep: {len(results)} rows over {len(sweep_geometries())} geometries, {sum(r.ok for r in results)} as expected, {wall:.2f} s wall ({sum(r.seconds for r in results):.2f} s summed over workers)"
    )
    del cpu0

    python = sys.executable
    pytest = [python, "-m", "pytest", "spec", "-q", "-p", "no:cacheprovider"]
    pool, one, cpus, tails = [], [], [], set()
    for _ in range(REPS):
        wall, _, rc, tail = timed(pytest, {"KVSPEC_JOBS": str(min(os.cpu_count() or 1, 8))})
        pool.append(wall)
        tails.add(f"exit {rc}: {tail}")
        wall, cpu, rc, tail = timed(pytest, {"KVSPEC_JOBS": "1"})
        one.append(wall)
        cpus.append(cpu)
        tails.add(f"exit {rc}: {tail}")
    med = statistics.median
    print(
        f"pytest spec/ (default tier), {REPS} runs each, alternated: a pool of one worker per CPU median {med(pool):.2f} s wall (min {min(pool):.2f}, max {max(pool):.2f}); "
        f"one process (the default) median {med(one):.2f} s wall (min {min(one):.2f}, max {max(one):.2f}), {med(cpus):.2f} s CPU; pool / one process {med(pool) / med(one):.2f}; {sorted(tails)}"
    )
    wall, _, rc, tail = timed(
        [python, "-m", "kvspec.cli", "prove", "--out", str(ROOT / ".kvspec" / "bench-counterexamples")]
    )
    print(f"kvspec prove (full catalogue + minimal counterexamples): {wall:.2f} s wall, exit {rc}: {tail}")
    wall, _, rc, tail = timed(
        [python, "-m", "kvspec.cli", "prove", "--all", "--out", str(ROOT / ".kvspec" / "bench-counterexamples")]
    )
    print(
        f"kvspec prove --all (also chunked prefill per rule and the chunked junction rows): {wall:.2f} s wall, exit {rc}: {tail}"
    )
    if "--slow" in sys.argv[1:]:
        wall, _, rc, tail = timed([*pytest, "--slow"])
        print(f"pytest spec/ --slow (everything): {wall:.2f} s wall, exit {rc}: {tail}")
    print(f"load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
