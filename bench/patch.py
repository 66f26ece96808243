"""bench/patch.py: what a patch to vLLM costs and changes, release vs patched build, side by side.

    python bench/patch.py --patch fixes/A.diff [--patch fixes/B.diff] [--engine vllm==0.33.0] [--cases 100] [--seed 1] [--rounds 3] [--json OUT]

On the same cases (the proofs' boundary cases mapped onto deployments, then
``--cases`` seeded random deployment cases, each resolved by vLLM), run on
the release and on its patched build (``engine_adapter.host.builds``), one worker
each:

* **hits**, request by request: how many requests the build hits fewer
  tokens on than the release (a fix must never take a hit away), the same,
  more;
* **Mamba states kept per prompt**: the states of a prompt the block pool
  holds once it finished (the engines' explain ``retained_mamba_blocks``),
  build minus release, per request: the distribution (a fix that keeps one
  more boundary keeps at most one more state);
* **scheduler time** (no timed assertion): the CPU seconds each worker spends
  serving the traces (``timing.total_cpu_s - setup_cpu_s``: vLLM's
  scheduler, KV-cache manager and the adapter's bookkeeping, without the
  block-pool scan), summed over the cases, per round; the two engines
  alternate which runs a case first; the ratio build / release per round,
  and its median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _states(explain: dict) -> int | None:
    kept = explain.get("retained_mamba_blocks")
    if not isinstance(kept, dict) or not kept:
        return None
    return max(len(v) for v in kept.values())  # one Mamba block size per deployment


def _trace_cpu(obs: dict) -> float:
    t = obs.get("timing") or {}
    return float(t.get("total_cpu_s", 0.0)) - float(t.get("setup_cpu_s", 0.0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/patch.py")
    parser.add_argument("--engine", default="vllm==0.33.0")
    parser.add_argument("--patch", action="append", required=True)
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from engine_adapter import open_engine
    from engine_adapter.host.builds import prepare
    from fuzz.draw.seeds import load_seed_cases, on_deployments, seed_dir
    from fuzz.driving.campaign import Campaign, harness_error_of
    from fuzz.driving.drivers import random_cases
    from ground.home import kvspec_home

    release = args.engine
    build = prepare(release, args.patch)
    t0 = time.monotonic()
    a, b = open_engine(release, mode="worker"), open_engine(build, mode="worker")
    try:
        a.start(), b.start()
        print(f"engines: {release} vs {build} (started in {time.monotonic() - t0:.0f}s)", file=sys.stderr, flush=True)
        resolver = Campaign(a, tempfile.mkdtemp(prefix="bench-patch-", dir=kvspec_home())).resolver
        seeds = on_deployments([c for c in load_seed_cases(seed_dir(kvspec_home())) if c.deployment is None], resolver)
        gen = random_cases(args.seed, resolver=resolver)
        cases = seeds + [next(gen) for _ in range(args.cases)]
        print(
            f"cases: {len(seeds)} boundary cases on deployments + {args.cases} random deployment cases",
            file=sys.stderr,
            flush=True,
        )

        kept, hits = [], Counter()
        states = Counter()
        errors = 0
        runnable = []
        for i, case in enumerate(cases):
            pair = (a, b) if i % 2 == 0 else (b, a)
            obs = {e.engine: e.run(case, {"retained": True}) for e in pair}
            oa, ob = obs[a.engine], obs[b.engine]
            if harness_error_of(oa) or harness_error_of(ob) or "error" in oa or "error" in ob:
                errors += 1
                continue
            runnable.append(case)
            for j, (ha, hb) in enumerate(zip(oa["hits"], ob["hits"])):
                hits["fewer" if hb < ha else "more" if hb > ha else "equal"] += 1
                if hb < ha:
                    kept.append({"case": i, "request": j, "release": ha, "build": hb})
                sa, sb = _states(oa["explain"][j]), _states(ob["explain"][j])
                if sa is not None and sb is not None:
                    states[sb - sa] += 1
        print(
            f"hits per request, build vs release: {dict(hits)}; Mamba states per prompt, build minus release: {dict(sorted(states.items()))}",
            file=sys.stderr,
            flush=True,
        )

        rounds = []
        for r in range(args.rounds):
            cpu = {a.engine: 0.0, b.engine: 0.0}
            for i, case in enumerate(runnable):
                pair = (a, b) if (i + r) % 2 == 0 else (b, a)
                for e in pair:
                    cpu[e.engine] += _trace_cpu(e.run(case, {"retained": False}))
            rounds.append(
                {
                    "release_cpu_s": round(cpu[a.engine], 3),
                    "build_cpu_s": round(cpu[b.engine], 3),
                    "ratio": round(cpu[b.engine] / max(cpu[a.engine], 1e-9), 4),
                }
            )
            print(
                f"round {r + 1}: scheduler CPU s release {cpu[a.engine]:.2f}, build {cpu[b.engine]:.2f}, ratio {rounds[-1]['ratio']}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        a.close(), b.close()
    result = {
        "release": release,
        "build": build,
        "cases": len(cases),
        "runnable": len(runnable),
        "errors_or_harness": errors,
        "requests": sum(hits.values()),
        "hits": dict(hits),
        "fewer_hits_examples": kept[:10],
        "mamba_states_build_minus_release": {str(k): v for k, v in sorted(states.items())},
        "rounds": rounds,
        "ratio_median": statistics.median(x["ratio"] for x in rounds) if rounds else None,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        from ground.files import write_json_atomic

        write_json_atomic(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
