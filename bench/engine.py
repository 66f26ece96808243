"""bench/engine.py: what the engine adapter costs, on the real vLLM scheduler.

    python bench/engine.py [--engine vllm==0.33.0] [--repeats 5] [--cold-cache]

Prints (no timed assertions):

* requests/s through kvspec's adapter (``VllmDriver.run``: wrapped methods,
  explain records, block-pool scan) vs a bare loop over the same vLLM calls
  (``engine_adapter.baseline``) in the same process, on the seed case and on
  a 50-request mixed trace; the ratio is the adapter's overhead;
* requests/s through the worker (JSON over a pipe) on the same traces;
* case setup: cold (first case of a fresh process; with ``--cold-cache``
  also with an empty ``VLLM_CACHE_ROOT``, i.e. vLLM's model inspection in a
  subprocess) vs warm (every later case).

The in-process part runs inside the engine's own environment (this script
re-executes itself there with ``--inner``); the environment is installed
first if missing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def seed_case() -> dict:
    return json.loads((ROOT / "examples" / "seed-53504.json").read_text())


def mixed_case(n: int = 50) -> dict:
    """50 requests over a few shared prefixes: resends, extensions, siblings."""
    import random

    rng = random.Random(7)
    trace = []
    for i in range(n):
        base = rng.choice(["A", "B", "C"])
        kind = rng.random()
        if kind < 0.4:
            prompt = [{"segment": base, "length": rng.choice([1000, 2000, 3000])}]
        elif kind < 0.7:
            prompt = [{"segment": base, "length": rng.randrange(500, 4000)}]
        else:
            prompt = [{"segment": base, "length": rng.randrange(200, 2000)}, {"segment": f"S{i}", "length": rng.randrange(16, 800)}]
        trace.append({"prompt": prompt})
    return {
        "schema": 1,
        "name": "mixed-50",
        "geometry": {"groups": [{"kind": "full_attention", "block_size": 32}, {"kind": "mamba", "block_size": 64, "count": 3}], "hash_block_size": 16, "prefix_match_unit": 16, "retention_interval": 0, "max_num_batched_tokens": 2048},
        "speculative": {"method": "mtp", "num_speculative_tokens": 2, "disable_lookahead_block_hashes": True},
        "trace": trace,
    }


CASES = {"seed (3 req)": seed_case, "mixed (50 req)": mixed_case}


def inner(repeats: int) -> dict:
    """Runs inside the engine environment: in-process measurements."""
    t0 = time.perf_counter()
    from engine_adapter.baseline import bare_run
    from engine_adapter.driver import get_driver
    from reference.case import parse_case

    import_s = time.perf_counter() - t0
    driver = get_driver()
    out: dict = {"vllm_version": driver.version, "import_s": import_s, "cases": {}}
    first = None
    for name, make in CASES.items():
        case = parse_case(make())
        n = len(case.trace)
        adapter_rps, bare_rps, setups = [], [], []
        for r in range(repeats):
            res = driver.run(case)
            assert "error" not in res, res["error"]
            if first is None:
                first = res["timing"]["setup_s"]
            else:
                setups.append(res["timing"]["setup_s"])
            adapter_rps.append(n / (res["timing"]["total_s"] - res["timing"]["setup_s"]))
            hits, setup_s, loop_s = bare_run(driver, case)
            assert hits == res["hits"], (hits, res["hits"])
            setups.append(setup_s)
            bare_rps.append(n / loop_s)
        out["cases"][name] = {
            "requests": n,
            "adapter_rps": statistics.median(adapter_rps),
            "bare_rps": statistics.median(bare_rps),
            "warm_setup_s": statistics.median(setups),
        }
    out["first_setup_s"] = first
    return out


def outer(args) -> int:
    from engine_adapter import environments
    from engine_adapter.engine import WorkerEngine
    from engine_adapter.versions import parse_engine

    version = parse_engine(args.engine)
    if not environments.is_ready(version):
        environments.install(version)
    py = str(environments.env_python(version))
    env = environments.worker_env(version)
    results = {}
    runs = [("warm disk cache", env)]
    tmp = None
    if args.cold_cache:
        # a fresh KVSPEC_HOME: its cache/vllm-X (VLLM_CACHE_ROOT) is empty
        tmp = tempfile.mkdtemp(prefix="bench-cold-", dir=environments.kvspec_home())
        runs.append(("empty VLLM_CACHE_ROOT", dict(env, KVSPEC_HOME=tmp)))
    for label, e in runs:
        t = time.perf_counter()
        proc = subprocess.run([py, __file__, "--inner", "--repeats", str(args.repeats)], env=e, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        results[label] = json.loads(proc.stdout.strip().splitlines()[-1])
        results[label]["process_s"] = time.perf_counter() - t
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)

    worker = {}
    with WorkerEngine(version) as engine:
        t = time.perf_counter()
        engine.start()
        worker["start_s"] = time.perf_counter() - t
        for name, make in CASES.items():
            case = make()
            rps = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                res = engine.run(case)
                wall = time.perf_counter() - t
                rps.append(len(case["trace"]) / (wall - res["timing"]["setup_s"]))
            worker[name] = statistics.median(rps)

    from rich.console import Console
    from rich.table import Table

    console = Console()
    warm = results["warm disk cache"]
    table = Table(title=f"engine adapter vs bare vLLM loop (vllm=={warm['vllm_version']}, median of {args.repeats})")
    for col in ("trace", "bare loop req/s", "adapter req/s", "adapter/bare", "worker req/s", "warm setup"):
        table.add_column(col, justify="right")
    for name, c in warm["cases"].items():
        table.add_row(name, f"{c['bare_rps']:.1f}", f"{c['adapter_rps']:.1f}", f"{c['adapter_rps'] / c['bare_rps']:.2f}", f"{worker[name]:.1f}", f"{c['warm_setup_s'] * 1000:.1f} ms")
    console.print(table)
    setup = Table(title="case setup: cold vs warm")
    for col in ("process", "import vLLM", "first case setup (cold)", "later case setup (warm)"):
        setup.add_column(col, justify="right")
    for label, r in results.items():
        warm_setup = statistics.median(c["warm_setup_s"] for c in r["cases"].values())
        setup.add_row(label, f"{r['import_s']:.1f} s", f"{r['first_setup_s']:.2f} s", f"{warm_setup * 1000:.1f} ms")
    setup.add_row("worker start (import + hello)", f"{worker['start_s']:.1f} s", "", "")
    console.print(setup)
    print(json.dumps({"inprocess": results, "worker": worker}, indent=None))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="vllm==0.33.0")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cold-cache", action="store_true", help="also measure with an empty VLLM_CACHE_ROOT (adds ~20-60 s)")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        out = sys.stdout
        sys.stdout = sys.stderr  # vLLM's logs must not mix with the JSON line
        result = inner(args.repeats)
        out.write(json.dumps(result) + "\n")
        return 0
    return outer(args)


if __name__ == "__main__":
    sys.exit(main())
