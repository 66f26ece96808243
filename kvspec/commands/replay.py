"""kvspec replay FINDING_OR_CASE.json --server URL [--api-key-env NAME] [--model NAME] [--gap S] [--step-s S] [--timeout S] [--rescale] [--rule R] [--json PATH]

Replays a case (or the case inside a finding) against a running vLLM
OpenAI-compatible server, request by request, and judges the
``vllm:prefix_cache_hits_total`` deltas with kvspec's one judge
(:mod:`fuzz.judge.verdict`): a finding is reproduced / not reproduced, a bare case
agrees / diverges with the reference prediction.

Exit status: 0 reproduced (a finding) or agrees (a bare case), 1 not
reproduced or diverges, 3 inconclusive (also when something was sent and
then the server's answers could not be read: a timeout, an HTTP error,
unreadable ``/metrics``; in-process: the engine did not run the case), 2
refused or bad input before anything was sent (one line on stderr). ``--timeout`` bounds each
request (a completion or a metrics scrape, retries included) in wall-clock
time. The API key is read only from the environment variable named by
``--api-key-env``; it goes over https, or plain http to a loopback host,
and to any other plain-http host only with ``--send-key-in-clear`` (refused
before any connection otherwise); it is never printed or written: the key, and any
``Bearer`` token, is replaced by ``[redacted]`` in every message and report,
even when the server echoes it.

``--engine vllm==X`` (in-process replay) is delegated to
``fuzz.replaying.replay.replay_on_engine(path, spec) -> dict`` (the
typed engine, parsed once here) and
``fuzz.replaying.replay.render_replay(result, console)`` when that module provides
them (the same judge and verdicts). A ``versions`` finding runs on
``--engine`` and on the other engine the finding names.
"""

from __future__ import annotations

import importlib
import os
import re

from fuzz.judge.verdict import EXIT as VERDICT_EXIT
from ground.errors import InvalidArgument, Unsupported, invalid
from kvspec.rule_option import add_rule_argument

HELP = "replay a case or finding against a running vLLM server (or an in-process engine) and say whether it reproduces"

#: The judge's verdicts and their exit codes, for --server and --engine alike.
EXIT = ENGINE_EXIT = VERDICT_EXIT
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def configure(parser) -> None:
    parser.add_argument("file", metavar="FINDING_OR_CASE", help="a case file (schema 1) or a finding file")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--server", metavar="URL", help="base URL of a vLLM OpenAI-compatible server, e.g. http://127.0.0.1:8000"
    )
    from kvspec.engine_options import add_engine_arguments

    add_engine_arguments(
        parser,
        group=where,
        metavar="vllm==X",
        help="replay in-process on an installed engine instead (see fuzz.replaying.replay); also a build: vllm==X --patch FILE.diff, vllm==X+LABEL.HASH, path:DIR, wheel:FILE.whl",
    )
    parser.add_argument(
        "--api-key-env", metavar="NAME", help="name of the environment variable holding the server's API key"
    )
    parser.add_argument(
        "--send-key-in-clear",
        action="store_true",
        help="send the API key over plain http to a host that is not loopback (anyone on the path can read it)",
    )
    parser.add_argument("--model", metavar="NAME", help="served model name (default: the only one the server serves)")
    parser.add_argument(
        "--gap", metavar="S", type=float, default=1.0, help="seconds between requests (default: %(default)s)"
    )
    parser.add_argument(
        "--step-s",
        metavar="S",
        type=float,
        default=0.05,
        help="a concurrent trace: seconds a scheduler step is taken to last, so 'arrival' d sends a request d x S after the previous one (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout",
        metavar="S",
        type=float,
        default=120.0,
        help="per-request timeout in seconds (default: %(default)s)",
    )
    parser.add_argument(
        "--rescale", action="store_true", help="map the case onto the server's block size where its pattern allows"
    )
    add_rule_argument(parser, what="retention rule of the target for a bare case")
    parser.add_argument(
        "--outputs",
        action="store_true",
        help="with --server: the output oracle, each request's greedy ids and top-5 logprobs against its cold twin (the same request with a fresh cache_salt); serial traces",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON (no secrets in it)")


def _api_key(name: str | None) -> str | None:
    if name is None:
        return None
    if not _ENV_NAME.match(name):
        raise invalid("--api-key-env", name, "must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
    value = os.environ.get(name)
    if not value:
        # Name the variable, never a value.
        raise InvalidArgument(
            f"--api-key-env={name}: the variable is unset or empty; allowed: a set, non-empty variable"
        )
    return value


def _engine_replay(args) -> int:
    try:
        module = importlib.import_module("fuzz.replaying.replay")
    except ModuleNotFoundError as e:
        if e.name not in ("fuzz.replaying.replay", "fuzz"):
            raise
        module = None
    fn = getattr(module, "replay_on_engine", None) if module else None
    show = getattr(module, "render_replay", None) if module else None
    if fn is None or show is None:
        raise Unsupported(
            f"--engine={args.engine}: in-process replay is not available in this kvspec (fuzz.replaying.replay.replay_on_engine); allowed: --server URL"
        )
    from ground.console import table_console
    from kvspec.engine_options import engine_specs

    if len(args.engine) > 1:
        raise invalid("--engine", args.engine, "replay takes one engine (a versions finding names its other engine)")
    result = fn(args.file, engine_specs(args)[0])  # the typed engine, parsed once at this edge
    show(result, table_console())
    if args.json:
        from ground.files import write_json_atomic

        write_json_atomic(args.json, result)
    verdict = result.get("verdict")
    if not isinstance(verdict, str) or verdict not in ENGINE_EXIT:
        raise Unsupported(f"verdict={verdict!r}: unknown to kvspec replay; allowed: {', '.join(ENGINE_EXIT)}")
    return ENGINE_EXIT[verdict]


def main(args) -> int:
    from kvspec.options import output_file, seconds

    seconds("--gap", args.gap, zero_ok=True, maximum=3600)
    seconds("--timeout", args.timeout)
    seconds("--step-s", args.step_s, zero_ok=True, maximum=60)
    if args.json:
        output_file("--json", args.json)
    if args.engine is not None:
        for flag, value in (
            ("--api-key-env", args.api_key_env),
            ("--send-key-in-clear", args.send_key_in_clear or None),
            ("--model", args.model),
            ("--rescale", args.rescale or None),
            ("--gap", None if args.gap == 1.0 else args.gap),
            ("--step-s", None if args.step_s == 0.05 else args.step_s),
            ("--rule", None if args.rule == "promise" else args.rule),
            ("--outputs", args.outputs or None),
        ):
            if value is not None:
                raise invalid(flag, value, "applies to --server only")
        return _engine_replay(args)
    for flag, value in (("--patch", args.engine_patches), ("--base", args.engine_bases)):
        if value:
            raise invalid(
                flag,
                next(iter(value.values())),
                "applies to --engine only (a build runs in-process, a server is what it is)",
            )

    from engine_adapter.live.client import check_base_url, check_key_transport
    from fuzz.replaying.live_replay import load_target, render, replay
    from ground.files import write_json_atomic

    key = _api_key(args.api_key_env)
    check_key_transport(
        check_base_url(args.server), key is not None, in_clear_ok=args.send_key_in_clear
    )  # before any connection
    target = load_target(args.file)
    report = replay(
        target,
        args.server,
        api_key=key,
        model=args.model,
        gap_s=args.gap,
        timeout_s=args.timeout,
        rescale=args.rescale,
        rule=args.rule,
        step_s=args.step_s,
        outputs=args.outputs,
    )
    if args.json:  # first: what was sent is on record whatever printing does
        try:
            write_json_atomic(args.json, report.as_dict())
        except OSError as e:
            raise invalid(
                "--json", args.json, f"cannot be written ({e.strerror or e}); allowed: a writable path"
            ) from None
    render(report)
    return EXIT[report.verdict]
