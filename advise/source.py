"""Where advice gets its geometry: a deployment resolved by vLLM's own code,
or a running server.

* **A deployment** (``--model M -- FLAGS``, or a case file's deployment) is
  resolved in the engine environment of the version under test
  (``engine_adapter.vllm_engine.resolve`` through ``Engine.resolve``). A resolution is
  kept on disk under kvspec's home (``cache/advise-resolutions/``), keyed
  by the engine, the deployment, the resolver's version, the engine
  environment's install marker and a digest of kvspec's resolver code
  (``RESOLVER_FILES`` and the shipped model configs), so a second
  ``advise`` of the same deployment starts no engine unless it confirms.
* **A server** (``--server URL``): the geometry ``kvspec replay --server``
  reads from ``/metrics`` (``engine_adapter.live.geometry``): block and hash
  block, retention, speculative decoding on or off; its vLLM version from
  ``/version``. What a server does not expose (KV cache group count, chunk
  budget, speculative method, internal checkpoints, the Mamba page size) is
  assumed and listed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from engine_adapter.host import environments
from engine_adapter.live.client import LiveClient, check_base_url
from engine_adapter.live.measure import redact_url, server_info
from ground.engines import EngineSpec
from ground.errors import EngineError, KvspecError, Unsupported
from ground.files import hash_files, load_json, write_json_atomic
from ground.home import cache_dir
from reference.case import Case, Geometry, Group, Speculative, case_to_dict, with_resolution
from reference.knobs import SUPPORTED_VERSIONS

#: Bump when the cached record's shape changes.
CACHE_SCHEMA = 1
#: Chunk budget assumed for a server (vLLM's default for these deployments).
SERVER_BUDGET = 8192


@dataclass
class Source:
    """A resolved geometry and what it came from."""

    kind: str  # "deployment" | "server"
    #: the engine whose rules apply, typed (parsed once: the command line's
    #: ``--engine``, or the server's ``/version``)
    engine_spec: EngineSpec
    geometry: Geometry
    speculative: Speculative | None
    facts: dict = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)
    summary: dict | None = None  # the engine's resolution (deployment)
    deployment_case: Case | None = None  # the deployment as a case (deployment)
    cached: bool = False
    describe: str = ""

    @property
    def engine(self) -> str:
        """The engine's name (``vllm==X``), as messages and files say it."""
        return self.engine_spec.name

    def case(self, requests, name: str | None = None) -> Case:
        """The workload as a case on this geometry (built directly: a
        workload may be far longer than a case file allows)."""
        if self.deployment_case is not None:
            dep = self.deployment_case.deployment
            return Case(self.geometry, self.speculative, tuple(requests), name, dep, self.engine)
        return Case(self.geometry, self.speculative, tuple(requests), name)

    def as_dict(self) -> dict:

        geometry = case_to_dict(Case(self.geometry, self.speculative, ()))
        return {
            "kind": self.kind,
            "engine": self.engine,
            "describe": self.describe,
            "geometry": geometry["geometry"],
            "speculative": geometry["speculative"],
            "facts": self.facts,
            "assumptions": self.assumptions,
            "resolution_cached": self.cached,
        }


# ---------------------------------------------------------------- deployment


#: The kvspec code a resolution is made of (``Engine.resolve`` runs
#: ``engine_adapter.vllm_engine.resolve.resolve`` and ``summary`` over these); the shipped
#: model configs too.
RESOLVER_FILES = (
    "vllm_engine/resolve.py",
    "models/served.py",
    "vllm_engine/engine_core.py",
    "vllm_engine/resolution.py",
    "vllm_engine/failure.py",
    "vllm_engine/standins.py",
    "vllm_engine/platform.py",
    "inside/worker.py",
)


def _code_digest() -> str:
    """A digest of the resolver's code (RESOLVER_FILES and the shipped model
    configs under ``engine_adapter/``): a change there may change a resolution."""
    h = hashlib.sha256()
    hash_files(h, Path(__file__).resolve().parents[1] / "engine_adapter", (*RESOLVER_FILES, "models/**/*"))
    return h.hexdigest()


def cache_key(engine: EngineSpec, case: Case) -> str:
    """The resolution cache key of a deployment on an engine."""
    from engine_adapter.vllm_engine.resolve import RESOLVER_VERSION

    marker = environments.read_marker(engine.version) or {}
    text = json.dumps(
        {
            "schema": CACHE_SCHEMA,
            "engine": engine.name,
            "deployment": case.deployment.as_dict(),
            "resolver": RESOLVER_VERSION,
            "env": [marker.get("fingerprint"), marker.get("created")],
            "code": _code_digest(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cache_path(engine: EngineSpec, case: Case) -> Path:

    return cache_dir("advise-resolutions") / f"{cache_key(engine, case)}.json"


def _cached(path: Path) -> dict | None:
    """A cached resolution, or None (absent or unreadable: resolved again)."""
    if not path.is_file():
        return None
    try:
        doc = load_json(path, "resolution cache")
    except KvspecError:
        return None
    if isinstance(doc, dict) and doc.get("schema") == CACHE_SCHEMA and isinstance(doc.get("summary"), dict):
        return doc["summary"]
    return None


def resolve_deployment(case: Case, engine: EngineSpec, open_engine_fn, *, use_cache: bool = True) -> tuple[dict, bool]:
    """vLLM's resolution of the case's deployment on ``engine`` (a
    ``summary``), and whether it came from the cache. ``open_engine_fn()``
    gives the engine when one is needed (started once, by the caller)."""
    path = cache_path(engine, case)
    if use_cache:
        summary = _cached(path)
        if summary is not None:
            return summary, True
    summary = open_engine_fn().resolve(case)
    write_json_atomic(
        path,
        {"schema": CACHE_SCHEMA, "engine": engine.name, "deployment": case.deployment.as_dict(), "summary": summary},
    )
    return summary, False


def forget(engine: EngineSpec, case: Case) -> None:
    """Drop a cached resolution (it disagreed with what the engine built)."""
    try:
        cache_path(engine, case).unlink()
    except OSError:
        pass


def from_deployment(case: Case, engine: EngineSpec, open_engine_fn, *, use_cache: bool = True) -> Source:
    """The deployment's geometry as ``engine`` (the typed engine) resolves
    it, from the resolution cache unless ``use_cache`` is off."""
    summary, cached = resolve_deployment(case, engine, open_engine_fn, use_cache=use_cache)
    resolved = with_resolution(
        Case(None, None, case.trace[:1], case.name, case.deployment),
        summary["geometry"],
        summary["speculative"],
        engine.name,
    )
    return Source(
        "deployment",
        engine,
        resolved.geometry,
        resolved.speculative,
        dict(summary.get("facts") or {}),
        list(summary.get("assumptions") or []),
        summary,
        Case(None, None, case.trace[:1], case.name, case.deployment),
        cached,
        short_describe(case.deployment),
    )


def short_describe(dep) -> str:
    """One short line: model (and how many config fields it overrides),
    where it runs, its flags."""
    over = f" (+{len(dep.model_overrides)} config overrides)" if dep.model_overrides else ""
    where = dep.platform + (f"/{dep.device}" if dep.device else "")
    return f"{dep.model}{over} [{where}] {' '.join(dep.vllm_args)}".rstrip()


# ---------------------------------------------------------------- server


def server_geometry(info) -> tuple[Geometry, Speculative | None, list[str]]:
    """The geometry a server's ``/metrics`` shows (``ServerInfo``), with the
    assumptions for what it does not. One line when it cannot be advised."""
    block = info.cached_block("advice")
    unit = info.prefix_match_unit
    retention = info.retention_interval
    assumptions = [
        "KV cache groups: one full-attention and one Mamba group of the block (the count is not exposed; it changes no hit)",
        f"max_num_batched_tokens={SERVER_BUDGET} (not exposed)",
        "no internal prefill checkpoints and no shared-prefix checkpoint (not exposed)",
    ]
    if retention == "unknown":
        assumptions.append("retention interval 0 (sparse; the server's label is absent)")
        retention = 0
    spec = None
    if info.spec_positions is not None:
        spec = Speculative("mtp", info.spec_positions)
        assumptions.append(
            f"speculative method mtp with {info.spec_positions} tokens (the server shows {info.spec_positions} draft positions, not the method or its options)"
        )
    geometry = Geometry(
        (Group("full_attention", block), Group("mamba", block)),
        unit or block,
        block,
        unit if unit and unit != block else None,
        retention,
        SERVER_BUDGET,
        None,
        False,
    )
    return geometry, spec, assumptions


def from_server(url: str, *, api_key: str | None, model: str | None, timeout_s: float) -> Source:
    """The geometry of a running server (one line when unreachable)."""

    check_base_url(url, "--server")
    try:
        with LiveClient(url, api_key=api_key, timeout_s=timeout_s, retries=1) as client:
            info = server_info(client, model)
    except EngineError as e:  # unreachable, timed out, not a vLLM server: one line naming the server
        raise EngineError(f"--server={redact_url(url)}: {e}") from None
    version = info.version
    if version not in SUPPORTED_VERSIONS:
        raise Unsupported(
            f"server /version={version!r}: the reference model resolves knobs for {', '.join(SUPPORTED_VERSIONS)}; allowed: a server of one of them"
        )
    geometry, spec, assumptions = server_geometry(info)
    facts = {
        "block_size": info.block_size,
        "hash_block_size": info.hash_block_size,
        "max_model_len": info.max_model_len,
        "server_model": info.model,
        "server_knobs": info.knobs(),
    }
    engine = EngineSpec.parse(version, "server /version")  # the server's text, read once here
    return Source("server", engine, geometry, spec, facts, assumptions, describe=f"{info.model} at {redact_url(url)}")


def with_geometry(source: Source, geometry: Geometry) -> Source:
    return replace(source, geometry=geometry)
