"""advise.sglang on a resolution stated by hand (a named test double of
SGLang's resolution summary, never a differential check): SGLang's rule,
the promise where stated, the lost reuse, stale resumes named."""

from __future__ import annotations

from advise.sglang import advise, notes
from reference.case import parse_case


def _resolution(chunk: int, geometry: bool) -> dict:
    g = {
        "groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 64}],
        "hash_block_size": 64,
        "scheduler_block_size": 64,
        "prefix_match_unit": None,
        "retention_interval": 0,
        "max_num_batched_tokens": chunk,
    }
    return {
        "page_size": 64,
        "chunked_prefill_size": chunk,
        "extra_buffer": True,
        "mamba_radix_cache_strategy": "extra_buffer",
        "mamba_cache_chunk_size": 64,
        "checkpoint_grid": 64,
        "mamba_state_chunk_size": 64,
        "mamba_max_states_per_path": -1,
        "geometry": g if geometry else None,
    }


def _case(prompts):
    return parse_case(
        {
            "schema": 1,
            "name": "w",
            "deployment": {"model": "qwen3_next", "engine": "sglang"},
            "trace": [{"prompt": [{"segment": s, "length": n} for s, n in p]} for p in prompts],
        }
    )


def test_a_grid_multiple_resend_loses_what_the_promise_keeps():
    a = advise(_case([[("A", 3200)]] * 3), _resolution(2048, True), "sglang==0.5.23")
    assert [r["implemented"] for r in a["requests"]] == [0, 2048, 3136] and [r["promise"] for r in a["requests"]] == [
        0,
        3136,
        3136,
    ]
    assert a["lost_tokens"] == 1088 and "keep-cut" in " ".join(notes(a))


def test_a_budget_off_the_page_is_named_for_its_stale_resume():
    a = advise(_case([[("A", 3000)]] * 3), _resolution(1000, False), "sglang==0.5.23")
    assert a["stale_resumes"] == [1] and "promise_not_stated" in a
    assert any("launch check refuses" in line for line in notes(a))
