"""The one judge: does an observation reproduce a finding (or agree with a
bare case's target)?

Every kvspec command that prints a verdict takes it from :func:`judge`:
in-process replay (``kvspec replay FINDING --engine``, :mod:`fuzz.replaying.replay`),
live replay (``kvspec replay FINDING --server``,
:mod:`fuzz.replaying.live_replay`, which first applies its own rules for a
noisy server), ``kvspec run --compare`` and ``kvspec matrix``. So
"reproduced" means one thing everywhere.

**A finding is reproduced** when, on the observation, *the same oracle fires,
at the same first diverging request, with the same observed hits*:

* with the oracles evaluated on the observation (an engine that reports
  knobs and explain, i.e. an in-process or worker engine;
  :func:`divergences` evaluates the finding's oracle on the case as judged,
  a deployment with the geometry this engine resolved): the finding's oracle
  is among the divergences; its first diverging request equals the finding's
  ``first_divergence`` (``None`` for ``knobs``, the request that raised for
  ``engine_error``, which also needs the same exception type); and the
  observed hits equal the finding's observed hits at every request. For a
  ``versions`` finding both engines' hits are observed: the engine under
  test's must equal the finding's ``observed`` hits and the other engine's
  the finding's ``expected`` hits (the finding names the other engine);
* with hits only (a live server, whose Prometheus counters give nothing
  else), "the same oracle fires" reads: the observed hits equal the
  finding's observed hits at every request, and differ from the finding's
  expected hits at its first divergence. A ``knobs`` finding, or one that
  states no expected hits there, cannot be judged from hits: inconclusive.

Otherwise it is **not reproduced**, with the reasons (the oracle does not
fire; it fires first at another request; request i hit a, the finding b;
vLLM raised now). It is **inconclusive** when the observation is not vLLM's
behaviour: an error of any kind but ``vllm`` (a worker that died or timed
out, an exception in kvspec's adapter) in either engine's observation
(:func:`harness_error_of`: kvspec's own failures are never
vLLM's). Live replay adds its own inconclusive rules before asking the
judge (foreign traffic, restarts, knobs that differ, ...). A case the
reference model cannot judge on that version (``Unsupported``) is
inconclusive too.

**A bare case** (no finding) **agrees** or **diverges**:

* against a :class:`Target` (the hits a reference rule predicts, and
  optionally the queries and knobs; ``kvspec run --compare``, a bare case
  replayed live): it agrees when every request's observed hits (and queries)
  equal the target's and every knob both report is equal; vLLM raising
  diverges. Against the promise (rule ``promise``) with the oracles
  evaluated, a hit *above* the target is judged as ``fuzz`` and
  ``check-build`` judge it, by the safety oracles
  (:data:`fuzz.judge.oracle_registry.SAFETY_ORACLES`: ``cap``, ``keys``,
  ``draft_keys``, ``stale``, ``resumed_state``) and never by the promise's
  number alone: it diverges only when one of them fires;
* with the oracles evaluated (``kvspec replay CASE --engine``,
  ``kvspec matrix``): it agrees when no oracle fires.

Exit codes (:data:`EXIT`): 0 reproduced / agrees, 1 not reproduced /
diverges, 3 inconclusive.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fuzz.judge.oracle_registry import KNOWN_ORACLES, NOT_BY_COUNTERS, SINGLE_ENGINE_ORACLES
from fuzz.judge.oracles import (
    COMPARED_KNOBS,
    Divergence,
    check_all,
    check_resolution,
    check_versions,
    oracles_for,
    resolved,
)
from ground.engines import FAMILIES, EngineSpec, version_key
from ground.errors import Unsupported, invalid
from reference.case import Case

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
AGREES = "agrees"
DIVERGES = "diverges"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, AGREES, DIVERGES)
EXIT = {REPRODUCED: 0, AGREES: 0, NOT_REPRODUCED: 1, DIVERGES: 1, INCONCLUSIVE: 3}


def _hits(value, where: str) -> list | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
        raise invalid(where, value, "must be a list of hit counts")
    return list(value)


@dataclass(frozen=True)
class Claim:
    """What a finding claims, in the judge's terms."""

    oracle: str
    #: The first diverging request (None for ``knobs``).
    first: int | None
    #: The hits the engine under test showed.
    observed: list | None
    #: The finding's expected hits (the model's, or the other engine's for ``versions``).
    expected: list | None
    #: ``engine_error``: the exception type vLLM raised.
    error_type: str | None = None
    #: ``versions``: the other engine's version.
    other_version: str | None = None

    @classmethod
    def of(cls, finding: dict) -> Claim:
        """The claim of a finding (schema 1 or 2); a malformed one is one line."""
        oracle = finding.get("oracle")
        if not isinstance(oracle, str) or oracle not in KNOWN_ORACLES:
            raise invalid("finding.oracle", oracle, f"allowed: {', '.join(KNOWN_ORACLES)}")
        observed_part = finding.get("observed") or {}
        expected_part = finding.get("expected") or {}
        if not isinstance(observed_part, dict) or not isinstance(expected_part, dict):
            raise invalid("finding.observed", observed_part, "must be an object with 'hits'")
        observed = _hits(observed_part.get("hits"), "finding.observed.hits")
        expected = None if oracle == "knobs" else _hits(expected_part.get("hits"), "finding.expected.hits")
        if "first_divergence" in finding:
            first = finding["first_divergence"]
            if first is not None and (not isinstance(first, int) or isinstance(first, bool) or first < 0):
                raise invalid("finding.first_divergence", first, "must be a request index or null")
        else:  # an older or hand-written finding: where observed and expected part
            first = next((i for i, (o, e) in enumerate(zip(observed or [], expected or [])) if o != e), None)
        err = observed_part.get("error")
        error_type = err.get("type") if isinstance(err, dict) else None
        return cls(oracle, first, observed, expected, error_type, other_engine_version(finding))

    def swapped(self) -> Claim:
        """A ``versions`` claim seen from the other engine: its observed
        hits are the finding's expected ones and the other way round."""
        return Claim(self.oracle, self.first, self.expected, self.observed, self.error_type, None)


def other_engine_version(finding: dict) -> str | None:
    """The other engine of a ``versions`` finding: schema 2's
    ``other_engine``, else (schema 1) the detail ``expected = vllm==Y``."""
    other = finding.get("other_engine")
    if isinstance(other, dict):
        other = other.get("version") or other.get("name")
    if isinstance(other, str) and other:
        return version_key(other)
    detail = (finding.get("expected") or {}).get("detail") if isinstance(finding.get("expected"), dict) else None
    if finding.get("oracle") == "versions" and isinstance(detail, str) and detail.startswith("expected = vllm=="):
        return detail[len("expected = vllm==") :].split()[0]
    return None


@dataclass(frozen=True)
class Target:
    """A bare case's target: the hits a reference rule predicts, and
    optionally the queries and knobs (compared on the keys both report)."""

    hits: list
    rule: str | None = None
    queries: list | None = None
    knobs: dict | None = None
    #: Where ``hits[i]`` is None: the most request i may hit whatever the
    #: batching (``reference.predict.resume_bounds``), or None.
    bounds: list | None = None


@dataclass
class Verdict:
    verdict: str
    reasons: list[str] = field(default_factory=list)
    #: The oracle judged (a finding's), or None.
    oracle: str | None = None
    #: The first diverging request now (the judged oracle's, or the first divergence).
    first: int | None = None

    @property
    def exit_code(self) -> int:
        return EXIT[self.verdict]

    def as_dict(self) -> dict:
        return {"verdict": self.verdict, "reasons": self.reasons, "oracle": self.oracle, "first_divergence": self.first}


def _n(x) -> str:
    if x is None:
        return "-"
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _hit_differences(observed: list, claimed: list, what: str, only: list[int] | None = None) -> list[str]:
    """A line per request whose observed and claimed hits differ (or either
    is missing); ``only``: the requests to compare (default every one)."""
    out = []
    for i in range(max(len(observed), len(claimed))) if only is None else only:
        o = observed[i] if i < len(observed) else None
        c = claimed[i] if i < len(claimed) else None
        if o is None or c is None or o != c:
            out.append(f"request {i}: observed hits {_n(o)}, {what} {_n(c)}")
    return out


#: The error kinds that are an engine's own failure (one per family: its
#: name, ``ground.engines.FAMILIES``).
ENGINE_ERROR_KINDS = tuple(FAMILIES)


def harness_error_of(observation: dict) -> str | None:
    """The rule: only an error of an engine family's kind (``vllm``: vLLM
    itself raised; ``sglang``: SGLang did) is engine behaviour. Any other error in an observation (``worker``: died or timed
    out; ``internal``: an adapter exception; no kind at all) is a harness
    error, returned as text; ``None`` when the observation may be judged."""
    err = observation.get("error")
    if err is None:
        return None
    if not isinstance(err, dict):
        return f"malformed error in observation: {err!r}"[:2000]
    if err.get("kind") in ENGINE_ERROR_KINDS:
        return None
    head = f"{err.get('kind', 'unknown')} error: {err.get('message', '')}".strip()
    return head + ("\n" + err["traceback"] if err.get("traceback") else "")


def _harness_error(observation: dict | None) -> str | None:
    if observation is None:
        return None
    text = harness_error_of(observation)
    return None if text is None else text.splitlines()[0][:300]


def judge(
    claim: dict | Claim | Target | None,
    observation: dict,
    divergences: list[Divergence] | None = None,
    *,
    other_observation: dict | None = None,
) -> Verdict:
    """The verdict on ``observation`` (the engine's result dict, or
    ``{"hits": [...]}`` from a live server) for a finding (its dict or
    :class:`Claim`), a :class:`Target`, or a bare case (``None``).

    ``divergences``: the oracles' divergences on the observation
    (:func:`divergences`), or ``None`` when only hits were observed (live).
    ``other_observation``: the other engine's, for a ``versions`` finding.
    See the module docstring for the definition."""
    for obs, whose in ((observation, "the engine"), (other_observation, "the other engine")):
        text = _harness_error(obs)
        if text is not None:
            return Verdict(INCONCLUSIVE, [f"{whose} did not run the case (kvspec's own failure, not vLLM's): {text}"])
    observed = list(observation.get("hits") or [])
    err = observation.get("error")
    if isinstance(claim, dict):
        claim = Claim.of(claim)
    if isinstance(claim, Target):
        return _judge_target(claim, observation, observed, err, divergences)
    if claim is None:
        if divergences is None:
            raise ValueError("a bare case needs a Target or the oracles' divergences")
        if not divergences:
            return Verdict(AGREES, ["no oracle fires"])
        first = divergences[0]
        return Verdict(
            DIVERGES,
            [
                f"{d.oracle} fires"
                + (f" at request {d.first}" if d.first is not None else "")
                + (f" ({d.detail})" if d.detail else "")
                for d in divergences
            ],
            first.oracle,
            first.first,
        )
    if divergences is None:
        return _judge_hits_only(claim, observed)
    return _judge_oracles(claim, observation, observed, err, divergences)


def _bound_excesses(target: Target, observation: dict, observed: list) -> list[str]:
    """A line per request the target does not predict whose observed hits
    exceed its bound, and per wave of such requests (``observation["waves"]``:
    ``{"requests": [...], "hits": h}``, a live server's summed counters)
    whose summed hits exceed the sum of their bounds."""
    bounds = target.bounds or []
    out = []
    for i, b in enumerate(bounds):
        o = observed[i] if i < len(observed) else None
        if b is not None and o is not None and o > b:
            out.append(
                f"request {i}: observed hits {_n(o)} above {_n(b)}, the most it can resume from whatever the batching (no request sent before it computed more)"
            )
    for w in observation.get("waves") or ():
        idx = list(w.get("requests") or ())
        if w.get("hits") is None or not idx or any(i >= len(bounds) or bounds[i] is None for i in idx):
            continue
        cap = sum(bounds[i] for i in idx)
        if w["hits"] > cap:
            out.append(
                f"requests {idx[0]}-{idx[-1]} (one wave): summed hits {_n(w['hits'])} above {_n(cap)}, the sum of the most each can resume from whatever the batching"
            )
    return out


def _judge_target(
    target: Target, observation: dict, observed: list, err, divergences: list[Divergence] | None
) -> Verdict:
    """A target's hits (``None`` where the model predicts none: a concurrent
    trace past its serial prefix), queries and knobs; where the model
    predicts none, the target's bounds (per request, or summed over a wave
    when only the sum was observed); and, where given, the divergences of
    the oracles that judge what the target does not predict (None: no
    oracle was evaluated, a live server)."""
    reasons = []
    if err:
        reasons.append(
            f"vLLM raised at request {err.get('request')}: {err.get('type')}: {' '.join(str(err.get('message', '')).split())[:200]}"
        )
    predicted = [i for i, h in enumerate(target.hits) if h is not None]
    judged = predicted
    if target.rule == "promise" and divergences is not None:
        # a hit above the promise is not by itself wrong: the safety oracles
        # (``fuzz.judge.oracle_registry.SAFETY_ORACLES``, among ``divergences``) judge it
        judged = [i for i in predicted if i >= len(observed) or observed[i] <= target.hits[i]]
    reasons += _hit_differences(
        observed, list(target.hits), "target", None if len(judged) == len(target.hits) else judged
    )
    reasons += _bound_excesses(target, observation, observed)
    reasons += [
        f"{d.oracle} fires"
        + (f" at request {d.first}" if d.first is not None else "")
        + (f" ({d.detail})" if d.detail else "")
        for d in divergences or ()
    ]
    if target.queries is not None and observation.get("queries") is not None and not err:
        q = list(observation["queries"])
        reasons += [
            f"request {i}: observed queries {_n(a)}, target {_n(b)}"
            for i, (a, b) in enumerate(zip(q, target.queries))
            if a != b
        ]
    knobs = observation.get("knobs") or {}
    for k, v in (target.knobs or {}).items():
        if k in knobs and knobs[k] != v:
            reasons.append(f"knob {k}: observed {knobs[k]}, target {v}")
    if reasons:
        return Verdict(DIVERGES, reasons)
    if len(predicted) < len(target.hits):
        held = (["none resumes past what a request sent before it computed"] if target.bounds else []) + (
            ["no oracle that judges them fires"] if divergences is not None else []
        )
        return Verdict(
            AGREES,
            [
                f"the hits of the {len(predicted)} request(s) the model predicts equal the target"
                + (f" (rule {target.rule})" if target.rule else "")
                + f"; the other {len(target.hits) - len(predicted)} share scheduler steps"
                + (": " + "; ".join(held) if held else " (not judged)")
            ],
        )
    return Verdict(
        AGREES, ["every request's hits equal the target" + (f" (rule {target.rule})" if target.rule else "")]
    )


def _judge_hits_only(claim: Claim, observed: list) -> Verdict:
    if claim.oracle in NOT_BY_COUNTERS:
        return Verdict(
            INCONCLUSIVE, [f"a {claim.oracle} finding cannot be judged from hit counters alone"], claim.oracle
        )
    if claim.observed is None:
        return Verdict(INCONCLUSIVE, ["the finding states no observed hits"], claim.oracle)
    i = claim.first
    if i is None or claim.expected is None or i >= len(claim.expected) or i >= len(claim.observed):
        return Verdict(
            INCONCLUSIVE,
            ["the finding states no expected hits at its first divergence: the oracle cannot be checked from hits"],
            claim.oracle,
        )
    differences = _hit_differences(observed, claim.observed, "the finding observed")
    if differences:
        return Verdict(NOT_REPRODUCED, differences, claim.oracle, i)
    if observed[i] == claim.expected[i]:
        return Verdict(
            NOT_REPRODUCED,
            [
                f"request {i}: observed hits {_n(observed[i])} equal the finding's expected hits: {claim.oracle} does not fire there"
            ],
            claim.oracle,
            i,
        )
    return Verdict(
        REPRODUCED,
        [
            f"every request's hits equal the finding's observed hits, and request {i} differs from its expected {_n(claim.expected[i])}"
        ],
        claim.oracle,
        i,
    )


def _judge_oracles(claim: Claim, observation: dict, observed: list, err, divergences: list[Divergence]) -> Verdict:
    reasons: list[str] = []
    if err and claim.oracle != "engine_error":
        reasons.append(
            f"vLLM raised now at request {err.get('request')}: {err.get('type')}: {' '.join(str(err.get('message', '')).split())[:200]}"
        )
    same = [d for d in divergences if d.oracle == claim.oracle]
    first = same[0].first if same else None
    if not same:
        reasons.append(f"{claim.oracle} does not fire")
    elif first != claim.first:
        reasons.append(f"{claim.oracle} fires first at request {first}, the finding at request {claim.first}")
    if claim.oracle == "engine_error" and same and claim.error_type is not None:
        now = (err or {}).get("type")
        if now != claim.error_type:
            reasons.append(f"vLLM raised {now}, the finding {claim.error_type}")
    if claim.observed is not None:
        reasons += _hit_differences(observed, claim.observed, "the finding observed")
    if claim.oracle == "versions" and same and claim.expected is not None:
        reasons += [
            r.replace("observed hits", "the other engine hit", 1)
            for r in _hit_differences(list(same[0].expected), claim.expected, "the finding's other engine")
        ]
    if reasons:
        return Verdict(NOT_REPRODUCED, reasons, claim.oracle, first)
    where = "no request (knobs)" if claim.first is None else f"request {claim.first}"
    return Verdict(
        REPRODUCED, [f"{claim.oracle} fires first at {where} with the finding's observed hits"], claim.oracle, first
    )


Run = Callable[[Case], dict]


class HarnessFailure(Exception):
    """The harness, not vLLM, failed on a case: a run came back with a
    harness error (:func:`harness_error_of`), or kvspec could not reach an
    engine. Never judged, never a finding. The one such exception: the judge
    raises it for a variant run, :mod:`fuzz.driving.campaign` for any run."""


def divergences(
    case: Case,
    version: str | EngineSpec,
    observation: dict,
    oracle: str | None = None,
    *,
    run: Run | None = None,
    other_version: str | None = None,
    other_observation: dict | None = None,
) -> list[Divergence]:
    """The divergences the judge weighs: a finding's ``oracle`` alone, or
    every single-engine oracle for a bare case (``oracle`` None), on
    ``case`` as judged (a deployment resolved by this engine:
    :func:`fuzz.judge.oracles.resolved`). ``run`` runs a variant of the case on
    the same engine (``sparse_dense``, ``spec_on_off``); a variant that
    comes back with a harness error raises :class:`HarnessFailure` (never
    judged as vLLM's). An observation carrying a harness error is never
    judged (empty). ``version``: the typed engine (handed to the oracles as
    it is: :func:`fuzz.judge.oracles.check_all`) or its key."""
    engine = version if isinstance(version, EngineSpec) else None
    version = engine.version if engine is not None else version
    if _harness_error(observation) is not None:
        return []
    if oracle == "versions":
        if other_observation is None or other_version is None or _harness_error(other_observation) is not None:
            return []
        return check_versions(case, version, observation, other_version, other_observation)
    oracles = (oracle,) if oracle in KNOWN_ORACLES else oracles_for(version, SINGLE_ENGINE_ORACLES)

    def checked(variant: Case) -> dict:
        obs = run(variant)
        text = _harness_error(obs)
        if text is not None:
            raise HarnessFailure(f"a variant of the case did not run (kvspec's own failure, not vLLM's): {text}")
        return obs

    return check_all(case, engine or version, observation, checked if run is not None else None, oracles)


@dataclass
class Judged:
    """One case judged on an engine: the case as judged (a deployment with
    this engine's resolution), both observations, the divergences and the
    verdict."""

    case: Case
    observation: dict
    divergences: list[Divergence]
    verdict: Verdict
    other_observation: dict | None = None


def typed_engine(engine) -> str | EngineSpec:
    """The engine object's typed engine (every engine object holds
    ``.spec``), else its version key (a test double may hold only that)."""
    spec = getattr(engine, "spec", None)
    return spec if isinstance(spec, EngineSpec) and spec.version == engine.version else engine.version


def observe_and_judge(case: Case, claim: dict | Claim | None, engine, other=None) -> Judged:
    """Run ``case`` on ``engine`` (and, for a ``versions`` claim, on
    ``other``), evaluate the claim's oracle (every single-engine oracle for
    a bare case) on the case as this engine resolved it, and judge. A
    ``versions`` claim without ``other`` is inconclusive."""

    if isinstance(claim, dict):
        claim = Claim.of(claim)
    obs = engine.run(case)
    if _harness_error(obs) is None and (claim is None or claim.oracle == "resolution"):
        misresolved = check_resolution(case, engine.version, obs)
        if misresolved:  # not resolved further: the geometry breaks vLLM's own rule
            return Judged(case, obs, misresolved, judge(claim, obs, misresolved))
    judged = case if _harness_error(obs) is not None else resolved(case, obs, engine.version)
    other_obs = None
    if claim is not None and claim.oracle == "versions":
        if other is None:
            return Judged(
                judged,
                obs,
                [],
                Verdict(
                    INCONCLUSIVE,
                    [
                        f"a versions finding needs its other engine (vllm=={claim.other_version or '?'}) beside vllm=={engine.version}"
                    ],
                    "versions",
                ),
            )
        other_obs = other.run(case)
    try:
        divs = divergences(
            judged,
            typed_engine(engine),
            obs,
            claim.oracle if claim else None,
            run=engine.run,
            other_version=other.version if other is not None else None,
            other_observation=other_obs,
        )
    except HarnessFailure as e:
        return Judged(judged, obs, [], Verdict(INCONCLUSIVE, [str(e)], claim.oracle if claim else None), other_obs)
    except Unsupported as e:  # kvspec's model cannot judge it: says nothing about vLLM
        return Judged(
            judged,
            obs,
            [],
            Verdict(
                INCONCLUSIVE,
                [f"the reference model cannot judge this case on vllm=={engine.version}: {e}"],
                claim.oracle if claim else None,
            ),
            other_obs,
        )
    return Judged(judged, obs, divs, judge(claim, obs, divs, other_observation=other_obs), other_obs)


def differences(reference: dict, observed: dict) -> list[dict]:
    """Every difference between a prediction and an observation, request by
    request (hits, queries), then the knobs both report (``COMPARED_KNOBS``):
    the rows ``kvspec run --compare`` marks MISMATCH."""
    out: list[dict] = []
    if observed.get("error"):
        out.append({"what": "error", "reference": None, "observed": observed["error"].get("message")})
    ref_h, obs_h = reference["hits"], observed.get("hits") or []
    ref_q, obs_q = reference["queries"], observed.get("queries") or []
    for i in range(max(len(ref_h), len(obs_h))):
        rh = ref_h[i] if i < len(ref_h) else None
        oh = obs_h[i] if i < len(obs_h) else None
        if rh is None and i < len(ref_h):
            continue  # not predicted (a concurrent trace past its serial prefix): the oracles judge it
        if rh != oh:
            out.append({"what": "hits", "request": i, "reference": rh, "observed": oh})
        rq = ref_q[i] if i < len(ref_q) else None
        oq = obs_q[i] if i < len(obs_q) else None
        if rq != oq:
            out.append({"what": "queries", "request": i, "reference": rq, "observed": oq})
    ok, rk = observed.get("knobs") or {}, reference.get("knobs") or {}
    for k in COMPARED_KNOBS:
        if k in rk and k in ok and rk[k] != ok[k]:
            out.append({"what": f"knobs.{k}", "reference": rk[k], "observed": ok[k]})
    return out
