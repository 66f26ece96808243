"""Files from strangers, and files kvspec writes.

Reading: a JSON file (a case, a finding, a config) is read as bytes:
 a regular file (no device, FIFO or
folder) of at most ``MAX_FILE_BYTES`` = 8 MiB, strict UTF-8 without a
byte-order mark, JSON nested at most ``MAX_JSON_DEPTH`` = 64 levels, integers
of at most ``MAX_INT_DIGITS`` = 20 digits, and no ``NaN``/``Infinity``.
Every refusal is one line naming the file or the field (:mod:`ground.errors`).

Writing: every file kvspec writes goes through :func:`write_bytes_atomic`
(or the text, JSON and folder forms built on it), so a kill at any moment
leaves the old file or the new one, never a torn one.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ground.errors import KvspecError, invalid

MAX_FILE_BYTES = 8 << 20
MAX_JSON_DEPTH = 64
MAX_INT_DIGITS = 20


def load_json(path: str | os.PathLike, what: str = "case file") -> Any:
    """Read a JSON document within the file limits of the module docstring.

    Every refusal is one line naming the file (unreadable, special, too big,
    not UTF-8, not JSON) or the field where the document breaks a limit
    (too deep, an oversized integer, NaN/Infinity)."""
    name = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path)
    data = read_bounded(path, what, name)
    text = decode_utf8(data, what, name)
    return parse_json(text, what, name)


def _special_kind(mode: int) -> str | None:
    """What a file that is not a regular file is (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    for test, kind in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def read_bounded(path: str | os.PathLike, what: str, name: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes.

    Folders, devices, FIFOs and sockets are refused before they are opened
    (a FIFO blocks an open, ``/dev/zero`` never ends); the file is then opened
    non-blocking, checked again on the open descriptor (it may have been
    swapped), and read at most ``limit + 1`` bytes."""
    allowed = f"allowed: a regular file of at most {limit:,} bytes"
    try:
        kind = _special_kind(os.stat(path).st_mode)
        if kind is not None:
            raise invalid(what, name, f"is {kind}; {allowed}")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except KvspecError:
        raise
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        raise invalid(what, name, f"cannot be read ({getattr(e, 'strerror', None) or e})") from None
    try:
        st = os.fstat(fd)
        kind = _special_kind(st.st_mode)
        if kind is not None:
            raise invalid(what, name, f"is {kind}; {allowed}")
        if st.st_size > limit:
            raise invalid(what, name, f"is {st.st_size:,} bytes; {allowed}")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise invalid(what, name, f"cannot be read ({e.strerror or e})") from None
    finally:
        os.close(fd)
    if size > limit:
        raise invalid(what, name, f"is more than {limit:,} bytes; {allowed}")
    return b"".join(chunks)


_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF8, "UTF-8"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def decode_utf8(data: bytes, what: str, name: str) -> str:
    """Strict UTF-8 without a byte-order mark. A NUL byte (binary data, or
    UTF-16/32 without a mark) is refused too: no JSON text holds one."""
    allowed = "allowed: UTF-8 JSON text without a byte-order mark"
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            raise invalid(what, name, f"starts with a {encoding} byte-order mark; {allowed}")
    nul = data.find(b"\0")
    if nul >= 0:
        raise invalid(what, name, f"has a NUL byte at offset {nul} (binary, or UTF-16/32); {allowed}")
    try:
        return data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        raise invalid(
            what, name, f"is not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}: {e.reason}); {allowed}"
        ) from None


class _Refused:
    """A JSON number kvspec does not hold: an integer of more than
    MAX_INT_DIGITS digits, NaN, Infinity, or a float that overflows."""

    def __init__(self, text: str, rule: str):
        self.text, self.rule = text, rule

    def __repr__(self) -> str:
        return self.text if len(self.text) <= 24 else f"<an integer of {len(self.text.lstrip('-'))} digits>"


def _refuse_int(text: str) -> int | _Refused:
    """json's parse_int: the int, or _Refused beyond MAX_INT_DIGITS digits
    (never calls int() on a long string: Python refuses 4,301+ digits)."""
    if len(text) - text.startswith("-") > MAX_INT_DIGITS:
        return _Refused(text, f"too many digits; allowed: an integer of at most {MAX_INT_DIGITS} digits")
    return int(text)


def _refuse_float(text: str) -> float | _Refused:
    """json's parse_float: the float, or _Refused when it overflows (1e999)."""
    value = float(text)
    return value if math.isfinite(value) else _Refused(text, "overflows a float; allowed: a finite number")


def _refuse_constant(text: str) -> _Refused:
    """json's parse_constant: NaN, Infinity and -Infinity are refused."""
    return _Refused(text, "NaN and Infinity are not JSON; allowed: a finite number")


def parse_json(text: str, what: str, name: str) -> Any:
    """Decode JSON text: no NaN/Infinity, integers of at most MAX_INT_DIGITS
    digits, nesting at most MAX_JSON_DEPTH levels; a refusal names the field."""
    try:
        doc = json.loads(text, parse_int=_refuse_int, parse_float=_refuse_float, parse_constant=_refuse_constant)
    except json.JSONDecodeError as e:
        raise invalid(what, name, f"is not valid JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise invalid(what, name, f"is nested too deeply; allowed: at most {MAX_JSON_DEPTH} levels") from None
    except ValueError as e:  # a number the hooks let through (none known): still one line
        raise invalid(what, name, f"is not valid JSON ({str(e)[:80]})") from None
    if _nesting_exceeds(doc, MAX_JSON_DEPTH) or _holds_refused(doc):
        where, value, rule = _first_problem(doc, "", 0) or (what, name, "is not valid JSON")
        where = where if len(where) <= 100 else f"{where[:48]}...{where[-48:]}"
        raise invalid(where or what, value, rule)
    return doc


def _nesting_exceeds(doc: Any, limit: int) -> bool:
    """Whether any chain of nested arrays/objects is longer than ``limit``
    (level by level, so deep input costs no recursion)."""
    level = [doc] if isinstance(doc, (dict, list)) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        children: list = []
        for node in level:
            children.extend(
                c for c in (node.values() if isinstance(node, dict) else node) if isinstance(c, (dict, list))
            )
        level = children
    return False


def _holds_refused(doc: Any) -> bool:
    """Whether a decoded document (nesting already bounded) holds a _Refused."""
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, _Refused):
            return True
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def field_key(key: str) -> str:
    """A JSON key as it appears in a field path (quoted unless plain)."""
    return key if re.fullmatch(r"[A-Za-z0-9_]{1,64}", key) else repr(key[:40])


def _first_problem(node: Any, path: str, depth: int) -> tuple[str, Any, str] | None:
    """(field path, shown value, rule) of the first refused number or the
    first container nested deeper than MAX_JSON_DEPTH; recursion is bounded
    by MAX_JSON_DEPTH."""
    if isinstance(node, _Refused):
        return path, node, node.rule
    if not isinstance(node, (dict, list)):
        return None
    if depth >= MAX_JSON_DEPTH:
        return (
            path,
            f"<{type(node).__name__} at depth {depth + 1}>",
            f"nested too deeply; allowed: at most {MAX_JSON_DEPTH} levels",
        )
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, child in items:
        if isinstance(child, (dict, list, _Refused)):
            sub = (
                (f"{path}.{field_key(key)}" if path else field_key(key)) if isinstance(node, dict) else f"{path}[{key}]"
            )
            found = _first_problem(child, sub, depth + 1)
            if found:
                return found
    return None


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` so that a kill at any moment leaves the old file or the
    new one, never a torn one (temp file ``.NAME.*.tmp`` in the same folder,
    fsync, rename). kvspec's one atomic writer: every file it writes goes
    through here (or :func:`write_text_atomic` / :func:`write_json_atomic`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _umask() -> int:
    """This process's umask, read without changing it (Linux), else 022."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def write_folder_atomic(path: str | os.PathLike, files: dict[str, str | bytes]) -> None:
    """Make ``path`` a folder holding exactly ``files`` ({plain file name:
    text or bytes}) so that a kill or a failed write at any moment leaves
    the old folder or the new one whole, never a half-written one: the
    files go into a temporary sibling ``.NAME.*.tmp``, which then takes the
    folder's place (an old folder is first moved aside to ``.NAME.*.old``,
    put back if the swap fails, and removed after). On an error the
    temporary folder is removed and the error raised. The caller decides
    whether an existing folder may be replaced."""
    path = Path(path)
    for name in files:
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name:
            raise ValueError(f"file name {name!r}: a plain file name")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    old = None
    try:
        for name, data in files.items():
            write_bytes_atomic(tmp / name, data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, 0o777 & ~_umask())
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old)  # a folder onto an empty folder
        try:
            os.replace(tmp, path)
        except BaseException:
            if old is not None:
                os.replace(old, path)
                old = None
            raise
        try:
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            pass
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """:func:`write_bytes_atomic` of ``text`` in UTF-8."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_text_if_changed(path: str | os.PathLike, text: str) -> None:
    """:func:`write_text_atomic`, unless the file already holds ``text``
    (a config many processes read stays untouched, its mtime too)."""
    try:
        if Path(path).read_text() == text:
            return
    except (OSError, UnicodeDecodeError):
        pass
    write_text_atomic(path, text)


def write_json_atomic(path: str | os.PathLike, obj: Any, *, indent: int | None = 2, sort_keys: bool = False) -> None:
    """:func:`write_text_atomic` of ``obj`` as JSON and a final newline."""
    write_text_atomic(path, json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n")


def hash_files(h: Any, root: Path, patterns: Iterable[str]) -> None:
    """Feed the hash ``h`` (``hashlib``) the files under ``root`` that the
    glob ``patterns`` match, ``__pycache__`` left out, in path order: each
    its path relative to ``root``, a NUL, its bytes and a NUL. The digest of
    a source tree (a warm engine's sources, the vLLM files under test, the
    code that judges a mutation run)."""
    files = sorted(
        {p for pattern in patterns for p in root.glob(pattern) if p.is_file() and "__pycache__" not in p.parts}
    )
    for path in files:
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
