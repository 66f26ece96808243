"""One root error type for everything kvspec reports to a user.

Every message is one line that names the offending ``field=value``, the rule
it broke and what is allowed (in the style of Hypothesis'
``internal/validation.py``). The CLI prints ``kvspec: <message>`` and exits 2;
it never shows a traceback for these.
"""

from __future__ import annotations


class KvspecError(Exception):
    """Root of every error kvspec raises on purpose."""


class InvalidArgument(KvspecError, ValueError):
    """The input (a case file, a flag, a finding) breaks a stated rule."""


class Unsupported(KvspecError):
    """The input is valid but outside what this component models or can run.

    Raised instead of guessing (Alive2's "unsupported").
    """


class DeploymentRejected(InvalidArgument):
    """vLLM itself refused a deployment (its flags, its model config): the
    message carries vLLM's own words, in one line."""


class DeploymentCrashes(DeploymentRejected):
    """vLLM raised while building a deployment's KV cache, with an exception
    it does not refuse configurations with (an ``IndexError``, not a
    ``ValueError``): to a caller that only resolves, a deployment vLLM cannot
    build; a case run on it is an ``engine_error`` finding."""


class EngineError(KvspecError):
    """An engine could not be set up or reached (not: vLLM raised on a case;
    that is recorded as a finding)."""


#: How much of a value's repr a message shows.
MAX_SHOWN = 120


def shown(value: object) -> str:
    """``repr(value)``, cut to MAX_SHOWN characters (a refused value may be a
    whole document); a repr is always one line."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's digit limit for str()
        text = (
            f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
            if isinstance(value, int)
            else f"<{type(value).__name__}>"
        )
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def invalid(field: str, value: object, allowed: str) -> InvalidArgument:
    """Build the one-line error ``field=value: allowed`` (the value's repr
    cut to MAX_SHOWN characters)."""
    return InvalidArgument(f"{field}={shown(value)}: {allowed}")
