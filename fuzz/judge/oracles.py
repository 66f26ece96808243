"""The dispatch of the oracles: :func:`check_all` runs every single-engine
oracle asked for on one observation, in a fixed order (engine errors end
it), and :func:`oracles_for` picks the oracles that judge an engine's
version. Which oracles exist, and what kind of judge each is, is
:mod:`fuzz.judge.oracle_registry` (every list of oracle names is derived
there); the rules they state are in :mod:`fuzz.judge.oracle_hits`,
:mod:`fuzz.judge.oracle_states`, :mod:`fuzz.judge.oracle_schedule`,
:mod:`fuzz.judge.oracle_resolution` and :mod:`fuzz.judge.oracle_base`, whose names
this module re-exports (``from fuzz.judge.oracles import check_stale`` holds).

A concurrent trace (requests that share scheduler steps, ``arrival``;
docs/concurrent.md): the oracles of :data:`CONCURRENT_ORACLES` judge every
request, ``stale`` by steps (an "earlier" write is one computed in a step
before the first step that ran the request: a state whose forward pass
runs in the same step is not there yet); the others judge the serial
prefix (:func:`serial_part`), where their rules were stated.
"""

from __future__ import annotations

from dataclasses import replace

from engine_adapter.interface import Observation
from fuzz.judge.oracle_base import Divergence, Run, check_engine_error, engine_key, first_load, promised, request_kinds  # noqa: F401 - re-exported
from fuzz.judge.oracle_hits import (  # noqa: F401 - re-exported
    check_junction,
    check_promise,
    check_reference,
    check_sparse_dense,
    check_spec_on_off,
    check_versions,
)
from fuzz.judge.oracle_outputs import check_outputs  # noqa: F401 - re-exported
from fuzz.judge.oracle_registry import (  # noqa: F401 - re-exported
    BUILD_ORACLES,
    CONCURRENT_ORACLES,
    EXTRA_ORACLES,
    KNOWN_ORACLES,
    LOCAL_ORACLES,
    NEUTRAL_ORACLES,
    ORACLES,
    PRESSURE_ORACLES,
    SAFETY_ORACLES,
    SAME_HITS_ORACLES,
)
from fuzz.judge.oracle_resolution import COMPARED_KNOBS, check_knobs, check_resolution, comparable_resolutions, resolved  # noqa: F401 - re-exported
from fuzz.judge.oracle_safety import check_cap, check_draft_keys, check_keys  # noqa: F401 - re-exported
from fuzz.judge.oracle_schedule import (  # noqa: F401 - re-exported
    check_block_table,
    check_checkpoint,
    check_hit_blocks,
    check_shared_prefix,
    check_split,
)
from fuzz.judge.oracle_states import (  # noqa: F401 - re-exported
    SAME_STEP_READ,
    check_resumed_state,
    check_retention,
    check_stale,
    held_states,
    stale_keys,
    writes_before,
    written_before,
)
from ground.engines import FAMILIES, Capability, EngineSpec, family_of, load
from reference.case import Case, is_concurrent, serial_prefix, waves


def _memo(run: Run) -> Run:
    """``run`` that runs each variant once (variants are compared by value)."""
    seen: dict = {}

    def once(variant: Case) -> dict:
        key = repr(variant)
        if key not in seen:
            seen[key] = run(variant)
        return seen[key]

    return once


def oracles_for(version: str, oracles: tuple[str, ...] = ORACLES) -> tuple[str, ...]:
    """The oracles that judge engine ``version``: all of ``oracles`` for a
    vLLM release, :data:`BUILD_ORACLES` among them for a build
    (``X+LABEL.HASH``), :data:`NEUTRAL_ORACLES` among them for another
    family (``sglang==X``: the promise's own rules, not vLLM's), with the
    oracles whose rule the family states itself (``Family.own_checks``);
    a family with real weights (``Capability.OUTPUTS``) is judged by
    ``outputs`` too."""
    family = FAMILIES.get(family_of(version))
    if family is not None and not family.supports(Capability.RULE_MODEL):
        own = own_checks(version)
        chosen = tuple(o for o in oracles if o in NEUTRAL_ORACLES or o in own)
        if family.supports(Capability.OUTPUTS) and "outputs" not in chosen and "promise" in oracles:
            chosen += ("outputs",)  # with a campaign's set (its promise in it), not a finding's one oracle
        return chosen
    if "+" not in version:
        return oracles
    return tuple(o for o in oracles if o in BUILD_ORACLES)


def own_checks(version: str) -> dict:
    """The family's own checks by oracle name (``Family.own_checks``), or {}."""
    family = FAMILIES.get(family_of(version))
    return {} if family is None or family.own_checks is None else load(family.own_checks)


#: The oracles that read one observation and nothing else, in the order
#: :func:`check_all` runs them.
SINGLE_RUN_CHECKS = (
    ("knobs", check_knobs),
    ("promise", check_promise),
    ("cap", check_cap),
    ("keys", check_keys),
    ("draft_keys", check_draft_keys),
    ("stale", check_stale),
    ("resumed_state", check_resumed_state),
    ("retention", check_retention),
    ("split", check_split),
    ("checkpoint", check_checkpoint),
    ("hit_blocks", check_hit_blocks),
    ("shared_prefix", check_shared_prefix),
    ("block_table", check_block_table),
    ("reference", check_reference),
    ("outputs", check_outputs),
)


def serial_part(case: Case, obs: Observation) -> tuple[Case, Observation] | None:
    """A concurrent trace's serial prefix (:func:`reference.case.serial_prefix`)
    as a serial case of its own, with the observation of those requests
    (they ran alone, as they would in that case); None when there is none."""
    k = serial_prefix(case)
    if k == 0:
        return None
    part = dict(obs)
    for key in ("hits", "queries", "explain"):
        if isinstance(obs.get(key), list):
            part[key] = obs[key][:k]
    return replace(case, trace=case.trace[:k]), part


def before_pressure(case: Case, obs: Observation) -> int | None:
    """Where a trace comes under pressure: the first request of the first
    wave (``reference.case.waves``) holding a request whose observation says
    it was preempted (``explain[i].preempted_steps``), or, on a pool the
    deployment sized (the resolution's fact ``pool_set_by_deployment``), whose
    allocations evicted cached blocks (``explain[i].evicted``); None where
    none did. On kvspec's own pool (sized from the trace) an eviction is
    the engine's reuse of a block it freed, as on a deployment's large pool,
    and every oracle judges every request, as before pressure was drawn."""
    explain = obs.get("explain") or []
    facts = (obs.get("resolution") or {}).get("facts") or {}
    pinned = facts.get("pool_set_by_deployment") is True
    hit = [
        i
        for i, e in enumerate(explain)
        if isinstance(e, dict) and (e.get("preempted_steps") or (pinned and e.get("evicted")))
    ]
    if not hit:
        return None
    return next(w[0] for w in waves(case) if hit[0] in w)


def prefix_part(case: Case, obs: Observation, k: int) -> tuple[Case, Observation]:
    """The first ``k`` requests as a case of their own, with their observation."""
    part = dict(obs)
    for key in ("hits", "queries", "explain"):
        if isinstance(obs.get(key), list):
            part[key] = obs[key][:k]
    return replace(case, trace=case.trace[:k]), part


def check_all(
    case: Case,
    version: str | EngineSpec,
    obs: Observation,
    run: Run | None = None,
    oracles: tuple[str, ...] = ORACLES,
) -> list[Divergence]:
    """Every single-engine oracle, in a fixed order; engine errors end it.
    On a concurrent trace, the oracles of :data:`CONCURRENT_ORACLES` judge
    every request; the others judge only its serial prefix
    (:func:`serial_part`), where their rules were stated. Each oracle
    judges the requests before the first place its rule stops holding
    (:func:`judged_ends`): under pressure, or from a KV connector's first
    load. ``version``: the typed engine (the checks take it as it is and
    resolve their knobs from it, never reading a name again; a family's own
    checks take its version key), or a version key (a test's, a host
    helper's)."""
    if "error" in obs:
        return check_engine_error(case, engine_key(version), obs) if "engine_error" in oracles else []
    ends = judged_ends(case, obs, oracles)
    out: list[Divergence] = []
    for k in sorted(set(ends.values()), key=lambda k: -1 if k is None else -k):  # the whole trace, then longest first
        group = tuple(o for o in oracles if ends[o] == k)
        if k is None:
            out += _check_trace(case, version, obs, run, group)
        elif k > 0:
            part, part_obs = prefix_part(case, obs, k)
            out += _check_trace(part, version, part_obs, run, group)
    return out


def judged_ends(case: Case, obs: Observation, oracles: tuple[str, ...]) -> dict[str, int | None]:
    """For each of ``oracles``, how many requests it judges: None for every
    one, else the first k. Where its rule stops holding, by the registry's
    declarations (``fuzz.judge.oracle_registry``):

    * under pressure (:func:`before_pressure`) every oracle but those of
      :data:`PRESSURE_ORACLES` (the safety oracles, and those declared
      ``pressure``);
    * from a KV connector's first load (:func:`first_load`) the oracles of
      :data:`LOCAL_ORACLES` (declared ``local``: the local prefix cache's rules)."""
    pressure, load = before_pressure(case, obs), first_load(obs)

    def end(oracle: str) -> int | None:
        cuts = [
            k
            for k, stops in ((pressure, oracle not in PRESSURE_ORACLES), (load, oracle in LOCAL_ORACLES))
            if stops and k is not None
        ]
        return min(cuts) if cuts else None

    return {o: end(o) for o in oracles}


def _check_trace(
    case: Case, version: str | EngineSpec, obs: Observation, run: Run | None, oracles: tuple[str, ...]
) -> list[Divergence]:
    if not is_concurrent(case):
        return _check(case, version, obs, run, oracles)
    out = _check(case, version, obs, None, tuple(o for o in oracles if o in CONCURRENT_ORACLES))
    serial = serial_part(case, obs)
    rest = tuple(o for o in oracles if o not in CONCURRENT_ORACLES)
    if serial is not None and rest:
        out += _check(serial[0], version, serial[1], run, rest)
    return out


def _check(
    case: Case, typed: str | EngineSpec, obs: Observation, run: Run | None, oracles: tuple[str, ...]
) -> list[Divergence]:
    """The checks of ``oracles`` on one trace. The engine-neutral checks
    take ``typed`` as it is (issue 41: the judge takes the typed engine,
    never a key to parse again); a family's own check takes its version key."""
    version = engine_key(typed)
    out: list[Divergence] = []
    own = own_checks(version)
    for name, check in SINGLE_RUN_CHECKS:
        if name in oracles:
            out += own[name](case, version, obs) if name in own else check(case, typed, obs)
    if run is not None and "sparse_dense" in oracles and "junction" in oracles:
        run = _memo(run)  # one dense run for both
    if run is not None and "sparse_dense" in oracles:
        out += check_sparse_dense(case, typed, obs, run)
    if run is not None and "junction" in oracles:
        out += check_junction(case, typed, obs, run)
    if run is not None and "spec_on_off" in oracles:
        out += check_spec_on_off(case, typed, obs, run)
    return out
