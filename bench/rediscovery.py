"""Rediscovery: does a default campaign find every known class by itself?

Time to bug, as FuzzBench and Magma measure it. For each release that has
a known class (``fuzz.results.known_classes``: 0.29.0's #53504 resend; 0.33.0's
longer sibling, hashed longer sibling on Falcon-H1, stale state, resend
beside an internal checkpoint, dense below sparse; SGLang 0.5.23's grid
resend and sibling branch, ``--releases sglang==0.5.23``), each driver (the random
driver beside atheris, in the same run) and each of K seeds, one default
campaign runs exactly as a user runs it::

    kvspec fuzz --engine vllm==R --driver D --seed S --max-time B+STARTUP \\
                --out FRESH [--corpus EMPTY: atheris] --json

from an empty corpus and an empty findings folder: no ``examples/`` file
is a seed (the z3 boundary cases, derived from the proofs, are, as in
every default campaign). A finding is sorted into its class by
``fuzz.results.known_classes.classify`` (oracle, request kind, direction,
retention, hash unit, speculative mode: the rule it breaks); its time is
its file's modification time minus the moment the engine was ready (the
summary's ``ready_at``). A class counts as found in a seed when its first
finding came within the budget B (default 60 s) of the engine being ready.

Printed: a table (class x driver: seeds that found it, median and each
seed's time) and one JSON line. Nothing is asserted: targets live here, as
figures, never in timed tests. A campaign whose engine did not start within
its budget (no case ran: exit 3) is a failed campaign, not a seed that found
nothing; one whose start took longer than ``--startup`` had less than the
budget to fuzz (``--max-time`` includes the start): its line says ``cut``.
On a shared machine a worker's start-up can take 80-150 s (stop 47, load
5-8), so give ``--startup`` room there and say the figure is contended.

    python bench/rediscovery.py [--seeds 5] [--budget 60] [--drivers random,atheris]
                                [--releases 0.29.0,0.33.0] [--startup 40] [--parallel 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)  # bench/ must not shadow the packages

from fuzz.results.known_classes import KNOWN_CLASSES, classify  # noqa: E402


def run_campaign(release: str, driver: str, seed: int, budget: float, startup: float, work: Path) -> dict:
    """One default campaign from an empty corpus; its summary and, per
    known class, the seconds from the engine ready to its first finding."""
    out, corpus = work / "out", work / "corpus"
    corpus.mkdir(parents=True)
    engine = release if "==" in release else f"vllm=={release}"  # sglang==X names its family
    cmd = [
        sys.executable,
        "-m",
        "kvspec.cli",
        "fuzz",
        "--engine",
        engine,
        "--driver",
        driver,
        "--seed",
        str(seed),
        "--max-time",
        str(budget + startup),
        "--out",
        str(out),
        "--json",
    ] + (["--corpus", str(corpus)] if driver == "atheris" else [])
    began = time.time()
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget + startup + 120, env=dict(os.environ)
    )
    try:
        summary = json.loads(proc.stdout)
    except ValueError:
        return {
            "release": release,
            "driver": driver,
            "seed": seed,
            "error": f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}",
            "times": {},
        }
    if proc.returncode == 3 or not summary.get("cases"):
        # the engine did not start within the budget (kvspec's failure, or a
        # machine too busy for --startup): no seed of it, never "found nothing"
        return {
            "release": release,
            "driver": driver,
            "seed": seed,
            "error": f"exit {proc.returncode}: {summary.get('outcome') or 'no case ran'} (startup {summary.get('startup_s')} s)",
            "times": {},
        }
    ready = summary.get("ready_at") or began
    times: dict[str, float] = {}
    unclassified = 0
    for path in sorted(out.glob("*.json")):
        try:
            finding = json.loads(path.read_text())
        except ValueError:
            continue
        cls = classify(finding)
        if cls is None:
            unclassified += 1
            continue
        t = round(path.stat().st_mtime - ready, 1)
        times[cls] = min(times.get(cls, t), t)
    return {
        "release": release,
        "driver": driver,
        "seed": seed,
        "exit": proc.returncode,
        "times": times,
        "unclassified": unclassified,
        "cases": summary.get("cases"),
        "cases_per_s": summary.get("cases_per_s"),
        "startup_s": summary.get("startup_s"),
        # the seconds of fuzzing the campaign had once ready (--max-time includes the start):
        # below the budget where the start took longer than --startup (a busy machine)
        "window_s": round(budget + startup - float(summary.get("startup_s") or 0.0), 1),
        "harness_errors": summary.get("harness_errors"),
        "findings": len(list(out.glob("*.json"))),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument(
        "--budget", type=float, default=60.0, help="seconds from the engine ready within which a class counts as found"
    )
    ap.add_argument(
        "--startup",
        type=float,
        default=40.0,
        help="seconds the campaign gets on top of --budget for its engine's start",
    )
    ap.add_argument("--drivers", default="random,atheris")
    ap.add_argument("--releases", default=",".join(sorted({k.release for k in KNOWN_CLASSES})))
    ap.add_argument("--parallel", type=int, default=1, help="campaigns at once (default 1: each gets the machine)")
    args = ap.parse_args()
    drivers, releases = args.drivers.split(","), args.releases.split(",")
    jobs = [(r, d, s) for r in releases for s in range(1, args.seeds + 1) for d in drivers]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvspec-rediscovery-", dir=ROOT / ".kvspec") as tmp:

        def one(job):
            r, d, s = job
            work = Path(tmp) / f"{r}-{d}-{s}"
            result = run_campaign(r, d, s, args.budget, args.startup, work)
            print(
                f"  {r} {d} seed {s}: {result.get('error') or ', '.join(f'{k} {v}s' for k, v in sorted(result['times'].items())) or 'no known class'}"
                f" ({result.get('cases')} cases, {result.get('cases_per_s')} cases/s, {result.get('findings')} findings, {result.get('unclassified')} unclassified, harness errors {result.get('harness_errors')}"
                + (
                    f"; cut: {result['window_s']} s of fuzzing"
                    if result.get("window_s", args.budget) < args.budget
                    else ""
                )
                + ")",
                file=sys.stderr,
                flush=True,
            )
            return result

        Path(tmp).mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
            results = list(pool.map(one, jobs))
    table = {}
    print(
        f"\nrediscovery: {args.seeds} seeds, found = first finding of the class within {args.budget:.0f} s of the engine ready; {time.monotonic() - started:.0f} s in all"
    )
    print(f"{'class':<26} {'release':<14} " + " ".join(f"{d + ' found':>14} {d + ' median s':>16}" for d in drivers))
    for k in KNOWN_CLASSES:
        if k.release not in releases:
            continue
        row = {}
        cells = []
        for d in drivers:
            runs = [x for x in results if x["release"] == k.release and x["driver"] == d]
            times = [x["times"][k.id] for x in runs if k.id in x["times"] and x["times"][k.id] <= args.budget]
            row[d] = {
                "found": len(times),
                "of": len(runs),
                "times_s": [x["times"].get(k.id) for x in runs],
                "median_s": statistics.median(times) if times else None,
            }
            cells.append(
                f"{len(times):>8}/{len(runs):<5} {('-' if not times else f'{statistics.median(times):.1f}'):>16}"
            )
        table[k.id] = row
        print(f"{k.id:<26} {k.release:<14} " + " ".join(cells))
    errors = [x for x in results if "error" in x]
    speed = {
        d: statistics.median([x["cases_per_s"] for x in results if x["driver"] == d and x.get("cases_per_s")] or [0])
        for d in drivers
    }
    cut = [x for x in results if x.get("window_s", args.budget) < args.budget]
    print(
        "cases/s (median over campaigns): "
        + ", ".join(f"{d} {v}" for d, v in speed.items())
        + (f"; {len(errors)} campaign(s) failed" if errors else "")
        + (f"; {len(cut)} campaign(s) had under {args.budget:.0f} s of fuzzing (start past --startup)" if cut else "")
    )
    print(
        json.dumps(
            {
                "bench": "rediscovery",
                "seeds": args.seeds,
                "budget_s": args.budget,
                "classes": table,
                "cases_per_s": speed,
                "failed_campaigns": [x["error"] for x in errors],
                "cut_campaigns": [{"seed": x["seed"], "window_s": x["window_s"]} for x in cut],
            },
            separators=(",", ":"),
        )
    )


if __name__ == "__main__":
    main()
