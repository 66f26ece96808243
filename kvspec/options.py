"""Checks of command-line option values, shared by the commands.

argparse turns ``--timeout nan`` into a float NaN and ``--jobs -3`` into an
int without complaint; every command checks its numbers and paths here
before any work, so a bad value is one line ``kvspec: --flag=value: rule``
(exit 2), never a traceback, a hang or a silently ignored value.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

from ground.errors import KvspecError, invalid

#: The longest duration any option takes (one day).
MAX_SECONDS = 86400.0


def seconds(flag: str, value: float, *, zero_ok: bool = False, maximum: float = MAX_SECONDS) -> float:
    """A duration in seconds: finite, > 0 (>= 0 when ``zero_ok``) and at
    most ``maximum``; NaN and infinities are refused."""
    low = "0 <=" if zero_ok else "0 <"
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero_ok)
        or value > maximum
    ):
        raise invalid(flag, value, f"must be a finite number of seconds, {low} S <= {maximum:g}")
    return float(value)


def whole(
    flag: str, value: int | None, *, minimum: int, maximum: int, none_ok: bool = False, why: str = ""
) -> int | None:
    """An integer option in [minimum, maximum] (None allowed when ``none_ok``);
    ``why`` says where the bound comes from (e.g. "this machine's cores")."""
    if value is None and none_ok:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise invalid(flag, value, f"must be an integer in [{minimum}, {maximum}]" + (f" ({why})" if why else ""))
    return value


#: The room an output folder must have before any work: a full disk is
#: refused up front, not found at the first write after minutes of work.
MIN_FREE_BYTES = 1 << 20


def cores() -> int:
    """The CPU cores this process may run on (its affinity, else the
    machine's count), at least 1: the bound of parallel workers."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def output_dir(flag: str, path: str | os.PathLike) -> Path:
    """A folder kvspec may create or write into: an existing folder, or a
    path whose nearest existing ancestor is a folder; either one must take a
    file. Writable is tried, not asked: ``os.access`` says yes to root for a
    read-only folder, and a folder like ``/proc/self`` is no place for
    files, so a temporary file is created and removed in it (the only thing
    written); a read-only mount (``ST_RDONLY``) and a file system with less
    than :data:`MIN_FREE_BYTES` free are refused first. A file, a
    path under a file, ``/dev/null`` and a NUL in the path are refused too.
    Nothing else is created here."""
    if "\0" in os.fspath(path):
        raise invalid(flag, str(path), "holds a NUL byte; allowed: a folder kvspec can write into")
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
        why = _unwritable(probe)
    except KvspecError:
        raise
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        raise invalid(
            flag,
            str(path),
            f"cannot be checked ({getattr(e, 'strerror', None) or e}); allowed: a folder kvspec can write into",
        ) from None
    if why:
        raise invalid(flag, str(path), f"{probe} is not writable ({why}); allowed: a folder kvspec can write into")
    return p


def _unwritable(folder: Path) -> str | None:
    """Why no file can be written in ``folder`` (a read-only mount, or
    creating a temporary file there failed), or None when one can."""
    fs = os.statvfs(folder)
    if fs.f_flag & os.ST_RDONLY:
        return "a read-only file system"
    if fs.f_bavail * fs.f_frsize < MIN_FREE_BYTES:
        return f"less than {MIN_FREE_BYTES >> 20} MiB free"
    if not os.access(folder, os.W_OK | os.X_OK):
        return "permission denied"
    try:  # a nameless file that is gone once closed (not a write of ours)
        with tempfile.TemporaryFile(prefix=".kvspec-probe-", dir=folder):
            pass
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def output_file(flag: str, path: str | os.PathLike) -> Path:
    """A file kvspec will write (atomically, through a temporary file beside
    it, then renamed over it): a new path or an existing regular file, never
    a folder or a device (a rename over ``/dev/null`` would replace it), and
    its folder creatable or writable (``output_dir``)."""
    if "\0" in os.fspath(path):
        raise invalid(flag, str(path), "holds a NUL byte; allowed: a file path kvspec can write")
    p = Path(path)
    try:
        if p.is_dir():
            raise invalid(flag, str(path), "is a folder; allowed: a file path")
        if p.exists() and not p.is_file():
            raise invalid(flag, str(path), "is not a regular file (a device, a pipe or a socket); allowed: a file path")
    except KvspecError:
        raise
    except (OSError, ValueError) as e:
        raise invalid(
            flag,
            str(path),
            f"cannot be checked ({getattr(e, 'strerror', None) or e}); allowed: a file path kvspec can write",
        ) from None
    output_dir(flag, p.parent if str(p.parent) else ".")
    return p
