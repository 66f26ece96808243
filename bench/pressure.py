"""A cache under pressure: what the drawn pools reach, and what they cost.

1. **Reach.** The first ``--cases`` drawn cases of ``random_cases(seed)``
   with ``--pressure always`` (every case pins its pool,
   ``fuzz.draw.generate_pressure``), run on the engine: per level, how many cases
   the engine accepted, how many evicted a cached block, how many preempted
   a request (and resumed it), and how many a resend of a prompt hit less
   than the same case on kvspec's pool (an eviction that changes a hit).
2. **Case rate.** ``kvspec fuzz --pressure drawn`` beside ``--pressure
   none`` (the cases of a campaign without the pool) on the same seed and
   budget, alternated over ``--rounds``: cases per second of fuzzing
   (start-up apart) and the ratio drawn/none (target >= 0.8).

Printed: a table and one JSON line. Nothing is asserted.

    python bench/pressure.py [--engine vllm==0.33.0] [--cases 40] [--seed 3]
                             [--budget 60] [--rounds 1] [--no-reach] [--no-rate] [--no-z3-seeds]
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)  # bench/ must not shadow the packages


def reach(engine_name: str, seed: int, cases: int) -> dict:
    from engine_adapter.host.engine import open_engine
    from fuzz.draw.generate_pressure import POOL_FLAG, strip_pool
    from fuzz.driving.campaign import Campaign
    from fuzz.driving.drivers import random_cases
    from reference.case import parse_case

    engine = open_engine(engine_name)
    try:
        with tempfile.TemporaryDirectory() as out:
            campaign = Campaign(engine, Path(out), seed=seed)
            rows: dict[str, dict] = {}
            for case in itertools.islice(random_cases(seed, resolver=campaign.resolver, pressure="always"), cases):
                args = list(case.deployment.vllm_args)
                if POOL_FLAG not in args:
                    level = "refused"
                else:
                    level = _level_of(case, campaign)
                row = rows.setdefault(level, {"cases": 0, "evicted": 0, "preempted": 0, "hit_lower": 0, "errors": 0})
                row["cases"] += 1
                if level == "refused":
                    continue
                obs = engine.run(case)
                if obs.get("error"):
                    row["errors"] += 1
                    continue
                explain = obs.get("explain") or []
                row["evicted"] += any(e.get("evicted") for e in explain)
                row["preempted"] += any(e.get("preempted_steps") for e in explain)
                plain = parse_case(
                    {
                        **_raw(case),
                        "deployment": {**_raw(case)["deployment"], "vllm_args": strip_pool(args)},
                    }
                )
                base = engine.run(plain)
                if not base.get("error"):
                    row["hit_lower"] += any(a < b for a, b in zip(obs.get("hits") or [], base.get("hits") or []))
            return rows
    finally:
        engine.close()


def _raw(case) -> dict:
    from reference.case import case_to_dict

    return case_to_dict(case)


def _level_of(case, campaign) -> str:
    """Which level the pinned pool is (recomputed from the case, as drawn)."""
    from fuzz.draw.generate_pressure import POOL_FLAG, Sizing, level_of, strip_pool

    args = list(case.deployment.vllm_args)
    pool = int(args[args.index(POOL_FLAG) + 1])
    info = campaign.resolver({**_raw(case)["deployment"], "vllm_args": strip_pool(args)}) or {}
    lengths = [r.num_prompt_tokens + r.max_tokens for r in case.trace]
    if not info.get("groups"):
        return "other"
    return level_of(pool, Sizing.of(lengths, info)) or "other"


def rate(engine_name: str, seed: int, budget: float, rounds: int, extra: tuple[str, ...] = ()) -> dict:
    out: dict[str, list[float]] = {"none": [], "drawn": []}
    for _ in range(rounds):
        for mode in ("none", "drawn"):
            with tempfile.TemporaryDirectory() as d:
                cmd = [sys.executable, "-m", "kvspec.cli", "fuzz", "--engine", engine_name, "--seed", str(seed)]
                cmd += ["--max-time", str(budget), "--pressure", mode, "--out", d, "--json", *extra]
                p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=budget + 600)
                summary = json.loads(p.stdout)
                if not summary.get("cases"):
                    print(f"{mode}: no case ran: {p.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                out[mode].append(float(summary["cases_per_s"]))
    none, drawn = sum(out["none"]) / rounds, sum(out["drawn"]) / rounds
    ratio = round(drawn / none, 3) if none else None
    return {"none_cases_per_s": out["none"], "drawn_cases_per_s": out["drawn"], "ratio": ratio}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="vllm==0.33.0")
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--no-reach", action="store_true")
    ap.add_argument("--no-rate", action="store_true")
    ap.add_argument("--no-z3-seeds", action="store_true", help="time the random driver's cases only")
    a = ap.parse_args()
    result: dict = {"engine": a.engine, "seed": a.seed}
    if not a.no_reach:
        rows = reach(a.engine, a.seed, a.cases)
        print(f"{'level':8} {'cases':>5} {'evicted':>7} {'preempted':>9} {'hit lower':>9} {'errors':>6}")
        for level, r in sorted(rows.items()):
            print(
                f"{level:8} {r['cases']:>5} {r['evicted']:>7} {r['preempted']:>9} {r['hit_lower']:>9} {r['errors']:>6}"
            )
        result["reach"] = rows
    if not a.no_rate:
        result["rate"] = rate(a.engine, a.seed, a.budget, a.rounds, ("--no-z3-seeds",) if a.no_z3_seeds else ())
        print(f"cases/s none {result['rate']['none_cases_per_s']} drawn {result['rate']['drawn_cases_per_s']}")
        print(f"ratio drawn/none: {result['rate']['ratio']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
