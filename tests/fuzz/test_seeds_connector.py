"""check-build's boundary cases again with a KV connector
(``fuzz.draw.seeds.with_connector``): the same trace and deployment plus vLLM's
CPU offloading flags, once; a case that has a connector or no deployment
is not doubled. Pure: no engine."""

from __future__ import annotations

import json

from fuzz.draw.seeds import CONNECTOR_ARGS, with_connector
from ground.home import REPO_ROOT
from reference.case import case_to_dict, parse_case


def _example(name: str):
    return parse_case(json.loads((REPO_ROOT / "examples" / name).read_text()))


def test_a_deployment_case_gets_the_connector_flags_and_keeps_its_trace():
    case = _example("retention-periodic-chunk-checkpoint-deployment.json")
    (out,) = with_connector([case])
    assert out.deployment.vllm_args == (*case.deployment.vllm_args, *CONNECTOR_ARGS)
    assert case_to_dict(out)["trace"] == case_to_dict(case)["trace"]
    assert out.name.endswith("+offloading")


def test_a_case_with_a_connector_or_without_a_deployment_is_not_doubled():
    connected = _example("connector-longer-sibling-qwen3_next.json")
    hand = parse_case(json.loads((REPO_ROOT / "tests" / "engine" / "data" / "faults" / "cap-case.json").read_text()))
    assert with_connector([connected, hand]) == []
