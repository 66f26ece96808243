"""The case: one experiment, as kvspec reads it from a JSON file.

A case is a block geometry, optional speculative-decoding settings and a
trace of requests. By default every request finishes before the next is
sent, so the prefix cache a request sees is exactly what the earlier ones
left. A request with ``"arrival": d`` is sent ``d`` scheduler steps after
the previous one was sent (0: into the same step), while the earlier ones
may still run, as a server batches requests: a concurrent trace
(:func:`waves`). A request that arrives while the engine is idle is sent
at once.

Schema 1 (JSON)::

    {"schema": 1, "name": "seed-53504",
     "geometry": {"groups": [{"kind": "full_attention", "block_size": 1600},
                             {"kind": "mamba", "block_size": 1600, "count": 3}],
                  "hash_block_size": null, "prefix_match_unit": null,
                  "scheduler_block_size": null, "retention_interval": 0,
                  "max_num_batched_tokens": 8192},
     "speculative": {"method": "mtp", "num_speculative_tokens": 2},
     "trace": [{"prompt": [{"segment": "A", "length": 11910}], "max_tokens": 1}]}

Resolution (as vLLM 0.33.0 ``kv_cache_utils.resolve_kv_cache_block_sizes``):
``scheduler_block_size`` defaults to the LCM of the group block sizes;
``hash_block_size`` defaults to ``prefix_match_unit`` when set, else to the
single group's block size, else to the GCD of the group block sizes.

Tokens: a segment ``{"segment": "A", "length": L}`` stands for the first L
tokens of the deterministic infinite stream named ``A``; a prompt is its
segments concatenated. So ``A:5000`` is a prefix of ``A:11910`` and
``[A:5000, B:300]`` / ``[A:5000, C:300]`` are siblings diverging at 5000
(the model always uses the real longest common prefix of the token lists).

Outputs (the chat shape): a segment ``{"output": j}`` stands for the tokens
request j generated: ``trace[j].max_tokens`` copies of
:data:`reference.tokens.OUTPUT_TOKEN` (the case defines every output; an
engine's stood-in sampler samples that token). j must name a request that
finished before this one is sent (an earlier wave: in a serial trace, any
earlier request). So ``[A:5000, {"output": 0}, B:300]`` is turn 2 of a
conversation whose turn 1 (request 0) was ``A:5000``. What vLLM 0.33.0
caches of an output, and where such a follow-up resumes:
:mod:`reference.serial` (``output_states``).

Limits: :mod:`reference.limits` (each refused with one line naming the
field; docs/case-format.md states the same).

A case or finding file is read as :mod:`ground.files` reads a stranger's
JSON file.

Over 500 lines on purpose: one format, so its dataclasses, its parser and
its writer stay in one module (the token streams are :mod:`reference.tokens`,
the limits :mod:`reference.limits`).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ground.engines import FAMILIES
from ground.errors import InvalidArgument, Unsupported, invalid
from ground.files import field_key, load_json, write_json_atomic
from reference.deployment import Deployment, parse_deployment
from reference.limits import (  # noqa: F401 - the case's limits, also read from here
    MAX_ARRIVAL_STEPS,
    MAX_BATCHED_TOKENS,
    MAX_BLOCK_SIZE,
    MAX_CASE_TOKENS,
    MAX_GROUP_COUNT,
    MAX_GROUPS,
    MAX_MAX_TOKENS,
    MAX_PROMPT_TOKENS,
    MAX_REQUESTS,
    MAX_RETENTION_INTERVAL,
    MAX_SEGMENTS,
    MAX_SPECULATIVE_TOKENS,
)
from reference.tokens import OUTPUT_TOKEN, TOKEN_VOCAB, draw_tokens, output_tokens, segment_tokens  # noqa: F401 - read from here too

SCHEMA_VERSION = 1

#: Group kinds the model covers. Others are rejected, never guessed.
GROUP_KINDS = ("full_attention", "mamba")
#: Speculative methods whose drafter needs the EAGLE block drop in vLLM
#: (``SpeculativeConfig.needs_eagle_block_drop``: its KV at a position reads
#: the next token).
EAGLE_METHODS = ("mtp", "eagle", "eagle3")
#: Speculative methods a case may name: the EAGLE ones and ``ngram``
#: (vLLM's prompt-lookup proposer: drafts from the prompt itself, no drafter
#: model, no drafter KV, so no block drop and no lookahead hashes; its
#: drafts still widen each decode step and the Mamba groups' speculative
#: blocks).
SPECULATIVE_METHODS = (*EAGLE_METHODS, "ngram")
#: vLLM's own SpeculativeConfig option names that change prefix caching.
SPECULATIVE_OPTIONS = ("disable_eagle_block_drop", "disable_lookahead_block_hashes")
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
_SEGMENT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class Group:
    """``count`` KV cache groups of one kind and block size."""

    kind: str
    block_size: int
    count: int = 1


@dataclass(frozen=True)
class Geometry:
    """Block sizes and cache policy, with defaults already resolved."""

    groups: tuple[Group, ...]
    hash_block_size: int
    scheduler_block_size: int
    prefix_match_unit: int | None = None
    #: None = dense retention, 0 = sparse (vLLM's default), >0 = periodic.
    retention_interval: int | None = 0
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    #: Internal Mamba prefill checkpoints (a kernel exports the prompt's
    #: checkpoint from inside a prefill): None = off, else the grid the
    #: checkpoint offset must lie on (vLLM's ``prefill_checkpoint_alignment``).
    prefill_checkpoint_grid: int | None = None
    #: vLLM's ``--enable-mamba-shared-prefix-checkpoint`` (0.32.0+).
    shared_prefix_checkpoint: bool = False
    #: The block the align-mode prefill split works in (``cache_config.
    #: block_size`` as the scheduler reads it); None = the smallest group
    #: block. vLLM's CPU engine core resets it to 128 below a larger KV block
    #: up to 0.32.0 (``engine_adapter.vllm_engine.engine_core.engine_core_handshake``).
    split_block_size: int | None = None

    @property
    def split_block(self) -> int:
        """The block ``Scheduler._mamba_block_aligned_split`` splits on."""
        return self.split_block_size or min(g.block_size for g in self.groups)

    # Derived from ``groups`` once per geometry (the model asks per request).
    @cached_property
    def num_groups(self) -> int:
        return sum(g.count for g in self.groups)

    @cached_property
    def mamba_block_sizes(self) -> tuple[int, ...]:
        return tuple(g.block_size for g in self.groups if g.kind == "mamba")

    @cached_property
    def attention_block_sizes(self) -> tuple[int, ...]:
        return tuple(g.block_size for g in self.groups if g.kind == "full_attention")


@dataclass(frozen=True)
class Speculative:
    """Speculative decoding settings, in vLLM's own option names."""

    method: str
    num_speculative_tokens: int
    options: dict[str, bool] = field(default_factory=dict)

    def option(self, name: str) -> bool:
        return bool(self.options.get(name, False))


#: The ``segment`` name of an output segment (no stream can have it: it is
#: not a valid segment name).
OUTPUT_SEGMENT = "<output>"


@dataclass(frozen=True)
class Segment:
    """The first ``length`` tokens of the stream named ``segment``; or, with
    ``output`` j set (``segment`` is then :data:`OUTPUT_SEGMENT`), request
    j's output, ``length`` = its ``max_tokens``."""

    segment: str
    length: int
    output: int | None = None


@dataclass(frozen=True)
class Request:
    prompt: tuple[Segment, ...]
    max_tokens: int = 1
    #: None: sent once every earlier request has finished (a serial trace).
    #: An int d: sent d scheduler steps after the previous request was sent,
    #: while earlier ones may still run (0: in the same step); see
    #: :func:`waves`.
    arrival: int | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return sum(s.length for s in self.prompt)


@dataclass(frozen=True)
class Case:
    """A hand case (geometry and speculative settings written out), a
    deployment case (``deployment`` set, ``geometry`` None until an engine
    resolves it), or a resolved one (both, and ``resolved_by``)."""

    geometry: Geometry | None
    speculative: Speculative | None
    trace: tuple[Request, ...]
    name: str | None = None
    deployment: Deployment | None = None
    #: ``vllm==X`` whose resolution of ``deployment`` filled geometry and speculative.
    resolved_by: str | None = None

    @property
    def kind(self) -> str:
        """``hand`` (a geometry written by hand) or ``deployment``."""
        return "hand" if self.deployment is None else "deployment"


# ---------------------------------------------------------------- tokens


def prompt_tokens(request: Request) -> list[int]:
    """The token ids of a request's prompt: its segments concatenated."""
    tokens: list[int] = []
    for seg in request.prompt:
        tokens.extend(output_tokens(seg.length) if seg.output is not None else segment_tokens(seg.segment, seg.length))
    return tokens


def sequence_tokens(request: Request) -> list[int]:
    """The token ids of a request's whole sequence: its prompt, then its
    output (``max_tokens`` copies of :data:`OUTPUT_TOKEN`). A state or
    block inside the output is over these tokens."""
    return prompt_tokens(request) + output_tokens(request.max_tokens)


def output_segment(j: int, trace: tuple[Request, ...] | list[Request]) -> Segment:
    """The segment standing for request j's output in ``trace``."""
    return Segment(OUTPUT_SEGMENT, trace[j].max_tokens, j)


def quotes_output(request: Request) -> bool:
    """Whether a prompt holds an earlier request's output (the chat shape)."""
    return any(s.output is not None for s in request.prompt)


def resync_outputs(trace: tuple[Request, ...], kept: list[int] | None = None) -> tuple[Request, ...] | None:
    """``trace`` with every output segment's length set to its request's
    ``max_tokens`` again; with ``kept`` (the old indices of the requests
    left, in order), the output indices renumbered too. None where a
    request left quotes one that is gone, or one no longer in an earlier
    wave (what :func:`parse_case` would refuse)."""
    where = {old: new for new, old in enumerate(kept)} if kept is not None else None
    out: list[Request] = []
    start = 0  # the first request of the current wave
    for i, r in enumerate(trace):
        if r.arrival is None or i == 0:
            start = i
        if not quotes_output(r):
            out.append(r)
            continue
        prompt = []
        for s in r.prompt:
            if s.output is None:
                prompt.append(s)
                continue
            j = s.output if where is None else where.get(s.output)
            if j is None or j >= start:
                return None
            prompt.append(output_segment(j, trace))
        out.append(Request(tuple(prompt), r.max_tokens, r.arrival))
    return tuple(out)


# ---------------------------------------------------------------- parsing


def _check_fields(obj: Any, where: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
    if not isinstance(obj, dict):
        raise invalid(where, obj, "must be a JSON object")
    for key in obj:
        if key not in allowed:
            raise invalid(f"{where}.{field_key(key)}", obj[key], f"unknown field; allowed: {', '.join(allowed)}")
    for key in required:
        if key not in obj:
            raise InvalidArgument(f"{where}.{key}: missing; required field")
    return obj


def _int(
    obj: dict, key: str, where: str, *, minimum: int, maximum: int, default: Any = ..., nullable: bool = False
) -> Any:
    """``obj[key]`` as an int in [minimum, maximum] (a bool is not an int
    here), ``default`` when absent, None when null and ``nullable``."""
    if key not in obj:
        if default is ...:
            raise InvalidArgument(f"{where}.{key}: missing; required field")
        return default
    value = obj[key]
    if value is None and nullable:
        return None
    allowed = f"an integer in [{minimum:,}, {maximum:,}]" + (" or null" if nullable else "")
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{where}.{key}", value, f"must be {allowed}")
    if not minimum <= value <= maximum:
        raise invalid(f"{where}.{key}", value, f"must be {allowed}")
    return value


def _parse_groups(raw: Any) -> tuple[Group, ...]:
    if not isinstance(raw, list) or not raw:
        raise invalid("geometry.groups", raw, "must be a non-empty list of groups")
    if len(raw) > MAX_GROUPS:
        raise invalid("geometry.groups", f"<{len(raw)} groups>", f"at most {MAX_GROUPS} groups")
    groups = []
    total = 0
    for i, g in enumerate(raw):
        where = f"geometry.groups[{i}]"
        _check_fields(g, where, ("kind", "block_size", "count"), ("kind", "block_size"))
        if not isinstance(g["kind"], str) or g["kind"] not in GROUP_KINDS:
            raise invalid(f"{where}.kind", g["kind"], f"allowed: {', '.join(GROUP_KINDS)}")
        group = Group(
            g["kind"],
            _int(g, "block_size", where, minimum=1, maximum=MAX_BLOCK_SIZE),
            _int(g, "count", where, minimum=1, maximum=MAX_GROUP_COUNT, default=1),
        )
        total += group.count
        if total > MAX_GROUPS:
            raise invalid(f"{where}.count", group.count, f"at most {MAX_GROUPS} KV cache groups in all (counts summed)")
        groups.append(group)
    return tuple(groups)


def _divides_every_block(where: str, value: int, groups: tuple[Group, ...]) -> None:
    """``value`` (the geometry field ``where``) must divide every group's
    block size; the first group it does not divide is named."""
    for i, g in enumerate(groups):
        if g.block_size % value:
            raise invalid(
                where, value, f"must divide every group block size; geometry.groups[{i}].block_size={g.block_size}"
            )


def parse_geometry(raw: Any) -> Geometry:
    """Validate and resolve a geometry; every rule names its field."""
    _check_fields(
        raw,
        "geometry",
        (
            "groups",
            "hash_block_size",
            "prefix_match_unit",
            "scheduler_block_size",
            "retention_interval",
            "max_num_batched_tokens",
            "prefill_checkpoint_grid",
            "shared_prefix_checkpoint",
            "split_block_size",
        ),
        ("groups",),
    )
    groups = _parse_groups(raw["groups"])
    sizes = [g.block_size for g in groups]
    lcm = math.lcm(*sizes)
    if lcm > MAX_BLOCK_SIZE:
        raise invalid(
            "geometry.groups",
            sorted(set(sizes))[:8],
            f"the LCM of the block sizes ({lcm}) is the scheduler block; allowed: at most {MAX_BLOCK_SIZE:,}",
        )
    unit = _int(raw, "prefix_match_unit", "geometry", minimum=1, maximum=MAX_BLOCK_SIZE, default=None, nullable=True)
    if unit is not None:
        _divides_every_block("geometry.prefix_match_unit", unit, groups)
    default_hash = (
        unit if unit is not None else (sizes[0] if len(groups) == 1 and groups[0].count == 1 else math.gcd(*sizes))
    )
    hash_block = _int(
        raw, "hash_block_size", "geometry", minimum=1, maximum=MAX_BLOCK_SIZE, default=None, nullable=True
    )
    if hash_block is None:
        hash_block = default_hash
    elif unit is not None and hash_block != unit:
        raise invalid(
            "geometry.hash_block_size", hash_block, f"must equal geometry.prefix_match_unit={unit} when both are set"
        )
    _divides_every_block("geometry.hash_block_size", hash_block, groups)
    sched = _int(
        raw, "scheduler_block_size", "geometry", minimum=1, maximum=MAX_BLOCK_SIZE, default=None, nullable=True
    )
    if sched is None:
        sched = lcm
    elif sched % lcm:
        raise invalid(
            "geometry.scheduler_block_size", sched, f"must be a multiple of every group block size (LCM {lcm})"
        )
    retention = _int(
        raw, "retention_interval", "geometry", minimum=0, maximum=MAX_RETENTION_INTERVAL, default=0, nullable=True
    )
    if retention and retention % sched:
        raise invalid(
            "geometry.retention_interval",
            retention,
            f"must be null (dense), 0 (sparse) or a positive multiple of scheduler_block_size={sched}",
        )
    budget = _int(
        raw,
        "max_num_batched_tokens",
        "geometry",
        minimum=1,
        maximum=MAX_BATCHED_TOKENS,
        default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
    )
    grid = _int(
        raw, "prefill_checkpoint_grid", "geometry", minimum=1, maximum=MAX_BLOCK_SIZE, default=None, nullable=True
    )
    if grid is not None and not any(g.kind == "mamba" for g in groups):
        raise invalid("geometry.prefill_checkpoint_grid", grid, "needs a mamba group; allowed: null")
    shared_ckpt = raw.get("shared_prefix_checkpoint", False)
    if not isinstance(shared_ckpt, bool):
        raise invalid("geometry.shared_prefix_checkpoint", shared_ckpt, "must be true or false")
    split = _int(raw, "split_block_size", "geometry", minimum=1, maximum=MAX_BLOCK_SIZE, default=None, nullable=True)
    if split is not None and any(g.block_size % split for g in groups):
        raise invalid(
            "geometry.split_block_size", split, "must divide every group block size (the prefill split's block)"
        )
    if split == min(g.block_size for g in groups):
        split = None
    return Geometry(groups, hash_block, sched, unit, retention, budget, grid, shared_ckpt, split)


def parse_speculative(raw: Any) -> Speculative | None:
    if raw is None:
        return None
    _check_fields(
        raw,
        "speculative",
        ("method", "num_speculative_tokens", *SPECULATIVE_OPTIONS),
        ("method", "num_speculative_tokens"),
    )
    if not isinstance(raw["method"], str) or raw["method"] not in SPECULATIVE_METHODS:
        raise invalid("speculative.method", raw["method"], f"allowed: {', '.join(SPECULATIVE_METHODS)}")
    k = _int(raw, "num_speculative_tokens", "speculative", minimum=1, maximum=MAX_SPECULATIVE_TOKENS)
    options = {}
    for name in SPECULATIVE_OPTIONS:
        if name in raw:
            if not isinstance(raw[name], bool):
                raise invalid(f"speculative.{name}", raw[name], "must be true or false")
            options[name] = raw[name]
    return Speculative(raw["method"], k, options)


def _parse_output(s: dict, sw: str, earlier: tuple[Request, ...], wave_start: int) -> Segment:
    """An output segment ``{"output": j}``: j names a request that finished
    before this one is sent (an earlier wave)."""
    _check_fields(s, sw, ("output",), ("output",))
    if wave_start == 0:
        raise invalid(
            f"{sw}.output",
            s["output"],
            "no request finished before this one is sent (it is in the first wave); allowed: a stream segment",
        )
    j = s["output"]
    if isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < wave_start:
        raise invalid(
            f"{sw}.output",
            j,
            f"must name a request that finished before this one is sent (an earlier wave); allowed: an integer in [0, {wave_start - 1:,}]",
        )
    return output_segment(j, earlier)


def parse_request(raw: Any, i: int, earlier: tuple[Request, ...] = ()) -> Request:
    """Request ``i``; ``earlier``: the requests before it (an output
    segment quotes one of them)."""
    where = f"trace[{i}]"
    _check_fields(raw, where, ("prompt", "max_tokens", "arrival"), ("prompt",))
    arrival = _arrival(raw, i)
    prompt = raw["prompt"]
    if not isinstance(prompt, list) or not prompt:
        raise invalid(f"{where}.prompt", prompt, "must be a non-empty list of segments")
    if len(prompt) > MAX_SEGMENTS:
        raise invalid(f"{where}.prompt", f"<{len(prompt)} segments>", f"at most {MAX_SEGMENTS} segments per prompt")
    segments = []
    tokens = 0
    for j, s in enumerate(prompt):
        sw = f"{where}.prompt[{j}]"
        if isinstance(s, dict) and "output" in s:
            segments.append(_parse_output(s, sw, earlier, _wave_start(i, arrival, earlier)))
        else:
            _check_fields(s, sw, ("segment", "length", "output"), ("segment", "length"))
            if not isinstance(s["segment"], str) or not _SEGMENT_NAME.match(s["segment"]):
                raise invalid(f"{sw}.segment", s["segment"], "must be 1-64 characters of [A-Za-z0-9_.-]")
            segments.append(Segment(s["segment"], _int(s, "length", sw, minimum=1, maximum=MAX_PROMPT_TOKENS)))
        tokens += segments[-1].length
        _at_most(
            tokens, MAX_PROMPT_TOKENS, f"{where}.prompt", "+ tokens", "a prompt has", "tokens (vLLM's max_model_len)"
        )
    return Request(
        tuple(segments), _int(raw, "max_tokens", where, minimum=1, maximum=MAX_MAX_TOKENS, default=1), arrival
    )


def _arrival(raw: dict, i: int) -> int | None:
    """Request i's ``arrival`` (absent or null: None); the first request
    has none."""
    where = f"trace[{i}]"
    arrival = _int(raw, "arrival", where, minimum=0, maximum=MAX_ARRIVAL_STEPS, default=None, nullable=True)
    if arrival is not None and i == 0:
        raise invalid(
            f"{where}.arrival", arrival, "the first request has no earlier one to arrive after; allowed: absent or null"
        )
    return arrival


def _at_most(total: int, limit: int, field: str, shown: str, whole: str, unit: str) -> None:
    """A running total past its limit is one error naming the total so far."""
    if total > limit:
        raise invalid(field, f"<{total:,}{shown}>", f"{whole} at most {limit:,} {unit}")


def _wave_start(i: int, arrival: int | None, earlier: tuple[Request, ...]) -> int:
    """The index of the first request of request i's wave (i itself unless
    it has an ``arrival``): the requests before it finished before i is sent."""
    if i == 0 or arrival is None:
        return i
    start = i - 1
    while start > 0 and earlier[start].arrival is not None:
        start -= 1
    return start


def _parse_trace(trace: list) -> tuple[Request, ...]:
    """The requests of a trace: at most MAX_REQUESTS of them, and at most
    MAX_CASE_TOKENS prompt tokens in all."""
    if len(trace) > MAX_REQUESTS:
        raise invalid("trace", f"<{len(trace)} requests>", f"at most {MAX_REQUESTS:,} requests per case")
    requests = []
    tokens = 0
    for i, r in enumerate(trace):
        requests.append(parse_request(r, i, tuple(requests)))
        tokens += requests[-1].num_prompt_tokens
        _at_most(tokens, MAX_CASE_TOKENS, f"trace[{i}]", " prompt tokens so far", "a case has", "prompt tokens in all")
    return tuple(requests)


def parse_case(raw: Any) -> Case:
    """Validate a decoded JSON case; raises InvalidArgument with one line.

    Either ``geometry`` (a hand case, with ``speculative``) or ``deployment``
    (resolved by an engine); a resolved case has both, ``speculative`` and
    ``resolved_by``."""
    _check_fields(
        raw,
        "case",
        ("schema", "name", "geometry", "speculative", "trace", "deployment", "resolved_by"),
        ("schema", "trace"),
    )
    if "deployment" in raw:
        return _parse_deployment_case(raw)
    if "geometry" not in raw:
        raise InvalidArgument("case.geometry: missing; required field (or a deployment: see docs/case-format.md)")
    if "resolved_by" in raw:
        raise invalid("resolved_by", raw["resolved_by"], "only with a deployment")
    if type(raw["schema"]) is not int or raw["schema"] != SCHEMA_VERSION:
        raise invalid("schema", raw["schema"], f"this kvspec reads schema {SCHEMA_VERSION}")
    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        raise invalid("name", name, "must be a string or null")
    trace = raw["trace"]
    if not isinstance(trace, list) or not trace:
        raise invalid("trace", trace, "must be a non-empty list of requests")
    return Case(
        parse_geometry(raw["geometry"]),
        parse_speculative(raw.get("speculative")),
        _parse_trace(trace),
        name,
    )


def _parse_deployment_case(raw: dict) -> Case:
    if type(raw["schema"]) is not int or raw["schema"] != SCHEMA_VERSION:
        raise invalid("schema", raw["schema"], f"this kvspec reads schema {SCHEMA_VERSION}")
    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        raise invalid("name", name, "must be a string or null")
    deployment = parse_deployment(raw["deployment"])
    trace = raw["trace"]
    if not isinstance(trace, list) or not trace:
        raise invalid("trace", trace, "must be a non-empty list of requests")
    requests = _parse_trace(trace)
    resolved_by = raw.get("resolved_by")
    if resolved_by is None:
        for key in ("geometry", "speculative"):
            if raw.get(key) is not None:
                raise invalid(
                    key,
                    raw[key],
                    "with a deployment, vLLM resolves it; allowed: absent (or a resolved case with resolved_by)",
                )
        return Case(None, None, requests, name, deployment)
    families = tuple(FAMILIES)  # the registry as it stands
    if not isinstance(resolved_by, str) or not re.match(
        rf"^({'|'.join(map(re.escape, families))})==[0-9A-Za-z.+_-]{{1,64}}$", resolved_by
    ):
        raise invalid("resolved_by", resolved_by, "an engine name " + " or ".join(f"{f}==X" for f in families))
    if "geometry" not in raw:
        raise InvalidArgument(
            "geometry: missing; a resolved case (resolved_by) carries the geometry its engine resolved"
        )
    return Case(
        parse_geometry(raw["geometry"]),
        parse_speculative(raw.get("speculative")),
        requests,
        name,
        deployment,
        resolved_by,
    )


def case_to_dict(case: Case) -> dict:
    """The canonical JSON form of a case (resolved defaults written out)."""
    if case.geometry is None:
        assert case.deployment is not None
        return {
            "schema": SCHEMA_VERSION,
            "name": case.name,
            "deployment": case.deployment.as_dict(),
            "trace": _trace_to_list(case),
        }
    g = case.geometry
    spec = None
    if case.speculative is not None:
        spec = {"method": case.speculative.method, "num_speculative_tokens": case.speculative.num_speculative_tokens}
        spec.update(case.speculative.options)
    out = {
        "schema": SCHEMA_VERSION,
        "name": case.name,
        "geometry": {
            "groups": [{"kind": x.kind, "block_size": x.block_size, "count": x.count} for x in g.groups],
            "hash_block_size": g.hash_block_size,
            "prefix_match_unit": g.prefix_match_unit,
            "scheduler_block_size": g.scheduler_block_size,
            "retention_interval": g.retention_interval,
            "max_num_batched_tokens": g.max_num_batched_tokens,
            "prefill_checkpoint_grid": g.prefill_checkpoint_grid,
            "shared_prefix_checkpoint": g.shared_prefix_checkpoint,
            "split_block_size": g.split_block_size,
        },
        "speculative": spec,
        "trace": _trace_to_list(case),
    }
    if case.deployment is not None:
        out["deployment"] = case.deployment.as_dict()
        out["resolved_by"] = case.resolved_by
    return out


def _trace_to_list(case: Case) -> list:
    """The trace's JSON form; ``arrival`` only where a request has one (a
    serial case's form is the same as before concurrent traces)."""
    return [request_to_dict(r) for r in case.trace]


def request_to_dict(r: Request) -> dict:
    out: dict[str, Any] = {
        "prompt": [
            {"output": s.output} if s.output is not None else {"segment": s.segment, "length": s.length}
            for s in r.prompt
        ],
        "max_tokens": r.max_tokens,
    }
    if r.arrival is not None:
        out["arrival"] = r.arrival
    return out


def waves(case_or_trace: Case | tuple[Request, ...]) -> list[list[int]]:
    """The trace's waves: a request without ``arrival`` starts one (it is
    sent once every earlier request has finished); each following request
    with an ``arrival`` joins it (sent that many scheduler steps after the
    previous one, while the wave's earlier requests may still run). A
    serial trace is one wave per request."""
    trace = case_or_trace.trace if isinstance(case_or_trace, Case) else case_or_trace
    out: list[list[int]] = []
    for i, r in enumerate(trace):
        if r.arrival is None or not out:
            out.append([i])
        else:
            out[-1].append(i)
    return out


def is_concurrent(case: Case) -> bool:
    """Whether any request shares the scheduler with another."""
    return any(r.arrival is not None for r in case.trace)


def serial_prefix(case: Case) -> int:
    """How many of the trace's first requests run alone, each after the
    earlier ones finished and before any request shares the scheduler: the
    requests before the first wave of two or more (all of a serial trace).
    Every rule of the reference model holds for them as for a serial trace;
    the head of a wave is not counted (its retained states are read once
    the whole wave has finished)."""
    for w in waves(case):
        if len(w) > 1:
            return w[0]
    return len(case.trace)


def with_resolution(case: Case, geometry: dict, speculative: dict | None, engine: str) -> Case:
    """A deployment case with the geometry and speculative settings an
    engine resolved for it (``resolved_by`` names the engine)."""
    if case.deployment is None:
        raise invalid("case.deployment", None, "only a deployment case can be resolved")
    return Case(
        parse_geometry(geometry), parse_speculative(speculative), case.trace, case.name, case.deployment, engine
    )


def require_geometry(case: Case) -> Geometry:
    """The case's geometry; a deployment case must be resolved first."""
    if case.geometry is None:
        raise Unsupported(
            f"case.deployment={case.deployment.model if case.deployment else None!r}: not resolved; "
            "allowed: a hand geometry, or resolve it on an engine (kvspec resolve CASE --engine vllm==X, or pass --engine)"
        )
    return case.geometry


def load_case(path: str | os.PathLike) -> Case:
    """Load a case file, or the ``case`` inside a finding file."""
    raw = load_json(path)
    if isinstance(raw, dict) and "case" in raw and "geometry" not in raw and "deployment" not in raw:
        raw = raw["case"]
    return parse_case(raw)


def dump_case(case: Case, path: str | os.PathLike) -> None:
    write_json_atomic(path, case_to_dict(case))
