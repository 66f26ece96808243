"""The forward pass stood in along vLLM's data path: where each Mamba state
is written, and what a request resumes from.

kvspec has no GPU and no model weights, so a Mamba state is a *fingerprint*
of the tokens it was computed over (their count and a hash of them). The
stand-in writes each fingerprint into the state slot (a block of the first
Mamba group in align mode) where vLLM's worker-side code writes that state,
never where the scheduler *records* it: a cache that keys a state at one
position while the kernel writes it at another then resumes a request from
a slot holding other tokens, which ``resumed_state`` (``fuzz.judge.oracle_states``)
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
* **a KV connector's stores and loads** (``OffloadingConnector``; 0.33.0):
  a store copies the GPU blocks of its job after the forward pass of the
  step that issued it (``OffloadingConnector.wait_for_save`` queues it,
  ``offloading_connector.py:134-138``; the next step's
  ``start_kv_transfers`` submits it behind the compute stream,
  ``offloading/worker.py:246-251``, ``kv_offload/cpu/gpu_worker.py:694``),
  and a load copies CPU chunks into GPU blocks before the forward pass
  (``start_load_kv``, ``offloading_connector.py:117-120``). The stood-in
  worker (``engine_adapter.vllm_engine.connector``) moves no bytes, so the
  stand-in moves the fingerprints instead, cell by cell as the worker's
  ``transfer_async`` pairs them (``gpu_worker.py:629-660``: per group, the
  group's GPU blocks, logical index ``block_indices[g] + k``, go to CPU chunk
  ``cpu[off + (b % P + k) // P]`` at sub-block ``(b + k) % P``, P the
  ``blocks_per_chunk``): a load carries the fingerprint its chunk's store
  carried (the state the saving request held there), so a load of a state
  over other tokens is judged by ``resumed_state`` as a local hit is. A
  chunk no store kvspec saw filled holds no fingerprint: a request resuming
  from it reports ``resumed_state`` ``{"observable": false}``.

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


def transfer_cells(job, group: int, blocks_per_chunk: int, gpu_to_cpu: bool) -> list[tuple[int, tuple[int, int]]]:
    """``(GPU block id, (CPU chunk, sub-block))`` for each block of KV cache
    group position ``group`` that one connector transfer job moves, paired
    as vLLM 0.33.0's ``CpuGpuOffloadingHandler.transfer_async`` pairs them
    (``kv_offload/cpu/gpu_worker.py:629-660``): the job's GPU spec lists each
    group's blocks in turn (``group_sizes``), the first at logical index
    ``block_indices[g]``; the CPU spec lists each group's chunks in turn, a
    chunk holding ``blocks_per_chunk`` logical blocks."""
    gpu = job.src_spec if gpu_to_cpu else job.dst_spec
    cpu = job.dst_spec if gpu_to_cpu else job.src_spec
    sizes, starts = list(getattr(gpu, "group_sizes", None) or [len(gpu.block_ids)]), None
    starts = list(getattr(gpu, "block_indices", None) or [0] * len(sizes))
    P = max(int(blocks_per_chunk), 1)
    gpu_ids, cpu_ids = [int(b) for b in gpu.block_ids], [int(b) for b in cpu.block_ids]
    g_off = c_off = 0
    cells: list[tuple[int, tuple[int, int]]] = []
    for g, (n, b) in enumerate(zip(sizes, starts)):
        n, b = int(n), int(b)
        if n == 0:
            continue
        if g == group:
            for k in range(n):
                c = c_off + (b % P + k) // P
                if g_off + k < len(gpu_ids) and c < len(cpu_ids):
                    cells.append((gpu_ids[g_off + k], (cpu_ids[c], (b + k) % P)))
        g_off += n
        c_off += -(-(n + b % P) // P)
    return cells


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
        self.held: dict[
            int, tuple | None
        ] = {}  # block id -> fingerprint (None: loaded from a chunk kvspec saw no store fill)
        self.column: dict[str, int] = {}  # request -> the column holding its running state
        self.after: dict[str, int] = {}  # request -> tokens computed after its last step
        self.resumed: dict[str, dict[str, Any]] = {}
        self.drafting = int(getattr(scheduler, "num_spec_tokens", 0) or 0) > 0
        self.scheduler = scheduler
        self.stored: dict[tuple[int, int], tuple | None] = {}  # (CPU chunk, sub-block) -> what a store copied there
        self.storing: list = []  # this step's store jobs, copied after its forward pass
        self.connector_group, self.blocks_per_chunk = self._connector_layout(scheduler, gids[0] if gids else None)
        # Under async scheduling a step is scheduled while the previous one is
        # in flight (``EngineCore.step_with_batch_queue``, vLLM 0.33.0
        # core.py:708-824), but the device runs the steps in order: a step's
        # pre-forward writes and reads come after the previous step's kernel.
        # So what a step reads from the scheduler is taken when it is
        # scheduled, and it runs (:meth:`_run`) once the step before it has
        # written (``waiting``: scheduled steps not yet run).
        vc = getattr(scheduler, "vllm_config", None)
        self.overlapped = int(getattr(vc, "max_concurrent_batches", 1) or 1) > 1 if vc is not None else False
        self.waiting: list[dict] = []

    @staticmethod
    def _connector_layout(scheduler, gid: int | None) -> tuple[int | None, int]:
        """(the first align group's position in the offloading connector's
        transfer specs, its ``blocks_per_chunk``); (None, 1) without one."""
        connector = getattr(scheduler, "connector", None)
        side = getattr(connector, "connector_scheduler", None) or connector
        config = getattr(side, "config", None)
        groups = getattr(config, "kv_group_configs", None)
        if gid is None or not groups:
            return None, 1
        order = [int(getattr(g, "group_idx", i)) for i, g in enumerate(groups)]
        return (order.index(gid) if gid in order else None), int(getattr(config, "blocks_per_chunk", 1) or 1)

    @property
    def active(self) -> bool:
        """Whether the states are stood in: an align-mode Mamba group, and not
        async scheduling with drafts. There the scheduler counts a step's
        drafts as computed until the step's output rolls them back
        (``update_from_output``, vLLM 0.33.0 scheduler.py:2356-2365), while
        the next step is already scheduled from the optimistic count; the
        worker corrects its positions on the device, which this stand-in does
        not model, so what the kernel wrote is left unobserved rather than
        guessed (no ``resumed_state`` read)."""
        return self.manager is not None and not (self.overlapped and self.drafting)

    def _blocks(self, rid: str) -> list[int]:
        return [b.block_id for b in self.manager.req_to_blocks.get(rid, ())]

    def scheduled(self, so) -> dict:
        """After ``schedule()``: what the step reads from the scheduler (each
        scheduled request's tokens computed before it, its blocks, whether
        it is prefilling), run at once where no step is in flight, else once
        the one before it has written; returns what :meth:`updated` needs
        once the step's output is processed."""
        requests = self.scheduler.requests
        rows = []
        for rid, num in so.num_scheduled_tokens.items():
            req = requests.get(rid)
            if req is None:
                continue
            num = int(num)
            c0 = int(req.num_computed_tokens) - num
            prefill = req.num_output_tokens == 0 and c0 < req.num_prompt_tokens
            rows.append((rid, req, num, c0, self._blocks(rid), prefill))
        step = {"so": so, "rows": rows, "todo": None}
        self.waiting.append(step)
        if len(self.waiting) == 1:
            self._run(step)
        return step

    def _run(self, step: dict) -> None:
        """The step on the device, before its kernel: the resume reads and
        the running-state columns of every scheduled request."""
        so, M, todo = step["so"], self.block_size, []
        for rid in getattr(so, "preempted_req_ids", None) or ():  # resumed from scratch (scheduler.py:1799-1844)
            self.column.pop(rid, None)
            self.after.pop(rid, None)
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
        self.storing = []
        if getattr(so, "kv_connector_metadata", None) is not None:
            self.loaded(so.kv_connector_metadata)
        spec = getattr(so, "scheduled_spec_decode_tokens", None) or {}
        for rid, req, num, c0, blocks, prefill in step["rows"]:
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
            if self.cell is not None and prefill:
                cell = self.cell(
                    c0 + num, num
                )  # the model runner's seq_len and query_len, as writes.written reads them
            self.column[rid] = curr
            todo.append((rid, req, blocks, curr, c0 + num - len(spec.get(rid) or ()), cell))
        step["todo"], step["storing"] = todo, self.storing

    def _read(self, req, blocks: list[int], col: int, c0: int) -> dict[str, Any]:
        if col >= len(blocks):
            return {"observable": False, "at": c0, "why": f"no block at column {col}"}
        held = self.held.get(blocks[col])
        if held is None and blocks[col] in self.held:
            return {
                "observable": False,
                "at": c0,
                "why": "loaded by a KV connector from a chunk no store kvspec saw filled",
            }
        tokens = list(req.all_token_ids)
        want = fingerprint(tokens, c0)
        if held is None or held == ("unwritten",):
            return {"observable": True, "at": c0, "tokens": None, "same_tokens": False, "column": col}
        return {"observable": True, "at": c0, "tokens": held[0], "same_tokens": held == want, "column": col}

    def updated(self, step: dict) -> None:
        """After ``update_from_output()``: the kernel's writes of each
        scheduled request (its running state; a checkpoint; with drafts, the
        state at a crossed block boundary); then the next scheduled step
        runs, where one waits."""
        M = self.block_size
        if step["todo"] is None:
            self._run(step)
        self.waiting.remove(step)
        self.storing = step["storing"]
        for rid, req, blocks, curr, running, cell in step["todo"]:
            tokens = list(req.all_token_ids)
            # in flight, the scheduler may have advanced the request for a
            # later step (or reset it, preempted): the kernel wrote ``running``
            computed = running if self.overlapped else int(req.num_computed_tokens)
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
        self.stored_after_forward()
        if self.waiting:
            self._run(self.waiting[0])

    def loaded(self, metadata) -> None:
        """Before the forward pass: each load job of this step's connector
        metadata fills its GPU blocks with what its CPU chunks hold (the
        fingerprint a store copied there; None where no store kvspec saw
        did). Its store jobs are kept for :meth:`stored_after_forward`."""
        self.storing = list((getattr(metadata, "store_jobs", None) or {}).values())
        for job in (getattr(metadata, "load_jobs", None) or {}).values():
            if self.connector_group is None:
                for b in getattr(job.dst_spec, "block_ids", ()):
                    self.held[int(b)] = None
                continue
            for gpu, cell in transfer_cells(job, self.connector_group, self.blocks_per_chunk, gpu_to_cpu=False):
                self.held[gpu] = self.stored.get(cell)

    def stored_after_forward(self) -> None:
        """After the forward pass of the step that issued them: each store
        job copies its GPU blocks' fingerprints into its CPU chunks."""
        jobs, self.storing = self.storing, []
        if self.connector_group is None:
            return
        for job in jobs:
            for gpu, cell in transfer_cells(job, self.connector_group, self.blocks_per_chunk, gpu_to_cpu=True):
                self.stored[cell] = self.held.get(gpu, ("unwritten",))

    def resumed_state(self, rid: str) -> dict[str, Any] | None:
        return self.resumed.get(rid)
