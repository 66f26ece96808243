"""The safety oracles (fuzz/judge/oracle_safety.py): a hit is never higher than
an engine may safely resume. The observations are hand-written test
doubles of what a driver reports (hits and explain); the rules are computed
by kvspec from the case's tokens."""

from __future__ import annotations

from fuzz.judge.oracle_registry import BY_NAME, SAFETY_ORACLES
from fuzz.judge.oracles import check_all, check_cap, check_draft_keys, check_keys
from fuzz.judge.verdict import Target, judge
from tests.conftest import hybrid, make_case

MTP = {"method": "mtp", "num_speculative_tokens": 1}


def _obs(hits, **per_request):
    explain = [
        {"request": i, "hit": h, **{k: v[i] for k, v in per_request.items() if i in v}} for i, h in enumerate(hits)
    ]
    return {"hits": list(hits), "queries": [0] * len(hits), "explain": explain}


def test_no_request_resumes_at_or_past_the_last_position_it_must_compute():
    case = make_case(hybrid(16, 16), [[("A", 48)]] * 2)
    assert check_cap(case, "0.33.0", _obs([0, 47])) == []
    div = check_cap(case, "0.33.0", _obs([0, 48], external_hit={1: 32}))
    assert (
        div[0].oracle == "cap" and div[0].requests == [1] and div[0].expected == [0, 47] and div[0].observed == [0, 48]
    )
    assert "32 of them loaded by a KV connector" in div[0].detail


def test_the_cap_a_family_reports_is_read_from_the_observation():
    case = make_case(hybrid(16, 16), [[("A", 48)]] * 2)
    div = check_cap(case, "sglang==0.5.23", _obs([0, 40], resume_cap={1: 32}))
    assert div[0].requests == [1] and div[0].expected[1] == 32
    assert check_cap(case, "sglang==0.5.23", _obs([0, 32], resume_cap={1: 32})) == []


def test_a_hit_over_tokens_no_earlier_request_keyed_is_unsafe_reuse():
    case = make_case(hybrid(16, 16), [[("A", 48)], [("A", 32), ("B", 16)]])
    assert check_keys(case, "0.33.0", _obs([0, 32])) == []
    div = check_keys(case, "0.33.0", _obs([0, 47]))
    assert div[0].oracle == "keys" and div[0].requests == [1] and div[0].expected == [0, 32]
    fresh = make_case(hybrid(16, 16), [[("A", 48)], [("B", 48)]])
    assert check_keys(fresh, "0.33.0", _obs([0, 16]))[0].expected == [0, 0]


def test_under_lookahead_hashes_the_token_after_the_hit_is_part_of_the_key():
    """vLLM 0.33.0 MTP: the block ending at 32 is keyed with token 32; the
    second prompt has another token there, so a hit at 32 reuses the
    drafter's KV computed for another next token. Before 0.33.0 (no
    lookahead hashes) the same hit is safe."""
    case = make_case(hybrid(16, 16), [[("A", 48)], [("A", 32), ("B", 16)]], speculative=MTP)
    div = check_draft_keys(case, "0.33.0", _obs([0, 32]))
    assert (
        div[0].oracle == "draft_keys"
        and div[0].requests == [1]
        and div[0].expected == [0, 16]
        and div[0].context["lookahead"] == 1
    )
    assert check_draft_keys(case, "0.33.0", _obs([0, 16])) == []
    assert check_draft_keys(case, "0.32.0", _obs([0, 32])) == []
    # a build is judged by its release's rule, whatever its own hasher does
    assert check_draft_keys(case, "0.33.0+nolookahead.0123ab", _obs([0, 32]))[0].requests == [1]
    # an earlier request long enough to hash that block with the same next token keys it
    same = make_case(hybrid(16, 16), [[("A", 48)], [("A", 40)]], speculative=MTP)
    assert check_draft_keys(same, "0.33.0", _obs([0, 32])) == []


def test_the_safety_oracles_take_the_typed_engine_and_judge_as_with_its_key(monkeypatch):
    """Issue 41: handed the typed engine (a build of 0.33.0), ``check_all``
    gives its safety checks the ``EngineSpec`` itself: the same divergences
    as with the version key, recorded under the key, and no name parsed
    again (the parser is never called)."""
    from ground.engines import EngineSpec

    case = make_case(hybrid(16, 16), [[("A", 48)], [("A", 32), ("B", 16)]], speculative=MTP)
    build = EngineSpec("vllm", "0.33.0", "nolookahead", "0123ab")
    by_key = check_all(case, build.version, _obs([0, 32]), None, SAFETY_ORACLES)

    def refuse(cls, text, field="engine"):
        raise AssertionError(f"parsed again: {text}")

    monkeypatch.setattr(EngineSpec, "parse", classmethod(refuse))
    typed = check_all(case, build, _obs([0, 32]), None, SAFETY_ORACLES)
    assert [d.oracle for d in typed] == ["draft_keys"] and typed == by_key
    assert typed[0].version == "0.33.0+nolookahead.0123ab"


def test_the_safety_oracles_are_neutral_judge_builds_and_rank_above_lost_reuse():
    assert set(SAFETY_ORACLES) == {"stale", "cap", "keys", "draft_keys", "resumed_state"}
    assert all(BY_NAME[o].neutral and BY_NAME[o].build for o in SAFETY_ORACLES)
    case = make_case(hybrid(16, 16), [[("A", 48)]] * 2)
    names = [d.oracle for d in check_all(case, "0.33.0+x.0123ab", _obs([0, 48]))]
    assert "cap" in names


def test_run_compare_judges_a_hit_above_the_promise_by_the_safety_rules_only():
    """One verdict: against the promise, a hit above the target diverges
    only when a safety oracle fires; below it, always."""
    target = Target([0, 32], "promise")
    safe = _obs([0, 47])
    assert judge(target, safe, []).verdict == "agrees"
    case = make_case(hybrid(16, 16), [[("A", 48)], [("A", 32), ("B", 16)]])
    unsafe = _obs([0, 47])
    v = judge(target, unsafe, check_keys(case, "0.33.0", unsafe))
    assert v.verdict == "diverges" and any(r.startswith("keys fires at request 1") for r in v.reasons)
    assert judge(target, _obs([0, 16]), []).verdict == "diverges"
    # another rule (the release's own model) still compares exactly
    assert judge(Target([0, 32], "replay"), safe, []).verdict == "diverges"
