"""llama.cpp's server log, captured and read: the checkpoint events.

llama.cpp logs from its own thread to file descriptor 2 (``common/log.cpp``);
at verbosity 4 the server's trace lines say what happened to each slot's
context checkpoints (``tools/server/server-context.cpp``, the snapshot read
at commit 001d906a: ``create_checkpoint`` "created context checkpoint",
``update_slots`` "restored context checkpoint", "erased invalidated context
checkpoint", "forcing full prompt re-processing", "superseding context
checkpoint"; ``create_checkpoint`` "erasing old context checkpoint" when the
list is full). :class:`Capture` points fd 2 at a file for the life of a
server and reads it back bounded; :func:`events` parses one request's lines.
Pure parsing here apart from :class:`Capture`; never imports xllamacpp.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time

#: The most log bytes kept per case (a run that logs more is kvspec's failure).
MAX_LOG_BYTES = 64 << 20
#: How long to wait for a request's last line (llama.cpp logs asynchronously): polls x interval.
SYNC_POLLS, SYNC_INTERVAL_S = 400, 0.005

_N = r"n_tokens = (\d+)"
PATTERNS = {
    "created": re.compile(r"created context checkpoint \d+ of \d+ \(pos_min = -?\d+, pos_max = -?\d+, " + _N),
    "restored": re.compile(r"restored context checkpoint \(pos_min = -?\d+, pos_max = -?\d+, " + _N),
    "erased": re.compile(r"erased invalidated context checkpoint \(pos_min = -?\d+, pos_max = -?\d+, " + _N),
    "evicted": re.compile(r"erasing (?:old )?context checkpoint[^(]*\(pos_min = -?\d+, pos_max = -?\d+, " + _N),
    "superseded": re.compile(r"superseding context checkpoint at " + _N),
}
FORCED = "forcing full prompt re-processing"
_SLOT = re.compile(r"\bid\s+(\d+) \| task (-?\d+) \|")
_RELEASE = re.compile(r"release: id\s+(\d+) \| task (-?\d+) \| stop processing: n_tokens = (\d+)")
_IDLE_SAVE = re.compile(r"id\s+(\d+) \| task -?\d+ \| saving idle slot to prompt cache")
_SKIP = "prompt is already in the cache, skipping"
_OBSOLETE = re.compile(r"removing obsolete cached prompt with length (\d+)")
_SAVE = re.compile(r"prompt_save:\s+- saving prompt with length (\d+)")
_CANDIDATE = re.compile(r"- prompt with length\s+(\d+), lcp =\s+\d+, f_keep = ([0-9.]+), f_sim = ([0-9.]+)")
_FOUND = re.compile(r"found better prompt with f_keep = ([0-9.]+), f_sim = ([0-9.]+)")


def events(text: str) -> dict:
    """One request's checkpoint events, in order: each kind's ``n_tokens``
    list, ``forced_full`` when the server re-processed the whole prompt,
    the slot that served it, and ``slot_tokens`` (what it held after)."""
    out: dict = {k: [] for k in PATTERNS}
    out.update(forced_full=False, slot=None, slot_tokens=None, order=[], prompt_cache_load=None, cache_ops=[])
    candidates: list[tuple[int, str, str]] = []
    idle: int | None = None
    for line in text.splitlines():
        m = _IDLE_SAVE.search(line)
        if m:
            idle = int(m.group(1))
        m = _SAVE.search(line)
        if m:  # the RAM prompt cache, in order: save (by the idle slot named, or the request's), skip, obsolete, load
            out["cache_ops"].append(["save", idle, int(m.group(1))])
            idle = None
        if _SKIP in line:
            out["cache_ops"].append(["skip", None, None])
        m = _OBSOLETE.search(line)
        if m:
            out["cache_ops"].append(["obsolete", None, int(m.group(1))])
        m = _CANDIDATE.search(line)
        if m:
            candidates.append((int(m.group(1)), m.group(2), m.group(3)))
        m = _FOUND.search(line)
        if m:  # the cached prompt the slot loaded: the candidate with those fractions
            hits = [n for n, fk, fs in candidates if (fk, fs) == m.groups()]
            out["prompt_cache_load"] = hits[-1] if hits else -1
            out["cache_ops"].append(["load", None, out["prompt_cache_load"]])
        for kind, pat in PATTERNS.items():
            m = pat.search(line)
            if m:
                out[kind].append(int(m.group(1)))
                out["order"].append([kind, int(m.group(1))])
        if FORCED in line:
            out["forced_full"] = True
        m = _RELEASE.search(line)
        if m:
            out["slot"], out["slot_tokens"] = int(m.group(1)), int(m.group(3))
    return out


def resolved_settings(text: str) -> dict:
    """What the server resolved at load (its own log lines): slots, the
    slot context, checkpoints (max, min spacing), the prompt cache, batch sizes."""

    def num(pattern: str) -> int | None:
        m = re.search(pattern, text)
        return int(m.group(1)) if m else None

    m = re.search(r"context checkpoints enabled, max = (\d+), min spacing = (\d+)", text)
    return {
        "n_slots": num(r"initializing, n_slots = (\d+)"),
        "n_ctx_slot": num(r"n_ctx_slot = (\d+)"),
        "n_ctx": num(r"llama_context: n_ctx\s+= (\d+)"),
        "n_batch": num(r"llama_context: n_batch\s+= (\d+)"),
        "n_ubatch": num(r"llama_context: n_ubatch\s+= (\d+)"),
        "n_ctx_checkpoints": int(m.group(1)) if m else 0,
        "checkpoint_min_step": int(m.group(2)) if m else None,
        "cache_ram_mib": num(r"prompt cache is enabled, size limit: (\d+) MiB"),
        "prompt_cache": "prompt cache is enabled" in text,
        "cache_idle_slots": "idle slots will be saved to prompt cache" in text,
        "speculative_uses_checkpoints": "speculative decoding will use checkpoints" in text,
    }


class Capture:
    """fd 2 pointed at a temporary file while the server lives; ``read``
    returns what was logged since a mark, bounded."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="kvspec-llamacpp-log-")  # noqa: SIM115 - closed in __exit__
        self._saved: int | None = None

    def __enter__(self) -> Capture:  # noqa: PYI034
        sys.stderr.flush()
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc) -> None:
        sys.stderr.flush()
        if self._saved is not None:
            os.dup2(self._saved, 2)
            os.close(self._saved)
            self._saved = None
        self._file.close()

    def size(self) -> int:
        return os.fstat(self._file.fileno()).st_size

    def read(self, start: int, end: int | None = None) -> str:
        end = self.size() if end is None else end
        if end > MAX_LOG_BYTES:
            raise RuntimeError(f"llama.cpp log: {end} bytes; allowed: at most {MAX_LOG_BYTES} per case")
        return os.pread(self._file.fileno(), max(0, end - start), start).decode("utf-8", "replace")

    def wait_for(self, start: int, needle: str) -> str:
        """The log from ``start`` once it holds ``needle`` (bounded polls)."""
        text = ""
        for _ in range(SYNC_POLLS):
            text = self.read(start)
            if needle in text:
                return text
            time.sleep(SYNC_INTERVAL_S)
        raise RuntimeError(f"llama.cpp log: no {needle!r} line after {SYNC_POLLS} polls")
