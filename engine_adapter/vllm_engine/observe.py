"""What kvspec observes of vLLM, per request, without changing it.

* :class:`Recorder` wraps two *instance* methods (never vLLM's classes):
  ``KVCacheManager.get_computed_blocks`` (the hit, the junction and each
  full-attention group's number of hit blocks at admission) and the first
  Mamba manager's ``cache_blocks`` (its ``num_tokens`` and
  ``replay_boundaries``);
* :func:`read_knobs` reads the knobs the built objects hold;
* :class:`RetainedScan` lists, after a request finished, which of its prompt
  states the block pool holds per Mamba group (``retained_mamba_blocks``);
* :class:`BlockTable` counts, after each step is scheduled, the Mamba
  blocks a running request holds below the state the step starts from,
  and those it holds that were freed (``block_table``), and, once a
  request has finished, the block references left (``leaked_blocks``);
* :func:`explain` assembles the per-request record.
"""

from __future__ import annotations

import inspect
from itertools import compress, repeat

from vllm.v1.core import kv_cache_utils
from vllm.v1.core.sched.scheduler import Scheduler

from reference.tokens import OUTPUT_TOKEN

#: The token the stood-in sampler samples: the case's output token
#: (``reference.tokens.OUTPUT_TOKEN``), so an output segment of a case
#: quotes exactly what the engine generated.
SAMPLED_TOKEN = OUTPUT_TOKEN


class Recorder:
    """What the wrapped vLLM methods were called with / returned, per request."""

    def __init__(self) -> None:
        self.lookups: dict[str, list[tuple[int, int]]] = {}
        #: per request, at its first lookup: [block size, blocks taken] of
        #: each full-attention group's cache hit
        self.attention_blocks: dict[str, list[list[int]]] = {}
        self.cache_calls: dict[str, list[tuple]] = {}

    def wrap(self, scheduler: Scheduler, mamba_group_ids: list[int]) -> None:
        kvm = scheduler.kv_cache_manager
        original_lookup = kvm.get_computed_blocks
        attention = [
            (gid, int(m.block_size))
            for gid, m in enumerate(kvm.coordinator.single_type_managers)
            if type(getattr(m, "kv_cache_spec", None)).__name__ == "FullAttentionSpec"
        ]

        def get_computed_blocks(request, *args, **kwargs):
            out = original_lookup(request, *args, **kwargs)
            try:
                num_tokens = int(out[1])
                spb = int(out[2]) if len(out) > 2 else None
                rid = request.request_id
                if rid not in self.lookups:
                    groups = out[0].blocks
                    self.attention_blocks[rid] = [[bs, len(groups[gid])] for gid, bs in attention]
                self.lookups.setdefault(rid, []).append((num_tokens, spb))
            except Exception:  # observation must never change behaviour
                pass
            return out

        kvm.get_computed_blocks = get_computed_blocks
        managers = kvm.coordinator.single_type_managers
        for gid in mamba_group_ids[:1]:  # every Mamba group gets the same calls
            manager = managers[gid]
            original_cache = manager.cache_blocks
            calls = self.cache_calls

            def cache_blocks(request, num_tokens, *args, _orig=original_cache, **kwargs):
                # Record the raw values (converted once per request, in
                # ``cache_blocks_of``): this runs on every step.
                try:
                    rb = kwargs.get("replay_boundaries")
                    calls.setdefault(request.request_id, []).append((num_tokens, None if rb is None else tuple(rb)))
                except Exception:
                    pass
                return _orig(request, num_tokens, *args, **kwargs)

            manager.cache_blocks = cache_blocks

    def cache_blocks_of(self, request_id: str) -> tuple[list[int], list[int] | None]:
        """(``num_tokens`` of each Mamba ``cache_blocks`` call of the request,
        the positive ``replay_boundaries`` handed to them, sorted, or None
        when no call carried any: vLLM before 0.30.0)."""
        calls = self.cache_calls.get(request_id, ())
        boundaries = None
        if any(rb is not None for _, rb in calls):
            boundaries = sorted({int(b) for _, rb in calls for b in (rb or ()) if b > 0})
        return [int(n) for n, _ in calls], boundaries


class BlockTable:
    """Two counts read from a running request's Mamba block tables after a
    step is scheduled (align mode; ``None`` managers are left out).

    In align mode vLLM keeps, per request and Mamba group, one block per
    state the request may still read; ``remove_skipped_blocks`` runs first
    in every ``allocate_slots`` and gives back every block below column
    ``(s - 1) // M`` (``MambaManager.get_num_skipped_tokens``: "Mamba only
    need to keep the state of the last computed token"; ``s`` the tokens
    computed before the step, ``M`` the Mamba block size). Counted:
    *unretired*, a block there that is not the null block and carries no
    block hash (no later request can hit it either); *freed*, a block
    anywhere in the table, not the null block, whose reference count is
    below 1 (the pool may hand it to another request while this one still
    reads or writes it)."""

    def __init__(self, scheduler: Scheduler, mamba_group_ids: list[int]) -> None:
        managers = scheduler.kv_cache_manager.coordinator.single_type_managers
        self.managers = [
            (managers[g], int(managers[g].block_size))
            for g in mamba_group_ids
            if getattr(managers[g], "mamba_cache_mode", None) == "align"
        ]
        self.scheduler = scheduler

    def leaked(self) -> int:
        """Block references left once the scheduler holds no request: the
        reference counts of the pool's blocks (every KV cache group's; the
        null block left out) less the blocks waiting in the scheduler's
        ``deferred_frees`` (vLLM 0.29.0-0.33.0: returned to the pool once the
        step that may still write them is processed). A finished request
        gives back every block it took (``KVCacheManager.free``: cached ones
        stay in the free queue, evictable), so anything left is a block no
        request can use again."""
        pool = self.scheduler.kv_cache_manager.block_pool
        held = sum(b.ref_cnt for b in pool.blocks if b.ref_cnt > 0 and not b.is_null)
        pending = sum(len(blocks) for _fence, blocks in getattr(self.scheduler, "deferred_frees", ()))
        return held - pending

    def __call__(self, request_id: str, start: int) -> tuple[int, int]:
        """(unretired, freed) blocks, summed over the Mamba groups; ``start``
        the request's tokens computed before the step."""
        unretired = freed = 0
        for manager, size in self.managers:
            blocks = manager.req_to_blocks.get(request_id)
            if not blocks:
                continue
            below = (start - 1) // size if start > 0 else 0
            for k, b in enumerate(blocks):
                if b.is_null:
                    continue
                if b.ref_cnt < 1:
                    freed += 1
                if k < below and b.block_hash is None:
                    unretired += 1
        return unretired, freed


def read_knobs(version: str, built: dict) -> dict:
    """The knobs as the built vLLM objects hold them (observed, never inferred)."""
    s: Scheduler = built["scheduler"]
    vc = built["vllm_config"]
    kvm = s.kv_cache_manager
    coord = kvm.coordinator
    spec = vc.speculative_config
    knobs = {
        "version": version,
        "eagle_drop": bool(kvm.use_eagle),
        "scheduler_use_eagle": bool(getattr(s, "use_eagle", False)),
        "hash_lookahead_tokens": int(getattr(s, "num_hash_lookahead_tokens", 0) or 0),
        "scheduler_block_size": int(s.block_size),
        "hash_block_size": int(getattr(s, "hash_block_size", built["hash_block_size"])),
        "alignment": int(getattr(coord, "_cache_hit_alignment_tokens", s.block_size)),
        "cache_hit_alignment_tokens": built["alignment_tokens"],
        "partial_hash_hits": bool(getattr(coord, "enable_partial_hash_hits", False)),
        "eagle_group_ids": sorted(int(i) for i in getattr(coord, "eagle_group_ids", ()) or ()),
        "drop_eagle_group_ids": sorted(int(i) for i in getattr(coord, "drop_eagle_group_ids", ()) or ())
        if hasattr(coord, "drop_eagle_group_ids")
        else None,
        "mamba_drop_eagle_checkpoint_block": [
            bool(getattr(coord.single_type_managers[i], "drop_eagle_checkpoint_block", False))
            for i in built["mamba_group_ids"]
        ],
        "retention_interval": getattr(coord, "retention_interval", None),
        "cache_block_size": int(vc.cache_config.block_size),
        "max_num_scheduled_tokens": int(s.max_num_scheduled_tokens),
        "max_num_seqs": int(vc.scheduler_config.max_num_seqs),
        "num_lookahead_tokens": int(getattr(vc, "num_lookahead_tokens", 0) or 0),
        "num_prefill_lookahead_tokens": int(getattr(vc, "num_prefill_lookahead_tokens", 0) or 0)
        if hasattr(vc, "num_prefill_lookahead_tokens")
        else None,
        "use_eagle_block_drop": bool(spec.use_eagle_block_drop())
        if spec is not None and hasattr(spec, "use_eagle_block_drop")
        else None,
        "use_v2_model_runner": bool(getattr(s, "use_v2_model_runner", False)),
        "coordinator": type(coord).__name__,
        "kv_connector": None if getattr(s, "connector", None) is None else type(s.connector).__name__,
        "num_blocks": built["num_blocks"],
        "max_model_len": built["max_model_len"],
        "ignored_options": built["ignored_options"],
        "sampled_token": SAMPLED_TOKEN,
    }
    return knobs


_PARAMETERS: dict = {}


def _parameters(fn) -> list[str] | None:
    """The parameter names of a (bound) method, read once per function."""
    func = getattr(fn, "__func__", fn)
    if func not in _PARAMETERS:
        try:
            _PARAMETERS[func] = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            _PARAMETERS[func] = None
    return _PARAMETERS[func]


_SUFFIXES: dict[tuple, bytes | None] = {}


def _key_suffix(make_key, gid: int) -> bytes | None:
    """The bytes vLLM's ``make_block_hash_with_group_id`` appends to a hash
    for group ``gid``, when its key is hash + a fixed suffix (probed once
    per process and group)."""
    memo = (make_key, gid)
    if memo not in _SUFFIXES:
        suffix = None
        sample = b"kvspec-key-probe"
        try:
            key = make_key(sample, gid)
            if isinstance(key, bytes) and key.startswith(sample) and make_key(b"x", gid) == b"x" + key[len(sample) :]:
                suffix = bytes(key[len(sample) :])
        except Exception:
            pass
        _SUFFIXES[memo] = suffix
    return _SUFFIXES[memo]


class RetainedScan:
    """Which prompt states the block pool holds, per Mamba group.

    vLLM keys a cached block by hash + group id; when that key is the hash
    bytes followed by a fixed suffix per group (checked on a sample), the
    key is built inline. Asking the map for every hash of every request
    costs in proportion to all the tokens of the trace, so once a trace has
    asked for :data:`INDEX_AFTER` keys, the scan builds its own index of the
    Mamba groups' cached hashes and keeps it up to date by wrapping the
    *instance* methods through which vLLM inserts and removes keys
    (``BlockHashToBlockMap.insert`` / ``.pop``, 0.29.0-0.33.0): one cheap
    step per block vLLM caches. The index is trusted only while the map is
    the same object and holds as many keys as the index counted (a
    ``reset_prefix_cache``, or a write past ``insert``/``pop`` in some
    version, breaks that); otherwise, and where the key layout differs, the
    scan asks the map for each key."""

    #: Keys asked for one by one before the scan switches to its index.
    INDEX_AFTER = 1500

    def __init__(self, scheduler: Scheduler, built: dict) -> None:
        pool = scheduler.kv_cache_manager.block_pool
        self.pool = pool
        self.hbs = built["hash_block_size"]
        self.mamba_gids = built["mamba_group_ids"]
        self.group_bs = {gid: built["groups"][gid].kv_cache_spec.block_size for gid in self.mamba_gids}
        sizes = set(self.group_bs.values())
        self.uniform_bs = sizes.pop() if len(sizes) == 1 else None
        self.map_obj = getattr(pool, "cached_block_hash_to_block", None)
        cache_map = getattr(self.map_obj, "_cache", None)
        self.make_key = getattr(kv_cache_utils, "make_block_hash_with_group_id", None)
        if not isinstance(cache_map, dict) or self.make_key is None:
            cache_map = None
        self.cache_map = cache_map
        self.key_suffix: dict[int, bytes] = {}
        if cache_map is not None:
            for gid in self.mamba_gids:
                suffix = _key_suffix(self.make_key, gid)
                if suffix is not None:
                    self.key_suffix[gid] = suffix
        self.held: dict[int, set] | None = None
        self._count = [0]
        self.asked = 0  # keys asked for one by one
        self.indexable = True

    def _index(self) -> None:
        """Start the incremental index (see the class note) when every Mamba
        group's key is hash + a suffix of one length."""
        self.indexable = False  # one try
        cache_map = self.cache_map
        lengths = {len(x) for x in self.key_suffix.values()}
        if cache_map is None or set(self.key_suffix) != set(self.mamba_gids) or len(lengths) != 1 or 0 in lengths:
            return
        insert, pop = getattr(self.map_obj, "insert", None), getattr(self.map_obj, "pop", None)
        if (
            not callable(insert)
            or not callable(pop)
            or _parameters(insert) != ["key", "block"]
            or _parameters(pop) != ["key", "block_id"]
        ):
            return
        cut = -lengths.pop()
        by_suffix = {suffix: gid for gid, suffix in self.key_suffix.items()}
        held: dict[int, set] = {gid: set() for gid in self.mamba_gids}
        for key in list(cache_map):
            gid = by_suffix.get(key[cut:]) if isinstance(key, bytes) else None
            if gid is not None:
                held[gid].add(key[:cut])
        count = self._count
        count[0] = len(cache_map)
        scan = self

        # vLLM 0.29.0-0.33.0's signatures (checked above); these run for every
        # block vLLM caches or drops, so they are kept flat.
        def on_insert(key, block):
            before = len(cache_map)
            out = insert(key, block)
            if len(cache_map) != before:
                try:
                    count[0] += 1
                    gid = by_suffix.get(key[cut:])
                    if gid is not None:
                        held[gid].add(key[:cut])
                except Exception:  # observation must never change behaviour
                    scan.held = None
            return out

        def on_pop(key, block_id):
            before = len(cache_map)
            out = pop(key, block_id)
            if len(cache_map) != before:
                try:
                    count[0] -= 1
                    gid = by_suffix.get(key[cut:])
                    if gid is not None:
                        held[gid].discard(key[:cut])
                except Exception:
                    scan.held = None
            return out

        self.map_obj.insert, self.map_obj.pop = on_insert, on_pop
        self.held = held

    def _index_valid(self) -> bool:
        return (
            self.held is not None
            and getattr(self.pool, "cached_block_hash_to_block", None) is self.map_obj
            and len(self.cache_map) == self._count[0]
        )

    def positions(self, hashes: list, first: int = 0) -> dict[int, list[int]]:
        """{group id: token counts p (multiples of the hash block) whose state
        is held}, ``hashes[j]`` being the request's hash ``first + j``.

        The membership tests run in C (``map``, ``compress``)."""
        out = {}
        hbs, cache_map, n = self.hbs, self.cache_map, len(hashes)
        steps = range((first + 1) * hbs, (first + n + 1) * hbs, hbs)  # (first + j + 1) * hbs
        if self._index_valid():
            held = self.held
            for gid in self.mamba_gids:
                out[gid] = list(compress(steps, map(held[gid].__contains__, hashes)))
            return out
        self.asked += n * len(self.mamba_gids)
        same_map = cache_map is not None and getattr(self.pool, "cached_block_hash_to_block", None) is self.map_obj
        for gid in self.mamba_gids:
            if same_map:
                suffix = self.key_suffix.get(gid)
                if suffix is not None:
                    keys = map(bytes.__add__, hashes, repeat(suffix, n))
                else:
                    keys = (self.make_key(h, gid) for h in hashes)
                out[gid] = list(compress(steps, map(cache_map.__contains__, keys)))
            else:
                out[gid] = [p for p, h in zip(steps, hashes) if self.pool.get_cached_block(h, [gid]) is not None]
        if self.indexable and self.asked >= self.INDEX_AFTER:
            self._index()
        return out

    def held_after(self, hashes: list, first: int) -> list[int]:
        """The token counts past ``first`` hash blocks (a request's prompt:
        states inside its output) at which any Mamba group holds a state,
        ``hashes`` being the request's block hashes."""
        return sorted(set().union(*self.positions(hashes[first:], first).values()))

    def retained(self, hashes: list) -> tuple[dict[str, list[int]], dict | None, dict | None]:
        """(``retained_mamba_blocks`` by block size, ``retained_mamba_tokens``
        when a held state is not a whole block or the groups disagree, the
        per-group blocks when they disagree)."""
        gids = self.mamba_gids
        tokens = self.positions(hashes)
        if self.uniform_bs is not None:
            # the usual case, kept short (it runs after every request): one
            # Mamba block size and every group holding the same states
            first = tokens[gids[0]]
            for g in gids[1:]:
                if tokens[g] != first:
                    break
            else:
                bs = self.uniform_bs
                partial = any(p % bs for p in first)
                return (
                    {str(bs): [p // bs - 1 for p in first if p % bs == 0]},
                    ({str(g): tokens[g] for g in gids} if partial else None),
                    None,
                )
        by_group = {
            gid: [p // self.group_bs[gid] - 1 for p in tokens[gid] if p % self.group_bs[gid] == 0]
            for gid in self.mamba_gids
        }
        by_size: dict[str, list[int]] = {}
        disagree = False
        for gid in self.mamba_gids:
            key = str(self.group_bs[gid])
            if key in by_size and by_size[key] != by_group[gid]:
                disagree = True
                by_size[key] = sorted(set(by_size[key]) | set(by_group[gid]))
            else:
                by_size.setdefault(key, by_group[gid])
        partial = any(p % self.group_bs[g] for g in self.mamba_gids for p in tokens[g])
        tokens_out = {str(g): tokens[g] for g in self.mamba_gids} if (partial or disagree) else None
        groups_out = {str(g): by_group[g] for g in self.mamba_gids} if disagree else None
        return by_size, tokens_out, groups_out
