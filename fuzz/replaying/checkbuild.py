"""The custom-build guard behind ``kvspec check-build``: does a vLLM build
(a release, a patched release, a local tree, a wheel) keep kvspec's promises?

It runs, on the one engine, in this order until the time is spent:

1. the examples that name a deployment or a vLLM bug class
   (``examples/*deployment*.json``, ``r1-*``, ``r2-*``, ``dense-*``,
   ``stale-*``) and a cache under pressure (``pressure-*``: a pinned pool
   that evicts and preempts);
2. the proofs' boundary cases (``spec.seeds.boundary_cases``: z3's
   counterexamples and witnesses per geometry class), mapped onto real
   deployments (``fuzz.draw.seeds.on_deployments``), interleaved by speculative
   mode so every mode is reached early, then each again with a KV
   connector (``fuzz.draw.seeds.with_connector``: a load is part of the hit);
3. a short random campaign over deployments (``fuzz.driving.drivers.run_random``).

Every case is judged by the oracles that judge a build
(``fuzz.judge.oracles.oracles_for``: promise, stale, retention, split,
checkpoint, hit_blocks, shared_prefix, block_table, resolution,
sparse_dense, spec_on_off, engine_error) plus
``junction``; never by the release's own rule. Each
finding is sorted into the promise it breaks (:func:`promise_of`):

* ``R1`` an identical resend resumes where dense retention would;
* ``R2`` a longer sibling (an earlier prompt is its prefix) does too;
* ``junction`` a sibling diverging inside an earlier prompt hits its
  divergence point once the junction was observed (the promise's prediction);
* ``no-stale`` no request hits more than the Mamba states a prefill wrote
  allow (the ``stale`` oracle, and any hit above the expected one);
* ``retention`` sparse retention keeps no state a later request cannot
  resume at and none inside an output, periodic retention every segment
  end a prefill wrote (the ``retention`` oracle);
* ``split`` a prefill chunk ends only where a Mamba state must be cached,
  and no step after the prefill is cut short (the ``split`` oracle);
* ``checkpoint`` a prompt's last chunk whose checkpoint the kernel can
  export runs to the end in one step (the ``checkpoint`` oracle);
* ``hit-blocks`` a request takes exactly the full-attention blocks its hit
  covers (the ``hit_blocks`` oracle);
* ``shared-prefix`` the junction a request reports lies above its hit and
  within what full attention can have cached for it (the ``shared_prefix``
  oracle);
* ``block-table`` a running request's Mamba block table holds no block it
  freed, and none below the state it resumes each step from that the
  cache does not hold either; a finished request leaves no block
  referenced (the ``block_table`` oracle);
* ``flags`` the build applies the flags it accepts as vLLM documents them
  (``--prefix-match-unit`` is the hash block; the ``resolution`` oracle);
* ``errors`` vLLM raises on no case the model accepts.

The verdict: 0 every promise held, 1 a promise failed (its first
counterexample rendered), 3 the harness failed (the engine could not start,
nothing ran, or harness errors above the limit).

**Against a baseline** (``against="0.33.0"``: the release a patch sits on,
which may break promises already): every finding's case is judged on the
baseline too (``fuzz.driving.campaign.Campaign.fails_on_baseline``), and a row reads
``FAIL (new)`` when the build breaks the promise on a case the baseline
keeps it on, ``fails on baseline too`` when every counterexample of the row
fails the same way on the baseline, ``pass`` otherwise. The exit code
follows what is new: 1 only for a new failure, so a fork's CI sees its own
regression beside the release's known bugs.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from fuzz.judge.oracle_registry import KNOWN_ORACLES
from fuzz.judge.oracles import request_kinds
from ground.engines import FAMILIES, EngineSpec, load
from reference.case import Case, parse_case

ROOT = Path(__file__).resolve().parents[2]
#: (id, short name, what is promised)
PROMISES = (
    (
        "R1",
        "identical resend",
        "an identical resend resumes where dense retention would, with or without speculative decoding",
    ),
    ("R2", "longer sibling", "a prompt that extends an earlier one resumes where dense retention would"),
    (
        "junction",
        "junction",
        "a sibling diverging inside an earlier prompt hits its divergence point once that junction was observed",
    ),
    ("no-stale", "no stale states", "no request hits beyond the Mamba states its prefills wrote"),
    (
        "safety",
        "no unsafe reuse",
        "no request resumes at or past the last prompt position it must compute, over tokens no earlier request keyed (lookahead tokens included), or from a state computed over other tokens",
    ),
    (
        "retention",
        "retention",
        "sparse retention keeps only states a later request can resume at, none inside an output; periodic retention keeps every segment end a prefill wrote",
    ),
    (
        "split",
        "chunk ends",
        "a prefill chunk ends only on the hash grid, at the junction, at the chunk budget or at the prompt's end; no later step is cut short",
    ),
    (
        "checkpoint",
        "checkpoints",
        "a prompt's last chunk whose checkpoint the kernel can export from inside it is not split",
    ),
    (
        "hit-blocks",
        "hit blocks",
        "a request takes from the cache exactly the full-attention blocks its hit covers, no more and no fewer",
    ),
    (
        "shared-prefix",
        "junction reach",
        "the junction a request reports lies above its hit and within its common prefix with an earlier request",
    ),
    (
        "block-table",
        "Mamba block table",
        "a running request holds no Mamba block it freed, nor one below the state it resumes from that the cache does not hold; a finished request leaves no block referenced",
    ),
    (
        "flags",
        "flags applied",
        "the build applies the flags it accepts as vLLM documents them: --prefix-match-unit is the hash block size",
    ),
    ("errors", "no engine errors", "the engine raises on no case the model accepts"),
)
EXIT_PASS, EXIT_FAIL, EXIT_HARNESS = 0, 1, 3


def promise_of(finding: dict) -> str:
    """The promise a finding breaks (one of :data:`PROMISES`' ids)."""
    oracle = finding.get("oracle")
    if oracle == "engine_error":
        return "errors"
    if oracle in (
        "stale",
        "resumed_state",
    ):  # resumed_state: a state's content is not its key's tokens (SGLang's driver reads it)
        return "no-stale"
    if oracle in ("cap", "keys", "draft_keys", "resumed_state"):
        return "safety"
    if oracle == "resolution":
        return "flags"
    if oracle in ("retention", "split", "checkpoint"):
        return oracle
    if oracle in ("hit_blocks", "shared_prefix", "block_table"):
        return oracle.replace("_", "-")
    case = parse_case(finding["case"])
    i = finding.get("first_divergence")
    exp = (finding.get("expected") or {}).get("hits") or []
    obs = (finding.get("observed") or {}).get("hits") or []
    if i is None or i >= len(exp) or i >= len(obs):
        return "errors"
    if obs[i] > exp[i]:
        return "no-stale"
    kind = request_kinds(case)[i]
    if oracle == "junction" or kind == "sibling":
        return "junction"
    return {"resend": "R1", "extension": "R2"}.get(kind, "no-stale")


#: The examples check-build runs first, per engine family (``examples/README.md``).
EXAMPLE_PATTERNS = {
    "vllm": ("*deployment*", "r1-*", "r2-*", "dense-*", "stale-*", "pressure-*", "*-chat-decode-*"),
    "sglang": ("sglang-*",),
}


def example_cases(root: Path = ROOT, family: str = "vllm") -> list[tuple[str, Case]]:
    """The examples check-build runs first: for vLLM every deployment
    example and every example of a vLLM bug class (``r1-``, ``r2-``,
    ``dense-``, ``stale-``), of a pinned pool (``pressure-``) or of a
    scheduler (``async-``/``sync-chat-decode-``); for SGLang
    its own (``sglang-*``)."""
    from fuzz.results.findings import load_finding

    paths = sorted({p for pattern in EXAMPLE_PATTERNS[family] for p in root.glob(f"examples/{pattern}.json")})
    return [(str(p.relative_to(root)), load_finding(p)[0]) for p in paths]


def interleave(cases: list[Case]) -> list[Case]:
    """Round-robin over the cases' speculative modes (the deployment's
    ``--speculative-config``), so a short run reaches each mode early."""
    groups: dict[str, list[Case]] = {}
    for c in cases:
        key = "off"
        if c.deployment is not None:
            args = list(c.deployment.vllm_args)
            if "--speculative-config" in args:
                key = args[args.index("--speculative-config") + 1]
        elif c.speculative is not None:
            key = c.speculative.method
        groups.setdefault(key, []).append(c)
    out: list[Case] = []
    queues = list(groups.values())
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


@dataclass
class BuildReport:
    engine: str
    rows: list[dict] = field(default_factory=list)
    counterexamples: dict[str, str] = field(
        default_factory=dict
    )  # promise id -> finding path (new ones, against a baseline)
    against: str | None = None  # the baseline engine's name, or None
    known: dict[str, str] = field(default_factory=dict)  # promise id -> a finding the baseline fails too
    phases: list[dict] = field(default_factory=list)
    execs: int = 0
    harness_errors: int = 0
    rejected: int = 0
    unsupported: int = 0
    elapsed_s: float = 0.0
    first_failure_s: float | None = None
    exit_code: int = EXIT_PASS
    reason: str = ""
    out: str = ""

    def as_dict(self) -> dict:
        return {
            k: getattr(self, k)
            for k in (
                "engine",
                "against",
                "exit_code",
                "reason",
                "rows",
                "counterexamples",
                "known",
                "phases",
                "execs",
                "harness_errors",
                "rejected",
                "unsupported",
                "elapsed_s",
                "first_failure_s",
                "out",
            )
        }


def check_build(
    engine: EngineSpec | str,
    *,
    out: Path,
    max_time: float = 45.0,
    cases_time: float = 240.0,
    seed: int = 1,
    fail_fast: bool = False,
    shrink_calls: int = 12,
    progress=None,
    harness_error_limit: float | None = None,
    started: float | None = None,
    against: EngineSpec | str | None = None,
) -> BuildReport:
    """Run check-build on ``engine`` (a ready engine, typed: the command
    parsed it at its edge; a test's name is read once here) and return the
    report; with ``against`` (a ready engine, typed or the name its build
    gave: the baseline) each failure is sorted into new or shared with the
    baseline."""
    from engine_adapter import open_engine
    from engine_adapter.host.versions import spec_of
    from fuzz.draw.seeds import load_seed_cases, on_deployments, seed_dir, with_connector
    from fuzz.driving.campaign import Campaign
    from fuzz.driving.drivers import BoundedEngine, run_random
    from fuzz.driving.outcome import HARNESS_ERROR_LIMIT, outcome
    from ground.errors import EngineError
    from ground.home import kvspec_home

    say = progress or (lambda line: None)
    started = time.monotonic() if started is None else started
    spec = spec_of(engine, "--engine")
    base_spec = None if against is None else spec_of(against, "--against")
    against = None if base_spec is None else base_spec.name  # what the report and its lines say
    engine_name = spec.name
    report = BuildReport(engine_name, out=str(out), against=against)
    deadline = started + cases_time + max_time
    baseline = None
    try:
        engine = open_engine(spec)
        if base_spec is not None:
            baseline = open_engine(base_spec)
    except EngineError as e:
        report.exit_code, report.reason = EXIT_HARNESS, f"the engine cannot be opened: {e}"
        return report
    findings_order: list[str] = []

    def on_finding(path: Path, finding: dict) -> None:
        findings_order.append(str(path))
        pid = promise_of(finding)
        if (finding.get("baseline") or {}).get("fails_too"):
            if pid not in report.known:
                report.known[pid] = str(path)
                say(
                    f"[check-build] {pid}: fails on the baseline too ({against}) at {time.monotonic() - started:.0f}s: {finding.get('summary', '')}"
                )
            return
        if pid not in report.counterexamples:
            report.counterexamples[pid] = str(path)
            if report.first_failure_s is None:
                report.first_failure_s = round(time.monotonic() - started, 1)
            say(
                f"[check-build] {pid}: FAIL{' (new)' if against else ''} at {time.monotonic() - started:.0f}s: {finding.get('summary', '')}"
            )

    bounded = BoundedEngine(engine, deadline)
    campaign = Campaign(
        bounded,
        out,
        oracles=KNOWN_ORACLES,
        seed=seed,
        shrink_calls=shrink_calls,
        on_finding=on_finding,
        deadline=deadline,
        baseline=None if baseline is None else BoundedEngine(baseline, deadline),
    )

    def stop() -> bool:
        return time.monotonic() >= deadline or (fail_fast and bool(report.counterexamples))

    try:
        say(f"[check-build] {engine_name}: starting the engine" + (f" and the baseline {against}" if against else ""))
        for e in (engine, baseline):
            if e is not None and hasattr(e, "start"):
                e.start()

        def check_each(cases: list[Case], until: float) -> int:
            """Check ``cases`` in order until ``until`` or stop(); how many were checked."""
            n = 0
            for case in cases:
                if stop() or time.monotonic() >= until:
                    break
                campaign.check(case)
                n += 1
            return n

        t = time.monotonic()
        family = spec.family
        examples = example_cases(family=family)
        n = check_each([case for _name, case in examples], deadline)
        report.phases.append(
            {"phase": "examples", "cases": n, "of": len(examples), "seconds": round(time.monotonic() - t, 1)}
        )
        say(f"[check-build] examples: {n} cases in {time.monotonic() - t:.0f}s")
        t = time.monotonic()
        own_cases = FAMILIES[family].boundary_cases
        if own_cases:  # the family's own boundary cases (SGLang: from its grid rule, fuzz.draw.generate_sglang)
            mapped = load(own_cases)(campaign.resolver)
        else:
            seeds = [c for c in load_seed_cases(seed_dir(kvspec_home())) if c.deployment is None]
            mapped = interleave(on_deployments(seeds, campaign.resolver))
            mapped += with_connector(mapped)  # the same boundaries with a KV connector's load in the hit
        n = check_each(mapped, min(deadline, started + cases_time))
        report.phases.append(
            {"phase": "boundary cases", "cases": n, "of": len(mapped), "seconds": round(time.monotonic() - t, 1)}
        )
        say(f"[check-build] boundary cases on deployments: {n} of {len(mapped)} in {time.monotonic() - t:.0f}s")
        t = time.monotonic()
        before = campaign.stats.execs
        if not stop():
            left = max(0.0, min(max_time, deadline - time.monotonic()))
            if fail_fast:
                run_random(campaign, seed, max_time=left, stop_on_finding=True)
            else:
                run_random(campaign, seed, max_time=left)
        report.phases.append(
            {
                "phase": "campaign",
                "driver": "random",
                "runs": campaign.stats.execs - before,
                "seconds": round(time.monotonic() - t, 1),
            }
        )
        say(
            f"[check-build] campaign (random, deployments): {campaign.stats.execs - before} runs in {time.monotonic() - t:.0f}s"
        )
    finally:
        for e in (engine, baseline):
            if e is not None:
                e.close()
    s = campaign.stats
    report.execs, report.harness_errors, report.rejected, report.unsupported = (
        s.execs,
        s.harness_errors,
        s.rejected,
        s.unsupported,
    )
    report.elapsed_s = round(time.monotonic() - started, 1)
    failed = set(report.counterexamples)
    stopped_early = fail_fast and bool(failed)
    for pid, name, what in PROMISES:
        if pid in failed:
            verdict = "FAIL (new)" if against else "FAIL"
        elif pid in report.known:
            verdict = "fails on baseline too"
        else:
            verdict = "not checked" if stopped_early else "pass"
        report.rows.append(
            {
                "promise": pid,
                "name": name,
                "what": what,
                "verdict": verdict,
                "new": pid in failed if against else None,
                "counterexample": report.counterexamples.get(pid) or report.known.get(pid),
            }
        )
    code, why = outcome(
        execs=s.execs,
        harness_errors=s.harness_errors,
        new_findings=len(s.findings),
        workers_died=0,
        limit=HARNESS_ERROR_LIMIT if harness_error_limit is None else harness_error_limit,
    )
    if code == 3:
        report.exit_code, report.reason = EXIT_HARNESS, f"harness failed: {why}"
    elif failed:
        report.exit_code = EXIT_FAIL
        report.reason = (
            "promise(s) broken where the baseline keeps them: " if against else "promise(s) broken: "
        ) + ", ".join(pid for pid, _n, _w in PROMISES if pid in failed)
    elif report.known:
        report.exit_code = EXIT_PASS
        report.reason = f"nothing new against {against}; the baseline fails too: " + ", ".join(
            pid for pid, _n, _w in PROMISES if pid in report.known
        )
    else:
        report.exit_code, report.reason = EXIT_PASS, "every promise held"
    return report


def render(report: BuildReport) -> list[str]:
    """The report as text: one row per promise, then each failing promise's
    first counterexample (the finding, rendered)."""
    from fuzz.results.findings import render as render_finding

    lines = [f"kvspec check-build: {report.engine}" + (f" against {report.against}" if report.against else "")]
    for p in report.phases:
        if p["phase"] == "campaign":
            lines.append(f"  {p['phase']}: {p['runs']} runs ({p['driver']}, deployments) in {p['seconds']}s")
        else:
            lines.append(f"  {p['phase']}: {p['cases']} of {p['of']} cases in {p['seconds']}s")
    lines.append(
        f"  runs {report.execs}, rejected by the engine {report.rejected}, unsupported {report.unsupported}, harness errors {report.harness_errors}; {report.elapsed_s}s"
    )
    lines.append("")
    pw, width = max(len(p) for p, _n, _w in PROMISES), max(len(n) for _p, n, _w in PROMISES)
    for row in report.rows:
        lines.append(f"  {row['promise']:<{pw}} {row['name']:<{width}}  {row['verdict']}")
    for pid, _n, _w in PROMISES:
        path = report.counterexamples.get(pid)
        if path is None:
            continue
        lines += [
            "",
            f"first counterexample for {pid}{' (new: the baseline keeps this promise on it)' if report.against else ''} ({path}):",
        ]
        try:
            lines += ["  " + x for x in render_finding(json.loads(Path(path).read_text())).splitlines()]
        except (OSError, ValueError) as e:
            lines.append(f"  (cannot read it: {e})")
    if report.known:
        lines += ["", f"failing on the baseline {report.against} too (its known bugs, not this build's):"]
        lines += [f"  {pid}: {report.known[pid]}" for pid, _n, _w in PROMISES if pid in report.known]
    lines += ["", f"verdict: exit {report.exit_code}: {report.reason}"]
    return lines
