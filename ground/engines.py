"""Engine families and engine names: the one grammar of ``family==X`` and
the one registry of families, on the ground floor so every floor reads the
same (``reference/`` states each family's rule, ``engine_adapter/`` drives
it, ``fuzz/`` and the CLI run and print it).

A family is declared once, in ``families.toml`` beside this module (one
table each, read into :data:`FAMILIES` as :class:`Family` values): its
name and title, its releases, the deployment field its serve flags go in,
how its server is started, what it supports
(:class:`Capability`), and where its parts live (the driver module inside
its ``engine_adapter/<family>_engine/`` package, the flag allow-list and the
knobs of ``reference/``), named as ``module:attribute`` text so that this
floor imports none of them: the floor that owns a part loads it
(:func:`load`). Code outside ``engine_adapter/`` asks a family's
capability (``family.supports(Capability.DECODE)``), never its name.

An engine name is ``family==X`` (a release) or ``family==X+LABEL.HASH`` (a
build of release X: a PEP 440 local version); a bare ``X`` is vLLM's
(the first family, whose *version key* stays the bare release so that
every cache and file name of a vLLM engine is unchanged). :class:`EngineSpec`
is the one reader of a name (:meth:`EngineSpec.parse`). Parsing never
imports an engine. Bad names are one-line errors naming the value and what
is allowed.
"""

from __future__ import annotations

import enum
import importlib
import json
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ground.errors import InvalidArgument, Unsupported


class Capability(enum.Enum):
    """What a family's driver and model can do; code outside the family asks
    these, never the family's name."""

    #: Requests decode more than one token (outputs a later prompt may quote).
    DECODE = "decode"
    #: Speculative decoding (EAGLE/MTP drafters) in its deployments.
    SPECULATION = "speculation"
    #: Requests that share scheduler steps (``arrival``).
    CONCURRENCY = "concurrency"
    #: KV connectors (offloading) in its deployments.
    CONNECTORS = "connectors"
    #: A cache under memory pressure (eviction).
    PRESSURE = "pressure"
    #: A live OpenAI-compatible server kvspec can replay against.
    LIVE_SERVER = "live_server"
    #: Hand-written geometries (a case without a deployment; ``--synthetic-geometry``).
    GEOMETRY = "geometry"
    #: Patched builds (``--patch``, ``path:``, ``wheel:``).
    BUILDS = "builds"
    #: Driven in kvspec's own process too (atheris' instrumented harness, Ray workers).
    IN_PROCESS = "in_process"
    #: The z3 boundary cases map onto its deployments (``fuzz.draw.seeds``).
    BOUNDARY_SEEDS = "boundary_seeds"
    #: ``reference/`` states each release's own rule: every oracle judges
    #: it (else only the promise's engine-neutral oracles).
    RULE_MODEL = "rule_model"
    #: Its documented resolution rule (the prefix-match unit divides every
    #: block: ``fuzz.judge.oracle_resolution``) holds it.
    RESOLUTION_RULE = "resolution_rule"
    #: ``fuzz.driving.reach``'s deployment classes (speculative mode, hash unit,
    #: retention) are its features.
    DEPLOYMENT_CLASSES = "deployment_classes"
    #: Every cache it resolves is one the promise is stated for (else a
    #: resolution may name a cache kvspec does not predict).
    EVERY_CACHE_STATED = "every_cache_stated"
    #: Real weights: every run carries the same requests on a cold engine
    #: beside it (run option ``cold``, on by default), so the ``outputs``
    #: oracle judges it wherever it is judged.
    OUTPUTS = "outputs"


@dataclass(frozen=True)
class Family:
    """One engine family, declared. The parts are ``module:attribute``
    texts (:func:`load`), each loaded by the floor that owns it:

    * ``driver``: the family's driver module (``get_driver()``), inside
      its package under ``engine_adapter/``;
    * ``flags``: its serve-flag allow-list checker (``check(args)``);
    * ``knobs``: its knobs resolver (``knobs(case, version) -> Knobs``);
    * ``generator``: a module drawing its deployments' cases
      (``build_case(chooser, resolver) -> Case`` and ``case_on(chooser,
      deployment, info, name) -> Case``), None: vLLM's (``fuzz.draw.generate``);
    * ``twin``: a second engine a campaign holds it to when none is given
      (``twin(engine)``), else None;
    * ``classes``: a module declaring its known classes (``CLASSES``, and
      ``classify(finding, kind, geometry)``), None: the default family's;
    * ``canonical_flag``: its flag-name canonicaliser, None: vLLM's;
    * ``resolve_printer``: how ``kvspec resolve`` prints its resolution,
      None: the default's.
    """

    name: str
    title: str
    releases: tuple[str, ...]
    default_release: str
    #: The deployment field holding its serve flags.
    args_field: str
    #: The command that starts its server, as a user types it.
    serve: str
    #: The Python package of the engine (what a patch's paths start with).
    package: str
    driver: str
    flags: str
    knobs: str
    capabilities: frozenset[Capability] = field(default_factory=frozenset)
    #: The platforms its deployments may name.
    platforms: tuple[str, ...] = ("cuda", "cpu")
    #: The flag that sets its tensor-parallel size (``fuzz.results.impact``).
    tp_flag: str = "--tensor-parallel-size"
    #: The run options its driver takes (``kvspec run``'s flags of that name).
    run_options: tuple[str, ...] = ()
    generator: str | None = None
    twin: str | None = None
    classes: str | None = None
    canonical_flag: str | None = None
    resolve_printer: str | None = None
    #: Other packages its family package may import besides ``package``.
    imports: tuple[str, ...] = ()
    #: Its own prediction for ``kvspec predict --as`` (``(case, name) ->
    #: dict``), None: ``reference.predict`` on the geometry it resolves.
    predictor: str | None = None
    #: The rule ``kvspec run --compare`` compares a release with by default
    #: when the family models its own (``module:NAME``), None: ``reference.knobs.implemented_rule``.
    own_rule: str | None = None
    #: Its reference for ``run --compare`` (``(case, observed, name, rule,
    #: judged) -> (reference | None, notes)``), None: ``reference.predict``.
    own_reference: str | None = None
    #: Its own boundary cases for ``check-build`` (``(resolver) -> [Case]``),
    #: None: the z3 boundary cases mapped onto its deployments.
    boundary_cases: str | None = None
    #: Its own ``kvspec report`` bundle (a module with ``bundle(finding,
    #: matrix=, finding_path=)``), None: vLLM's (``fuzz.results.report``).
    reporter: str | None = None
    #: Its own ``kvspec advise`` (``(args, spec) -> exit code``: the parsed
    #: ``--engine`` handed down), None: vLLM's.
    adviser: str | None = None
    #: Its own ``kvspec run --compare`` table and verdict (``(case,
    #: observed, name, json_path) -> exit code``), None: the judge's.
    comparer: str | None = None
    #: The version key is the bare release (vLLM's historical form).
    bare_key: bool = False
    #: Its own checks of oracles whose rule it states itself (``module:NAME``,
    #: a dict oracle name -> ``(case, version, observation) -> [Divergence]``):
    #: those oracles judge it too, by these checks (llama.cpp: ``reference``,
    #: its rule; ``promise``, the promise stated for one live state per slot).
    own_checks: str | None = None

    def supports(self, capability: Capability) -> bool:
        return capability in self.capabilities

    @property
    def default_engine(self) -> str:
        return f"{self.name}=={self.default_release}"


def _declared(name: str, entry: dict) -> Family:
    """One table of ``families.toml`` as a :class:`Family`: lists are
    tuples, ``capabilities`` names :class:`Capability` values (or ``"all"``);
    a key that is no field of :class:`Family` is refused by name."""
    known = {f.name for f in fields(Family)} - {"name"}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise InvalidArgument(
            f"families.toml [{name}].{unknown[0]}: not a Family field; allowed: {', '.join(sorted(known))}"
        )
    caps = entry.get("capabilities", ())
    allowed = {c.value for c in Capability}
    stray = [c for c in caps if c not in allowed] if caps != "all" else []
    if stray:
        raise InvalidArgument(
            f'families.toml [{name}].capabilities={stray[0]!r}: no such capability; allowed: "all" or {", ".join(sorted(allowed))}'
        )
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()}
    values["capabilities"] = frozenset(Capability) if caps == "all" else frozenset(Capability(c) for c in caps)
    return Family(name, **values)


#: The registry, declared in ``families.toml`` beside this module (one table
#: per family). A new family is its package under ``engine_adapter/`` plus
#: one table there (docs/architecture.md, "Adding an engine family").
FAMILIES: dict[str, Family] = {
    name: _declared(name, entry)
    for name, entry in tomllib.loads((Path(__file__).with_name("families.toml")).read_text()).items()
}

#: The family a bare ``X`` and a deployment without ``engine`` belong to.
DEFAULT_FAMILY = "vllm"


def family(name: object, field_name: str = "family") -> Family:
    """The declared family ``name``; another is one line naming the allowed."""
    if not isinstance(name, str) or name not in FAMILIES:
        raise InvalidArgument(
            f"{field_name}={name!r}: not an engine family kvspec drives; allowed: {', '.join(FAMILIES)}"
        )
    return FAMILIES[name]


def load(target: str) -> Any:
    """A family's part, ``module:attribute`` (or a module), imported by the
    floor that owns it."""
    module, _, attribute = target.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attribute) if attribute else loaded


_VERSION = r"(\d+\.\d+\.\d+)(?:\+([a-z0-9][a-z0-9.-]*))?"
_BARE = re.compile(rf"^{_VERSION}$")


def _spec_pattern() -> re.Pattern:
    return re.compile(rf"^({'|'.join(map(re.escape, FAMILIES))})=={_VERSION}$")


def allowed_text() -> str:
    return "allowed: " + ", ".join(f"{f.name}=={v}" for f in FAMILIES.values() for v in f.releases)


@dataclass(frozen=True)
class EngineSpec:
    """One engine, parsed: ``family==release`` (a release) or
    ``family==release+label.hash`` (a build of it). ``hash`` is None for a
    release, and for a build label with no dot in it. ``patches``: the
    patch files a build is made of, when the command line gave them (never
    part of the name)."""

    family: str
    release: str
    label: str | None = None
    hash: str | None = None
    patches: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: object, field: str = "engine") -> EngineSpec:
        """``"vllm==0.33.0"`` (or a bare ``"0.33.0"``, of vLLM) or a build
        ``"vllm==0.33.0+fix.1a2b3c"`` (its release must be supported;
        whether it is built is the environment's business).

        Malformed names raise InvalidArgument; well-formed but unsupported
        releases raise Unsupported. Both are one line."""
        default = FAMILIES[DEFAULT_FAMILY].default_engine
        if not isinstance(text, str):
            raise InvalidArgument(f"{field}={text!r}: must be a string like {default}; {allowed_text()}")
        raw = text.strip()
        m = _spec_pattern().match(raw)
        if m:
            name, release, local = m.groups()
        elif (b := _BARE.match(raw)) is not None:
            name, (release, local) = DEFAULT_FAMILY, b.groups()
        else:
            forms = " or ".join(f"{f}==X.Y.Z" for f in FAMILIES)
            raise InvalidArgument(f"{field}={text!r}: not an engine name of the form {forms}; {allowed_text()}")
        fam = FAMILIES[name]
        if release not in fam.releases:
            raise Unsupported(
                f"{field}={text!r}: {fam.title} {release} has no kvspec engine environment; {allowed_text()}"
            )
        if local is None:
            return cls(name, release)
        label, dot, digest = local.rpartition(".")
        return cls(name, release, label, digest) if dot else cls(name, release, local)

    def to_json(self) -> str:
        """The engine as one serialized value (what a worker receives:
        ``python -m engine_adapter.inside.worker --engine JSON``); read
        back by :meth:`from_json`, never by the name grammar."""
        fields = {"family": self.family, "release": self.release, "label": self.label, "hash": self.hash}
        return json.dumps({**fields, "patches": list(self.patches)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: object, field: str = "engine") -> EngineSpec:
        """The engine :meth:`to_json` wrote: a JSON object with exactly its
        fields, a declared family and one of its releases; anything else is
        one line naming the field."""
        keys = ("family", "hash", "label", "patches", "release")
        try:
            raw = json.loads(text) if isinstance(text, str) else None
        except ValueError:
            raw = None
        if not isinstance(raw, dict) or tuple(sorted(raw)) != keys:
            raise InvalidArgument(
                f"{field}={text!r}: not a serialized engine; allowed: a JSON object of {', '.join(keys)}"
            )
        fam = family(raw["family"], f"{field}.family")
        if raw["release"] not in fam.releases:
            raise Unsupported(
                f"{field}.release={raw['release']!r}: not a {fam.title} release kvspec has; {allowed_text()}"
            )
        for name in ("label", "hash"):
            value = raw[name]
            if value is not None and not (isinstance(value, str) and re.fullmatch(r"[a-z0-9][a-z0-9.-]*", value)):
                raise InvalidArgument(f"{field}.{name}={value!r}: allowed: null or a PEP 440 local label")
        patches = raw["patches"]
        if not isinstance(patches, list) or not all(isinstance(x, str) for x in patches):
            raise InvalidArgument(f"{field}.patches={patches!r}: allowed: a list of file names")
        if raw["hash"] is not None and raw["label"] is None:
            raise InvalidArgument(f"{field}.hash={raw['hash']!r}: a hash belongs to a build label; allowed: null")
        return cls(fam.name, raw["release"], raw["label"], raw["hash"], tuple(patches))

    @property
    def family_entry(self) -> Family:
        return FAMILIES[self.family]

    @property
    def local(self) -> str | None:
        """The PEP 440 local label of a build (``LABEL.HASH``), else None."""
        if self.label is None:
            return None
        return self.label if self.hash is None else f"{self.label}.{self.hash}"

    @property
    def version(self) -> str:
        """The version key: ``X`` for a vLLM release, ``X+LABEL.HASH`` for a
        build, ``family==X`` for another family's release."""
        bare = self.release if self.label is None else f"{self.release}+{self.local}"
        return bare if self.family_entry.bare_key else f"{self.family}=={bare}"

    @property
    def name(self) -> str:
        """The canonical name: ``vllm==X``, ``vllm==X+LABEL.HASH``, ``sglang==X``."""
        bare = self.release if self.label is None else f"{self.release}+{self.local}"
        return f"{self.family}=={bare}"

    @property
    def is_build(self) -> bool:
        return self.label is not None

    @property
    def release_spec(self) -> EngineSpec:
        """The release a build is made from (a release is its own)."""
        return EngineSpec(self.family, self.release)


def family_of(version: str) -> str:
    """The family of a version key (or an engine name): the text before
    ``==``, else the default family's (a bare key)."""
    head, sep, _ = version.partition("==")
    return head if sep else DEFAULT_FAMILY


def engine_name(version: str) -> str:
    """The engine name of a version key: ``0.33.0`` -> ``vllm==0.33.0``;
    ``sglang==0.5.23`` is its own."""
    return version if "==" in version else f"{DEFAULT_FAMILY}=={version}"


def engine_key(engine: EngineSpec | str) -> str:
    """The version key of a typed engine (``EngineSpec.version``), or a key
    as it is: for code that takes either (the judge, the reference model)."""
    return engine.version if isinstance(engine, EngineSpec) else engine


def version_key(name: str) -> str:
    """The version key of an engine name (the inverse of
    :func:`engine_name`): ``vllm==0.33.0`` -> ``0.33.0``; ``sglang==0.5.23``
    and a key already are their own."""
    head, sep, rest = name.partition("==")
    return rest if sep and head in FAMILIES and FAMILIES[head].bare_key else name


def family_of_version(version: str) -> Family:
    """The declared family of a version key or an engine name."""
    return family(family_of(version), "engine")
