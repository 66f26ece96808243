"""Conversations (the chat shape) through the real vLLM 0.33.0 scheduler: a
prompt that quotes an earlier request's output resumes where the reference
model says (``reference.serial.output_states`` / ``cached_length``), and no
oracle fires: under dense retention inside the earlier output, under sparse
retention at the earlier prompt's extension boundary."""

from __future__ import annotations

import pytest

from fuzz.judge.oracles import ORACLES, check_all, resolved
from reference.case import case_to_dict, parse_case
from reference.knobs import implemented_rule, resolve_knobs
from reference.predict import predict_with_knobs
from tests.conftest import MTP, MTP_DROP, hybrid

pytestmark = pytest.mark.engine


def chat(geometry=None, speculative=None, deployment=None, first=40, max_tokens=30):
    turns = [
        {"prompt": [{"segment": "A", "length": first}], "max_tokens": max_tokens},
        {
            "prompt": [{"segment": "A", "length": first}, {"output": 0}, {"segment": "B", "length": 20}],
            "max_tokens": 12,
        },
        {
            "prompt": [
                {"segment": "A", "length": first},
                {"output": 0},
                {"segment": "B", "length": 20},
                {"output": 1},
                {"segment": "C", "length": 3},
            ]
        },
    ]
    if deployment is not None:
        return parse_case({"schema": 1, "deployment": deployment, "trace": turns})
    return parse_case({"schema": 1, "geometry": geometry, "speculative": speculative, "trace": turns})


def judged(engine, case, version="0.33.0"):
    obs = engine.run(case_to_dict(case))
    assert "error" not in obs, obs.get("error")
    case = resolved(case, obs, version)
    model = predict_with_knobs(case, resolve_knobs(case, version), implemented_rule(version))["hits"]
    divergences = check_all(case, version, obs, lambda c: engine.run(case_to_dict(c)), ORACLES)
    return obs, model, divergences


@pytest.mark.parametrize(
    ("retention", "speculative", "second"),
    [
        (None, None, 64),  # turn 1 computed 69 tokens: states at 48 and 64 inside its output
        (0, None, 32),  # sparse: turn 1's extension boundary, its output recomputed
        (32, None, 64),  # periodic 32: the segment end 64 inside the output
        (None, MTP, 64),  # lookahead hashes: block 64 keyed with the output token after it
        (None, MTP_DROP, 48),  # the EAGLE drop: attention gives up its last block
    ],
)
def test_a_follow_up_resumes_where_the_model_says(engine_033, retention, speculative, second):
    case = chat(hybrid(16, 16, 1, retention_interval=retention), speculative)
    obs, model, divergences = judged(engine_033, case)
    assert divergences == [], [(d.oracle, d.detail) for d in divergences]
    assert obs["hits"] == model
    assert obs["hits"][1] == second
    assert obs["explain"][0]["computed_tokens"] == 69


def test_a_deployment_conversation(engine_033):
    # Qwen3-Next on an A100 resolves to a 544-token block: turn 1 (1,000
    # prompt tokens, 100 outputs) leaves a state at 1,088 inside its output
    dense = {
        "model": "qwen3_next",
        "vllm_args": ["--enable-prefix-caching", "--prefix-cache-retention-interval", "None"],
        "platform": "cuda",
        "device": "a100",
    }
    obs, model, divergences = judged(engine_033, chat(deployment=dense, first=1000, max_tokens=100))
    assert divergences == [], [(d.oracle, d.detail) for d in divergences]
    assert obs["hits"] == model
    assert obs["hits"][1] == 1088
    sparse = {**dense, "vllm_args": ["--enable-prefix-caching", "--prefix-cache-retention-interval", "0"]}
    obs, model, divergences = judged(engine_033, chat(deployment=sparse, first=1000, max_tokens=100))
    assert divergences == [], [(d.oracle, d.detail) for d in divergences]
    assert obs["hits"] == model
    assert obs["hits"][1] == 544


@pytest.mark.parametrize(("retention", "second"), [(None, 64), (0, 32), (32, 64)])
def test_vllm_0_29_0_keeps_an_outputs_states_as_0_33_0_does(engines, retention, second):
    case = chat(hybrid(16, 16, 1, retention_interval=retention))
    obs, model, divergences = judged(engines("0.29.0"), case, "0.29.0")
    assert divergences == [], [(d.oracle, d.detail) for d in divergences]
    assert obs["hits"] == model
    assert obs["hits"][1] == second
