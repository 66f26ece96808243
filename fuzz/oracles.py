"""Oracles: each compares one engine observation with what must hold, and
says which requests diverge.

* ``promise``: an identical resend or a longer sibling of an earlier prompt
  hits exactly what kvspec's promise predicts (where dense retention would
  resume). A sibling diverging inside an earlier prompt is not compared.
* ``reference``: every request hits what the reference model predicts for
  the rule the engine's version implements (``legacy`` before 0.30.0,
  ``replay`` from 0.30.0), with the knobs that version resolves. A
  divergence here is either a vLLM behaviour the model misses or a bug.
* ``knobs``: the engine resolved the same knobs as the reference model.
* ``sparse_dense``: on the same engine, no promised request hits less under
  sparse retention (interval 0) than under dense retention, capped by the
  promise: dense retention also keeps the chunk ends of other earlier
  prompts (a prompt that extends one request and diverges inside another
  finds them), which sparse retention is not promised to keep. A request
  that hits more under sparse is not this oracle's: it says the dense run
  fell short, which the promise judges on a dense case. The dense run is
  made only where a promised request hits below the promise (elsewhere it
  cannot fire).
* ``spec_on_off``: turning speculative decoding on moves the first repeat's
  hit only by the documented EAGLE drop (the model's difference); judged
  only where the spec-off run keeps the promise. The spec-off run is made
  only where the first repeat misses the promise (elsewhere it cannot
  fire).
* ``versions``: two engine versions agree on every request.
* ``junction`` (only when asked: ``kvspec check-build``): under sparse
  retention a sibling diverging inside an earlier prompt hits at least what
  the promise predicts, capped by its dense-retention hit on the same engine.
* ``stale``: every hit resumes from a Mamba state an earlier prefill wrote
  at that position over the same tokens (the engine's ``written``: its
  chunk ends and the internal checkpoints vLLM's worker-side code places).
  Any other hit serves a state that belongs elsewhere. Also: no request
  leaves a state held at a prompt position its prefill did not write and
  no earlier request held (it keyed a state it never computed). Not judged
  where the engine could not observe the writes (``written`` null).
* ``retention``: under sparse or periodic retention a request leaves in the
  cache only states a later request can resume at (a boundary the promise
  or the release's rule keeps, for this prompt or an earlier one over the
  same tokens, or the junction the engine observed), and under periodic
  retention every segment boundary its prefill wrote over its hashed tokens.
  Inside a request's output (past its prompt) sparse retention keeps no
  state (vLLM: "only semantic checkpoints"), periodic retention only
  segment ends. Sparse retention exists to save that memory; a state kept
  nowhere reachable is the memory it was meant to save, a segment boundary
  dropped is reuse periodic retention promises a sibling.
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
* ``resolution``: the geometry vLLM resolved for a deployment keeps what
  vLLM documents of its flags: with ``--prefix-match-unit`` U the hash
  block size is U (``CacheConfig.prefix_match_unit``, 0.29.0-0.33.0: "This
  equals to the hash_block_size used throughout the KV cache code"), and
  it divides every group's block size (the same docstring: "as long as
  every KV cache group's block_size is divisible by it"; vLLM rejects any
  other unit). A build that accepts the flag and hashes otherwise, or
  accepts a unit that does not divide a block, silently serves other hits
  than the deployment asked for. Judged on the engine's
  ``resolution`` before the case is resolved (a geometry that breaks it
  is not judged further); no request diverges.
* ``engine_error``: vLLM raised on a case the model accepts.

An observation is the dict an engine returns (``hits``, ``queries``,
``knobs``, ``explain``) or ``{"error": {...}}``.

A concurrent trace (requests that share scheduler steps, ``arrival``;
docs/concurrent.md): the oracles of :data:`CONCURRENT_ORACLES` judge every
request, ``stale`` by steps (an "earlier" write is one computed in a step
before the first step that ran the request: a state whose forward pass
runs in the same step is not there yet); the others judge the serial
prefix (:func:`serial_part`), where their rules were stated.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from reference.boundaries import internal_checkpoint_valid, junction_states, mamba_checkpoint_position, resumable_states
from reference.case import Case, Request, is_concurrent, prompt_tokens, serial_prefix, waves, with_resolution
from ground.errors import DeploymentRejected
from reference.knobs import implemented_rule, resolve_knobs
from reference.predict import predict_with_knobs
from reference.serial import common_prefix, known_common
from reference.variants import has_speculative, with_retention, without_speculative

ORACLES = ("promise", "stale", "retention", "split", "checkpoint", "hit_blocks", "shared_prefix", "block_table", "resolution", "reference", "knobs", "sparse_dense", "spec_on_off", "versions", "engine_error")
#: The oracles that judge a build of a release (a patched, local-tree or
#: wheel engine, version ``X+LABEL.HASH``): ``reference`` and ``knobs``
#: compare with the rule the *release* implements, which a patch is meant
#: to change, so they are left out.
BUILD_ORACLES = ("promise", "stale", "retention", "split", "checkpoint", "hit_blocks", "shared_prefix", "block_table", "resolution", "sparse_dense", "spec_on_off", "versions", "engine_error", "junction")
#: Oracles a campaign runs only when asked (``kvspec check-build``):
#: ``junction``: under sparse retention a sibling diverging inside an earlier
#: prompt hits at least its promised hit (the divergence point once the
#: junction was observed), capped by the same engine's dense-retention hit.
EXTRA_ORACLES = ("junction",)
#: The oracles that judge something other than the hits (chunks, blocks,
#: held states, the junction, Mamba block tables): their divergences carry the hits unchanged.
SAME_HITS_ORACLES = ("retention", "split", "checkpoint", "hit_blocks", "shared_prefix", "block_table")
#: Every oracle a finding may name.
KNOWN_ORACLES = ORACLES + EXTRA_ORACLES
#: Knob names both the model and the engine report.
COMPARED_KNOBS = ("eagle_drop", "hash_lookahead_tokens", "scheduler_block_size", "hash_block_size", "alignment")

Run = Callable[[Case], dict]


@dataclass
class Divergence:
    """One oracle firing on one case."""

    oracle: str
    version: str
    requests: list[int]  # the diverging requests, first first
    expected: list
    observed: list
    detail: str = ""
    context: dict = field(default_factory=dict)

    @property
    def first(self) -> int | None:
        return self.requests[0] if self.requests else None


def request_kinds(case: Case) -> list[str]:
    """For each request: ``fresh``, ``resend`` (identical to an earlier
    prompt), ``extension`` (an earlier prompt is a strict prefix) or
    ``sibling`` (shares a prefix with an earlier prompt, neither of the two)."""
    seen: list[list[int]] = []
    kinds = []
    for request in case.trace:
        tokens = prompt_tokens(request)
        kind = "fresh"
        for earlier in seen:
            if earlier == tokens:
                kind = "resend"
                break
            if len(earlier) < len(tokens) and tokens[: len(earlier)] == earlier:
                kind = "extension"
            elif kind == "fresh" and earlier[:1] == tokens[:1]:
                kind = "sibling"
        kinds.append(kind)
        seen.append(tokens)
    return kinds


def promised(case: Case) -> list[int]:
    return [i for i, k in enumerate(request_kinds(case)) if k in ("resend", "extension")]


def _diff(expected: list, observed: list, only: list[int] | None = None) -> list[int]:
    idx = range(len(expected)) if only is None else only
    return [i for i in idx if i >= len(observed) or expected[i] != observed[i]]


def check_engine_error(case: Case, version: str, obs: dict) -> list[Divergence]:
    if "error" not in obs:
        return []
    err = obs["error"]
    return [Divergence("engine_error", version, [int(err.get("request", 0) or 0)], [], [], f"{err.get('type', 'Error')}: {err.get('message', '')}".strip(), {"traceback": err.get("traceback", "")})]


def check_resolution(case: Case, version: str, obs: dict) -> list[Divergence]:
    """The engine's ``resolution`` of a deployment case against what vLLM
    documents of the deployment's flags (see the module docstring):
    ``prefix_match_unit`` set -> ``hash_block_size`` equals it, and the hash
    block divides every group's block size. Run on the observation before
    :func:`resolved` (a geometry breaking it may not parse); a hand case or
    an observation without a resolution is not judged. The divergence
    carries the hits unchanged; ``context``: ``rule`` (for the signature),
    ``resolution``."""
    r = obs.get("resolution") if case.deployment is not None and "error" not in obs else None
    g = (r or {}).get("geometry") or {}
    unit, hashed = g.get("prefix_match_unit"), g.get("hash_block_size")
    if hashed is None:
        return []
    hits = list(obs.get("hits") or [])
    quote = "vLLM's CacheConfig.prefix_match_unit: "
    if unit is not None and int(unit) != int(hashed):
        return [Divergence("resolution", version, [], hits, list(hits),
                           f"the deployment sets --prefix-match-unit {unit} and vLLM resolved hash_block_size={hashed} ({quote}"
                           f"\"This equals to the hash_block_size used throughout the KV cache code\"): hits land on {hashed}-token boundaries, not {unit}",
                           {"rule": "prefix_match_unit", "resolution": {"prefix_match_unit": int(unit), "hash_block_size": int(hashed)}})]
    blocks = sorted({int(x["block_size"]) for x in g.get("groups") or [] if int(x.get("block_size") or 0) % int(hashed)})
    if blocks:
        return [Divergence("resolution", version, [], hits, list(hits),
                           f"vLLM resolved hash_block_size={hashed}, which does not divide the block size(s) {blocks} of its KV cache groups ({quote}"
                           f"\"as long as every KV cache group's block_size is divisible by it\"; vLLM rejects such a unit): a hash key then spans a block boundary",
                           {"rule": "hash_divides_blocks", "resolution": {"prefix_match_unit": unit, "hash_block_size": int(hashed), "blocks": blocks}})]
    return []


def check_knobs(case: Case, version: str, obs: dict) -> list[Divergence]:
    model = resolve_knobs(case, version).as_dict()
    engine = (obs.get("knobs") or {})
    wrong = [k for k in COMPARED_KNOBS if k in engine and engine[k] != model[k]]
    if not wrong:
        return []
    return [Divergence("knobs", version, [], [model[k] for k in wrong], [engine[k] for k in wrong], "knobs differ: " + ", ".join(f"{k} model={model[k]} engine={engine[k]}" for k in wrong))]


def _written(e: dict) -> list[int] | None:
    """The positions a request's prefill wrote Mamba states at: the
    engine's ``written`` when it observed them, else its chunk ends (an
    observation from before ``written``); None when neither is known."""
    w = e.get("written")
    if w is not None:
        return w
    return None if "written" in e else e.get("chunk_ends")


def writes_before(case: Case, obs: dict, i: int) -> list[tuple[int, set[int]]]:
    """``(j, positions)``: the Mamba states request ``j``'s prefill wrote
    (:func:`_written`) before request ``i`` first ran. In a serial trace,
    every state of every earlier request. In a concurrent one (the engine's
    ``written_steps`` and ``first_step``), the states any other request
    computed in a scheduler step before the one that first scheduled ``i``:
    a state whose forward pass runs in the same step as the request that
    resumes from it is not there yet when that request reads it."""
    explain = obs.get("explain") or []
    if i >= len(explain) or "first_step" not in explain[i]:
        return [(j, set(_written(explain[j]) or ())) for j in range(min(i, len(explain)))]
    first = explain[i].get("first_step")
    out = []
    for j, e in enumerate(explain):
        steps = e.get("written_steps")
        if j == i or first is None:
            continue
        if steps is None:  # writes not observed: only a request that finished before i ran
            if j < i and e.get("first_step") is not None and e["first_step"] + e.get("steps", 0) <= first:
                out.append((j, set(_written(e) or ())))
            continue
        out.append((j, {int(p) for p, s in steps if s is not None and s < first}))
    return out


def written_before(case: Case, obs: dict, i: int, pos: int) -> bool:
    """Did a prefill before request ``i`` write a Mamba state at ``pos``
    over the same first ``pos`` tokens (:func:`writes_before`)? Then
    resuming at ``pos`` is reuse the promise may not require, not a stale
    state."""
    if pos <= 0:
        return True
    mine = prompt_tokens(case.trace[i])[:pos]
    return any(pos in ps and prompt_tokens(case.trace[j])[:pos] == mine for j, ps in writes_before(case, obs, i))


def stale_keys(case: Case, obs: dict) -> list[list[int]]:
    """Per request ``j``: the prompt positions whose Mamba state the cache
    holds once ``j`` finished (:func:`held_states`) that ``j``'s prefill did
    not write (``written``) and that no earlier request over the same tokens
    left held: a state ``j`` keyed without computing it. Empty where the
    engine observed neither writes nor holds. (A position an earlier prefill
    wrote but did not keep is no excuse: its block went back to the pool.)"""
    explain = obs.get("explain") or []
    prompts = [prompt_tokens(r) for r in case.trace]
    held = [held_states(e) for e in explain]
    # In a concurrent trace the cache is read once the whole wave finished:
    # a state another request of the wave wrote over the same tokens is
    # that request's, and a request before the wave left held what it held.
    wave_of = {i: w for w in waves(case) for i in w}
    out: list[list[int]] = []
    for j, e in enumerate(explain):
        w = e.get("written")
        if w is None or held[j] is None or j >= len(prompts):
            out.append([])
            continue
        mine = prompts[j]
        wave = wave_of.get(j, [j])
        mates = [k for k in wave if k != j and k < len(explain)]
        out.append(sorted(p for p in held[j] if p <= len(mine) and p not in w
                          and not any(held[k] is not None and p in held[k] and prompts[k][:p] == mine[:p] for k in range(min(wave[0], j)))
                          and not any(p in (explain[k].get("written") or ()) and prompts[k][:p] == mine[:p] for k in mates)))
    return out


#: What a ``stale`` divergence says of a request that read a state in the
#: step computing it (``fuzz.known_classes`` tells that class apart by it).
SAME_STEP_READ = "read in the same step or before it was computed"


def check_stale(case: Case, version: str, obs: dict) -> list[Divergence]:
    """No request resumes where no earlier prefill wrote a Mamba state over
    its tokens, and no request leaves a state held that its prefill did not
    write (:func:`stale_keys`; the later hit on it looks like reuse of an
    earlier write); judged only where the writes were observed. Expected
    hits: the highest written position at or below a stale hit."""
    explain = obs.get("explain") or []
    hits = obs.get("hits") or []
    bad, expected = [], list(hits)
    concurrent = is_concurrent(case)
    same_step: dict[int, tuple[int, int]] = {}  # request -> (the request that computed its state, that step)
    for i, h in enumerate(hits):
        if h <= 0 or i > len(explain) or any(explain[j].get("written") is None for j in (range(len(explain)) if concurrent else range(i))):
            continue
        if written_before(case, obs, i, h):
            continue
        bad.append(i)
        mine = prompt_tokens(case.trace[i])
        below = [p for j, ps in writes_before(case, obs, i) for p in ps if p <= h and prompt_tokens(case.trace[j])[:p] == mine[:p]]
        expected[i] = max(below, default=0)
        if concurrent:  # another request did compute it, in the step that first ran i or later: read too early
            late = [(j, s) for j, e in enumerate(explain) if j != i and prompt_tokens(case.trace[j])[:h] == mine[:h]
                    for p, s in (e.get("written_steps") or ()) if p == h and s is not None]
            if late:
                same_step[i] = min(late, key=lambda x: x[1])
    keyed = stale_keys(case, obs)
    keyed_bad = [j for j, ps in enumerate(keyed) if ps]
    if not bad and not keyed_bad:
        return []
    notes = []
    if bad:
        i = bad[0]
        if i in same_step:
            j, step = same_step[i]
            notes.append(f"request {i} resumed at {hits[i]} in step {explain[i]['first_step']}, the first that ran it, from the state request {j} computes "
                         f"in step {step}: {SAME_STEP_READ} (the highest written before is {expected[i]})")
        else:
            notes.append(f"request {i} resumed at {hits[i]}, where no earlier prefill wrote a Mamba state over its tokens (the highest written is {expected[i]})")
    if keyed_bad:
        j = keyed_bad[0]
        notes.append(f"request {j} left Mamba states at {keyed[j]} held that its prefill did not write (written {explain[j].get('written')}) and no earlier request held")
    order = sorted(set(bad) | set(keyed_bad))
    context: dict = {"stale_keys": keyed} if keyed_bad else {}
    if same_step and bad and bad[0] == order[0] and bad[0] in same_step:
        context["same_step"] = True  # the first divergence reads a state in the step that computes it
    return [Divergence("stale", version, order, expected, hits, "; ".join(notes if not keyed_bad or (bad and bad[0] <= keyed_bad[0]) else notes[::-1]),
                       context)]


def held_states(e: dict) -> set[int] | None:
    """The Mamba states (token counts) an explain record says the cache
    holds on a request's prompt once it finished, over every Mamba group
    (``retained_mamba_tokens`` where a state is not a whole block, else
    ``retained_mamba_blocks``); None where they were not observed."""
    tokens = e.get("retained_mamba_tokens")
    if tokens:
        return {int(p) for ps in tokens.values() for p in ps}
    blocks = e.get("retained_mamba_blocks")
    if blocks is None:
        return None
    return {(int(b) + 1) * int(size) for size, bs in blocks.items() for b in bs}


def check_retention(case: Case, version: str, obs: dict) -> list[Divergence]:
    """Sparse and periodic retention keep what they say (see the module
    note). Allowed for request ``i``: over the same tokens as its prompt,
    a state some request ``j <= i`` may leave behind: one a later request
    can resume at (:func:`reference.boundaries.resumable_states` of ``j``'s
    prompt, with the knobs ``version`` resolves), one the reference model
    keeps for ``j`` under the promise or the release's rule, the states a
    sibling resumes at for the junction the engine observed for ``j``
    (:func:`reference.boundaries.junction_states`: the junction, its floor
    to the Mamba block, and with speculative decoding the floor one block
    lower), ``j``'s hit, and under periodic
    retention every segment end. Inside ``i``'s output (the engine's
    ``retained_output_states``, past its prompt) no state under sparse
    retention (vLLM 0.30.0-0.33.0, ``prefix_cache_retention_interval``: 0
    "retains only semantic checkpoints, including the latest replay
    boundary and shared-prefix junctions", all of them prompt positions),
    only segment ends under periodic retention. Required (periodic): every
    position ``i``'s own prefill wrote (``written``) on the segment grid
    within its hashed tokens. Judged where the engine observed what the
    cache holds. The divergence carries the hits unchanged; the states are
    its ``context`` (``expected_states`` / ``observed_states``, output
    states included; ``output_states``: the output states judged extra)."""
    g = case.geometry
    if g is None or g.retention_interval is None:
        return []
    explain = obs.get("explain") or []
    hits = obs.get("hits") or []
    if not explain or any(held_states(e) is None for e in explain):
        return []
    knobs = resolve_knobs(case, version)
    interval, L, H, S, U = g.retention_interval, knobs.hash_lookahead_tokens, g.hash_block_size, g.scheduler_block_size, knobs.alignment
    Ms = sorted(set(g.mamba_block_sizes))
    step = None if not interval else max(interval, min(Ms))
    models = [predict_with_knobs(case, knobs, rule)["explain"] for rule in dict.fromkeys(("promise", implemented_rule(version)))]
    prompts = [prompt_tokens(r) for r in case.trace]
    own: list[set[int]] = []
    for j, e in enumerate(explain):
        mine = set().union(*(resumable_states(len(prompts[j]), S, U, H, M, knobs.eagle_drop, L) for M in Ms))
        for m in models:
            if j < len(m):
                mine |= held_states(m[j]) or set()
        mine.update(p for M in Ms for p in junction_states(int(e.get("junction") or 0), U, M, has_speculative(case)))
        if j < len(hits) and hits[j]:
            mine.add(int(hits[j]))
        own.append(mine)
    bad, expected, observed, outputs, notes = [], [], [], [], []
    for i, e in enumerate(explain):
        held = held_states(e)
        tokens = prompts[i]
        allowed = {p for j in range(i + 1) for p in own[j] if prompts[j][:p] == tokens[:p]}
        extra = sorted(p for p in held - allowed if not (step and p % step == 0))
        output = [int(p) for p in e.get("retained_output_states") or []]
        inside = [p for p in output if not (step and p % step == 0)]
        missing: list[int] = []
        if step and e.get("written") is not None:
            hashed = max(len(tokens) - L, 0) // H * H
            missing = sorted(p for p in e["written"] if 0 < p <= hashed and p % step == 0 and p not in held)
        expected.append(sorted((held - set(extra)) | set(missing) | (set(output) - set(inside))))
        observed.append(sorted(held | set(output)))
        outputs.append(inside)
        if extra or missing or inside:
            bad.append(i)
            faults = ([f"keeps {extra}, where no later request can resume"] if extra else []) + (
                [f"keeps {inside} inside its {len(tokens)}-token prompt's output, no semantic checkpoint"] if inside else []) + (
                [f"drops the segment ends {missing} its prefill wrote"] if missing else [])
            notes.append(f"request {i} " + " and ".join(faults))
    if not bad:
        return []
    mode = "sparse" if interval == 0 else f"periodic (interval {interval})"
    return [Divergence("retention", version, bad, list(hits), list(hits), f"{mode} retention: " + "; ".join(notes[:3]),
                       {"expected_states": expected, "observed_states": observed, "output_states": outputs})]


def _same_hits(oracle: str, version: str, hits: list, context: dict[str, list], detail: Callable[[int], str]) -> list[Divergence]:
    """The divergence of an oracle that judges something other than the
    hits (which it carries unchanged): the requests with a non-empty entry
    in any of the per-request lists of ``context`` (the divergence's
    context), ``detail`` of the first."""
    bad = [i for i, xs in enumerate(zip(*context.values())) if any(xs)]
    if not bad:
        return []
    return [Divergence(oracle, version, bad, list(hits), list(hits), detail(bad[0]), context)]


def _budget(g, knobs: dict) -> int:
    """The chunk budget the engine resolved, else the geometry's."""
    return int(knobs.get("max_num_scheduled_tokens") or g.max_num_batched_tokens or 0)


def _prefill_chunks(case: Case, obs: dict) -> list[tuple[int, int, list[tuple[int, int]]]]:
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


def check_split(case: Case, version: str, obs: dict) -> list[Divergence]:
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
    stray = [[end for start, end in spans if end < N and not (end % H == 0 or (g.split_block_size and end % g.split_block_size == 0)
                                                             or end == junction or end - start == budget or end >= N - lookahead)]
             for N, junction, spans in _prefill_chunks(case, obs)]
    cut = [_cut_steps(e.get("decode_steps") or [], budget, int(knobs.get("max_model_len") or 0)) for e in explain]

    def detail(i: int) -> str:
        if stray[i]:
            return f"request {i}'s prefill chunk ends at {stray[i][0]} of {explain[i].get('prompt_tokens')} (chunk ends {explain[i].get('chunk_ends')}): off the hash grid {H}, not the junction, not the budget {budget}"
        start, asked, scheduled = cut[i][0]
        return (f"request {i}'s step after its {explain[i].get('prompt_tokens')}-token prefill, from {start}, schedules {scheduled} of the {asked} tokens it asked for "
                f"(the sampled token and {asked - 1} draft{'' if asked == 2 else 's'}): cut at {start + scheduled}, by neither the budget {budget} nor max_model_len")
    return _same_hits("split", version, hits, {"stray_ends": stray, "cut_steps": cut}, detail)


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


def check_checkpoint(case: Case, version: str, obs: dict) -> list[Divergence]:
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
    splits = [[end for start, end in spans if end < N and start % B == 0 and N - start <= budget and not start < junction < N
               and internal_checkpoint_valid(start, N, mamba_checkpoint_position(N, unit, drop, L), H, B, g.prefill_checkpoint_grid)]
              for N, junction, spans in _prefill_chunks(case, obs)]
    return _same_hits("checkpoint", version, hits, {"needless_splits": splits}, lambda i: (
        f"request {i}'s last chunk is split at {splits[i][0]} of {explain[i].get('prompt_tokens')} (chunk ends {explain[i].get('chunk_ends')}), though the kernel can export its checkpoint from inside the chunk (grid {g.prefill_checkpoint_grid})"))


def check_hit_blocks(case: Case, version: str, obs: dict) -> list[Divergence]:
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
    return _same_hits("hit_blocks", version, obs.get("hits") or [], {"extra_blocks": extra}, lambda i: (
        f"request {i} resumed at {explain[i].get('scheduler_hit')} but took full-attention blocks {explain[i].get('attention_blocks')} ([block size, blocks]): "
        + (f"{extra[i]} beyond its hit" if extra[i] > 0 else f"{-extra[i]} fewer than its hit covers (its skipped tokens have no keys and values)")))


def check_shared_prefix(case: Case, version: str, obs: dict) -> list[Divergence]:
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
    for i, e in enumerate(explain[:len(prompts)]):
        junction, hit = e.get("junction"), e.get("scheduler_hit")
        if not junction or hit is None:
            bad.append([])
            continue
        tokens = prompts[i]
        reach = max((_reach(case.trace[i], tokens, case.trace[j], prompts[j]) for j in range(i)), default=0)
        reach = min(reach, len(tokens) - 1)
        bad.append([int(junction), int(hit), reach] if not int(hit) < int(junction) <= reach else [])
    return _same_hits("shared_prefix", version, obs.get("hits") or [], {"bad_junctions": bad}, lambda i: (
        f"request {i} of {len(prompts[i])} tokens reports the junction {bad[i][0]} (vLLM's shared_prefix_boundary) with its hit at {bad[i][1]}: "
        + (f"past the {bad[i][2]} tokens full attention can have cached for it (its longest common prefix with an earlier request, below its length)"
           if bad[i][0] > bad[i][2] else "not above its hit")))


def check_block_table(case: Case, version: str, obs: dict) -> list[Divergence]:
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
        what = " and ".join(([f"{freed} block(s) it had freed"] if freed else []) + ([f"{unretired} block(s) below the state it resumes from that nothing can hit"] if unretired else []))
        more = f", and so after {len(table[i]) - 1} more step(s)" if len(table[i]) > 1 else ""
        left = f"; {leaked[i]} more block reference(s) held once it finished" if leaked[i] else ""
        return f"request {i}'s Mamba block table held {what} once the step starting at {start} tokens was scheduled{more}{left}"

    return _same_hits("block_table", version, obs.get("hits") or [], {"block_table": table, "leaked_blocks": leaked}, detail)


def _reach(request: Request, tokens: list[int], earlier: Request, earlier_tokens: list[int]) -> int:
    """How far an earlier request's cached tokens can match ``request``'s
    (``tokens``): their common prefix (compared past the segments they share
    by construction, as the reference model does), plus the earlier
    request's outputs (at most its ``max_tokens``, whatever was sampled)
    where ``tokens`` runs through its whole prompt."""
    shared = common_prefix(tokens, earlier_tokens, known_common(earlier.prompt, request.prompt))
    return shared + earlier.max_tokens if shared == len(earlier_tokens) else shared


def check_promise(case: Case, version: str, obs: dict) -> list[Divergence]:
    """Promised requests hit what the promise predicts. Below it is lost
    reuse; above it is a stale state unless a prefill wrote a state there
    (:func:`written_before`: vLLM may keep more states than the promise
    requires, e.g. the block-floored replay boundary beside the
    hash-unit one; that costs memory, not correctness)."""
    expected = predict_with_knobs(case, resolve_knobs(case, version), "promise")
    bad = [i for i in _diff(expected["hits"], obs["hits"], promised(case))
           if i >= len(obs["hits"]) or obs["hits"][i] < expected["hits"][i] or not written_before(case, obs, i, obs["hits"][i])]
    if not bad:
        return []
    return [Divergence("promise", version, bad, expected["hits"], obs["hits"], context={"model_explain": expected["explain"]})]


def check_reference(case: Case, version: str, obs: dict) -> list[Divergence]:
    rule = implemented_rule(version)
    expected = predict_with_knobs(case, resolve_knobs(case, version), rule)
    bad = _diff(expected["hits"], obs["hits"])
    if not bad:
        return []
    return [Divergence("reference", version, bad, expected["hits"], obs["hits"], f"rule={rule}", {"model_explain": expected["explain"]})]


def resolved(case: Case, obs: dict, version: str) -> Case:
    """The case the model judges: a deployment case with the geometry the
    engine resolved for it (the observation's ``resolution``); a hand case
    as it is."""
    if case.deployment is None or obs.get("resolution") is None:
        return case
    r = obs["resolution"]
    return with_resolution(case, r["geometry"], r["speculative"], f"vllm=={version}")


def check_sparse_dense(case: Case, version: str, obs: dict, run: Run) -> list[Divergence]:
    if case.geometry is None or case.geometry.retention_interval != 0:
        return []
    promise = predict_with_knobs(case, resolve_knobs(case, version), "promise")["hits"]
    if all(i < len(obs["hits"]) and obs["hits"][i] >= promise[i] for i in promised(case)):
        return []  # it fires only below the promise: the dense run could not change the verdict
    dense_case = with_retention(case, None)
    dense = run(dense_case)
    if "error" in dense:
        return check_engine_error(dense_case, version, dense)
    bad = [i for i in promised(case) if i >= len(obs["hits"]) or (i < len(dense["hits"]) and obs["hits"][i] < min(dense["hits"][i], promise[i]))]
    if not bad:
        return []
    return [Divergence("sparse_dense", version, bad, dense["hits"], obs["hits"], "expected = the same engine under dense retention")]


def check_spec_on_off(case: Case, version: str, obs: dict, run: Run) -> list[Divergence]:
    if not has_speculative(case):
        return []
    kinds = request_kinds(case)
    first = next((i for i, k in enumerate(kinds) if k == "resend"), None)
    if first is None:
        return []
    model_on = predict_with_knobs(case, resolve_knobs(case, version), "promise")["hits"][first]
    if first < len(obs["hits"]) and obs["hits"][first] == model_on:
        return []  # it fires only where the spec-off run keeps the promise, i.e. moved = model_off - model_on here
    off_case = without_speculative(case)
    try:
        off = run(off_case)
    except DeploymentRejected:  # vLLM refuses the deployment without speculation (a retention interval that is no multiple of its block): nothing to compare
        return []
    if "error" in off:
        return check_engine_error(off_case, version, off)
    off_case = resolved(off_case, off, version)
    if case.deployment is not None and off_case.geometry is not None and case.geometry is not None and off_case.geometry.scheduler_block_size != case.geometry.scheduler_block_size:
        return []  # the speculative tokens moved the block size: hits are not comparable
    model_off = predict_with_knobs(off_case, resolve_knobs(off_case, version), "promise")["hits"][first]
    if off["hits"][first] != model_off:
        return []  # the baseline itself is off the promise: that is the promise oracle's finding, on the spec-off case
    moved = off["hits"][first] - obs["hits"][first]
    if moved == model_off - model_on:
        return []
    expected = list(obs["hits"])
    expected[first] = off["hits"][first] - (model_off - model_on)
    return [Divergence("spec_on_off", version, [first], expected, obs["hits"], f"spec off hits {off['hits'][first]}; the EAGLE drop moves it by {model_off - model_on}, engine moved it by {moved}")]


def check_versions(case: Case, version: str, obs: dict, other_version: str, other: dict) -> list[Divergence]:
    if "error" in other or "error" in obs:
        return []
    if comparable_resolutions(obs, other) is False:
        return []  # the versions built different geometries: hits differ by construction
    bad = _diff(other["hits"], obs["hits"])
    if not bad:
        return []
    return [Divergence("versions", version, bad, other["hits"], obs["hits"], f"expected = vllm=={other_version}", {"other_version": other_version})]


def comparable_resolutions(a: dict, b: dict) -> bool | None:
    """Did two engines resolve a deployment to the same geometry and
    speculative settings? None for hand cases (nothing resolved)."""
    ra, rb = a.get("resolution"), b.get("resolution")
    if ra is None or rb is None:
        return None
    return ra.get("geometry") == rb.get("geometry") and ra.get("speculative") == rb.get("speculative")


def check_junction(case: Case, version: str, obs: dict, run: Run) -> list[Divergence]:
    """Under sparse retention, a sibling (a prompt that shares a prefix with
    an earlier one and diverges inside it) hits at least what the promise
    predicts for it (its divergence point once an earlier request observed
    that junction), capped by what the same engine hits under dense
    retention (a state no prefill wrote is promised by no retention rule)."""
    if case.geometry is None or case.geometry.retention_interval != 0:
        return []
    siblings = [i for i, k in enumerate(request_kinds(case)) if k == "sibling"]
    if not siblings:
        return []
    promise = predict_with_knobs(case, resolve_knobs(case, version), "promise")
    dense_case = with_retention(case, None)
    dense = run(dense_case)
    if "error" in dense:
        return check_engine_error(dense_case, version, dense)
    expected = list(obs["hits"])
    bad = []
    for i in siblings:
        if i < len(obs["hits"]) and i < len(dense["hits"]):
            floor = min(promise["hits"][i], dense["hits"][i])
            if obs["hits"][i] < floor:
                expected[i] = floor
                bad.append(i)
    if not bad:
        return []
    return [Divergence("junction", version, bad, expected, obs["hits"], "expected = the promise at a junction, capped by the same engine under dense retention", {"model_explain": promise["explain"]})]


def _memo(run: Run) -> Run:
    """``run`` that runs each variant once (variants are compared by value)."""
    seen: dict = {}

    def once(variant: Case) -> dict:
        key = repr(variant)
        if key not in seen:
            seen[key] = run(variant)
        return seen[key]

    return once


def oracles_for(version: str, oracles: tuple[str, ...] = ORACLES) -> tuple[str, ...]:
    """The oracles that judge engine ``version``: all of ``oracles`` for a
    release, :data:`BUILD_ORACLES` among them for a build (``X+LABEL.HASH``)."""
    if "+" not in version:
        return oracles
    return tuple(o for o in oracles if o in BUILD_ORACLES)


#: The oracles whose rules hold for every request of a concurrent trace
#: (requests that share scheduler steps): a state is read only after the
#: step that computes it, a block table holds no freed block, every block is
#: given back, the knobs. The others state rules of a serial trace.
CONCURRENT_ORACLES = ("knobs", "stale", "block_table", "engine_error", "versions", "resolution")

#: The oracles that read one observation and nothing else, in the order
#: :func:`check_all` runs them.
SINGLE_RUN_CHECKS = (("knobs", check_knobs), ("promise", check_promise), ("stale", check_stale), ("retention", check_retention),
                     ("split", check_split), ("checkpoint", check_checkpoint), ("hit_blocks", check_hit_blocks),
                     ("shared_prefix", check_shared_prefix), ("block_table", check_block_table), ("reference", check_reference))


def serial_part(case: Case, obs: dict) -> tuple[Case, dict] | None:
    """A concurrent trace's serial prefix (:func:`reference.case.serial_prefix`)
    as a serial case of its own, with the observation of those requests
    (they ran alone, as they would in that case); None when there is none."""
    k = serial_prefix(case)
    if k == 0:
        return None
    part = dict(obs)
    for key in ("hits", "queries", "explain"):
        if isinstance(obs.get(key), list):
            part[key] = obs[key][:k]
    return replace(case, trace=case.trace[:k]), part


def check_all(case: Case, version: str, obs: dict, run: Run | None = None, oracles: tuple[str, ...] = ORACLES) -> list[Divergence]:
    """Every single-engine oracle, in a fixed order; engine errors end it.
    On a concurrent trace, the oracles of :data:`CONCURRENT_ORACLES` judge
    every request; the others judge only its serial prefix
    (:func:`serial_part`), where their rules were stated."""
    if "error" in obs:
        return check_engine_error(case, version, obs) if "engine_error" in oracles else []
    if not is_concurrent(case):
        return _check(case, version, obs, run, oracles)
    out = _check(case, version, obs, None, tuple(o for o in oracles if o in CONCURRENT_ORACLES))
    serial = serial_part(case, obs)
    rest = tuple(o for o in oracles if o not in CONCURRENT_ORACLES)
    if serial is not None and rest:
        out += _check(serial[0], version, serial[1], run, rest)
    return out


def _check(case: Case, version: str, obs: dict, run: Run | None, oracles: tuple[str, ...]) -> list[Divergence]:
    out: list[Divergence] = []
    for name, check in SINGLE_RUN_CHECKS:
        if name in oracles:
            out += check(case, version, obs)
    if run is not None and "sparse_dense" in oracles and "junction" in oracles:
        run = _memo(run)  # one dense run for both
    if run is not None and "sparse_dense" in oracles:
        out += check_sparse_dense(case, version, obs, run)
    if run is not None and "junction" in oracles:
        out += check_junction(case, version, obs, run)
    if run is not None and "spec_on_off" in oracles:
        out += check_spec_on_off(case, version, obs, run)
    return out
