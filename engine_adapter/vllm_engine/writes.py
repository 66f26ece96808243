"""Where the model runner writes Mamba states during a prefill.

A later request can resume at position h only from a Mamba state some
earlier prefill wrote at h over the same tokens; a cached block holding
anything else is a stale state. The model runner writes a state

* at every prefill step's end (the running state after the step; the step
  loop records these as ``chunk_ends``), and
* at each Mamba group's *internal prefill checkpoint* (vLLM 0.32.0+), which
  the attention backends place with ``MambaPrefillCheckpointBuilder.build``
  (``model_executor/layers/mamba/checkpoint.py``): nothing unless the cache
  mode is ``align`` and the group's spec reserves checkpoint blocks
  (``num_prefill_checkpoint_blocks``); else vLLM's own
  ``compute_mamba_prefill_checkpoints`` with the step's sequence and query
  lengths and the worker's cache config: ``hash_block_size`` and
  ``cache_hit_alignment_tokens`` as ``gpu_worker`` copies them from the KV
  cache config the engine core resolved, the spec's block size and
  checkpoint alignment, the drop of the EAGLE block (``use_eagle_block_drop()``,
  and from 0.33.0 only without lookahead block hashes) and, from 0.33.0,
  ``num_hash_lookahead_tokens``.

The placement itself is vLLM's function, called; only those arguments are
read here the way ``build`` reads them (0.32.0, 0.33.0). It observes; it
does not judge. :func:`checkpoint_writer` answers ``None`` where the writes
cannot be observed (a spec reserves checkpoint blocks, but this vLLM has no
``compute_mamba_prefill_checkpoints``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

#: ``[(seq_len, query_len), ...]`` of a request's prefill steps -> the
#: positions every Mamba group writes an internal checkpoint at.
Writer = Callable[[list[tuple[int, int]]], set[int]]


def no_checkpoints(_steps: list[tuple[int, int]]) -> set[int]:
    return set()


def checkpoint_writer(built: dict) -> Writer | None:
    """The :data:`Writer` of what ``setup`` built (its ``vllm_config``,
    ``groups``, ``hash_block_size``, ``alignment_tokens``): the
    intersection over the Mamba groups (a hit needs every group's state),
    or None (unobservable)."""
    placed = _placement(built)
    if placed is None:
        return no_checkpoints  # some group writes none: the intersection is empty
    if placed is False:
        return None
    compute, exporting, hash_block_size, alignment, drop, extra = placed
    distinct = list({(s.block_size, s.prefill_checkpoint_alignment): s for s in exporting}.values())
    return _positions(compute, distinct, hash_block_size, alignment, drop, extra)


def _placement(built: dict):
    """``(vLLM's compute_mamba_prefill_checkpoints, the exporting Mamba specs,
    hash block, alignment, drop, extra keyword arguments)`` as
    ``MambaPrefillCheckpointBuilder.build`` passes them, or ``None`` (no
    group writes checkpoints) or ``False`` (unobservable)."""
    from vllm.v1.kv_cache_interface import MambaSpec

    vllm_config = built["vllm_config"]
    mamba = [g.kv_cache_spec for g in built["groups"] if isinstance(g.kv_cache_spec, MambaSpec)]
    exporting = [s for s in mamba if getattr(s, "num_prefill_checkpoint_blocks", 0)]
    if (
        not exporting
        or getattr(vllm_config.cache_config, "mamba_cache_mode", None) != "align"
        or len(exporting) < len(mamba)
    ):
        return None
    try:
        from vllm.model_executor.layers.mamba.checkpoint import compute_mamba_prefill_checkpoints
    except ImportError:
        return False
    hash_block_size, alignment = built["hash_block_size"], built["alignment_tokens"]
    if hash_block_size is None or alignment is None:
        return None  # ``build`` returns None unresolved
    lookahead = int(getattr(vllm_config, "num_hash_lookahead_tokens", 0) or 0)
    spec_config = vllm_config.speculative_config
    drop = spec_config is not None and spec_config.use_eagle_block_drop()
    extra = {}
    if "num_hash_lookahead_tokens" in inspect.signature(compute_mamba_prefill_checkpoints).parameters:
        drop = drop and not lookahead  # 0.33.0: MambaPrefillCheckpointBuilder.__init__
        extra["num_hash_lookahead_tokens"] = lookahead
    return compute_mamba_prefill_checkpoints, exporting, hash_block_size, alignment, drop, extra


def checkpoint_cells(built: dict, spec) -> Callable[[int, int], tuple[int, int] | None] | None:
    """Where the kernel copies the internal prefill checkpoint of one step of
    Mamba spec ``spec``'s group: ``(seq_len, query_len) -> (position, block
    column)`` or None, both as vLLM's own ``compute_mamba_prefill_checkpoints``
    returns them (0.32.0+: ``checkpoint.py:61-62`` in 0.33.0, the column
    ``cdiv(seq_len, M) - 2``, which ``_gather_checkpoint_state_indices``
    turns into the state slot the kernel writes); None where this vLLM has no
    checkpoints or the cells cannot be observed."""
    placed = _placement(built)
    if not placed or not getattr(spec, "num_prefill_checkpoint_blocks", 0):
        return None
    compute, _exporting, hash_block_size, alignment, drop, extra = placed

    def cell(seq_len: int, query_len: int) -> tuple[int, int] | None:
        offsets, cols = compute(
            [seq_len],
            [query_len],
            hash_block_size=hash_block_size,
            mamba_block_size=spec.block_size,
            checkpoint_alignment=spec.prefill_checkpoint_alignment,
            drop_eagle_block=drop,
            cache_hit_alignment_tokens=alignment,
            **extra,
        )
        if offsets[0] > 0 and cols[0] >= 0:
            return seq_len - query_len + offsets[0], int(cols[0])
        return None

    return cell


def _positions(compute_mamba_prefill_checkpoints, distinct, hash_block_size, alignment, drop, extra) -> Writer:

    def positions(steps: list[tuple[int, int]]) -> set[int]:
        """One call per group spec over all the steps (a checkpoint lies
        strictly inside its step's query, so no two steps share one)."""
        if not steps:
            return set()
        seq_lens, query_lens = [q[0] for q in steps], [q[1] for q in steps]
        found: set[int] | None = None
        for s in distinct:
            offsets, _cols = compute_mamba_prefill_checkpoints(
                seq_lens,
                query_lens,
                hash_block_size=hash_block_size,
                mamba_block_size=s.block_size,
                checkpoint_alignment=s.prefill_checkpoint_alignment,
                drop_eagle_block=drop,
                cache_hit_alignment_tokens=alignment,
                **extra,
            )
            mine = {seq - query + o for seq, query, o in zip(seq_lens, query_lens, offsets) if o > 0}
            found = mine if found is None else found & mine
        return found or set()

    return positions


def written(served, writer: Writer) -> list[int]:
    """The positions of the request's prompt where its prefill wrote a Mamba
    state in every group: the chunk ends, every prefill step's end within
    the prompt (a preempted request's recompute ends its chunks where the
    pool lets it, below the first pass's ends, which ``chunk_ends`` keeps
    rising only) and the writer's checkpoints."""
    n = len(served.request.prompt_token_ids)
    ends = (seq for seq, _query in served.prefill_steps if seq <= n)
    return sorted({*served.chunk_ends, *ends, *(p for p in writer(served.prefill_steps) if p <= n)})
