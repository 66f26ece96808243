"""Engine names: ``vllm==X`` for the vLLM releases kvspec can drive.

Parsing never imports vLLM. Bad names are one-line errors naming the value
and what is allowed.
"""

from __future__ import annotations

import re

from reference.errors import InvalidArgument, Unsupported

#: vLLM releases with a shipped requirement file (engine_adapter/requirements/).
SUPPORTED_VERSIONS = ("0.29.0", "0.30.0", "0.32.0", "0.33.0")
DEFAULT_VERSION = "0.33.0"
DEFAULT_ENGINE = f"vllm=={DEFAULT_VERSION}"

_SPEC = re.compile(r"^vllm==(\d+\.\d+\.\d+)$")
_BARE = re.compile(r"^\d+\.\d+\.\d+$")


def allowed_text() -> str:
    return "allowed: " + ", ".join(f"vllm=={v}" for v in SUPPORTED_VERSIONS)


def parse_engine(text: object, field: str = "engine") -> str:
    """``"vllm==0.33.0"`` (or a bare ``"0.33.0"``) -> ``"0.33.0"``.

    Malformed names raise InvalidArgument; well-formed but unsupported
    versions raise Unsupported. Both are one line."""
    if not isinstance(text, str):
        raise InvalidArgument(f"{field}={text!r}: must be a string like {DEFAULT_ENGINE}; {allowed_text()}")
    raw = text.strip()
    m = _SPEC.match(raw)
    version = m.group(1) if m else (raw if _BARE.match(raw) else None)
    if version is None:
        raise InvalidArgument(f"{field}={text!r}: not an engine name of the form vllm==X.Y.Z; {allowed_text()}")
    if version not in SUPPORTED_VERSIONS:
        raise Unsupported(f"{field}={text!r}: vLLM {version} has no kvspec engine environment; {allowed_text()}")
    return version


def engine_name(version: str) -> str:
    return f"vllm=={version}"
