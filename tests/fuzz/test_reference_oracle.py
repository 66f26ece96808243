"""The ``reference`` oracle (fuzz/judge/oracle_hits.py) judges the local
prefix cache: where a KV connector loaded, the scheduler's own lookup, and
no request after the first one a connector loaded for. The observations are
hand-written test doubles of what a driver reports; the expected hits are
the reference model's."""

from __future__ import annotations

from fuzz.judge.oracle_hits import check_reference, local_hits
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
