"""SGLang's off-grid draws and the power they leave (issue 42 item 5):
runs to the first finding of each known SGLang class, per seed, with the
off-grid draws (``fuzz.draw.generate_sglang.OFF_GRID_ODDS``, one in four) and
without them (on the grid only, as in stop 37), on one warm worker.

Each campaign is the test's (``tests/engine/test_sglang.py::
test_a_campaign_finds_both_sglang_classes_by_itself``): ``Campaign`` with
the tree-core twin, seeded random cases on deployments SGLang resolves,
bounded by engine runs, not time, so a loaded machine changes the seconds
and not the runs. Printed: one JSON line per campaign (the run and the
second of each class's first finding), nothing asserted.

    python bench/sglang_draws.py [--seeds 1,2,3] [--max-execs 450] [--odds 4,0] [--decode-odds 8,0]

``--odds 0``: no off-grid draw (the side stream never moves a value).
``--decode-odds 0``: no decode case and no speculative deployment
(``DECODE_ODDS`` and ``SPEC_ODDS``, stop 47); each value is run with
each ``--odds``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)  # bench/ must not shadow the packages

VERSION = "sglang==0.5.23"
#: Odds so long that no draw moves off the grid.
NEVER = 10**12


def campaign(engine, seed: int, odds: int, max_execs: int, decode_odds: int = 8) -> dict:
    """One campaign; per class, the engine run and second of its first finding."""
    import fuzz.draw.generate_sglang as gs
    from engine_adapter.host.versions import family_of
    from fuzz.driving.campaign import Campaign
    from fuzz.driving.drivers import BoundedEngine, TreeCoreTwin, random_cases
    from fuzz.results.known_classes import classify

    gs.OFF_GRID_ODDS = odds or NEVER
    gs.DECODE_ODDS = gs.SPEC_ODDS = decode_odds or NEVER
    bounded = BoundedEngine(engine, time.monotonic() + 3600)
    c = Campaign(
        bounded, Path(tempfile.mkdtemp(prefix=f"sglang-draws-{odds}-{seed}-")), other=TreeCoreTwin(bounded), seed=seed
    )
    cases = iter(random_cases(seed, family_of(VERSION), resolver=c.resolver))
    t0, seen, first = time.monotonic(), 0, {}
    while c.stats.execs < max_execs:
        c.check(next(cases))
        for p in c.stats.findings[seen:]:
            k = classify(json.loads(Path(p).read_text()))
            first.setdefault(k, {"run": c.stats.execs, "s": round(time.monotonic() - t0, 1)})
        seen = len(c.stats.findings)
    return {
        "seed": seed,
        "off_grid_odds": odds,
        "decode_odds": decode_odds,
        "runs": c.stats.execs,
        "harness_errors": c.stats.harness_errors,
        "s": round(time.monotonic() - t0, 1),
        "first": first,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--max-execs", type=int, default=450)
    ap.add_argument("--odds", default="4,0", help="OFF_GRID_ODDS values to compare (0: on the grid only)")
    ap.add_argument("--decode-odds", default="8", help="DECODE_ODDS and SPEC_ODDS values to compare (0: none)")
    args = ap.parse_args(argv)
    from engine_adapter.host.engine import WorkerEngine

    engine = WorkerEngine(VERSION, start_timeout=1200.0)
    t = time.monotonic()
    engine.start()
    print(json.dumps({"engine_start_s": round(time.monotonic() - t, 1)}), flush=True)
    try:
        for decode in (int(x) for x in args.decode_odds.split(",")):
            for odds in (int(x) for x in args.odds.split(",")):
                for seed in (int(x) for x in args.seeds.split(",")):
                    print(json.dumps(campaign(engine, seed, odds, args.max_execs, decode)), flush=True)
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
