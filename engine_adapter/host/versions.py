"""Engine names: ``vllm==X`` for the vLLM releases kvspec can drive,
``vllm==X+LABEL.HASH`` for a build of release X (a patched, local-tree or
wheel overlay: ``engine_adapter.host.builds``), a PEP 440 local version of X,
and ``sglang==X`` for the SGLang releases (the second family).

The *version key* code passes around is vLLM's bare ``X`` (``0.33.0``,
``0.33.0+fix.1a2b3c``: vLLM was the only family and its key stays as it
was, so every cache and file name of a vLLM engine is unchanged), and the
full name for another family (``sglang==0.5.23``): :func:`family_of` reads
the family back, :func:`engine_name` the name.

:class:`EngineSpec` is the one reader of a name (:meth:`EngineSpec.parse`):
the command line parses each name once, at its edge
(``kvspec.engine_options.engine_specs``), and hands the spec down;
:func:`parse_engine`, :func:`engine_name`, :func:`release_of` and
:func:`is_build` are thin functions over it for code that holds a version
string. Parsing never imports vLLM. Bad names are one-line errors naming
the value and what is allowed.
"""

from __future__ import annotations

from ground.engines import FAMILIES, EngineSpec, allowed_text, engine_name, family_of  # noqa: F401 - the grammar lives on the ground floor

#: vLLM releases with a shipped requirement file (engine_adapter/requirements/).
SUPPORTED_VERSIONS = FAMILIES["vllm"].releases
DEFAULT_VERSION = FAMILIES["vllm"].default_release
DEFAULT_ENGINE = FAMILIES["vllm"].default_engine

#: SGLang releases with a shipped requirement file.
SGLANG_VERSIONS = FAMILIES["sglang"].releases

#: The supported releases of each engine family a name may start with
#: (``ground.engines.FAMILIES``).
RELEASES = {f.name: f.releases for f in FAMILIES.values()}

#: How each family is named in a message.
FAMILY_TITLES = {f.name: f.title for f in FAMILIES.values()}


def parse_engine(text: object, field: str = "engine") -> str:
    """``"vllm==0.33.0"`` (or a bare ``"0.33.0"``) -> ``"0.33.0"``; a build
    ``"vllm==0.33.0+fix.1a2b3c"`` -> ``"0.33.0+fix.1a2b3c"``
    (:meth:`EngineSpec.parse`'s version)."""
    return EngineSpec.parse(text, field).version


def spec_of(version: str | EngineSpec, field: str = "engine") -> EngineSpec:
    """The typed engine: an :class:`EngineSpec` as it is (parsed at a
    command's edge, never read again); a version key or name (``0.33.0``,
    ``sglang==0.5.23``: a test's or a host helper's text) read once here."""
    return version if isinstance(version, EngineSpec) else EngineSpec.parse(engine_name(version), field)


def release_of(version: str) -> str:
    """The release a version key names: ``0.33.0+fix.1a2b3c`` -> ``0.33.0``
    (``sglang==0.5.23`` is its own)."""
    return version.split("+", 1)[0]


def release_number(version: str) -> str:
    """The bare release of a version key: ``sglang==0.5.23`` -> ``0.5.23``,
    ``0.33.0+fix.1a2b3c`` -> ``0.33.0`` (what the engine's own package reports)."""
    return release_of(version).partition("==")[2] or release_of(version)


def env_slug(version: str) -> str:
    """The file name of a version key's environment and lock: ``vllm-X``, ``sglang-X``."""
    return f"{family_of(version)}-{version.partition('==')[2] or version}"


def is_build(version: str) -> bool:
    """Is ``version`` a build of a release (a local version label), not the release?"""
    return "+" in version
