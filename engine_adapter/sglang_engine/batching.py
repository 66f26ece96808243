"""SGLang 0.5.23's scheduler loop for requests that share it (a concurrent
trace's wave: ``arrival``), inside the SGLang environment.

What runs is SGLang's, in the order of the non-overlap event loop
(``Scheduler.event_loop_normal``: receive, ``get_next_batch_to_run``, run,
process the result), one loop turn per scheduler step:

1. arrivals: a request is put in the waiting queue ``arrival`` steps after
   the one before it (at once when nothing is queued or running);
2. ``get_next_batch_to_run`` (``scheduler.py:3894-3990``): the chunked
   request is stashed (``stash_chunked_request`` -> ``checkpoint_kv_cache``,
   ``:3772``) and left out of the merge; the last extend batch is filtered
   and merged into the running batch (``merge_batch``); the running batch
   is filtered;
3. ``get_new_batch_prefill`` (``:4177-4330``): a ``PrefillAdder`` over the
   running batch, the chunked request first (``add_chunked_req``), then
   each waiting request in queue order (``init_next_round_input`` with the
   tree, ``add_one_req``) until the budget stops (``budget_state``,
   ``AddReqResult``); a request left out gives back its Mamba slot
   (``:4279-4294``); ``ScheduleBatch.init_new`` + ``prepare_for_extend``.
   Several requests share the extend, the last one admitted cut at the
   chunk budget (a mixed chunk: one request's middle chunk beside others'
   whole prompts);
4. with no prefill to run, the running batch decodes
   (``update_running_batch``: ``filter_batch`` + ``prepare_for_decode``);
5. the result: a prefill row with a chunk still to come counts it down
   (``batch_result_processor.py:404``); the others append their first
   output and finish (``release_kv_cache(checkpoint=True)``) or are
   checkpointed (``:355-395``); a decode row appends its output and goes
   through ``_handle_finish_state_updated_req`` (``:1376``).

Stood in: the forward pass (each row's working state and track slot get
the fingerprint of their tokens, as in the serial driver), the schedule
policy (the queue in arrival order: ``--schedule-policy fcfs``; SGLang's
default ``lpm`` reorders by prefix match, :data:`POLICY`), and overlap
(off). Not driven here: speculative decoding in a wave, ``--enable-mixed-chunk``
(decode rows inside an extend, ``mix_with_running``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache

from engine_adapter.sglang_engine.decode import PlainDecodeResult, host_memory_unpinned, result_processor
from reference.tokens import OUTPUT_TOKEN

#: The queue order this loop keeps (SGLang's ``SchedulePolicy`` name for it).
POLICY = "fcfs"
#: Steps a wave may take per token it computes, plus slack per request.
STEP_SLACK = 64


@dataclass
class WaveRequest:
    """One request of a wave: its trace index, tokens, outputs asked and
    steps after the previous request of the wave it is sent."""

    index: int
    tokens: list[int]
    max_tokens: int
    after: int


@dataclass
class _Seen:
    """What one request of a wave showed (the serial driver's observation fields)."""

    req: Req
    tokens: list[int]
    hit: int | None = None
    branching: int | None = None
    resumed: tuple[int, int] | None = None
    chunk_ends: list[int] = field(default_factory=list)
    written: list[int] = field(default_factory=list)
    #: (position, scheduler step) of every state the request's extends wrote
    written_steps: list[tuple[int, int]] = field(default_factory=list)
    tracked: list[int] = field(default_factory=list)
    decode_steps: list[list[int]] = field(default_factory=list)
    first_step: int | None = None
    last_step: int | None = None


def _admit(cache, res, running, waiting: list[Req], chunked):
    """``get_new_batch_prefill``'s admission (``scheduler.py:4157-4310``):
    ``(can_run, new_chunked, chunked)``."""
    adder = PrefillAdder(
        res.page_size, cache.tree, cache.allocator, running, 1.0, res.max_prefill_tokens, res.chunked_prefill_size
    )
    if chunked is not None:
        chunked.init_next_round_input()
        chunked = adder.add_chunked_req(chunked)
    for req in waiting:
        if adder.budget_state() == AddReqResult.OTHER:
            break
        req.init_next_round_input(cache.tree)
        verdict = adder.add_one_req(req, has_chunked_req=chunked is not None, truncation_align_size=None)
        if verdict != AddReqResult.CONTINUE:
            if not (adder.can_run_list and req is adder.can_run_list[-1]):
                req.kv.mamba_cow_src_index = None
                req.kv.mamba_needs_clear = False
                if req.kv.holds_mamba:
                    cache.req_pool.mamba_allocator.free(req.kv.mamba_pool_idx.unsqueeze(-1))
                    req.kv.mamba_pool_idx = None
            break
    return list(adder.can_run_list), adder.new_chunked_req, chunked


def _extend(cache, batch, seen: dict[str, _Seen], step: int, tracked_content: Callable) -> None:
    """The stood-in forward of an extend batch: per row the working state
    over its extend's end, and the tracked state where the row's track mask
    is set (what the kernel copies, ``tracked_content``)."""
    cache.deferred_cow_and_clear(batch)
    for row, req in enumerate(batch.reqs):
        s = seen[req.rid]
        if s.resumed is None:
            s.resumed = cache.read(req.kv.mamba_pool_idx) if s.hit else (0, 0)
            s.first_step = step
        end = req.extend_end
        s.chunk_ends.append(end)
        cache.write(req.kv.mamba_pool_idx, s.tokens[:end])
        s.written.append(end)
        s.written_steps.append((end, step))
        mask = batch.mamba_prefill_track_mask_cpu
        if mask is not None and mask[row]:
            computed = tracked_content(batch, req, row)
            cache.write(batch.mamba_track_indices[row], s.tokens[:computed])
            s.tracked.append(req.kv.mamba_last_track_seqlen)
            if computed not in s.written:
                s.written.append(computed)
                s.written_steps.append((computed, step))


def _prefill_result(cache, batch, seen: dict[str, _Seen], step: int) -> None:
    """``process_batch_result_prefill``'s per-row part (``:297-440``)."""
    for req in batch.reqs:
        if req.finished():
            continue
        if req.inflight_middle_chunks > 0:
            req.inflight_middle_chunks -= 1
            continue
        req.output_ids.append(OUTPUT_TOKEN)
        req.update_finish_state()
        if req.finished():
            release_kv_cache(req, cache.tree, checkpoint=True)
            seen[req.rid].last_step = step
        else:
            checkpoint_kv_cache(req, cache.tree)


def _decode(cache, batch, seen: dict[str, _Seen], step: int, proc) -> None:
    """One decode step of the running batch: ``prepare_for_decode``, the
    stood-in forward (each row's working state over its ``seq_len`` tokens,
    the track slot where the row's mask is set), then per row the result
    (``process_batch_result_decode``, ``:1029-1052``)."""
    with host_memory_unpinned():
        batch.prepare_for_decode()
    mask = batch.mamba_track_mask_cpu
    for row, req in enumerate(batch.reqs):
        seq = int(batch.seq_lens_cpu[row])
        content = list(req.origin_input_ids) + list(req.output_ids)
        cache.write(req.kv.mamba_pool_idx, content[:seq])
        if mask is not None and mask[row]:
            cache.write(batch.mamba_track_indices[row], content[:seq])
            seen[req.rid].tracked.append(seq)
        seen[req.rid].decode_steps.append([seq - 1, 1, 1])
    for row, req in enumerate(batch.reqs):
        req.output_ids.append(OUTPUT_TOKEN)
        req.update_finish_state(1)
        proc._handle_finish_state_updated_req(req, batch, PlainDecodeResult(), row, None)
        if req.finished():
            seen[req.rid].last_step = step


def serve_wave(cache, res, model_config, wave: list[WaveRequest], make_req: Callable, tracked_content: Callable):
    """Serve one wave through SGLang's scheduler loop; per request (in
    wave order) its :class:`_Seen`, and the steps the wave took."""
    spec = res.spec_algorithm()
    pending = list(wave)
    seen: dict[str, _Seen] = {}
    waiting: list[Req] = []
    running = ScheduleBatch.init_new([], cache.req_pool, cache.allocator, cache.tree, model_config, False, spec)
    proc = result_processor(cache.tree, cache.allocator, cache.req_pool, model_config)
    last = chunked = None
    steps = due = 0
    max_steps = sum(len(a.tokens) + a.max_tokens + a.after for a in wave) + STEP_SLACK * len(wave)
    while steps <= max_steps:
        idle = not waiting and chunked is None and running.is_empty() and (last is None or last.is_empty())
        while pending and (steps >= due or idle):
            a = pending.pop(0)
            req = make_req(a)
            seen[req.rid] = _Seen(req, a.tokens)
            waiting.append(req)
            idle = False
            if pending:
                due = steps + pending[0].after
        # get_next_batch_to_run
        exclude = []
        if chunked is not None:
            exclude.append(chunked)
            if chunked.extend_end > chunked.prefix_len:
                checkpoint_kv_cache(chunked, cache.tree)
        if last is not None and last.forward_mode.is_extend():
            last.filter_batch(reqs_to_exclude=exclude)
            if not last.is_empty() and last is not running:
                if running.is_empty():
                    running = last
                else:
                    running.merge_batch(last)
        running.filter_batch()
        batch = None
        if waiting or chunked is not None:
            can_run, new_chunked, chunked = _admit(cache, res, running, waiting, chunked)
            if can_run:
                for req in can_run:
                    s = seen[req.rid]
                    if s.hit is None:
                        s.hit, s.branching = req.prefix_len, req.mamba_branching_seqlen
                waiting = [r for r in waiting if r not in can_run]
                if new_chunked is not None:
                    chunked = new_chunked
                if chunked is not None:
                    chunked.inflight_middle_chunks += 1
                batch = ScheduleBatch.init_new(
                    can_run,
                    cache.req_pool,
                    cache.allocator,
                    cache.tree,
                    model_config,
                    False,
                    spec,
                    chunked_req=chunked,
                )
                batch.prepare_for_extend()
                _extend(cache, batch, seen, steps, tracked_content)
                _prefill_result(cache, batch, seen, steps)
        if batch is None and not running.is_empty():
            batch = running
            _decode(cache, batch, seen, steps, proc)
        last = batch
        steps += 1
        if not pending and not waiting and chunked is None and all(s.req.finished() for s in seen.values()):
            return [seen[f"kvspec-{a.index}"] for a in wave], steps
    raise RuntimeError(f"a wave of {len(wave)} requests did not finish within {max_steps} scheduler steps")
