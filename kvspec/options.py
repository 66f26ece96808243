"""Checks of command-line option values, shared by the commands.

argparse turns ``--timeout nan`` into a float NaN and ``--jobs -3`` into an
int without complaint; every command checks its numbers and paths here
before any work, so a bad value is one line ``kvspec: --flag=value: rule``
(exit 2), never a traceback, a hang or a silently ignored value.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from reference.errors import invalid

#: The longest duration any option takes (one day).
MAX_SECONDS = 86400.0


def seconds(flag: str, value: float, *, zero_ok: bool = False, maximum: float = MAX_SECONDS) -> float:
    """A duration in seconds: finite, > 0 (>= 0 when ``zero_ok``) and at
    most ``maximum``; NaN and infinities are refused."""
    low = "0 <=" if zero_ok else "0 <"
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok) or value > maximum:
        raise invalid(flag, value, f"must be a finite number of seconds, {low} S <= {maximum:g}")
    return float(value)


def whole(flag: str, value: int | None, *, minimum: int, maximum: int, none_ok: bool = False) -> int | None:
    """An integer option in [minimum, maximum] (None allowed when ``none_ok``)."""
    if value is None and none_ok:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise invalid(flag, value, f"must be an integer in [{minimum}, {maximum}]")
    return value


def output_dir(flag: str, path: str | os.PathLike) -> Path:
    """A folder kvspec may create or write into: an existing folder, or a
    path whose nearest existing ancestor is a writable folder. Nothing is
    created here."""
    p = Path(path)
    try:
        if p.exists():
            if not p.is_dir():
                raise invalid(flag, str(path), "is not a folder; allowed: a folder kvspec can write into")
            probe = p
        else:
            probe = next((a for a in p.absolute().parents if a.exists()), Path("/"))
            if not probe.is_dir():
                raise invalid(flag, str(path), f"{probe} is not a folder; allowed: a path kvspec can create")
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        raise invalid(flag, str(path), f"cannot be checked ({getattr(e, 'strerror', None) or e}); allowed: a folder kvspec can write into") from None
    if not os.access(probe, os.W_OK | os.X_OK):
        raise invalid(flag, str(path), f"{probe} is not writable; allowed: a folder kvspec can write into")
    return p


def output_file(flag: str, path: str | os.PathLike) -> Path:
    """A file kvspec will write (atomically, through a temporary file beside
    it): not an existing folder, and its folder creatable or writable."""
    p = Path(path)
    try:
        if p.is_dir():
            raise invalid(flag, str(path), "is a folder; allowed: a file path")
    except (OSError, ValueError) as e:
        raise invalid(flag, str(path), f"cannot be checked ({getattr(e, 'strerror', None) or e}); allowed: a file path kvspec can write") from None
    output_dir(flag, p.parent if str(p.parent) else ".")
    return p
