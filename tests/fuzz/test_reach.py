"""fuzz.driving.reach: the deployment class and trace shape of a case, and a
campaign's table of them."""

from __future__ import annotations

import json

from fuzz.draw.generate import deployment_classes
from fuzz.driving.campaign import Campaign
from fuzz.driving.drivers import run_cases
from fuzz.driving.reach import Reach, deployment_class_of, trace_shape
from reference.case import parse_case
from tests.conftest import hybrid, make_case
from tests.fuzz.doubles import ReferenceDouble

DROP = json.dumps({"method": "mtp", "num_speculative_tokens": 2, "disable_lookahead_block_hashes": True})


def _deployment(*args):
    return parse_case(
        {
            "schema": 1,
            "deployment": {
                "model": "qwen3_next",
                "vllm_args": ["--enable-prefix-caching", *args],
                "platform": "cuda",
                "device": "a100",
            },
            "trace": [{"prompt": [{"segment": "A", "length": 100}]}],
        }
    )


def test_a_deployment_s_class_reads_its_flags():
    assert deployment_class_of(_deployment()).label() == "qwen3_next/off/block/sparse"
    assert (
        deployment_class_of(
            _deployment(
                "--speculative-config", DROP, "--prefix-match-unit", "32", "--prefix-cache-retention-interval", "None"
            )
        ).label()
        == "qwen3_next/drop/unit/dense"
    )
    assert (
        deployment_class_of(
            _deployment(
                "--speculative-config",
                '{"method":"mtp","num_speculative_tokens":1}',
                "--prefix-cache-retention-interval",
                "1088",
            )
        ).label()
        == "qwen3_next/mtp/block/periodic"
    )
    assert deployment_class_of(make_case(hybrid(16, 16), [[("A", 5)]])) is None


def test_trace_shapes_name_the_kinds_and_a_junction_chain():
    g = hybrid(16, 16)
    assert trace_shape(make_case(g, [[("A", 40)], [("B", 40)]])) == "fresh"
    assert trace_shape(make_case(g, [[("A", 40)], [("A", 40)], [("A", 60)]])) == "extension+resend"
    chain = make_case(g, [[("A", 40)], [("A", 20), ("B", 5)], [("A", 20), ("C", 7)]])
    assert trace_shape(chain) == "sibling+junction-chain"
    apart = make_case(g, [[("A", 40)], [("A", 20), ("B", 5)], [("A", 30), ("C", 7)]])
    assert trace_shape(apart) == "sibling"


def test_a_campaign_counts_what_it_ran(tmp_path):
    campaign = Campaign(ReferenceDouble("0.33.0", "replay"), tmp_path, oracles=("promise",))
    run_cases(
        campaign,
        [make_case(hybrid(16, 16), [[("A", 40)], [("A", 40)]]), make_case(hybrid(16, 16), [[("A", 40)], [("B", 3)]])],
    )
    assert campaign.stats.reach.as_dict()["shapes"] == {"resend": 1, "fresh": 1}
    reach = Reach()
    reach.add(_deployment())
    table = reach.as_dict()
    assert table["deployment_classes"] == 1 and table["of"] == len(deployment_classes())
    assert (
        "qwen3_next/off/block/sparse" not in table["never_reached"] and len(table["never_reached"]) == table["of"] - 1
    )


def test_the_pressure_reach_reads_evictions_preemptions_and_the_scheduler():
    from fuzz.driving.reach import pressure_of

    obs = {
        "resolution": {"facts": {"pool_set_by_deployment": True, "async_scheduling": True}},
        "explain": [{"evicted": [[0, 3]]}, {"preempted_steps": [28], "resumed_steps": [101]}],
    }
    assert pressure_of(obs) == ["pinned", "evicted", "preempted", "async"]
    assert pressure_of({"resolution": {"facts": {"async_scheduling": False}}, "explain": [{}]}) == ["sync"]
    assert pressure_of({}) == []
    reach = Reach()
    reach.observed(obs)
    reach.observed({"resolution": {"facts": {"async_scheduling": False}}})
    assert reach.as_dict()["pressure"] == {"pinned": 1, "evicted": 1, "preempted": 1, "async": 1, "sync": 1}
