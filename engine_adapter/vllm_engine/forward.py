"""The forward pass stood in along vLLM's data path: where each Mamba state
is written, and what a request resumes from.

kvspec has no GPU and no model weights, so a Mamba state is a *fingerprint*
of the tokens it was computed over (their count and a hash of them). The
stand-in writes each fingerprint into the state slot (a block of the first
Mamba group in align mode) where vLLM's worker-side code writes that state,
never where the scheduler *records* it: a cache that keys a state at one
position while the kernel writes it at another then resumes a request from
a slot holding other tokens, which ``resumed_state`` (``fuzz.oracle_states``)
sees. Each write mirrors one step of the model runner (vLLM 0.33.0; 0.32.0
at the same lines; 0.29.0 where noted):

* **resume** (``preprocess_mamba``, ``v1/worker/mamba_utils.py:1493-1495``;
  0.29.0 ``:1481-1483``): a new or resumed request reads its initial state
  from column ``(num_computed_tokens - 1) // M`` of its block table (M the
  Mamba block size): the block its cache hit supplied. The fingerprint read
  there is the request's ``resumed_state``.
* **the step's running state** (``:1497-1512``; 0.29.0 ``:1485-1500``): the
  step saves its running state in column ``cdiv(computed + scheduled, M) - 1``
  (drafts included); when that differs from the column it read, the state
  is first copied there (``:1517``, ``collect_mamba_copy_meta``; 0.29.0
  ``:1505``), so the old column keeps what it held. The kernel leaves there
  the state over the tokens the step computed and kept (the scheduler's
  ``num_computed_tokens`` after ``update_from_output``: rejected drafts are
  not computed).
* **speculative decoding** (``postprocess_mamba_fused_kernel``,
  ``mamba_utils.py:444-470``; 0.29.0 ``:446-472``): when the accepted
  tokens cross a block boundary b, the state at b is copied into column
  ``b // M - 1``.
* **internal prefill checkpoints** (0.32.0+, ``model_executor/layers/mamba/
  checkpoint.py:61-62`` in 0.33.0, ``:58`` in 0.32.0; none in 0.29.0): the
  kernel copies the state at the checkpoint position into the column vLLM's
  own ``compute_mamba_prefill_checkpoints`` returns
  (:func:`engine_adapter.vllm_engine.writes.checkpoint_cells`), called.
* **copy-on-write** (``gpu_model_runner.py:1203-1212`` in 0.33.0, ``:1203`` in 0.32.0, ``:1233`` in 0.29.0): before
  the forward pass the worker zeroes the step's fresh blocks
  (``new_block_ids_to_zero``) and copies ``kv_cache_block_copies`` (a
  partial hit's shared tail into a private block; a producer's sub-block
  state into the durable block the cache entry moved to,
  ``single_type_kv_cache_manager.py:1883-1893``).
* **a KV connector's load** (``OffloadingConnector``): the stood-in worker
  (``engine_adapter.vllm_engine.connector``) moves no bytes, so a block a
  load filled holds no fingerprint kvspec wrote: a request that resumes
  from one reports ``resumed_state`` ``{"observable": false}`` (the rule is
  then not judged for it; docs/judge.md).

Not observable (documented in docs/judge.md): a Mamba group not in align
mode (``all`` mode keeps a state per block computed by the kernel itself),
and the groups after the first (every Mamba group gets the same block-table
columns, so the first stands for all).

It observes; it never changes what vLLM does (it reads block tables after
``schedule()``, before ``update_from_output()`` frees a finished request's
blocks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def fingerprint(tokens: list[int], count: int) -> tuple[int, int]:
    """The fingerprint of a state computed over ``tokens[:count]``."""
    return count, hash(tuple(tokens[:count]))


class StateSlots:
    """The fingerprints held in the first align-mode Mamba group's blocks,
    by block id, and per request what it resumed from."""

    def __init__(self, scheduler, built: dict) -> None:
        from engine_adapter.vllm_engine.writes import checkpoint_cells

        managers = scheduler.kv_cache_manager.coordinator.single_type_managers
        gids = [g for g in built["mamba_group_ids"] if getattr(managers[g], "mamba_cache_mode", None) == "align"]
        self.manager = managers[gids[0]] if gids else None
        self.block_size = int(self.manager.block_size) if self.manager is not None else 0
        spec = built["groups"][gids[0]].kv_cache_spec if gids else None
        self.cell: Callable[[int, int], tuple[int, int] | None] | None = (
            checkpoint_cells(built, spec) if spec is not None else None
        )
        self.held: dict[int, tuple[int, int] | None] = {}  # block id -> fingerprint (None: filled by a connector load)
        self.column: dict[str, int] = {}  # request -> the column holding its running state
        self.after: dict[str, int] = {}  # request -> tokens computed after its last step
        self.resumed: dict[str, dict[str, Any]] = {}
        self.drafting = int(getattr(scheduler, "num_spec_tokens", 0) or 0) > 0
        self.scheduler = scheduler

    @property
    def active(self) -> bool:
        return self.manager is not None

    def _blocks(self, rid: str) -> list[int]:
        return [b.block_id for b in self.manager.req_to_blocks.get(rid, ())]

    def scheduled(self, so) -> list[tuple]:
        """After ``schedule()``: the resume reads and the running-state
        columns of every scheduled request; returns what
        :meth:`updated` needs once the step's output is processed."""
        M = self.block_size
        todo = []
        # Before the forward pass the worker zeroes freshly allocated blocks
        # and applies the scheduler's copy-on-write copies (a partial hit's
        # tail, a producer's sub-block state moved to a durable block:
        # gpu_model_runner.py:1203-1212, ``kv_cache_block_copies``; 0.32.0
        # the same), then a connector's loads.
        for b in getattr(so, "new_block_ids_to_zero", None) or ():
            self.held[int(b)] = ("unwritten",)
        for copy in getattr(so, "kv_cache_block_copies", None) or ():
            src, dst = int(copy[0]), int(copy[1])
            self.held[dst] = self.held.get(src, ("unwritten",))
        if getattr(so, "kv_connector_metadata", None) is not None:
            self.loaded(so.kv_connector_metadata)
        spec = getattr(so, "scheduled_spec_decode_tokens", None) or {}
        requests = self.scheduler.requests
        for rid, num in so.num_scheduled_tokens.items():
            req = requests.get(rid)
            if req is None:
                continue
            num = int(num)
            c0 = int(req.num_computed_tokens) - num
            blocks = self._blocks(rid)
            prev = self.column.get(rid)
            if (
                prev is None or self.after.get(rid) != c0
            ):  # new, or resumed after a preemption (cleanup_mamba_state_idx)
                prev = (c0 - 1) // M  # mamba_utils.py:1493-1495
                if c0 > 0 and rid not in self.resumed:
                    self.resumed[rid] = self._read(req, blocks, prev, c0)
            curr = -(-(c0 + num) // M) - 1  # mamba_utils.py:1497-1512
            if 0 <= prev < len(blocks) and prev != curr and curr < len(blocks):
                self.held[blocks[curr]] = self.held.get(blocks[prev], ("unwritten",))  # the copy (:1517)
            cell = None
            if self.cell is not None and req.num_output_tokens == 0:
                cell = self.cell(
                    c0 + num, num
                )  # the model runner's seq_len and query_len, as writes.written reads them
            self.column[rid] = curr
            todo.append((rid, req, blocks, curr, c0 + num - len(spec.get(rid) or ()), cell))
        return todo

    def _read(self, req, blocks: list[int], col: int, c0: int) -> dict[str, Any]:
        if col >= len(blocks):
            return {"observable": False, "at": c0, "why": f"no block at column {col}"}
        held = self.held.get(blocks[col])
        if held is None and blocks[col] in self.held:
            return {"observable": False, "at": c0, "why": "filled by a KV connector load (no fingerprint moved)"}
        tokens = list(req.all_token_ids)
        want = fingerprint(tokens, c0)
        if held is None or held == ("unwritten",):
            return {"observable": True, "at": c0, "tokens": None, "same_tokens": False, "column": col}
        return {"observable": True, "at": c0, "tokens": held[0], "same_tokens": held == want, "column": col}

    def updated(self, todo: list[tuple]) -> None:
        """After ``update_from_output()``: the kernel's writes of each
        scheduled request (its running state; a checkpoint; with drafts, the
        state at a crossed block boundary)."""
        M = self.block_size
        for rid, req, blocks, curr, running, cell in todo:
            tokens = list(req.all_token_ids)
            computed = int(req.num_computed_tokens)
            if 0 <= curr < len(blocks):
                self.held[blocks[curr]] = fingerprint(tokens, min(computed, running))
            if cell is not None and 0 <= cell[1] < len(blocks):
                self.held[blocks[cell[1]]] = fingerprint(tokens, cell[0])
            aligned = computed // M * M  # postprocess_mamba_fused_kernel, mamba_utils.py:444-470
            if self.drafting and aligned >= running and 0 <= aligned // M - 1 < len(blocks):
                self.held[blocks[aligned // M - 1]] = fingerprint(tokens, aligned)
            self.after[rid] = computed
            if req.is_finished():
                self.column.pop(rid, None)
                self.after.pop(rid, None)

    def loaded(self, metadata) -> None:
        """Blocks this step's KV connector loads fill (its metadata's load
        jobs' GPU blocks): no fingerprint kvspec wrote."""
        for job in (getattr(metadata, "load_jobs", None) or {}).values():
            for b in getattr(job.dst_spec, "block_ids", ()):
                self.held[int(b)] = None

    def resumed_state(self, rid: str) -> dict[str, Any] | None:
        return self.resumed.get(rid)
