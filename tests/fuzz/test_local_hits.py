"""The hit oracles that state a rule of the local prefix cache
(fuzz/judge/oracle_hits.py: ``reference``, ``spec_on_off``) judge its
lookup: where a KV connector loaded, the scheduler's own lookup, and
(``reference``) no request after the first one a connector loaded for. The observations are
hand-written test doubles of what a driver reports; the expected hits are
the reference model's."""

from __future__ import annotations

from fuzz.judge.oracle_hits import check_reference, check_spec_on_off, local_hits
from reference.knobs import implemented_rule, resolve_knobs
from reference.predict import predict_with_knobs
from tests.conftest import hybrid, make_case
from tests.fuzz.test_safety_oracles import _obs

EAGLE = {"method": "eagle", "num_speculative_tokens": 2}
VERSION = "0.32.0"
# A:32, then a sibling sharing 16 tokens (the EAGLE drop takes the local hit
# to 0), then a resend of the sibling
CASE = make_case(hybrid(16, 16), [[("A", 32)], [("A", 16), ("B", 1)], [("A", 16), ("B", 1)]], EAGLE)


def _model() -> list[int]:
    return predict_with_knobs(CASE, resolve_knobs(CASE, VERSION), implemented_rule(VERSION))["hits"]


def test_the_model_drops_the_shared_block():
    assert _model()[1] == 0


def test_a_hit_the_connector_loaded_is_not_the_local_cache_s():
    model = _model()
    hits = [model[0], 16, model[2]]
    assert check_reference(CASE, VERSION, _obs(hits, external_hit={1: 16})) == []
    (div,) = check_reference(CASE, VERSION, _obs(hits))
    assert div.oracle == "reference" and div.requests == [1] and div.observed == hits
    assert div.detail == "rule=replay"


def test_no_request_after_the_first_connector_load_is_judged():
    model = _model()
    later = [model[0], 16, model[2] + 16]
    assert check_reference(CASE, VERSION, _obs(later, external_hit={1: 16})) == []
    (div,) = check_reference(CASE, VERSION, _obs([model[0] + 16, 16, model[2]], external_hit={1: 16}))
    assert div.requests == [0] and div.observed == [model[0] + 16, 0, model[2]]
    assert "through request 1, the first a KV connector loaded for" in div.detail


def test_local_hits_reads_each_request_s_load():
    assert local_hits(_obs([0, 16, 32], external_hit={1: 16, 2: 8})) == ([0, 0, 24], 1)
    assert local_hits(_obs([0, 16])) == ([0, 16], None)
    assert local_hits({"hits": [0, 16]}) == ([0, 16], None)


def test_a_load_that_supersedes_a_local_partial_tail_is_judged_by_the_local_lookup():
    """vLLM 0.32.0: the local lookup found 32 (a partial tail in a 160-token
    block); the connector, asked beyond the block-aligned 0, loads 160, and
    the scheduler drops the local tail: hit 160, all of it loaded. The
    local cache answered 32 (a 0.32.0 campaign's seed 3, Jamba, unit 32)."""
    obs = _obs([0, 32, 160], external_hit={2: 160}, scheduler_hit={0: 0, 1: 32, 2: 32})
    assert local_hits(obs) == ([0, 32, 32], 2)


def test_the_eagle_drop_is_judged_on_the_local_lookup_when_a_connector_loaded_past_it():
    """vLLM 0.30.0 (a campaign's spec_on_off finding): MTP 1, unit 16, block
    272, B:273 resent; the local lookup drops one unit (256) and the
    offloading connector, serving past the drop by design, loads to 272."""
    case = make_case(
        hybrid(272, 272, prefix_match_unit=16), [[("B", 273)]] * 2, {"method": "mtp", "num_speculative_tokens": 1}
    )
    version = "0.30.0"
    on = predict_with_knobs(case, resolve_knobs(case, version), "promise")["hits"]
    off_double = _obs([0, on[1] + 16])  # a test double of the spec-off run: it hits one unit more

    def run(_case):
        return off_double

    loaded = _obs([0, on[1] + 16], external_hit={1: on[1] + 16}, scheduler_hit={0: 0, 1: on[1]})
    assert check_spec_on_off(case, version, loaded, run) == []
    (div,) = check_spec_on_off(case, version, _obs([0, on[1] + 16]), run)  # no load: the engine did not drop
    assert div.oracle == "spec_on_off" and "engine moved it by 0" in div.detail
