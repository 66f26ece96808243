"""Stalls on pinned pools are vLLM's (0.33.0, 0.32.0 and 0.29.0), not kvspec's pool stand-in
(issue 43; ``examples/README.md``, "Stalls on pinned pools").

A pinned pool is the one vLLM builds from ``--num-gpu-blocks-override``
(kvspec calls vLLM's own ``get_kv_cache_configs`` and start-up check,
``kv_cache_planning.py:1510-1559``). Two causes, each held here from a run:

* **the copy-on-write block**: the start-up check plans a request of
  ``max_model_len`` with no prefix hit; the admission gate
  (``full_sequence_must_fit``, ``kv_cache_manager.py:531-548``) counts one
  more block per group for a hit that ends inside a block
  (``single_type_kv_cache_manager.py:262-265``, Mamba ``:1748-1795``). The
  sync example stalls on pool 19 and runs on pool 20: the gate asks 19 of 18
  free blocks. If kvspec's pool were one block short of vLLM's, the stall
  would move to pool 20, and this test fails.
* **the self-preemption under async scheduling** (slow tier: 3,181 steps):
  the async example preempts its only request forever on pool 23; the same
  pool under ``--no-async-scheduling`` runs.

The fixes (``fixes/vllm-0.33.0-admission-cow-block.diff``,
``fixes/vllm-0.33.0-async-self-preemption.diff``) are patched builds: their
tests are in the slow tier.

vLLM 0.29.0's stalls (make check's campaign, which reaches the start-up
check's floor pools): the copy-on-write overcount
(``fuzz.results.known_classes``, ``tail-cow-overcount``) stalls under sync
scheduling too; the self-preemption under async only. Each ends with its
own cause removed and not with the other's: 0.32.0's cap back-ported
(``data/vllm-0.29.0-tail-cow-cap.diff``), and the 0.33.0 fix ported
(``data/vllm-0.29.0-async-self-preemption.diff``); test data, not fixes
kvspec proposes (0.32.0 counts the block once; the async port is
``fixes/vllm-0.33.0-async-self-preemption.diff``'s rule).

The self-preemption without a loop (a 0.32.0 campaign's stall, the same on
0.33.0): preempted once with its own step in flight, the request is never
admitted again where its own hit ends inside a block; sync runs it, and the
0.33.0 fix, which applies to 0.32.0 as it is, ends it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from engine_adapter.host import builds

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
POOL = "--num-gpu-blocks-override"


def _pinned(case: dict, pool: int | None, extra: tuple[str, ...]) -> dict:
    """A copy of ``case`` on ``pool`` blocks (None: its own) with ``extra`` flags."""
    case = copy.deepcopy(case)
    args = case["deployment"]["vllm_args"]
    if pool is not None:
        args[args.index(POOL) + 1] = str(pool)
    args.extend(extra)
    return case


def _load(name: str, pool: int | None = None, *extra: str) -> dict:
    return _pinned(json.loads((EXAMPLES / f"{name}.json").read_text()), pool, extra)


DATA = ROOT / "tests" / "engine" / "data"
#: make check's 0.29.0 stalls: granitemoehybrid A:16 (pool 19, async, unit 16: its own tail 16)
#: and Jamba A:797 (pool 42, async, EAGLE 3, unit = block 160: no tail of its own)
NEVER_READMITTED = "finding-tail-cow-never-readmitted-granitemoehybrid.json"
ASYNC_029 = "finding-async-self-preemption-0.29.0-jamba.json"
#: a 0.32.0 campaign's stall: Jamba A:337 (pool 20, async, block 80, unit 16), preempted once
#: with its own step in flight and never admitted again
SHUT_OUT_032 = "finding-async-self-preemption-shut-out-0.32.0-jamba.json"
#: a 0.32.0 campaign's never-admitted stall (seed 2; Jamba, 241 tokens, a hit inside a block)
COW_032 = "finding-pinned-pool-cow-stall-0.32.0-jamba.json"


def _finding_case(name: str, *extra: str, pool: int | None = None) -> dict:
    return _pinned(json.loads((DATA / name).read_text())["case"], pool, extra)


def _unresolved(case: dict, length: int | None = None) -> dict:
    """A stored finding's deployment case as a user writes it (the engine
    resolves it again), its one prompt ``length`` tokens long if given."""
    case = {**case, "geometry": None, "speculative": None}
    case.pop("resolved_by", None)
    if length is not None:
        case["trace"] = [{**case["trace"][0], "prompt": [{**case["trace"][0]["prompt"][0], "length": length}]}]
    return case


def _stalled_at(obs: dict) -> int | None:
    err = obs.get("error")
    if err is None:
        return None
    assert err["type"] == "EngineStall" and err["phase"] == "step", err
    return err["request"]


def test_a_hit_ending_inside_a_block_stalls_one_pool_below_the_smallest_that_runs(engine_033):
    name = "stall-partial-hit-cow-sync-qwen3_5"
    stalled = engine_033.run(_load(name))  # pool 19: vLLM's start-up check accepts it
    assert stalled["resolution"]["facts"]["num_blocks"] == 19
    assert _stalled_at(stalled) == 1, stalled.get("error")
    assert "0/577 prompt tokens computed" in stalled["error"]["message"]
    runs = engine_033.run(_load(name, 20))
    assert _stalled_at(runs) is None
    assert runs["hits"] == [0, 16]  # the hit that ends inside a 288-token block


@pytest.mark.slow
def test_an_async_chunk_in_flight_preempts_its_only_request_forever(engine_033):
    name = "stall-async-self-preemption-qwen3_5"
    looped = engine_033.run(_load(name))  # pool 23, async
    assert _stalled_at(looped) == 2, looped.get("error")
    # not idle (a request never admitted stalls after 9 idle steps): scheduled,
    # preempted and resumed until the step bound, never past its first chunks
    steps = int(looped["error"]["message"].split(" after ")[1].split()[0])
    assert steps > 3000 and "(0/3115 prompt tokens computed)" in looped["error"]["message"], looped["error"]
    sync = engine_033.run(_load(name, None, "--no-async-scheduling"))
    assert _stalled_at(sync) is None
    assert sync["hits"] == [0, 0, 576, 0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "fix, name, outcome",
    [
        ("vllm-0.33.0-admission-cow-block.diff", "stall-partial-hit-cow-sync-qwen3_5", "refused"),
        ("vllm-0.33.0-async-self-preemption.diff", "stall-async-self-preemption-qwen3_5", "runs"),
    ],
)
def test_each_fix_ends_its_stall(engines, fix, name, outcome):
    engine = engines(builds.prepare("vllm==0.33.0", [str(ROOT / "fixes" / fix)]).removeprefix("vllm=="))
    if outcome == "refused":  # the start-up check now plans the copy-on-write block
        with pytest.raises(Exception, match="KV cache|max seq len|available"):
            obs = engine.run(_load(name))
            raise AssertionError(obs.get("error") or obs["hits"])
        assert _stalled_at(engine.run(_load(name, 20))) is None  # the smallest pool that runs is accepted
    else:
        obs = engine.run(_load(name))
        assert _stalled_at(obs) is None
        assert obs["hits"][2] > 0


def test_0_29_s_overcount_stalls_under_sync_too_and_its_self_preemption_under_async_only(engine_029):
    stalled = engine_029.run(_finding_case(NEVER_READMITTED))
    assert _stalled_at(stalled) == 0 and "after 10 steps (0/16 prompt tokens computed)" in stalled["error"]["message"]
    assert _stalled_at(engine_029.run(_finding_case(NEVER_READMITTED, "--no-async-scheduling"))) == 0
    assert _stalled_at(engine_029.run(_finding_case(NEVER_READMITTED, pool=40))) is None
    looped = engine_029.run(_finding_case(ASYNC_029))
    assert _stalled_at(looped) == 0 and "after 866 steps (640/797 prompt tokens computed)" in looped["error"]["message"]
    assert _stalled_at(engine_029.run(_finding_case(ASYNC_029, "--no-async-scheduling"))) is None


@pytest.mark.slow
@pytest.mark.parametrize(
    "diff, ends, keeps",
    [
        ("vllm-0.29.0-tail-cow-cap.diff", NEVER_READMITTED, ASYNC_029),
        ("vllm-0.29.0-async-self-preemption.diff", ASYNC_029, NEVER_READMITTED),
    ],
)
def test_each_0_29_stall_ends_with_its_own_cause_removed_only(engines, diff, ends, keeps):
    engine = engines(builds.prepare("vllm==0.29.0", [str(DATA / diff)]).removeprefix("vllm=="))
    assert _stalled_at(engine.run(_finding_case(ends))) is None
    assert _stalled_at(engine.run(_finding_case(keeps))) == 0


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
def test_a_self_preempted_request_is_shut_out_once_its_own_hit_ends_inside_a_block(engines, version):
    """The async class without a loop (``known_classes``: a request that ran
    and stopped at 0 computed, its own hit inside a block): 337, 352 and 399
    tokens stall after 11 steps; 336 (hit 320) and 321 (hit 320), whose hits
    end on a block, run; under sync every one runs."""
    engine = engines(version)
    for n in (337, 352, 399):
        stalled = engine.run(_unresolved(_finding_case(SHUT_OUT_032), n))
        assert _stalled_at(stalled) == 0 and f"after 11 steps (0/{n} prompt tokens" in stalled["error"]["message"]
        assert _stalled_at(engine.run(_unresolved(_finding_case(SHUT_OUT_032, "--no-async-scheduling"), n))) is None
    for n in (321, 336):
        assert _stalled_at(engine.run(_unresolved(_finding_case(SHUT_OUT_032), n))) is None


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
def test_the_async_fix_ends_the_shut_out_stall(engines, version):
    """``fixes/vllm-0.33.0-async-self-preemption.diff`` applies to 0.32.0
    as it is, and ends the stall on both."""
    fix = str(ROOT / "fixes" / "vllm-0.33.0-async-self-preemption.diff")
    engine = engines(builds.prepare(f"vllm=={version}", [fix]).removeprefix("vllm=="))
    obs = engine.run(_unresolved(_finding_case(SHUT_OUT_032)))
    assert _stalled_at(obs) is None and obs["hits"] == [0]


def test_a_hit_the_eagle_drop_moves_inside_a_block_stalls_one_pool_below_the_smallest_that_runs(engine_033):
    """The copy-on-write class with the hit inside a block only after the
    drop: the shared prefix floors to 384 (block 192), the drop backs it off
    one 32-token unit to 352 (``known_classes._hit_may_end_inside_a_block``)."""
    name = "finding-pinned-pool-cow-stall-drop-qwen3_next.json"
    stalled = engine_033.run(_finding_case(name))  # pool 23
    assert _stalled_at(stalled) == 1 and "(0/577 prompt tokens computed)" in stalled["error"]["message"]
    runs = engine_033.run(_finding_case(name, pool=24))
    assert _stalled_at(runs) is None and runs["hits"] == [0, 352]


def test_0_32_has_the_copy_on_write_stall(engines):
    """0.32.0's admission gate counts the copy-on-write block of a hit
    inside a block, as 0.33.0's does: the stored finding's request is never
    admitted (9 idle steps, nothing computed)."""
    stalled = engines("0.32.0").run(_unresolved(_finding_case(COW_032)))
    assert _stalled_at(stalled) == 1 and "after 9 steps (0/241 prompt tokens" in stalled["error"]["message"]


@pytest.mark.slow
def test_the_admission_fix_ported_to_0_32_refuses_the_pool_at_start_up(engines):
    """``fixes/vllm-0.33.0-admission-cow-block.diff``'s rule in 0.32.0's
    start-up check (``kv_cache_utils.py:2337-2366``; test data, not a fix
    kvspec proposes: 0.33.0's is): the pool that stalls is refused. The ten
    stalls of three 0.32.0 campaigns this class names were refused so."""
    diff = str(DATA / "vllm-0.32.0-admission-cow-block.diff")
    engine = engines(builds.prepare("vllm==0.32.0", [diff]).removeprefix("vllm=="))
    with pytest.raises(Exception, match="KV cache|max seq len|available"):
        obs = engine.run(_unresolved(_finding_case(COW_032)))
        raise AssertionError(obs.get("error") or obs["hits"])
