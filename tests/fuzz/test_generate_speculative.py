"""The generator's draws of speculative methods other than MTP and of
``--scheduling-policy`` (issue 27, item 2): seeded, on the allow-list, one
``other`` class per model and hash unit, and the policy drawn from a stream
of its own so it leaves the rest of a seed's case as it was."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from fuzz.draw import generate as g
from fuzz.draw.choosers import RandomChooser
from fuzz.driving.reach import deployment_class_of
from reference.vllm_flags import check_vllm_args


def lenient(dep):
    return {"block": 544, "hash": 544, "max_model_len": 32768}


def _spec(case) -> dict | None:
    args = list(case.deployment.vllm_args)
    return json.loads(args[args.index("--speculative-config") + 1]) if "--speculative-config" in args else None


def _policy(case) -> str | None:
    args = list(case.deployment.vllm_args)
    return args[args.index("--scheduling-policy") + 1] if "--scheduling-policy" in args else None


def test_every_model_has_one_other_class_per_hash_unit_with_its_retention_drawn():
    classes = g.deployment_classes()
    other = [c for c in classes if c.spec == "other"]
    assert {c.model for c in other} == set(g.DEPLOYMENT_MODELS)
    assert all(c.retention == g.ANY_RETENTION for c in other)
    # 66 MTP/off classes as before, plus 2 per hybrid and 1 per attention-free model
    assert len(other) == 2 * (len(g.DEPLOYMENT_MODELS) - len(g.ATTENTION_FREE_MODELS)) + len(g.ATTENTION_FREE_MODELS)
    assert len(classes) == 66 + len(other)


@pytest.mark.parametrize("model", g.DEPLOYMENT_MODELS)
def test_an_other_class_draws_a_non_mtp_method_with_the_drop_options_on_and_off(model):
    cls = g.DeploymentClass(model, "other", False, g.ANY_RETENTION)
    seen: Counter = Counter()
    retentions = set()
    for seed in range(60):
        case = g.build_case(RandomChooser(random.Random(seed)), resolver=lenient, cls=cls)
        check_vllm_args(list(case.deployment.vllm_args))
        config = _spec(case)
        assert config["method"] in g.OTHER_METHODS and 1 <= config["num_speculative_tokens"] <= 3
        assert deployment_class_of(case) == cls
        for option in ("disable_eagle_block_drop", "disable_lookahead_block_hashes"):
            seen[(option, config.get(option, False))] += 1
        seen[config["method"]] += 1
        args = list(case.deployment.vllm_args)
        retentions.add(args[args.index("--prefix-cache-retention-interval") + 1])
    assert all(
        seen[(o, v)] for o in ("disable_eagle_block_drop", "disable_lookahead_block_hashes") for v in (True, False)
    ), seen
    assert {"0", "None"} <= retentions and len(retentions) > 2  # sparse, dense and periodic drawn inside the class
    assert (
        seen["ngram"]
        and bool(seen["eagle"]) is (model not in g.ATTENTION_FREE_MODELS)
        and bool(seen["eagle3"]) is (model in g.EAGLE3_MODELS)
    ), seen


def test_the_same_seed_draws_the_same_case_and_the_hypothesis_path_draws_ngram_too():
    cls = g.DeploymentClass("jamba", "other", True, g.ANY_RETENTION)
    a = g.build_case(RandomChooser(random.Random(7)), resolver=lenient, cls=cls)
    b = g.build_case(RandomChooser(random.Random(7)), resolver=lenient, cls=cls)
    assert a == b
    methods = Counter()
    for seed in range(200):
        case = g.build_case(RandomChooser(random.Random(seed)), resolver=lenient)
        config = _spec(case)
        methods[None if config is None else config["method"]] += 1
    assert methods["ngram"] and methods["eagle"] and methods["mtp"] and methods[None], methods


def test_the_policy_is_drawn_with_a_seed_and_leaves_the_rest_of_the_case_alone(monkeypatch):
    cls = g.DeploymentClass("qwen3_next", "mtp", True, "periodic")
    drawn = [g.build_case(RandomChooser(random.Random(seed)), resolver=lenient, cls=cls) for seed in range(60)]
    assert {_policy(c) for c in drawn} == {None, "fcfs", "priority"}
    assert [_policy(c) for c in drawn] == [
        _policy(g.build_case(RandomChooser(random.Random(seed)), resolver=lenient, cls=cls)) for seed in range(60)
    ]
    monkeypatch.setattr(g, "SCHEDULING_POLICIES", (None,))
    plain = [g.build_case(RandomChooser(random.Random(seed)), resolver=lenient, cls=cls) for seed in range(60)]
    for with_policy, without in zip(drawn, plain):
        args = list(with_policy.deployment.vllm_args)
        if "--scheduling-policy" in args:
            i = args.index("--scheduling-policy")
            del args[i : i + 2]
        assert tuple(args) == without.deployment.vllm_args and with_policy.trace == without.trace


def test_another_trace_keeps_the_deployments_policy():
    cls = g.DeploymentClass("nemotron_h", "other", False, g.ANY_RETENTION)
    for seed in range(20):
        case = g.build_case(RandomChooser(random.Random(seed)), resolver=lenient, cls=cls)
        again = g.another_trace(RandomChooser(random.Random(seed + 1)), case, lenient)
        assert again.deployment.vllm_args == case.deployment.vllm_args
