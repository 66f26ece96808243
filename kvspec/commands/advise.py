"""kvspec advise (--model M [--platform P] [--device D] | CASE.json) [--engine vllm==X] [-- FLAGS] | --server URL [--api-key-env NAME]
                (--workload resend|chat|agent|rag|interleaved [sizes] | --trace FILE) [--confirm | --no-confirm] [--out DIR] [--json]

What a deployment will hit on a workload, before it ships: the geometry
vLLM resolves for it (``--model`` and ``vllm serve`` flags after ``--``, or
a case file's deployment; resolved with vLLM's own code in the engine
environment of ``--engine``, cached on disk), or a running server's
(``--server``, read from its ``/metrics``); then, with the reference model:

1. the resolved geometry and the minimum cacheable prefix (the shortest
   prompt whose identical resend hits, under the deployment's retention and
   under the promise);
2. per request: hits under the rule the version implements and under the
   promise (dense retention); the lost reuse, in tokens and as a share of
   prefill;
3. the failure classes this deployment is exposed to, each with its
   shortest canonical case;
4. for sparse, periodic k x block and dense retention: the hit share and
   the Mamba states kept at the end (count and memory), and the cheapest
   setting within 1% of the best hit share;
5. a PNG chart of the hit share per request for each setting.

The numbers of 2 and 4 are confirmed on the real in-process scheduler of
that version (``--confirm``; on by default up to 200 requests and 2,000,000
prompt tokens, see ``advise.confirm``); every disagreement is printed and
written as a ``reference`` finding under ``OUT/findings/``.

Workload sizes: ``--requests``, ``--prompt-tokens``, ``--turn-tokens``,
``--system-tokens``, ``--turns``, ``--conversations``, ``--documents``,
``--seed`` (defaults per shape: ``advise.workloads``). Without
``--workload``/``--trace`` a case file's own trace is the workload.

Writes ``OUT/advice.json`` and ``OUT/advice.png`` (``--out``, default
``.kvspec/advise``), each atomically: a read-only or full disk is one line
(exit 2), never a torn file. A server's API key is read only from the
environment variable ``--api-key-env`` names (as ``kvspec replay``): a key
on the command line is readable by every local user in
``/proc/PID/cmdline``, so ``--api-key`` is refused in one line that never
shows its value. Exit status: 0 advice given (confirmed, or not
confirmed); 1 the engine disagreed with the model (findings written);
2 bad input (one line); 3 the engine did not run a setting (kvspec's own
failure, never vLLM's).
"""

from __future__ import annotations

import json
from pathlib import Path

from ground.console import say as _say
from ground.errors import InvalidArgument, invalid
from kvspec.epilog import set_epilog
from kvspec.model_options import add_model_arguments, model_case
from kvspec.switches import add_switches

HELP = "what a deployment will hit on a workload: lost reuse, failure classes, the retention to use and its memory (confirmed on the engine)"


def configure(parser) -> None:
    import argparse

    from advise.workloads import OPTIONS, WORKLOADS

    set_epilog(
        parser,
        "exit status: 0 advice given; 1 the engine disagreed with the model (findings written); 2 bad input; 3 the engine did not run a setting",
    )
    add_model_arguments(
        parser,
        case_help="a case or finding file: its deployment (and its trace, without --workload/--trace)",
        model_help="a shipped model name or a config.json path; vllm serve flags after --",
        device_help="with --model on cuda: the GPU (h100, h200, a100, b200; default h100)",
    )
    parser.add_argument(
        "--engine",
        default=None,
        metavar="vllm==X",
        help="the vLLM version whose rules and resolution apply (default: vllm==0.33.0; with --server: the server's)",
    )
    parser.add_argument("--server", metavar="URL", help="read the geometry from a running server's /metrics instead")
    parser.add_argument(
        "--api-key-env",
        default=None,
        metavar="NAME",
        help="with --server: the name of the environment variable holding its API key (never printed or saved)",
    )
    parser.add_argument(
        "--api-key", default=None, help=argparse.SUPPRESS
    )  # refused: kept so it is not read as --api-key-env
    parser.add_argument(
        "--send-key-in-clear",
        action="store_true",
        help="with --server: send the API key over plain http to a host that is not loopback (anyone on the path can read it)",
    )
    parser.add_argument(
        "--served-model", default=None, help="with --server: the served model name (when it serves several)"
    )
    parser.add_argument("--workload", metavar="|".join(WORKLOADS), help="a built-in workload shape")
    for flag in OPTIONS:
        parser.add_argument(
            flag, type=int, default=None, metavar="N", help=f"workload size: {OPTIONS[flag].replace('_', ' ')}"
        )
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default: %(default)s)")
    parser.add_argument("--trace", metavar="FILE", help="a recorded trace: JSON lines (advise.workloads)")
    confirm = parser.add_mutually_exclusive_group()
    confirm.add_argument(
        "--confirm",
        dest="confirm",
        action="store_true",
        default=None,
        help="confirm on the engine (default: up to 200 requests / 2,000,000 prompt tokens)",
    )
    confirm.add_argument("--no-confirm", dest="confirm", action="store_false", help="predict only")
    parser.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="where advice.json, advice.png and findings/ go (default: .kvspec/advise)",
    )
    parser.add_argument("--chart", default=None, metavar="FILE", help="the PNG chart (default: OUT/advice.png)")
    add_switches(
        parser,
        {
            "--json": "print the advice as JSON instead of tables",
            "--fresh": "resolve the deployment again (ignore the resolution cache)",
        },
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds one engine run (or a server request) may take (default: %(default)s)",
    )
    parser.add_argument("flags", nargs="*", help="after --: vllm serve flags (with --model)")


def check_options(args) -> None:
    """Every option value checked before any work (one line each)."""
    from kvspec.options import output_dir, output_file, seconds

    if args.api_key is not None:  # never echo the value
        raise InvalidArgument(
            "--api-key: a key on the command line is readable by every local user (/proc/PID/cmdline); allowed: --api-key-env NAME, the name of an environment variable holding the key"
        )
    seconds("--timeout", args.timeout)
    if (
        args.model is not None and args.case is not None and args.case.startswith("-")
    ):  # argparse put the first flag after -- here
        args.flags = [args.case, *(args.flags or [])]
        args.case = None
    sources = [x for x in (args.case, args.model, args.server) if x is not None]
    if len(sources) != 1:  # a --server URL shown with any user:password@ part masked
        from engine_adapter.live.client import _shown_url

        shown = [_shown_url(x) if x is args.server else x for x in sources]
        raise invalid("source", shown, "give exactly one of: a case file, --model M (flags after --), --server URL")
    if args.flags and args.model is None:
        raise invalid("flags", args.flags, "vllm serve flags go with --model only")
    if args.server is not None and args.engine is not None:
        raise invalid(
            "--engine", args.engine, "with --server the server's own vLLM version applies; allowed: no --engine"
        )
    if args.server is None and (args.api_key_env is not None or args.served_model is not None):
        flag, value = (
            ("--api-key-env", args.api_key_env)
            if args.api_key_env is not None
            else ("--served-model", args.served_model)
        )
        raise invalid(flag, value, "only with --server")
    if args.workload is not None and args.trace is not None:
        raise invalid("--trace", args.trace, "give --workload or --trace, not both")
    if args.workload is None and args.trace is None and args.case is None:
        raise invalid(
            "--workload",
            None,
            "give a workload: --workload resend|chat|agent|rag|interleaved or --trace FILE (or a case file's trace)",
        )
    from advise.workloads import OPTIONS

    if args.workload is None:
        for flag, key in OPTIONS.items():
            if getattr(args, key) is not None:
                raise invalid(flag, getattr(args, key), "a size of a built-in workload; allowed: with --workload")
    output_dir("--out", args.out if args.out is not None else _default_out())
    if args.chart is not None:
        output_file("--chart", args.chart)


def _default_out() -> Path:
    from ground.home import kvspec_home

    return kvspec_home() / "advise"


def _written(flag: str, path, write) -> None:
    """``write()`` (an atomic write of ``path``); a disk that refuses it
    (read-only, full) is one line naming ``flag``."""
    try:
        write()
    except OSError as e:
        raise invalid(
            flag, str(path), f"cannot be written ({e.strerror or e}); allowed: a writable folder with room"
        ) from None


def build_workload(args, case):
    from advise import workloads

    if args.trace is not None:
        return workloads.load_trace(args.trace)
    if args.workload is not None:
        given = {key: getattr(args, key) for key in workloads.OPTIONS.values()}
        return workloads.build(args.workload, given, args.seed)
    workload = workloads.Workload("case", {"file": args.case}, case.trace)
    workloads.check(workload)
    return workload


def _deployment_case(args):
    return model_case(args, "advise")


class LazyEngine:
    """The engine, opened on first use (resolution or confirmation) and
    closed at the end."""

    def __init__(self, spec) -> None:
        self.spec = spec  # the typed engine (ground.engines.EngineSpec)
        self.name = spec.name
        self.engine = None

    def __call__(self):
        if self.engine is None:
            from engine_adapter.host.engine import open_engine

            _say(f"kvspec advise: starting the {self.name} engine (about half a minute) ...")
            self.engine = open_engine(self.spec)
        return self.engine

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


def main(args) -> int:
    from advise import model
    from advise import source as sources
    from advise.chart import chart
    from advise.confirm import RUN_TIMEOUT_S, check_explicit, confirm, too_big
    from advise.render import render, report
    from engine_adapter.host.versions import DEFAULT_ENGINE, EngineSpec
    from ground.files import write_json_atomic
    from kvspec.commands.replay import _api_key

    check_options(args)
    # the name parsed once, here (with --server the server's /version names the engine)
    spec = None if args.server is not None else EngineSpec.parse(args.engine or DEFAULT_ENGINE, "--engine")
    if spec is not None and spec.family_entry.adviser:  # the family's own advice (SGLang: advise/sglang.py)
        from ground.engines import load

        return load(spec.family_entry.adviser)(args, spec)
    api_key = _api_key(args.api_key_env)
    if args.server is not None:
        from engine_adapter.live.client import check_base_url, check_key_transport

        check_key_transport(
            check_base_url(args.server), api_key is not None, in_clear_ok=args.send_key_in_clear
        )  # before any connection
    case = None
    if args.case is not None:
        from fuzz.results.findings import load_finding

        case, _ = load_finding(args.case)
    elif args.model is not None:
        case = _deployment_case(args)
    if case is not None:  # a model config kvspec refuses: before the engine starts
        from engine_adapter.models.served import check_case_model

        check_case_model(case)
    workload = build_workload(args, case)
    if args.confirm:
        check_explicit(workload.requests)
    out = Path(args.out) if args.out is not None else _default_out()
    lazy = None
    try:
        if args.server is not None:
            src = sources.from_server(
                args.server, api_key=api_key, model=args.served_model, timeout_s=min(args.timeout, 60.0)
            )
        else:
            lazy = LazyEngine(spec)
            if case.deployment is not None:
                src = sources.from_deployment(case, spec, lazy, use_cache=not args.fresh)
            else:
                src = sources.Source(
                    "hand",
                    spec,
                    case.geometry,
                    case.speculative,
                    {},
                    ["a hand geometry: no deployment resolved it (kvspec resolve CASE says whether one reaches it)"],
                    describe=case.name or str(args.case),
                )
        if lazy is None:
            lazy = LazyEngine(src.engine_spec)
        version = src.engine_spec.version
        _check_lengths(workload, src.facts.get("max_model_len"))
        resolved = src.case(workload.requests, workload.name)
        advice = model.advise(resolved, src.engine_spec, src.facts)
        from fuzz.results.impact import workload_cost

        dep = resolved.deployment.as_dict() if resolved.deployment is not None else None
        advice["cost"] = workload_cost(
            [r["implemented"] for r in advice["requests"]], [r["promise"] for r in advice["requests"]], dep, src.facts
        )
        confirmed = None
        skipped = None
        if args.confirm is False:
            skipped = "--no-confirm"
        else:
            why = None if args.confirm else too_big(workload.requests, explicit=False)
            if why:
                skipped = f"the workload has {why} (--confirm to run it anyway)"
            elif src.kind == "server":
                from engine_adapter.host import environments

                if not environments.is_ready(version):
                    if args.confirm:
                        from ground.errors import EngineError

                        raise EngineError(
                            f"engine={src.engine!r}: not installed; run: kvspec engines install {src.engine}"
                        )
                    skipped = f"the server's engine {src.engine} is not installed (kvspec engines install {src.engine})"
            if skipped is None:
                confirmed = confirm(
                    src, resolved, advice, lazy(), out, timeout=min(args.timeout, RUN_TIMEOUT_S), progress=_say
                )
        chart_path = Path(args.chart) if args.chart else out / "advice.png"
        title = f"{src.describe} on {src.engine}: workload {workload.name} ({len(workload.requests):,} requests)"
        _written("--chart" if args.chart else "--out", chart_path, lambda: chart(advice, title[:330], chart_path))
        files = {
            "json": str(out / "advice.json"),
            "chart": str(chart_path),
            "findings": str(out / "findings") if confirmed and confirmed["findings"] else None,
        }
        doc = report(advice, src.as_dict(), workload.as_dict(), confirmed, files)
        if skipped:
            doc["confirm_skipped"] = skipped
        _written("--out", out / "advice.json", lambda: write_json_atomic(out / "advice.json", doc))
    finally:
        if lazy is not None:
            lazy.close()
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        render(doc)
    if confirmed is None:
        return 0
    return {"confirmed": 0, "disagrees": 1, "inconclusive": 3}[confirmed["status"]]


def _check_lengths(workload, max_model_len: int | None) -> None:
    """A request vLLM would refuse (longer than max_model_len): one line."""
    if not max_model_len:
        return
    for i, r in enumerate(workload.requests):
        need = r.num_prompt_tokens + r.max_tokens
        if need > max_model_len:
            raise invalid(
                f"workload request {i}",
                f"<{need:,} tokens with max_tokens>",
                f"above the deployment's max_model_len={max_model_len:,}; allowed: shorter prompts (or --max-model-len)",
            )


def _advise_sglang(args, spec) -> int:
    """``--engine sglang==X``: SGLang's own rule on the workload
    (:mod:`advise.sglang`), resolved and confirmed on SGLang's engine.
    Exit 0 advice given; 1 the engine disagreed with the rule."""
    from advise import sglang as advice_of
    from engine_adapter.host.engine import open_engine
    from ground.files import write_json_atomic
    from reference.case import Case, parse_case

    if args.case is not None:
        from fuzz.results.findings import load_finding

        case, _ = load_finding(args.case)
        if case.deployment is None or case.deployment.engine != spec.family:
            raise invalid(
                "case", args.case, f'with --engine {spec.name}: a case whose deployment has "engine": "{spec.family}"'
            )
    else:
        case = parse_case(
            {
                "schema": 1,
                "name": "advise",
                "deployment": {"model": args.model, "engine": "sglang", "sglang_args": list(args.flags or [])},
                "trace": [{"prompt": [{"segment": "A", "length": 1}]}],
            }
        )
    workload = build_workload(args, case)
    case = Case(None, None, tuple(workload.requests), workload.name, case.deployment)
    out = Path(args.out) if args.out is not None else _default_out()
    _say(f"kvspec advise: starting the {spec.name} engine ...")
    with open_engine(spec) as engine:
        resolution = engine.resolve(case)
        _check_lengths(workload, (resolution.get("facts") or {}).get("max_model_len"))
        advice = advice_of.advise(case, resolution, spec.name)
        confirmed = None
        if args.confirm is not False:
            obs = engine.run(case, {"tree_core": "python"})
            observed = obs.get("hits") or []
            differs = [
                i for i, r in enumerate(advice["requests"]) if i >= len(observed) or observed[i] != r["implemented"]
            ]
            confirmed = {
                "status": "disagrees" if differs or obs.get("error") else "confirmed",
                "observed": observed,
                "differs": differs[:20],
            }
    doc = {"advice": advice, "notes": advice_of.notes(advice), "workload": workload.as_dict(), "confirmed": confirmed}
    _written("--out", out / "advice.json", lambda: write_json_atomic(out / "advice.json", doc))
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        a = advice
        print(
            f"{spec.name}: {case.deployment.describe()} on workload {workload.name} ({len(workload.requests)} requests)"
        )
        print(
            f"  resolved: page {a['setting']['page_size']}, chunk budget {a['setting']['chunked_prefill_size']}, {a['setting']['strategy']}, grid {a['setting']['checkpoint_grid']}"
        )
        print(
            f"  hit share {a['hit_share']:.1%} (SGLang's rule)"
            + (
                f", promise {a['promise_hit_share']:.1%}; {a['lost_tokens']:,} tokens lost"
                if "promise_hit_share" in a
                else "; promise not stated"
            )
        )
        for line in doc["notes"]:
            print(f"  - {line}")
        if confirmed is not None:
            print(
                f"  confirmed on {spec.name}: {confirmed['status']}"
                + (f" (requests {confirmed['differs']})" if confirmed["differs"] else "")
            )
    return 1 if confirmed is not None and confirmed["status"] == "disagrees" else 0
