"""kvspec check-build --engine ENGINE [--patch FILE.diff ...] [--max-time S] [--out DIR] [--json]

The custom-build guard (``fuzz.replaying.checkbuild``): runs the examples, the proofs'
boundary cases (mapped onto real deployments) and a short random campaign on
one build of vLLM, and prints pass/fail per promise (``fuzz.replaying.checkbuild.PROMISES``:
R1 identical resend, R2 longer sibling, junction, no stale states,
retention, chunk ends, checkpoints, hit blocks, no engine errors) with the
first counterexample of each failure. The one command a fork's CI runs.
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

from fuzz.judge.oracle_registry import BY_NAME, KNOWN_ORACLES, listed
from ground.console import say as _say
from kvspec.epilog import set_epilog

NAME = "check-build"
HELP = "does an engine build (a release, vllm==X or sglang==X --patch FILE.diff, path:DIR, wheel:FILE.whl) keep kvspec's promises?"
EPILOG = (
    """\
exit codes:
  0  every promise held
  1  a promise failed (its first counterexample is printed); with
     --against, only a failure the baseline does not share
  2  usage: a bad option, a patch that does not apply (one line)
  3  the harness failed: the build's environment or engine could not be
     made or started, nothing ran, or harness errors above the limit

"""
    + textwrap.fill(
        f"A build is judged by the {listed(o for o in KNOWN_ORACLES if BY_NAME[o].build and not BY_NAME[o].second_engine)} oracles, "
        f"never by the rule its release implements (the {listed(o for o in KNOWN_ORACLES if not BY_NAME[o].build)} oracles).",
        72,
    )
    + """
--against BUILD judges every counterexample on BUILD too (a
release, or a build from `kvspec engines list`): a promise the baseline
breaks on the same case is listed apart ("fails on baseline too"), so a
patch on a release with known failures shows only its own regressions. Building its environment (~30 s once) comes before the clock;
--max-time bounds the campaign, --cases-time the examples and boundary
cases before it.

  kvspec check-build --engine vllm==0.33.0 --patch my-fix.diff
  kvspec check-build --engine vllm==0.33.0 --patch my-fix.diff --against vllm==0.33.0
  kvspec check-build --engine path:$HOME/src/vllm --base vllm==0.33.0
"""
)


def configure(parser) -> None:
    from kvspec.engine_options import add_engine_arguments

    set_epilog(parser, EPILOG)
    add_engine_arguments(
        parser,
        metavar="ENGINE",
        help="the build: vllm==X (with --patch FILE.diff ...), vllm==X+LABEL.HASH, path:DIR or wheel:FILE.whl (default: vllm==0.33.0)",
    )
    parser.add_argument(
        "--max-time",
        type=float,
        default=45.0,
        metavar="S",
        help="seconds for the random campaign after the boundary cases (default: %(default)s)",
    )
    parser.add_argument(
        "--cases-time",
        type=float,
        default=240.0,
        metavar="S",
        help="at most this many seconds for the examples and boundary cases, engine start included (default: %(default)s)",
    )
    parser.add_argument(
        "--against",
        default=None,
        metavar="BUILD",
        help="a baseline (vllm==X, or a build vllm==X+LABEL.HASH): failures it shares on the same case are not this build's (the exit code follows what is new)",
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed (default: %(default)s)")
    parser.add_argument(
        "--fail-fast", action="store_true", help="stop at the first promise that fails (the others: not checked)"
    )
    parser.add_argument(
        "--out", default=None, metavar="DIR", help="findings folder (default: $KVSPEC_HOME/check-build/<engine>/<time>)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def main(args) -> int:
    from engine_adapter.host.builds import prepare
    from engine_adapter.host.versions import DEFAULT_ENGINE
    from fuzz.replaying.checkbuild import EXIT_HARNESS, check_build, render
    from ground.errors import EngineError, invalid
    from ground.home import kvspec_home
    from kvspec.engine_options import engine_specs
    from kvspec.options import output_dir, seconds

    seconds("--max-time", args.max_time)
    seconds("--cases-time", args.cases_time)
    if args.engine and len(args.engine) > 1:
        raise invalid("--engine", args.engine, "check-build takes one engine")
    if args.out:
        out = output_dir("--out", args.out)
        if out.is_dir() and any(out.glob("*.json")):
            raise invalid(
                "--out",
                args.out,
                "holds findings already; allowed: an empty or new folder (check-build reports what this run finds)",
            )
    try:
        # the baseline's name as its build gives it (check_build reads it once)
        against = None if args.against is None else prepare(args.against, flag="--against", progress=_say)
        (spec,) = engine_specs(args, default=DEFAULT_ENGINE, progress=_say)  # parsed once, at this edge
    except EngineError as e:
        _say(f"kvspec: {e} (harness failed, exit 3)")
        return EXIT_HARNESS
    started = time.monotonic()
    if not args.out:
        out = kvspec_home() / "check-build" / spec.name.replace("==", "-") / time.strftime("%Y%m%d-%H%M%S")
    report = check_build(
        spec,
        out=Path(out),
        max_time=args.max_time,
        cases_time=args.cases_time,
        seed=args.seed,
        fail_fast=args.fail_fast,
        progress=_say,
        started=started,
        against=against,
    )
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print("\n".join(render(report)))
    return report.exit_code
