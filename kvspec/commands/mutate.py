"""kvspec mutate --engine vllm==X [--mutants N | --only ID ...] [--budget S] [--out DIR] [--report] [--coverage S] [--ray auto|ADDRESS]

How strong is kvspec? Faults planted in vLLM's boundary code (Cosmic Ray's
operators, one mutant = one patched build), each judged by kvspec (a fixed
budget of cases per mutant) and by vLLM's own tests/v1/core (from the sdist,
run in the build's environment); the score of each, side by side
(``mutate/``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ground.console import say as _say
from kvspec.epilog import set_epilog
from kvspec.switches import add_switches

NAME = "mutate"
HELP = "mutation score of kvspec vs vLLM's own tests on vLLM's boundary code (Cosmic Ray mutants as patched builds)"
EPILOG = """\
  kvspec mutate --engine vllm==0.33.0 --mutants 40 --budget 30      # run, then write the report
  kvspec mutate --list                                              # every candidate mutant position
  kvspec mutate --only replay-82bcea0f --budget 20 --out DIR        # chosen mutants
  kvspec mutate --report --out DIR                                  # the report of a run (table, JSON, PNG)
  kvspec mutate --coverage 600 --out DIR                            # branch coverage: campaign vs vLLM's tests
  kvspec mutate --ray auto ...                                      # the mutants as tasks on a Ray cluster

exit codes: 0 done; 2 usage (one line); 3 the harness failed before any mutant ran.
"""


def configure(parser) -> None:
    set_epilog(parser, EPILOG)
    parser.add_argument(
        "--engine", default="vllm==0.33.0", help="the release whose code is mutated (default: %(default)s)"
    )
    parser.add_argument(
        "--mutants",
        type=int,
        default=20,
        metavar="N",
        help="how many mutants, picked round-robin over the areas (default: %(default)s)",
    )
    parser.add_argument("--only", nargs="+", default=None, metavar="ID", help="run these mutant ids (see --list)")
    parser.add_argument(
        "--budget",
        type=float,
        default=30.0,
        metavar="S",
        help="kvspec's seconds per mutant, from the engine being ready (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=1, help="selection and case seed (default: %(default)s)")
    parser.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="run folder (default: $KVSPEC_HOME/mutate/runs/<time>); a folder of an earlier run resumes it",
    )
    add_switches(
        parser,
        {
            "--no-vllm-tests": "judge with kvspec only",
            "--vllm-tests-only": "add vLLM's tests to the mutants a --no-vllm-tests pass in --out judged (runs beside it; touches no other mutant)",
        },
    )
    parser.add_argument(
        "--vllm-tests-from",
        default=None,
        metavar="DIR",
        help="take vLLM's tests' verdicts from an earlier run folder wherever it judged the same build (the same mutant diff in the same base); run them only for the others",
    )
    add_switches(
        parser,
        {
            "--keep-builds": "keep each mutant's build environment",
            "--report": "only write the report of the run in --out",
            "--list": "print every candidate mutant position (id, function, line, operator) and exit",
        },
    )
    parser.add_argument(
        "--coverage",
        type=float,
        default=None,
        metavar="S",
        help="only measure branch coverage of the target functions: an S-second campaign vs vLLM's tests",
    )
    parser.add_argument(
        "--check-equivalent",
        nargs="+",
        default=None,
        metavar="ID",
        help="only run the equivalence check on these mutants (the fixed cases and --equivalent-cases random cases, mutant vs base); results under OUT/equivalent",
    )
    parser.add_argument(
        "--equivalent-cases",
        type=int,
        default=30,
        metavar="N",
        help="random cases of --check-equivalent (default: %(default)s)",
    )
    parser.add_argument(
        "--ray",
        default=None,
        metavar="auto|local|ADDRESS",
        help="run the mutants as tasks on a Ray cluster (fuzz.driving.distribute)",
    )


def main(args) -> int:
    from engine_adapter.host.versions import EngineSpec
    from ground.errors import EngineError, invalid
    from ground.home import kvspec_home
    from kvspec.options import output_dir, seconds, whole

    spec = EngineSpec.parse(args.engine, "--engine")
    release = spec.version
    if spec.is_build:
        raise invalid("--engine", args.engine, "mutate plants faults in a release (vllm==X), not in a build")
    seconds("--budget", args.budget)
    whole("--mutants", args.mutants, minimum=1, maximum=5000)
    if args.coverage is not None:
        seconds("--coverage", args.coverage)
    if args.vllm_tests_only and (args.no_vllm_tests or not args.out):
        raise invalid("--vllm-tests-only", True, "needs --out DIR of a --no-vllm-tests pass, and vLLM's tests on")
    if args.vllm_tests_from is not None:
        if args.no_vllm_tests:
            raise invalid("--vllm-tests-from", args.vllm_tests_from, "scores vLLM's tests: not with --no-vllm-tests")
        if not (Path(args.vllm_tests_from) / "mutants").is_dir():
            raise invalid(
                "--vllm-tests-from",
                args.vllm_tests_from,
                "allowed: the --out folder of an earlier kvspec mutate run (it has mutants/)",
            )
    if args.report and not args.out:
        raise invalid("--report", True, "needs --out DIR, the run to report on")
    out = (
        output_dir("--out", args.out)
        if args.out
        else kvspec_home() / "mutate" / "runs" / time.strftime("%Y%m%d-%H%M%S")
    )
    if args.list:
        from mutate.generate import positions
        from mutate.run import base_engine, default_base_patches
        from mutate.targets import release_vllm_root

        base = base_engine(release, default_base_patches(release))  # mutants are planted in the base
        for p in positions(release_vllm_root(base.split("==", 1)[1])):
            print(f"{p['id']}\t{p['function']}\t{p['line']}\t{p['operator'].removeprefix('core/')}")
        return 0
    if args.check_equivalent:
        from mutate.equivalent import check_mutants

        whole("--equivalent-cases", args.equivalent_cases, minimum=0, maximum=100000)
        results = check_mutants(
            release, args.check_equivalent, out=out, n=args.equivalent_cases, seed=args.seed, progress=_say
        )
        print(json.dumps([{k: r.get(k) for k in ("id", "equal", "compared", "reason")} for r in results], indent=2))
        return 0
    if args.coverage is not None:
        from mutate.coverage import compare

        result = compare(release, out=out, campaign_s=args.coverage, seed=args.seed, progress=_say)
        print(json.dumps(result["summary"], indent=2))
        return 0
    from mutate import report

    if not args.report:
        from mutate.run import run

        try:
            run(
                release,
                out=out,
                budget=args.budget,
                n=args.mutants,
                only=args.only,
                seed=args.seed,
                vllm_tests=not args.no_vllm_tests,
                keep_builds=args.keep_builds,
                ray=args.ray,
                tests_only=args.vllm_tests_only,
                vllm_tests_from=Path(args.vllm_tests_from) if args.vllm_tests_from else None,
                progress=_say,
            )
        except EngineError as e:
            _say(f"kvspec: {e} (harness failed, exit 3)")
            return 3
    s = report.write(out)
    print(report.markdown(s).split("\n## Per file")[0])
    print(f"report: {out / 'report.md'}, {out / 'report.json'}, {out / 'report.png'}")
    return 0
