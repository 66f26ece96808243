"""The one interface an engine family implements, and the observation it
returns: the contract between the engine package and the judge.

A **family** (vLLM now: :mod:`engine_adapter.vllm_engine`; SGLang joins as
a sibling) runs inside its engine's environment and offers a driver with
three jobs, whichever way a case reaches it (in-process, a worker's pipe,
a warm engine's socket):

* ``resolve(case)``: a deployment (model config + serve flags) resolved by
  the engine's own code: the geometry, the facts read, the assumptions;
* ``run(case, options)``: the case's trace through the engine's real
  scheduler and cache, returning an :class:`Observation`;
* ``version``: the release it imports.

An :class:`Observation` is what the engine did, never a judgement: the hits
and lookups the engine's own metrics count, the knobs read from the objects
it built, and per request what was observed (:class:`RequestObservation`).
If the engine raised, ``error`` says where (:class:`EngineFailure`); only
``kind: "vllm"`` is the engine's own failure, any other kind is kvspec's
(``fuzz.judge.verdict.harness_error_of``). The wire carries it as JSON
(:mod:`engine_adapter.protocol`); the types here are ``TypedDict`` so the
same dicts are read on both sides, and :func:`observation_problem` checks
the shape where an observation enters kvspec's interpreter: a worker that
answers something else is a harness error, never a finding.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, TypedDict

from ground.engines import FAMILIES as _REGISTRY
from ground.errors import Unsupported, invalid
from reference.case import Case, is_concurrent, parse_case

#: The families kvspec drives: family name -> the module (inside the
#: family's environment) whose ``get_driver()`` returns its driver; read
#: from the one registry, ``ground.engines.FAMILIES``.
FAMILIES = {f.name: f.driver for f in _REGISTRY.values()}


class ReleaseOfPackage:
    """A driver's ``version`` and ``name``, read from its family's installed
    package (``ground.engines`` entry's ``package``): a subclass sets
    ``family``."""

    family: str

    def __init__(self) -> None:
        import importlib.metadata

        self.version = importlib.metadata.version(_REGISTRY[self.family].package)
        self.name = f"{self.family}=={self.version}"


def as_case(case: Case | dict) -> Case:
    """A case a driver was handed (parsed already, or its dict)."""
    return case if isinstance(case, Case) else parse_case(case)


def family_deployment(case: Case, family: str):
    """The case's deployment, when it is one of ``family``'s (a family that
    runs only deployments); else one line built from the family's
    ``ground.engines`` entry (its title and serve-flag field)."""
    entry = _REGISTRY[family]
    if case.deployment is None or case.deployment.engine != family:
        raise Unsupported(
            f'case.deployment: {entry.title} runs deployment cases with "engine": "{family}"; '
            f"allowed: a deployment block with engine {family} and {entry.args_field}"
        )
    return case.deployment


def check_requests(case: Case, family: str, most: int, serial_note: str = "") -> None:
    """A driver's ``check_case`` prologue: at most ``most`` requests, and a
    serial trace (``serial_note``: why, after "serial requests")."""
    title = _REGISTRY[family].title
    if len(case.trace) > most:
        raise Unsupported(f"trace: {len(case.trace)} requests; allowed on {title}: at most {most}")
    if is_concurrent(case):
        raise Unsupported(f"trace: a concurrent trace (arrival); allowed on {title}: serial requests{serial_note}")


class EngineFailure(TypedDict, total=False):
    """Where a run stopped: ``kind`` ``vllm`` (the engine raised; ``phase``
    config / add_request / step, at ``request``) or kvspec's own
    (``worker``, ``internal``, ``protocol``)."""

    kind: str
    phase: str
    request: int | None
    type: str
    message: str
    traceback: str | None


class RequestObservation(TypedDict, total=False):
    """One request, as the engine served it (vLLM: ``driver.VllmDriver._explain``)."""

    request: int
    prompt_tokens: int
    hit: int  # tokens the engine's hit metric counted
    query: int
    scheduler_hit: int | None  # what the scheduler's lookup returned
    junction: int | None
    shared_prefix_boundary: int | None
    lookups: int
    attention_blocks: list[int] | None
    boundaries: list[int] | None
    chunk_ends: list[int]
    decode_steps: list[list[int]]
    computed_tokens: int  # tokens computed once it finished (prompt and outputs but the last)
    written: list[int] | None  # positions at which a prefill wrote a Mamba state
    cache_blocks: list[int]
    retained_mamba_blocks: dict[str, list[int]] | None
    retained_mamba_tokens: dict[str, list[int]] | None
    retained_output_states: list[int] | None
    retained_mamba_by_group: dict[str, Any]
    block_table: list[list[int]]
    leaked_blocks: int
    steps: int
    # a concurrent trace: when it ran, and when each state was written
    first_step: int | None
    written_steps: list[list[int | None]] | None
    wave: list[int]
    wave_stats: dict[str, int]
    preempted_hits: int
    preempted_queries: int
    # the safety oracles (fuzz.judge.oracle_safety, fuzz.judge.oracle_states)
    #: the highest position the engine may resume this request at, where the
    #: family reports its own; absent: N - 1, the bound of every engine that
    #: samples from the last prompt token's logits
    resume_cap: int | None
    #: what the stood-in forward pass read where the request resumed:
    #: ``{"observable": bool, "tokens": count or None, "same_tokens": bool}``
    #: (absent or ``observable`` false: ``resumed_state`` does not judge it)
    resumed_state: dict[str, Any] | None
    external_hit: int


class Observation(TypedDict, total=False):
    """What one run of a case observed (the worker's ``run`` result)."""

    engine: str
    hits: list[int]
    queries: list[int]
    knobs: dict[str, Any] | None
    explain: list[RequestObservation]
    error: EngineFailure
    resolution: dict[str, Any]
    timing: dict[str, float]
    vllm_files_sha256: str
    harness: dict[str, Any]


def served_observation(engine: str, explain: list, **rest: Any) -> Observation:
    """The observation of a family that reports no knobs (vLLM's alone
    does): each request's hit and query read from its ``explain`` row, then
    ``rest`` (resolution, timing, harness, error)."""
    return {
        "engine": engine,
        "hits": [e["hit"] for e in explain],
        "queries": [e["query"] for e in explain],
        "knobs": None,
        "explain": explain,
        **rest,
    }


class FamilyDriver(Protocol):
    """What a family's ``get_driver()`` returns, inside its environment."""

    family: str  # its key in FAMILIES
    version: str

    def resolve(self, case: Any) -> dict[str, Any]: ...

    def run(self, case: Any, options: dict | None = None) -> Observation: ...


def family_module(family: str = "vllm"):
    """The family's driver module in this interpreter (imports the engine):
    ``get_driver()``, ``selftest_case()``, ``IMPORT_CHECK`` (the engine's
    modules an import-only self-test imports)."""
    if family not in _REGISTRY:  # the registry as it stands (a family added after import counts)
        raise invalid("family", family, f"allowed: {', '.join(_REGISTRY)}")
    return importlib.import_module(_REGISTRY[family].driver)


def get_driver(family: str = "vllm") -> FamilyDriver:
    """The driver of ``family`` in this interpreter (imports the engine)."""
    return family_module(family).get_driver()


def _ints(value: object, allow_none: bool = False) -> bool:
    return isinstance(value, list) and all(
        (isinstance(x, int) and not isinstance(x, bool)) or (allow_none and x is None) for x in value
    )


def observation_problem(result: object) -> str | None:
    """What is wrong with the shape of an observation (one line naming the
    field), or None when it has the shape the judge reads: ``hits`` and
    ``queries`` lists of ints, one ``explain`` object per request with its
    index, ``error`` an object with a string ``kind``."""
    if not isinstance(result, dict):
        return f"observation={type(result).__name__}: must be a JSON object"
    for key in ("hits", "queries"):
        if not _ints(result.get(key)):
            return f"observation.{key}={str(result.get(key))[:60]}: must be a list of integers"
    explain = result.get("explain")
    if not isinstance(explain, list) or not all(isinstance(e, dict) for e in explain):
        return f"observation.explain={str(explain)[:60]}: must be a list of objects"
    if not len(result["hits"]) == len(result["queries"]) == len(explain):
        return f"observation: hits, queries and explain have {len(result['hits'])}, {len(result['queries'])} and {len(explain)} entries; allowed: one each per request served"
    for i, e in enumerate(explain):
        if not isinstance(e.get("request"), int) or isinstance(e.get("request"), bool):
            return f"observation.explain[{i}].request={e.get('request')!r}: must be the request's index"
    if "error" in result:
        err = result["error"]
        if not isinstance(err, dict) or not isinstance(err.get("kind"), str):
            return f"observation.error={str(err)[:60]}: must be an object with a string kind"
    if result.get("knobs") is not None and not isinstance(result["knobs"], dict):
        return f"observation.knobs={str(result['knobs'])[:60]}: must be an object or null"
    return None
