"""The oracles of how vLLM schedules a request's prefill and hands it
blocks: chunk ends, internal checkpoints, full-attention blocks, the
junction and Mamba block tables. Each judges something other than the
hits, which its divergences carry unchanged (:func:`fuzz.judge.oracle_base.same_hits`).

* ``split``: a prefill chunk other than a prompt's last ends only where
  align mode needs it to (vLLM's own invariant in
  ``Scheduler._mamba_block_aligned_split``: a Mamba state is written at each
  chunk end, so chunk ends are block aligned): on the hash grid (block
  boundaries, the prompt's checkpoint), at the junction, where the chunk
  budget ran out, or within the MTP prefill lookahead of the prompt's end.
  A chunk ending anywhere else writes a state nothing can key and costs a
  step.
* ``checkpoint``: where the deployment's layers export internal prefill
  checkpoints (vLLM 0.32.0+), a prompt's last chunk that the kernel can
  export its checkpoint from (``reference.boundaries.internal_checkpoint_valid``,
  vLLM's ``is_mamba_prefill_checkpoint_valid``) runs to the prompt's end in
  one step: the feature exists so the prefill is not split there.
* ``hit_blocks``: a request takes from the cache exactly the full-attention
  blocks its hit covers: ceil(hit / block) per full-attention group (full
  attention is downward-closed and the coordinator truncates every
  full-attention group to the reconciled hit, vLLM 0.29.0-0.33.0); a longer
  list hands the request blocks whose tokens it then recomputes into
  shared, cached blocks, a shorter one resumes it without the keys and
  values of tokens it skips.
* ``shared_prefix``: the junction a request reports at admission (vLLM's
  ``shared_prefix_boundary``, 0.29.0-0.33.0) is 0, or above its hit and
  within what full attention can have cached for it (its common prefix
  with an earlier request, below its length). ``split``, ``retention`` and
  ``checkpoint`` take the observed junction as given; this checks it.
* ``block_table``: after each step is scheduled a running request's Mamba
  block tables (align mode) hold no block it has freed, and no block below
  the state the step starts from that the cache does not hold either (vLLM
  0.29.0-0.33.0: "Mamba only need to keep the state of the last computed
  token"; vLLM #55450 fixed a leak of such blocks). A freed block can be
  handed to another request mid-use; an unretired one is memory nothing
  can use until the request ends. And once a request has finished (the
  scheduler holds none), no block of any group is still referenced,
  deferred frees aside: a leaked block is memory no request can use again.
"""

from __future__ import annotations

from engine_adapter.interface import Observation
from fuzz.judge.oracle_base import Divergence, same_hits
from ground.engines import EngineSpec
from reference.boundaries import internal_checkpoint_valid, mamba_checkpoint_position
from reference.case import Case, Request, prompt_tokens
from reference.serial import common_prefix, known_common


def _budget(g, knobs: Observation) -> int:
    """The chunk budget the engine resolved, else the geometry's."""
    return int(knobs.get("max_num_scheduled_tokens") or g.max_num_batched_tokens or 0)


def _prefill_chunks(case: Case, obs: Observation) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """Per request: (its prompt length N, the junction the engine observed
    or 0, its prefill chunks as (start, end) from the engine's
    ``chunk_ends``, the first starting at its admission hit)."""
    hits = obs.get("hits") or []
    out = []
    for i, e in enumerate(obs.get("explain") or []):
        N = int(e.get("prompt_tokens") or len(prompt_tokens(case.trace[i])))
        start = int(e.get("scheduler_hit") or (hits[i] if i < len(hits) else 0) or 0)
        spans = []
        for end in e.get("chunk_ends") or []:
            spans.append((start, end))
            start = end
        out.append((N, int(e.get("junction") or 0), spans))
    return out


def check_split(case: Case, version: EngineSpec | str, obs: Observation) -> list[Divergence]:
    """Every prefill chunk end ``e`` below a prompt's length N (the engine's
    ``chunk_ends``, the first chunk starting at the hit) is on the hash grid
    H, on the CPU engine core's split block, at the junction the engine
    observed, ``budget`` tokens after the chunk's start (the engine's
    ``max_num_scheduled_tokens``), or at least N minus the MTP prefill
    lookahead (``num_prefill_lookahead_tokens``). After the prefill the
    split stands aside (vLLM: "Split only during prefill"): a step
    schedules all it asked for, the sampled token and its drafts (the
    engine's ``decode_steps``), unless ``max_model_len`` caps it; judged
    where the budget is clearly not what cut it. The divergence carries the
    hits unchanged and names the first stray end or cut step; ``context``:
    ``stray_ends`` and ``cut_steps`` ([start, asked, scheduled]) per
    request."""
    g = case.geometry
    explain = obs.get("explain") or []
    knobs = obs.get("knobs") or {}
    if g is None or not explain:
        return []
    H = g.hash_block_size
    budget = _budget(g, knobs)
    lookahead = int(knobs.get("num_prefill_lookahead_tokens") or 0)
    hits = obs.get("hits") or []
    stray = [
        [
            end
            for start, end in spans
            if end < N
            and not (
                end % H == 0
                or (g.split_block_size and end % g.split_block_size == 0)
                or end == junction
                or end - start == budget
                or end >= N - lookahead
            )
        ]
        for N, junction, spans in _prefill_chunks(case, obs)
    ]
    cut = [_cut_steps(e.get("decode_steps") or [], budget, int(knobs.get("max_model_len") or 0)) for e in explain]

    def detail(i: int) -> str:
        if stray[i]:
            return f"request {i}'s prefill chunk ends at {stray[i][0]} of {explain[i].get('prompt_tokens')} (chunk ends {explain[i].get('chunk_ends')}): off the hash grid {H}, not the junction, not the budget {budget}"
        start, asked, scheduled = cut[i][0]
        return (
            f"request {i}'s step after its {explain[i].get('prompt_tokens')}-token prefill, from {start}, schedules {scheduled} of the {asked} tokens it asked for "
            f"(the sampled token and {asked - 1} draft{'' if asked == 2 else 's'}): cut at {start + scheduled}, by neither the budget {budget} nor max_model_len"
        )

    return same_hits("split", version, hits, {"stray_ends": stray, "cut_steps": cut}, detail)


def _cut_steps(steps: list, budget: int, max_model_len: int) -> list[list[int]]:
    """The steps after a prefill ([start, asked, scheduled]) that schedule
    fewer tokens than they asked for where neither the budget (judged only
    when it exceeds the ask by 64 tokens, room for the draft slots vLLM
    reserves) nor ``max_model_len`` (vLLM caps a step from ``start`` at
    ``max_model_len - 1 - start`` tokens) can have cut them; a budget or
    ``max_model_len`` of 0 (unknown): nothing judged."""
    if not budget or not max_model_len:
        return []
    return [[int(a), int(q), int(n)] for a, q, n in steps if n < q and budget >= q + 64 and n < max_model_len - 1 - a]


def check_checkpoint(case: Case, version: EngineSpec | str, obs: Observation) -> list[Divergence]:
    """A uniform geometry (one block B for every group) with an internal
    checkpoint grid: for each request of N tokens, a chunk start ``s`` (its
    hit or a chunk end) on the block grid, with N - s within the chunk
    budget, no junction inside (s, N), and the prompt checkpoint
    ``p = mamba_checkpoint_position(N, H if hits are finer than B else B,
    EAGLE drop, L)`` valid for the chunk [s, N), must be followed by the
    chunk end N. The divergence carries the hits unchanged and names the
    first split; ``context``: ``needless_splits`` per request."""
    g = case.geometry
    explain = obs.get("explain") or []
    knobs = obs.get("knobs") or {}
    if g is None or g.prefill_checkpoint_grid is None or not explain or not knobs:
        return []
    B = g.scheduler_block_size
    if {x.block_size for x in g.groups} != {B}:
        return []
    H = int(knobs.get("hash_block_size") or g.hash_block_size)
    budget = _budget(g, knobs)
    unit = H if (knobs.get("partial_hash_hits") and H < B) else B
    drop, L = bool(knobs.get("eagle_drop")), int(knobs.get("hash_lookahead_tokens") or 0)
    hits = obs.get("hits") or []
    splits = [
        [
            end
            for start, end in spans
            if end < N
            and start % B == 0
            and N - start <= budget
            and not start < junction < N
            and internal_checkpoint_valid(
                start, N, mamba_checkpoint_position(N, unit, drop, L), H, B, g.prefill_checkpoint_grid
            )
        ]
        for N, junction, spans in _prefill_chunks(case, obs)
    ]
    return same_hits(
        "checkpoint",
        version,
        hits,
        {"needless_splits": splits},
        lambda i: (
            f"request {i}'s last chunk is split at {splits[i][0]} of {explain[i].get('prompt_tokens')} (chunk ends {explain[i].get('chunk_ends')}), though the kernel can export its checkpoint from inside the chunk (grid {g.prefill_checkpoint_grid})"
        ),
    )


def check_hit_blocks(case: Case, version: EngineSpec | str, obs: Observation) -> list[Divergence]:
    """Each full-attention group's hit (the engine's ``attention_blocks``:
    [block size, blocks taken] at admission) has exactly ceil(hit / block)
    blocks, ``hit`` the admission's ``scheduler_hit``: full attention is
    downward-closed, so it holds every block below the reconciled hit, and
    the coordinator truncates it there. More hands the request blocks whose
    tokens it then recomputes into shared, cached blocks; fewer resumes it
    at ``hit`` without the keys and values of the tokens it skips. Not
    judged where the engine did not record them. The divergence carries
    the hits unchanged; ``context``: ``extra_blocks`` per request (blocks
    beyond the hit, negative for blocks missing below it, 0 where exact)."""
    explain = obs.get("explain") or []
    extra: list[int] = []
    for e in explain:
        taken, hit = e.get("attention_blocks"), e.get("scheduler_hit")
        if not taken or hit is None:
            extra.append(0)
            continue
        extra.append(max((n - -(-int(hit) // int(bs)) for bs, n in taken), key=abs))
    return same_hits(
        "hit_blocks",
        version,
        obs.get("hits") or [],
        {"extra_blocks": extra},
        lambda i: (
            f"request {i} resumed at {explain[i].get('scheduler_hit')} but took full-attention blocks {explain[i].get('attention_blocks')} ([block size, blocks]): "
            + (
                f"{extra[i]} beyond its hit"
                if extra[i] > 0
                else f"{-extra[i]} fewer than its hit covers (its skipped tokens have no keys and values)"
            )
        ),
    )


def check_shared_prefix(case: Case, version: EngineSpec | str, obs: Observation) -> list[Divergence]:
    """The junction a request reports at admission (the engine's
    ``junction``: vLLM's ``shared_prefix_boundary``, the hit plus the
    coordinator's ``num_uncached_common_prefix_tokens``, i.e. the longest
    single-group hit where it passes the reconciled hit, else 0; vLLM
    0.29.0-0.33.0) is 0, or above the request's hit (``scheduler_hit``) and
    no longer than full attention can have cached for it: below its N
    prompt tokens, and within its longest common prefix with an earlier
    request (that request's prompt, and its ``max_tokens`` outputs where
    the prompt runs through it). ``split``, ``retention`` and
    ``checkpoint`` take the junction the engine observed as given; this
    checks it. Not judged where the engine did not record it. The
    divergence carries the hits unchanged; ``context``: ``bad_junctions``
    per request ([junction, hit, reach], or [] where it holds)."""
    explain = obs.get("explain") or []
    prompts = [prompt_tokens(r) for r in case.trace]
    bad: list[list[int]] = []
    for i, e in enumerate(explain[: len(prompts)]):
        junction, hit = e.get("junction"), e.get("scheduler_hit")
        if not junction or hit is None:
            bad.append([])
            continue
        tokens = prompts[i]
        reach = max((_reach(case.trace[i], tokens, case.trace[j], prompts[j]) for j in range(i)), default=0)
        reach = min(reach, len(tokens) - 1)
        bad.append([int(junction), int(hit), reach] if not int(hit) < int(junction) <= reach else [])
    return same_hits(
        "shared_prefix",
        version,
        obs.get("hits") or [],
        {"bad_junctions": bad},
        lambda i: (
            f"request {i} of {len(prompts[i])} tokens reports the junction {bad[i][0]} (vLLM's shared_prefix_boundary) with its hit at {bad[i][1]}: "
            + (
                f"past the {bad[i][2]} tokens full attention can have cached for it (its longest common prefix with an earlier request, below its length)"
                if bad[i][0] > bad[i][2]
                else "not above its hit"
            )
        ),
    )


def check_block_table(case: Case, version: EngineSpec | str, obs: Observation) -> list[Divergence]:
    """After each step is scheduled a running request's Mamba block tables
    (align mode) hold no block it has freed (reference count below 1: the
    pool may hand it to another request while this one reads or writes it)
    and no block below the state the step starts from (column ``(s - 1) //
    M``, ``s`` its tokens computed before the step) that the cache does not
    hold either: vLLM 0.29.0-0.33.0, "Mamba only need to keep the state of
    the last computed token" (``MambaManager.get_num_skipped_tokens``), and
    ``remove_skipped_blocks`` gives the rest back before each step's
    allocation; such a block is memory no request can use until this one
    finishes (vLLM #55450 fixed a leak of them: retirement stopping at null
    gaps, 71 blocks per group at the peak of a long prefill). The engine's
    ``block_table``: [s, unretired, freed] of each step where it counted
    any. And once a request has finished, with the scheduler holding no
    other, no block of any KV cache group is still referenced (the engine's
    ``leaked_blocks``: reference counts left, the null block and the
    scheduler's deferred frees aside): ``KVCacheManager.free`` gives back
    every block a request took, and one never given back is memory no
    request can use again (a copy-on-write that takes a block and never
    hands it to the request leaves one); a request is flagged where the
    count rose over the request before. Not judged where the engine did
    not record it. The divergence carries the hits unchanged; ``context``:
    ``block_table`` and ``leaked_blocks`` per request."""
    explain = obs.get("explain") or []
    table = [[list(u) for u in (e.get("block_table") or [])] for e in explain]
    held = [int(e.get("leaked_blocks") or 0) for e in explain]  # what the pool still holds after each request
    leaked = [max(0, n - (held[i - 1] if i else 0)) for i, n in enumerate(held)]  # what each request added

    def detail(i: int) -> str:
        if not table[i]:
            return f"request {i} finished with {leaked[i]} more block reference(s) held than before it ({held[i]} in all) and no request left to give them back"
        start, unretired, freed = table[i][0]
        what = " and ".join(
            ([f"{freed} block(s) it had freed"] if freed else [])
            + ([f"{unretired} block(s) below the state it resumes from that nothing can hit"] if unretired else [])
        )
        more = f", and so after {len(table[i]) - 1} more step(s)" if len(table[i]) > 1 else ""
        left = f"; {leaked[i]} more block reference(s) held once it finished" if leaked[i] else ""
        return f"request {i}'s Mamba block table held {what} once the step starting at {start} tokens was scheduled{more}{left}"

    return same_hits(
        "block_table", version, obs.get("hits") or [], {"block_table": table, "leaked_blocks": leaked}, detail
    )


def _reach(request: Request, tokens: list[int], earlier: Request, earlier_tokens: list[int]) -> int:
    """How far an earlier request's cached tokens can match ``request``'s
    (``tokens``): their common prefix (compared past the segments they share
    by construction, as the reference model does), plus the earlier
    request's outputs (at most its ``max_tokens``, whatever was sampled)
    where ``tokens`` runs through its whole prompt."""
    shared = common_prefix(tokens, earlier_tokens, known_common(earlier.prompt, request.prompt))
    return shared + earlier.max_tokens if shared == len(earlier_tokens) else shared
