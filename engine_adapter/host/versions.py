"""Engine names: ``vllm==X`` for the vLLM releases kvspec can drive, and
``vllm==X+LABEL.HASH`` for a build of release X (a patched, local-tree or
wheel overlay: ``engine_adapter.host.builds``), a PEP 440 local version of X.

Parsing never imports vLLM. Bad names are one-line errors naming the value
and what is allowed.
"""

from __future__ import annotations

import re

from ground.errors import InvalidArgument, Unsupported

#: vLLM releases with a shipped requirement file (engine_adapter/requirements/).
SUPPORTED_VERSIONS = ("0.29.0", "0.30.0", "0.32.0", "0.33.0")
DEFAULT_VERSION = "0.33.0"
DEFAULT_ENGINE = f"vllm=={DEFAULT_VERSION}"

_SPEC = re.compile(r"^vllm==(\d+\.\d+\.\d+(?:\+[a-z0-9][a-z0-9.-]*)?)$")
_BARE = re.compile(r"^\d+\.\d+\.\d+(?:\+[a-z0-9][a-z0-9.-]*)?$")


def allowed_text() -> str:
    return "allowed: " + ", ".join(f"vllm=={v}" for v in SUPPORTED_VERSIONS)


def parse_engine(text: object, field: str = "engine") -> str:
    """``"vllm==0.33.0"`` (or a bare ``"0.33.0"``) -> ``"0.33.0"``; a build
    ``"vllm==0.33.0+fix.1a2b3c"`` -> ``"0.33.0+fix.1a2b3c"`` (its release
    must be supported; whether it is built is the environment's business).

    Malformed names raise InvalidArgument; well-formed but unsupported
    versions raise Unsupported. Both are one line."""
    if not isinstance(text, str):
        raise InvalidArgument(f"{field}={text!r}: must be a string like {DEFAULT_ENGINE}; {allowed_text()}")
    raw = text.strip()
    m = _SPEC.match(raw)
    version = m.group(1) if m else (raw if _BARE.match(raw) else None)
    if version is None:
        raise InvalidArgument(f"{field}={text!r}: not an engine name of the form vllm==X.Y.Z; {allowed_text()}")
    if release_of(version) not in SUPPORTED_VERSIONS:
        raise Unsupported(f"{field}={text!r}: vLLM {release_of(version)} has no kvspec engine environment; {allowed_text()}")
    return version


def release_of(version: str) -> str:
    """The release a version names: ``0.33.0+fix.1a2b3c`` -> ``0.33.0``."""
    return version.split("+", 1)[0]


def is_build(version: str) -> bool:
    """Is ``version`` a build of a release (a local version label), not the release?"""
    return "+" in version


def engine_name(version: str) -> str:
    return f"vllm=={version}"
