"""The seed case (vLLM #53504) on the real schedulers of 0.29.0 and 0.33.0."""

from __future__ import annotations

import pytest

from tests.conftest import MTP, MTP_DROP, hybrid, make_case

pytestmark = pytest.mark.engine

SEED_GEOMETRY = hybrid(1600, 1600, retention_interval=0, max_num_batched_tokens=8192)
SEED_PROMPTS = [[("A", 11910)]] * 3


def seed(speculative):
    return make_case(SEED_GEOMETRY, SEED_PROMPTS, speculative, name="seed-53504")


def test_seed_029_mtp_misses_the_first_repeat(engine_029):
    result = engine_029.run(seed(MTP_DROP))
    assert "error" not in result, result.get("error")
    assert result["hits"] == [0, 0, 9600]
    assert result["queries"] == [11910, 11910, 11910]
    knobs = result["knobs"]
    assert knobs["version"] == "0.29.0"
    assert knobs["eagle_drop"] is True
    assert knobs["hash_lookahead_tokens"] == 0
    assert (knobs["scheduler_block_size"], knobs["hash_block_size"], knobs["alignment"]) == (1600, 1600, 1600)
    ex = result["explain"]
    # the first repeat leaves a junction at 9600, which rescues the second
    assert [e["scheduler_hit"] for e in ex] == [0, 0, 9600]
    assert ex[1]["junction"] == 9600
    assert ex[0]["chunk_ends"] == [8000, 9600, 11910]
    assert ex[0]["retained_mamba_blocks"] == {"1600": []}
    assert ex[1]["retained_mamba_blocks"] == {"1600": [5]}
    assert ex[0]["boundaries"] is None  # 0.29.0 has no replay_boundaries


def test_seed_029_plain_mtp_is_the_drop(engine_029):
    # 0.29.0 has no lookahead hashes: plain MTP means the EAGLE block drop
    result = engine_029.run(seed(MTP))
    assert result["hits"] == [0, 0, 9600]
    assert result["knobs"]["ignored_options"] == {}


def test_seed_033_with_block_drop(engine_033):
    result = engine_033.run(seed(MTP_DROP))
    assert "error" not in result, result.get("error")
    assert result["hits"] == [0, 9600, 9600]
    knobs = result["knobs"]
    assert knobs["version"] == "0.33.0"
    assert knobs["eagle_drop"] is True
    assert knobs["hash_lookahead_tokens"] == 0
    assert knobs["alignment"] == 1600
    ex = result["explain"]
    assert ex[0]["boundaries"] == [9600]  # replay_boundaries(11910, 1600, eagle)
    assert ex[0]["retained_mamba_blocks"] == {"1600": [5]}


def test_seed_033_plain_mtp_uses_lookahead_hashes(engine_033):
    result = engine_033.run(seed(MTP))
    assert result["hits"] == [0, 11200, 11200]
    assert result["knobs"]["eagle_drop"] is False
    assert result["knobs"]["hash_lookahead_tokens"] == 1


@pytest.mark.parametrize("version", ["0.29.0", "0.33.0"])
def test_seed_spec_off(engines, version):
    result = engines(version).run(seed(None))
    assert result["hits"] == [0, 11200, 11200]
    assert result["knobs"]["eagle_drop"] is False
    assert result["queries"] == [11910] * 3


def test_results_are_deterministic(engine_033):
    case = seed(MTP_DROP)
    a, b = engine_033.run(case), engine_033.run(case)
    a.pop("timing"), b.pop("timing")
    assert a == b


@pytest.mark.parametrize("version, hits", [("0.29.0", [0, 0, 9600]), ("0.33.0", [0, 9600, 9600])])
def test_a_block_aligned_prompt_without_drafts_misses_the_first_repeat_on_0_29_only(engines, version, hits):
    """The ``aligned-resend`` class (fuzz.results.known_classes): #53504's
    geometry with 11,200 = 7 x 1600 tokens and no drafts. 0.29.0's first
    prefill stops its chunks at 8000 and 11200 (its end, the last cacheable
    position), so the state at 9600 the repeat resumes from is first
    written by the repeat itself; 0.33.0 stops a chunk at 9600. 11,910
    tokens (not block-aligned) hit 11200 on both."""
    geometry = hybrid(1600, 1600, retention_interval=0, max_num_batched_tokens=8192)
    aligned = engines(version).run(make_case(geometry, [[("A", 11200)]] * 3, None))
    assert aligned["hits"] == hits
    assert aligned["explain"][0]["chunk_ends"] == ([8000, 11200] if version == "0.29.0" else [8000, 9600, 11200])
    unaligned = engines(version).run(make_case(geometry, [[("A", 11910)]] * 3, None))
    assert unaligned["hits"] == [0, 11200, 11200]
