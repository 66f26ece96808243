"""A cache under pressure: the block pool a drawn vLLM deployment case gets.

A case with no pool flag runs on kvspec's pool, sized so that nothing in
its trace is evicted (``engine_adapter.vllm_engine.setup.build_deployment``).
One drawn case in :data:`PRESSURE_ONE_IN` (``--pressure drawn``) pins the
pool instead, with ``--num-gpu-blocks-override P`` (vLLM 0.33.0
arg_utils.py:1399; ``get_kv_cache_configs`` plans P blocks' worth of
memory, kv_cache_planning.py:1515-1530, and the pool has P blocks,
``may_override_num_blocks``, 243-248), at one of :data:`LEVELS`, each
derived from the case's token counts and the resolved KV cache groups,
never from a known bug:

* ``floor``: a pool drawn from the least vLLM's start-up check accepts (one
  request of ``--max-model-len`` tokens as the check budgets it,
  kv_cache_planning.py:50-85, each Mamba group's budget as the engine
  resolved it, :func:`with_budget`) up to what that request holds
  while running (:func:`floor_band`): under async scheduling a step in
  flight keeps a Mamba block per group more than the check budgets
  (:func:`running_blocks`), and a pool the check accepts must serve a lone
  request of that length however the engine schedules it;
* ``one``: room for the longest request alone (a second prompt evicts the
  first; a wave queues or is preempted);
* ``two``: room for the two longest together (a resend with room for both);
* ``half``: the longest and half of what the others need;
* ``room``: what every request needs together (nothing evicted).

A running request of T tokens (prompt and output) holds, per KV cache
group of block size b, what vLLM itself budgets for one request
(``KVCacheSpec.max_memory_usage_bytes``, 0.33.0 kv_cache_interface.py):
full attention ``ceil((T + K) / b)`` blocks (K :data:`SLACK_TOKENS`, the
speculative slots a step may add), a Mamba group in align mode
``2 + num_speculative_blocks + num_prefill_checkpoint_blocks``
(kv_cache_interface.py:1135-1141), as the engine resolved it
(:func:`with_budget`; where it did not say, :data:`MAMBA_RUNNING_BLOCKS`,
:func:`running_blocks`). Once it has finished, what it leaves cached is
at most its full-attention blocks and one Mamba state per block boundary
(dense retention: :func:`kept_blocks`). Every group draws from one pool
(vLLM's hybrid coordinator: kv_cache_coordinator.py:120, one
``BlockPool``), so a request's need is the sum over the groups, each
counted ``count`` times.

vLLM refuses a pool that cannot hold one request of ``max_model_len``
tokens (kv_cache_planning.py:50-85 and 1554, "larger than the available KV
cache memory"): a pinned pool comes with ``--max-model-len``, the longest
request rounded up to the scheduler block (and :data:`SLACK_TOKENS`), at
most the deployment's own (:class:`Sizing`), and where vLLM still refuses
the pair, the case keeps kvspec's pool.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: Pool levels, tightest first (module docstring).
LEVELS = ("floor", "one", "two", "half", "room")
#: ``--pressure`` values: ``drawn`` (one case in :data:`PRESSURE_ONE_IN`),
#: ``always`` (every case a level), ``none``.
PRESSURE_MODES = ("drawn", "always", "none")
PRESSURE_ONE_IN = 10
#: Token slots a step may add past a request's tokens (drafts, lookahead).
SLACK_TOKENS = 4
#: Blocks a Mamba group holds for one running request in align mode, at
#: most, where the engine did not say (:func:`with_budget`): vLLM's 2 +
#: speculative blocks + prefill checkpoint blocks
#: (kv_cache_interface.py:1135-1141; 5 is what vLLM 0.33.0 budgets for the
#: drawn MTP deployments: its refusals of a smaller pool say so).
MAMBA_RUNNING_BLOCKS = 5
#: The block vLLM's pool holds back (the null block: kv_cache_planning.py
#: "Reserve the null block BlockPool permanently holds back", 1532-1543).
NULL_BLOCKS = 1
POOL_FLAG = "--num-gpu-blocks-override"


def running_blocks(tokens: int, groups: Sequence[dict], in_flight: bool = False) -> int:
    """Blocks of the one pool a running request of ``tokens`` tokens holds
    at most (module docstring). ``in_flight``: the deployment overlaps steps
    (async scheduling): vLLM frees skipped blocks on the processed-token
    basis, leaving out the step in flight (0.33.0 kv_cache_manager.py:561-567),
    so a Mamba group in align mode holds one block more while the next step
    is scheduled."""
    total = 0
    for g in groups:
        if g["kind"] == "mamba":
            per = int(g.get("request_blocks") or MAMBA_RUNNING_BLOCKS) + (1 if in_flight else 0)
        else:
            per = math.ceil((tokens + SLACK_TOKENS) / int(g["block_size"]))
        total += per * int(g.get("count", 1))
    return total


def with_budget(groups: Sequence[dict], request_blocks: int | None) -> Sequence[dict]:
    """``groups`` with each Mamba group's ``request_blocks``: the blocks
    vLLM's start-up check budgets one request there, as the engine resolved
    it (``mamba_request_blocks``); without it, :data:`MAMBA_RUNNING_BLOCKS`."""
    if not request_blocks:
        return groups
    return [{**g, "request_blocks": int(request_blocks)} if g["kind"] == "mamba" else g for g in groups]


def kept_blocks(tokens: int, groups: Sequence[dict]) -> int:
    """Blocks a finished request of ``tokens`` tokens may leave cached at
    most: every full block of every group (dense retention keeps a Mamba
    state per block boundary)."""
    return sum(tokens // int(g["block_size"]) * int(g.get("count", 1)) for g in groups)


@dataclass(frozen=True)
class Sizing:
    """What a pinned pool is sized on: the requests' token counts
    (``lengths``), the resolved KV cache groups (:func:`with_budget`'s), the
    scheduler ``block``, whether the deployment overlaps steps
    (``in_flight``: async scheduling), and the longest ``--max-model-len``
    it takes (``limit``: its resolved ``max_model_len``, past which vLLM
    refuses a user's value; None: none)."""

    lengths: tuple[int, ...]
    groups: tuple[dict, ...]
    block: int = 1
    in_flight: bool = False
    limit: int | None = None

    @classmethod
    def of(cls, lengths: list[int], info: dict) -> Sizing:
        """The sizing of requests of ``lengths`` tokens on a deployment as
        a campaign's resolver states it (``fuzz.driving.campaign``: groups,
        Mamba budget, block, async scheduling, max_model_len)."""
        return cls(
            lengths=tuple(lengths),
            groups=tuple(with_budget(info["groups"], info.get("mamba_request_blocks"))),
            block=int(info["block"]),
            in_flight=bool(info.get("async_scheduling")),
            limit=info.get("max_model_len"),
        )

    @property
    def max_model_len(self) -> int:
        """The ``--max-model-len`` a pinned pool comes with: the longest
        request and :data:`SLACK_TOKENS`, rounded up to the scheduler block,
        at most ``limit`` (vLLM 0.33.0 refuses a user's max_model_len past
        the model's derived one, config/model.py ``get_and_verify_max_len``)."""
        rounded = math.ceil((max(self.lengths) + SLACK_TOKENS) / self.block) * self.block
        return min(rounded, self.limit) if self.limit else rounded


def floor_band(s: Sizing) -> tuple[int, int]:
    """The ``floor`` level's pools (blocks), least and most: the start-up
    check's budget of one request of :attr:`Sizing.max_model_len` tokens
    (:func:`running_blocks` with no step in flight), and what that request
    holds while running (with a step in flight where the deployment
    overlaps steps). Where steps do not overlap the two are one pool."""
    tokens = s.max_model_len - SLACK_TOKENS
    return NULL_BLOCKS + running_blocks(tokens, s.groups), NULL_BLOCKS + running_blocks(tokens, s.groups, s.in_flight)


def pool_for(level: str, s: Sizing) -> int:
    """The pool (blocks) of ``level``: ``floor`` the least of
    :func:`floor_band`, ``one``, ``two`` and ``half`` count running requests
    (:func:`running_blocks`), ``room`` adds what each leaves cached
    (:func:`kept_blocks`); each with vLLM's null block."""
    if level not in LEVELS:
        raise ValueError(f"level={level!r}: allowed: {', '.join(LEVELS)}")
    if level == "floor":
        return floor_band(s)[0]
    needs = sorted((running_blocks(n, s.groups, s.in_flight) for n in s.lengths), reverse=True)
    if level == "one":
        return NULL_BLOCKS + needs[0]
    if level == "two":
        return NULL_BLOCKS + sum(needs[:2])
    if level == "half":
        return NULL_BLOCKS + needs[0] + math.ceil(sum(needs[1:]) / 2)
    return NULL_BLOCKS + sum(needs) + sum(kept_blocks(n, s.groups) for n in s.lengths)


def level_of(pool: int, s: Sizing) -> str | None:
    """The level a pinned pool of ``pool`` blocks was drawn at: the
    tightest whose pool (or band, for ``floor``) holds it; None for none."""
    for level in LEVELS:
        least, most = floor_band(s) if level == "floor" else (pool_for(level, s),) * 2
        if least <= pool <= most:
            return level
    return None


def draw_pool(c, level: str, s: Sizing) -> int:
    """The pool of ``level`` (:func:`pool_for`); at ``floor``, one drawn
    from ``c`` across :func:`floor_band` (one draw, made only where the
    band holds more than one pool)."""
    if level == "floor":
        least, most = floor_band(s)
        return c.integer(least, most) if most > least else least
    return pool_for(level, s)


def pressure_flags(pool: int, s: Sizing) -> list[str]:
    """The flags that pin the pool at ``pool`` blocks: ``--num-gpu-blocks-override``
    and the ``--max-model-len`` vLLM needs to accept it (:attr:`Sizing.max_model_len`)."""
    return [POOL_FLAG, str(pool), "--max-model-len", str(s.max_model_len)]


#: One drawn case in :data:`SYNC_ONE_IN` on a deployment that resolves
#: async scheduling (vLLM 0.33.0's default on CUDA, config/vllm.py:1685-1719)
#: runs with ``--no-async-scheduling`` instead: the plain ``Scheduler``
#: (config/scheduler.py:231-238), each step's output processed before the
#: next is scheduled (core.py:667-697).
SYNC_ONE_IN = 4
SYNC_FLAG = "--no-async-scheduling"


def draw_scheduling(c, resolved_async: bool) -> list[str]:
    """The scheduling flag a case gets: ``--no-async-scheduling`` one time in
    :data:`SYNC_ONE_IN` where the deployment resolves async scheduling
    (drawn always, so the stream stays put either way), else none."""
    off = c.integer(0, SYNC_ONE_IN - 1) == 0
    return [SYNC_FLAG] if resolved_async and off else []


def draw_level(c, mode: str) -> str | None:
    """The level a case gets under ``--pressure mode`` (None: kvspec's pool)."""
    if mode not in PRESSURE_MODES:
        raise ValueError(f"pressure={mode!r}: allowed: {', '.join(PRESSURE_MODES)}")
    drawn, level = c.integer(0, PRESSURE_ONE_IN - 1) == 0, c.choice(LEVELS)  # both always drawn
    if mode == "always" or (mode == "drawn" and drawn):
        return level
    return None


def without_flags(args: list[str], flags: tuple[str, ...]) -> list[str]:
    """A copy of ``args`` without each of ``flags`` and the value after it."""
    out = list(args)
    for flag in flags:
        if flag in out:
            at = out.index(flag)
            del out[at : at + 2]
    return out


def strip_pool(args: list[str]) -> list[str]:
    """``args`` without a pinned pool (the pool flag and the
    ``--max-model-len`` drawn with it), for another trace on the deployment."""
    if POOL_FLAG not in args:
        return args
    return without_flags(args, (POOL_FLAG, "--max-model-len"))
