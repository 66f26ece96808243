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


def finish_prefill(req, tree) -> None:
    """The prefill result's step for a request whose last chunk ran
    (``batch_result_processor.py:355-395``)."""
    req.output_ids.append(OUTPUT_TOKEN)
    req.update_finish_state()
    if req.finished():
        release_kv_cache(req, tree, checkpoint=True)
    else:
        checkpoint_kv_cache(req, tree)


def run_decode(cache, batch, req, max_tokens: int) -> tuple[list[list[int]], list[int]]:
    """Decode ``req`` (its prefill finished in ``batch``) until SGLang
    finishes it: ``(decode_steps, tracked)``; each decode step as
    ``[tokens computed before, 1, 1]`` and each length a decode step
    tracked a state at. Bounded by ``max_tokens`` steps."""
    proc = result_processor(cache.tree, cache.allocator, cache.req_pool, batch.model_config)
    steps: list[list[int]] = []
    tracked: list[int] = []
    for _ in range(max_tokens):
        if req.finished():
            break
        batch.filter_batch()
        if batch.is_empty():
            break
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
    else:
        if not req.finished():
            raise RuntimeError(f"request {req.rid}: decode did not finish within {max_tokens} steps")
    return steps, tracked
