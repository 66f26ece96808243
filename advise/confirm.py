"""Confirm the advice on the real engine of the version, setting by setting.

For every retention setting the advice reports (the deployment's own,
sparse, periodic k x block, dense) the workload runs on the in-process
scheduler of that vLLM version (``engine_adapter``: for a deployment, with
``--prefix-cache-retention-interval`` set in its flags, so vLLM resolves
the variant itself; for a server's geometry, as a hand geometry). Compared
with the model's prediction under the rule the version implements:

* the hits of every request;
* the Mamba states cached on each request's own prompt once it finished
  (the engine reads them from its block pool; the model's are the states
  kept so far on that prompt's path), and so the distinct states at the end.

Any difference is a ``reference`` finding (``fuzz.results.findings``), written under
``OUT/findings/`` and printed: a gap in kvspec's model or a vLLM bug, never
averaged away. An engine that did not finish a run (a dead or hung worker)
makes that setting *inconclusive*, never a finding. The promise column is
checked against the engine under dense retention; where they differ it is
printed (the promise is kvspec's rule, not a model of vLLM).

Default size limit (``CONFIRM_REQUESTS`` requests and ``CONFIRM_TOKENS``
prompt tokens): a larger workload is predicted only unless ``--confirm`` is
given, and ``--confirm`` takes at most what a case file holds (1,000
requests, 4,194,304 prompt tokens, 256 segments a prompt).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from advise.model import RuleOutcome, held_on_path, kept_positions, retention_label
from fuzz.judge.oracles import Divergence, check_engine_error, resolved
from fuzz.judge.verdict import harness_error_of
from fuzz.results.findings import make_finding, write_finding
from ground.errors import invalid
from reference.case import MAX_CASE_TOKENS, MAX_REQUESTS, MAX_SEGMENTS, Case

CONFIRM_REQUESTS = 200
CONFIRM_TOKENS = 2_000_000
#: Seconds one setting's run may take on the engine.
RUN_TIMEOUT_S = 600.0


def too_big(requests, *, explicit: bool) -> str | None:
    """Why a workload is not confirmed by default (None: it is). With
    ``explicit`` (--confirm), only the case format's limits apply."""
    n = len(requests)
    tokens = sum(r.num_prompt_tokens for r in requests)
    segments = max(len(r.prompt) for r in requests)
    if segments > MAX_SEGMENTS:
        return f"a prompt has {segments} segments; the engine takes at most {MAX_SEGMENTS}"
    top_n, top_t = (MAX_REQUESTS, MAX_CASE_TOKENS) if explicit else (CONFIRM_REQUESTS, CONFIRM_TOKENS)
    if n > top_n:
        return f"{n:,} requests; confirmed {'at most' if explicit else 'by default up to'} {top_n:,}"
    if tokens > top_t:
        return f"{tokens:,} prompt tokens; confirmed {'at most' if explicit else 'by default up to'} {top_t:,}"
    return None


def check_explicit(requests) -> None:
    """``--confirm`` on a workload the engine cannot take: one line."""
    why = too_big(requests, explicit=True)
    if why:
        raise invalid("--confirm", True, f"the workload has {why}; allowed: --no-confirm, or a smaller workload")


def variant(source, case: Case, interval: int | None) -> Case:
    """The case the engine runs for one retention setting."""
    if source.deployment_case is not None:
        from reference.variants import with_retention

        dep_case = Case(None, None, case.trace, case.name, source.deployment_case.deployment)
        return with_retention(dep_case, interval)
    return replace(case, geometry=replace(case.geometry, retention_interval=interval))


def engine_held(observation: dict) -> list[set[int]]:
    """Per request, the Mamba states (token counts) the engine's block pool
    held on its prompt once it finished (union over Mamba groups)."""
    out = []
    for ex in observation.get("explain") or []:
        tokens = ex.get("retained_mamba_tokens")
        if tokens:
            out.append({int(p) for ps in tokens.values() for p in ps})
        else:
            out.append(
                {
                    (int(b) + 1) * int(size)
                    for size, blocks in (ex.get("retained_mamba_blocks") or {}).items()
                    for b in blocks
                }
            )
    return out


def _same_geometry(a, b) -> bool:
    """Two geometries equal but for the retention interval."""
    return replace(a, retention_interval=None) == replace(b, retention_interval=None)


def compare(case: Case, outcome: RuleOutcome, observation: dict, lookahead: int) -> dict:
    """The model's outcome against the engine's observation of one setting."""
    model_held, model_states = held_on_path(case.trace, [kept_positions(s) for s in outcome.steps], lookahead)
    seen = engine_held(observation)
    _, engine_states = held_on_path(case.trace, seen, lookahead)
    hits = observation.get("hits") or []
    bad_hits = [i for i in range(len(outcome.hits)) if i >= len(hits) or hits[i] != outcome.hits[i]]
    bad_states = [i for i in range(len(model_held)) if i >= len(seen) or set(model_held[i]) != seen[i]]
    detail = ""
    if bad_states:
        i = bad_states[0]
        detail = f"Mamba states held on request {i}'s prompt: model {sorted(model_held[i])}, engine {sorted(seen[i]) if i < len(seen) else None}"
    return {
        "engine_hits": list(hits),
        "engine_hit_tokens": sum(hits),
        "model_states": model_states,
        "engine_states": engine_states,
        "hits_agree": not bad_hits,
        "states_agree": not bad_states,
        "diverging_requests": sorted(set(bad_hits) | set(bad_states)),
        "detail": detail,
    }


def confirm(
    source, case: Case, advice: dict, engine, out_dir: Path, *, timeout: float = RUN_TIMEOUT_S, progress=None
) -> dict:
    """Run every setting of ``advice`` on ``engine``; compare; write findings."""

    version = source.engine_spec.version
    lookahead = advice["knobs"]["hash_lookahead_tokens"]
    block = source.geometry.scheduler_block_size
    rows, findings, notes = [], [], []
    dense_hits = None
    for interval, outcome in advice["outcomes"].items():
        label = retention_label(interval, block)
        if progress:
            progress(f"confirming {label} on {source.engine} ...")
        run_case = variant(source, case, interval)
        if getattr(engine, "mode", "") == "worker":
            obs = engine.run(run_case, None, timeout=timeout)
        else:
            obs = engine.run(run_case)
        row = {"interval": interval, "setting": label}
        harness = harness_error_of(obs)
        if harness is not None:
            rows.append(
                {
                    **row,
                    "status": "inconclusive",
                    "reason": "the engine did not run the workload (kvspec's own failure, not vLLM's): "
                    + " ".join(harness.split())[:300],
                }
            )
            continue
        judged = resolved(run_case, obs, version)
        if obs.get("error"):
            divs = check_engine_error(judged, version, obs)
            path = write_finding(make_finding(judged, divs[0], obs, platform=_platform(source)), out_dir / "findings")
            findings.append(str(path))
            rows.append({**row, "status": "vllm raised", "finding": str(path), "reason": divs[0].detail[:300]})
            continue
        if judged.geometry is not None and not _same_geometry(judged.geometry, case.geometry):
            rows.append(
                {
                    **row,
                    "status": "inconclusive",
                    "reason": "the engine resolved another geometry than the one predicted (a stale resolution cache: run again)",
                }
            )
            notes.append(f"{label}: the engine resolved another geometry; the cached resolution was dropped")
            from advise.source import forget

            if source.deployment_case is not None:
                forget(source.engine_spec, source.deployment_case)
            continue
        got = compare(case, outcome, obs, lookahead)
        status = "agrees" if got["hits_agree"] and got["states_agree"] else "disagrees"
        row.update(status=status, **got)
        if status == "disagrees":
            detail = f"rule={advice['rule']}; retention {label}; kvspec advise" + (
                f"; {got['detail']}" if got["detail"] else ""
            )
            div = Divergence(
                "reference",
                version,
                got["diverging_requests"],
                outcome.hits,
                obs.get("hits") or [],
                detail,
                {"model_explain": [s.as_dict() for s in outcome.steps]},
            )
            path = write_finding(make_finding(judged, div, obs, platform=_platform(source)), out_dir / "findings")
            findings.append(str(path))
            row["finding"] = str(path)
        if interval is None:
            dense_hits = got["engine_hits"]
        rows.append(row)
    promise = advice["promise_outcome"].hits
    promise_check = None
    if dense_hits is not None:
        below = [i for i, (p, e) in enumerate(zip(promise, dense_hits)) if e < p]
        above = [i for i, (p, e) in enumerate(zip(promise, dense_hits)) if e > p]
        promise_check = {
            "engine_dense_hits": dense_hits,
            "requests_below_promise": below,
            "requests_above_promise": above,
        }
        if below or above:
            notes.append(
                f"the engine under dense retention differs from the promise at requests {(below + above)[:10]} (the promise is kvspec's rule; vLLM's dense retention is what the engine did)"
            )
    statuses = {r["status"] for r in rows}
    overall = (
        "disagrees"
        if statuses & {"disagrees", "vllm raised"}
        else ("inconclusive" if "inconclusive" in statuses else "confirmed")
    )
    return {
        "engine": source.engine,
        "status": overall,
        "settings": rows,
        "promise": promise_check,
        "findings": findings,
        "notes": notes,
    }


def _platform(source) -> str:
    if source.deployment_case is not None:
        return source.deployment_case.deployment.platform
    return "cuda"
