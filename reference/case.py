"""The case: one experiment, as kvspec reads it from a JSON file.

A case is a block geometry, optional speculative-decoding settings and a
serial trace of requests. Every request finishes before the next is sent, so
the prefix cache a request sees is exactly what the earlier ones left.

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
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import tempfile
from dataclasses import dataclass, field
from hashlib import blake2b
from pathlib import Path
from typing import Any

from reference.deployment import Deployment, parse_deployment
from reference.errors import InvalidArgument, Unsupported, invalid

SCHEMA_VERSION = 1

#: Group kinds the model covers. Others are rejected, never guessed.
GROUP_KINDS = ("full_attention", "mamba")
#: Speculative methods whose drafter needs the EAGLE block drop in vLLM.
SPECULATIVE_METHODS = ("mtp", "eagle", "eagle3")
#: vLLM's own SpeculativeConfig option names that change prefix caching.
SPECULATIVE_OPTIONS = ("disable_eagle_block_drop", "disable_lookahead_block_hashes")
#: Token ids of every segment stream lie in [1, TOKEN_VOCAB).
TOKEN_VOCAB = 1024
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

    @property
    def num_groups(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def mamba_block_sizes(self) -> tuple[int, ...]:
        return tuple(g.block_size for g in self.groups if g.kind == "mamba")

    @property
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


@dataclass(frozen=True)
class Segment:
    """The first ``length`` tokens of the stream named ``segment``."""

    segment: str
    length: int


@dataclass(frozen=True)
class Request:
    prompt: tuple[Segment, ...]
    max_tokens: int = 1

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

_STREAMS: dict[str, list[int]] = {}
_RNGS: dict[str, random.Random] = {}


def segment_tokens(name: str, length: int) -> list[int]:
    """The first ``length`` tokens of stream ``name`` (ids in [1, TOKEN_VOCAB)).

    The stream is a pseudo-random sequence seeded by blake2b(name), so it is
    the same on every machine and Python version, and any shorter slice is a
    prefix of any longer one.
    """
    stream = _STREAMS.get(name)
    if stream is None:
        seed = int.from_bytes(blake2b(name.encode(), digest_size=16).digest(), "big")
        stream = _STREAMS[name] = []
        _RNGS[name] = random.Random(seed)
    if len(stream) < length:
        rng = _RNGS[name]
        stream.extend(1 + rng.randrange(TOKEN_VOCAB - 1) for _ in range(length - len(stream)))
    return stream[:length]


def prompt_tokens(request: Request) -> list[int]:
    """The token ids of a request's prompt: its segments concatenated."""
    tokens: list[int] = []
    for seg in request.prompt:
        tokens.extend(segment_tokens(seg.segment, seg.length))
    return tokens


# ---------------------------------------------------------------- parsing


def _check_fields(obj: Any, where: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
    if not isinstance(obj, dict):
        raise invalid(where, obj, "must be a JSON object")
    for key in obj:
        if key not in allowed:
            raise invalid(f"{where}.{key}", obj[key], f"unknown field; allowed: {', '.join(allowed)}")
    for key in required:
        if key not in obj:
            raise InvalidArgument(f"{where}.{key}: missing; required field")
    return obj


def _int(obj: dict, key: str, where: str, *, minimum: int, default: Any = ..., nullable: bool = False) -> Any:
    if key not in obj:
        if default is ...:
            raise InvalidArgument(f"{where}.{key}: missing; required field")
        return default
    value = obj[key]
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{where}.{key}", value, f"must be an integer >= {minimum}" + (" or null" if nullable else ""))
    if value < minimum:
        raise invalid(f"{where}.{key}", value, f"must be an integer >= {minimum}")
    return value


def _parse_groups(raw: Any) -> tuple[Group, ...]:
    if not isinstance(raw, list) or not raw:
        raise invalid("geometry.groups", raw, "must be a non-empty list of groups")
    groups = []
    for i, g in enumerate(raw):
        where = f"geometry.groups[{i}]"
        _check_fields(g, where, ("kind", "block_size", "count"), ("kind", "block_size"))
        if g["kind"] not in GROUP_KINDS:
            raise invalid(f"{where}.kind", g["kind"], f"allowed: {', '.join(GROUP_KINDS)}")
        groups.append(Group(g["kind"], _int(g, "block_size", where, minimum=1), _int(g, "count", where, minimum=1, default=1)))
    return tuple(groups)


def parse_geometry(raw: Any) -> Geometry:
    """Validate and resolve a geometry; every rule names its field."""
    _check_fields(
        raw,
        "geometry",
        ("groups", "hash_block_size", "prefix_match_unit", "scheduler_block_size", "retention_interval", "max_num_batched_tokens"),
        ("groups",),
    )
    groups = _parse_groups(raw["groups"])
    sizes = [g.block_size for g in groups]
    lcm = math.lcm(*sizes)
    unit = _int(raw, "prefix_match_unit", "geometry", minimum=1, default=None, nullable=True)
    if unit is not None:
        for i, g in enumerate(groups):
            if g.block_size % unit:
                raise invalid("geometry.prefix_match_unit", unit, f"must divide every group block size; geometry.groups[{i}].block_size={g.block_size}")
    default_hash = unit if unit is not None else (sizes[0] if len(groups) == 1 and groups[0].count == 1 else math.gcd(*sizes))
    hash_block = _int(raw, "hash_block_size", "geometry", minimum=1, default=None, nullable=True)
    if hash_block is None:
        hash_block = default_hash
    elif unit is not None and hash_block != unit:
        raise invalid("geometry.hash_block_size", hash_block, f"must equal geometry.prefix_match_unit={unit} when both are set")
    for i, g in enumerate(groups):
        if g.block_size % hash_block:
            raise invalid("geometry.hash_block_size", hash_block, f"must divide every group block size; geometry.groups[{i}].block_size={g.block_size}")
    sched = _int(raw, "scheduler_block_size", "geometry", minimum=1, default=None, nullable=True)
    if sched is None:
        sched = lcm
    elif sched % lcm:
        raise invalid("geometry.scheduler_block_size", sched, f"must be a multiple of every group block size (LCM {lcm})")
    retention = _int(raw, "retention_interval", "geometry", minimum=0, default=0, nullable=True)
    if retention and retention % sched:
        raise invalid("geometry.retention_interval", retention, f"must be null (dense), 0 (sparse) or a positive multiple of scheduler_block_size={sched}")
    budget = _int(raw, "max_num_batched_tokens", "geometry", minimum=1, default=DEFAULT_MAX_NUM_BATCHED_TOKENS)
    return Geometry(groups, hash_block, sched, unit, retention, budget)


def parse_speculative(raw: Any) -> Speculative | None:
    if raw is None:
        return None
    _check_fields(raw, "speculative", ("method", "num_speculative_tokens", *SPECULATIVE_OPTIONS), ("method", "num_speculative_tokens"))
    if raw["method"] not in SPECULATIVE_METHODS:
        raise invalid("speculative.method", raw["method"], f"allowed: {', '.join(SPECULATIVE_METHODS)}")
    k = _int(raw, "num_speculative_tokens", "speculative", minimum=1)
    options = {}
    for name in SPECULATIVE_OPTIONS:
        if name in raw:
            if not isinstance(raw[name], bool):
                raise invalid(f"speculative.{name}", raw[name], "must be true or false")
            options[name] = raw[name]
    return Speculative(raw["method"], k, options)


def parse_request(raw: Any, i: int) -> Request:
    where = f"trace[{i}]"
    _check_fields(raw, where, ("prompt", "max_tokens"), ("prompt",))
    prompt = raw["prompt"]
    if not isinstance(prompt, list) or not prompt:
        raise invalid(f"{where}.prompt", prompt, "must be a non-empty list of segments")
    segments = []
    for j, s in enumerate(prompt):
        sw = f"{where}.prompt[{j}]"
        _check_fields(s, sw, ("segment", "length"), ("segment", "length"))
        if not isinstance(s["segment"], str) or not _SEGMENT_NAME.match(s["segment"]):
            raise invalid(f"{sw}.segment", s["segment"], "must be 1-64 characters of [A-Za-z0-9_.-]")
        segments.append(Segment(s["segment"], _int(s, "length", sw, minimum=1)))
    return Request(tuple(segments), _int(raw, "max_tokens", where, minimum=1, default=1))


def parse_case(raw: Any) -> Case:
    """Validate a decoded JSON case; raises InvalidArgument with one line.

    Either ``geometry`` (a hand case, with ``speculative``) or ``deployment``
    (resolved by an engine); a resolved case has both, ``speculative`` and
    ``resolved_by``."""
    _check_fields(raw, "case", ("schema", "name", "geometry", "speculative", "trace", "deployment", "resolved_by"), ("schema", "trace"))
    if "deployment" in raw:
        return _parse_deployment_case(raw)
    if "geometry" not in raw:
        raise InvalidArgument("case.geometry: missing; required field (or a deployment: see README)")
    if "resolved_by" in raw:
        raise invalid("resolved_by", raw["resolved_by"], "only with a deployment")
    if raw["schema"] != SCHEMA_VERSION:
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
        tuple(parse_request(r, i) for i, r in enumerate(trace)),
        name,
    )


def _parse_deployment_case(raw: dict) -> Case:
    if raw["schema"] != SCHEMA_VERSION:
        raise invalid("schema", raw["schema"], f"this kvspec reads schema {SCHEMA_VERSION}")
    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        raise invalid("name", name, "must be a string or null")
    deployment = parse_deployment(raw["deployment"])
    trace = raw["trace"]
    if not isinstance(trace, list) or not trace:
        raise invalid("trace", trace, "must be a non-empty list of requests")
    requests = tuple(parse_request(r, i) for i, r in enumerate(trace))
    resolved_by = raw.get("resolved_by")
    if resolved_by is None:
        for key in ("geometry", "speculative"):
            if raw.get(key) is not None:
                raise invalid(key, raw[key], "with a deployment, vLLM resolves it; allowed: absent (or a resolved case with resolved_by)")
        return Case(None, None, requests, name, deployment)
    if not isinstance(resolved_by, str) or not re.match(r"^vllm==[0-9A-Za-z.+_-]{1,64}$", resolved_by):
        raise invalid("resolved_by", resolved_by, "an engine name vllm==X")
    if "geometry" not in raw:
        raise InvalidArgument("geometry: missing; a resolved case (resolved_by) carries the geometry its engine resolved")
    return Case(parse_geometry(raw["geometry"]), parse_speculative(raw.get("speculative")), requests, name, deployment, resolved_by)


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
        },
        "speculative": spec,
        "trace": _trace_to_list(case),
    }
    if case.deployment is not None:
        out["deployment"] = case.deployment.as_dict()
        out["resolved_by"] = case.resolved_by
    return out


def _trace_to_list(case: Case) -> list:
    return [
        {"prompt": [{"segment": s.segment, "length": s.length} for s in r.prompt], "max_tokens": r.max_tokens}
        for r in case.trace
    ]


def require_geometry(case: Case) -> Geometry:
    """The case's geometry; a deployment case must be resolved first."""
    if case.geometry is None:
        raise Unsupported(
            f"case.deployment={case.deployment.model if case.deployment else None!r}: not resolved; "
            "allowed: a hand geometry, or resolve it on an engine (kvspec resolve CASE --engine vllm==X, or pass --engine)"
        )
    return case.geometry


def load_json(path: str | os.PathLike, what: str = "case file") -> Any:
    """Read a JSON document, turning I/O and syntax errors into one line."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise invalid(what, str(path), f"cannot be read ({e.strerror or e})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise invalid(what, str(path), f"is not valid JSON (line {e.lineno} column {e.colno}: {e.msg})") from None


def load_case(path: str | os.PathLike) -> Case:
    """Load a case file, or the ``case`` inside a finding file."""
    raw = load_json(path)
    if isinstance(raw, dict) and "case" in raw and "geometry" not in raw and "deployment" not in raw:
        raw = raw["case"]
    return parse_case(raw)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON so that a kill at any moment leaves the old file or the new
    one, never a torn one (temp file in the same folder, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def dump_case(case: Case, path: str | os.PathLike) -> None:
    write_json_atomic(path, case_to_dict(case))
