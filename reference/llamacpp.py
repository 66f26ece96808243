"""llama.cpp's prompt-cache rule for recurrent and hybrid models: slots,
context checkpoints and the RAM prompt cache, as the server applies them
to a serial trace of token-id completions. Pure arithmetic; never imports
llama.cpp (the engine family ``engine_adapter.llamacpp_engine`` runs it).

Source: llama.cpp ``tools/server/server-context.cpp`` and
``server-common.cpp`` as stored at commit 001d906a (the ``xllamacpp``
2026.10.11549 wheel reports no commit, ``BUILD_INFO['commit'] ==
'unknown'``; every rule here was checked against that wheel by
``tests/llamacpp/``). Line numbers are of that snapshot's file offsets
quoted beside each rule by the function it lives in.

A recurrent state cannot be truncated, so a slot that must resume before
the end of what it holds needs a **context checkpoint** (a copy of the
recurrent state after ``n_tokens`` tokens):

* **placement** (``update_slots``, the prompt batch loop): a prompt is fed
  in batches of at most ``n_batch``; a batch also ends where
  ``4 + n_ubatch`` and where ``4`` tokens remain (both capped by
  ``n_batch``: "create checkpoints that many tokens before the end of the
  prompt", PR 20288). Before a batch [s, e) is decoded a checkpoint at s is
  made when s > 0 (the memory holds something) and the batch ends the
  prompt or ends within ``n_ubatch`` of it (``near_prompt_end``); for
  token-id prompts there are no message starts. So a prompt of N tokens
  leaves checkpoints at most at N-4-n_ubatch and N-4 (:func:`placements`).
* **adding one** (``create_checkpoint``): when the list would reach
  ``n_ctx_checkpoints``, checkpoints of earlier tasks within
  ``checkpoint_min_step`` of the one before are dropped, then the oldest
  until there is room; one at the same ``n_tokens`` is superseded.
* **resuming** (``update_slots``, SLOT_STATE_STARTED): n_past is the common
  prefix of the slot's tokens and the prompt. If the slot's state lies at
  or past the threshold (``pos_min_thold`` = n_past, or n_past-1 when the
  prompt adds nothing), the newest checkpoint at ``n_tokens`` k <= n_past
  with k-1 below the threshold is restored and n_past = k; with none, the
  prompt is re-processed from 0. Then every checkpoint past the resume point
  is erased (``pos_max > pos_next``). If the prompt extends all the slot
  holds, the slot's own state is used and nothing is restored.
  n_past = N is cut to N-1 (at least one token is evaluated).
* **slots** (``get_available_slot``): the idle slot whose tokens share the
  largest fraction (> ``slot_prompt_similarity``, 0.1) of the prompt; else
  the least recently used one. A slot chosen by similarity that keeps less
  than half of what it holds (``f_keep`` < 0.5), or any slot chosen by LRU,
  first saves itself to the RAM prompt cache and loads the cached prompt
  that keeps a larger fraction of itself and of the prompt (``f_keep`` and
  ``f_sim`` both larger, ``f_keep`` >= 0.25: ``server_prompt_cache::load``).
* what a slot holds after a request: the prompt and all generated tokens but
  the last (generated tokens are the model's; this model treats them as
  matching no prompt token).

What llama.cpp promises less than kvspec's promise asks (documented in
docs/llamacpp.md, never flagged here): one live state per slot, states
only at the checkpoints above, so a resend resumes 4 tokens before its end
and a sibling that diverges between two checkpoints resumes at the lower.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reference.case import Case, prompt_tokens
from reference.serial import common_prefix

#: llama.cpp's defaults (``common/common.h``), what a deployment's flags override.
DEFAULTS = {
    "n_ctx": 4096,
    "n_parallel": 1,
    "n_ctx_checkpoints": 32,
    "checkpoint_min_step": 8192,
    "cache_ram_mib": 8192,
    "n_batch": 2048,
    "n_ubatch": 512,
    "cache_prompt": True,
    "slot_prompt_similarity": 0.1,
}
#: A generated token: matches no prompt token.
GENERATED = -1


@dataclass(frozen=True)
class Settings:
    n_parallel: int = 1
    n_ctx_checkpoints: int = 32
    checkpoint_min_step: int = 8192
    prompt_cache: bool = True
    n_batch: int = 2048
    n_ubatch: int = 512
    cache_prompt: bool = True
    slot_prompt_similarity: float = 0.1
    cache_idle_slots: bool = True

    @classmethod
    def of(cls, server: dict, params: dict) -> Settings:
        """From what the server resolved (``observation.resolution``)."""
        return cls(
            n_parallel=int(server.get("n_slots") or params.get("n_parallel") or 1),
            n_ctx_checkpoints=int(server.get("n_ctx_checkpoints") or 0),
            checkpoint_min_step=int(server.get("checkpoint_min_step") or params.get("checkpoint_min_step") or 0),
            prompt_cache=bool(server.get("prompt_cache")),
            n_batch=int(server.get("n_batch") or params.get("n_batch")),
            n_ubatch=int(server.get("n_ubatch") or params.get("n_ubatch")),
            cache_prompt=bool(params.get("cache_prompt", True)),
            slot_prompt_similarity=float(params.get("slot_prompt_similarity", 0.1)),
            cache_idle_slots=bool(server.get("cache_idle_slots")),
        )

    @classmethod
    def from_fields(cls, fields: dict) -> Settings:
        """From the deployment's flags over llama.cpp's defaults, as the
        server resolves them for kvspec's models (a recurrent memory: the
        checkpoints stay on; n_ubatch at most n_batch)."""
        f = {**DEFAULTS, **fields}
        n_batch = int(f["n_batch"])
        cache = int(f["cache_ram_mib"]) != 0
        return cls(
            int(f["n_parallel"]),
            int(f["n_ctx_checkpoints"]),
            int(f["checkpoint_min_step"]),
            cache,
            n_batch,
            min(int(f["n_ubatch"]), n_batch),
            bool(f["cache_prompt"]),
            float(f["slot_prompt_similarity"]),
            cache and bool(f.get("cache_idle_slots", True)),
        )


@dataclass
class Checkpoint:
    n_tokens: int
    task: int


@dataclass
class Slot:
    tokens: list[int] = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    t_last: int = -1


def batch_ends(start: int, n: int, n_batch: int, n_ubatch: int) -> list[int]:
    """Where each prompt batch ends, fed from ``start`` to ``n`` (the batch
    loop of ``update_slots``: full at ``n_batch``, cut where
    ``min(n_batch, 4 + n_ubatch)`` or ``min(n_batch, 4)`` tokens remain)."""
    lasts = {min(n_batch, 4 + n_ubatch), min(n_batch, 4)}
    ends, s = [], start
    for _ in range(n + 1):
        if s >= n:
            break
        e = s
        while True:
            e += 1
            if e == n or e - s == n_batch or (n - e) in lasts:
                break
        ends.append(e)
        s = e
    return ends


def placements(start: int, n: int, st: Settings) -> list[int]:
    """The ``n_tokens`` of every checkpoint a prefill from ``start`` to ``n`` makes."""
    if st.n_ctx_checkpoints <= 0:
        return []
    out, s = [], start
    for e in batch_ends(start, n, st.n_batch, st.n_ubatch):
        if s > 0 and (e == n or n < e + st.n_ubatch):
            out.append(s)
        s = e
    return out


def add_checkpoint(cps: list[Checkpoint], at: int, task: int, st: Settings) -> list[int]:
    """``create_checkpoint``: make room, supersede, append; returns the evicted."""
    evicted = []
    if len(cps) + 1 >= st.n_ctx_checkpoints:
        last, keep = -1, []
        for c in cps:
            if c.task != task and last >= 0 and c.n_tokens <= last + st.checkpoint_min_step:
                evicted.append(c.n_tokens)
                continue
            last = c.n_tokens
            keep.append(c)
        cps[:] = keep
    while cps and len(cps) >= st.n_ctx_checkpoints:
        evicted.append(cps.pop(0).n_tokens)
    cps[:] = [c for c in cps if c.n_tokens != at]
    cps.append(Checkpoint(at, task))
    return evicted


def _select(slots: list[Slot], tokens: list[int], st: Settings) -> tuple[int, bool]:
    """``get_available_slot``: (slot index, whether the prompt cache is updated)."""
    best, chosen = 0.0, None
    if st.slot_prompt_similarity != 0:
        for i, s in enumerate(slots):
            if not s.tokens:
                continue
            f = common_prefix(s.tokens, tokens) / len(tokens)
            if f > best and f > st.slot_prompt_similarity:
                best, chosen = f, i
        if chosen is not None:
            f_keep = best * len(tokens) / len(slots[chosen].tokens)
            return chosen, f_keep < 0.5
    t_last, chosen = -1, None
    for i, s in enumerate(slots):
        if chosen is None or s.t_last <= t_last:
            t_last, chosen = s.t_last, i
    return chosen, True


def cache_save(slot: Slot, cache: list[Slot]) -> None:
    """``prompt_save`` / ``server_prompt_cache::alloc``: nothing when a cached
    prompt already holds all of the slot's tokens; else the cached prompts the
    slot's tokens hold all of are dropped ("obsolete") and the slot's copy added."""
    if not slot.tokens or any(common_prefix(c.tokens, slot.tokens) == len(slot.tokens) for c in cache):
        return
    cache[:] = [c for c in cache if common_prefix(c.tokens, slot.tokens) != len(c.tokens)]
    cache.append(Slot(list(slot.tokens), [Checkpoint(c.n_tokens, c.task) for c in slot.checkpoints]))


def _cache_update(slot: Slot, cache: list[Slot], tokens: list[int]) -> bool:
    """``prompt_save`` then ``server_prompt_cache::load``; True when a cached
    prompt replaced the slot's."""
    cache_save(slot, cache)
    lcp = common_prefix(slot.tokens, tokens)
    f_keep_best = lcp / len(slot.tokens) if slot.tokens else -1.0
    f_sim_best = lcp / len(tokens)
    best = None
    for j, c in enumerate(cache):
        lc = common_prefix(c.tokens, tokens)
        f_keep, f_sim = lc / len(c.tokens), lc / len(tokens)
        if f_keep < 0.25:
            continue
        if f_keep_best < f_keep and f_sim_best < f_sim:
            f_keep_best, f_sim_best, best = f_keep, f_sim, j
    if best is None:
        return False
    entry = cache.pop(best)
    slot.tokens, slot.checkpoints = entry.tokens, entry.checkpoints
    return True


@dataclass
class ServedStep:
    """One request, as the rule serves it."""

    request: int
    prompt_tokens: int
    hit: int
    slot: int
    restored: int | None
    forced_full: bool
    created: list[int]
    erased: list[int]
    held: list[int]
    prompt_cache_load: bool

    def as_dict(self) -> dict:
        return {
            "request": self.request,
            "prompt_tokens": self.prompt_tokens,
            "hit": self.hit,
            "query": self.prompt_tokens,
            "slot": self.slot,
            "checkpoint_restored": self.restored,
            "forced_full": self.forced_full,
            "checkpoints_created": self.created,
            "checkpoints_erased": self.erased,
            "checkpoints_held": self.held,
            "prompt_cache_load": self.prompt_cache_load,
        }


def simulate(case: Case, st: Settings) -> list[ServedStep]:
    """Serve ``case``'s trace (serial) with llama.cpp's rule."""
    slots = [Slot() for _ in range(max(1, st.n_parallel))]
    cache: list[Slot] = []
    steps = []
    for i, req in enumerate(case.trace):
        tokens = prompt_tokens(req)
        n = len(tokens)
        k, update = _select(slots, tokens, st)
        slot = slots[k]
        loaded = _cache_update(slot, cache, tokens) if update and st.prompt_cache else False
        if st.prompt_cache and st.cache_idle_slots:  # then every other idle slot publishes a copy (process_single_task)
            for j, other in enumerate(slots):
                if j != k:
                    cache_save(other, cache)
        n_past = common_prefix(slot.tokens, tokens) if st.cache_prompt else 0
        pos_next, restored, forced, erased = n_past, None, False, []
        if n_past > 0 and n_past <= len(slot.tokens):
            thold = max(0, n_past - (0 if n_past < n else 1))
            if len(slot.tokens) - 1 >= thold:  # the slot's state lies past the resume point
                for c in reversed(slot.checkpoints):
                    if c.n_tokens - 1 > pos_next:
                        continue
                    if c.n_tokens - 1 < thold or c.n_tokens - 1 == 0:
                        restored = c.n_tokens
                        break
                if restored is None:
                    forced, pos_next, n_past = True, 0, 0
                else:
                    pos_next = min(pos_next, restored)
                    n_past = min(n_past, restored)
        keep = []
        for c in slot.checkpoints:
            (erased.append(c.n_tokens) if c.n_tokens - 1 > pos_next else keep.append(c))
        slot.checkpoints = keep
        if n_past == n and n_past > 0:
            n_past -= 1
        created = placements(n_past, n, st)
        for at in created:
            erased += add_checkpoint(slot.checkpoints, at, i, st)
        slot.tokens = tokens + [GENERATED] * (req.max_tokens - 1)
        slot.t_last = i
        steps.append(
            ServedStep(
                i, n, n_past, k, restored, forced, created, erased, sorted(c.n_tokens for c in slot.checkpoints), loaded
            )
        )
    return steps


def predict(case: Case, st: Settings) -> dict:
    """The model's answer for a llama.cpp case (``kvspec predict --as llamacpp==X``)."""
    steps = simulate(case, st)
    return {
        "rule": "llamacpp",
        "hits": [s.hit for s in steps],
        "queries": [s.prompt_tokens for s in steps],
        "knobs": None,
        "explain": [s.as_dict() for s in steps],
        "predicted": len(steps),
        "settings": st.__dict__,
    }
