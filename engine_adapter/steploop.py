"""The step loops: requests through vLLM's scheduler, one at a time
(:func:`serve`) or a wave of them sharing steps as a server batches them
(:func:`serve_wave`, a concurrent trace's; the same vLLM calls, 0.29.0-0.33.0).

Each request is added, then ``schedule()`` -> a ``ModelRunnerOutput`` that
samples one token (``SAMPLED_TOKEN``, outside every case stream, so an
output never extends a shared prefix) when a request's last prompt token
has been computed -> ``update_from_output()``, until it finishes. With
speculative decoding (``num_spec_tokens`` K > 0), after each step that
leaves the request running the loop proposes K draft tokens
(``update_draft_token_ids``, all ``SAMPLED_TOKEN``), as the drafter does
after every sampling step, and the next step rejects them all (it samples
one token), so the outputs are the same as without drafts; vLLM itself
drops drafts proposed for a prefill chunk. A step after the prefill is
one that starts at or past ``max(prompt, num_tokens - 1)``, vLLM's own
prefill end (a resumed request replays its outputs as prefill). The
step's ``prefix_cache_stats`` are summed (vLLM resets them every step):
that is what ``vllm:prefix_cache_hits_total`` / ``..._queries_total`` grow
by. A request that makes no progress is a vLLM failure (``EngineStall``),
bounded in steps; an exception vLLM raises is one too, and one from
kvspec's own code goes to the harness (``engine_adapter.failure``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.sampling_params import SamplingParams
from vllm.v1.metrics.stats import PrefixCacheStats
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.request import Request as VllmRequest

from engine_adapter.failure import VllmFailure, vllm_outcome
from engine_adapter.observe import SAMPLED_TOKEN

#: Idle steps (nothing scheduled) before a request counts as stalled.
MAX_IDLE_STEPS = 8
#: Whether this vLLM's prefix-cache stats count preempted requests apart (0.29.0+).
HAS_PREEMPTED = all(hasattr(PrefixCacheStats, f) for f in ("preempted_hits", "preempted_queries"))


@dataclass
class Served:
    """What one request's steps showed."""

    request: object
    hits: int = 0
    queries: int = 0
    preempted_hits: int = 0
    preempted_queries: int = 0
    chunk_ends: list[int] = field(default_factory=list)
    #: (sequence length, query length) of each prefill step, as the model
    #: runner sees it (``engine_adapter.writes`` places its checkpoints).
    prefill_steps: list[tuple[int, int]] = field(default_factory=list)
    #: (tokens computed before the step, tokens it asked for: the sampled
    #: token plus the drafts, tokens scheduled) of each step after the
    #: prefill (the ``split`` oracle's decode rule).
    decode_steps: list[tuple[int, int, int]] = field(default_factory=list)
    #: [tokens computed before the step, unretired, freed] of each step after
    #: whose scheduling ``watch`` counted Mamba blocks
    block_table: list[tuple[int, int, int]] = field(default_factory=list)
    steps: int = 0
    #: The step (counted from the first step of this call) that first
    #: scheduled the request, and that of each of ``prefill_steps``: when
    #: each state the prefill wrote was computed.
    first_step: int | None = None
    prefill_at: list[int] = field(default_factory=list)
    #: The tokens computed before the first step that scheduled the request:
    #: where it resumed (its hit, however often it was looked up).
    resumed: int | None = None


def serve(scheduler: Scheduler, index: int, tokens: list[int], max_tokens: int, hasher, watch=None) -> Served:
    """Run one request to completion (the scheduler holds no other).

    The loop makes the bare loop's vLLM calls (``engine_adapter.baseline``)
    and adds only what is observed: the chunk end and the lengths of each
    prefill step and the summed ``prefix_cache_stats`` (names bound once, no
    copies). ``watch(request_id, start)``, asked after each step of the
    request is scheduled (``start``: its tokens computed before the step):
    (unretired, freed) Mamba blocks it holds (``observe.BlockTable``)."""
    n = len(tokens)
    rid = f"req-{index}"
    try:
        req = VllmRequest(request_id=rid, prompt_token_ids=tokens, sampling_params=SamplingParams(max_tokens=max_tokens), pooling_params=None, block_hasher=hasher)
        scheduler.add_request(req)
    except Exception as e:
        if vllm_outcome(e, "run") is None:
            raise
        raise VllmFailure("add_request", e, request=index) from None
    out = Served(req)
    chunk_ends = out.chunk_ends
    requests = scheduler.requests
    schedule, update, unfinished = scheduler.schedule, scheduler.update_from_output, scheduler.has_unfinished_requests
    sampled_one = [SAMPLED_TOKEN]
    num_drafts = int(getattr(scheduler, "num_spec_tokens", 0) or 0)
    drafting = num_drafts > 0 and max_tokens > 1
    propose = scheduler.update_draft_token_ids
    decode_steps = out.decode_steps
    hits = queries = preempted_hits = preempted_queries = steps = idle = 0
    last_end = -1
    max_steps = n + max_tokens + 64
    while True:
        try:
            if not unfinished():
                break
            decoding = req.num_output_tokens > 0 and req.num_computed_tokens >= max(n, req.num_tokens - 1)
            if decoding:
                before, asked = int(req.num_computed_tokens), int(req.num_tokens_with_spec - req.num_computed_tokens)
            so = schedule()
            scheduled = so.num_scheduled_tokens
            if decoding and rid in scheduled:
                decode_steps.append((before, asked, int(scheduled[rid])))
            if out.first_step is None and rid in scheduled:
                out.first_step, out.resumed = steps, int(req.num_computed_tokens) - int(scheduled[rid])
            if watch is not None and rid in scheduled:
                start = int(req.num_computed_tokens) - int(scheduled[rid])
                unretired, freed = watch(rid, start)
                if unretired or freed:
                    out.block_table.append((start, unretired, freed))
            req_ids = list(scheduled)
            sampled = [sampled_one if requests[sid].num_computed_tokens >= requests[sid].num_tokens else [] for sid in req_ids]
            # A prefill chunk's end; the last one may carry draft-token slots
            # past the prompt (MTP with lookahead hashes), so it counts as N.
            if rid in scheduled and req.num_output_tokens == 0:
                computed = min(int(req.num_computed_tokens), n)
                if last_end < computed:
                    chunk_ends.append(computed)
                    last_end = computed
                out.prefill_steps.append((int(req.num_computed_tokens), int(scheduled[rid])))
                out.prefill_at.append(steps)
            outputs = update(so, ModelRunnerOutput(req_ids=req_ids, req_id_to_index={x: j for j, x in enumerate(req_ids)}, sampled_token_ids=sampled))
            if drafting and rid in scheduled and not req.is_finished():
                propose(DraftTokenIds([rid], [[SAMPLED_TOKEN] * num_drafts]))  # a fresh list: vLLM keeps it
        except Exception as e:  # kvspec's own (``watch``, the stand-in outputs) goes to the harness
            if vllm_outcome(e, "run") is None:
                raise
            raise VllmFailure("step", e, request=index) from None
        steps += 1
        if outputs:
            for eco in outputs.values():
                stats = eco.scheduler_stats
                pcs = stats.prefix_cache_stats if stats is not None else None
                if pcs is not None:
                    hits += pcs.hits
                    queries += pcs.queries
                    if HAS_PREEMPTED:
                        preempted_hits += pcs.preempted_hits
                        preempted_queries += pcs.preempted_queries
        idle = idle + 1 if not scheduled else 0
        if idle > MAX_IDLE_STEPS or steps > max_steps:
            raise VllmFailure("step", None, f"no progress: request {index} still unfinished after {steps} steps ({req.num_computed_tokens}/{n} prompt tokens computed)", request=index)
    out.hits, out.queries, out.preempted_hits, out.preempted_queries, out.steps = hits, queries, preempted_hits, preempted_queries, steps
    return out


@dataclass(frozen=True)
class Arrival:
    """One request of a wave: its case index, tokens, ``max_tokens``, and
    the scheduler steps after the previous request was sent (the wave's
    first: 0)."""

    index: int
    tokens: list[int]
    max_tokens: int
    after: int


def serve_wave(scheduler: Scheduler, wave: list[Arrival], hasher, watch=None, admitted=None) -> tuple[list[Served], dict]:
    """Run a wave of requests that share the scheduler, as a server batches
    them: each is added ``after`` steps after the previous one (at once when
    nothing is running: a server's idle loop takes no steps), and every
    ``schedule()`` step serves every running request, admitting waiting ones
    into the same step where the budget allows. The per-request record is
    :class:`Served`'s, with ``resumed`` and ``first_step``; the prefix-cache
    stats are per step, not per request, so they are summed for the wave
    (returned beside, ``hits`` / ``queries``, with the wave's ``steps``): a request looked up again
    after vLLM deferred it counts its query twice there.
    ``admitted(request_id)`` is called when a request is first scheduled.
    Draft tokens and the sampled token as in :func:`serve`; a wave that makes
    no progress is an ``EngineStall`` (bounded in steps)."""
    served: dict[str, Served] = {}
    lengths: dict[str, int] = {}
    last_end: dict[str, int] = {}
    added: dict[str, int] = {}
    done: set[str] = set()
    pending = list(wave)
    requests = scheduler.requests
    schedule, update, unfinished = scheduler.schedule, scheduler.update_from_output, scheduler.has_unfinished_requests
    num_drafts = int(getattr(scheduler, "num_spec_tokens", 0) or 0)
    propose = scheduler.update_draft_token_ids
    sampled_one = [SAMPLED_TOKEN]
    totals = {"hits": 0, "queries": 0, "preempted_hits": 0, "preempted_queries": 0}
    steps = idle = 0
    due = 0
    max_steps = sum(len(a.tokens) + a.max_tokens for a in wave) + sum(a.after for a in wave) + 64 * len(wave)
    current = wave[0].index
    while True:
        try:
            while pending and (steps >= due or not unfinished()):
                a = pending.pop(0)
                current = a.index
                rid = f"req-{a.index}"
                try:
                    req = VllmRequest(request_id=rid, prompt_token_ids=a.tokens, sampling_params=SamplingParams(max_tokens=a.max_tokens), pooling_params=None, block_hasher=hasher)
                    scheduler.add_request(req)
                except Exception as e:
                    if vllm_outcome(e, "run") is None:
                        raise
                    raise VllmFailure("add_request", e, request=a.index) from None
                served[rid] = Served(req)
                added[rid] = steps
                lengths[rid] = len(a.tokens)
                last_end[rid] = -1
                if pending:
                    due = steps + pending[0].after
            if not pending and not unfinished():
                break
            decoding = {}
            for rid, out in served.items():
                req = out.request
                if not req.is_finished() and req.num_output_tokens > 0 and req.num_computed_tokens >= max(lengths[rid], req.num_tokens - 1):
                    decoding[rid] = (int(req.num_computed_tokens), int(req.num_tokens_with_spec - req.num_computed_tokens))
            so = schedule()
            scheduled = so.num_scheduled_tokens
            for rid in scheduled:
                out = served.get(rid)
                if out is None:
                    continue
                req, n = out.request, lengths[rid]
                current = int(rid[4:])
                if out.first_step is None:
                    out.first_step, out.resumed = steps, int(req.num_computed_tokens) - int(scheduled[rid])
                    if admitted is not None:
                        admitted(rid)
                if rid in decoding:
                    out.decode_steps.append((*decoding[rid], int(scheduled[rid])))
                if watch is not None:
                    start = int(req.num_computed_tokens) - int(scheduled[rid])
                    unretired, freed = watch(rid, start)
                    if unretired or freed:
                        out.block_table.append((start, unretired, freed))
                if req.num_output_tokens == 0:
                    computed = min(int(req.num_computed_tokens), n)
                    if last_end[rid] < computed:
                        out.chunk_ends.append(computed)
                        last_end[rid] = computed
                    out.prefill_steps.append((int(req.num_computed_tokens), int(scheduled[rid])))
                    out.prefill_at.append(steps)
            req_ids = list(scheduled)
            sampled = [sampled_one if requests[sid].num_computed_tokens >= requests[sid].num_tokens else [] for sid in req_ids]
            outputs = update(so, ModelRunnerOutput(req_ids=req_ids, req_id_to_index={x: j for j, x in enumerate(req_ids)}, sampled_token_ids=sampled))
            if num_drafts:
                drafting = [rid for rid in req_ids if rid in served and served[rid].request.sampling_params.max_tokens > 1 and not served[rid].request.is_finished()]
                if drafting:
                    propose(DraftTokenIds(drafting, [[SAMPLED_TOKEN] * num_drafts for _ in drafting]))
        except VllmFailure:
            raise
        except Exception as e:  # kvspec's own (``watch``, the stand-in outputs) goes to the harness
            if vllm_outcome(e, "run") is None:
                raise
            raise VllmFailure("step", e, request=current) from None
        steps += 1
        for rid, out in served.items():
            if rid not in done and out.request.is_finished():
                done.add(rid)
                out.steps = steps - added[rid]
        if outputs:
            for eco in outputs.values():
                stats = eco.scheduler_stats
                pcs = stats.prefix_cache_stats if stats is not None else None
                if pcs is not None:
                    totals["hits"] += pcs.hits
                    totals["queries"] += pcs.queries
                    if HAS_PREEMPTED:
                        totals["preempted_hits"] += pcs.preempted_hits
                        totals["preempted_queries"] += pcs.preempted_queries
        idle = idle + 1 if not scheduled else 0
        if idle > MAX_IDLE_STEPS or steps > max_steps:
            late = [r for r, o in served.items() if not o.request.is_finished()]
            raise VllmFailure("step", None, f"no progress: requests {', '.join(late) or '(none)'} of the wave still unfinished after {steps} steps", request=current)
    for out in served.values():
        out.hits, out.queries = out.resumed or 0, len(out.request.prompt_token_ids)
    totals["steps"] = steps
    return [served[f"req-{a.index}"] for a in wave], totals
