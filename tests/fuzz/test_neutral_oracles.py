"""The oracles that state the promise judge any engine family
(``neutral`` in fuzz/judge/oracle_registry.py); the others are vLLM's. The
observations here are hand-written test doubles of what a driver reports."""

from __future__ import annotations

from fuzz.judge.oracles import NEUTRAL_ORACLES, ORACLES, check_promise, check_resumed_state, check_versions, oracles_for
from reference.case import parse_case, with_resolution

GRID = {
    "groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 64}],
    "hash_block_size": 64,
    "scheduler_block_size": 64,
    "prefix_match_unit": None,
    "retention_interval": 0,
    "max_num_batched_tokens": 2048,
}
RAW = {
    "schema": 1,
    "deployment": {"model": "qwen3_next", "engine": "sglang", "sglang_args": []},
    "trace": [{"prompt": [{"segment": "A", "length": 3200}]}, {"prompt": [{"segment": "A", "length": 3200}]}],
}


def _obs(hits, resumed=None, core=None):
    explain = [
        {"request": i, "hit": h, "written": [3200], "resumed_state": (resumed or {}).get(i)} for i, h in enumerate(hits)
    ]
    return {
        "hits": hits,
        "queries": [3200] * len(hits),
        "explain": explain,
        **({"harness": {"tree_core": core}} if core else {}),
    }


def test_another_family_is_judged_by_the_promises_own_oracles_only():
    assert oracles_for("sglang==0.5.23") == (
        "promise",
        "stale",
        "cap",
        "keys",
        "draft_keys",
        "resumed_state",
        "versions",
        "engine_error",
    )
    assert NEUTRAL_ORACLES == oracles_for("sglang==0.5.23") + (
        "outputs",
    )  # outputs: run when asked (a family with real weights)
    assert oracles_for("0.33.0") == ORACLES and "reference" in ORACLES and "reference" not in NEUTRAL_ORACLES


def test_the_promise_is_not_stated_where_no_geometry_was_resolved():
    unresolved = parse_case(RAW)  # SGLang's no_buffer: the driver resolves no geometry
    assert check_promise(unresolved, "sglang==0.5.23", _obs([0, 0])) == []
    resolved = with_resolution(unresolved, GRID, None, "sglang==0.5.23")
    div = check_promise(resolved, "sglang==0.5.23", _obs([0, 2048]))
    assert div and div[0].requests == [1] and div[0].expected[1] == 3136


def test_a_resumed_state_of_other_tokens_is_a_wrong_answer():
    case = parse_case(RAW)
    good = _obs([0, 3136], {1: {"tokens": 3136, "same_tokens": True}})
    assert check_resumed_state(case, "sglang==0.5.23", good) == []
    bad = _obs([0, 3136], {1: {"tokens": 3136, "same_tokens": False}})
    div = check_resumed_state(case, "sglang==0.5.23", bad)
    assert div[0].oracle == "resumed_state" and div[0].requests == [1] and div[0].expected == [0, 0]
    assert "computed over 3136 tokens that are not its first 3136" in div[0].detail
    assert check_resumed_state(case, "0.33.0", _obs([0, 3136])) == []  # not observed (vLLM's driver): not judged


def test_the_tree_cores_are_named_in_a_versions_divergence():
    case = parse_case(RAW)
    div = check_versions(case, "sglang==0.5.23", _obs([0, 2048]), "sglang==0.5.23", _obs([0, 3136], core="rust"))
    assert div[0].detail == "expected = sglang==0.5.23 (rust tree core)"
    assert check_versions(case, "0.33.0", _obs([0, 1]), "0.29.0", _obs([0, 2]))[0].detail == "expected = vllm==0.29.0"
