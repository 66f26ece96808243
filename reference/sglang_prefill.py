"""The rule SGLang 0.5.23 implements (``--rule replay`` for ``sglang==X``):
what each request of a serial trace matches, where its prefill cuts chunks,
which Mamba state every extend and decode step tracks, and what the radix
tree keeps.

Pure arithmetic over token lists; no engine import. Each rule cites the
0.5.23 wheel (``sglang/srt/...``). Requests run one after another, each
generating its ``max_tokens``, and nothing is evicted (kvspec's SGLang driver sizes
the pools so). What it reads of SGLang's resolution is
:class:`SglangSetting` (``engine_adapter.sglang_engine.resolve``'s summary).

1. **Match** (``managers/schedule_batch.py:1692 init_next_round_input``,
   ``:1766 _compute_max_prefix_len``: the key is capped at N-1;
   ``mem_cache/radix_cache.py RadixKey.page_aligned``: the walk is in whole
   pages). The full-attention hit is the deepest page both the prompt and a
   kept key share; the hit (``device_prefix_len``) is the deepest kept
   Mamba state at or above a node on that path
   (``components/mamba.py:151 create_match_validator``: a node matches only
   with a Mamba value; ``:322 redistribute_on_node_split``: a split parent
   has none). The branching point
   (``components/mamba.py:164 finalize_match_result_in_tree_core``) is the
   full-attention hit floored to the checkpoint grid, when it lies past
   the hit.
2. **Chunks** (``managers/schedule_policy.py:1600-1680``, the first
   admission, and ``:1140 add_chunked_req``, a continuing one). With
   ``--chunked-prefill-size C``, a request whose remaining tokens, rounded
   up to the page, exceed C is cut: the first chunk takes C floored to the
   page and ends on an absolute page (``end = (prefix + extend) // page *
   page``); a continuing chunk takes min(C, remaining) tokens, not rounded
   (``mamba_prefill_chunk_grid`` is 1 without DCP, ``:586``).
3. **Tracking** (extra buffer only; ``managers/schedule_batch.py:3137
   _mamba_radix_cache_v2_req_prepare_for_extend``). An extend from p to e
   tracks a state when ``e - p >= grid``, at ``p + (e - p) // grid * grid``
   (relative to its own prefix, not the absolute grid), or instead at the
   branching point b when ``p < b < track_seqlen`` and ``(b - p) %
   cache_chunk == 0``; ``track_seqlen`` is e, or the aligned point + 1 when
   the model's FLA chunk grid (``mamba_chunk_size``) would land elsewhere.
   The state the kernel copies (``layers/attention/mamba/
   prefill_track_metadata.py:23 build_prefill_track_plan``): with
   ``L = track_seqlen - p``, the final state (over e tokens) when
   ``L % state_chunk == 0``, else the snapshot at ``p + L // state_chunk *
   state_chunk``. An extend that tracks nothing leaves the last tracked
   length as it was.
4. **Keeping** (``mem_cache/unified_radix_cache.py:1164
   checkpoint_into_tree``). Between chunks (``common.py:271
   checkpoint_kv_cache``, up to the chunk end) and at the end
   (``common.py:400 release_kv_cache``, up to the prompt), the cache length
   is min(the tokens, the Mamba component's length), and the key is that
   floored to the page (``:1232 page_aligned``): full attention up to the
   key, and the Mamba state at the key (``components/mamba.py:227
   commit_insert_component_data``: only where the node has none yet). The
   Mamba length (``components/mamba.py:604 prepare_for_caching_req``):
   with the extra buffer the last tracked length (none tracked: nothing is
   kept, ``:582 _select_finished_checkpoint``); under ``no_buffer`` the
   tokens themselves (the working state, page 1).

So a state's key and the tokens it was computed over can differ: a
continuing chunk starts off the page, its tracked point is off the page
too, and the key floors it. :func:`simulate` reports both
(``resumed_state``: the tokens the resumed state was computed over).

5. **Decode** (a request asking for m > 1 tokens; overlap off, no
   speculation). Its prefill's result checkpoints it up to its prompt
   (``batch_result_processor.py:392 checkpoint_kv_cache``); each decode
   step reaching ``seq`` tokens (n+1 .. n+m-1) tracks, with the extra
   buffer, where ``seq % track_grid == 0`` (``schedule_batch.py:3815``),
   keyed at ``seq`` (``batch_result_processor.py:1406``); the finished
   request donates the last tracked state within its n+m-1 computed tokens,
   else the one before (``components/mamba.py:582
   _select_finished_checkpoint``), keyed and kept as in 4; under
   ``no_buffer`` the working state at n+m-1. Its outputs are kvspec's
   output tokens, so a later turn quoting them matches them.

6. **Speculative decoding** (an EAGLE chain, topk 1, with the extra
   buffer; SGLang refuses it under ``no_buffer``, ``mamba_hook`` /
   ``model_hook.py``). The tree keys bigrams (``is_eagle``,
   ``mem_cache/kv_cache_builder.py:401``; ``radix_cache.py:60 RadixKey``:
   N+1 raw tokens for N bigrams, a slice sharing its boundary token), which
   keys and matches the same lengths as rules 1 and 4 (the driver's probes
   in ``tests/engine/test_sglang.py``). A decode is a run of verify steps,
   each committing ``a`` tokens (kvspec's stood-in drafter proposes the
   token the target samples, so every draft is accepted: ``a`` is the
   resolved ``speculative_num_draft_tokens``): from ``pre`` (``n`` after
   the prefill) to ``post = pre + a`` while fewer than ``m`` outputs
   exist (the prefill gave one, each step ``a`` more; the last step may run
   past ``m``, ``schedule_batch.py:2038`` caps only the outputs). A step
   tracks where it crosses a multiple of ``track_grid``, at ``post //
   track_grid * track_grid`` (``speculative/spec_utils.py:983-1002
   _verify_commit_step_indices``; keyed there,
   ``batch_result_processor.py:1652-1666 _mamba_check_track_boundary``),
   and the finished request donates as in 5 within ``min(n + m, pre)``
   tokens: its outputs capped at ``m`` (``finished_len``), and every one
   of them computed by a verify unless the last step stopped short
   (``_select_finished_checkpoint``: a state tracked past them, by a step
   that ran past ``m``, is not keyed).

Not in this model (refused, :class:`ground.errors.Unsupported`):
``--mamba-max-states-per-path`` (its eviction walks the tree's shape,
``components/mamba.py:265``), ``extra_buffer_lazy``, concurrent traces
(:func:`predict` states their serial prefix, :func:`serial_steps`; a wave's
hits depend on how SGLang batches it, judged by the engine-neutral
concurrent oracles).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from ground.errors import Unsupported, invalid
from reference.case import Case, is_concurrent, prompt_tokens, serial_prefix
from reference.radix import common_prefix
from reference.tokens import output_tokens

#: The SGLang releases this rule is stated for.
SGLANG_RULE_VERSIONS = ("0.5.23",)
#: What ``--rule`` names SGLang's implemented rule.
IMPLEMENTED = "replay"


@dataclass(frozen=True)
class SglangSetting:
    """The numbers of SGLang's resolution the rule reads (the summary of
    ``engine_adapter.sglang_engine.resolve.SglangResolution``)."""

    page_size: int
    chunked_prefill_size: int | None
    extra_buffer: bool
    strategy: str
    cache_chunk: int
    checkpoint_grid: int
    state_chunk: int
    max_states_per_path: int = -1
    #: The decode track grid (``runtime_context.mamba_track_grid``: the
    #: ``--mamba-track-interval`` on the checkpoint grid); 0: not stated.
    track_grid: int = 0
    #: Tokens a verify step commits under speculative decoding (the
    #: resolved ``speculative_num_draft_tokens``: rule 6); 0: no speculation.
    draft_tokens: int = 0

    @classmethod
    def from_resolution(cls, r: dict) -> SglangSetting:
        """From a resolution summary (``observation["resolution"]``)."""
        try:
            chunked = r.get("chunked_prefill_size")
            return cls(
                page_size=int(r["page_size"]),
                chunked_prefill_size=int(chunked) if chunked is not None and int(chunked) > 0 else None,
                extra_buffer=bool(r["extra_buffer"]),
                strategy=str(r["mamba_radix_cache_strategy"]),
                cache_chunk=int(r["mamba_cache_chunk_size"]),
                checkpoint_grid=int(r["checkpoint_grid"]),
                state_chunk=int(r.get("mamba_state_chunk_size") or 64),
                max_states_per_path=int(r.get("mamba_max_states_per_path", -1)),
                track_grid=int(r.get("track_grid") or 0),
                draft_tokens=int(r.get("speculative_num_draft_tokens") or 0) if r.get("speculative_algorithm") else 0,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise invalid(
                "resolution",
                str(r)[:80],
                f"an SGLang resolution summary with page_size, chunked_prefill_size, extra_buffer, checkpoint_grid ({e})",
            ) from None

    def check(self) -> None:
        if self.max_states_per_path != -1:
            raise Unsupported(
                f"mamba_max_states_per_path={self.max_states_per_path}: its eviction is not in SGLang's replay rule here; allowed: -1 (unlimited)"
            )
        if self.strategy not in ("extra_buffer", "no_buffer"):
            raise Unsupported(
                f"mamba_radix_cache_strategy={self.strategy!r}: not in SGLang's replay rule here; allowed: extra_buffer, no_buffer"
            )
        for name in ("page_size", "cache_chunk", "checkpoint_grid", "state_chunk"):
            if getattr(self, name) < 1:
                raise invalid(name, getattr(self, name), "allowed: a positive integer")


def page_floor(n: int, page: int) -> int:
    return n // page * page


def ceil_page(n: int, page: int) -> int:
    return -(-n // page) * page


def first_chunk(prefix: int, remaining: int, s: SglangSetting) -> int:
    """Tokens the first admission extends (``schedule_policy.py:1609-1672``):
    all when they fit (rounded up to the page), else the budget floored to
    the page, ending on an absolute page."""
    c = s.chunked_prefill_size
    if c is None or ceil_page(remaining, s.page_size) <= c:
        return remaining
    extend = page_floor(c, s.page_size)
    end = page_floor(prefix + extend, s.page_size)
    return end - prefix


def next_chunk(remaining: int, s: SglangSetting) -> int:
    """Tokens a continuing chunk extends (``schedule_policy.py:1140
    add_chunked_req``: min(remaining, budget), unrounded without DCP)."""
    c = s.chunked_prefill_size
    return remaining if c is None else min(remaining, c)


@dataclass(frozen=True)
class Track:
    """One extend's tracked state: its key length and the tokens the kernel computed it over."""

    seqlen: int
    content: int


def track(prefix: int, end: int, branching: int | None, s: SglangSetting) -> Track | None:
    """The state an extend from ``prefix`` to ``end`` tracks (extra buffer;
    ``schedule_batch.py:3137-3232``), and what the kernel copies for it
    (``prefill_track_metadata.py:23-57``); None when it tracks none."""
    grid, ext = s.checkpoint_grid, end - prefix
    if ext < grid:
        return None
    aligned = prefix + ext // grid * grid
    seqlen = end
    if prefix + ext // s.state_chunk * s.state_chunk != aligned:
        seqlen = aligned + 1  # _force_track_h
    if branching is not None and prefix < branching < seqlen and (branching - prefix) % s.cache_chunk == 0:
        seqlen, aligned = branching + 1, branching
    length = seqlen - prefix
    content = end if length % s.state_chunk == 0 else prefix + length // s.state_chunk * s.state_chunk
    return Track(aligned, content)


@dataclass
class _Kept:
    """What the tree keeps: full-attention keys and Mamba states, each on a request's tokens."""

    keys: list[tuple[int, int]] = field(default_factory=list)  # (prompt index, key length)
    states: list[tuple[int, int, int]] = field(default_factory=list)  # (prompt index, key length, content length)


@dataclass
class ReplayedRequest:
    """One request's replay: what the model states for it."""

    request: int
    prompt_tokens: int
    hit: int
    full_hit: int
    branching: int | None
    chunk_ends: list[int]
    tracked: list[int]
    kept: list[int]
    resumed_content: int | None
    resumed_same_tokens: bool | None

    def as_dict(self) -> dict:
        return asdict(self)


def _insert(
    kept: _Kept,
    prompts: list[list[int]],
    i: int,
    tokens_len: int,
    mamba_len: int | None,
    content: int | None,
    s: SglangSetting,
) -> int | None:
    """``checkpoint_into_tree`` up to ``tokens_len``; returns the key a state went to, or None."""
    if mamba_len is None or mamba_len <= 0:
        return None
    key = page_floor(min(tokens_len, mamba_len), s.page_size)
    if key <= 0:
        return None
    kept.keys.append((i, key))
    mine = prompts[i]
    for j, k, _ in kept.states:
        if k == key and common_prefix(prompts[j], mine) >= key:
            return key  # mamba_exist: the node keeps its first state
    kept.states.append((i, key, content if content is not None else mamba_len))
    return key


def _checkpoint(kept: _Kept, seqs: list[list[int]], i: int, upto: int, last: Track | None, s: SglangSetting):
    """``tree_cache.checkpoint(req, up_to=upto)``: with the extra buffer the
    last tracked state, under ``no_buffer`` the working state at ``upto``."""
    if s.extra_buffer:
        return _insert(kept, seqs, i, upto, last.seqlen if last else None, last.content if last else None, s)
    return _insert(kept, seqs, i, upto, upto, upto, s)


def decode_tracks(n: int, m: int, s: SglangSetting) -> list[Track]:
    """The states a request's decode steps track (extra buffer): a step
    whose sequence reaches ``seq`` tokens (``n + 1`` .. ``n + m - 1``: the
    prompt, then each output but the last) tracks where ``seq %
    track_grid == 0`` (``schedule_batch.py:3815``), the state after that
    step's token, keyed at ``kv_committed_len`` (``batch_result_processor.py:1406``)."""
    if not s.extra_buffer:
        return []
    g = s.track_grid
    first = (n + 1 + g - 1) // g * g
    return [Track(q, q) for q in range(first, n + m, g)]


def spec_decode_tracks(n: int, m: int, s: SglangSetting) -> tuple[list[Track], int]:
    """The states a request's verify steps track (rule 6), and the tokens
    its finished key covers: each step from ``pre`` to ``post = pre + a``
    tracks at ``post // track_grid * track_grid`` when it crosses a
    multiple of the grid (``spec_utils.py:983-1002``), while fewer than
    ``m`` outputs exist; the key covers ``min(n + m, pre)``."""
    g, a = s.track_grid, s.draft_tokens
    out, pre, outputs = [], n, 1
    while outputs < m:
        post = pre + a
        if s.extra_buffer and pre // g != post // g:
            out.append(Track(post // g * g, post // g * g))
        pre, outputs = post, outputs + a
    return out, min(n + m, pre)


def finished_checkpoint(last: Track | None, previous: Track | None, tokens: int) -> Track | None:
    """The state a finished request donates (``components/mamba.py:582
    _select_finished_checkpoint``): the last tracked one when its length is
    within the key's ``tokens``, else the one before it when that is, else
    none."""
    if last is None or last.seqlen <= tokens:
        return last
    return previous if previous is not None and previous.seqlen <= tokens else None


def simulate(case: Case, s: SglangSetting) -> list[ReplayedRequest]:
    """Every request of a serial trace through SGLang 0.5.23's rule."""
    s.check()
    if is_concurrent(case):
        raise Unsupported("trace: a concurrent trace; allowed in SGLang's replay rule: serial requests")
    decoding = any(r.max_tokens > 1 for r in case.trace)
    if decoding and s.extra_buffer and s.track_grid < 1:
        raise invalid(
            "track_grid", s.track_grid, "a positive integer (SGLang's decode track grid) for a trace that decodes"
        )
    prompts = [prompt_tokens(r) for r in case.trace]
    seqs = [p + output_tokens(r.max_tokens) for p, r in zip(prompts, case.trace)]
    kept = _Kept()
    out: list[ReplayedRequest] = []
    for i, tokens in enumerate(prompts):
        n = len(tokens)
        limit = page_floor(max(n - 1, 0), s.page_size)
        full_hit = 0
        for j, k in kept.keys:
            full_hit = max(full_hit, page_floor(min(k, limit, common_prefix(seqs[j], tokens)), s.page_size))
        hit, src = 0, None
        for j, k, content in kept.states:
            if k <= full_hit and k > hit and common_prefix(seqs[j], tokens) >= k:
                hit, src = k, (j, content)
        aligned = page_floor(full_hit, s.checkpoint_grid)
        branching = aligned if aligned > hit else None
        prefix, last_track, chunk_ends, tracked, kept_at = hit, None, [], [], []
        first = True
        for _ in range(n + 2):
            remaining = n - prefix
            ext = first_chunk(prefix, remaining, s) if first else next_chunk(remaining, s)
            first = False
            end = prefix + ext
            chunk_ends.append(end)
            if s.extra_buffer:
                t = track(prefix, end, branching, s)
                if t is not None:
                    last_track = t
                    tracked.append(t.seqlen)
            if end < n:  # checkpoint_kv_cache between chunks
                k = _checkpoint(kept, seqs, i, end, last_track, s)
                if k is not None:
                    kept_at.append(k)
                prefix = end
                continue
            m = case.trace[i].max_tokens
            if m > 1:  # unfinished after its prefill: checkpointed up to n, then decoded
                k = _checkpoint(kept, seqs, i, n, last_track, s)
                if k is not None:
                    kept_at.append(k)
                previous = None
                decoded, keyed = spec_decode_tracks(n, m, s) if s.draft_tokens else (decode_tracks(n, m, s), n + m - 1)
                for t in decoded:
                    previous, last_track = last_track, t
                    tracked.append(t.seqlen)
                last_track = finished_checkpoint(last_track, previous, keyed)
            else:
                keyed = n + m - 1
            k = _checkpoint(kept, seqs, i, keyed, last_track, s)
            if k is not None:
                kept_at.append(k)
            break
        resumed = same = None
        if hit and src is not None:
            j, content = src
            resumed = content
            same = content == hit and common_prefix(seqs[j], tokens) >= content
        out.append(ReplayedRequest(i, n, hit, full_hit, branching, chunk_ends, tracked, kept_at, resumed, same))
    return out


def serial_steps(case: Case, s: SglangSetting) -> list[ReplayedRequest]:
    """:func:`simulate` on the trace's serial prefix (all of a serial trace)."""
    k = serial_prefix(case)
    return simulate(replace(case, trace=case.trace[:k]), s) if k else []


def predict(case: Case, s: SglangSetting, version: str = "sglang==0.5.23") -> dict:
    """``kvspec predict --as sglang==X --rule replay``'s answer (the shape of
    :func:`reference.predict.predict_with_knobs`). A concurrent trace, as
    for vLLM: the rule is stated for its serial prefix
    (:func:`reference.case.serial_prefix`); the rest are ``null``, with the
    engine-neutral ``bounds`` (the most each can resume whatever SGLang
    batches), and the concurrent oracles judge them."""
    from reference.predict import unpredicted_bounds

    steps = serial_steps(case, s)
    k = len(steps)
    rest = len(case.trace) - k
    out = {
        "rule": IMPLEMENTED,
        "engine": version,
        "hits": [r.hit for r in steps] + [None] * rest,
        "queries": [r.prompt_tokens for r in steps] + [r.num_prompt_tokens for r in case.trace[k:]],
        "knobs": {},
        "setting": asdict(s),
        "explain": [r.as_dict() for r in steps] + [None] * rest,
        "predicted": k,
    }
    if rest:
        out["bounds"] = unpredicted_bounds(case)
    return out


def legitimately_above(promise_hits: list, observed: dict, steps: list[ReplayedRequest]) -> dict[int, str]:
    """Requests whose observed hit is above the promise's by a state
    SGLang legitimately wrote (``run --compare --rule promise`` on SGLang):
    the replay rule resumes there too, from a state kept at a chunk end or
    a point a prefill or decode step tracked, computed over exactly the tokens it is
    keyed by, and the engine's resumed state says the same
    (``explain[i].resumed_state.same_tokens``). {request: why}."""
    out = {}
    hits, explain = observed.get("hits") or [], observed.get("explain") or []
    for i, (p, o) in enumerate(zip(promise_hits, hits)):
        if p is None or o is None or o <= p or i >= len(steps) or i >= len(explain):
            continue
        r, resumed = steps[i], (explain[i] or {}).get("resumed_state") or {}
        if r.hit == o and r.resumed_same_tokens and resumed.get("same_tokens") is True:
            out[i] = (
                f"hits {o} above the promise's {p}: a state SGLang wrote at {o} (a chunk end, or a point a prefill or decode step tracked, computed over its own tokens), not a divergence"
            )
    return out
