"""The Python files of a stranger's vLLM source tree (``--engine path:DIR``)
or wheel (``--engine wheel:FILE.whl``), read for a build
(:mod:`engine_adapter.host.builds`) without following the input anywhere it
should not lead, and bounded before the work grows.

Rules:

* **Regular files only, bounded.** A file kvspec reads (a ``--patch``, a
  tree's ``.py`` file, a wheel's member) is opened without blocking and
  must be a regular file of at most :data:`MAX_SOURCE_BYTES`; a build reads
  at most :data:`MAX_SOURCES_BYTES` of them in all.
* **No symlink leaves a tree.** kvspec reads a tree's ``vllm/**.py`` files.
  A symlink it would follow to reach them (a ``.py`` file, a folder, or
  ``vllm`` itself) must resolve inside DIR, else the build is refused in one
  line naming the link and its target: copying it would put a file from
  elsewhere on the machine (``/etc/...``, another user's) into the build.
  Inside DIR a ``.py`` symlink is read at its target; a folder symlink is not
  walked (what it points to is read where it lies, if under ``vllm/``), so no
  file is read twice and no cycle is followed. Other symlinks (``.so``,
  data) are never opened. ``__pycache__`` folders are skipped. The walk is
  bounded: :data:`MAX_TREE_ENTRIES` entries, :data:`MAX_TREE_DEPTH` folders
  deep.
* **A wheel is judged by its central directory before anything is
  inflated**: at most :data:`MAX_WHEEL_BYTES` on disk, a central directory
  of at most :data:`MAX_WHEEL_MEMBERS` entries; the ``vllm/**.py`` members
  (the only ones ever inflated) each at most :data:`MAX_SOURCE_BYTES`
  declared, :data:`MAX_SOURCES_BYTES` together, and compressed at most
  :data:`MAX_RATIO` to 1 (past 1 MiB). Members are inflated in 1 MiB reads,
  never more than they declare, so a zip bomb costs one bounded read, not a
  ``MemoryError``. A member name under ``vllm/`` must be a plain relative
  path (:func:`engine_adapter.host.patches.check_rel`: no ``..``, no control
  character, no backslash); nothing is extracted to disk.
* **Permissions never widen.** Each file comes with the permission bits of
  its source (the file; for a wheel member, its own bits if recorded, and
  the wheel file's): a build writes it with no more than those
  (:func:`engine_adapter.host.builds.build`), so a 0600 file stays owner-only.
* **The version is text.** ``vllm/_version.py`` (setuptools-scm's
  ``__version__ = version = '0.33.0'``) is read with a regular expression,
  never imported or executed.

Every refusal is one line ``--engine='path:DIR': ...; allowed: ...``
(InvalidArgument, exit 2). Nothing here writes a file or imports vLLM.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import zipfile
import zlib
from pathlib import Path

from engine_adapter.host.patches import check_rel
from ground.errors import InvalidArgument, KvspecError, invalid

#: The longest file kvspec reads for a build (a patch, a source file, a wheel member).
MAX_SOURCE_BYTES = 16 * 2**20
#: The most bytes of a tree's or a wheel's Python files one build reads.
MAX_SOURCES_BYTES = 256 * 2**20
#: The most entries (files, folders, links) walked in a source tree.
MAX_TREE_ENTRIES = 200_000
#: The deepest folder walked below ``vllm/``.
MAX_TREE_DEPTH = 64
#: The largest wheel file, and the most entries in its central directory.
MAX_WHEEL_BYTES = 2 * 2**30
MAX_WHEEL_MEMBERS = 100_000
#: The most a member kvspec inflates may expand (uncompressed / compressed), past 1 MiB.
MAX_RATIO = 100
_CHUNK = 2**20

_VERSION_LINE = re.compile(
    r"""^[ \t]*(?:(?:__version__|version)[ \t]*(?::[ \t]*str[ \t]*)?=[ \t]*)+(['"])([0-9][0-9A-Za-z.+!_-]{0,63})\1""",
    re.M,
)

Source = tuple[bytes, int]  # (content, permission bits)


def version_in(text: str) -> str | None:
    """The version a ``_version.py`` states (``__version__ = version =
    '0.33.0'``, ``__version__ = "0.33.0"``, ``version: str = '...'``), or
    None; the text is only matched, never run."""
    m = _VERSION_LINE.search(text)
    return m.group(2) if m else None


def read_regular(
    path: str | os.PathLike, flag: str, what: str, *, follow: bool = True, limit: int = MAX_SOURCE_BYTES
) -> Source:
    """The bytes and permission bits of the regular file ``path`` (of at
    most ``limit`` bytes); ``follow=False``: the last part of ``path`` must
    not be a symlink. A FIFO, a device or a folder is refused, not opened
    for reading (the open never blocks)."""
    named = "" if str(path) == what else f"{str(path)!r} "
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError) as e:
        raise invalid(
            flag, what, f"{named}cannot be read ({getattr(e, 'strerror', None) or e}); allowed: a readable regular file"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise invalid(flag, what, f"{named}is not a regular file; allowed: a readable regular file")
        if st.st_size > limit:
            raise invalid(flag, what, f"{named}is larger than {limit} bytes; allowed: at most {limit}")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise invalid(flag, what, f"{named}is larger than {limit} bytes; allowed: at most {limit}")
        return b"".join(chunks), stat.S_IMODE(st.st_mode)
    except OSError as e:
        raise invalid(
            flag, what, f"{named}cannot be read ({e.strerror or e}); allowed: a readable regular file"
        ) from None
    finally:
        os.close(fd)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def tree_files(given: str | os.PathLike, pkg: Path, flag: str, what: str) -> dict[str, Source]:
    """``{"vllm/...py": (bytes, mode)}`` of the package folder ``pkg`` of
    the tree the user gave as ``given`` (see the module docstring)."""
    root = os.path.realpath(given)
    top = os.path.abspath(given)

    def refuse_link(link: str) -> InvalidArgument:
        name = os.path.join(str(given), os.path.relpath(link, top))
        return invalid(
            flag,
            what,
            f"{name!r} is a symlink to {os.path.realpath(link)!r}, outside {str(given)!r}; allowed: files and folders inside the tree",
        )

    if os.path.islink(pkg) and not _inside(os.path.realpath(pkg), root):
        raise refuse_link(str(pkg))
    found: dict[str, Source] = {}
    entries = total = 0

    def walk_error(e: OSError) -> None:
        raise invalid(
            flag, what, f"{e.filename!r} cannot be listed ({e.strerror or e}); allowed: a readable source tree"
        )

    for folder, dirs, files in os.walk(pkg, onerror=walk_error):
        rel_folder = Path(os.path.relpath(folder, pkg))
        depth = len(rel_folder.parts)  # Path(".").parts == ()
        entries += len(dirs) + len(files)
        if entries > MAX_TREE_ENTRIES:
            raise invalid(
                flag, what, f"has more than {MAX_TREE_ENTRIES} entries under vllm/; allowed: at most {MAX_TREE_ENTRIES}"
            )
        for d in list(dirs):
            full = os.path.join(folder, d)
            if d == "__pycache__":
                dirs.remove(d)
            elif os.path.islink(full):
                if not _inside(os.path.realpath(full), root):
                    raise refuse_link(full)
                dirs.remove(d)  # inside the tree: read where it lies, not through the link
            elif depth + 1 > MAX_TREE_DEPTH:
                raise invalid(
                    flag,
                    what,
                    f"{os.path.join(folder, d)!r} is more than {MAX_TREE_DEPTH} folders below vllm/; allowed: at most {MAX_TREE_DEPTH}",
                )
        for name in files:
            if not name.endswith(".py"):
                continue
            full = os.path.join(folder, name)
            rel = check_rel("vllm/" + (rel_folder / name).as_posix(), f"{flag}={what!r}")
            if os.path.islink(full):
                target = os.path.realpath(full)
                if not _inside(target, root):
                    raise refuse_link(full)
                data, mode = read_regular(target, flag, what, follow=False)
            else:
                data, mode = read_regular(full, flag, what, follow=False)
            total += len(data)
            if total > MAX_SOURCES_BYTES:
                raise invalid(
                    flag,
                    what,
                    f"its Python files under vllm/ hold more than {MAX_SOURCES_BYTES} bytes; allowed: at most {MAX_SOURCES_BYTES}",
                )
            found[rel] = (data, mode)
    return found


# ---------------------------------------------------------------- wheels


def _central_directory(f, flag: str, what: str) -> None:
    """Refuse a wheel whose central directory is too large to list, before
    :class:`zipfile.ZipFile` reads it into memory."""
    endrec = zipfile._EndRecData(f)  # the end-of-central-directory record (zip64 too); reads no entry
    if endrec is None:
        raise invalid(
            flag, what, "is not a zip file (no end of central directory); allowed: wheel:FILE.whl, a vLLM wheel"
        )
    count, size = endrec[zipfile._ECD_ENTRIES_TOTAL], endrec[zipfile._ECD_SIZE]
    if count > MAX_WHEEL_MEMBERS or size > MAX_WHEEL_MEMBERS * 1024:
        raise invalid(
            flag,
            what,
            f"its central directory lists {count} members in {size} bytes; allowed: at most {MAX_WHEEL_MEMBERS} members",
        )


def _inflate(z: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """A member's bytes, inflated 1 MiB at a time and never past its declared size."""
    chunks, size = [], 0
    with z.open(info) as f:
        while size < info.file_size:
            chunk = f.read(min(_CHUNK, info.file_size - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    return b"".join(chunks)


def wheel_files(whl: Path, flag: str, what: str) -> tuple[dict[str, Source], str]:
    """``({"vllm/...py": (bytes, mode)}, sha256 of the wheel)`` (see the
    module docstring)."""
    try:
        st = os.stat(whl)
        if not stat.S_ISREG(st.st_mode):
            raise invalid(flag, what, "is not a regular file; allowed: wheel:FILE.whl, a vLLM wheel")
        if st.st_size > MAX_WHEEL_BYTES:
            raise invalid(flag, what, f"is larger than {MAX_WHEEL_BYTES} bytes; allowed: at most {MAX_WHEEL_BYTES}")
        wheel_mode = stat.S_IMODE(st.st_mode)
        found: dict[str, Source] = {}
        with open(whl, "rb") as f:
            _central_directory(f, flag, what)
            f.seek(0)
            digest = hashlib.file_digest(f, "sha256").hexdigest()
            f.seek(0)
            with zipfile.ZipFile(f) as z:
                chosen, total = [], 0
                for info in z.infolist():
                    name = info.filename
                    if not (name.startswith("vllm/") and name.endswith(".py")) or "/__pycache__/" in name:
                        continue
                    check_rel(name, f"{flag}={what!r}: member")
                    if info.file_size > MAX_SOURCE_BYTES:
                        raise invalid(
                            flag,
                            what,
                            f"member {name!r} inflates to {info.file_size} bytes; allowed: at most {MAX_SOURCE_BYTES}",
                        )
                    if info.file_size > _CHUNK and info.file_size > MAX_RATIO * max(info.compress_size, 1):
                        raise invalid(
                            flag,
                            what,
                            f"member {name!r} inflates {info.compress_size} bytes to {info.file_size}; allowed: at most {MAX_RATIO} to 1",
                        )
                    total += info.file_size
                    if total > MAX_SOURCES_BYTES:
                        raise invalid(
                            flag,
                            what,
                            f"its Python members under vllm/ inflate to more than {MAX_SOURCES_BYTES} bytes; allowed: at most {MAX_SOURCES_BYTES}",
                        )
                    chosen.append(info)
                for info in chosen:
                    member_mode = (info.external_attr >> 16) & 0o777
                    found[info.filename] = (_inflate(z, info), wheel_mode & (member_mode or 0o777))
    except KvspecError:
        raise
    except (
        OSError,
        EOFError,
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        NotImplementedError,
        RuntimeError,
        ValueError,
        zlib.error,
    ) as e:
        text = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise invalid(
            flag, what, f"cannot be read as a wheel ({text!r}); allowed: wheel:FILE.whl, a vLLM wheel"
        ) from None
    return found, digest
