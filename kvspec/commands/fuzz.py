"""kvspec fuzz --engine vllm==X [--engine vllm==Y] [--max-time S] [--seed N] ..."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from reference.errors import invalid

HELP = "differential fuzzing of a vLLM engine against the reference model"
DRIVERS = ("atheris", "hypothesis", "random")


def configure(parser) -> None:
    parser.add_argument("--engine", action="append", default=None, help="engine under test (vllm==X); a second --engine adds the version-vs-version oracle (default: vllm==0.33.0)")
    parser.add_argument("--max-time", type=float, default=60.0, help="seconds (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default: %(default)s)")
    parser.add_argument("--out", default=None, help="findings folder (default: $KVSPEC_HOME/findings)")
    parser.add_argument("--corpus", default=None, help="corpus folder to resume from and grow (atheris; default: $KVSPEC_HOME/corpus/<engine>)")
    parser.add_argument("--jobs", type=int, default=1, help="parallel atheris workers (default: %(default)s)")
    parser.add_argument("--driver", choices=DRIVERS, default="atheris", help="search driver (default: %(default)s)")
    parser.add_argument("--no-z3-seeds", action="store_true", help="do not seed the corpus with spec/'s boundary cases")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("libfuzzer", nargs="*", help="after --: flags passed to libFuzzer")


def main(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from engine_adapter.home import kvspec_home
    from engine_adapter.versions import DEFAULT_ENGINE, engine_name, parse_engine

    engines = [engine_name(parse_engine(e, "--engine")) for e in (args.engine or [DEFAULT_ENGINE])]
    if len(engines) > 2:
        raise invalid("--engine", engines, "give one engine under test and at most one more to compare with")
    if args.max_time <= 0:
        raise invalid("--max-time", args.max_time, "must be a positive number of seconds")
    if args.jobs < 1:
        raise invalid("--jobs", args.jobs, "must be at least 1")
    home = kvspec_home()
    out = Path(args.out) if args.out else home / "findings"
    console = Console(stderr=True)
    from fuzz.seeds import load_seed_cases
    from fuzz.seeds import seed_dir as z3_seed_dir

    seed_dir = None if args.no_z3_seeds else z3_seed_dir(home)
    if args.driver == "atheris":
        from fuzz.atheris_runner import run_atheris

        corpus = Path(args.corpus) if args.corpus else home / "corpus" / engines[0].replace("==", "-")
        summary = run_atheris(engines[0], out=out, corpus=corpus, seed_dir=seed_dir, seed=args.seed, max_time=args.max_time, jobs=args.jobs, other=engines[1] if len(engines) > 1 else None, libfuzzer_args=args.libfuzzer, console=console if sys.stderr.isatty() else None)
    else:
        summary = _run_in_process(args, engines, out, load_seed_cases(seed_dir) if seed_dir else [])
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        table = Table(title=f"kvspec fuzz: {engines[0]}" + (f" vs {engines[1]}" if len(engines) > 1 else ""))
        for col in ("driver", "execs", "exec/s", "coverage", "unsupported", "findings", "first finding (s)"):
            table.add_column(col, justify="right")
        table.add_row(args.driver, str(summary["execs"]), str(summary["exec_per_s"]), str(summary.get("coverage", "-")), str(summary["unsupported"]), str(len(summary["findings"])), "-" if summary["first_finding_s"] is None else f"{summary['first_finding_s']:.2f}")
        Console().print(table)
        for f in summary["findings"]:
            print(f"  {f['path']}\n    {f['summary']}")
        if summary.get("harness_errors"):
            print(f"  {summary['harness_errors']} harness error(s) recorded under {out / 'harness-errors'}")
    return 0


def _run_in_process(args, engines, out, seeds) -> dict:
    import time

    from engine_adapter import open_engine

    from fuzz.campaign import Campaign
    from fuzz.drivers import run_cases, run_hypothesis, run_random

    engine = open_engine(engines[0])
    other = open_engine(engines[1]) if len(engines) > 1 else None
    start = time.monotonic()
    campaign = Campaign(engine, out, other=other, seed=args.seed)
    run_cases(campaign, seeds, max_time=args.max_time)
    left = max(0.0, args.max_time - (time.monotonic() - start))
    if args.driver == "hypothesis":
        run_hypothesis(campaign, args.seed, max_time=left)
    else:
        run_random(campaign, args.seed, max_time=left)
    s = campaign.stats
    findings = []
    for path in s.findings:
        data = json.loads(Path(path).read_text())
        findings.append({"path": path, "summary": data["summary"]})
    return {"engine": engines[0], "execs": s.execs, "exec_per_s": round(s.execs / max(s.elapsed, 1e-9), 1), "unsupported": s.unsupported, "findings": findings, "first_finding_s": s.first_finding_s, "elapsed_s": round(s.elapsed, 2)}
