"""The fuzz machinery against test doubles: oracles, shrinking, findings,
dedup and resume, drivers, codec. The real engine is tested in tests/engine/."""

from __future__ import annotations

import itertools
import json
import os
import random
from pathlib import Path

from fuzz.draw.codec import decode, encode
from fuzz.driving.campaign import Campaign
from fuzz.driving.drivers import random_cases, run_cases, run_hypothesis, run_random
from fuzz.judge.oracles import check_all, request_kinds
from fuzz.results.findings import load_finding, render
from tests.conftest import MTP_DROP, hybrid, make_case
from tests.fuzz.doubles import RaisingDouble, ReferenceDouble

ROOT = Path(__file__).resolve().parents[2]


def test_request_kinds():
    case = make_case(hybrid(16, 16), [[("A", 40)], [("A", 40)], [("A", 60)], [("A", 20), ("B", 5)], [("C", 5)]])
    assert request_kinds(case) == ["fresh", "resend", "extension", "sibling", "fresh"]


def test_promise_oracle_fires_on_legacy_and_not_on_promise():
    case = make_case(hybrid(1600, 1600), [[("A", 11910)]] * 3, MTP_DROP)
    legacy = ReferenceDouble("0.29.0", "legacy")
    divs = check_all(case, "0.29.0", legacy.run(case), legacy.run, ("promise",))
    assert [(d.oracle, d.requests) for d in divs] == [("promise", [1])]
    honest = ReferenceDouble("0.29.0", "promise")
    assert (
        check_all(case, "0.29.0", honest.run(case), honest.run, ("promise", "knobs", "sparse_dense", "spec_on_off"))
        == []
    )


def test_random_campaign_finds_shrinks_and_writes_a_replayable_finding(tmp_path):
    engine = ReferenceDouble("0.29.0", "legacy")
    campaign = Campaign(engine, tmp_path, oracles=("promise",), seed=1)
    stats = run_random(campaign, seed=1, max_time=30, max_execs=3000, stop_on_finding=True, synthetic=True)
    assert stats.findings, "the legacy rule's resend miss must be found"
    case, finding = load_finding(stats.findings[0])
    assert finding["oracle"] == "promise" and finding["reproduced_twice"]
    assert len(case.trace) == 2 and case.geometry.scheduler_block_size <= 32
    # It replays from the file alone.
    divs = check_all(case, "0.29.0", engine.run(case), engine.run, ("promise",))
    assert [d.oracle for d in divs] == ["promise"]
    text = render(finding)
    assert text.index("inputs:") < text.index("request  expected  observed") < text.index("first divergence")


def test_findings_are_deduplicated_and_a_campaign_resumes(tmp_path):
    engine = ReferenceDouble("0.29.0", "legacy")
    cases = list(itertools.islice(random_cases(2), 150))
    first = Campaign(engine, tmp_path, oracles=("promise",))
    run_cases(first, cases)
    files = sorted(p.name for p in tmp_path.glob("*.json"))
    assert files and first.stats.duplicates > 0
    again = Campaign(engine, tmp_path, oracles=("promise",))
    run_cases(again, cases)
    assert again.stats.findings == []
    assert sorted(p.name for p in tmp_path.glob("*.json")) == files


def test_engine_exception_is_a_finding_and_the_campaign_continues(tmp_path):
    engine = RaisingDouble(limit=100)
    campaign = Campaign(engine, tmp_path, oracles=("engine_error",))
    big = make_case(hybrid(16, 16), [[("A", 500)]])
    small = make_case(hybrid(16, 16), [[("A", 50)]])
    assert campaign.check(big)
    assert campaign.check(small) == []
    (path,) = tmp_path.glob("engine_error-*.json")
    finding = json.loads(path.read_text())
    assert finding["observed"]["error"]["type"] == "ValueError"
    assert "raised at request 0" in finding["summary"]
    # Shrunk to the smallest prompt that still raises.
    assert finding["case"]["trace"][0]["prompt"][0]["length"] <= 116


def test_hypothesis_driver_uses_the_same_oracles(tmp_path):
    campaign = Campaign(ReferenceDouble("0.29.0", "legacy"), tmp_path, oracles=("promise",))
    stats = run_hypothesis(campaign, seed=3, max_time=60, max_examples=500, stop_on_finding=True, synthetic=True)
    assert stats.findings


def test_any_bytes_decode_to_a_valid_case_and_literals_round_trip():
    rng = random.Random(0)
    for _ in range(500):
        case = decode(bytes(rng.randrange(256) for _ in range(rng.randrange(120))))
        try:
            assert decode(encode(case)) == case
        except ValueError:
            pass  # outside the literal domain
    seed = make_case(hybrid(1600, 1600), [[("A", 11910)]] * 3, MTP_DROP)
    assert decode(encode(seed)) == seed


def test_malformed_corpus_produces_no_harness_error(tmp_path):
    campaign = Campaign(ReferenceDouble("0.33.0", "replay"), tmp_path)
    for data in (b"", b"\x01", b"\xff" * 3, os.urandom(64), b"\x01" + b"\xff" * 200):
        campaign.check(decode(data))
    assert not (tmp_path / "harness-errors").exists()


def test_a_campaign_over_deployments_decodes_every_input_to_a_deployment():
    """With a resolver, a hand-geometry literal (a z3 seed's bytes, or what a
    mutation of a deployment input turns into) is read as a generated
    deployment input: no hand geometry reaches the engine of a campaign over
    deployments. Without one it stays the hand geometry it encodes."""

    def stub_resolver(dep: dict) -> dict:  # a test double: every deployment resolves to block 544
        return {"block": 544, "hash": 544, "max_model_len": 32768}

    seed = make_case(hybrid(1600, 1600), [[("A", 11910)]] * 3, MTP_DROP)
    literal = encode(seed)
    assert decode(literal) == seed and decode(literal).deployment is None
    assert decode(literal, stub_resolver).deployment is not None
    rng = random.Random(3)
    for _ in range(200):
        data = bytes([rng.choice([1, 5, 9, 3])]) + bytes(rng.randrange(256) for _ in range(rng.randrange(120)))
        assert decode(data, stub_resolver).deployment is not None


def test_spec_on_off_skips_a_variant_vllm_refuses():
    """The spec_on_off oracle drops --speculative-config; where vLLM refuses
    that variant (DeploymentRejected) there is nothing to compare: no
    divergence, no engine_error. (The run function is a test double.)"""
    from fuzz.judge.oracles import check_spec_on_off
    from ground.errors import DeploymentRejected

    case = make_case(hybrid(1600, 1600), [[("A", 11910)]] * 3, MTP_DROP)

    def refusing_run(variant):  # a test double for the engine
        assert variant.speculative is None
        raise DeploymentRejected("deployment=...: vLLM refuses it when its scheduler starts")

    assert check_spec_on_off(case, "0.33.0", {"hits": [0, 9600, 9600]}, refusing_run) == []


def test_sparse_dense_fires_only_where_sparse_hits_less():
    """sparse_dense judges sparse retention against dense on the same
    engine: a request that hits less under sparse than both dense and the
    promise is a divergence; one that hits more is not (the dense run fell
    short; the promise judges that), nor one that keeps the promise where
    dense found more (the chunk ends of another earlier prompt: from a
    60 s control campaign on 0.33.0 + both fixes, Falcon-H1 at block 272,
    A:1203+B:192+E:444 after A:1203 and A:1203+B:724 hit 1088 sparse, 1360
    dense, promise 1088). (The run function is a test double standing for
    the dense run.)"""
    from dataclasses import replace

    from fuzz.judge.oracles import check_sparse_dense

    base = make_case(hybrid(16, 16), [[("A", 64)], [("A", 64), ("B", 1)]])
    case = replace(base, geometry=replace(base.geometry, retention_interval=0))

    def dense_run(hits):
        def run(variant):  # a test double for the engine's dense run
            assert variant.geometry.retention_interval is None
            return {"hits": hits}

        return run

    assert check_sparse_dense(case, "0.33.0", {"hits": [0, 64]}, dense_run([0, 48])) == []
    (div,) = check_sparse_dense(case, "0.33.0", {"hits": [0, 48]}, dense_run([0, 64]))
    assert (div.oracle, div.requests, div.expected) == ("sparse_dense", [1], [0, 64])
    # dense found more than the promise (another prompt's chunk end): sparse keeping the promise is no divergence
    three = make_case(hybrid(16, 16), [[("A", 64)], [("A", 64), ("B", 40)], [("A", 64), ("B", 20), ("C", 5)]])
    three = replace(three, geometry=replace(three.geometry, retention_interval=0))
    assert check_sparse_dense(three, "0.33.0", {"hits": [0, 64, 64]}, dense_run([0, 64, 80])) == []


def test_a_hit_above_the_promise_is_stale_only_where_no_prefill_wrote_that_state():
    """check_promise: below the promise is lost reuse; above it is judged by
    the engine's chunk ends. (From the 10-min campaign on 0.33.0 + both
    fixes: Qwen3-Next, block 576, hash unit 32, periodic retention 1728;
    request 1 prefilled A:727 in chunks ending at 576, 704, 727; request 2,
    A:576 + B:1, resumed at 576, above the promise's 32: a state a prefill
    wrote, kept beyond what the promise requires, not stale.)"""
    from fuzz.judge.oracles import check_promise

    case = make_case(
        hybrid(576, 576, prefix_match_unit=32, retention_interval=1728, prefill_checkpoint_grid=64),
        [[("A", 45)], [("A", 727)], [("A", 576), ("B", 1)]],
    )
    explain = [{"chunk_ends": [32, 45]}, {"chunk_ends": [576, 704, 727]}, {"chunk_ends": [577]}]
    assert check_promise(case, "0.33.0", {"hits": [0, 32, 576], "explain": explain}) == []
    # the same hit with no prefill ending there: a stale state
    unwritten = [{"chunk_ends": [32, 45]}, {"chunk_ends": [704, 727]}, {"chunk_ends": [577]}]
    (div,) = check_promise(case, "0.33.0", {"hits": [0, 32, 576], "explain": unwritten})
    assert div.requests == [2]


def test_the_stale_oracle_flags_a_hit_where_no_earlier_prefill_wrote_a_state():
    """check_stale: every hit must land on a position an earlier prefill over
    the same tokens wrote a Mamba state at (``written``: chunk ends and the
    worker's internal checkpoints). The shape of 0.33.0's stale state after
    a partial hit (tests/engine/data/finding-stale-state-falcon-h1.json):
    the third request resumes at 144 where the prefills wrote only 16 and 17."""
    from fuzz.judge.oracles import check_stale
    from fuzz.replaying.checkbuild import promise_of

    case = make_case(hybrid(16, 16), [[("A", 17)], [("A", 150)], [("A", 150), ("B", 3)]])
    wrote = [{"written": [16, 17]}, {"written": [144, 150]}, {"written": [153]}]
    assert check_stale(case, "0.33.0", {"hits": [0, 16, 144], "explain": wrote}) == []
    stale = [{"written": [16, 17]}, {"written": [150]}, {"written": [153]}]
    (div,) = check_stale(case, "0.33.0", {"hits": [0, 16, 144], "explain": stale})
    assert (div.oracle, div.requests, div.expected, div.observed) == ("stale", [2], [0, 16, 17], [0, 16, 144])
    # a state written over other tokens does not count
    other = make_case(hybrid(16, 16), [[("B", 150)], [("A", 150)], [("A", 150), ("B", 3)]])
    (div,) = check_stale(
        other,
        "0.33.0",
        {"hits": [0, 0, 144], "explain": [{"written": [144, 150]}, {"written": [150]}, {"written": [153]}]},
    )
    assert div.requests == [2]
    # writes the engine could not observe (null): not judged
    unknown = [{"written": None}, {"written": [150]}, {"written": [153]}]
    assert check_stale(case, "0.33.0", {"hits": [0, 16, 144], "explain": unknown}) == []
    finding = {"oracle": "stale", "case": {}, "first_divergence": 2}
    assert promise_of(finding) == "no-stale"


def test_resumable_states_are_the_resend_and_sibling_boundaries_at_each_alignment():
    """Sparse retention's whole allowance for one prompt: 1216 tokens, block
    576, no EAGLE drop: 1152, where the resend (capped at 1215, floored) and
    the longer sibling both resume, and vLLM's replay boundary 1215 aligned
    down. With the drop, a block-aligned 1152-token prompt keeps 576 (the
    sibling's; the resend's is 0), never 1152 itself."""
    from reference.boundaries import resumable_states

    assert resumable_states(1216, 576, 576, 576, 576, False, 0) == {1152}
    aligned = resumable_states(1152, 576, 576, 576, 576, True, 0)
    assert 576 in aligned and 1152 not in aligned
    # with a hash unit of 64 the prompt's own checkpoint (1088) is resumable too
    assert 1088 in resumable_states(1152, 576, 64, 64, 576, True, 0)


def test_the_retention_oracle_flags_states_kept_nowhere_reachable_and_dropped_segment_ends():
    """check_retention: under sparse retention the cache holds only states a
    later request can resume at; under periodic retention it also holds
    every segment end a prefill wrote. The shapes of two mutants of vLLM
    0.33.0's ``reachable_block_mask``: sparse retention caching every block
    (``segment_tokens = None if interval > 0``), and periodic boundaries
    moved two blocks up (``// per_segment * per_segment + 1``)."""
    from fuzz.judge.oracles import check_retention
    from fuzz.replaying.checkbuild import promise_of

    sparse = make_case(hybrid(64, 64, retention_interval=0), [[("A", 300)], [("A", 300), ("B", 40)]])
    ok = [{"retained_mamba_blocks": {"64": [3]}, "junction": 0}, {"retained_mamba_blocks": {"64": [3]}, "junction": 0}]
    assert check_retention(sparse, "0.33.0", {"hits": [0, 256], "explain": ok}) == []
    every = [
        {"retained_mamba_blocks": {"64": [0, 1, 2, 3]}, "junction": 0},
        {"retained_mamba_blocks": {"64": [0, 1, 2, 3, 4]}, "junction": 0},
    ]
    (div,) = check_retention(sparse, "0.33.0", {"hits": [0, 256], "explain": every})
    assert (div.oracle, div.requests, div.expected, div.observed) == ("retention", [0, 1], [0, 256], [0, 256])
    assert div.context["expected_states"] == [[256], [256, 320]] and div.context["observed_states"][0] == [
        64,
        128,
        192,
        256,
    ]
    # dense retention keeps every block: not this oracle's to judge
    dense = make_case(hybrid(64, 64, retention_interval=None), [[("A", 300)]])
    assert check_retention(dense, "0.33.0", {"hits": [0], "explain": every[:1]}) == []
    # periodic, interval 128: segment ends 128 and 256 (written by chunk ends at 128, 256)
    periodic = make_case(hybrid(64, 64, retention_interval=128, max_num_batched_tokens=128), [[("A", 300)]])
    wrote = {"written": [128, 256, 300], "junction": 0}
    assert (
        check_retention(
            periodic, "0.33.0", {"hits": [0], "explain": [{**wrote, "retained_mamba_blocks": {"64": [1, 3]}}]}
        )
        == []
    )
    (div,) = check_retention(
        periodic, "0.33.0", {"hits": [0], "explain": [{**wrote, "retained_mamba_blocks": {"64": [2]}}]}
    )
    assert div.context["expected_states"] == [[128, 256]] and "drops the segment ends [128, 256]" in div.detail
    # not observed: not judged
    assert (
        check_retention(sparse, "0.33.0", {"hits": [0, 256], "explain": [{"retained_mamba_blocks": None}, ok[1]]}) == []
    )
    assert promise_of({"oracle": "retention", "case": {}, "first_divergence": 0}) == "retention"


def test_the_retention_oracle_allows_a_sub_block_junctions_floor():
    """A sibling diverging at a junction inside a Mamba block resumes at the
    block ending at or below it (no state has a slot inside a block), one
    block lower under speculative decoding: vLLM 0.33.0 keeps that state on
    purpose (``reachable_block_mask`` of the junction), and a fourth request
    of the same trace resumes there (docs/mutate.md, "The retention finding
    against a fourth request"). The observation kept in the finding file
    kvspec once wrote for it: held [48, 1152, 2304, 3440] after a junction
    at 2288, block 1152. The promise itself keeps that block for the
    request whose lookup observed the junction
    (``reference.serial.promise_junction_state``), so 1152 is allowed by the
    model as well; the junction itself (2288, which only the shared-prefix
    checkpoint writes) is allowed only through the junction the engine
    reports: held without it, it is flagged."""
    from fuzz.judge.oracles import check_retention
    from reference.boundaries import junction_states

    assert junction_states(2288, 16, 1152, eagle=True) == {2288, 1152}
    assert junction_states(2288, 16, 1152, eagle=False) == {2288, 1152}
    assert junction_states(2400, 16, 1152, eagle=True) == {2400, 2304, 1152}
    assert junction_states(0, 16, 1152, eagle=True) == frozenset()
    finding = json.loads((ROOT / "docs/data/findings/retention-after-partial-hit-qwen3_next.json").read_text())
    case, _ = load_finding(ROOT / "docs/data/findings/retention-after-partial-hit-qwen3_next.json")
    obs = {"hits": finding["observed"]["hits"], "explain": finding["explain"]["engine"]}
    assert check_retention(case, "0.33.0", obs) == []
    third = obs["explain"][2]
    at_junction = {g: [48, 2288, 2304, 3440] for g in third["retained_mamba_tokens"]}
    seen = {**obs, "explain": [*obs["explain"][:2], {**third, "retained_mamba_tokens": at_junction}]}
    assert check_retention(case, "0.33.0", seen) == []
    unseen = {**seen, "explain": [*seen["explain"][:2], {**seen["explain"][2], "junction": 0}]}
    (div,) = check_retention(case, "0.33.0", unseen)
    assert div.requests == [2] and "keeps [2288]" in div.detail


def test_the_retention_oracle_flags_a_state_kept_inside_a_requests_output():
    """check_retention on ``retained_output_states``: sparse retention keeps
    no state past the prompt (vLLM: interval 0 "retains only semantic
    checkpoints"), periodic retention only segment ends. The shape of a
    mutant of vLLM 0.33.0's ``replay_boundaries`` keeping {N + 1, N}
    instead of {N - 1, N} without EAGLE (observed on Qwen3-Next, block
    544): A:1087 decoding 4 tokens leaves the state at 1088 held, the
    release none."""
    from fuzz.judge.oracles import check_retention
    from fuzz.results.findings import signature

    sparse = make_case(hybrid(544, 544, retention_interval=0), [[("A", 1087)]])
    release = [{"retained_mamba_blocks": {"544": [0]}, "retained_output_states": [], "junction": 0}]
    assert check_retention(sparse, "0.33.0", {"hits": [0], "explain": release}) == []
    mutant = [{**release[0], "retained_output_states": [1088]}]
    (div,) = check_retention(sparse, "0.33.0", {"hits": [0], "explain": mutant})
    assert (div.oracle, div.requests, div.expected, div.observed) == ("retention", [0], [0], [0])
    assert (
        div.context["observed_states"] == [[544, 1088]]
        and div.context["expected_states"] == [[544]]
        and div.context["output_states"] == [[1088]]
    )
    assert "keeps [1088] inside its 1087-token prompt's output" in div.detail
    # a prompt state kept nowhere reachable is another class
    (prompt,) = check_retention(
        sparse, "0.33.0", {"hits": [0], "explain": [{**release[0], "retained_mamba_blocks": {"544": [0, 1]}}]}
    )
    knobs = {"eagle_drop": False, "hash_lookahead_tokens": 0}
    assert signature(sparse, div, knobs) != signature(sparse, prompt, knobs)
    # periodic retention may keep a segment end inside the output, nothing else
    periodic = make_case(hybrid(544, 544, retention_interval=1088), [[("A", 1087)]])
    assert check_retention(periodic, "0.33.0", {"hits": [0], "explain": mutant}) == []
    (off,) = check_retention(
        periodic, "0.33.0", {"hits": [0], "explain": [{**release[0], "retained_output_states": [1088, 1632]}]}
    )
    assert off.context["output_states"] == [[1632]]
    # not observed (an older observation): the prompt states alone
    assert (
        check_retention(
            sparse, "0.33.0", {"hits": [0], "explain": [{"retained_mamba_blocks": {"544": [0]}, "junction": 0}]}
        )
        == []
    )


def test_every_generated_request_may_decode():
    """fuzz.draw.generate draws each request's max_tokens from 1, 2 and 4, with
    or without speculative decoding, after the prompts; a conversation's
    turns (a turn quotes the one before it) generate tens to hundreds."""
    import random

    from fuzz.draw.choosers import RandomChooser
    from fuzz.draw.conversation import MAX_DECODE
    from fuzz.draw.generate import build_case

    drawn = [build_case(RandomChooser(random.Random(seed)), speculative=None) for seed in range(40)]
    turns = [{s.output for r in case.trace for s in r.prompt if s.output is not None} for case in drawn]
    turns = [
        t | {i for i, r in enumerate(case.trace) if any(s.output is not None for s in r.prompt)}
        for t, case in zip(turns, drawn)
    ]
    outputs = {r.max_tokens for case, t in zip(drawn, turns) for i, r in enumerate(case.trace) if i not in t}
    assert outputs == {1, 2, 4}
    assert all(10 <= case.trace[i].max_tokens <= MAX_DECODE for case, t in zip(drawn, turns) for i in t)


def test_the_split_oracle_flags_a_prefill_chunk_ending_where_no_state_is_needed():
    """check_split: below the prompt's end a chunk ends on the hash grid, at
    the junction, at the budget or within the MTP prefill lookahead of the
    end. The shape of a mutant of ``get_mamba_prefill_checkpoint_position``
    returning ``max(position, 1)``: a 10-token prompt (block and hash 16)
    prefilled as 1 + 9 tokens."""
    from fuzz.judge.oracles import check_split
    from fuzz.replaying.checkbuild import promise_of

    case = make_case(hybrid(16, 16, max_num_batched_tokens=40), [[("A", 10)], [("A", 100)]])
    knobs = {"max_num_scheduled_tokens": 40, "num_prefill_lookahead_tokens": 2}
    ok = [
        {"prompt_tokens": 10, "chunk_ends": [10]},
        {"prompt_tokens": 100, "scheduler_hit": 0, "chunk_ends": [32, 64, 96, 98, 100]},
    ]
    assert check_split(case, "0.33.0", {"hits": [0, 0], "knobs": knobs, "explain": ok}) == []
    stray = [{"prompt_tokens": 10, "chunk_ends": [1, 10]}, ok[1]]
    (div,) = check_split(case, "0.33.0", {"hits": [0, 0], "knobs": knobs, "explain": stray})
    assert (div.oracle, div.requests, div.expected, div.observed) == ("split", [0], [0, 0], [0, 0])
    assert div.context["stray_ends"] == [[1], []] and "ends at 1 of 10" in div.detail
    # a budget-limited chunk (40 tokens from a hit at 16) and the junction are allowed
    odd = [ok[0], {"prompt_tokens": 100, "scheduler_hit": 16, "junction": 61, "chunk_ends": [56, 61, 64, 100]}]
    assert check_split(case, "0.33.0", {"hits": [0, 16], "knobs": knobs, "explain": odd}) == []
    # ... but the same end one token later is not
    odd[1] = {**odd[1], "chunk_ends": [57, 61, 64, 100]}
    (div,) = check_split(case, "0.33.0", {"hits": [0, 16], "knobs": knobs, "explain": odd})
    assert div.context["stray_ends"] == [[], [57]]
    assert promise_of({"oracle": "split", "case": {}, "first_divergence": 0}) == "split"


def test_the_split_oracle_flags_a_step_after_the_prefill_that_schedules_less_than_it_asked_for():
    """check_split, after the prefill: a step schedules the sampled token
    and all its drafts. The shape of a mutant of ``_mamba_block_aligned_split``
    reading ``start > prefill_end`` (split on decode steps too): Qwen3-Next,
    block 576, MTP K=2, a 575-token prompt; its first decode step from 575
    asks for 3 tokens and gets 1, cut at the block boundary 576 (what
    0.33.0 with that mutant does). A cut the budget or max_model_len
    explains is not judged."""
    from fuzz.judge.oracles import check_split

    case = make_case(hybrid(576, 576, max_num_batched_tokens=8192), [[("A", 575)], [("A", 575)]])
    knobs = {"max_num_scheduled_tokens": 8192, "max_model_len": 32768}
    whole = [
        {"prompt_tokens": 575, "chunk_ends": [575], "decode_steps": [[575, 3, 3], [576, 3, 3], [577, 3, 3]]},
        {"prompt_tokens": 575, "chunk_ends": [575], "decode_steps": []},
    ]
    assert check_split(case, "0.33.0", {"hits": [0, 0], "knobs": knobs, "explain": whole}) == []
    cut = [{**whole[0], "decode_steps": [[575, 3, 1], [576, 3, 3], [577, 3, 3]]}, whole[1]]
    (div,) = check_split(case, "0.33.0", {"hits": [0, 0], "knobs": knobs, "explain": cut})
    assert (div.oracle, div.requests, div.expected, div.observed) == ("split", [0], [0, 0], [0, 0])
    assert div.context["cut_steps"] == [[[575, 3, 1]], []] and div.context["stray_ends"] == [[], []]
    assert "from 575, schedules 1 of the 3 tokens" in div.detail and "cut at 576" in div.detail
    # max_model_len 577 caps the step from 575 at 577 - 575 - 1 = 1 token; a budget of 40 may be what cut it
    assert check_split(case, "0.33.0", {"hits": [0, 0], "knobs": {**knobs, "max_model_len": 577}, "explain": cut}) == []
    assert (
        check_split(
            case, "0.33.0", {"hits": [0, 0], "knobs": {**knobs, "max_num_scheduled_tokens": 40}, "explain": cut}
        )
        == []
    )
    assert check_split(case, "0.33.0", {"hits": [0, 0], "knobs": {**knobs, "max_model_len": 579}, "explain": cut}) != []
    # a cut step and a stray prefill end of the same request are two classes
    from fuzz.results.findings import signature

    (chunk,) = check_split(
        case, "0.33.0", {"hits": [0, 0], "knobs": knobs, "explain": [{**whole[0], "chunk_ends": [512, 575]}, whole[1]]}
    )
    assert signature(case, div, knobs) != signature(case, chunk, knobs)


def test_the_checkpoint_oracle_flags_a_last_chunk_split_where_the_kernel_could_export_the_checkpoint():
    """check_checkpoint: a Mamba-2 deployment (grid 1), block 144: a fresh
    200-token prompt's only chunk [0, 200) can export the checkpoint at 144
    from inside (vLLM's is_mamba_prefill_checkpoint_valid: two blocks from
    column -1), so it runs to 200 in one step. The shape of a mutant of that
    function reading the initial state's column as (start + 1) // block:
    the scheduler splits at 144 instead."""
    from fuzz.judge.oracles import check_checkpoint
    from fuzz.replaying.checkbuild import promise_of

    case = make_case(
        hybrid(144, 144, prefill_checkpoint_grid=1, max_num_batched_tokens=2048), [[("A", 200)], [("A", 100)]]
    )
    knobs = {
        "hash_block_size": 144,
        "max_num_scheduled_tokens": 2048,
        "partial_hash_hits": False,
        "eagle_drop": False,
        "hash_lookahead_tokens": 0,
    }
    one = [{"prompt_tokens": 200, "chunk_ends": [200]}, {"prompt_tokens": 100, "chunk_ends": [100]}]
    assert check_checkpoint(case, "0.33.0", {"hits": [0, 0], "knobs": knobs, "explain": one}) == []
    split = [{"prompt_tokens": 200, "chunk_ends": [144, 200]}, one[1]]
    (div,) = check_checkpoint(case, "0.33.0", {"hits": [0, 0], "knobs": knobs, "explain": split})
    assert (div.oracle, div.requests, div.context["needless_splits"]) == ("checkpoint", [0], [[144], []])
    # beyond the budget the chunk must split anyway; without a grid there is nothing to export
    tight = {**knobs, "max_num_scheduled_tokens": 150}
    assert check_checkpoint(case, "0.33.0", {"hits": [0, 0], "knobs": tight, "explain": split}) == []
    plain = make_case(hybrid(144, 144), [[("A", 200)], [("A", 100)]])
    assert check_checkpoint(plain, "0.33.0", {"hits": [0, 0], "knobs": knobs, "explain": split}) == []
    assert promise_of({"oracle": "checkpoint", "case": {}, "first_divergence": 0}) == "checkpoint"


def test_the_hit_blocks_oracle_flags_attention_blocks_beyond_or_missing_below_the_hit():
    """check_hit_blocks: each full-attention group hands a request exactly
    ceil(hit / block) blocks. The shapes of two mutants of vLLM 0.33.0's
    ``find_longest_cache_hit``: one skips the truncation to the reconciled
    hit (a sibling resumed at 0, the Mamba group had no state, with the
    attention group's matched block still in its hit); one never records
    the groups' blocks (``for group_id, blocks in []``), so a request
    resumes at its hit with no block at all."""
    from fuzz.judge.oracles import check_hit_blocks
    from fuzz.replaying.checkbuild import promise_of
    from fuzz.results.findings import signature

    case = make_case(hybrid(144, 144), [[("A", 300)], [("A", 150), ("B", 10)]])
    fine = [
        {"scheduler_hit": 0, "attention_blocks": [[144, 0]]},
        {"scheduler_hit": 144, "attention_blocks": [[144, 1]]},
    ]
    assert check_hit_blocks(case, "0.33.0", {"hits": [0, 144], "explain": fine}) == []
    # a hash-unit hit inside a block takes that block (ceil)
    assert (
        check_hit_blocks(
            case,
            "0.33.0",
            {"hits": [0, 160], "explain": [fine[0], {"scheduler_hit": 160, "attention_blocks": [[144, 2]]}]},
        )
        == []
    )
    extra = [fine[0], {"scheduler_hit": 0, "attention_blocks": [[144, 1]]}]
    (div,) = check_hit_blocks(case, "0.33.0", {"hits": [0, 0], "explain": extra})
    assert (div.oracle, div.requests, div.context["extra_blocks"]) == ("hit_blocks", [1], [0, 1])
    none = [fine[0], {"scheduler_hit": 144, "attention_blocks": [[144, 0]]}]
    (missing,) = check_hit_blocks(case, "0.33.0", {"hits": [0, 144], "explain": none})
    assert missing.context["extra_blocks"] == [0, -1] and "1 fewer than its hit covers" in missing.detail
    knobs = {"eagle_drop": False, "hash_lookahead_tokens": 0}
    assert signature(case, div, knobs) != signature(case, missing, knobs)
    # not recorded (an older observation): not judged
    assert (
        check_hit_blocks(case, "0.33.0", {"hits": [0, 0], "explain": [{"scheduler_hit": 0}, {"scheduler_hit": 0}]})
        == []
    )
    assert promise_of({"oracle": "hit_blocks", "case": {}, "first_divergence": 1}) == "hit-blocks"


def test_the_shared_prefix_oracle_flags_a_junction_full_attention_never_cached():
    """check_shared_prefix: the junction a request reports is 0, or above its
    hit and within its common prefix with an earlier request. The shape of
    a mutant of vLLM 0.33.0's ``find_longest_cache_hit`` that adds the hit
    to the uncached common prefix instead of subtracting it (observed on
    Qwen3-Next, block 544): A:1152 then A:1152+B:1728 resumes at 1088 and
    reports the junction 3264 (the release: none); a sibling sharing 2152
    tokens reports 3808 (the release: 1632)."""
    from fuzz.judge.oracles import check_shared_prefix
    from fuzz.replaying.checkbuild import promise_of
    from fuzz.results.findings import signature

    case = make_case(
        hybrid(544, 544), [[("A", 1152)], [("A", 1152), ("B", 1728)], [("A", 1152), ("B", 1000), ("C", 700)]]
    )
    release = [
        {"scheduler_hit": 0, "junction": 0},
        {"scheduler_hit": 1088, "junction": 0},
        {"scheduler_hit": 1088, "junction": 1632},
    ]
    assert check_shared_prefix(case, "0.33.0", {"hits": [0, 1088, 1088], "explain": release}) == []
    mutant = [release[0], {"scheduler_hit": 1088, "junction": 3264}, {"scheduler_hit": 1088, "junction": 3808}]
    (div,) = check_shared_prefix(case, "0.33.0", {"hits": [0, 1088, 1088], "explain": mutant})
    assert (div.oracle, div.requests, div.expected, div.observed) == (
        "shared_prefix",
        [1, 2],
        [0, 1088, 1088],
        [0, 1088, 1088],
    )
    # the reach: request 1 runs through A:1152 (plus its one output), request 2 shares 2152 with request 1
    assert div.context["bad_junctions"] == [[], [3264, 1088, 1153], [3808, 1088, 2152]]
    assert "past the 1153 tokens" in div.detail
    # a junction at or below the hit
    (low,) = check_shared_prefix(
        case,
        "0.33.0",
        {"hits": [0, 1088, 1088], "explain": [release[0], release[1], {"scheduler_hit": 1632, "junction": 1632}]},
    )
    assert low.context["bad_junctions"][2] == [1632, 1632, 2152] and "not above its hit" in low.detail
    knobs = {"eagle_drop": False, "hash_lookahead_tokens": 0}
    assert signature(case, div, knobs) != signature(case, low, knobs)
    # a junction at the earlier request's outputs: its max_tokens count
    longer = make_case(hybrid(544, 544), [[("A", 1152)], [("A", 1152), ("B", 600)]])
    assert (
        check_shared_prefix(
            longer, "0.33.0", {"hits": [0, 0], "explain": [release[0], {"scheduler_hit": 0, "junction": 1153}]}
        )
        == []
    )
    # not recorded: not judged
    assert (
        check_shared_prefix(
            case, "0.33.0", {"hits": [0, 0, 0], "explain": [{}, {"scheduler_hit": 0}, {"junction": 4000}]}
        )
        == []
    )
    assert promise_of({"oracle": "shared_prefix", "case": {}, "first_divergence": 1}) == "shared-prefix"


def test_the_block_table_oracle_flags_mamba_blocks_freed_or_no_longer_needed():
    """check_block_table: after each step a running request's Mamba block
    table holds no block it freed, and none below the state the step
    starts from that the cache does not hold. The shapes (Qwen3-Next, block
    544, 1088-token chunks): a vLLM 0.33.0 whose Mamba manager gives back
    no skipped block lets A:5000's chunk-end states pile up, one more per
    chunk; one that frees the running state's block leaves it in the table
    with reference count 0. The release: neither."""
    from fuzz.judge.oracles import check_block_table
    from fuzz.replaying.checkbuild import promise_of
    from fuzz.results.findings import signature

    case = make_case(hybrid(544, 544), [[("A", 5000)], [("A", 5000)]])
    release = [{"scheduler_hit": 0, "block_table": []}, {"scheduler_hit": 4896, "block_table": []}]
    assert check_block_table(case, "0.33.0", {"hits": [0, 4896], "explain": release}) == []
    leaking = [
        {"scheduler_hit": 0, "block_table": [[2176, 1, 0], [3264, 2, 0], [4352, 3, 0], [4896, 4, 0]]},
        release[1],
    ]
    (div,) = check_block_table(case, "0.33.0", {"hits": [0, 4896], "explain": leaking})
    assert (div.oracle, div.requests, div.expected, div.observed) == ("block_table", [0], [0, 4896], [0, 4896])
    assert div.context["block_table"] == [[[2176, 1, 0], [3264, 2, 0], [4352, 3, 0], [4896, 4, 0]], []]
    assert (
        "1 block(s) below the state" in div.detail
        and "starting at 2176" in div.detail
        and "3 more step(s)" in div.detail
    )
    assert "freed" not in div.detail.split("held")[1].split("once")[0]
    (freed,) = check_block_table(
        case,
        "0.33.0",
        {"hits": [0, 4896], "explain": [release[0], {"scheduler_hit": 4896, "block_table": [[5000, 0, 1]]}]},
    )
    assert freed.requests == [1] and "1 block(s) it had freed" in freed.detail and "below" not in freed.detail
    # a block reference left once a request finished: flagged where the count rises, not after
    left = [
        {"block_table": [], "leaked_blocks": 0},
        {"block_table": [], "leaked_blocks": 3},
        {"block_table": [], "leaked_blocks": 3},
    ]
    (leak,) = check_block_table(case, "0.33.0", {"hits": [0, 4896, 4896], "explain": left})
    assert leak.requests == [1] and leak.context["leaked_blocks"] == [0, 3, 0]
    assert "request 1 finished with 3 more block reference(s)" in leak.detail
    assert (
        check_block_table(case, "0.33.0", {"hits": [0, 4896], "explain": [{"leaked_blocks": 0}, {"leaked_blocks": 0}]})
        == []
    )
    # not recorded (an older observation): not judged
    assert check_block_table(case, "0.33.0", {"hits": [0, 0], "explain": [{}, {"scheduler_hit": 0}]}) == []
    assert promise_of({"oracle": "block_table", "case": {}, "first_divergence": 0}) == "block-table"
    assert len(signature(case, div, {"eagle_drop": False, "hash_lookahead_tokens": 0})) == 16


def test_the_resolution_oracle_makes_a_dropped_prefix_match_unit_a_finding(tmp_path):
    """check_resolution: with ``--prefix-match-unit 16`` the resolved hash
    block is 16 (vLLM's CacheConfig: "This equals to the hash_block_size
    used throughout the KV cache code"). The shape of a mutant of vLLM
    0.33.0's ``resolve_kv_cache_block_sizes`` (``len(groups) <= 1`` ->
    ``> 1``: a hybrid takes the one-group branch and hashes on its block):
    before this oracle kvspec counted it as its own harness error (its case
    format refuses the geometry). A campaign now writes a finding on the
    unresolved case (one request, no request diverging), which the judge
    replays; a build that keeps the unit gives none."""
    from fuzz.judge.oracles import check_resolution
    from fuzz.judge.verdict import observe_and_judge
    from fuzz.replaying.checkbuild import promise_of
    from fuzz.results.triage import read_findings, triage
    from reference.case import parse_case
    from tests.fuzz.doubles import ResolvingDouble

    dep = {
        "model": "qwen3_next",
        "platform": "cuda",
        "device": "a100",
        "vllm_args": ["--enable-prefix-caching", "--prefix-match-unit", "16"],
    }
    case = parse_case(
        {
            "schema": 1,
            "deployment": dep,
            "trace": [{"prompt": [{"segment": "A", "length": 1152}]}, {"prompt": [{"segment": "A", "length": 1152}]}],
        }
    )
    dropping = ResolvingDouble(hashed=544)
    (div,) = check_resolution(case, dropping.version, dropping.run(case))
    assert (div.oracle, div.requests, div.expected, div.observed, div.context["rule"]) == (
        "resolution",
        [],
        [0, 0],
        [0, 0],
        "prefix_match_unit",
    )
    assert "--prefix-match-unit 16" in div.detail and "hash_block_size=544" in div.detail
    assert check_resolution(case, "0.33.0", ResolvingDouble().run(case)) == []  # the unit kept
    no_unit = parse_case(
        {
            **json.loads(
                json.dumps(
                    {
                        "schema": 1,
                        "deployment": {**dep, "vllm_args": ["--enable-prefix-caching"]},
                        "trace": [{"prompt": [{"segment": "A", "length": 8}]}],
                    }
                )
            )
        }
    )
    assert check_resolution(no_unit, "0.33.0", dropping.run(no_unit)) == []  # no unit asked for
    assert (
        check_resolution(case, "0.33.0", {"error": {"kind": "vllm"}, "resolution": dropping.run(case)["resolution"]})
        == []
    )
    # a build that accepts a unit vLLM rejects (48 does not divide 544): the shape of blocks-eab54c26
    loose = parse_case(
        {
            "schema": 1,
            "deployment": {**dep, "vllm_args": ["--enable-prefix-caching", "--prefix-match-unit", "48"]},
            "trace": [{"prompt": [{"segment": "A", "length": 8}]}],
        }
    )
    (undivided,) = check_resolution(loose, "0.33.0", ResolvingDouble().run(loose))
    assert (
        undivided.context["rule"] == "hash_divides_blocks"
        and undivided.context["resolution"]["blocks"] == [544]
        and "does not divide" in undivided.detail
    )
    assert promise_of({"oracle": "resolution", "case": {}, "first_divergence": None}) == "flags"

    campaign = Campaign(dropping, tmp_path, oracles=("resolution",), seed=1)
    (path,) = campaign.check(case)
    assert campaign.stats.harness_errors == 0
    finding_case, finding = load_finding(path)
    assert (
        finding["oracle"] == "resolution" and finding["first_divergence"] is None and len(finding_case.trace) == 1
    )  # shrunk to one request
    assert "not judged further" in render(finding)
    described, malformed = read_findings(tmp_path)
    assert malformed == [] and triage(described)[0]["geometry"] == "unresolved"
    assert observe_and_judge(finding_case, finding, dropping).verdict.verdict == "reproduced"
    assert observe_and_judge(finding_case, finding, ResolvingDouble()).verdict.verdict == "not reproduced"


def test_a_drawn_unit_that_does_not_divide_the_block_is_kept_only_where_the_engine_accepts_it():
    """The generator's --prefix-match-unit choices include one that does not
    divide the block; a resolver that rejects it (a release) gets the case
    without the flag, one that accepts it (a build that lost vLLM's check)
    gets it. TEST DOUBLES: the resolvers answer every deployment with
    block 544."""
    from fuzz.draw.choosers import RandomChooser
    from fuzz.draw.generate import build_case

    def release(dep):
        args = dep["vllm_args"]
        unit = int(args[args.index("--prefix-match-unit") + 1]) if "--prefix-match-unit" in args else None
        return None if unit and 544 % unit else {"block": 544, "hash": unit or 544, "max_model_len": 32768}

    def lenient(dep):
        return {"block": 544, "hash": 544, "max_model_len": 32768}

    def units(resolver):
        rng = random.Random(3)
        out = []
        for _ in range(200):
            args = build_case(RandomChooser(rng), resolver=resolver).deployment.vllm_args
            out.append(int(args[args.index("--prefix-match-unit") + 1]) if "--prefix-match-unit" in args else None)
        return out

    kept = units(lenient)
    assert any(u and 544 % u for u in kept)  # drawn
    assert not any(u and 544 % u for u in units(release))  # dropped where rejected
    assert sum(u is not None for u in units(release)) < sum(u is not None for u in kept)


def test_a_class_that_asks_for_a_hash_unit_keeps_one_the_release_accepts():
    """The class schedule gives each class its share of cases: where the
    release refuses the drawn unit that does not divide the block, a case of
    a unit class gets a dividing unit instead of none (a resolver test
    double: block 544, units that do not divide it rejected)."""
    from fuzz.draw.choosers import RandomChooser
    from fuzz.draw.generate import DeploymentClass, build_case

    def release(dep):
        args = dep["vllm_args"]
        unit = int(args[args.index("--prefix-match-unit") + 1]) if "--prefix-match-unit" in args else None
        return None if unit and 544 % unit else {"block": 544, "hash": unit or 544, "max_model_len": 32768}

    rng = random.Random(5)
    cls = DeploymentClass("qwen3_next", "off", True, "sparse")
    drawn = []
    for _ in range(60):
        args = build_case(RandomChooser(rng), resolver=release, cls=cls).deployment.vllm_args
        drawn.append(int(args[args.index("--prefix-match-unit") + 1]) if "--prefix-match-unit" in args else None)
    assert all(u is not None and 544 % u == 0 for u in drawn), drawn
    assert {16, 32} <= set(drawn)


def test_vllm_raising_before_it_resolves_a_deployment_is_a_finding_not_a_harness_error(tmp_path):
    """An engine_error at setup on a deployment case leaves no geometry to
    judge: the finding's signature, text and class do without one (the
    signature read the geometry and raised, which the campaign filed as 45
    harness errors on blocks-eab54c26)."""
    from fuzz.results.triage import read_findings, triage
    from reference.case import parse_case
    from tests.fuzz.doubles import SetupErrorDouble

    dep = {
        "model": "qwen3_next",
        "platform": "cuda",
        "device": "a100",
        "vllm_args": ["--enable-prefix-caching", "--prefix-match-unit", "48"],
    }
    case = parse_case(
        {
            "schema": 1,
            "deployment": dep,
            "trace": [{"prompt": [{"segment": "A", "length": 600}]}, {"prompt": [{"segment": "A", "length": 600}]}],
        }
    )
    campaign = Campaign(SetupErrorDouble(), tmp_path, seed=1)
    (path,) = campaign.check(case)
    assert campaign.stats.harness_errors == 0
    _case, finding = load_finding(path)
    assert finding["oracle"] == "engine_error" and "not resolved" in render(finding)
    described, malformed = read_findings(tmp_path)
    assert malformed == [] and triage(described)[0]["geometry"] == "unresolved"


def test_every_text_that_lists_a_builds_oracles_names_each_of_them():
    """The help of --patch, check-build's epilog and docs/check-build.md's
    sentence name every oracle that judges a build (fuzz.judge.oracles.BUILD_ORACLES), and check-build has a
    promise row for each finding an oracle can make."""
    from pathlib import Path

    from fuzz.judge.oracles import BUILD_ORACLES
    from fuzz.replaying.checkbuild import PROMISES, promise_of
    from kvspec.commands import check_build
    from kvspec.engine_options import NOTE

    root = Path(__file__).resolve().parents[2]
    readme = " ".join((root / "docs" / "check-build.md").read_text().split())
    readme = readme[readme.index("a build is judged by") :][:400]  # the sentence that lists them
    epilog = " ".join(check_build.EPILOG.split())
    for name in BUILD_ORACLES:
        if name != "junction":
            assert name in NOTE and f"`{name}`" in readme, name
        if name != "versions":  # check-build judges one engine
            assert name in epilog, name
    ids = {p for p, _n, _w in PROMISES}
    for name in (
        "stale",
        "cap",
        "keys",
        "draft_keys",
        "resumed_state",
        "retention",
        "split",
        "checkpoint",
        "hit_blocks",
        "shared_prefix",
        "block_table",
        "resolution",
        "engine_error",
    ):
        assert promise_of({"oracle": name, "case": {}, "first_divergence": 0}) in ids, name


def test_the_stale_oracle_flags_a_state_held_where_the_request_wrote_none():
    """check_stale's second rule (stale_keys): the shape of vLLM 0.32.0's
    and 0.33.0's stale state after a partial hit on Falcon-H1 (block 144,
    hash unit 16, sparse retention; .kvspec/figs/stale-032): A:1153 resumes
    at A:1008's hash-unit checkpoint 992 and prefills to 1153 in one chunk,
    yet leaves a state held at 1008, which it never computed (A:1008 wrote
    one there, but did not keep it). A:1009 then resumes at 1008: a position
    an earlier prefill wrote, so the hit rule alone lets it pass."""
    from fuzz.judge.oracles import check_stale

    case = make_case(
        hybrid(144, 144, prefix_match_unit=16, prefill_checkpoint_grid=1), [[("A", 1008)], [("A", 1153)], [("A", 1009)]]
    )

    def ex(written, held):
        return {"written": written, "retained_mamba_blocks": {"144": []}, "retained_mamba_tokens": {"0": held}}

    release = [ex([992, 1008], [992]), ex([1152, 1153], [992, 1008, 1152]), ex([1009], [992, 1008])]
    (div,) = check_stale(case, "0.33.0", {"hits": [0, 992, 1008], "explain": release})
    assert (div.oracle, div.requests, div.context["stale_keys"]) == ("stale", [1], [[], [1008], []])
    assert div.expected == div.observed == [0, 992, 1008] and "left Mamba states at [1008]" in div.detail
    # the fixed build stops the chunk at 1008, so the state there is written
    fixed = [ex([992, 1008], [992]), ex([1008, 1152, 1153], [992, 1008, 1152]), ex([1009], [992, 1008])]
    assert check_stale(case, "0.33.0", {"hits": [0, 992, 1008], "explain": fixed}) == []


def test_the_stale_oracle_lets_a_connector_load_an_earlier_write_back():
    """stale_keys' exception: stale-052d07f8's shape (Qwen3-Next, block 560,
    an offloading connector, pool 25): A:2352+B:449 writes 560..2801, the
    pool evicts its states at 560 and 1120; A:1695+C:1 resumes at 1120 from
    the connector (``external_hit``) and holds the loaded block at 1120,
    which it caches as its own (vLLM 0.33.0 kv_cache_manager.py:590-600).
    That is request 0's write brought back, not a state it never computed;
    without the load, or over a position nobody wrote, the rule fires."""
    from fuzz.judge.oracles import check_stale

    case = make_case(hybrid(560, 560), [[("A", 2352), ("B", 449)], [("A", 1695), ("C", 1)]])

    def run(first_written, external):
        explain = [
            {"written": first_written, "retained_mamba_blocks": {"560": [2, 3, 4]}},
            {"written": [1680, 1696], "retained_mamba_blocks": {"560": [1, 2]}, "external_hit": external},
        ]
        return check_stale(case, "0.33.0", {"hits": [0, 1120], "explain": explain})

    assert run([560, 1120, 1680, 2240, 2800, 2801], 1120) == []
    (div,) = run([560, 1120, 1680, 2240, 2800, 2801], 0)  # held at 1120 with no load: keyed, never computed
    assert div.context["stale_keys"] == [[], [1120]]
    (div,) = run([560, 1680, 2240, 2800, 2801], 1120)  # loaded where no earlier prefill wrote
    assert div.requests == [1] and div.context["stale_keys"] == [[], [1120]]


def test_attention_free_draws_carry_a_block_size_and_only_a_unit_the_engine_accepts():
    """The generator draws the attention-free models with a --block-size of
    {default, 64, 256, 1024} and keeps a --prefix-match-unit on them only
    where the resolver accepts it (one KV cache group refuses any unit but
    the block on 0.32.0+); --enable-mamba-shared-prefix-checkpoint comes
    only with MTP and a unit below the block, and is dropped where the
    resolver refuses it. (The resolver is a test double: the block a
    deployment sets, 544 for a hybrid; it refuses any unit on an
    attention-free model and the shared-prefix flag everywhere.)"""
    from fuzz.draw.choosers import RandomChooser
    from fuzz.draw.generate import ATTENTION_FREE_MODELS, MTP_MODELS, build_deployment_case

    asked = []

    def resolver(dep: dict) -> dict | None:
        args = dep["vllm_args"]
        asked.append(list(args))
        if "--enable-mamba-shared-prefix-checkpoint" in args:
            return None
        if dep["model"] in ATTENTION_FREE_MODELS:
            if "--prefix-match-unit" in args:
                return None
            block = int(args[args.index("--block-size") + 1]) if "--block-size" in args else 16
            return {"block": block, "hash": block, "max_model_len": 2048}
        return {"block": 544, "hash": 544, "max_model_len": 32768}

    rng = random.Random(11)
    sizes, free, units_kept = set(), 0, 0
    for _ in range(600):
        case = build_deployment_case(RandomChooser(rng), resolver)
        args = case.deployment.vllm_args
        assert "--enable-mamba-shared-prefix-checkpoint" not in args
        if case.deployment.model in ATTENTION_FREE_MODELS:
            free += 1
            sizes.add(args[args.index("--block-size") + 1] if "--block-size" in args else None)
            assert "--prefix-match-unit" not in args
            assert max(r.num_prompt_tokens for r in case.trace) <= 2048 - 64
        elif "--prefix-match-unit" in args:
            units_kept += 1
    flags_asked = sum(1 for a in asked if "--enable-mamba-shared-prefix-checkpoint" in a)
    assert free > 60 and sizes == {None, "64", "256", "1024"}
    assert units_kept > 0 and flags_asked > 0
    assert all(
        "--speculative-config" in a and "--prefix-match-unit" in a
        for a in asked
        if "--enable-mamba-shared-prefix-checkpoint" in a
    )
    assert not any(m in ATTENTION_FREE_MODELS for m in MTP_MODELS)


def test_lengths_include_a_short_remainder_past_a_block_multiple():
    """Biased lengths are kB-1, kB, kB+1 and kB+r with 2 <= r <= k, where
    N % B and N // B meet in replay_boundaries' arithmetic."""
    from fuzz.draw.choosers import RandomChooser
    from fuzz.draw.generate import _length

    rng = random.Random(5)
    block = 144
    seen = {_length(RandomChooser(rng), block) for _ in range(3000)}
    short = {n for n in seen if 2 <= n % block <= n // block}
    assert short and all(n % block <= 8 for n in short)
    assert {block - 1, block, block + 1} <= seen


def test_variant_runs_are_made_only_where_their_oracle_can_fire():
    """sparse_dense fires only below the promise, spec_on_off only where the
    first repeat misses it: a case that keeps the promise costs no variant
    run; one that misses it gets both."""
    case = make_case(hybrid(1600, 1600), [[("A", 11910)]] * 3, MTP_DROP)
    for rule, variants in (("promise", 0), ("legacy", 2)):
        engine = ReferenceDouble("0.29.0", rule)
        ran = []
        check_all(
            case, "0.29.0", engine.run(case), lambda c: ran.append(c) or engine.run(c), ("sparse_dense", "spec_on_off")
        )
        assert len(ran) == variants, (rule, len(ran))


def test_a_hash_unit_finer_than_the_block_is_another_signature():
    """The longer sibling of a block-aligned prompt misses one block without
    a hash unit and one hash unit with one: two classes, both written."""
    from fuzz.judge.oracles import Divergence
    from fuzz.results.findings import signature

    plain = make_case(hybrid(544, 544, retention_interval=0), [[("A", 1088)], [("A", 1100)]])
    hashed = make_case(hybrid(544, 544, prefix_match_unit=32, retention_interval=0), [[("A", 1088)], [("A", 1100)]])
    div = Divergence("promise", "0.33.0", [1], [0, 1088], [0, 1056], "")
    knobs = {"eagle_drop": False, "hash_lookahead_tokens": 0}
    assert signature(plain, div, knobs) != signature(hashed, div, knobs)


def test_swarm_leaves_features_out_per_case_and_atheris_inputs_keep_every_one():
    """Swarm testing: each random case draws a subset of trace features
    from the chooser's side stream (never an empty kind); a chooser without
    a side stream (atheris bytes, Hypothesis) uses every feature, so its
    inputs mean what they meant."""
    from fuzz.draw.choosers import BytesChooser, RandomChooser
    from fuzz.draw.generate import EVERY_FEATURE, Swarm, _length, _trace, draw_swarm

    rng = random.Random(11)
    swarms = [draw_swarm(RandomChooser(random.Random(rng.random()))) for _ in range(300)]
    assert all(s.ops and s.offsets for s in swarms)
    assert len({s.ops for s in swarms}) > 8 and len({s.offsets for s in swarms}) == 15
    assert any(not s.uniform for s in swarms) and any(not s.unit_points for s in swarms)
    assert draw_swarm(BytesChooser(b"\x01\x02")) == EVERY_FEATURE
    c = RandomChooser(random.Random(2))
    state = c._rng.getstate()
    draw_swarm(c)
    assert c._rng.getstate() == state  # drawn beside the stream, not from it
    exact = Swarm(offsets=(0,), unit_points=False, uniform=False)
    assert all(_length(RandomChooser(rng), 544, swarm=exact) % 544 == 0 for _ in range(200))
    only_extend = Swarm(ops=("extend",))
    for _ in range(50):
        r = RandomChooser(random.Random(rng.random()))
        r_swarm = lambda c: only_extend  # noqa: E731
        import fuzz.draw.traces as G  # where _trace looks draw_swarm up

        saved, G.draw_swarm = G.draw_swarm, r_swarm
        try:
            trace = _trace(r, 544)
        finally:
            G.draw_swarm = saved
        prompts = [json.dumps(r["prompt"]) for r in trace]
        assert len(set(prompts)) == len(prompts)  # no resend: a later request is a fresh prompt or extends one


def test_a_case_drawn_for_a_deployment_class_is_of_that_class():
    """Every class the schedule walks gets cases of that class (a resolver
    test double that accepts every deployment at block 544). The "off"
    classes of the MTP models used to draw MTP: 12 of 66 classes were
    never run, and their share went to the MTP classes."""
    from fuzz.draw.choosers import RandomChooser
    from fuzz.draw.generate import build_case, deployment_classes
    from fuzz.driving.reach import deployment_class_of

    def lenient(dep):
        return {"block": 544, "hash": 544, "max_model_len": 32768}

    rng = random.Random(4)
    for cls in deployment_classes():
        for _ in range(3):
            case = build_case(RandomChooser(rng), resolver=lenient, cls=cls)
            assert deployment_class_of(case) == cls, (cls.label(), case.deployment.vllm_args)
