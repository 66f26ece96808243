"""Unified diffs against a release's ``vllm/`` tree: kvspec's strict parser
and applier (used by :mod:`engine_adapter.host.builds`).

A patch comes from a stranger, so:

* **Bounded before work starts.** A patch file is at most
  :data:`MAX_PATCH_BYTES`; the patches of one build are at most
  :data:`MAX_PATCHES` files, :data:`MAX_PATCH_BYTES` bytes and
  :data:`MAX_PATCH_LINES` lines together; the
  parser counts file patches and hunks as it goes and stops at
  :data:`MAX_FILE_PATCHES` / :data:`MAX_HUNKS` (all the build's patches
  together), before anything is applied.
* **Strict headers.** A file patch is ``--- a/vllm/...`` then ``+++
  b/vllm/...`` (git's or ``diff -u``'s); a path is printable text (no NUL,
  CR or other control character), no backslash, at most
  :data:`MAX_PATH_CHARS` characters, inside ``vllm/`` with no empty, ``.``
  or ``..`` part; at most one side is ``/dev/null``. A line starting ``@@
  -`` is a hunk header whose numbers have at most 9 digits. Anything else is
  one line ``FLAG: line N: what is wrong; allowed: ...`` (InvalidArgument,
  exit 2).
* **Lines end at ``\\n`` only** (as GNU patch reads them): a CR, form feed
  or other separator inside a line stays in it, in the patch and in the
  release's file alike.
* **Exact, never fuzzy.** A hunk's context and removed lines must be in the
  file, after the previous hunk; it goes where its line number says, or, if
  the file moved, to the nearest place they are.
* **Linear time.** The file is copied once (the hunks in order, a cursor in
  the original); a hunk found at its line number costs its own length; one
  that moved is found from the rarest of its lines through a line index and
  a rolling hash of the file, and the candidates looked at are bounded by
  :data:`SEARCH_FACTOR` times the file's and the hunks' lines: past that the
  hunk is refused in one line rather than searched for longer.

Nothing here reads or writes files, and nothing imports vLLM.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from engine_adapter.host.versions import FAMILY_TITLES
from ground.errors import InvalidArgument
from ground.errors import shown as shown_value

#: The longest patch file, and the most bytes of patches one build applies.
MAX_PATCH_BYTES = 16 * 2**20
#: The most lines in one build's patches (a real 16 MiB patch has about 400,000).
MAX_PATCH_LINES = 2_000_000
#: The most patch files one build applies.
MAX_PATCHES = 64
#: The most file patches (``---``/``+++`` pairs) in one build's patches.
MAX_FILE_PATCHES = 10_000
#: The most hunks in one build's patches.
MAX_HUNKS = 200_000
#: The longest path a header may name.
MAX_PATH_CHARS = 1024
#: A moved hunk's search looks at no more than this many candidates per line
#: of the file and of its hunks (plus SEARCH_SLACK).
SEARCH_FACTOR = 8
SEARCH_SLACK = 100_000

_HUNK = re.compile(r"^@@ -(\d{1,9})(?:,(\d{1,9}))? \+(\d{1,9})(?:,(\d{1,9}))? @@")
_MOD = (1 << 61) - 1
_BASE = 1_000_003


def split_lines(text: str) -> list[str]:
    """``text``'s lines, each with its ``\\n`` (the last may lack one)."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


@dataclass
class Hunk:
    header: str
    line: int  # its header's line number in the patch
    old_start: int
    old: list[str] = field(default_factory=list)  # context and removed lines
    new: list[str] = field(default_factory=list)  # context and added lines


@dataclass
class FilePatch:
    old: str | None  # None: /dev/null (a new file)
    new: str | None  # None: /dev/null (a deleted file)
    line: int = 0  # its '---' line's number in the patch
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new or self.old or "?"


def check_rel(rel: str, where: str, package: str = "vllm") -> str:
    """``rel`` if it is a file path inside the engine's package tree
    (``vllm/``; ``sglang/`` for an SGLang build; see the module docstring),
    else one line saying why not."""
    shown = shown_value(rel)
    if not rel.isprintable() or "\\" in rel:
        raise InvalidArgument(
            f"{where}: path {shown} holds a control character or a backslash; allowed: printable paths like a/vllm/v1/core/kv_cache_coordinator.py"
        )
    if len(rel) > MAX_PATH_CHARS:
        raise InvalidArgument(
            f"{where}: path {shown} is longer than {MAX_PATH_CHARS} characters; allowed: paths like a/vllm/v1/core/kv_cache_coordinator.py"
        )
    parts = rel.split("/")
    if not rel.startswith(package + "/") or any(p in ("", ".", "..") for p in parts):
        like = (
            "a/vllm/v1/core/kv_cache_coordinator.py"
            if package == "vllm"
            else f"a/{package}/srt/managers/schedule_policy.py"
        )
        raise InvalidArgument(
            f"{where}: path {shown} is not a file of {FAMILY_TITLES.get(package, package)}'s {package}/ tree; allowed: paths like {like}"
        )
    return rel


def _header_path(text: str, where: str, package: str = "vllm") -> str | None:
    text = text.removesuffix("\n").removesuffix("\r").split("\t", 1)[0].strip(" ")
    if text == "/dev/null":
        return None
    if text.startswith(("a/", "b/")):
        text = text[2:]
    return check_rel(text, where, package)


def _strip_newline(hunk: Hunk, tag: str) -> None:
    """``\\ No newline at end of file`` after a line tagged ``tag``."""
    for side in (hunk.old, hunk.new) if tag == " " else (hunk.old,) if tag == "-" else (hunk.new,):
        if side:
            side[-1] = side[-1].removesuffix("\n").removesuffix("\r")


def parse_patch(
    text: str, flag: str, *, max_files: int = MAX_FILE_PATCHES, max_hunks: int = MAX_HUNKS, package: str = "vllm"
) -> list[FilePatch]:
    """The file patches of a unified diff; lines outside a file's hunks
    (``diff --git``, ``index``, prose) are ignored. ``max_files`` /
    ``max_hunks``: how many more file patches / hunks the build allows;
    ``package``: the tree every path must lie in (``vllm``, ``sglang``)."""
    lines = split_lines(text)
    nlines = len(lines)
    files: list[FilePatch] = []
    nhunks = 0
    i = 0
    while i < nlines:
        line = lines[i]
        if line.startswith("--- ") and i + 1 < nlines and lines[i + 1].startswith("+++ "):
            where = f"{flag}: line {i + 1}"
            old, new = (
                _header_path(line[4:], where, package),
                _header_path(lines[i + 1][4:], f"{flag}: line {i + 2}", package),
            )
            if old is None and new is None:
                raise InvalidArgument(
                    f"{where}: both sides of the file header are /dev/null; allowed: '--- a/vllm/...' or '--- /dev/null' (a new file), then '+++ b/vllm/...' or '+++ /dev/null' (a deleted file)"
                )
            if len(files) >= max_files:
                raise InvalidArgument(
                    f"{where}: more than {MAX_FILE_PATCHES} file patches in the build's patches; allowed: at most {MAX_FILE_PATCHES}"
                )
            files.append(FilePatch(old, new, i + 1))
            i += 2
            continue
        if not line.startswith("@@ -"):
            i += 1
            continue
        where = f"{flag}: line {i + 1}"
        m = _HUNK.match(line)
        if not m:
            raise InvalidArgument(
                f"{where}: {line.strip()[:80]!r} is not a hunk header; allowed: '@@ -START[,COUNT] +START[,COUNT] @@' with numbers of at most 9 digits"
            )
        if not files:
            raise InvalidArgument(
                f"{where}: {line.strip()[:80]!r} comes before any '--- a/...' / '+++ b/...' file header; allowed: a unified diff"
            )
        nhunks += 1
        if nhunks > max_hunks:
            raise InvalidArgument(
                f"{where}: more than {MAX_HUNKS} hunks in the build's patches; allowed: at most {MAX_HUNKS}"
            )
        fp = files[-1]
        old_len = 1 if m.group(2) is None else int(m.group(2))
        new_len = 1 if m.group(4) is None else int(m.group(4))
        hunk = Hunk(m.group(0), i + 1, int(m.group(1)))  # the numbers only: the rest of the line is the stranger's text
        last = " "
        i += 1
        seen_old = seen_new = 0
        add_old, add_new = hunk.old.append, hunk.new.append
        while i < nlines and (seen_old < old_len or seen_new < new_len):
            body = lines[i]
            tag = body[:1]
            if tag == "+":
                add_new(body[1:])
                seen_new += 1
            elif tag == "-":
                add_old(body[1:])
                seen_old += 1
            elif tag == " " or body == "\n" or body == "\r\n":  # (an empty context line whose space an editor ate)
                rest = body[1:] if tag == " " else body
                tag = " "
                add_old(rest)
                add_new(rest)
                seen_old += 1
                seen_new += 1
            elif tag == "\\":  # "\ No newline at end of file"
                _strip_newline(hunk, last)
                i += 1
                continue
            else:
                break
            last = tag
            i += 1
        if i < nlines and lines[i].startswith("\\") and (hunk.old or hunk.new):
            _strip_newline(hunk, last)
            i += 1
        if len(hunk.old) != old_len or len(hunk.new) != new_len:
            raise InvalidArgument(
                f"{flag}: line {hunk.line}: hunk {len(fp.hunks) + 1} of {fp.path} ({hunk.header}) is cut short: {len(hunk.old)}/{old_len} old and "
                f"{len(hunk.new)}/{new_len} new lines; allowed: a complete unified diff"
            )
        fp.hunks.append(hunk)
    return files


class _Index:
    """A file's lines as ids, where each id occurs, and a rolling hash of
    every prefix (built once per file, when a hunk is not at its line)."""

    def __init__(self, lines: list[str]):
        self.ids: dict[str, int] = {}
        self.where: dict[int, list[int]] = {}
        self.prefix = [0]
        for p, text in enumerate(lines):
            k = self.ids.setdefault(text, len(self.ids))
            self.where.setdefault(k, []).append(p)
            self.prefix.append((self.prefix[-1] * _BASE + k + 1) % _MOD)
        self.powers = [1]

    def power(self, n: int) -> int:
        while len(self.powers) <= n:
            self.powers.append(self.powers[-1] * _BASE % _MOD)
        return self.powers[n]

    def span_hash(self, p: int, n: int) -> int:
        return (self.prefix[p + n] - self.prefix[p] * self.power(n)) % _MOD


def _find(lines: list[str], index: _Index, old: list[str], want: int, floor: int, budget: list[int]) -> int | None:
    """The start nearest ``want`` (the smaller of two as near) at or after
    ``floor`` where ``old`` is in ``lines``; None if nowhere. Each candidate
    looked at spends one of ``budget[0]``; at 0 it raises _OverBudget."""
    ids = []
    for text in old:
        k = index.ids.get(text)
        if k is None:
            return None  # a line the file does not have
        ids.append(k)
    n = len(old)
    h = 0
    for k in ids:
        h = (h * _BASE + k + 1) % _MOD
    j = min(range(n), key=lambda t: len(index.where[ids[t]]))  # the rarest line anchors the search
    pos = index.where[ids[j]]
    last = len(lines) - n
    hi = bisect.bisect_left(
        pos, min(max(want, floor), last) + j
    )  # no candidate below floor or past the end is looked at
    lo = hi - 1
    while True:
        left = pos[lo] - j if lo >= 0 and pos[lo] - j >= floor else None
        right = pos[hi] - j if hi < len(pos) and pos[hi] - j <= last else None
        if left is None and right is None:
            return None
        if right is None or (left is not None and want - left <= right - want):
            p, lo = left, lo - 1
        else:
            p, hi = right, hi + 1
        budget[0] -= 1
        if budget[0] < 0:
            raise _OverBudget
        if p < floor or p > last:
            continue
        if index.span_hash(p, n) == h and lines[p : p + n] == old:
            return p


class _OverBudget(Exception):
    pass


def apply_hunks(lines: list[str], fp: FilePatch, flag: str, release: str, package: str = "vllm") -> list[str]:
    """``lines`` with ``fp``'s hunks applied in order (see the module
    docstring); one line naming the hunk if one is not in the file."""
    title = FAMILY_TITLES.get(package, package)
    out: list[str] = []
    cursor = 0  # lines[:cursor] are copied (or replaced)
    index: _Index | None = None
    budget = [SEARCH_FACTOR * (len(lines) + sum(len(h.old) + len(h.new) for h in fp.hunks)) + SEARCH_SLACK]
    for k, hunk in enumerate(fp.hunks, 1):
        old, n = hunk.old, len(hunk.old)
        if not n:  # a pure insertion (diff -U0, or a new file): after line old_start
            at = min(max(hunk.old_start, cursor), len(lines))
        else:
            want = max(hunk.old_start - 1, 0)
            if want >= cursor and lines[want : want + n] == old:
                at = want
            else:
                index = index or _Index(lines)
                try:
                    found = _find(lines, index, old, want, cursor, budget)
                except _OverBudget:
                    raise InvalidArgument(
                        f"{flag}: line {hunk.line}: hunk {k} of {fp.path} ({hunk.header}) is far from its line number and was not found within "
                        f"{SEARCH_FACTOR} candidates per line; allowed: hunks at or near the lines they name in {title} {release}'s file"
                    ) from None
                if found is None:
                    first = old[0].strip()
                    raise InvalidArgument(
                        f"{flag}: hunk {k} of {fp.path} ({hunk.header}) does not apply to {title} {release}: its context and removed lines are not in the file"
                        f" (first: {first[:80]!r}); allowed: a unified diff against {title} {release}'s {package}/ tree"
                    )
                at = found
        out.extend(lines[cursor:at])
        out.extend(hunk.new)
        cursor = at + n
    out.extend(lines[cursor:])
    return out
