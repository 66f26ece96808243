"""SGLang 0.5.23's decode steps for one request, through its own scheduler
code (inside the SGLang environment; the driver's prefill hands over).

What runs is SGLang's, in the scheduler's order (overlap off, no
speculation, one request in the running batch):

1. the prefill's result (``managers/scheduler_components/
   batch_result_processor.py:355-395 process_batch_result_prefill``): the
   first output token appended, ``update_finish_state``; a finished request
   is released into the tree (``release_kv_cache(checkpoint=True)``), an
   unfinished one checkpointed (``checkpoint_kv_cache``, ``:392``);
2. each step ``Scheduler.update_running_batch`` (``scheduler.py:4459``):
   ``filter_batch`` then ``ScheduleBatch.prepare_for_decode``
   (``schedule_batch.py:3736``), which with the extra buffer sets the track
   mask where ``seq_len % mamba_track_interval == 0`` (``:3815``, the
   interval is ``runtime_context.mamba_track_grid``) and the slot to track
   into (``set_mamba_track_indices_from_reqs``, ``:2322``);
3. the stood-in forward pass writes the working state's fingerprint over
   ``seq_len`` tokens (prompt and outputs so far) and, where the mask is
   set, the same into the track slot (what the kernel's decode tracking
   copies: the state after the step's token);
4. ``process_batch_result_decode``'s per-request part (``:1032-1052``): the
   output appended, ``update_finish_state``, then
   ``_handle_finish_state_updated_req`` (``:1376``): at a boundary
   ``mamba_last_track_seqlen = kv_committed_len`` (``:1406``) and the
   ping-pong swapped (``_mamba_prefix_cache_update``, ``:1524``); when
   finished ``release_kv_cache(checkpoint=True)`` (``:1466``), whose
   checkpoint picks the last tracked state, or the one before it when the
   last ran past the key (``components/mamba.py:582
   _select_finished_checkpoint``).

The output tokens are kvspec's :data:`reference.tokens.OUTPUT_TOKEN` (the
case defines every output), so a later turn that quotes them matches what
this request cached.
"""

from __future__ import annotations

import contextlib

import torch
from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache

from reference.tokens import OUTPUT_TOKEN


class PlainDecodeResult:
    """The fields of SGLang's ``GenerationBatchResult`` (``managers/utils.py:56``)
    that a plain decode's finish path reads
    (``_mamba_can_cache_finished_req``, ``batch_result_processor.py:1472``:
    no draft was verified). A named stand-in: importing
    ``managers/utils.py`` pulls in ``einops`` (expert-parallel metrics),
    which SGLang's CPU environment here lacks and the cache never uses."""

    num_correct_drafts_per_req_cpu = None
    grammar_retained_tokens = None
    num_non_draft_tokens_per_req = 1


@contextlib.contextmanager
def host_memory_unpinned():
    """``prepare_for_decode`` pins its track mask before copying it to the
    device (``schedule_batch.py:3830``); with no accelerator torch refuses
    to pin. Here the device is the CPU, so the copy needs no pinned page:
    ``Tensor.pin_memory`` returns the tensor itself inside this block (a
    stand-in for the platform, restored on exit)."""
    if torch.cuda.is_available():
        yield
        return
    original = torch.Tensor.pin_memory
    torch.Tensor.pin_memory = lambda self, *a, **k: self
    try:
        yield
    finally:
        torch.Tensor.pin_memory = original


def _assign_rows_in_torch(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, batch_size):
    """What the ``assign_req_to_token_pool`` kernel writes
    (``mem_cache/allocation.py:700-723``): row ``i``'s slots
    ``[start_i, end_i)`` take the next ``end_i - start_i`` entries of
    ``out_cache_loc``, in row order."""
    at = 0
    for i in range(batch_size):
        start, end = int(start_offset[i]), int(end_offset[i])
        req_to_token[int(req_pool_indices[i]), start:end] = out_cache_loc[at : at + end - start]
        at += end - start


@contextlib.contextmanager
def spec_kernels_in_torch():
    """A verify step's KV reservation (``eagle_prepare_for_decode`` ->
    ``alloc_for_spec_decode``, ``mem_cache/allocation.py:780-843``) launches
    two Triton kernels for the resolved CUDA backend: ``get_last_loc_triton``
    (``:133``) and ``assign_req_to_token_pool`` (``:755``). With no
    accelerator neither can launch; inside this block the first is SGLang's
    own torch twin (``get_last_loc_torch``, ``:140``) and the second
    :func:`_assign_rows_in_torch` (the kernel's copy, in torch). A named
    stand-in for the platform, restored on exit; the slots allocated and
    the rows written are the kernels'."""
    from sglang.srt.mem_cache import allocation

    if torch.cuda.is_available():
        yield
        return
    saved = allocation.get_last_loc_triton, allocation.assign_req_to_token_pool_func
    allocation.get_last_loc_triton = allocation.get_last_loc_torch
    allocation.assign_req_to_token_pool_func = _assign_rows_in_torch
    try:
        yield
    finally:
        allocation.get_last_loc_triton, allocation.assign_req_to_token_pool_func = saved


def result_processor(tree, allocator, req_pool, model_config) -> SchedulerBatchResultProcessor:
    """SGLang's own result processor (a frozen dataclass, built by its
    constructor), holding what its per-request finish path reads for a plain
    decode: the tree, the pools, overlap off; the parts it never reads there
    (metrics, streaming, disaggregation, beams, draft and model workers)
    are None."""
    unused = {
        f: None
        for f in (
            "disaggregation_mode",
            "hisparse_coordinator",
            "decode_offload_manager",
            "metrics_collector",
            "metrics_reporter",
            "draft_worker",
            "model_worker",
            "logprob_result_processor",
            "output_streamer",
            "beam_coordinator",
            "abort_request",
        )
    }
    return SchedulerBatchResultProcessor(
        is_generation=True,
        enable_overlap=False,
        enable_overlap_mlx=False,
        model_config=model_config,
        token_to_kv_pool_allocator=allocator,
        tree_cache=tree,
        req_to_token_pool=req_pool,
        **unused,
    )


class NoMetrics:
    """A named stand-in for the result processor's metrics reporter and
    model worker: ``_resolve_spec_v2_tokens`` (``batch_result_processor.py:779,
    804``) reports the verify to them; they keep statistics, never cache
    state."""

    def snapshot_spec_decode_metrics(self, batch, result) -> None:
        return None

    def on_verify_complete_cpu(self, num_correct_drafts, batch_size=None) -> None:
        return None


class SpecVerifyResult:
    """The fields of SGLang's ``GenerationBatchResult`` (``managers/utils.py:56``)
    that a verify's result path reads (``_resolve_spec_v2_tokens``,
    ``batch_result_processor.py:770-848``; ``_mamba_check_track_boundary``,
    ``:1652-1666``; ``_mamba_can_cache_finished_req``, ``:1472``;
    ``advance_grammar_fsm``, ``:897``): the
    flattened accepted tokens with their row width, the accept lengths, no
    grammar (the same named stand-in reason as :class:`PlainDecodeResult`)."""

    grammar_retained_tokens = None
    num_non_draft_tokens_per_req = 1
    grammar_advanced = False
    block_accept_lens = None
    cap_lens = None
    num_correct_drafts_per_req_cpu = None

    def __init__(self, next_token_ids: torch.Tensor, accept_lens: torch.Tensor, stride: int) -> None:
        self.next_token_ids = next_token_ids
        self.accept_lens = accept_lens
        self.speculative_output_stride = stride
        self.speculative_num_draft_tokens = stride


def finish_prefill(req, tree) -> None:
    """The prefill result's step for a request whose last chunk ran
    (``batch_result_processor.py:355-395``)."""
    req.output_ids.append(OUTPUT_TOKEN)
    req.update_finish_state()
    if req.finished():
        release_kv_cache(req, tree, checkpoint=True)
    else:
        checkpoint_kv_cache(req, tree)


def run_decode(cache, batch, req, max_tokens: int, draft_tokens: int | None = None):
    """Decode ``req`` plainly or, with ``draft_tokens``, by EAGLE verify
    steps (:func:`run_spec_decode`)."""
    if draft_tokens:
        return run_spec_decode(cache, batch, req, max_tokens, draft_tokens)
    return run_plain_decode(cache, batch, req, max_tokens)


def _decode_rounds(batch, req, max_tokens: int, unit: str):
    """Yield once per decode round of ``req``: before each, stop when it has
    finished, else filter ``batch`` and stop when that leaves it empty. After
    ``max_tokens`` rounds an unfinished request is an error ("did not finish
    within N ``unit``")."""
    for _ in range(max_tokens):
        if req.finished():
            return
        batch.filter_batch()
        if batch.is_empty():
            return
        yield
    if not req.finished():
        raise RuntimeError(f"request {req.rid}: decode did not finish within {max_tokens} {unit}")


def run_plain_decode(cache, batch, req, max_tokens: int) -> tuple[list[list[int]], list[int]]:
    """Decode ``req`` (its prefill finished in ``batch``) until SGLang
    finishes it: ``(decode_steps, tracked)``; each decode step as
    ``[tokens computed before, 1, 1]`` and each length a decode step
    tracked a state at. Bounded by ``max_tokens`` steps."""
    proc = result_processor(cache.tree, cache.allocator, cache.req_pool, batch.model_config)
    steps: list[list[int]] = []
    tracked: list[int] = []
    for _ in _decode_rounds(batch, req, max_tokens, "steps"):
        with host_memory_unpinned():
            batch.prepare_for_decode()
        seq = int(batch.seq_lens_cpu[0])
        content = list(req.origin_input_ids) + list(req.output_ids)
        cache.write(req.kv.mamba_pool_idx, content[:seq])
        mask = batch.mamba_track_mask_cpu
        if mask is not None and mask[0]:
            cache.write(batch.mamba_track_indices[0], content[:seq])
            tracked.append(seq)
        steps.append([seq - 1, 1, 1])
        req.output_ids.append(OUTPUT_TOKEN)
        req.update_finish_state(1)
        proc._handle_finish_state_updated_req(req, batch, PlainDecodeResult(), 0, None)
    return steps, tracked


def run_spec_decode(cache, batch, req, max_tokens: int, draft_tokens: int) -> tuple[list[list[int]], list[int]]:
    """Decode ``req`` by EAGLE verify steps (topk 1, overlap off, as the
    scheduler's non-overlap spec-v2 round runs them, ``scheduler.py:4825-4850``):

    1. ``filter_batch`` then ``prepare_for_decode``, which for a speculative
       batch hands over to ``spec_prepare_for_decode``
       (``schedule_batch.py:3754-3762``; ``spec_utils.py:1249``: the lazy
       track plan, then ``eagle_prepare_for_decode``'s KV reservation,
       ``eagle_utils.py:857``), and ``prepare_mamba_track_for_verify``
       (``spec_utils.py:913``: the track slot from the request's ping-pong
       buffer);
    2. the stood-in verify. The drafter proposes
       :data:`reference.tokens.OUTPUT_TOKEN` ``draft_tokens - 1`` times and the
       target samples the same token, so every draft is accepted: ``a =
       draft_tokens`` tokens per step, the outputs those of a plain decode.
       Its state commit (``commit_mamba_states_after_verify``,
       ``spec_utils.py:1005``) writes the working slot over the ``seq + a``
       tokens computed, and where the step crosses a multiple of the track
       interval ``I`` (``_verify_commit_step_indices``, ``:983-1002``) the
       track slot over ``(seq + a) // I * I`` tokens; then ``seq_lens`` is
       the new length (``scheduler.py:4842-4849``);
    3. the result: ``_resolve_spec_v2_tokens`` (``batch_result_processor.py:770``,
       ``kv_committed_len`` grows by the accepted run), then per request the
       outputs extended, ``update_finish_state(a)`` (the cap at
       ``max_new_tokens``, ``schedule_batch.py:2038``) and
       ``_handle_finish_state_updated_req`` (``:1376``: the boundary by the
       accepted range, ``_mamba_check_track_boundary`` ``:1652``; the release
       into the tree when finished).

    Returns ``(decode_steps, tracked)``: each verify step as ``[tokens
    computed before, draft_tokens, accepted]``, each length a verify tracked
    a state at. Bounded by ``max_tokens`` steps."""
    from sglang.srt.runtime_context import mamba_track_grid
    from sglang.srt.speculative.spec_utils import prepare_mamba_track_for_verify

    proc = result_processor(cache.tree, cache.allocator, cache.req_pool, batch.model_config)
    object.__setattr__(proc, "metrics_reporter", NoMetrics())
    object.__setattr__(proc, "model_worker", NoMetrics())
    interval = mamba_track_grid(cache.tree.page_size)
    steps: list[list[int]] = []
    tracked: list[int] = []
    for _ in _decode_rounds(batch, req, max_tokens, "verify steps"):
        with host_memory_unpinned(), spec_kernels_in_torch():
            batch.prepare_for_decode()
        prepare_mamba_track_for_verify(batch)
        seq = int(batch.seq_lens_cpu[0])
        accept = draft_tokens
        post = seq + accept
        content = list(req.origin_input_ids) + list(req.output_ids) + [OUTPUT_TOKEN] * accept
        cache.write(req.kv.mamba_pool_idx, content[:post])
        track = batch.mamba_track_indices
        if track is not None and seq // interval != post // interval and int(track[0]) >= 0:
            at = post // interval * interval
            cache.write(track[0], content[:at])
            tracked.append(at)
        batch.seq_lens = batch.seq_lens + accept
        batch.seq_lens_cpu = batch.seq_lens_cpu + accept
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        steps.append([seq, draft_tokens, accept])
        result = SpecVerifyResult(
            torch.tensor([OUTPUT_TOKEN] * accept, dtype=torch.int64),
            torch.tensor([accept], dtype=torch.int64),
            draft_tokens,
        )
        tokens = proc._resolve_spec_v2_tokens(result, batch)[0]
        req.output_ids.extend(tokens)
        req.update_finish_state(len(tokens))
        proc._handle_finish_state_updated_req(req, batch, result, 0, None)
    return steps, tracked
