"""The oracles of what the engine resolved for a case (its knobs, a
deployment's geometry), and turning a deployment case into the case the
model judges (:func:`resolved`): a case is judged with the geometry and
knobs the engine resolved, and those are judged first.

* ``knobs``: the engine resolved the same knobs as the reference model.
* ``resolution``: the geometry vLLM resolved for a deployment keeps what
  vLLM documents of its flags: with ``--prefix-match-unit`` U the hash
  block size is U (``CacheConfig.prefix_match_unit``, 0.29.0-0.33.0: "This
  equals to the hash_block_size used throughout the KV cache code"), and
  it divides every group's block size (the same docstring: "as long as
  every KV cache group's block_size is divisible by it"; vLLM rejects any
  other unit). A build that accepts the flag and hashes otherwise, or
  accepts a unit that does not divide a block, silently serves other hits
  than the deployment asked for. Judged on the engine's
  ``resolution`` before the case is resolved (a geometry that breaks it
  is not judged further); no request diverges.
"""

from __future__ import annotations

from engine_adapter.host.versions import engine_name
from engine_adapter.interface import Observation
from fuzz.judge.oracle_base import Divergence, engine_key
from ground.engines import DEFAULT_FAMILY, FAMILIES, Capability, EngineSpec
from reference.case import Case, with_resolution
from reference.knobs import resolve_knobs

#: Knob names both the model and the engine report: the ``knobs`` oracle
#: and ``kvspec run --compare`` compare these (one list; --compare also had
#: ``partial_hash_hits``, which the oracle now compares too).
COMPARED_KNOBS = (
    "eagle_drop",
    "hash_lookahead_tokens",
    "scheduler_block_size",
    "hash_block_size",
    "alignment",
    "partial_hash_hits",
)


def check_resolution(case: Case, version: EngineSpec | str, obs: Observation) -> list[Divergence]:
    """The engine's ``resolution`` of a deployment case against what vLLM
    documents of the deployment's flags (see the module docstring):
    ``prefix_match_unit`` set -> ``hash_block_size`` equals it, and the hash
    block divides every group's block size. Run on the observation before
    :func:`resolved` (a geometry breaking it may not parse); a hand case or
    an observation without a resolution is not judged. The divergence
    carries the hits unchanged; ``context``: ``rule`` (for the signature),
    ``resolution``."""
    r = obs.get("resolution") if case.deployment is not None and "error" not in obs else None
    family = FAMILIES.get((r or {}).get("engine_family") or DEFAULT_FAMILY)
    if family is None or not family.supports(
        Capability.RESOLUTION_RULE
    ):  # vLLM's documented flags; another family states its own
        return []
    g = (r or {}).get("geometry") or {}
    unit, hashed = g.get("prefix_match_unit"), g.get("hash_block_size")
    if hashed is None:
        return []
    hits = list(obs.get("hits") or [])
    quote = "vLLM's CacheConfig.prefix_match_unit: "
    if unit is not None and int(unit) != int(hashed):
        return _misresolved(
            version,
            hits,
            f"the deployment sets --prefix-match-unit {unit} and vLLM resolved hash_block_size={hashed} ({quote}"
            f'"This equals to the hash_block_size used throughout the KV cache code"): hits land on {hashed}-token boundaries, not {unit}',
            "prefix_match_unit",
            {"prefix_match_unit": int(unit), "hash_block_size": int(hashed)},
        )
    blocks = sorted(
        {int(x["block_size"]) for x in g.get("groups") or [] if int(x.get("block_size") or 0) % int(hashed)}
    )
    if blocks:
        return _misresolved(
            version,
            hits,
            f"vLLM resolved hash_block_size={hashed}, which does not divide the block size(s) {blocks} of its KV cache groups ({quote}"
            f'"as long as every KV cache group\'s block_size is divisible by it"; vLLM rejects such a unit): a hash key then spans a block boundary',
            "hash_divides_blocks",
            {"prefix_match_unit": unit, "hash_block_size": int(hashed), "blocks": blocks},
        )
    return []


def _misresolved(version: str, hits: list, detail: str, rule: str, resolution: dict) -> list[Divergence]:
    """A ``resolution`` divergence (the hits as observed: the geometry, not
    a hit, breaks ``rule``) with what vLLM resolved."""
    return [Divergence("resolution", version, [], hits, list(hits), detail, {"rule": rule, "resolution": resolution})]


def check_knobs(case: Case, version: EngineSpec | str, obs: Observation) -> list[Divergence]:
    model = resolve_knobs(case, version).as_dict()
    engine = obs.get("knobs") or {}
    wrong = [k for k in COMPARED_KNOBS if k in engine and engine[k] != model[k]]
    if not wrong:
        return []
    return [
        Divergence(
            "knobs",
            version,
            [],
            [model[k] for k in wrong],
            [engine[k] for k in wrong],
            "knobs differ: " + ", ".join(f"{k} model={model[k]} engine={engine[k]}" for k in wrong),
        )
    ]


def resolved(case: Case, obs: Observation, version: str | EngineSpec) -> Case:
    """The case the model judges: a deployment case with the geometry the
    engine resolved for it (the observation's ``resolution``); a hand case
    as it is."""
    if case.deployment is None or obs.get("resolution") is None:
        return case
    r = obs["resolution"]
    if r.get("geometry") is None:  # resolved to nothing the model states (SGLang's no_buffer)
        return case
    return with_resolution(case, r["geometry"], r["speculative"], engine_name(engine_key(version)))


def trace_units(resolution: dict) -> tuple[int, int]:
    """The block and hash block a trace is drawn on for an engine's
    resolution: its geometry's, else the engine's own units
    (``facts.block`` / ``facts.hash``: SGLang's ``no_buffer`` resolves to
    no geometry the model states)."""
    g = resolution.get("geometry")
    if g is None:
        facts = resolution["facts"]
        return facts["block"], facts["hash"]
    return g["scheduler_block_size"], g["hash_block_size"]


def comparable_resolutions(a: dict, b: dict) -> bool | None:
    """Did two engines resolve a deployment to the same geometry and
    speculative settings? None for hand cases (nothing resolved)."""
    ra, rb = a.get("resolution"), b.get("resolution")
    if ra is None or rb is None:
        return None
    return ra.get("geometry") == rb.get("geometry") and ra.get("speculative") == rb.get("speculative")
