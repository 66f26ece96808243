"""A campaign: cases in, confirmed and shrunk findings out.

``Campaign.check(case)`` is the one step every driver (atheris, Hypothesis,
plain random) repeats:

1. a case outside what the reference model covers is counted *unsupported*
   and skipped, never guessed;
2. the engine runs it; every oracle judges the observation; a second engine
   (``versions`` oracle) runs it too;
3. a divergence whose signature is new is *confirmed* by running the case
   again: only a case that replays deterministically is reported;
4. it is shrunk (``fuzz.results.shrink``) with the predicate "the same oracle still
   fires with the same signature", and written atomically as a finding.

With a **baseline** engine (``check-build --against vllm==X``) each new
divergence is also judged on the baseline, on the same case, by the same
oracles: the baseline *fails too* when the same oracle fires there first at
the same request (:meth:`Campaign.fails_on_baseline`), and the finding is
*new* otherwise (the baseline keeps that promise on that case, refuses the
deployment, or cannot be judged on it). The two are deduplicated apart (a
known class never hides a new failure of the same signature:
:func:`against_signature`), the shrink predicate keeps the answer (a new
finding shrinks to a case the baseline still keeps), and the finding
records it under ``baseline``.

An exception raised inside vLLM arrives as an observation with ``error`` of
kind ``vllm`` and becomes an ``engine_error`` finding; the campaign goes on.
Anything else that goes wrong is a *harness error*, never a finding: an
observation whose error kind is not ``vllm`` (a worker that died or timed
out, an ``internal`` adapter exception), an engine that cannot be reached,
or an exception in kvspec's own code. It is counted (``Stats.harness_errors``),
stored apart (``OUT/harness-errors/``) and never judged.
"""

from __future__ import annotations

import hashlib
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from engine_adapter.host.versions import engine_name
from engine_adapter.interface import Observation
from fuzz.driving.reach import Reach
from fuzz.judge.oracle_resolution import trace_units
from fuzz.judge.oracles import ORACLES, Divergence, check_all, check_resolution, check_versions, oracles_for, resolved
from fuzz.judge.verdict import HarnessFailure, harness_error_of
from fuzz.results import findings as F
from fuzz.results.shrink import shrink
from ground.errors import DeploymentCrashes, DeploymentRejected, EngineError, KvspecError, Unsupported
from reference.case import Case, parse_case
from reference.knobs import resolve_knobs

#: The block a trace is drawn on for a deployment vLLM crashes on (no
#: geometry to draw on; the crash comes before any request).
CRASH_TRACE_BLOCK = 16


def against_signature(sig: str) -> str:
    """The signature of a finding the baseline does not share (another hex
    digest, so a new failure is never a duplicate of a known one)."""
    return hashlib.sha256(f"{sig}|new-against-baseline".encode()).hexdigest()[:16]


class CampaignEngine(Protocol):
    """What a campaign needs of an engine: its version and ``run`` (an
    ``engine_adapter`` Engine, or a test double named as one)."""

    version: str

    def run(self, case: Case) -> Observation: ...


#: The Stats fields a campaign summary carries unchanged.
SUMMARY_COUNTS = (
    "execs",
    "cases",
    "unsupported",
    "rejected",
    "harness_errors",
    "cut_at_deadline",
    "duplicates",
    "first_finding_s",
)


@dataclass
class Stats:
    #: Cases checked (``Campaign.check`` calls); ``execs`` counts engine runs
    #: (a case runs once, plus its variants and the confirmation of a finding).
    cases: int = 0
    execs: int = 0
    unsupported: int = 0
    divergences: int = 0
    duplicates: int = 0
    not_reproduced: int = 0
    harness_errors: int = 0
    #: Deployments vLLM itself refused (a mutated flag, say): neither a
    #: finding nor a harness error.
    rejected: int = 0
    cut_at_deadline: int = 0
    #: engine runs and seconds spent confirming and shrinking findings
    shrink_execs: int = 0
    shrink_s: float = 0.0
    findings: list[str] = field(default_factory=list)
    #: deployment classes x trace shapes checked (fuzz.driving.reach)
    reach: Reach = field(default_factory=Reach)
    first_finding_s: float | None = None
    started: float = field(default_factory=time.monotonic)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def counted(self) -> dict[str, int | float | None]:
        """The counts a campaign summary carries as the campaign counted
        them (``fuzz.driving.summary.CampaignSummary``'s fields of the same names)."""
        return {k: getattr(self, k) for k in SUMMARY_COUNTS}


class Campaign:
    def __init__(
        self,
        engine: CampaignEngine,
        out_dir: str | Path,
        *,
        other: CampaignEngine | None = None,
        baseline: CampaignEngine | None = None,
        oracles: tuple[str, ...] | None = None,
        seed: int | None = None,
        shrink_calls: int = 200,
        on_finding: Callable[[Path, dict], None] | None = None,
        on_harness_error: Callable[[Path], None] | None = None,
        deadline: float | None = None,
    ):
        self.engine, self.other, self.baseline = engine, other, baseline
        self.out_dir = Path(out_dir)
        # a build (X+LABEL.HASH) is not judged by the release's rule
        self.oracles = oracles_for(engine.version, ORACLES if oracles is None else oracles)
        self.seed = seed
        self.shrink_calls = shrink_calls
        self.on_finding = on_finding
        self.on_harness_error = on_harness_error
        self.deadline = deadline  # time.monotonic() past which shrinking stops
        self.stats = Stats()
        self.seen: set[str] = set()
        self._resolved: dict[str, dict | None] = {}
        self.last_other: dict | None = None  # the other engine's last observation
        if self.out_dir.is_dir():  # resume: do not report again what is already there
            for path in self.out_dir.glob("*.json"):
                sig = path.stem.rsplit("-", 1)[-1]
                self.seen.add(sig)

    # -------------------------------------------------------------- judging

    def _observe(self, engine: CampaignEngine, case: Case) -> dict:
        """Run ``case``; an observation carrying a harness error (see
        ``harness_error_of``) raises HarnessFailure instead of being judged."""
        obs = engine.run(case)
        self.stats.execs += 1
        text = harness_error_of(obs)
        if text is not None:
            raise HarnessFailure(text)
        return obs

    def _judge(
        self, case: Case, engine: CampaignEngine | None = None, only: str | None = None
    ) -> tuple[Case, dict, list[Divergence]]:
        """Run and judge ``case`` on ``engine`` (default: the engine under
        test): (the case as judged, the observation, the divergences). A
        deployment case is judged with the geometry the engine resolved for
        it (``oracles.resolved``); one the model does not cover raises
        Unsupported. The ``versions`` oracle runs for the engine under test
        only. ``only``: judge by that one oracle (a shrink predicate asks
        about one: the others' variant runs are not made)."""
        engine = self.engine if engine is None else engine
        oracles = self.oracles if only is None else tuple(o for o in self.oracles if o == only)
        obs = self._observe(engine, case)
        if "resolution" in oracles:
            misresolved = check_resolution(case, engine.version, obs)
            if misresolved:  # vLLM's resolution breaks its own documented rule: not judged further
                self.last_other = None
                return case, obs, misresolved
        judged = resolved(case, obs, engine.version)
        if judged.geometry is not None and "error" not in obs:
            resolve_knobs(judged, engine.version)  # Unsupported: outside the model
        divs = check_all(judged, engine.version, obs, lambda c: self._observe(engine, c), oracles)
        self.last_other = None
        if engine is not self.engine:
            return judged, obs, divs
        if self.other is not None and "versions" in oracles and "error" not in obs:
            other_obs = self._observe(self.other, case)
            self.last_other = other_obs
            divs += check_versions(judged, self.engine.version, obs, self.other.version, other_obs)
        return judged, obs, divs

    def fails_on_baseline(self, case: Case, div: Divergence) -> bool:
        """Does the baseline break the same promise on ``case``: the same
        oracle fires there, first at the same request? False when it keeps
        it, refuses the deployment, or the model cannot judge the case on
        its version; a harness error on the baseline raises HarnessFailure
        (never judged)."""
        if self.baseline is None:
            raise ValueError("fails_on_baseline needs a baseline engine")
        try:
            _judged, _obs, divs = self._judge(case, self.baseline, only=div.oracle)
        except (DeploymentRejected, Unsupported):
            return False
        except HarnessFailure:
            raise
        except KvspecError as e:  # the baseline cannot be reached: kvspec's failure, not a verdict
            raise HarnessFailure(f"baseline {self.baseline.version}: {type(e).__name__}: {e}") from e
        return any(d.oracle == div.oracle and d.first == div.first for d in divs)

    def resolver(self, deployment: dict) -> dict | None:
        """What the engine under test resolves a drawn deployment to: its
        block, hash block, max_model_len and default max_num_seqs (for the
        generator to draw a trace on), or None when vLLM rejects it or the
        model cannot judge it; None and a harness error when kvspec failed
        to resolve it. Cached per deployment."""
        import json

        key = json.dumps(deployment, sort_keys=True)
        if key in self._resolved:
            return self._resolved[key]
        info = None
        try:
            probe = parse_case(
                {"schema": 1, "deployment": deployment, "trace": [{"prompt": [{"segment": "A", "length": 1}]}]}
            )
            r = self.engine.resolve(probe)
            (block, hashed), facts = trace_units(r), r.get("facts", {})
            info = {
                "block": block,
                "hash": hashed,
                "max_model_len": facts.get("max_model_len"),
                "max_num_seqs": facts.get("max_num_seqs", 256),
                # the decode track grid, where the family states one (SGLang's: fuzz.draw.generate_sglang)
                "track": facts.get("track"),
                # the prefill chunk budget, where the family states one (SGLang's: chunk starts, fuzz.draw.generate_sglang)
                "chunk": facts.get("chunk"),
                # the KV cache groups (kind, block, count): a pinned pool is sized on them (fuzz.draw.generate_pressure)
                "groups": (r.get("geometry") or {}).get("groups"),
                # the blocks the start-up check budgets one request per Mamba group, where the engine says
                "mamba_request_blocks": facts.get("mamba_request_blocks"),
                # the internal checkpoints' grid, where the engine exports them (fuzz.draw.straddle)
                "checkpoint_grid": (r.get("geometry") or {}).get("prefill_checkpoint_grid"),
                # the scheduler it serves with (fuzz.draw.generate_pressure.draw_scheduling)
                "async_scheduling": bool(facts.get("async_scheduling")),
            }
        except DeploymentCrashes:  # drawn all the same: its run is the engine_error finding (any trace shows it)
            info = {"block": CRASH_TRACE_BLOCK, "hash": CRASH_TRACE_BLOCK, "max_model_len": None, "max_num_seqs": 256}
        except (
            EngineError
        ) as e:  # kvspec failed to resolve it (a broken engine environment, an adapter bug): counted, never silent
            self._harness_error(probe, str(e))
            info = None
        except KvspecError:
            info = None
        self._resolved[key] = info
        return info

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _harness_error(self, case: Case, text: str) -> None:
        """Count and store one harness error (atomically, under
        ``OUT/harness-errors/``). One that happens past the deadline is a run
        cut off by the campaign's own time limit: counted apart, not stored."""
        if self.past_deadline():
            self.stats.cut_at_deadline += 1
            return
        self.stats.harness_errors += 1
        path = F.write_harness_error(case, text, self.out_dir)
        if self.on_harness_error:
            self.on_harness_error(path)

    def supported(self, case: Case) -> bool:
        """Can the model judge ``case`` on these engines' versions? A
        deployment is known only once an engine resolved it (checked then)."""
        if case.geometry is None:
            return True
        try:
            resolve_knobs(case, self.engine.version)
            if self.other is not None:
                resolve_knobs(case, self.other.version)
        except Unsupported:
            return False
        return True

    def _signature(self, case: Case, div: Divergence, obs: dict) -> str:
        return F.signature(case, div, (obs.get("knobs") or {}))

    def _fires(self, case: Case, oracle: str, sig: str, fails_too: bool | None = None) -> bool:
        """The shrink predicate: the same oracle fires with the same
        signature (and, against a baseline, the baseline still fails too,
        or still keeps the promise, as ``fails_too`` says)."""
        if not self.supported(case):
            return False
        try:
            judged, obs, divs = self._judge(case, only=oracle)
            div = next((d for d in divs if d.oracle == oracle and self._signature(judged, d, obs) == sig), None)
            if div is None:
                return False
            return fails_too is None or self.fails_on_baseline(case, div) == fails_too
        except KvspecError:
            return False
        except HarnessFailure as e:
            self._harness_error(case, str(e))
            return False

    # -------------------------------------------------------------- the step

    def check(self, case: Case) -> list[Path]:
        """Judge one case; return the finding files written. A harness error
        (HarnessFailure, an engine that cannot be reached, an exception in
        kvspec's code) is recorded apart and yields no finding."""
        self.stats.cases += 1
        self.stats.reach.add(case)
        try:
            return self._check(case)
        except HarnessFailure as e:
            self._harness_error(case, str(e))
        except DeploymentRejected:  # vLLM refuses the deployment: an invalid input
            self.stats.rejected += 1
        except Unsupported:  # the engine says this version cannot express it
            self.stats.unsupported += 1
        except KvspecError as e:  # e.g. EngineError: the engine cannot be reached
            self._harness_error(case, f"{type(e).__name__}: {e}")
        except Exception:  # noqa: BLE001 - a harness bug is recorded, never judged
            self._harness_error(case, traceback.format_exc())
        return []

    def _check(self, case: Case) -> list[Path]:
        if not self.supported(case):
            self.stats.unsupported += 1
            return []
        judged, obs, divs = self._judge(case)
        self.stats.reach.observed(obs)
        written = []
        for div in divs:
            self.stats.divergences += 1
            raw = key = self._signature(judged, div, obs)
            fails_too = None
            if self.baseline is not None:
                if raw in self.seen and against_signature(raw) in self.seen:
                    self.stats.duplicates += 1
                    continue
                fails_too = self.fails_on_baseline(case, div)
                key = raw if fails_too else against_signature(raw)
            if key in self.seen:
                self.stats.duplicates += 1
                continue
            t0, runs0 = time.monotonic(), self.stats.execs
            try:
                small = self._confirm_and_shrink(
                    case,
                    div,
                    raw,
                    fails_too,
                    judged.geometry.scheduler_block_size if judged.geometry is not None else None,
                )
            finally:
                self.stats.shrink_s += time.monotonic() - t0
                self.stats.shrink_execs += self.stats.execs - runs0
            if small is None:  # it did not replay deterministically
                self.stats.not_reproduced += 1
                continue
            self.seen.add(key)
            try:
                small_judged, small_obs, small_divs = self._judge(small)
            except HarnessFailure as e:  # keep the confirmed original
                self._harness_error(small, str(e))
                small_judged, small_obs, small_divs = judged, obs, []
            except KvspecError:  # not run again (past the deadline the shrink used up): keep the confirmed original
                small_judged, small_obs, small_divs = judged, obs, []
            final = next(
                (
                    d
                    for d in small_divs
                    if d.oracle == div.oracle and self._signature(small_judged, d, small_obs) == raw
                ),
                None,
            )
            if final is None:  # cannot happen after a successful shrink; keep the original
                small_judged, small_obs, final = judged, obs, div
            finding = F.make_finding(
                small_judged,
                final,
                small_obs,
                seed=self.seed,
                other_observation=self.last_other if final.oracle == "versions" else None,
            )
            finding["signature"] = key
            if self.baseline is not None:
                finding["baseline"] = {"engine": engine_name(self.baseline.version), "fails_too": fails_too}
            path = F.write_finding(finding, self.out_dir)
            written.append(path)
            self.stats.findings.append(str(path))
            if self.stats.first_finding_s is None:
                self.stats.first_finding_s = self.stats.elapsed
            if self.on_finding:
                self.on_finding(path, finding)
        return written

    def _confirm_and_shrink(
        self, case: Case, div: Divergence, raw: str, fails_too: bool | None, block: int | None = None
    ) -> Case | None:
        """Replay ``case`` (only a divergence that replays is reported), then
        shrink it with the predicate "the same oracle fires with the same
        signature" (and the baseline's answer kept); None when it does not
        replay. ``block``: the scheduler block the case resolved to."""
        if not self._fires(case, div.oracle, raw, fails_too):
            return None
        small, _calls = shrink(
            case,
            lambda c: not self.past_deadline() and self._fires(c, div.oracle, raw, fails_too),
            self.shrink_calls,
            block,
        )
        pinned = pin_speculative(small, self.engine.version)
        if pinned != small and self._fires(pinned, div.oracle, raw, fails_too):
            small = pinned
        return small


def pin_speculative(case: Case, version: str) -> Case:
    """Spell out what an older version does implicitly, so the finding keeps
    its knobs on every version: before 0.33.0 there are no lookahead block
    hashes, i.e. ``disable_lookahead_block_hashes: true``."""
    spec = case.speculative
    if spec is None or "disable_lookahead_block_hashes" in spec.options:
        return case
    if tuple(int(x) for x in version.split(".")[:2]) >= (0, 33):
        return case
    return replace(case, speculative=replace(spec, options={**spec.options, "disable_lookahead_block_hashes": True}))
