"""The oracles declared ``local`` (fuzz/judge/oracle_registry.py: the rules
of the local prefix cache, ``reference`` and ``spec_on_off``) do not judge
a KV connector's load: the judge (``fuzz.judge.oracles.check_all``) hands
them the requests before the first one a connector loaded for, and
``spec_on_off`` also skips a first repeat the spec-off run loaded for. The
promise and the safety oracles judge every request. The observations are
hand-written test doubles of what a driver reports; the expected hits are
the reference model's."""

from __future__ import annotations

from fuzz.judge.oracle_base import first_load
from fuzz.judge.oracle_registry import LOCAL_ORACLES, PRESSURE_ORACLES
from fuzz.judge.oracles import check_all, judged_ends
from reference.knobs import implemented_rule, resolve_knobs
from reference.predict import predict_with_knobs
from tests.conftest import hybrid, make_case
from tests.fuzz.test_safety_oracles import _obs

EAGLE = {"method": "eagle", "num_speculative_tokens": 2}
VERSION = "0.32.0"
# A:32, then a sibling sharing 16 tokens (the EAGLE drop takes the local hit
# to 0), then a resend of the sibling
CASE = make_case(hybrid(16, 16), [[("A", 32)], [("A", 16), ("B", 1)], [("A", 16), ("B", 1)]], EAGLE)


def check_reference(case, version, obs):
    return check_all(case, version, obs, None, ("reference",))


def check_spec_on_off(case, version, obs, run):
    return check_all(case, version, obs, run, ("spec_on_off",))


def _model() -> list[int]:
    return predict_with_knobs(CASE, resolve_knobs(CASE, VERSION), implemented_rule(VERSION))["hits"]


def test_the_model_drops_the_shared_block():
    assert _model()[1] == 0


def test_no_request_from_the_first_connector_load_on_is_judged():
    """vLLM 0.32.0's offloading connector serves past the drop (a campaign's
    Qwen3.5 EAGLE 2 with --kv-offloading-size: A:32, A:16+B:1 hit 16 where
    the local lookup dropped to 0)."""
    model = _model()
    loaded = [model[0], 16, model[2] + 16]
    assert check_reference(CASE, VERSION, _obs(loaded, external_hit={1: 16})) == []
    (div,) = check_reference(CASE, VERSION, _obs(loaded))  # the same hits with no load: the model's finding
    assert div.oracle == "reference" and div.requests == [1, 2] and div.observed == loaded
    (div,) = check_reference(CASE, VERSION, _obs([model[0] + 16, 16, model[2]], external_hit={1: 16}))
    assert div.requests == [0] and div.observed == [model[0] + 16]  # before the load: judged, on those requests


def test_only_the_local_oracles_stop_at_a_load():
    """A load cuts the oracles declared ``local``; the promise and the
    safety oracles judge every request; pressure and a load together cut
    an oracle at the first of the two."""
    obs = _obs([0, 16, 32], external_hit={2: 16})
    ends = judged_ends(CASE, obs, ("promise", "reference", "spec_on_off", "cap", "stale"))
    assert ends == {"promise": None, "reference": 2, "spec_on_off": 2, "cap": None, "stale": None}
    assert set(LOCAL_ORACLES) == {o for o, k in ends.items() if k == 2}
    pressed = _obs([0, 16, 32], external_hit={2: 16}, preempted_steps={1: [3]})
    ends = judged_ends(CASE, pressed, ("promise", "reference", "cap"))
    assert ends == {"promise": 1, "reference": 1, "cap": None} and "cap" in PRESSURE_ORACLES


def test_first_load_reads_each_request_s_load():
    assert first_load(_obs([0, 16, 32], external_hit={1: 16, 2: 8})) == 1
    assert first_load(_obs([0, 16])) is None
    assert first_load({"hits": [0, 16]}) is None


def test_the_eagle_drop_is_not_judged_on_a_hit_a_connector_loaded():
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

    loaded = _obs([0, on[1] + 16], external_hit={1: on[1] + 16})
    assert check_spec_on_off(case, version, loaded, run) == []
    (div,) = check_spec_on_off(case, version, _obs([0, on[1] + 16]), run)  # no load: the engine did not drop
    assert div.oracle == "spec_on_off" and "engine moved it by 0" in div.detail

    def run_loaded(_case):
        return _obs([0, on[1] + 16], external_hit={1: 16})

    assert check_spec_on_off(case, version, _obs([0, on[1] + 16]), run_loaded) == []  # the off run's hit loaded
