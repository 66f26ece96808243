"""A cache under pressure, observed: what each request's allocation evicted
from vLLM's prefix cache, and when the scheduler preempted and resumed it.

* **Evictions.** vLLM evicts a cached block when ``BlockPool.get_new_blocks``
  hands it out again (0.33.0 block_pool.py:706-739: ``_maybe_evict_cached_block``
  drops every hash the block carries, 769-790, and emits its ``BlockRemoved``
  events, 651-663). :class:`Evictions` wraps two *instance* methods, the
  pool's ``_maybe_evict_cached_block`` (the hashes a block carried, when it
  returns True) and the manager's ``allocate_slots`` (which request's
  allocation ran: 0.33.0 kv_cache_manager.py:380), and maps each evicted
  hash back to the request whose block hashes hold it and the token count
  the block ends at (a group whose block spans several hash blocks carries
  their concatenation, 0.33.0 kv_cache_utils.py ``BlockHashListWithBlockSize``:
  its last hash block names it).
* **Preemption.** Every ``SchedulerOutput`` names the requests the step
  preempted (``preempted_req_ids``, 0.33.0 sched/output.py:274-276, set by
  ``_preempt_request``, scheduler.py:1799-1844, which frees the request's
  blocks and sends it back to the waiting queue with no computed tokens: it
  resumes by recomputing its prompt and its output); the step loop records
  those steps and the next step that schedules the request again
  (``engine_adapter.vllm_engine.steploop``).

It observes only: an exception in kvspec's bookkeeping is swallowed, never
vLLM's behaviour changed.
"""

from __future__ import annotations

from vllm.v1.core import kv_cache_utils

#: Bytes of a group id appended to a block hash (0.33.0 kv_cache_utils.py:60-79).
_GROUP_ID_BYTES = 4


class Evictions:
    """The cached blocks each request's allocations evicted, per request id."""

    def __init__(self, scheduler, hash_block: int) -> None:
        self.hash_block = hash_block
        kvm = scheduler.kv_cache_manager
        pool = kvm.block_pool
        self.pool = pool
        self.current: str | None = None
        #: evicting request id (None: outside any allocation) -> evicted keys
        self.by_request: dict[str | None, list[bytes]] = {}
        #: every request the manager allocated for, by id (their block hashes name what was evicted)
        self.requests: dict[str, object] = {}
        self._index: dict[bytes, tuple[str, int]] = {}
        self._indexed: dict[str, int] = {}
        original_alloc = kvm.allocate_slots
        original_evict = pool._maybe_evict_cached_block

        def allocate_slots(request, *args, **kwargs):
            before = self.current
            try:
                self.current = request.request_id
                self.requests.setdefault(request.request_id, request)
            except Exception:  # observation must never change behaviour
                pass
            try:
                return original_alloc(request, *args, **kwargs)
            finally:
                self.current = before

        def maybe_evict(block, *args, **kwargs):
            keys: list[bytes] = []
            try:
                if block.block_hash is not None:
                    keys.append(bytes(block.block_hash))
                keys.extend(bytes(k) for k in getattr(pool, "cached_block_hashes_by_block", {}).get(block.block_id, ()))
            except Exception:
                keys = []
            evicted = original_evict(block, *args, **kwargs)
            if evicted and keys:
                self.by_request.setdefault(self.current, []).extend(keys)
            return evicted

        kvm.allocate_slots = allocate_slots
        pool._maybe_evict_cached_block = maybe_evict

    def _refresh_index(self) -> None:
        """Index the block hashes of every request seen (its prompt's and
        its outputs'), keyed by the hash bytes."""
        for rid, req in self.requests.items():
            hashes = getattr(req, "block_hashes", None) or ()
            done = self._indexed.get(rid, 0)
            for i in range(done, len(hashes)):
                self._index.setdefault(bytes(hashes[i]), (rid, i))
            self._indexed[rid] = len(hashes)

    def of(self, request_id: str) -> list[list[int]]:
        """What ``request_id``'s allocations evicted: one row per (owner
        request, KV cache group), ``[owner, group, first end, last end,
        blocks]``: the case index of the request whose block hashes hold the
        evicted blocks (-1: none kvspec saw), the group id, the token counts
        the first and last evicted block end at (hash blocks of
        ``hash_block`` tokens; -1 when the owner is unknown) and how many
        blocks. Sorted; ``[]`` where nothing was evicted."""
        keys = self.by_request.get(request_id)
        if not keys:
            return []
        self._refresh_index()
        width = len(next(iter(self._index), b"")) or None
        rows: dict[tuple[int, int], list[int]] = {}
        for key in keys:
            group = int(kv_cache_utils.get_group_id(key)) if len(key) > _GROUP_ID_BYTES else -1
            block_hash = bytes(key[:-_GROUP_ID_BYTES])
            owner = self._index.get(block_hash[-width:]) if width else None
            if owner is None:
                row = rows.setdefault((-1, group), [-1, group, -1, -1, 0])
                row[4] += 1
                continue
            end = (owner[1] + 1) * self.hash_block
            who = _case_index(owner[0])
            row = rows.setdefault((who, group), [who, group, end, end, 0])
            row[2], row[3], row[4] = min(row[2], end), max(row[3], end), row[4] + 1
        return sorted(rows.values())


def _case_index(request_id: str) -> int:
    """The case index of ``req-{i}`` (the step loops' request ids), else -1."""
    head, _, tail = request_id.partition("-")
    return int(tail) if head == "req" and tail.isdigit() else -1
