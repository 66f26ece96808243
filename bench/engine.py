"""bench/engine.py: what the engine adapter costs, and what a warm engine saves, on the real vLLM scheduler.

    python bench/engine.py [--engine vllm==0.33.0] [--other vllm==0.29.0] [--repeats 9] [--rounds 2] [--cold-cache] [--no-commands]

Prints (no timed assertions; every figure is a ratio of two things measured
side by side in this one run, alternating, medians):

* **adapter vs bare loop**: requests/s through kvspec's adapter
  (``VllmDriver.run``: wrapped methods, explain records, block-pool scan)
  vs a bare loop over the same vLLM calls (``engine_adapter.vllm_engine.baseline``),
  in the same process, alternating which goes first, on the seed case and
  on a 50-request mixed trace; in CPU seconds of this process (the figure
  to read on a shared machine) and in wall seconds; also the adapter with
  ``retained=false`` (no block-pool scan), as a campaign may run it;
* **warm vs cold commands**: wall seconds of ``kvspec run``, ``replay
  --engine``, ``resolve`` and ``matrix`` (two engines) on a small case,
  each as a user runs it: with ``KVSPEC_WARM=0`` (cold: a worker of the
  command's own, vLLM imported every time) and on warm engines (after a
  first call started them), alternated over ``--rounds`` rounds;
  a warm call that found its engine gone (another session's edit to
  kvspec's sources makes a warm engine stale, and the next call starts a
  fresh one) is shown apart, not counted as warm;
* requests/s through a pipe worker (JSON over a pipe) on the same traces;
* the import of vLLM and a case's setup in a warm process (with
  ``--cold-cache`` also with an empty ``VLLM_CACHE_ROOT``).

The in-process part runs inside the engine's own environment (this script
re-executes itself there with ``--inner``); the environment is installed
first if missing. The warm engines live in a folder of this run under
kvspec's home and are stopped at its end.
"""

from __future__ import annotations

import argparse
import json
import os
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
            prompt = [
                {"segment": base, "length": rng.randrange(200, 2000)},
                {"segment": f"S{i}", "length": rng.randrange(16, 800)},
            ]
        trace.append({"prompt": prompt})
    return {
        "schema": 1,
        "name": "mixed-50",
        "geometry": {
            "groups": [{"kind": "full_attention", "block_size": 32}, {"kind": "mamba", "block_size": 64, "count": 3}],
            "hash_block_size": 16,
            "prefix_match_unit": 16,
            "retention_interval": 0,
            "max_num_batched_tokens": 2048,
        },
        "speculative": {"method": "mtp", "num_speculative_tokens": 2, "disable_lookahead_block_hashes": True},
        "trace": trace,
    }


#: name -> (case, repeats multiplier: the seed case is short, so it runs more often)
CASES = {"seed (3 req)": (seed_case, 5), "mixed (50 req)": (mixed_case, 1)}


def inner(repeats: int) -> dict:
    """Runs inside the engine environment: in-process measurements. Each
    repeat runs the adapter, the bare loop and the lean adapter, in an order
    that rotates, so that none always runs first."""
    t0 = time.perf_counter()
    from engine_adapter.vllm_engine.baseline import bare_run
    from engine_adapter.vllm_engine.driver import get_driver
    from reference.case import parse_case

    import_s = time.perf_counter() - t0
    driver = get_driver()
    from engine_adapter.inside.handler import settle

    settle()  # as the worker does after vLLM's import
    out: dict = {"vllm_version": driver.version, "import_s": import_s, "cases": {}}
    for name, (make, times) in CASES.items():
        case = parse_case(make())
        n = len(case.trace)
        m: dict[str, list[float]] = {
            k: [] for k in ("adapter_cpu", "adapter_wall", "bare_cpu", "bare_wall", "lean_cpu", "lean_wall", "setup")
        }
        driver.run(case)  # warm: the first build of a geometry is slower
        bare_run(driver, case)

        def adapter(options: dict, key: str) -> dict:
            res = driver.run(case, options)
            assert "error" not in res, res["error"]
            t = res["timing"]
            m[f"{key}_cpu"].append(t["total_cpu_s"] - t["setup_cpu_s"])
            m[f"{key}_wall"].append(t["total_s"] - t["setup_s"])
            m["setup"].append(t["setup_s"])
            return res

        def bare() -> list[int]:
            hits, setup_s, loop_s, loop_cpu = bare_run(driver, case)
            m["bare_cpu"].append(loop_cpu)
            m["bare_wall"].append(loop_s)
            m["setup"].append(setup_s)
            return hits

        steps = [lambda: adapter({}, "adapter"), bare, lambda: adapter({"retained": False}, "lean")]
        hits = None
        for r in range(repeats * times):
            for j in range(3):
                got = steps[(r + j) % 3]()
                got = got["hits"] if isinstance(got, dict) else got
                assert hits is None or got == hits, (got, hits)
                hits = got
        med = {k: statistics.median(v) for k, v in m.items()}
        out["cases"][name] = {
            "requests": n,
            "runs": repeats * times,
            **{k: med[k] for k in med},
            "adapter_rps": n / med["adapter_wall"],
            "bare_rps": n / med["bare_wall"],
        }
    return out


def _kvspec(argv: list[str], env: dict) -> tuple[float, int, str]:
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "kvspec.cli", *argv], capture_output=True, text=True, cwd=ROOT, env=env, timeout=900
    )
    return time.perf_counter() - t, proc.returncode, proc.stderr[-500:]


def commands(version: str, other: str, rounds: int) -> dict:
    """Wall seconds of each command, cold (KVSPEC_WARM=0) vs warm, alternated."""
    from engine_adapter.host import warm
    from ground.home import kvspec_home

    seed = str(ROOT / "examples" / "seed-53504.json")
    deployment = str(ROOT / "examples" / "seed-53504-deployment.json")
    folder = kvspec_home() / f"warm-bench-{os.getpid()}"
    plan = {
        "kvspec run (3 req)": ["run", seed, "--engine", f"vllm=={version}"],
        "kvspec replay --engine (3 req)": ["replay", seed, "--engine", f"vllm=={version}"],
        "kvspec resolve (deployment)": ["resolve", deployment, "--engine", f"vllm=={version}"],
        "kvspec matrix (1 case x 2 engines)": [
            "matrix",
            seed,
            "--engine",
            f"vllm=={other}",
            "--engine",
            f"vllm=={version}",
        ],
    }
    base = dict(os.environ, KVSPEC_WARM_DIR=str(folder), KVSPEC_WARM_IDLE_S="900")
    cold_env, warm_env = dict(base, KVSPEC_WARM="0"), dict(base, KVSPEC_WARM="1")
    out: dict = {name: {"cold_s": [], "warm_s": [], "warm_restarted_s": [], "exit": []} for name in plan}

    def servers() -> set:
        return {(w["engine"], w["platform"], w["pid"]) for w in warm.list_warm(folder)}

    try:
        t = time.perf_counter()
        for argv in plan.values():  # the first call starts the warm engines
            _kvspec(argv, warm_env)
        out["_first_calls_s"] = time.perf_counter() - t
        for r in range(rounds):
            for name, argv in plan.items():
                order = [("cold_s", cold_env), ("warm_s", warm_env)]
                for key, env in order if r % 2 == 0 else order[::-1]:
                    before = servers()
                    s, rc, err = _kvspec(argv, env)
                    if key == "warm_s" and not servers() <= before:
                        # a warm engine was (re)started: kvspec's sources
                        # changed under the bench (another edit), not a warm answer
                        key = "warm_restarted_s"
                    out[name][key].append(s)
                    out[name]["exit"].append(rc)
                    if rc not in (0, 1):
                        print(f"{name} ({key}): exit {rc}: {err}", file=sys.stderr)
    finally:
        warm.stop(directory=folder)
        shutil.rmtree(folder, ignore_errors=True)
    return out


def outer(args) -> int:
    from engine_adapter.host import environments
    from engine_adapter.host.engine import WorkerEngine
    from engine_adapter.host.versions import parse_engine

    version, other = parse_engine(args.engine), parse_engine(args.other)
    for v in (version, other):
        if not environments.is_ready(v):
            environments.install(v)
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
        proc = subprocess.run(
            [py, __file__, "--inner", "--repeats", str(args.repeats)], env=e, capture_output=True, text=True, cwd=ROOT
        )
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        results[label] = json.loads(proc.stdout.strip().splitlines()[-1])
        results[label]["process_s"] = time.perf_counter() - t
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)

    worker: dict = {}
    with WorkerEngine(version) as engine:
        t = time.perf_counter()
        engine.start()
        worker["start_s"] = time.perf_counter() - t
        for name, (make, _) in CASES.items():
            case = make()
            rps = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                res = engine.run(case)
                wall = time.perf_counter() - t
                rps.append(len(case["trace"]) / (wall - res["timing"]["setup_s"]))
            worker[name] = statistics.median(rps)
    cmds = commands(version, other, args.rounds) if not args.no_commands else None

    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(120, Console().width))
    warm = results["warm disk cache"]
    table = Table(
        title=f"engine adapter vs bare vLLM loop (vllm=={warm['vllm_version']}, same process, alternated; medians)"
    )
    for col in (
        "trace",
        "runs",
        "bare ms CPU",
        "adapter ms CPU",
        "adapter/bare CPU",
        "adapter/bare wall",
        "lean/bare CPU",
        "bare req/s",
        "adapter req/s",
        "worker req/s",
        "warm setup",
    ):
        table.add_column(col, justify="right")
    for name, c in warm["cases"].items():
        table.add_row(
            name,
            str(c["runs"]),
            f"{c['bare_cpu'] * 1000:.2f}",
            f"{c['adapter_cpu'] * 1000:.2f}",
            f"{c['bare_cpu'] / c['adapter_cpu']:.3f}",
            f"{c['bare_wall'] / c['adapter_wall']:.3f}",
            f"{c['bare_cpu'] / c['lean_cpu']:.3f}",
            f"{c['bare_rps']:.1f}",
            f"{c['adapter_rps']:.1f}",
            f"{worker[name]:.1f}",
            f"{c['setup'] * 1000:.1f} ms",
        )
    console.print(table)
    if cmds is not None:
        t2 = Table(
            title=f"commands on a small case: cold (KVSPEC_WARM=0) vs warm engines (medians of {args.rounds} alternated rounds; first calls, which started the warm engines: {cmds['_first_calls_s']:.1f} s)"
        )
        for col in ("command", "cold s", "warm s", "cold/warm", "warm <= 2 s", "warm calls that (re)started an engine"):
            t2.add_column(col, justify="right")
        for name, c in cmds.items():
            if name.startswith("_"):
                continue
            cold_s = statistics.median(c["cold_s"])
            warm_s = statistics.median(c["warm_s"]) if c["warm_s"] else float("nan")
            t2.add_row(
                name,
                f"{cold_s:.2f}",
                f"{warm_s:.2f}",
                f"{cold_s / warm_s:.1f}x",
                "yes" if warm_s <= 2.0 else "NO",
                ", ".join(f"{x:.1f} s" for x in c["warm_restarted_s"]) or "-",
            )
        console.print(t2)
    setup = Table(title="case setup: cold vs warm")
    for col in ("process", "import vLLM", "later case setup (warm)"):
        setup.add_column(col, justify="right")
    for label, r in results.items():
        warm_setup = statistics.median(c["setup"] for c in r["cases"].values())
        setup.add_row(label, f"{r['import_s']:.1f} s", f"{warm_setup * 1000:.1f} ms")
    setup.add_row("pipe worker start (import + hello)", f"{worker['start_s']:.1f} s", "")
    console.print(setup)
    print(json.dumps({"inprocess": results, "worker": worker, "commands": cmds}, indent=None))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="vllm==0.33.0")
    parser.add_argument(
        "--other", default="vllm==0.29.0", help="the second engine of the matrix command (default: %(default)s)"
    )
    parser.add_argument(
        "--repeats", type=int, default=9, help="in-process repeats per trace (the seed case runs 5x as often)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="cold/warm rounds per command (each cold call imports vLLM: ~30 s)"
    )
    parser.add_argument("--no-commands", action="store_true", help="skip the warm vs cold commands")
    parser.add_argument(
        "--cold-cache", action="store_true", help="also measure with an empty VLLM_CACHE_ROOT (adds ~20-60 s)"
    )
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
