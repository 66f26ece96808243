"""The upper-bound (safety) oracles: a hit is never higher than an engine may
safely resume. The promise and ``reference`` judge a hit that is too *low*
(lost reuse); these judge one that is too *high*, whatever supplied it (the
local prefix cache or a KV connector's load), on every family and build.
Their rules are the engines' own intent, not the promise's number: a hit
above the promise is no finding by itself (SGLang legitimately resumes at
chunk-end states the promise does not count), only when it breaks one of:

* ``cap``: no request resumes at or past the last prompt position its
  engine must compute. Every engine samples the first output token from
  the logits of the last prompt token, so it computes that token: vLLM
  0.29.0-0.33.0 ``KVCacheManager.get_computed_blocks`` caps the lookup at
  ``request.num_tokens - 1`` ("When all tokens hit the cache, we must
  recompute the last token to obtain logits",
  ``vllm/v1/core/kv_cache_manager.py:295-302`` in 0.33.0), and a KV
  connector's load only extends what the scheduler computes
  (``Scheduler.schedule``, ``sched/scheduler.py:1138``), so the same cap
  holds for the sum. SGLang 0.5.23 caps its match at ``N - 1`` too
  (``schedule_batch.py _compute_max_prefix_len``). The cap is read from the
  observation where the family reports its own (``explain[i].resume_cap``),
  else it is ``N - 1``, the bound every engine that samples from the last
  prompt token obeys.
* ``keys``: a hit covers only tokens whose cache keys match the request's.
  kvspec computes the key material itself from the case's tokens, never
  from the engine's hashes: the chained block hash over ``tokens[0:h]``
  (every family keys a block by its whole prefix: vLLM's
  ``get_request_block_hasher``, ``kv_cache_utils.py:953``; SGLang's radix
  tree by the raw tokens). A hit at ``h`` is safe only where some earlier
  request's sequence (prompt and output, which vLLM caches as it caches a
  prompt) starts with the same ``h`` tokens: a hit whose key no earlier
  request produced serves a target model's KV or state computed over other
  tokens (wrong output possible). The case model has no extra keys (no
  LoRA, multimodal input or cache salt), so the chain over the tokens is the
  whole key.
* ``draft_keys``: under vLLM 0.33.0's lookahead block hashes
  (``num_hash_lookahead_tokens`` L > 0: single-module MTP and EAGLE) the key
  of a block also covers the L tokens after it, "which the drafter's KV at
  the block's last position depends on" (``kv_cache_utils.py:966-968``,
  ``:1003-1016``). A hit at ``h`` on the hash grid therefore needs an
  earlier sequence that also agrees on ``tokens[h:h+L]`` and was long
  enough to hash that block (``h + L`` tokens: ``:975``). L is kvspec's own
  (``reference.knobs.resolve_knobs`` for the release; 0 for SGLang and
  before 0.33.0), never read from the engine, so a build that drops the
  lookahead from its keys is judged by the release's rule. A miss here
  reuses only the drafter's KV (the target still verifies every draft):
  severity ``draft acceptance``.

Expected hits: the highest safe hit at or below the observed one (the cap;
the longest prefix some earlier request keyed, floored to the hash unit).
"""

from __future__ import annotations

from engine_adapter.interface import Observation
from fuzz.judge.oracle_base import Divergence, engine_key
from ground.engines import EngineSpec
from ground.errors import KvspecError
from reference.case import Case, prompt_tokens, sequence_tokens


def resume_cap(case: Case, obs: Observation, i: int) -> int:
    """The highest position request ``i`` may resume at: the family's own
    (``explain[i].resume_cap``) when it reports one, else ``N - 1``."""
    n = len(prompt_tokens(case.trace[i]))
    explain = obs.get("explain") or []
    cap = explain[i].get("resume_cap") if i < len(explain) else None
    return min(int(cap), n - 1) if isinstance(cap, int) and not isinstance(cap, bool) else n - 1


def check_cap(case: Case, version: EngineSpec | str, obs: Observation) -> list[Divergence]:
    """No hit at or past the last position the engine must compute (see the
    module note). Expected hits: the cap."""
    hits = list(obs.get("hits") or [])
    caps = [resume_cap(case, obs, i) for i in range(min(len(hits), len(case.trace)))]
    bad = [i for i, c in enumerate(caps) if hits[i] > max(c, 0)]
    if not bad:
        return []
    i = bad[0]
    external = ((obs.get("explain") or [{}] * (i + 1))[i] or {}).get("external_hit")
    source = f" ({external} of them loaded by a KV connector)" if external else ""
    detail = (
        f"request {i} resumed at {hits[i]}{source} of its {len(prompt_tokens(case.trace[i]))}-token prompt, past {caps[i]}, "
        "the last position whose logits it must compute"
    )
    expected = [min(h, max(caps[k], 0)) if k < len(caps) else h for k, h in enumerate(hits)]
    return [Divergence("cap", engine_key(version), bad, expected, hits, detail)]


def _lookahead(case: Case, version: EngineSpec | str) -> tuple[int, int]:
    """(hash unit H, lookahead tokens L) kvspec states for the case on the
    engine's release (the typed engine's ``release_spec``: never parsed
    again; a version key is read by ``reference.knobs``); (1, 0) where the
    reference cannot resolve it (a case outside the model: no lookahead
    rule is claimed)."""
    from reference.knobs import resolve_knobs

    release = version.release_spec if isinstance(version, EngineSpec) else version.split("+", 1)[0]
    try:
        k = resolve_knobs(case, release)
    except (KvspecError, ValueError):
        return 1, 0
    return max(int(k.hash_block_size), 1), int(k.hash_lookahead_tokens)


def _common(a: list[int], b: list[int], upto: int) -> int:
    """The length of the common prefix of ``a`` and ``b``, at most ``upto``
    (a binary search over slice comparisons, which run in C)."""
    lo, hi = 0, min(len(a), len(b), upto)
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def keyed_prefix(tokens: list[int], earlier: list[list[int]], upto: int) -> int:
    """The longest ``p <= upto`` such that some sequence of ``earlier``
    starts with ``tokens[:p]`` (the deepest key an earlier request made)."""
    return max((_common(tokens, seq, upto) for seq in earlier), default=0)


def _safety_of_keys(
    case: Case, version: EngineSpec | str, obs: Observation
) -> tuple[list[int], list[int], list[int], list[int], int, int]:
    """(requests whose hit no earlier key covers, their safe hits; requests
    whose hit only the lookahead key fails, their safe hits; H; L)."""
    hits = list(obs.get("hits") or [])
    H, L = _lookahead(case, version)
    seqs = [sequence_tokens(r) for r in case.trace]
    bad, exp, draft, dexp = [], [], [], []
    for i, h in enumerate(hits[: len(case.trace)]):
        if h <= 0:
            continue
        mine = prompt_tokens(case.trace[i])
        earlier = seqs[:i]
        head = mine[:h]
        if len(head) < h or not any(s[:h] == head for s in earlier):
            bad.append(i)
            exp.append(keyed_prefix(mine, earlier, h) // H * H)
        elif L and h % H == 0 and not any(len(s) >= h + L and s[: h + L] == mine[: h + L] for s in earlier):
            draft.append(i)
            dexp.append(max(h - H, 0))
    return bad, exp, draft, dexp, H, L


def _lowered(obs: Observation, requests: list[int], safe: list[int]) -> tuple[list[int], list[int]]:
    """(the observed hits, the expected ones: each of ``requests`` lowered
    to its safe hit, the others as observed)."""
    hits = list(obs.get("hits") or [])
    expected = list(hits)
    for i, e in zip(requests, safe):
        expected[i] = e
    return hits, expected


def check_keys(case: Case, version: EngineSpec | str, obs: Observation) -> list[Divergence]:
    """A hit covers only tokens an earlier request keyed over the same
    prefix (see the module note). Expected hits: the longest such prefix,
    floored to the hash unit."""
    bad, exp, _d, _de, H, _L = _safety_of_keys(case, version, obs)
    if not bad:
        return []
    hits, expected = _lowered(obs, bad, exp)
    i = bad[0]
    detail = (
        f"request {i} resumed at {hits[i]}, but no earlier request's tokens match its first {hits[i]} "
        f"(the longest keyed prefix is {keyed_prefix(prompt_tokens(case.trace[i]), [sequence_tokens(r) for r in case.trace[:i]], hits[i])}): "
        "it reused KV or a state computed over other tokens"
    )
    return [Divergence("keys", engine_key(version), bad, expected, hits, detail)]


def check_draft_keys(case: Case, version: EngineSpec | str, obs: Observation) -> list[Divergence]:
    """Under lookahead block hashes a hit on the hash grid needs an earlier
    sequence that agrees on the L tokens after it too (see the module
    note). Expected hits: one hash unit lower."""
    _b, _e, draft, dexp, H, L = _safety_of_keys(case, version, obs)  # draft and bad are disjoint (elif)
    if not draft:
        return []
    hits, expected = _lowered(obs, draft, dexp)
    i = draft[0]
    h = hits[i]
    nxt = prompt_tokens(case.trace[i])[h : h + L]
    detail = (
        f"request {i} resumed at {h} over a block whose key covers the {L} lookahead token(s) {nxt} after it, "
        "which no earlier request had there: the drafter's KV at that position was computed for another next token"
    )
    return [
        Divergence("draft_keys", engine_key(version), draft, expected, hits, detail, {"hash_unit": H, "lookahead": L})
    ]
