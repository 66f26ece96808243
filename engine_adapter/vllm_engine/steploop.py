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
kvspec's own code goes to the harness (``engine_adapter.vllm_engine.failure``).
With a KV connector each step's output carries its stood-in workers' report
(``engine_adapter.vllm_engine.connector``), the loop steps on while the
scheduler ``has_requests()`` (as ``EngineCore``), and a request's hits add
what the connector loaded.

Async scheduling (``AsyncScheduler``, where the deployment resolves it):
``EngineCore`` steps with a batch queue of ``max_concurrent_batches`` (2;
vLLM 0.33.0 core.py:208-214, config/vllm.py:588-598) and
``step_with_batch_queue`` (core.py:708-824): it schedules a step while the
previous one is in flight and processes a step's output
(``update_from_output``) only once the queue is full or nothing more can be
scheduled, so each ``schedule()`` sees the previous step's tokens as output
placeholders (``async_scheduler.py:24-49``) and blocks are cached for
decoded tokens in ``update_from_output`` (scheduler.py:2403-2415). The loop
keeps that order (:class:`_Batches`); the stood-in model runner's output
is made when the step is scheduled (which requests sample: those past
their prefill chunk) and handed over when it is processed. Draft tokens
are then the scheduler's own placeholders: ``EngineCore.post_step`` does
not propose under async scheduling (core.py:699-706).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.metrics.stats import PrefixCacheStats
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.request import Request as VllmRequest

from engine_adapter.vllm_engine.connector import worker_output
from engine_adapter.vllm_engine.failure import VllmFailure, vllm_outcome
from engine_adapter.vllm_engine.observe import SAMPLED_TOKEN

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
    #: of ``hits``, the tokens a KV connector loaded (its
    #: ``connector_prefix_cache_stats``; 0 without one)
    external_hits: int = 0
    preempted_hits: int = 0
    preempted_queries: int = 0
    chunk_ends: list[int] = field(default_factory=list)
    #: (sequence length, query length) of each prefill step, as the model
    #: runner sees it (``engine_adapter.vllm_engine.writes`` places its checkpoints).
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
    #: the steps (counted as ``first_step``) whose scheduling preempted the
    #: request (the ``SchedulerOutput``'s ``preempted_req_ids``), and those
    #: that scheduled it again after each (``engine_adapter.vllm_engine.pressure``)
    preempted: list[int] = field(default_factory=list)
    resumed: list[int] = field(default_factory=list)


def _add_request(scheduler: Scheduler, index: int, tokens: list[int], max_tokens: int, hasher) -> VllmRequest:
    """Add request ``index`` (``req-{index}``) to the scheduler; vLLM's
    refusal is a :class:`VllmFailure`, kvspec's own error goes on up."""
    try:
        req = VllmRequest(
            request_id=f"req-{index}",
            prompt_token_ids=tokens,
            sampling_params=SamplingParams(max_tokens=max_tokens),
            pooling_params=None,
            block_hasher=hasher,
        )
        scheduler.add_request(req)
    except Exception as e:
        if vllm_outcome(e, "run") is None:
            raise
        raise VllmFailure("add_request", e, request=index) from None
    return req


def _decoding(req: VllmRequest, n: int) -> tuple[int, int] | None:
    """Before a step: (tokens computed, tokens it asks for: the sampled
    token and the drafts) of a request past its prefill (vLLM's own prefill
    end: ``max(prompt, num_tokens - 1)``), else None. Under async
    scheduling a token still in flight counts as an output placeholder
    (vLLM 0.33.0 scheduler.py:838-842: a running request asks for
    ``num_tokens_with_spec + num_output_placeholders - num_computed_tokens``)."""
    held = int(getattr(req, "num_output_placeholders", 0) or 0)
    if req.num_output_tokens + held > 0 and req.num_computed_tokens >= max(n, req.num_tokens + held - 1):
        return int(req.num_computed_tokens), int(req.num_tokens_with_spec + held - req.num_computed_tokens)
    return None


def _samples(req: VllmRequest) -> bool:
    """Whether the stood-in model runner samples a token for ``req`` in the
    step just scheduled: its scheduled tokens reach the end of what it
    holds (its tokens and, under async scheduling, the placeholders:
    ``request.is_prefill_chunk``, vLLM 0.33.0 scheduler.py:1861-1863, which
    ``AsyncScheduler`` reads before adding this step's placeholders)."""
    if int(getattr(req, "num_output_placeholders", 0) or 0) > 0:
        return not req.is_prefill_chunk
    return req.num_computed_tokens >= req.num_tokens


def _observe_step(out: Served, n: int, num: int, step: int, decoding: tuple[int, int] | None, watch) -> None:
    """What one scheduled step of ``out``'s request shows (``num``: its
    scheduled tokens; ``step``: the step's number): a step after the prefill,
    the first step, the Mamba blocks ``watch`` counts, and a prefill chunk's
    end (the last one may carry draft-token slots past the prompt, MTP with
    lookahead hashes, so it counts as N) with the step's lengths."""
    req = out.request
    if len(out.resumed) < len(out.preempted):
        out.resumed.append(step)
    if decoding is not None:
        out.decode_steps.append((*decoding, num))
    if out.first_step is None:
        out.first_step = step
    if watch is not None:
        # the tokens processed before the step: vLLM frees skipped blocks on
        # that basis, leaving out steps still in flight (0.33.0
        # kv_cache_manager.py:561-567; without async scheduling only this one)
        start = int(req.num_computed_tokens) - int(getattr(req, "num_in_flight_tokens", num) or num)
        unretired, freed = watch(req.request_id, start)
        if unretired or freed:
            out.block_table.append((start, unretired, freed))
    if (req.num_output_tokens == 0 or out.preempted) and int(req.num_computed_tokens) - num < n:  # (under async
        # scheduling the first decode step is scheduled before the prefill's sampled token is appended;
        # a request preempted after sampling recomputes its prompt and outputs from its hit, and each such
        # step is a prefill step the model runner writes states at: ``_preempt_request`` sets
        # ``num_computed_tokens`` to 0, vLLM 0.29.0 scheduler.py:1425, 0.33.0 :1822, so it starts inside the prompt)
        computed = min(int(req.num_computed_tokens), n)
        if not out.chunk_ends or out.chunk_ends[-1] < computed:
            out.chunk_ends.append(computed)
        out.prefill_steps.append((int(req.num_computed_tokens), num))
        out.prefill_at.append(step)


def _preemptions(so, served: dict, step: int) -> None:
    """Record the step on each request the step's scheduling preempted
    (vLLM 0.33.0 sched/output.py:274-276 ``preempted_req_ids``; set by
    ``Scheduler._preempt_request``, scheduler.py:1799-1844)."""
    for rid in getattr(so, "preempted_req_ids", None) or ():
        out = served.get(rid)
        if out is not None:
            out.preempted.append(step)


def _sum_stats(outputs, totals: list[int]) -> None:
    """Add each output's ``prefix_cache_stats`` (vLLM resets them every
    step) to ``totals``: [hits, queries, preempted hits, preempted queries,
    a KV connector's hits (``connector_prefix_cache_stats``: the tokens it
    loads beyond the local hit)]."""
    for eco in (outputs or {}).values():
        stats = eco.scheduler_stats
        pcs = stats.prefix_cache_stats if stats is not None else None
        if pcs is not None:
            totals[0] += pcs.hits
            totals[1] += pcs.queries
            if HAS_PREEMPTED:
                totals[2] += pcs.preempted_hits
                totals[3] += pcs.preempted_queries
        external = getattr(stats, "connector_prefix_cache_stats", None) if stats is not None else None
        if external is not None:
            totals[4] += external.hits


def _stepping(scheduler: Scheduler):
    """What keeps the loop stepping: unfinished requests; with a KV
    connector, as ``EngineCore.has_work`` asks (vLLM 0.33.0
    ``Scheduler.has_requests``), also finished requests not yet cleared and
    the connector's pending transfers, so a request's last stores are issued
    and complete before the next request is sent."""
    if getattr(scheduler, "connector", None) is not None and hasattr(scheduler, "has_requests"):
        return scheduler.has_requests
    return scheduler.has_unfinished_requests


def _runner_output(scheduler: Scheduler, so, req_ids: list[str], sampled: list[list[int]]) -> ModelRunnerOutput:
    """The stood-in model runner's output for one step: the sampled tokens,
    and with a KV connector its stood-in workers' report
    (``engine_adapter.vllm_engine.connector``)."""
    out = ModelRunnerOutput(
        req_ids=req_ids, req_id_to_index={x: j for j, x in enumerate(req_ids)}, sampled_token_ids=sampled
    )
    connector_output = worker_output(scheduler, so)
    if connector_output is not None:
        out.kv_connector_output = connector_output
    return out


class _Batches:
    """``EngineCore``'s batch queue (vLLM 0.33.0 core.py:208-214, 708-824):
    scheduled steps whose output is not yet processed, oldest last; its
    depth is ``max_concurrent_batches`` (1 without async scheduling: each
    step's output is processed at once, ``EngineCore.step``)."""

    def __init__(self, scheduler: Scheduler) -> None:
        vc = getattr(scheduler, "vllm_config", None)
        self.depth = max(1, int(getattr(vc, "max_concurrent_batches", 1) or 1)) if vc is not None else 1
        #: whether the engine core proposes drafts after a step (not under
        #: async scheduling: ``post_step``, core.py:699-706)
        self.proposes = not bool(getattr(getattr(vc, "scheduler_config", None), "async_scheduling", False))
        self.queue: list[tuple] = []

    def add(self, so, *rest) -> bool:
        """Queue a scheduled step; True when one is to be processed now (the
        queue is full, or nothing was scheduled and nothing more can be:
        ``step_with_batch_queue``'s ``len(batch_queue) < batch_queue_size and
        (model_executed or has_requests())``)."""
        self.queue.insert(0, (so, *rest))
        return not (len(self.queue) < self.depth and (so.total_num_scheduled_tokens > 0 or rest[-1]))

    def oldest(self) -> tuple:
        return self.queue.pop()


def serve(
    scheduler: Scheduler, index: int, tokens: list[int], max_tokens: int, hasher, watch=None, slots=None
) -> Served:
    """Run one request to completion (the scheduler holds no other).

    The loop makes the bare loop's vLLM calls (``engine_adapter.vllm_engine.baseline``)
    and adds only what is observed: the chunk end and the lengths of each
    prefill step and the summed ``prefix_cache_stats`` (names bound once, no
    copies). ``watch(request_id, start)``, asked after each step of the
    request is scheduled (``start``: its tokens computed before the step):
    (unretired, freed) Mamba blocks it holds (``observe.BlockTable``).
    ``slots``: the stood-in forward pass's state slots
    (``engine_adapter.vllm_engine.forward.StateSlots``), told of each step
    after ``schedule()`` and after ``update_from_output()``."""
    n = len(tokens)
    rid = f"req-{index}"
    req = _add_request(scheduler, index, tokens, max_tokens, hasher)
    out = Served(req)
    requests = scheduler.requests
    schedule, update, unfinished = scheduler.schedule, scheduler.update_from_output, _stepping(scheduler)
    sampled_one = [SAMPLED_TOKEN]
    num_drafts = int(getattr(scheduler, "num_spec_tokens", 0) or 0)
    drafting = num_drafts > 0 and max_tokens > 1
    propose = scheduler.update_draft_token_ids
    totals = [0, 0, 0, 0, 0]
    steps = idle = 0
    max_steps = n + max_tokens + 64
    batches = _Batches(scheduler)
    drafting = drafting and batches.proposes
    while True:
        try:
            scheduled, outputs, due = {}, None, True
            if unfinished():
                decoding = _decoding(req, n)
                so = schedule()
                scheduled = so.num_scheduled_tokens
                _preemptions(so, {rid: out}, steps)
                if rid in scheduled:
                    _observe_step(out, n, int(scheduled[rid]), steps, decoding, watch)
                todo = slots.scheduled(so) if slots is not None else None
                req_ids = list(scheduled)
                sampled = [sampled_one if _samples(requests[sid]) else [] for sid in req_ids]
                due = batches.add(so, _runner_output(scheduler, so, req_ids, sampled), todo, unfinished())
            elif not batches.queue:
                break
            if due:
                done, output, todo, _ = batches.oldest()
                outputs = update(done, output)
                if todo is not None:
                    slots.updated(todo)
                if drafting and rid in done.num_scheduled_tokens and not req.is_finished():
                    propose(DraftTokenIds([rid], [[SAMPLED_TOKEN] * num_drafts]))  # a fresh list: vLLM keeps it
        except Exception as e:  # kvspec's own (``watch``, the stand-in outputs) goes to the harness
            if vllm_outcome(e, "run") is None:
                raise
            raise VllmFailure("step", e, request=index) from None
        steps += 1
        _sum_stats(outputs, totals)
        idle = idle + 1 if not scheduled else 0
        if idle > MAX_IDLE_STEPS or steps > max_steps:
            raise VllmFailure(
                "step",
                None,
                f"no progress: request {index} still unfinished after {steps} steps ({req.num_computed_tokens}/{n} prompt tokens computed)",
                request=index,
            )
    out.hits, out.queries, out.preempted_hits, out.preempted_queries, out.external_hits = totals
    out.hits += out.external_hits
    out.steps = steps
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


def serve_wave(
    scheduler: Scheduler, wave: list[Arrival], hasher, watch=None, admitted=None, slots=None
) -> tuple[list[Served], dict]:
    """Run a wave of requests that share the scheduler, as a server batches
    them: each is added ``after`` steps after the previous one (at once when
    nothing is running: a server's idle loop takes no steps), and every
    ``schedule()`` step serves every running request, admitting waiting ones
    into the same step where the budget allows. The per-request record is
    :class:`Served`'s, its ``hits`` where it resumed (the tokens computed
    before the first step that ran it, however often vLLM looked it up) and
    ``queries`` its prompt; the prefix-cache
    stats are per step, not per request, so they are summed for the wave
    (returned beside, ``hits`` / ``queries``, with the wave's ``steps``): a request looked up again
    after vLLM deferred it counts its query twice there.
    ``admitted(request_id)`` is called when a request is first scheduled.
    Draft tokens and the sampled token as in :func:`serve`; a wave that makes
    no progress is an ``EngineStall`` (bounded in steps)."""
    served: dict[str, Served] = {}
    index_of = {f"req-{a.index}": a.index for a in wave}
    added: dict[str, int] = {}
    pending = list(wave)
    requests = scheduler.requests
    schedule, update, unfinished = scheduler.schedule, scheduler.update_from_output, _stepping(scheduler)
    num_drafts = int(getattr(scheduler, "num_spec_tokens", 0) or 0)
    propose = scheduler.update_draft_token_ids
    sampled_one = [SAMPLED_TOKEN]
    totals = [0, 0, 0, 0, 0]
    steps = idle = due = 0
    max_steps = sum(len(a.tokens) + a.max_tokens for a in wave) + sum(a.after for a in wave) + 64 * len(wave)
    current = wave[0].index
    batches = _Batches(scheduler)
    while True:
        try:
            while pending and (steps >= due or not unfinished()):
                a = pending.pop(0)
                current = a.index
                req = _add_request(scheduler, a.index, a.tokens, a.max_tokens, hasher)
                served[req.request_id] = Served(req)
                added[req.request_id] = steps
                if pending:
                    due = steps + pending[0].after
            running = [(rid, out) for rid, out in served.items() if not out.request.is_finished()]
            scheduled, outputs, process = {}, None, True
            if unfinished():
                decoding = {rid: _decoding(out.request, len(out.request.prompt_token_ids)) for rid, out in running}
                so = schedule()
                scheduled = so.num_scheduled_tokens
                _preemptions(so, served, steps)
                for rid, num in scheduled.items():
                    out = served.get(rid)
                    if out is None:
                        continue
                    current = index_of[rid]
                    first = out.first_step is None
                    _observe_step(out, len(out.request.prompt_token_ids), int(num), steps, decoding.get(rid), watch)
                    if first:  # where it resumed: the tokens computed before the first step that ran it
                        out.hits = int(out.request.num_computed_tokens) - int(num)
                        if admitted is not None:
                            admitted(rid)
                todo = slots.scheduled(so) if slots is not None else None
                req_ids = list(scheduled)
                sampled = [sampled_one if _samples(requests[sid]) else [] for sid in req_ids]
                process = batches.add(so, _runner_output(scheduler, so, req_ids, sampled), todo, req_ids, unfinished())
            elif not batches.queue:  # (nothing pending either: the arrivals above come while nothing is unfinished)
                break
            if process:
                done, output, todo, req_ids, _ = batches.oldest()
                outputs = update(done, output)
                if todo is not None:
                    slots.updated(todo)
            if process and num_drafts and batches.proposes:
                drafting = [
                    rid
                    for rid in req_ids
                    if rid in served
                    and served[rid].request.sampling_params.max_tokens > 1
                    and not served[rid].request.is_finished()
                ]
                if drafting:
                    propose(DraftTokenIds(drafting, [[SAMPLED_TOKEN] * num_drafts for _ in drafting]))
        except VllmFailure:
            raise
        except Exception as e:  # kvspec's own (``watch``, the stand-in outputs) goes to the harness
            if vllm_outcome(e, "run") is None:
                raise
            raise VllmFailure("step", e, request=current) from None
        steps += 1
        for rid, out in running:
            if out.request.is_finished():
                out.steps = steps - added[rid]
        _sum_stats(outputs, totals)
        idle = idle + 1 if not scheduled else 0
        if idle > MAX_IDLE_STEPS or steps > max_steps:
            late = [r for r, o in served.items() if not o.request.is_finished()]
            raise VllmFailure(
                "step",
                None,
                f"no progress: requests {', '.join(late) or '(none)'} of the wave still unfinished after {steps} steps",
                request=current,
            )
    for out in served.values():
        out.queries = len(out.request.prompt_token_ids)
    hits, queries, preempted_hits, preempted_queries, external_hits = totals
    return [served[f"req-{a.index}"] for a in wave], {
        "hits": hits,
        "queries": queries,
        "preempted_hits": preempted_hits,
        "preempted_queries": preempted_queries,
        "external_hits": external_hits,
        "steps": steps,
    }
