"""kvspec fuzz --engine vllm==X [--engine vllm==Y] [--max-time S] [--seed N] ...

Accounting that never gives a false all-clear:

* every option is checked before any work (a build, the z3 seeds, an
  engine): ``--out`` and ``--corpus`` must be folders kvspec can write into
  (``kvspec.options.output_dir``), ``--jobs`` at most ``JOBS_PER_CORE`` per
  core of this machine (``MAX_CLUSTER_JOBS`` on a Ray cluster joined),
  ``--max-time`` a finite duration; a bad one is one line, exit 2;
* ``--max-time`` bounds every driver, start-up included: the engine's worker
  is started once within it and not again if it cannot start; nothing is
  started past it (``fuzz.driving.drivers.BoundedEngine``);
* every ``--case`` file is run first and accounted for (given, run, cut at
  the deadline, a harness error, not started); one not run to completion
  makes the exit 3, naming it, unless a finding was written (exit 1).
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fuzz.judge.oracle_registry import build_sentence, help_text
from ground.console import say as _say
from ground.engines import Capability
from ground.errors import invalid
from kvspec.epilog import set_epilog
from kvspec.switches import add_switches

if TYPE_CHECKING:
    from ground.engines import EngineSpec
    from kvspec.engine_options import EngineOption

HELP = "differential fuzzing of a vLLM engine against the reference model"
DRIVERS = ("atheris", "hypothesis", "random", "cases")
EPILOG = (
    """\
exit codes:
  0  the campaign ran and wrote no finding
  1  the campaign wrote at least one finding this run; a divergence already
     on file in --out is not reported again and does not count (use a fresh
     --out to count everything)
  2  usage: a bad option or input (one line naming it)
  3  the harness failed, so the verdict cannot be trusted: no execution at
     all, a fuzzing worker died, the engine environment is missing or
     unusable, or harness errors above --harness-error-limit (and at least
     3), or the disk filled up (one line: the error and how many findings
     already written stay valid); takes precedence over 1

--case files run first; each is accounted for (given, run, cut at the
deadline, a harness error, not started). If any was not run to completion
the exit is 3, with one line naming how many and which, never 0 ("no
finding"); a finding written still gives 1 (the line names them too).

--driver random is the default: on 2 cores it finds every known class in
5 of 5 seeds within 60 s of the engine being ready, atheris two of them in
3 of 5 (python bench/rediscovery.py; docs/search.md). --corpus, --jobs N
without --ray and libFuzzer flags after -- are atheris's.

--jobs is at most 2 per core of this machine (without --ray, or with --ray
local), at most 1024 on a Ray cluster joined.

--max-time is the wall limit of the whole command, engine start-up included
(workers are stopped at it, nothing is started past it, a worker that could
not start is not started again; ~20 s of it go to starting the engine;
the campaign stops 2 s before it, so the command ends by about --max-time,
a few seconds more when stopping a worker is slow); building
a build's environment (--patch, path:, wheel:; ~30 s once) comes first, before
the clock starts.

Harness errors (kvspec's own bugs, a dead or hung engine worker) are never
findings: they are counted and stored under OUT/harness-errors/. When stderr
is not a terminal, a progress line is printed every ~10 s. At the end the
findings in OUT are grouped into classes (see kvspec findings).

"""
    + textwrap.fill(build_sentence(), 78)
    + "\n\n"
    + help_text()
    + "\n"
)


def configure(parser) -> None:
    from fuzz.driving.outcome import HARNESS_ERROR_LIMIT

    set_epilog(parser, EPILOG)
    from kvspec.engine_options import add_engine_arguments

    add_engine_arguments(
        parser,
        help="engine under test: vllm==X, a build vllm==X+LABEL.HASH, vllm==X --patch FILE.diff, path:DIR or wheel:FILE.whl; a second --engine adds the version-vs-version oracle (default: vllm==0.33.0)",
    )
    parser.add_argument(
        "--max-time",
        type=float,
        default=60.0,
        help="wall-clock limit in seconds, start-up included (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed (default: %(default)s)")
    parser.add_argument("--out", default=None, help="findings folder (default: $KVSPEC_HOME/findings)")
    parser.add_argument(
        "--corpus",
        default=None,
        help="with --driver atheris: corpus folder to resume from and grow (default: $KVSPEC_HOME/corpus/<engine>)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="parallel campaign workers, worker j with seed --seed + j: libFuzzer processes here (--driver atheris), Ray tasks with --ray (any driver) (default: %(default)s)",
    )
    parser.add_argument(
        "--ray",
        default=None,
        metavar="local|auto|HOST:PORT",
        help="run the --jobs workers on Ray: 'local' starts a cluster of --jobs CPUs on 127.0.0.1, 'auto' joins the one `ray start` started, HOST:PORT a cluster's GCS; one corpus, one findings folder (docs/distribute.md)",
    )
    parser.add_argument(
        "--ray-retries",
        type=int,
        default=2,
        help="with --ray: times a worker whose process died is run again (default: %(default)s)",
    )
    parser.add_argument(
        "--driver",
        choices=DRIVERS,
        default="random",
        help="search driver: 'random' (the structure-aware generator walking the deployment classes; it rediscovers every known class, docs/search.md), 'atheris' (coverage-guided libFuzzer over the same generator, with a corpus), 'hypothesis'; 'cases' runs only the z3 seeds and --case files, then stops (default: %(default)s)",
    )
    parser.add_argument(
        "--case",
        action="append",
        default=[],
        metavar="FILE",
        help="a case or finding file to run first (repeatable; not with --driver atheris)",
    )
    parser.add_argument(
        "--harness-error-limit",
        type=float,
        default=HARNESS_ERROR_LIMIT,
        metavar="FRACTION",
        help="exit 3 when harness errors exceed this fraction of executions (and number at least 3) (default: %(default)s)",
    )
    add_switches(
        parser,
        {
            "--no-z3-seeds": "do not seed the corpus with spec/'s boundary cases",
            "--synthetic-geometry": "draw hand geometries instead of deployments (model + vllm serve flags resolved by vLLM); their findings are labelled synthetic",
        },
    )
    parser.add_argument(
        "--kv-connector",
        default="drawn",
        metavar="drawn|offloading|none",
        help="KV connector of the random driver's deployments: 'drawn' (vLLM's CPU offloading connector, --kv-offloading-size, on one deployment in four), 'offloading' (on every one: a campaign over connector deployments), 'none' (default: %(default)s)",
    )
    parser.add_argument(
        "--pressure",
        default="drawn",
        metavar="drawn|always|none",
        help="the block pool of the random driver's deployments: 'drawn' (one case in ten pins it, --num-gpu-blocks-override, from the least pool vLLM's start-up check accepts to room for every request), 'always', 'none' (kvspec's pool: nothing evicted) (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("libfuzzer", nargs="*", help="after --, with --driver atheris: flags passed to libFuzzer")


#: Parallel workers per core of this machine (``--jobs`` without ``--ray``,
#: or with ``--ray local``, whose cluster is this machine).
JOBS_PER_CORE = 2
#: ``--jobs`` on a Ray cluster joined (``--ray auto|HOST:PORT``), whose size
#: is not known before joining it: Ray queues the tasks past its CPUs.
MAX_CLUSTER_JOBS = 1024


def max_jobs(ray: str | None) -> tuple[int, str]:
    """The largest ``--jobs`` and where it comes from: ``JOBS_PER_CORE`` per
    core of this machine, unless the workers run on a Ray cluster joined."""
    from kvspec.options import cores

    if ray is not None and ray != "local":
        return MAX_CLUSTER_JOBS, "the most tasks sent to a Ray cluster"
    n = cores()
    return JOBS_PER_CORE * n, f"{JOBS_PER_CORE} per core of this machine's {n} cores"


def _validate(args, engines: list[EngineOption]) -> None:
    """Every option checked before any work (a build, the z3 seeds, an
    engine): one line naming the flag, exit 2. ``engines``: the
    ``--engine`` options, parsed once (``parse_engine_options``); what a
    family allows is its registry entry's capabilities."""
    from kvspec.options import output_dir, seconds, whole

    if len(engines) > 2:
        raise invalid(
            "--engine", [e.text for e in engines], "give one engine under test and at most one more to compare with"
        )
    seconds("--max-time", args.max_time)
    ray = getattr(args, "ray", None)
    top, why = max_jobs(ray)
    whole("--jobs", args.jobs, minimum=1, maximum=top, why=why)
    if ray is not None:
        whole("--ray-retries", args.ray_retries, minimum=0, maximum=100)
    if not (math.isfinite(args.harness_error_limit) and 0 <= args.harness_error_limit <= 1):
        raise invalid("--harness-error-limit", args.harness_error_limit, "must be a fraction from 0 to 1")
    if args.driver != "atheris":
        if args.corpus:
            raise invalid(
                "--corpus",
                args.corpus,
                f"is atheris's corpus folder; allowed with --driver atheris (the driver is {args.driver})",
            )
        if args.libfuzzer:
            raise invalid(
                "libfuzzer",
                " ".join(args.libfuzzer),
                f"flags after -- go to libFuzzer; allowed with --driver atheris (the driver is {args.driver})",
            )
        if args.jobs > 1 and ray is None:
            raise invalid(
                "--jobs",
                args.jobs,
                f"parallel workers are libFuzzer processes (--driver atheris) or Ray tasks (--ray); allowed with --driver {args.driver} and no --ray: 1",
            )
    worker_only = next((e for e in engines if not e.family.supports(Capability.IN_PROCESS)), None)
    sglang = None if worker_only is None else worker_only.spec.name
    if worker_only is not None:  # its driver runs in its worker: no in-process atheris harness, deployments only
        title = worker_only.family.title
        if args.driver == "atheris":
            raise invalid(
                "--driver",
                "atheris",
                f"instruments vLLM in-process; allowed with --engine {sglang}: random, hypothesis, cases",
            )
        if args.synthetic_geometry or ray is not None:
            raise invalid(
                "--synthetic-geometry" if args.synthetic_geometry else "--ray",
                True,
                f"not with --engine {sglang}: {title} runs deployment cases in one process; allowed: neither",
            )
        if len(engines) > 1 and worker_only.family.twin is not None:
            raise invalid(
                "--engine",
                [e.text for e in engines],
                f"with {sglang} the second engine is {title}'s own twin (its second tree core), always; allowed: one --engine",
            )
    from fuzz.draw.generate import CONNECTOR_MODES

    if args.kv_connector not in CONNECTOR_MODES:
        raise invalid("--kv-connector", args.kv_connector, f"allowed: {', '.join(CONNECTOR_MODES)}")
    no_connector = next((e for e in engines if not e.family.supports(Capability.CONNECTORS)), None)
    if args.kv_connector != "drawn" and (
        args.driver != "random" or args.synthetic_geometry or no_connector is not None
    ):
        why = (
            f"{no_connector.family.title} deployments carry none"
            if no_connector is not None
            else "hand geometries carry none"
            if args.synthetic_geometry
            else f"the {args.driver} driver draws it"
        )
        raise invalid(
            "--kv-connector",
            args.kv_connector,
            f"pins the random driver's vLLM deployments; {why}; allowed here: drawn",
        )
    from fuzz.draw.generate_pressure import PRESSURE_MODES

    if args.pressure not in PRESSURE_MODES:
        raise invalid("--pressure", args.pressure, f"allowed: {', '.join(PRESSURE_MODES)}")
    no_pressure = next((e for e in engines if not e.family.supports(Capability.PRESSURE)), None)
    if args.pressure != "drawn" and (args.driver != "random" or args.synthetic_geometry or no_pressure is not None):
        raise invalid(
            "--pressure", args.pressure, "pins the random driver's pool on deployments of vLLM; allowed here: drawn"
        )
    if args.case and args.driver == "atheris":
        raise invalid(
            "--case", args.case[0], "runs with --driver random, hypothesis or cases (atheris reads a corpus folder)"
        )
    if args.driver == "cases" and not args.case and args.no_z3_seeds:
        raise invalid("--driver", "cases", "needs --case files or the z3 seeds (drop --no-z3-seeds)")
    from fuzz.driving.atheris_runner import process_flag

    flag = process_flag(args.libfuzzer or [])
    if flag:
        raise invalid("libfuzzer", flag, "starts processes of its own, past --max-time and --jobs; allowed: --jobs N")
    if args.out:
        output_dir("--out", args.out)
    if args.corpus:
        output_dir("--corpus", args.corpus)


def unusable_engine(engines: list[EngineSpec]) -> str | None:
    """The first engine that can run neither in this interpreter nor in a
    ready environment, as a one-line message; None when all can."""
    from engine_adapter.host import environments
    from engine_adapter.host.engine import inprocess_vllm_version

    for spec in engines:
        version = spec.version
        if inprocess_vllm_version() != version and not environments.is_ready(version):
            state = environments.status(version)["state"]
            return f"engine={spec.name!r}: environment {state} at {environments.env_dir(version)}; run: kvspec engines install {spec.name}"
    return None


def main(args) -> int:
    from engine_adapter.host.versions import DEFAULT_ENGINE
    from engine_adapter.models.served import check_case_model
    from fuzz.driving.outcome import EXIT_HARNESS
    from fuzz.driving.progress import resume_line
    from fuzz.results.findings import load_finding
    from ground.errors import EngineError
    from ground.home import kvspec_home
    from kvspec.engine_options import engine_specs, parse_engine_options

    options = parse_engine_options(args, default=DEFAULT_ENGINE)  # each name parsed once, here
    _validate(args, options)  # options first, before any build
    cases = [load_finding(path)[0] for path in args.case]  # a bad case file: one line, exit 2, before any build
    for case in cases:  # a model config kvspec refuses: before any build or engine
        check_case_model(case)
    # a build (--patch, path:, wheel:) is built before the clock starts
    try:
        specs = engine_specs(args, progress=_say, parsed=options)  # the names parsed above
    except EngineError as e:  # a build's environment could not be made (its self-test failed, say)
        _say(f"kvspec: {e} (harness failed, exit 3)")
        return EXIT_HARNESS
    started = time.monotonic()
    deadline = started + args.max_time
    home = kvspec_home()
    out = Path(args.out) if args.out else home / "findings"
    corpus = (
        (Path(args.corpus) if args.corpus else home / "corpus" / specs[0].name.replace("==", "-"))
        if args.driver == "atheris"
        else None
    )
    missing = unusable_engine(specs)
    if missing:
        _say(f"kvspec: {missing} (harness failed, exit 3)")
        return EXIT_HARNESS
    line = resume_line(out, corpus)
    if line:
        _say(line)
    from fuzz.draw.seeds import load_seed_cases
    from fuzz.draw.seeds import seed_dir as z3_seed_dir
    from fuzz.driving.config import RunConfig

    seed_dir = None if args.no_z3_seeds else z3_seed_dir(home)
    config = RunConfig(  # the campaign's flags, read once here and handed to whichever driver runs it
        args.driver,
        args.seed,
        synthetic=args.synthetic_geometry,
        connector=args.kv_connector,
        pressure=args.pressure,
        jobs=args.jobs,
        libfuzzer=tuple(args.libfuzzer or ()),
    )
    other = specs[1] if len(specs) > 1 else None
    try:
        if getattr(args, "ray", None) is not None:
            from fuzz.driving.ray_runner import run_on_ray

            summary = run_on_ray(
                config,
                specs,
                out,
                corpus,
                seed_dir,
                list(args.case),
                started,
                deadline,
                address=args.ray,
                retries=args.ray_retries,
                say=_say,
            )
        elif args.driver == "atheris":
            from rich.console import Console

            from fuzz.driving.atheris_runner import run_atheris

            tty = sys.stderr.isatty()
            console, emit = (Console(stderr=True), None) if tty else (None, _say)
            summary = run_atheris(
                specs[0],
                config,
                out,
                corpus,
                seed_dir,
                args.max_time,
                other=other,
                console=console,
                deadline=deadline,
                emit=emit,
            )
        else:
            from fuzz.driving.runner import run_in_process

            seeds = load_seed_cases(seed_dir) if seed_dir else []
            summary = run_in_process(
                config, specs, out, seeds, list(zip(args.case, cases)), started, deadline, say=_say
            )
    except EngineError as e:
        _say(f"kvspec: {e} (harness failed, exit 3)")
        return EXIT_HARNESS
    except OSError as e:  # the disk filled up (or went read-only) mid-campaign: kvspec's failure, never "findings"
        _say(f"kvspec: {_written_so_far(out, e)} (harness failed, exit 3)")
        return EXIT_HARNESS
    code, reason = summary.outcome(limit=args.harness_error_limit)
    report = summary.to_dict()
    report["classes"], report["malformed"] = _classes(out, report)
    report["exit_code"], report["outcome"] = code, reason
    _print(report, args, specs, out)
    _say(f"kvspec fuzz: exit {code}: {reason}")
    return code


def _written_so_far(out: Path, error: OSError) -> str:
    """One line for a campaign stopped by an ``OSError`` (a full disk, a
    read-only mount): the error, and what ``out`` holds (the findings
    already written are whole: each was written atomically)."""
    import errno
    import os

    from fuzz.results.triage import read_findings

    what = errno.errorcode.get(error.errno or 0, "error")
    where = f" writing {error.filename}" if error.filename else ""
    try:
        described, _ = read_findings(out) if out.is_dir() else ([], [])
        held = f"{len(described)} finding(s) already written in {out} stay valid"
    except OSError:
        held = f"what {out} holds could not be read"
    return (
        f"out={out}: the campaign stopped: {what} ({os.strerror(error.errno) if error.errno else error}){where}; {held}"
    )


def _classes(out: Path, summary: dict) -> tuple[list[dict], list[dict]]:
    """Every finding in ``out`` grouped into classes, this run's marked new."""
    from fuzz.results.triage import read_findings, triage

    if not out.is_dir():
        return [], []
    described, malformed = read_findings(out)
    new = {str(Path(f["path"])) for f in summary["findings"]}
    return triage(described, new), [{"path": p, "reason": r} for p, r in malformed]


def _print(summary: dict, args, specs: list[EngineSpec], out: Path) -> None:
    from rich.table import Table

    from ground.console import table_console
    from kvspec.commands.findings import render

    if args.json:
        print(json.dumps(summary, indent=2))
        return
    engines = [spec.name for spec in specs]
    table = Table(title=f"kvspec fuzz: {engines[0]}" + (f" vs {engines[1]}" if len(engines) > 1 else ""))
    for col in (
        "driver",
        "execs",
        "exec/s",
        "coverage",
        "unsupported",
        "rejected by the engine",
        "harness errors",
        "new findings",
        "first finding (s)",
    ):
        table.add_column(col, justify="right")
    cov = summary.get("coverage")
    table.add_row(
        args.driver,
        str(summary["execs"]),
        str(summary["exec_per_s"]),
        "-" if cov is None else str(cov),
        str(summary["unsupported"]),
        str(summary.get("rejected", 0)),
        str(summary["harness_errors"]),
        str(len(summary["findings"])),
        "-" if summary["first_finding_s"] is None else f"{summary['first_finding_s']:.2f}",
    )
    table_console().print(table)
    malformed = [(m["path"], m["reason"]) for m in summary["malformed"]]
    print("\n".join(render(summary["classes"], malformed, str(out))))
    reach = summary.get("reach")
    if reach:
        shapes = ", ".join(f"{k} {v}" for k, v in sorted(reach["shapes"].items(), key=lambda kv: -kv[1]))
        if specs[0].family_entry.supports(Capability.DEPLOYMENT_CLASSES):
            print(
                f"  reach: {reach['deployment_classes']} of {reach['of']} deployment classes (model/speculative/unit/retention); trace shapes: {shapes}"
            )
        else:  # the deployment classes are vLLM's features (speculative mode, hash unit, retention)
            print(f"  reach: trace shapes: {shapes}")
        if reach.get("pressure") and specs[0].family_entry.supports(Capability.PRESSURE):
            print("  reach under pressure (cases): " + ", ".join(f"{k} {v}" for k, v in reach["pressure"].items()))
    files = summary.get("case_files")
    if files and files.get("given"):
        print(
            f"  --case files: {files['given']} given, {files['run']} run, {files['cut_at_deadline']} cut at the deadline, {files['harness_error']} a harness error, {files['not_started']} not started"
        )
    if summary.get("harness_errors"):
        print(f"  {summary['harness_errors']} harness error(s) recorded under {out / 'harness-errors'} (not findings)")
