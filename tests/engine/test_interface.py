"""The engine-family interface and the observation contract
(``engine_adapter.interface``): a worker's answer is checked where it enters
kvspec's interpreter, and one that is not an observation becomes a harness
error (kvspec's failure), never something the oracles judge."""

from __future__ import annotations

import pytest

from engine_adapter.host.engine import _run_result
from engine_adapter.host.versions import RELEASES
from engine_adapter.interface import FAMILIES, family_module, observation_problem
from fuzz.judge.verdict import harness_error_of
from ground.errors import InvalidArgument


def observation(**over):
    obs = {
        "engine": "vllm==0.33.0",
        "hits": [0, 32],
        "queries": [40, 40],
        "knobs": {"eagle_drop": True},
        "explain": [{"request": 0, "hit": 0}, {"request": 1, "hit": 32}],
        "harness": {"platform": "cuda"},
    }
    obs.update(over)
    return obs


def test_a_well_formed_observation_passes_and_comes_back_tagged():
    assert observation_problem(observation()) is None
    assert (
        observation_problem(
            observation(error={"kind": "vllm", "message": "x"}, hits=[0], queries=[40], explain=[{"request": 0}])
        )
        is None
    )
    result = _run_result("vllm==0.33.0", {"ok": True, "result": observation()})
    assert result["hits"] == [0, 32] and result["harness"] == {"platform": "cuda", "mode": "worker"}
    assert harness_error_of(result) is None


@pytest.mark.parametrize(
    "bad, field",
    [
        ([1, 2], "observation=list"),
        (observation(hits=None), "observation.hits=None"),
        (observation(hits=[0, "32"]), "observation.hits="),
        (observation(hits=[0, True]), "observation.hits="),
        (observation(queries=[40]), "observation: hits, queries and explain have 2, 1 and 2 entries"),
        (observation(explain=[{"request": 0}, "x"]), "observation.explain="),
        (observation(explain=[{"request": 0}, {"hit": 1}]), "observation.explain[1].request=None"),
        (observation(error="boom"), "observation.error=boom"),
        (observation(error={"message": "no kind"}), "observation.error="),
        (observation(knobs=[1]), "observation.knobs=[1]"),
    ],
)
def test_a_malformed_answer_is_named_by_its_field_and_is_a_harness_error(bad, field):
    problem = observation_problem(bad)
    assert problem is not None and problem.startswith(field), problem
    result = _run_result("vllm==0.33.0", {"ok": True, "result": bad})
    assert result["hits"] == [] and result["error"]["kind"] == "protocol"
    assert result["error"]["message"] == problem
    assert harness_error_of(result).startswith("protocol error: observation")


def test_the_families_are_named_and_an_unknown_one_is_refused_in_one_line():
    assert FAMILIES == {
        "vllm": "engine_adapter.vllm_engine.driver",
        "sglang": "engine_adapter.sglang_engine.driver",
        "llamacpp": "engine_adapter.llamacpp_engine.driver",
    }
    assert set(RELEASES) == set(FAMILIES)  # every family a name may start with has a driver
    with pytest.raises(InvalidArgument, match=r"^family='tgi'.*allowed: vllm, sglang, llamacpp$"):
        family_module("tgi")


def test_the_worker_takes_only_a_serialized_engine_of_a_known_family(capsys):
    """The worker receives one serialized EngineSpec (``--engine JSON``),
    never a name or version key; another family, or a name, is refused."""
    import json

    from engine_adapter.inside.worker import main
    from ground.engines import EngineSpec

    nope = json.dumps({"family": "nope", "release": "1.0.0", "label": None, "hash": None, "patches": []})
    for value, said in ((nope, "--engine.family='nope'"), ("vllm==0.33.0", "not a serialized engine")):
        with pytest.raises(SystemExit) as e:
            main(["--engine", value, "--selftest"])
        assert e.value.code == 2
        assert said in capsys.readouterr().err
    build = EngineSpec("vllm", "0.33.0", "fix", "1a2b3c", ("fixes/a.diff",))
    assert EngineSpec.from_json(build.to_json()) == build


def test_served_observation_reads_hits_and_queries_from_explain_in_the_written_key_order():
    from engine_adapter.interface import served_observation

    explain = [{"request": 0, "hit": 0, "query": 12}, {"request": 1, "hit": 8, "query": 12}]
    out = served_observation("llamacpp==x", explain, resolution={"a": 1}, timing={"run_s": 0.1})
    assert list(out) == ["engine", "hits", "queries", "knobs", "explain", "resolution", "timing"]
    assert out["hits"] == [0, 8] and out["queries"] == [12, 12] and out["knobs"] is None
    assert observation_problem(out) is None
    assert served_observation("e", [], error={"kind": "worker"})["hits"] == []
