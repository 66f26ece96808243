"""kvspec run CASE.json [--engine vllm==X] [--compare [--rule R]] [--install] [--mode M]

Runs a case on the REAL vLLM scheduler (engine_adapter) and prints what it
observed, in the shape of ``kvspec predict``::

    {"engine": "vllm==X", "hits": [...], "queries": [...], "knobs": {...},
     "explain": [...], "timing": {...}}

plus ``"error": {...}`` when vLLM raised on the case (a finding: exit 1).

``--compare`` also runs the reference model with the same version's knobs
(``kvspec predict --as vllm==X --rule R``; R defaults to the variant that
states what that version implements: ``legacy`` for 0.29.x, ``replay`` for
0.30.0 and later) and prints both side by side per request. A deployment
case is predicted on the geometry this engine resolved for it (the run's
``resolution``). The verdict is kvspec's one judge's (:mod:`fuzz.judge.verdict`)
for a bare case against a target: it *agrees* when every request's hits and
queries equal the prediction and every shared knob does, else it
*diverges*. ``--json`` prints the comparison as JSON instead of a table.

Exit status: 0 ran (and, with --compare, agrees); 1 vLLM raised, or
--compare diverges; 2 bad input or engine not available (one line); 3 the
engine did not run the case (a worker that died or timed out, an adapter
exception: kvspec's own failure, never vLLM's; one line).
"""

from __future__ import annotations

import json
import sys

from engine_adapter.host.versions import DEFAULT_ENGINE, family_of
from engine_adapter.models.served import check_case_model
from fuzz.judge.oracle_resolution import COMPARED_KNOBS
from ground.engines import FAMILIES, Capability, load
from kvspec.options import seconds
from kvspec.rule_option import add_rule_argument
from kvspec.switches import add_switches
from reference.case import is_concurrent, load_case
from reference.knobs import implemented_rule

HELP = "run a case on the real engine's scheduler and cache (CPU: vLLM, or SGLang with --engine sglang==X) and print the observed hits; --compare with the reference"


def configure(parser) -> None:
    parser.add_argument("case", help="case file (JSON, schema 1) or a finding file")
    from kvspec.engine_options import add_engine_arguments

    add_engine_arguments(
        parser,
        help=f'engine to run (default: {DEFAULT_ENGINE}): vllm==X, a build vllm==X+LABEL.HASH, path:DIR, wheel:FILE.whl, or sglang==0.5.23 (a deployment case with "engine": "sglang")',
    )
    parser.add_argument(
        "--compare", action="store_true", help="print reference vs observed per request; exit 1 on a mismatch"
    )
    add_rule_argument(
        parser,
        what="reference retention rule for --compare",
        auto="the variant this version implements; for a build (--patch, path:, wheel:): promise",
    )
    add_switches(
        parser,
        {
            "--json": "with --compare: print JSON instead of a table",
            "--install": "install the engine environment first if missing",
        },
    )
    parser.add_argument(
        "--mode",
        choices=("auto", "inprocess", "worker", "warm"),
        default="auto",
        help="in-process (this interpreter's vLLM), the version's warm engine (started on first use, shared by later commands; auto uses it unless KVSPEC_WARM=0) or a worker of this command's own (default: auto)",
    )
    parser.add_argument(
        "--eagle-groups",
        choices=("auto", "all", "draft"),
        default="auto",
        help="which KV cache groups take the EAGLE drop (default: as this version's engine flags them)",
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, metavar="S", help="seconds the case may take (default: %(default)s)"
    )
    parser.add_argument(
        "--tree-core",
        choices=("python", "rust"),
        default="python",
        help="SGLang only: which tree core its UnifiedRadixCache runs (default: %(default)s)",
    )


def _render(
    reference: dict, observed: dict, mismatches: list[dict], engine: str, rule: str, oracle_notes: list[str], verdict
) -> None:
    """The reference-vs-observed table; a request the model does not
    predict (``concurrent``: it shared scheduler steps) shows the
    observation alone, and ``oracle_notes`` what the oracles that judge it
    said. The last line is the judge's ``verdict`` (:func:`fuzz.judge.verdict.judge`)."""
    from rich.table import Table

    from ground.console import table_console

    console = table_console()
    bad_requests = {m.get("request") for m in mismatches if "request" in m}
    table = Table(title=f"reference (--as {engine} --rule {rule}) vs observed ({engine})")
    who = FAMILIES[family_of(engine)].title
    for col in (
        "",
        "req",
        "tokens",
        "hit ref",
        f"hit {who}",
        "junction ref",
        f"junction {who}",
        "chunk ends ref",
        f"chunk ends {who}",
        "Mamba kept ref",
        f"Mamba kept {who}",
    ):
        table.add_column(
            col, justify="right" if col in ("req", "tokens", "hit ref", f"hit {who}") else "left", no_wrap=col == ""
        )
    rex, oex = reference.get("explain") or [], observed.get("explain") or []
    for i in range(max(len(rex), len(oex))):
        r = (rex[i] if i < len(rex) else None) or {}
        o = oex[i] if i < len(oex) else {}
        mark = "[red]MISMATCH[/red]" if i in bad_requests else "[green]ok[/green]" if r else "[cyan]concurrent[/cyan]"
        table.add_row(
            mark,
            str(i),
            str(r.get("prompt_tokens", o.get("prompt_tokens", ""))),
            str(r.get("hit", "")),
            str(o.get("hit", "")),
            str(r.get("junction", "")),
            str(o.get("junction", "")),
            " ".join(map(str, r.get("chunk_ends", []))),
            " ".join(map(str, o.get("chunk_ends", []))),
            json.dumps(r.get("retained_mamba_blocks", {}), separators=(",", ":")),
            json.dumps(o.get("retained_mamba_blocks", {}), separators=(",", ":")),
        )
    console.print(table)
    knobs = Table(title="knobs")
    for col in ("", "knob", "reference", who):
        knobs.add_column(col, no_wrap=True)
    rk, ok = reference.get("knobs") or {}, observed.get("knobs") or {}
    for k in COMPARED_KNOBS if observed.get("knobs") is not None else ():  # SGLang reports no vLLM knobs
        if k in rk or k in ok:
            same = rk.get(k) == ok.get(k)
            knobs.add_row(
                "[green]ok[/green]" if same else "[red]MISMATCH[/red]", k, str(rk.get(k, "-")), str(ok.get(k, "-"))
            )
    console.print(knobs)
    for note in oracle_notes:
        console.print(f"[red]{note}[/red]", markup=True, highlight=False)
    if len(rex) > reference.get("predicted", len(rex)) and verdict.verdict == "agrees":
        console.print(
            f"requests {reference['predicted']}..{len(rex) - 1} shared scheduler steps: the model predicts none of them; "
            "none resumes past what a request sent before it computed; no oracle that judges concurrent steps fires (stale, block_table)"
        )
    if observed.get("error"):
        e = observed["error"]
        console.print(f"[red]{who} raised[/red] in {e.get('phase')} (request {e.get('request')}): {e.get('message')}")
    if observed.get("resolution") and observed["resolution"].get("geometry"):
        g = observed["resolution"]["geometry"]
        console.print(
            f"deployment resolved by {engine}: scheduler block {g['scheduler_block_size']}, hash block {g['hash_block_size']}",
            highlight=False,
        )
    if verdict.verdict == "agrees":  # the judge's verdict (it agrees only where nothing mismatches)
        console.print(f"[green]reference and {who} agree[/green]")
    else:
        console.print(f"[red]{len(mismatches)} mismatch(es): {verdict.verdict}[/red]")
        for reason in verdict.reasons:
            console.print(f"  - {reason}", highlight=False)


def _sglang_reference(case, observed: dict, name: str, rule: str, judged) -> tuple[dict, list[str]]:
    """SGLang's reference: its implemented rule (``replay``,
    :mod:`reference.sglang_prefill`, on the resolution the engine
    reported), or the promise, where a hit above it by a state SGLang's
    prefill legitimately wrote is the target (not a divergence;
    :func:`reference.sglang_prefill.legitimately_above`)."""
    from reference.predict import predict
    from reference.sglang_prefill import SglangSetting, legitimately_above, serial_steps
    from reference.sglang_prefill import predict as sglang_predict

    setting = SglangSetting.from_resolution(observed["resolution"])
    if rule == "replay":
        return sglang_predict(case, setting, name), []
    if rule != "promise" or judged.geometry is None:
        return None, []  # the caller's one-line refusal (no promise under no_buffer), or a rule SGLang has not
    reference = predict(judged, name, rule)
    above = legitimately_above(reference["hits"], observed, serial_steps(case, setting))
    hits = list(reference["hits"])
    for i, note in above.items():
        hits[i] = observed["hits"][i]
    return {**reference, "hits": hits}, [f"request {i}: {note}" for i, note in sorted(above.items())]


def main(args) -> int:
    from ground.errors import invalid
    from kvspec.engine_options import engine_specs

    seconds("--timeout", args.timeout)
    if args.engine and len(args.engine) > 1:
        raise invalid("--engine", args.engine, "run takes one engine")
    case = load_case(args.case)
    check_case_model(case)  # a config naming code: one line before any engine starts
    spec = engine_specs(args, default=DEFAULT_ENGINE)[0]  # the name parsed once, there
    version = spec.version
    family = spec.family_entry
    name, title = spec.name, family.title
    if (case.deployment is not None and case.deployment.engine != spec.family) or (
        case.deployment is None and not family.supports(Capability.GEOMETRY)
    ):
        raise invalid(
            "--engine",
            spec.name,
            f"the case's deployment is for {case.deployment.engine if case.deployment else 'vllm (a hand geometry)'}; allowed: an engine of that family",
        )
    reference = None
    # a build is compared with kvspec's promise: the implemented rule is its release's
    rule = ("promise" if spec.is_build else implemented_rule(version)) if args.rule == "auto" else args.rule
    if family.own_rule and args.rule == "auto" and not spec.is_build:
        rule = load(
            family.own_rule
        )  # the family's own model of the rule it implements (SGLang: reference.sglang_prefill)
    from reference.predict import predict

    if args.compare and case.geometry is not None and case.deployment is None:
        reference = predict(case, spec, rule)  # its one-line errors exit 2 before any engine work
    from engine_adapter.host import warm
    from engine_adapter.host.engine import open_engine

    with open_engine(spec, mode=args.mode, install=args.install, warm=warm.enabled()) as engine:
        # the options its driver takes; "cold" (a cold engine beside the cached one) comes with --compare
        options = {
            option: bool(args.compare) if option == "cold" else getattr(args, option) for option in family.run_options
        }
        if engine.mode in ("worker", "warm"):
            observed = engine.run(case, options, timeout=args.timeout)
        else:
            observed = engine.run(case, options)
    from fuzz.judge.verdict import harness_error_of

    harness = harness_error_of(observed)
    if harness is not None:
        print(json.dumps(observed, indent=2))
        sys.stdout.flush()
        print(
            f"kvspec: engine={name}: did not run the case (kvspec's own failure, not {title}'s): {' '.join(harness.split())[:300]}",
            file=sys.stderr,
        )
        return 3
    if not args.compare:
        print(json.dumps(observed, indent=2))
        return 1 if observed.get("error") else 0
    if family.comparer:  # a family with its own rule and table (llama.cpp: kvspec/llamacpp_compare.py)
        return load(family.comparer)(case, observed, name, args.json)
    from fuzz.judge.oracles import resolved
    from fuzz.judge.verdict import Target, differences, judge

    judged = resolved(case, observed, version)
    rule_notes: list[str] = []
    if reference is None and family.own_reference and observed.get("resolution") and not observed.get("error"):
        reference, rule_notes = load(family.own_reference)(case, observed, name, rule, judged)
        if reference is not None:  # the family's rule, like the promise, predicts only up to pressure
            reference = _past_pressure(judged, observed, reference)
    if reference is None:
        if (
            judged.geometry is None
            and not family.supports(Capability.EVERY_CACHE_STATED)
            and observed.get("resolution")
        ):
            from ground.errors import Unsupported

            raise Unsupported(
                f"--compare: {title} resolved {case.deployment.describe()} to a cache the promise is not stated for "
                f"(strategy {observed['resolution'].get('mamba_radix_cache_strategy')}: a state only where a prefill ends); allowed: run without --compare"
            )
        if judged.geometry is None:  # the engine raised before it resolved the deployment
            reference = {"rule": rule, "hits": [], "queries": [], "knobs": {}, "explain": []}
        else:
            reference = _past_pressure(judged, observed, predict(judged, spec, rule))
    mismatches = differences(reference, observed)
    rk = reference.get("knobs") or {}
    # What the model does not predict (a concurrent trace past its serial
    # prefix) the oracles that state the rules of concurrent steps judge.
    # A hit above the target is judged by the safety oracles, as fuzz and
    # check-build judge it (fuzz.judge.verdict: one verdict).
    concurrent = []
    if judged.geometry is not None:
        from fuzz.judge.oracles import CONCURRENT_ORACLES, SAFETY_ORACLES, check_all, oracles_for

        asked = (
            tuple(o for o in CONCURRENT_ORACLES if o not in ("knobs", "versions", "resolution"))
            if is_concurrent(case)
            else ()
        )
        concurrent = check_all(  # the typed engine, never its key to parse again
            judged, spec, observed, None, oracles_for(version, tuple(dict.fromkeys(asked + SAFETY_ORACLES)))
        )
    elif not observed.get("error"):  # no geometry the promise is stated for: safety still, a resumed state's content
        from fuzz.judge.oracles import check_resumed_state

        concurrent = check_resumed_state(judged, version, observed)
    verdict = judge(
        Target(
            reference["hits"],
            rule,
            reference["queries"],
            {k: rk[k] for k in COMPARED_KNOBS if k in rk},
            reference.get("bounds"),
        ),
        observed,
        concurrent,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "engine": name,
                    "rule": rule,
                    "verdict": verdict.verdict,
                    "reasons": verdict.reasons,
                    "reference": reference,
                    "observed": observed,
                    "mismatches": mismatches,
                },
                indent=2,
            )
        )
    else:
        _render(
            reference,
            observed,
            mismatches,
            name,
            rule,
            [f"{d.oracle} fires at request {d.first}: {d.detail}" for d in concurrent] + rule_notes,
            verdict,
        )
    sys.stdout.flush()
    return verdict.exit_code


def _past_pressure(case, observed: dict, reference: dict) -> dict:
    """Under pressure (a request evicted or was preempted:
    ``fuzz.judge.oracles.before_pressure``) the model predicts the requests before
    it and none after (docs/judge.md, "Under pressure"): there, as past a
    concurrent trace's serial prefix, the oracles that hold judge them,
    and no request resumes past what was sent before it
    (``reference.predict.resume_bounds``)."""
    from fuzz.judge.oracles import before_pressure
    from reference.predict import resume_bounds

    k = before_pressure(case, observed)
    if k is None or not reference.get("hits"):
        return reference
    n = len(reference["hits"])
    old = reference.get("bounds") or [None] * n
    upper = resume_bounds(case)
    return {
        **reference,
        "hits": [h if i < k else None for i, h in enumerate(reference["hits"])],
        "bounds": [old[i] if i < k else upper[i] for i in range(n)],
    }
