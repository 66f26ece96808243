"""The oracles of the hits: each compares a request's hit with what must
hold: the promise, the reference model, the same engine with one knob
flipped (a variant run) or another vLLM version.

* ``promise``: an identical resend or a longer sibling of an earlier prompt
  hits exactly what kvspec's promise predicts (where dense retention would
  resume). A sibling diverging inside an earlier prompt is not compared.
* ``reference``: every request hits what the reference model predicts for
  the rule the engine's version implements (``legacy`` before 0.30.0,
  ``replay`` from 0.30.0), with the knobs that version resolves. A
  divergence here is either a vLLM behaviour the model misses or a bug.
  The model is the local prefix cache's: no request from the first one a
  KV connector loaded for on is judged (the registry's ``local``).
* ``sparse_dense``: on the same engine, no promised request hits less under
  sparse retention (interval 0) than under dense retention, capped by the
  promise: dense retention also keeps the chunk ends of other earlier
  prompts (a prompt that extends one request and diverges inside another
  finds them), which sparse retention is not promised to keep. A request
  that hits more under sparse is not this oracle's: it says the dense run
  fell short, which the promise judges on a dense case. The dense run is
  made only where a promised request hits below the promise (elsewhere it
  cannot fire).
* ``spec_on_off``: turning speculative decoding on moves the first repeat's
  hit only by the documented EAGLE drop (the model's difference); judged
  only where the spec-off run keeps the promise, and where no KV connector
  loaded for that repeat or before it in either run (the drop is the local
  lookup's; a connector's lookup is its own: the registry's ``local`` for
  this run, :func:`fuzz.judge.oracle_base.first_load` for the spec-off run). The
  spec-off run is made only where the first repeat misses the promise
  (elsewhere it cannot fire).
* ``versions``: two engine versions agree on every request.
* ``junction`` (only when asked: ``kvspec check-build``): under sparse
  retention a sibling diverging inside an earlier prompt hits at least what
  the promise predicts, capped by its dense-retention hit on the same engine.
"""

from __future__ import annotations

from engine_adapter.host.versions import engine_name
from engine_adapter.interface import Observation
from fuzz.judge.oracle_base import (
    Divergence,
    Run,
    check_engine_error,
    differing,
    first_load,
    promised,
    reference_divergence,
    request_kinds,
)
from fuzz.judge.oracle_resolution import comparable_resolutions, resolved
from fuzz.judge.oracle_states import written_before
from ground.engines import EngineSpec
from ground.errors import DeploymentRejected
from reference.case import Case
from reference.knobs import implemented_rule, resolve_knobs
from reference.predict import predict_with_knobs
from reference.variants import has_speculative, with_retention, without_speculative


def check_promise(case: Case, version: EngineSpec | str, obs: Observation) -> list[Divergence]:
    """Promised requests hit what the promise predicts. Below it is lost
    reuse; above it is a stale state unless a prefill wrote a state there
    (:func:`written_before`: vLLM may keep more states than the promise
    requires, e.g. the block-floored replay boundary beside the
    hash-unit one; that costs memory, not correctness)."""
    if case.geometry is None:  # resolved to a cache the promise is not stated for (SGLang's no_buffer)
        return []
    expected = predict_with_knobs(case, resolve_knobs(case, version), "promise")
    bad = [
        i
        for i in differing(expected["hits"], obs["hits"], promised(case))
        if i >= len(obs["hits"])
        or obs["hits"][i] < expected["hits"][i]
        or not written_before(case, obs, i, obs["hits"][i])
    ]
    if not bad:
        return []
    return [
        Divergence(
            "promise", version, bad, expected["hits"], obs["hits"], context={"model_explain": expected["explain"]}
        )
    ]


def check_reference(case: Case, version: EngineSpec | str, obs: Observation) -> list[Divergence]:
    """The hits against the model of the local prefix cache (declared
    ``local``: judged on the requests before the first one a KV connector
    loaded for; the promise and the safety oracles judge what a connector
    loads)."""
    rule = implemented_rule(version)
    expected = predict_with_knobs(case, resolve_knobs(case, version), rule)
    bad = differing(expected["hits"], obs["hits"])
    if not bad:
        return []
    return reference_divergence(version, bad, expected["hits"], obs["hits"], f"rule={rule}", expected["explain"])


def check_sparse_dense(case: Case, version: EngineSpec | str, obs: Observation, run: Run) -> list[Divergence]:
    if case.geometry is None or case.geometry.retention_interval != 0:
        return []
    promise = predict_with_knobs(case, resolve_knobs(case, version), "promise")["hits"]
    if all(i < len(obs["hits"]) and obs["hits"][i] >= promise[i] for i in promised(case)):
        return []  # it fires only below the promise: the dense run could not change the verdict
    dense_case = with_retention(case, None)
    dense = run(dense_case)
    if "error" in dense:
        return check_engine_error(dense_case, version, dense)
    bad = [
        i
        for i in promised(case)
        if i >= len(obs["hits"]) or (i < len(dense["hits"]) and obs["hits"][i] < min(dense["hits"][i], promise[i]))
    ]
    if not bad:
        return []
    return [
        Divergence(
            "sparse_dense", version, bad, dense["hits"], obs["hits"], "expected = the same engine under dense retention"
        )
    ]


def check_spec_on_off(case: Case, version: EngineSpec | str, obs: Observation, run: Run) -> list[Divergence]:
    if not has_speculative(case):
        return []
    kinds = request_kinds(case)
    first = next((i for i, k in enumerate(kinds) if k == "resend"), None)
    if first is None:
        return []
    model_on = predict_with_knobs(case, resolve_knobs(case, version), "promise")["hits"][first]
    if first < len(obs["hits"]) and obs["hits"][first] == model_on:
        return []  # it fires only where the spec-off run keeps the promise, i.e. moved = model_off - model_on here
    off_case = without_speculative(case)
    try:
        off = run(off_case)
    except DeploymentRejected:  # vLLM refuses the deployment without speculation (a retention interval that is no multiple of its block): nothing to compare
        return []
    if "error" in off:
        return check_engine_error(off_case, version, off)
    loaded = first_load(off)
    if loaded is not None and loaded <= first:  # the spec-off run's hit a connector loaded (this run's: ``local``)
        return []
    off_case = resolved(off_case, off, version)
    if (
        case.deployment is not None
        and off_case.geometry is not None
        and case.geometry is not None
        and off_case.geometry.scheduler_block_size != case.geometry.scheduler_block_size
    ):
        return []  # the speculative tokens moved the block size: hits are not comparable
    model_off = predict_with_knobs(off_case, resolve_knobs(off_case, version), "promise")["hits"][first]
    if off["hits"][first] != model_off:
        return []  # the baseline itself is off the promise: that is the promise oracle's finding, on the spec-off case
    moved = off["hits"][first] - obs["hits"][first]
    if moved == model_off - model_on:
        return []
    expected = list(obs["hits"])
    expected[first] = off["hits"][first] - (model_off - model_on)
    return [
        Divergence(
            "spec_on_off",
            version,
            [first],
            expected,
            obs["hits"],
            f"spec off hits {off['hits'][first]}; the EAGLE drop moves it by {model_off - model_on}, engine moved it by {moved}",
        )
    ]


def check_versions(
    case: Case, version: str, obs: Observation, other_version: str, other: Observation
) -> list[Divergence]:
    if "error" in other or "error" in obs:
        return []
    if comparable_resolutions(obs, other) is False:
        return []  # the versions built different geometries: hits differ by construction
    bad = differing(other["hits"], obs["hits"])
    if not bad:
        return []
    core = (other.get("harness") or {}).get("tree_core")
    label = engine_name(other_version) + (f" ({core} tree core)" if core else "")
    return [
        Divergence(
            "versions",
            version,
            bad,
            other["hits"],
            obs["hits"],
            f"expected = {label}",
            {"other_version": other_version},
        )
    ]


def check_junction(case: Case, version: EngineSpec | str, obs: Observation, run: Run) -> list[Divergence]:
    """Under sparse retention, a sibling (a prompt that shares a prefix with
    an earlier one and diverges inside it) hits at least what the promise
    predicts for it (its divergence point once an earlier request observed
    that junction), capped by what the same engine hits under dense
    retention (a state no prefill wrote is promised by no retention rule)."""
    if case.geometry is None or case.geometry.retention_interval != 0:
        return []
    siblings = [i for i, k in enumerate(request_kinds(case)) if k == "sibling"]
    if not siblings:
        return []
    promise = predict_with_knobs(case, resolve_knobs(case, version), "promise")
    dense_case = with_retention(case, None)
    dense = run(dense_case)
    if "error" in dense:
        return check_engine_error(dense_case, version, dense)
    expected = list(obs["hits"])
    bad = []
    for i in siblings:
        if i < len(obs["hits"]) and i < len(dense["hits"]):
            floor = min(promise["hits"][i], dense["hits"][i])
            if obs["hits"][i] < floor:
                expected[i] = floor
                bad.append(i)
    if not bad:
        return []
    return [
        Divergence(
            "junction",
            version,
            bad,
            expected,
            obs["hits"],
            "expected = the promise at a junction, capped by the same engine under dense retention",
            {"model_explain": promise["explain"]},
        )
    ]
