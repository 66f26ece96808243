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

* ``one``: room for the longest request alone (a second prompt evicts the
  first; a wave queues or is preempted);
* ``two``: room for the two longest together (a resend with room for both);
* ``half``: the longest and half of what the others need;
* ``room``: what every request needs together (nothing evicted).

A request of T tokens (prompt and output) holds, per KV cache group of
block size b, ``ceil((T + K) / b)`` blocks (:func:`request_blocks`; K
:data:`SLACK_TOKENS`, the speculative slots a step may add), and a Mamba
group in align mode ``K + 2`` more (the running state, the one it resumes
from, the speculative ones: vLLM 0.33.0 ``MambaManager``,
single_type_kv_cache_manager.py). Every group draws from one pool (vLLM's
hybrid coordinator: kv_cache_coordinator.py:120, one ``BlockPool``), so
the pool a request needs is the sum over the groups, each counted
``count`` times.

vLLM refuses a pool that cannot hold one request of ``max_model_len``
tokens (kv_cache_planning.py:50-85 and 1554, "larger than the available KV
cache memory"): a pinned pool comes with ``--max-model-len``, the longest
request rounded up to the scheduler block (and :data:`SLACK_TOKENS`), and
where vLLM still refuses the pair, the case keeps kvspec's pool.
"""

from __future__ import annotations

import math

#: Pool levels, tightest first (module docstring).
LEVELS = ("one", "two", "half", "room")
#: ``--pressure`` values: ``drawn`` (one case in :data:`PRESSURE_ONE_IN`),
#: ``always`` (every case a level), ``none``.
PRESSURE_MODES = ("drawn", "always", "none")
PRESSURE_ONE_IN = 6
#: Token slots a step may add past a request's tokens (drafts, lookahead).
SLACK_TOKENS = 4
POOL_FLAG = "--num-gpu-blocks-override"


def request_blocks(tokens: int, groups: list[dict]) -> int:
    """Blocks of the one pool a request of ``tokens`` tokens holds at most
    (module docstring): per group ``ceil((tokens + K) / block)``, plus
    ``K + 2`` for a Mamba group, times the group's count."""
    total = 0
    for g in groups:
        per = math.ceil((tokens + SLACK_TOKENS) / int(g["block_size"]))
        if g["kind"] == "mamba":
            per += SLACK_TOKENS + 2
        total += per * int(g.get("count", 1))
    return total


def pool_for(level: str, lengths: list[int], groups: list[dict]) -> int:
    """The pool (blocks) of ``level`` for requests of ``lengths`` tokens."""
    if level not in LEVELS:
        raise ValueError(f"level={level!r}: allowed: {', '.join(LEVELS)}")
    needs = sorted((request_blocks(n, groups) for n in lengths), reverse=True)
    if level == "one":
        return needs[0]
    if level == "two":
        return sum(needs[:2])
    if level == "half":
        return needs[0] + math.ceil(sum(needs[1:]) / 2)
    return sum(needs)


def pressure_flags(level: str, lengths: list[int], groups: list[dict], block: int) -> list[str]:
    """The flags that pin the pool at ``level``: ``--num-gpu-blocks-override``
    and the ``--max-model-len`` vLLM needs to accept it (the longest request
    and :data:`SLACK_TOKENS`, rounded up to the scheduler ``block``)."""
    longest = max(lengths) + SLACK_TOKENS
    max_len = math.ceil(longest / block) * block
    return [POOL_FLAG, str(pool_for(level, lengths, groups)), "--max-model-len", str(max_len)]


def draw_level(c, mode: str) -> str | None:
    """The level a case gets under ``--pressure mode`` (None: kvspec's pool)."""
    if mode not in PRESSURE_MODES:
        raise ValueError(f"pressure={mode!r}: allowed: {', '.join(PRESSURE_MODES)}")
    drawn, level = c.integer(0, PRESSURE_ONE_IN - 1) == 0, c.choice(LEVELS)  # both always drawn
    if mode == "always" or (mode == "drawn" and drawn):
        return level
    return None


def strip_pool(args: list[str]) -> list[str]:
    """``args`` without a pinned pool (the pool flag and the
    ``--max-model-len`` drawn with it), for another trace on the deployment."""
    if POOL_FLAG not in args:
        return args
    out = list(args)
    for flag in (POOL_FLAG, "--max-model-len"):
        if flag in out:
            at = out.index(flag)
            del out[at : at + 2]
    return out
