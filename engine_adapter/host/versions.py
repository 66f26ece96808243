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

import re
from dataclasses import dataclass

from ground.errors import InvalidArgument, Unsupported

#: vLLM releases with a shipped requirement file (engine_adapter/requirements/).
SUPPORTED_VERSIONS = ("0.29.0", "0.30.0", "0.32.0", "0.33.0")
DEFAULT_VERSION = "0.33.0"
DEFAULT_ENGINE = f"vllm=={DEFAULT_VERSION}"

#: SGLang releases with a shipped requirement file.
SGLANG_VERSIONS = ("0.5.23",)

#: llama.cpp releases (the pinned ``xllamacpp`` wheel, which runs llama.cpp's
#: own server in-process) with a shipped requirement file.
LLAMACPP_VERSIONS = ("2026.10.11549",)

#: The supported releases of each engine family a name may start with: the
#: families of ``engine_adapter.interface.FAMILIES``.
RELEASES = {"vllm": SUPPORTED_VERSIONS, "sglang": SGLANG_VERSIONS, "llamacpp": LLAMACPP_VERSIONS}

_VERSION = r"(\d+\.\d+\.\d+)(?:\+([a-z0-9][a-z0-9.-]*))?"
_SPEC = re.compile(rf"^({'|'.join(map(re.escape, RELEASES))})=={_VERSION}$")
_BARE = re.compile(rf"^{_VERSION}$")


def allowed_text() -> str:
    return "allowed: " + ", ".join(f"{family}=={v}" for family, versions in RELEASES.items() for v in versions)


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
        if not isinstance(text, str):
            raise InvalidArgument(f"{field}={text!r}: must be a string like {DEFAULT_ENGINE}; {allowed_text()}")
        raw = text.strip()
        m = _SPEC.match(raw)
        if m:
            family, release, local = m.groups()
        elif (b := _BARE.match(raw)) is not None:
            family, (release, local) = "vllm", b.groups()
        else:
            raise InvalidArgument(f"{field}={text!r}: not an engine name of the form vllm==X.Y.Z or sglang==X.Y.Z; {allowed_text()}")
        if release not in RELEASES[family]:
            raise Unsupported(f"{field}={text!r}: {FAMILY_TITLES[family]} {release} has no kvspec engine environment; {allowed_text()}")
        if local is None:
            return cls(family, release)
        label, dot, digest = local.rpartition(".")
        return cls(family, release, label, digest) if dot else cls(family, release, local)

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
        return bare if self.family == "vllm" else f"{self.family}=={bare}"

    @property
    def name(self) -> str:
        """The canonical name: ``vllm==X``, ``vllm==X+LABEL.HASH``, ``sglang==X``."""
        return engine_name(self.version)

    @property
    def is_build(self) -> bool:
        return self.label is not None

    @property
    def release_spec(self) -> EngineSpec:
        """The release a build is made from (a release is its own)."""
        return EngineSpec(self.family, self.release)


def parse_engine(text: object, field: str = "engine") -> str:
    """``"vllm==0.33.0"`` (or a bare ``"0.33.0"``) -> ``"0.33.0"``; a build
    ``"vllm==0.33.0+fix.1a2b3c"`` -> ``"0.33.0+fix.1a2b3c"``
    (:meth:`EngineSpec.parse`'s version)."""
    return EngineSpec.parse(text, field).version


def release_of(version: str) -> str:
    """The release a version key names: ``0.33.0+fix.1a2b3c`` -> ``0.33.0``
    (``sglang==0.5.23`` is its own)."""
    return version.split("+", 1)[0]


def family_of(version: str) -> str:
    """The family of a version key: ``sglang`` for ``sglang==X``, else ``vllm``."""
    head, sep, _ = version.partition("==")
    return head if sep else "vllm"


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


#: How each family is named in a message.
FAMILY_TITLES = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp"}


def engine_name(version: str) -> str:
    """The engine name of a version key: ``0.33.0`` -> ``vllm==0.33.0``;
    ``sglang==0.5.23`` is its own."""
    return version if "==" in version else f"vllm=={version}"
