"""The oracles of the Mamba states a request resumes from and leaves held:
a state is read only where a prefill wrote it over the same tokens, and
retention keeps only what it says.

* ``stale``: every hit resumes from a Mamba state an earlier prefill or
  decode step wrote at that position over the same tokens (the engine's
  ``written``: its chunk ends and the internal checkpoints vLLM's
  worker-side code places; inside an output, where a decode step ended
  and the block boundary a speculative step crossed: :func:`decode_writes`,
  which a later prompt quoting that output, the chat shape, resumes at
  under dense or periodic retention).
  Any other hit serves a state that belongs elsewhere. Also: no request
  leaves a state held at a prompt position its prefill did not write and
  no earlier request held (it keyed a state it never computed), unless a
  KV connector loaded it there from an earlier request's write. Not judged
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

On a concurrent trace ``stale`` judges by steps (an "earlier" write is one
computed in a step before the first step that ran the request: a state
whose forward pass runs in the same step is not there yet).
"""

from __future__ import annotations

from engine_adapter.interface import Observation
from fuzz.judge.oracle_base import Divergence
from ground.engines import EngineSpec
from reference.boundaries import junction_states, resumable_states, retention_period
from reference.case import Case, is_concurrent, prompt_tokens, sequence_tokens, waves
from reference.knobs import implemented_rule, resolve_knobs
from reference.predict import predict_with_knobs
from reference.variants import has_speculative


def _written(e: dict) -> list[int] | None:
    """The positions a request's prefill wrote Mamba states at: the
    engine's ``written`` when it observed them, else its chunk ends (an
    observation from before ``written``); None when neither is known."""
    w = e.get("written")
    if w is not None:
        return w
    return None if "written" in e else e.get("chunk_ends")


def decode_writes(e: dict, sizes: tuple[int, ...] = ()) -> set[int]:
    """The positions past a request's prompt where its decode steps left its
    Mamba state (over its prompt and its first outputs): where each step
    after the prefill started (``decode_steps``), and where the last one
    ended (``computed_tokens``, when the engine reported it). vLLM 0.33.0
    caches the state blocks among them that lie on the block grid, as it
    does a prompt's (``reference.serial.output_states``).

    Also, per Mamba block size M in ``sizes``, every multiple b of M past
    the prompt, up to ``computed_tokens``: a step from s computes the states
    after s+1 .. e tokens (e: s plus the tokens it kept; every step keeps at
    least one, so the steps' ranges cover every position to the end), and
    where its drafts let it cross b without ending there
    ``postprocess_mamba_fused_kernel`` (vLLM 0.33.0
    v1/worker/mamba_utils.py:444-470) copies the state at ``e // M * M``
    into column ``b // M - 1`` when it is at or past
    ``num_tokens_running_state`` (s + 1: the step's tokens less its
    drafts). That state is over exactly the first b tokens, so a later
    prompt quoting the output may resume at b. This holds where a step's
    range holds at most one multiple of M (M at least the most tokens a
    step schedules, ``decode_steps``' third field; the kernel copies only
    the highest); it needs no step's own end, which under async scheduling
    ``decode_steps`` does not give (a step is scheduled at the count that
    takes the step in flight as all accepted; vLLM 0.33.0
    scheduler.py:2356-2365 rolls it back later). Where M is smaller, only
    the crossing the recorded starts show (the next start, or
    ``computed_tokens`` for the last step, taken as the step's end)."""
    n = int(e.get("prompt_tokens") or 0)
    steps = [(int(d[0]), int(d[2]) if len(d) > 2 else 1) for d in e.get("decode_steps") or ()]
    out = {s for s, _ in steps if s > n}
    c = e.get("computed_tokens")
    if c is not None and int(c) > n:
        out.add(int(c))
    if not steps:
        return out
    widest = max(k for _, k in steps)
    top = int(c) if c is not None else max(s for s, _ in steps)
    ends = [s for s, _ in steps[1:]] + ([int(c)] if c is not None else [])
    for M in sizes:
        if M <= 0:
            continue
        if M >= widest:
            out.update(range((n // M + 1) * M, top + 1, M))
            continue
        for (s, _), end in zip(steps, ends):
            b = end // M * M
            if b > n and s + 1 <= b <= end:
                out.add(b)
    return out


def writes_before(case: Case, obs: Observation, i: int) -> list[tuple[int, set[int]]]:
    """``(j, positions)``: the Mamba states request ``j``'s prefill wrote
    (:func:`_written`) before request ``i`` first ran. In a serial trace,
    every state of every earlier request. In a concurrent one (the engine's
    ``written_steps`` and ``first_step``), the states any other request
    computed in a scheduler step before the one that first scheduled ``i``:
    a state whose forward pass runs in the same step as the request that
    resumes from it is not there yet when that request reads it."""
    explain = obs.get("explain") or []
    sizes = tuple(dict.fromkeys(case.geometry.mamba_block_sizes)) if case.geometry is not None else ()
    if i >= len(explain) or "first_step" not in explain[i]:
        return [
            (j, set(_written(explain[j]) or ()) | decode_writes(explain[j], sizes)) for j in range(min(i, len(explain)))
        ]
    first = explain[i].get("first_step")
    wave_of = {k: w for w, members in enumerate(waves(case)) for k in members}
    out = []
    for j, e in enumerate(explain):
        steps = e.get("written_steps")
        if j == i or first is None:
            continue
        finished = j < i and (
            wave_of.get(j, -1) < wave_of.get(i, -1) or _ended_by_step(e, first)
        )  # an earlier wave ended before i's was sent, whatever its step count says
        if steps is None:  # writes not observed: only a request that finished before i ran
            if finished:
                out.append((j, set(_written(e) or ()) | decode_writes(e, sizes)))
            continue
        out.append(
            (
                j,
                {int(p) for p, s in steps if s is not None and s < first}
                | (decode_writes(e, sizes) if finished else set()),
            )
        )
    return out


def _ended_by_step(e: dict, first: int) -> bool:
    """Whether a request of ``i``'s own wave ran its last step before the
    step ``first`` that first ran ``i``, by its step count. (A request of an
    earlier wave ended before ``i``'s wave was sent: ``reference.case.waves``;
    its count may run past that, since under async scheduling it includes
    the steps the loop takes while its last one is in flight.)"""
    return e.get("first_step") is not None and e["first_step"] + e.get("steps", 0) <= first


def written_before(
    case: Case, obs: Observation, i: int, pos: int, writes: list[tuple[int, set[int]]] | None = None
) -> bool:
    """Did a prefill before request ``i`` write a Mamba state at ``pos``
    over the same first ``pos`` tokens (:func:`writes_before`, or
    ``writes`` where the caller holds them already)? Then resuming at
    ``pos`` is reuse the promise may not require, not a stale state."""
    if pos <= 0:
        return True
    mine = prompt_tokens(case.trace[i])[:pos]
    writes = writes_before(case, obs, i) if writes is None else writes
    return any(pos in ps and sequence_tokens(case.trace[j])[:pos] == mine for j, ps in writes)


def stale_keys(case: Case, obs: Observation) -> list[list[int]]:
    """Per request ``j``: the prompt positions whose Mamba state the cache
    holds once ``j`` finished (:func:`held_states`) that ``j``'s prefill did
    not write (``written``) and that no earlier request over the same tokens
    left held: a state ``j`` keyed without computing it. Empty where the
    engine observed neither writes nor holds. (A position an earlier prefill
    wrote but did not keep is no excuse: its block went back to the pool.)

    Except what a KV connector loaded for ``j`` (``external_hit``: the last
    tokens of its hit): a state there that an earlier request wrote over the
    same tokens (:func:`written_before`) is that write brought back, not one
    ``j`` keyed without computing: the offloading connector stores each
    block a request computes and loads the hit's blocks into ``j``'s fresh
    blocks (vLLM 0.33.0 ``allocate_new_computed_blocks`` with
    ``num_external_computed_tokens``, v1/core/kv_cache_manager.py:590-600),
    which ``j`` then caches as its own. Whether the load carries that state
    is ``resumed_state``'s question, where the stand-in observes it."""
    explain = obs.get("explain") or []
    hits = obs.get("hits") or []
    prompts = [prompt_tokens(r) for r in case.trace]
    seqs = [sequence_tokens(r) for r in case.trace]  # an earlier request's output states are over its sequence
    held = [held_states(e) for e in explain]
    held_all = [
        None if h is None else h | {int(p) for p in e.get("retained_output_states") or ()}
        for h, e in zip(held, explain)
    ]
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
        ext, h = int(e.get("external_hit") or 0), int(hits[j]) if j < len(hits) else 0
        before = writes_before(case, obs, j) if ext > 0 else []
        loaded = {p for p in held[j] if h - ext < p <= h and written_before(case, obs, j, p, before)}
        wave = wave_of.get(j, [j])
        mates = [k for k in wave if k != j and k < len(explain)]
        out.append(
            sorted(
                p
                for p in held[j]
                if p <= len(mine)
                and p not in w
                and p not in loaded
                and not any(
                    held_all[k] is not None and p in held_all[k] and seqs[k][:p] == mine[:p]
                    for k in range(min(wave[0], j))
                )
                and not any(p in (explain[k].get("written") or ()) and prompts[k][:p] == mine[:p] for k in mates)
            )
        )
    return out


#: What a ``stale`` divergence says of a request that read a state in the
#: step computing it (``fuzz.results.known_classes`` tells that class apart by it).
SAME_STEP_READ = "read in the same step or before it was computed"


def check_resumed_state(case: Case, version: EngineSpec | str, obs: Observation) -> list[Divergence]:
    """A request that resumes at h reads a Mamba state computed over exactly
    its first h tokens. Judged where the engine's driver read the state it
    resumed from (``explain[i].resumed_state``: SGLang's driver, whose
    stood-in kernel writes a fingerprint of the tokens computed, and vLLM's,
    ``engine_adapter.vllm_engine.forward``, which writes it where the model
    runner's data path writes each state); a state of other tokens, or a
    slot no step wrote, is a wrong answer served from the cache. Not judged
    where the driver says the state is not observable (``observable``
    false: a state loaded by a KV connector from a chunk no store the
    driver saw filled; a load of a chunk it saw stored carries the stored
    fingerprint and is judged). Expected hits: 0
    (nothing that can be trusted to resume from)."""
    explain = obs.get("explain") or []
    hits = list(obs.get("hits") or [])
    bad = [
        i
        for i, e in enumerate(explain)
        if isinstance(e.get("resumed_state"), dict) and e["resumed_state"].get("same_tokens") is False
    ]
    if not bad:
        return []
    got = explain[bad[0]]["resumed_state"]
    at = (
        got.get("at") if isinstance(got.get("at"), int) else hits[bad[0]]
    )  # where it resumed (vLLM: its tokens computed before its first step)
    over = (
        "a slot no step wrote"
        if got.get("tokens") is None
        else f"a state computed over {got.get('tokens')} tokens that are not its first {at}"
    )
    detail = f"request {bad[0]} resumed at {at} (hit {hits[bad[0]]}) from {over}"
    return [Divergence("resumed_state", version, bad, [0 if i in bad else h for i, h in enumerate(hits)], hits, detail)]


def check_stale(case: Case, version: EngineSpec | str, obs: Observation) -> list[Divergence]:
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
        if (
            h <= 0
            or i > len(explain)
            or any(explain[j].get("written") is None for j in (range(len(explain)) if concurrent else range(i)))
        ):
            continue
        if written_before(case, obs, i, h):
            continue
        bad.append(i)
        mine = prompt_tokens(case.trace[i])
        below = [
            p
            for j, ps in writes_before(case, obs, i)
            for p in ps
            if p <= h and sequence_tokens(case.trace[j])[:p] == mine[:p]
        ]
        expected[i] = max(below, default=0)
        if concurrent:  # another request did compute it, in the step that first ran i or later: read too early
            late = [
                (j, s)
                for j, e in enumerate(explain)
                if j != i and prompt_tokens(case.trace[j])[:h] == mine[:h]
                for p, s in (e.get("written_steps") or ())
                if p == h and s is not None
            ]
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
            notes.append(
                f"request {i} resumed at {hits[i]} in step {explain[i]['first_step']}, the first that ran it, from the state request {j} computes "
                f"in step {step}: {SAME_STEP_READ} (the highest written before is {expected[i]})"
            )
        else:
            notes.append(
                f"request {i} resumed at {hits[i]}, where no earlier prefill wrote a Mamba state over its tokens (the highest written is {expected[i]})"
            )
    if keyed_bad:
        j = keyed_bad[0]
        notes.append(
            f"request {j} left Mamba states at {keyed[j]} held that its prefill did not write (written {explain[j].get('written')}) and no earlier request held"
        )
    order = sorted(set(bad) | set(keyed_bad))
    context: dict = {"stale_keys": keyed} if keyed_bad else {}
    if same_step and bad and bad[0] == order[0] and bad[0] in same_step:
        context["same_step"] = True  # the first divergence reads a state in the step that computes it
    return [
        Divergence(
            "stale",
            version,
            order,
            expected,
            hits,
            "; ".join(notes if not keyed_bad or (bad and bad[0] <= keyed_bad[0]) else notes[::-1]),
            context,
        )
    ]


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


def check_retention(case: Case, version: EngineSpec | str, obs: Observation) -> list[Divergence]:
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
    interval, L, H, S, U = (
        g.retention_interval,
        knobs.hash_lookahead_tokens,
        g.hash_block_size,
        g.scheduler_block_size,
        knobs.alignment,
    )
    Ms = sorted(set(g.mamba_block_sizes))
    step = retention_period(interval, min(Ms)) if interval else None
    models = [
        predict_with_knobs(case, knobs, rule)["explain"]
        for rule in dict.fromkeys(("promise", implemented_rule(version)))
    ]
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
            faults = (
                ([f"keeps {extra}, where no later request can resume"] if extra else [])
                + (
                    [f"keeps {inside} inside its {len(tokens)}-token prompt's output, no semantic checkpoint"]
                    if inside
                    else []
                )
                + ([f"drops the segment ends {missing} its prefill wrote"] if missing else [])
            )
            notes.append(f"request {i} " + " and ".join(faults))
    if not bad:
        return []
    mode = "sparse" if interval == 0 else f"periodic (interval {interval})"
    return [
        Divergence(
            "retention",
            version,
            bad,
            list(hits),
            list(hits),
            f"{mode} retention: " + "; ".join(notes[:3]),
            {"expected_states": expected, "observed_states": observed, "output_states": outputs},
        )
    ]
