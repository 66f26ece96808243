"""The known vLLM bug classes, and how a finding is recognised as one.

A class is named by the rule it breaks, not by a trace: a finding belongs
to it when its oracle, the kind of its first diverging request, the
direction of the error and the deployment's retention, hash unit and
speculative mode say so (:func:`classify`). Nothing here tells a campaign
where to look: ``bench/rediscovery.py`` counts how soon a campaign from an
empty corpus finds each class by itself (time to bug, as FuzzBench and
Magma measure it), and ``examples/README.md`` holds each class's
deployment, cause and fix.

===========================  ========  =========================================
class                        release   recognised by
===========================  ========  =========================================
``resend-53504``             0.29.0    an identical resend hits below the promise
                                       under the EAGLE drop (vLLM #53504)
``aligned-resend``           0.29.0    an identical resend of a block-aligned
                                       prompt hits below the promise without
                                       the drop: the first prefill ran to N,
                                       the resend needs N - block (miss, miss,
                                       hit, as #53504; 0.30.0 too, with the
                                       drop as well)
``hashed-drop-resend``       0.30.0    an identical resend under the EAGLE drop
                                       with a hash unit below the block misses:
                                       the lookup backs off one hash unit below
                                       every place the prefill stopped a chunk
                                       (miss, miss, miss on 0.30.0; 0.29.0 too)
``longer-sibling``           0.33.0    R2: an extension hits below the promise,
                                       sparse (or periodic) retention, hash
                                       block = block
``hashed-longer-sibling``    0.33.0    R2 with a hash unit below the block,
                                       sparse retention (first seen on Falcon-H1:
                                       A:288 then A:300, block 144, unit 16, hits
                                       272 where the promise gives 288)
``stale-state``              0.33.0    the ``stale`` oracle, with a hash unit
                                       below the block (partial hits): a hit
                                       resumes from a state no prefill wrote,
                                       or a state is held that none did; or, through the
                                       ``resumed_state`` oracle, a hit at a Mamba
                                       block boundary resumes from a state over
                                       fewer tokens inside that block (a partial
                                       hit's copied state, cached as the block's
                                       end when another prefill wrote a state
                                       there, so ``stale`` stays quiet)
``resend-beside-checkpoint`` 0.33.0    R1: a resend hits below the promise under
                                       the drop, a hash unit below the block,
                                       periodic or dense retention; or a
                                       sibling does, there and with the
                                       shared-prefix checkpoint (the earlier
                                       request's junction, lost the same way)
``dense-below-sparse``       0.33.0    an extension hits below the promise under
                                       dense or periodic retention (which keep
                                       more than sparse) with a hash unit below
                                       the block (where sparse retention holds)
``pinned-pool-cow-stall``    0.33.0    a request never admitted on a pool vLLM's
                                       start-up check accepts: its hit may end
                                       inside a block, and admission counts a
                                       copy-on-write block per group that the
                                       check does not plan
``async-self-preemption``    0.33.0    a request on a pinned pool under async
                                       scheduling scheduled and preempted again
                                       and again, resumed each time where it
                                       was, or never admitted again once its
                                       own hit ends inside a block (0.32.0
                                       too; 0.29.0 and 0.30.0 where the
                                       overcount does not explain it)
``null-gap-retirement``      0.29.0    the ``block_table`` oracle: a running
                                       request's Mamba table holds blocks below
                                       the state it resumes from, none freed
                                       (retirement stops at the first null gap
                                       a multi-block step leaves; vLLM #55450)
``tail-cow-overcount``       0.29.0    a lone request on a pinned pool preempts
                                       itself once its prefill reaches its own
                                       partial-tail key: the Mamba manager
                                       counts two blocks for that key's one
                                       copy-on-write block, then resumes there
                                       (or, counting it twice again at
                                       admission, never; 0.30.0 too)
``async-tail-recache``       0.29.0    the ``resumed_state`` oracle, async
                                       scheduling: a request resumes at an
                                       earlier prompt's own partial tail t from
                                       a state over t + k tokens (the key
                                       cached again after its copy-on-write,
                                       copied a decode step later)
``sglang-grid-resend``       sglang    SGLang: an identical resend of a prompt
                             0.5.23    of k x grid tokens hits below the promise
                                       (its tracked state is at k x grid, one
                                       grid past the N-1 cap)
``sglang-sibling-branch``    sglang    SGLang: a resend or extension of a sibling
                             0.5.23    hits below the promise (the sibling's
                                       prefill tracked its branching point, not
                                       its own last grid point)
===========================  ========  =========================================

The promise-breaking oracles that speak of one request's hit (``promise``,
``sparse_dense``, ``spec_on_off``) are taken alike: a campaign writes
whichever fires first, and each names the same broken hit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fuzz.judge.oracle_registry import HIT_ORACLES
from fuzz.judge.oracles import SAME_STEP_READ, request_kinds
from ground.engines import FAMILIES, family_of, load
from ground.errors import KvspecError
from reference.case import Case, parse_case, prompt_tokens
from reference.serial import common_prefix


@dataclass(frozen=True)
class KnownClass:
    id: str
    release: str  # the newest release kvspec has that shows it
    promise: str  # the promise it breaks (fuzz.replaying.checkbuild.PROMISES)
    rule: str  # what a finding of it says, in one line


#: The default family's (vLLM's) classes; another family declares its own
#: (its registry entry's ``classes`` module: ``CLASSES`` and ``classify``).
VLLM_CLASSES = (
    KnownClass(
        "resend-53504", "0.29.0", "R1", "an identical resend hits below the promise under the EAGLE drop (vLLM #53504)"
    ),
    KnownClass(
        "aligned-resend",
        "0.29.0",
        "R1",
        "an identical resend of a block-aligned prompt hits below the promise without the EAGLE drop: the first prefill"
        " wrote no state below its end N, the resend resumes at most at N - block (0.30.0 too, with the drop as well)",
    ),
    KnownClass(
        "hashed-drop-resend",
        "0.30.0",
        "R1",
        "an identical resend under the EAGLE drop with a hash unit below the block misses: the lookup backs its hit"
        " off one hash unit, where the prefill stopped no chunk (0.29.0 too)",
    ),
    KnownClass(
        "longer-sibling",
        "0.33.0",
        "R2",
        "a longer sibling hits below the promise under sparse retention, hash block = block",
    ),
    KnownClass(
        "hashed-longer-sibling",
        "0.33.0",
        "R2",
        "a longer sibling hits below the promise under sparse retention with a hash unit below the block (seen on Falcon-H1)",
    ),
    KnownClass(
        "stale-state",
        "0.33.0",
        "no-stale",
        "a hit resumes from a Mamba state no prefill wrote (the stale oracle), or from a partial hit's copied state"
        " cached as its block's end (the resumed_state oracle)",
    ),
    KnownClass(
        "resend-beside-checkpoint",
        "0.33.0",
        "R1",
        "an identical resend (or, with the shared-prefix checkpoint, a sibling) hits below the promise under the EAGLE drop,"
        " a hash unit below the block, periodic or dense retention",
    ),
    KnownClass(
        "dense-below-sparse",
        "0.33.0",
        "R2",
        "a longer sibling hits below the promise under dense or periodic retention with a hash unit below the block",
    ),
    KnownClass(
        "pinned-pool-cow-stall",
        "0.33.0",
        "errors",
        "a request whose hit may end inside a block is never admitted on a pinned pool the start-up check accepts",
    ),
    KnownClass(
        "async-self-preemption",
        "0.33.0",
        "errors",
        "under async scheduling a lone request on a pinned pool preempts itself while its chunk is in flight, forever,"
        " or once, never admitted again (0.32.0, 0.30.0 and 0.29.0 too)",
    ),
    KnownClass(
        "tail-cow-overcount",
        "0.29.0",
        "errors",
        "a request on a pinned pool whose last prompt key ends inside a Mamba block preempts itself once its prefill"
        " reaches that key, and resumes there or is never admitted again: the key's copy-on-write block is counted"
        " twice (0.30.0 too)",
    ),
    KnownClass(
        "async-tail-recache",
        "0.29.0",
        "no-stale",
        "under async scheduling a request resumes at an earlier prompt's own partial-tail key from a state a decode"
        " step or more past it: the key is cached again after its copy-on-write and copied again a step later",
    ),
    KnownClass(
        "null-gap-retirement",
        "0.29.0",
        "block-table",
        "a running request's Mamba block table keeps blocks below the state it resumes from that nothing can hit:"
        " retirement stops at the first null gap (vLLM #55450)",
    ),
)


def _declared() -> tuple[KnownClass, ...]:
    """Every family's classes: the default family's, then each family's own
    (``ground.engines.FAMILIES``' ``classes``), in registry order."""
    own = tuple(KnownClass(*k) for f in FAMILIES.values() if f.classes is not None for k in load(f.classes).CLASSES)
    return VLLM_CLASSES + own


#: The one known-class registry: ``kvspec findings``, ``triage``,
#: ``report`` and ``bench/rediscovery.py`` all read it.
KNOWN_CLASSES = _declared()
BY_ID = {k.id: k for k in KNOWN_CLASSES}


def _case(finding: dict) -> Case | None:
    """The finding's case, parsed once for every rule that reads it; None
    where it cannot be read (a rule then names no class)."""
    try:
        return parse_case(finding.get("case"))
    except KvspecError:
        return None


def _low_hit(finding: dict) -> tuple[str, dict, Case] | None:
    """(the first diverging request's kind, the case's geometry as the
    finding holds it, the parsed case) when the finding says that request
    hit less than it must; None otherwise."""
    if finding.get("oracle") not in HIT_ORACLES:
        return None
    i = finding.get("first_divergence")
    exp = (finding.get("expected") or {}).get("hits") or []
    obs = (finding.get("observed") or {}).get("hits") or []
    if not isinstance(i, int) or i >= len(exp) or i >= len(obs) or obs[i] >= exp[i]:
        return None
    raw = finding.get("case")
    if not isinstance(raw, dict) or not isinstance(raw.get("geometry"), dict):
        return None
    case = _case(finding)
    kinds = request_kinds(case) if case is not None else []
    return (kinds[i], raw["geometry"], case) if i < len(kinds) else None


def _high_past_checkpoint(finding: dict) -> bool:
    """The first diverging request hit more than the reference gives, on a
    deployment with internal prefill checkpoints and a hash unit (partial
    hits): a copied state cached as a later boundary's (the stale-state
    class as ``kvspec report`` has told it since stop 20:
    ``fixes/vllm-0.33.0-stale-state-after-partial-hit.diff``)."""
    i = finding.get("first_divergence")
    exp = (finding.get("expected") or {}).get("hits") or []
    obs = (finding.get("observed") or {}).get("hits") or []
    g = (finding.get("case") or {}).get("geometry") if isinstance(finding.get("case"), dict) else None
    if not isinstance(i, int) or not isinstance(g, dict) or i >= len(exp) or i >= len(obs):
        return False
    if not all(isinstance(x, int) for x in (exp[i], obs[i])):
        return False
    return obs[i] > exp[i] and g.get("prefill_checkpoint_grid") is not None and g.get("prefix_match_unit") is not None


def _partial_hits(finding: dict) -> bool:
    """The case's deployment has partial hits: a hash unit
    (``prefix_match_unit``) below its scheduler block, so a hit may end
    inside a Mamba block. The stale-state class needs one: after a partial
    hit the prefill runs past the next block boundary and the Mamba manager
    caches the copied state as that boundary's (0.33.0;
    ``fixes/vllm-0.33.0-stale-state-after-partial-hit.diff``). A ``stale``
    finding without one is no instance of it (it is new, or kvspec's)."""
    g = (finding.get("case") or {}).get("geometry") if isinstance(finding.get("case"), dict) else None
    if not isinstance(g, dict):
        return False
    unit, block = g.get("prefix_match_unit"), g.get("scheduler_block_size")
    if not isinstance(unit, int) or unit <= 0:
        return False
    return not isinstance(block, int) or unit < block


def _first_resumed(finding: dict) -> tuple[dict, dict] | None:
    """(the first diverging request's ``resumed_state`` record, the case's
    geometry); None when the finding holds neither."""
    i = finding.get("first_divergence")
    engine = (finding.get("explain") or {}).get("engine") if isinstance(finding.get("explain"), dict) else None
    raw = finding.get("case")
    if not isinstance(i, int) or not isinstance(engine, list) or i >= len(engine) or not isinstance(raw, dict):
        return None
    rec, g = (engine[i] or {}).get("resumed_state") if isinstance(engine[i], dict) else None, raw.get("geometry")
    return (rec, g) if isinstance(rec, dict) and isinstance(g, dict) else None


def _copied_partial_state(finding: dict) -> bool:
    """A ``resumed_state`` finding of the stale-state class: the request
    resumed at a Mamba block boundary ``b`` from a state over ``t`` tokens
    with ``b - M < t < b`` on the hash unit (a partial hit's position inside
    the block ending at ``b``). vLLM 0.33.0: a prefill resuming at a partial
    hit ``t`` copies that state into the block's column (the resume read,
    ``v1/worker/mamba_utils.py:1493-1495``, kept by the copy at ``:1517``),
    its chunk runs past ``b`` when the prompt's internal checkpoint is
    valid (``v1/core/sched/scheduler.py:644-648``: the next-boundary stop is
    dropped under ``use_internal_checkpoint``, ``:593-604``), and
    ``MambaManager.cache_blocks`` (``v1/core/single_type_kv_cache_manager.py:1978-1993``)
    caches that block as the state after ``b``. When another prefill did
    write a state at ``b``, the position-only ``stale`` oracle is satisfied
    and only ``resumed_state`` sees it; ``fixes/vllm-0.33.0-stale-state-after-partial-hit.diff``
    stops the chunk at ``b``."""
    got = _first_resumed(finding)
    if got is None:
        return False
    rec, g = got
    at, t = rec.get("at"), rec.get("tokens")
    mamba = [x.get("block_size") for x in g.get("groups") or () if isinstance(x, dict) and x.get("kind") == "mamba"]
    M, unit = (mamba[0] if mamba else g.get("scheduler_block_size")), g.get("hash_block_size")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (at, t, M, unit)) or M <= 0 or unit <= 0:
        return False
    return at > 0 and at % M == 0 and unit < M and at - M < t < at and t % unit == 0


def _recached_tail(finding: dict) -> bool:
    """A ``resumed_state`` finding of the ``async-tail-recache`` class
    (vLLM 0.29.0, async scheduling): the request resumed at ``t`` from a
    state over ``t + k`` tokens (``0 < k``, at most the decode steps of the
    earlier request) where ``t`` is an earlier prompt's own partial tail
    (:func:`_own_partial_tail`). The scheduler caches up to
    ``min(computed + new, request.num_tokens)`` (``kv_cache_manager.py:555-562``);
    with the step's output in flight ``num_tokens`` lacks it, so the decode
    step after the prefill reached t caches t again
    (``MambaManager.cache_blocks``, ``single_type_kv_cache_manager.py:1818-1830``;
    ``_cache_partial_tail_block``, ``:1858-1893``) on the running block whose
    entry the previous copy-on-write had moved (``:1743-1751``), and the
    next step's copy-on-write copies that block after the decode wrote
    t + 1 into it. Ended by ``tests/engine/data/vllm-0.29.0-async-tail-recache.diff``
    (no second key once the request computed past it)."""
    got = _first_resumed(finding)
    facts = (finding.get("resolution") or {}).get("facts") if isinstance(finding.get("resolution"), dict) else None
    if got is None or not isinstance(facts, dict) or facts.get("async_scheduling") is not True:
        return False
    rec, _g = got
    at, t = rec.get("at"), rec.get("tokens")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (at, t)) or t <= at:
        return False
    case = _case(finding)
    i = finding.get("first_divergence")
    if case is None or not isinstance(i, int):
        return False
    trace = case.trace
    return any(_own_partial_tail(case, j) == at and t - at <= trace[j].max_tokens for j in range(min(i, len(trace))))


#: "request I still unfinished after S steps (C/N prompt tokens computed)":
#: the serial step loop's EngineStall (engine_adapter/vllm_engine/steploop.py).
_STALL = re.compile(r"request (\d+) still unfinished after (\d+) steps \((\d+)/(\d+) prompt tokens computed\)")
#: The step loop stops a request after 8 steps that schedule nothing
#: (steploop.MAX_IDLE_STEPS): a stall within this many steps never ran.
_IDLE_STALL_STEPS = 9


def _pinned_stall(finding: dict) -> tuple[int, int, int, dict] | None:
    """(stalled request, steps, prompt tokens computed, the resolution's
    facts) for an ``EngineStall`` of a serial case on a pool the deployment
    pins (``--num-gpu-blocks-override``: vLLM's start-up check accepted it,
    ``v1/core/kv_cache_planning.py:1510-1559`` in 0.33.0); None otherwise."""
    err = (finding.get("observed") or {}).get("error")
    facts = (finding.get("resolution") or {}).get("facts") if isinstance(finding.get("resolution"), dict) else None
    if finding.get("oracle") != "engine_error" or not isinstance(err, dict) or err.get("type") != "EngineStall":
        return None
    m = _STALL.search(str(err.get("message") or ""))
    if m is None or not isinstance(facts, dict) or facts.get("pool_set_by_deployment") is not True:
        return None
    i, steps, computed, _ = (int(x) for x in m.groups())
    return i, steps, computed, facts


def _hit_may_end_inside_a_block(case: Case, i: int, drop: bool, own: bool = False) -> bool:
    """Whether request ``i`` shares with an earlier request a prefix whose
    hash-unit floor (capped at its last prompt position) ends inside a
    scheduler block: a partial local hit, for which 0.33.0's admission gate
    (``full_sequence_must_fit``, ``v1/core/kv_cache_manager.py:531-548``)
    counts one copy-on-write block per group
    (``_has_partial_local_hit``, ``v1/core/single_type_kv_cache_manager.py:164-174, 262-265``)
    that the start-up check's plan of one ``max_model_len`` request
    (``_max_memory_usage_bytes_from_groups``, ``kv_cache_planning.py:1253-1285``) leaves out.
    Under the EAGLE drop the hit backs off one hash unit more
    (``FullAttentionManager.find_longest_cache_hit``,
    ``single_type_kv_cache_manager.py:829-830``: ``min(alignment_tokens,
    block_size)``), so a floor on a block boundary lands inside the block
    below (a make check campaign's B:380+C:4 then +T0:193, block 192, unit
    32: floor 384, hit 352). ``drop``: the engine's knobs say the drop is on.
    ``own``: the request's own prompt instead of the earlier ones (a
    request preempted while its own step was in flight finds the blocks
    that step cached, the longest prefix it can hit)."""
    g = case.geometry
    if g is None or i >= len(case.trace) or g.hash_block_size is None or g.hash_block_size >= g.scheduler_block_size:
        return False
    mine, unit = prompt_tokens(case.trace[i]), g.hash_block_size
    for earlier in [mine] if own else (prompt_tokens(r) for r in case.trace[:i]):
        floor = min(common_prefix(mine, earlier), len(mine) - 1) // unit * unit
        hit = floor - unit if drop else floor
        if hit > 0 and hit % g.scheduler_block_size:
            return True
    return False


def _own_partial_tail(case: Case, i: int, unit_lower: bool = False) -> int | None:
    """The position of request ``i``'s own partial-tail key: its prompt's
    last hash-unit boundary ``t = N // u * u`` (``unit_lower``: one unit
    lower) where it lies inside a Mamba block (``0 < t``, ``t % M != 0``,
    ``u < M``); None otherwise. vLLM 0.29.0 caches the state there once the
    prefill reaches it and marks the request for a copy-on-write of that
    block at its next allocation (``MambaManager._cache_partial_tail_block``,
    ``v1/core/single_type_kv_cache_manager.py:1858-1893``: ``_partial_hit_reqs``
    at :1892). 0.30.0 keys it one unit lower in an EAGLE group (:2083-2088:
    "Eagle groups match one hash unit past the candidate and drop it"), so
    a block-aligned prompt has a tail too (a 0.30.0 campaign: A:544, block
    544, unit 32, MTP 1, stops at 512; A:1007, unit 16, at 976)."""
    g = case.geometry
    if g is None or i >= len(case.trace) or not g.hash_block_size:
        return None
    M, u = (g.mamba_block_sizes or (g.scheduler_block_size,))[0], g.hash_block_size
    t = len(prompt_tokens(case.trace[i])) // u * u - (u if unit_lower else 0)
    return t if u < M and t > 0 and t % M else None


def _block_aligned(case: Case, i: int) -> bool:
    """Whether the first diverging request's prompt is a whole number of
    scheduler blocks: the ``aligned-resend`` class. vLLM 0.29.0 (align
    mode) stops a prefill chunk at its last cacheable position
    ``N - N % block`` (``v1/core/sched/scheduler.py:413-417``), for such a
    prompt its end N, so the first request writes no state at N - block;
    an identical resend looks up at most N - 1 tokens
    (``kv_cache_manager.py:253-258``), floored to N - block, and misses.
    The resend's own chunk stops there (its junction), so the next resend
    hits: miss, miss, hit, as #53504 under the drop. 0.30.0 stops a chunk
    the same way (``sched/scheduler.py:443-445``; under the drop one block
    lower, where the resend's lookup lands one block lower still): a
    0.30.0 campaign's 9 aligned resends gave miss, miss, hit with a third
    request, with the drop and without, and 0.33.0 miss, hit, hit."""
    block = case.geometry.scheduler_block_size if case.geometry is not None else None
    if not block or i >= len(case.trace):
        return False
    return len(prompt_tokens(case.trace[i])) % block == 0


def _stall_class(finding: dict, version: str) -> str | None:
    """The pinned-pool stall classes (``examples/README.md``, "Stalls on
    pinned pools"; ``tests/engine/test_stalls.py``).

    * Never ran (no prompt token computed within the idle bound), its hit
      possibly ending inside a block: the copy-on-write class
      (``fixes/vllm-0.33.0-admission-cow-block.diff``; its rule ported to
      0.32.0's start-up check, ``tests/engine/data/vllm-0.32.0-admission-cow-block.diff``,
      refused all ten such pools of three 0.32.0 campaigns, and to 0.30.0's,
      ``vllm-0.30.0-admission-cow-block.diff``, the two of its campaigns).
    * Ran, on vLLM 0.29.0 or 0.30.0, and stopped at its own partial tail t
      (:func:`_own_partial_tail`; on 0.30.0 under the EAGLE drop one hash
      unit lower) or at 0: the copy-on-write overcount. At
      the step after its prefill reached t the request asks the Mamba
      manager for the copy-on-write block of that key, and
      ``get_num_blocks_to_allocate`` counts ``1 + int(has_partial_hit)``
      (``v1/core/single_type_kv_cache_manager.py:1642-1643``, then
      ``:1651-1652``) where ``allocate_new_blocks`` takes one
      (``:1730-1732``); on a tight pool the lone request preempts itself
      (``sched/scheduler.py:656-712``) and resumes from its hit at t, or,
      the admission gate counting the block twice again (``:1651-1652``
      under ``full_sequence_must_fit``, ``kv_cache_manager.py:471-487``),
      is never admitted again (0 computed). 0.32.0 (``:1770-1773``) and
      0.33.0 (``:1787-1790``) cap the count at the blocks taken. Held by
      ``tests/engine/test_stalls.py``: the cap back-ported to 0.29.0
      (``tests/engine/data/vllm-0.29.0-tail-cow-cap.diff``) ends them; on
      0.30.0 (``:1797-1801``, the same count) its port
      (``tests/engine/data/vllm-0.30.0-tail-cow-cap.diff``) ended the six
      of a 90 s campaign this rule names (seed 1), and not the two below.
    * Ran, under async scheduling, no overcount, and looped
      (:func:`_looped`): the self-preemption class, preempted while its own
      chunk is in flight and resumed where it was, again and again
      (``v1/core/sched/scheduler.py:912-980`` in 0.33.0, ``:797-834`` in
      0.32.0, ``:656-712`` in 0.29.0; ``fixes/vllm-0.33.0-async-self-preemption.diff``,
      which applies to 0.32.0 as it is, and its port
      ``tests/engine/data/vllm-0.29.0-async-self-preemption.diff`` end
      them); or preempted so once and never admitted again, 0 computed, its
      own prompt's hit (the blocks its in-flight step cached) ending inside
      a block, for which admission counts a copy-on-write block per group
      (Jamba, block 80, unit 16, pool 20 on 0.32.0 and 0.33.0: 337, 352 and
      399 tokens stall, 320, 321 and 336 run; sync runs all; the fix ends
      it). Only on the releases where it was traced (0.29.x, 0.30.x, 0.32.x,
      0.33.x; on 0.30.0 the 0.33.0 fix applies as it is).

    ``version``: the finding's engine version, as :func:`classify` read it."""
    got = _pinned_stall(finding)
    case = _case(finding) if got is not None else None
    if case is None:  # every rule below reads the case
        return None
    i, steps, computed, facts = got
    drop = bool(((finding.get("engine") or {}).get("knobs") or {}).get("eagle_drop"))
    if steps <= _IDLE_STALL_STEPS:
        never_ran = computed == 0 and _hit_may_end_inside_a_block(case, i, drop)
        return "pinned-pool-cow-stall" if never_ran else None
    tail = _own_partial_tail(case, i, unit_lower=drop and version.startswith("0.30."))
    if version.startswith(("0.29.", "0.30.")) and tail is not None and computed in (0, tail):
        return "tail-cow-overcount"
    if not version.startswith(("0.29.", "0.30.", "0.32.", "0.33.")) or facts.get("async_scheduling") is not True:
        return None
    shut_out = computed == 0 and _hit_may_end_inside_a_block(case, i, drop, own=True)
    return "async-self-preemption" if _looped(case, i, steps) or shut_out else None


def _looped(case: Case, i: int, steps: int) -> bool:
    """Whether request ``i`` took more steps than it could without being
    preempted and resumed: its prompt and output tokens, one step each at
    the least progress, plus the idle bound. The step loop stops a request
    at ``n + max_tokens + 64`` steps (``steploop.py``), past this; one
    preempted once and never admitted again stops at the idle bound,
    within it."""
    if i >= len(case.trace):
        return False
    request = case.trace[i]
    return steps > len(prompt_tokens(request)) + request.max_tokens + _IDLE_STALL_STEPS


def _unretired_only(finding: dict) -> bool:
    """A ``block_table`` finding of the null-gap class: the first diverging
    request's table (its explain record's ``block_table``, [tokens computed
    before the step, unretired, freed] per step) held blocks below the state
    it resumes from on some step and never a freed one, and the divergence
    is no leak once it finished (a table with no step recorded). vLLM
    0.29.0: ``remove_skipped_blocks`` retires the columns below ``(s - 1)
    // M`` (``MambaManager.get_num_skipped_tokens``,
    ``v1/core/single_type_kv_cache_manager.py:1810-1816``) through the base
    ``_remove_blocks_in_range`` (``:605-630``), which walks down from the
    top and stops at the first null block (``:624-626``); a step covering
    more than one block pads its table with null blocks
    (``allocate_new_blocks``, ``:1709-1720``), and the one block freed
    past it, ``last_state_block_idx``'s (``:1540-1557``), is overwritten by
    the next allocation (``:1697-1707``) before it is below the step's
    start, so the block under the gap stays until the request finishes.
    0.32.0 (``:1592-1611``) and 0.33.0 (``:1608-1627``) give Mamba its own
    ``_remove_blocks_in_range`` that skips the null gaps."""
    i = finding.get("first_divergence")
    engine = (finding.get("explain") or {}).get("engine") if isinstance(finding.get("explain"), dict) else None
    if not isinstance(i, int) or not isinstance(engine, list) or i >= len(engine) or not isinstance(engine[i], dict):
        return False
    table = engine[i].get("block_table")
    if not isinstance(table, list) or not table:
        return False
    try:
        counts = [(int(unretired), int(freed)) for _start, unretired, freed in table]
    except (TypeError, ValueError):
        return False
    return all(freed == 0 for _, freed in counts) and any(unretired > 0 for unretired, _ in counts)


def classify(finding: dict) -> str | None:
    """The known class a finding belongs to (an id of :data:`KNOWN_CLASSES`),
    or None. Reads only the finding's own fields; a case it cannot read is
    None, never an exception."""
    version = str((finding.get("engine") or {}).get("version") or "")
    family = FAMILIES.get(family_of(version))
    if finding.get("oracle") == "stale":
        # the known class is serial: a hit that read a state in the step
        # computing it (a concurrent trace; fuzz.judge.oracles.check_stale) is another
        if SAME_STEP_READ in str((finding.get("expected") or {}).get("detail") or ""):
            return None
        if family is not None and family.classes is not None:  # another family's: none of vLLM's
            return None
        return "stale-state" if _partial_hits(finding) else None
    if finding.get("oracle") == "resumed_state":
        # SGLang's one state class, the off-page key, was found only on
        # deployments its launch check refuses (docs/sglang.md): none now
        if family is not None and family.classes is not None:
            return None
        if family is not None:  # vLLM's: by what the resumed state held
            if _copied_partial_state(finding):
                return "stale-state"
            return "async-tail-recache" if version.startswith("0.29.") and _recached_tail(finding) else None
    if finding.get("oracle") == "engine_error":
        return _stall_class(finding, version) if family is not None and family.classes is None else None
    if finding.get("oracle") == "block_table":
        vllm = family is not None and family.classes is None
        return "null-gap-retirement" if vllm and version.startswith("0.29.") and _unretired_only(finding) else None
    if family is not None and family.classes is None and _high_past_checkpoint(finding):
        return "stale-state"
    low = _low_hit(finding)
    if low is None:
        return None
    kind, g, case = low
    if family is not None and family.classes is not None:  # the family's own classes
        return load(family.classes).classify(finding, kind, g)
    knobs = (finding.get("engine") or {}).get("knobs") or {}
    drop = bool(knobs.get("eagle_drop"))
    hashed = g.get("hash_block_size") is not None and g["hash_block_size"] < g["scheduler_block_size"]
    retention = {None: "dense", 0: "sparse"}.get(g.get("retention_interval"), "periodic")
    if kind == "resend":
        if hashed and drop and version.startswith(("0.29.", "0.30.")):
            # The lookup drops one hash unit past its fine-grained hit
            # (single_type_kv_cache_manager.py:827-828 in 0.30.0, :778-779
            # in 0.29.0); the prefill stops chunks at the block (one block
            # lower under the drop, sched/scheduler.py:443-445 in 0.30.0)
            # and at the prompt's last hash-unit boundary, never there: the
            # resend misses (0.33.0 hits). Every 0.30.0 file run with a
            # third request missed again; on 0.29.0, 8 of 9 (one hit where
            # sparse retention kept the state the second request rewrote).
            return "hashed-drop-resend"
        if hashed and drop and retention != "sparse":
            return "resend-beside-checkpoint"
        if drop and version.startswith("0.29."):
            return "resend-53504"
        if version.startswith(("0.29.", "0.30.")) and _block_aligned(case, finding["first_divergence"]):
            return "aligned-resend"
        return None
    if kind == "sibling":
        # The earlier request's chunk ending at its junction also exported an
        # interim checkpoint: the cache call returns from that branch before
        # keying the junction (0.33.0 single_type_kv_cache_manager.py:2036-2084,
        # the junction at :2097-2103), as it does for the resend's tail; the
        # class's fix (fixes/vllm-0.33.0-hash-unit-tail-beside-checkpoint.diff)
        # falls through and keys both. Only with the shared-prefix checkpoint
        # is a junction keyed at all.
        if hashed and drop and retention != "sparse" and g.get("shared_prefix_checkpoint"):
            return "resend-beside-checkpoint"
        return None
    if kind == "extension":
        if retention != "sparse" and hashed:
            return "dense-below-sparse"
        if hashed and retention == "sparse":
            return "hashed-longer-sibling"
        if retention != "dense" and not hashed:
            # periodic retention keeps the sparse states too: below its
            # interval it is sparse retention (a Granite 4.0-H deployment
            # with interval 3B: B then B+1 hits 0 where the promise gives B;
            # the longer-sibling fix gives B)
            return "longer-sibling"
    return None
