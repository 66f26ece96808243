"""vLLM raising on a case is a structured error result; the worker stays usable."""

from __future__ import annotations

import pytest

from ground.errors import Unsupported
from tests.conftest import MTP_DROP, hybrid, make_case

pytestmark = pytest.mark.engine

TINY = [[("A", 100)]]


def eagle_without_draft_model():
    # vLLM's SpeculativeConfig rejects EAGLE without a draft model
    return make_case(hybrid(16, 16, mamba_count=1), TINY, {"method": "eagle", "num_speculative_tokens": 2})


@pytest.mark.parametrize("version", ["0.29.0", "0.33.0"])
def test_vllm_rejection_is_a_structured_error(engines, version):
    engine = engines(version)
    result = engine.run(eagle_without_draft_model())
    err = result["error"]
    assert err["kind"] == "vllm"
    assert err["phase"] == "config"
    assert err["type"] == "ValidationError"
    assert "speculative model" in err["message"]
    assert "Traceback (most recent call last)" in err["traceback"]
    assert "SpeculativeConfig" in err["message"]  # raised by vLLM's own config validation
    assert result["hits"] == []
    # the same worker answers the next case normally
    ok = engine.run(make_case(hybrid(16, 16, mamba_count=1), [[("A", 100)]] * 3, MTP_DROP))
    assert "error" not in ok and ok["hits"][0] == 0 and ok["hits"][2] == 80


def test_033_rejects_prefix_match_unit_on_a_single_group(engine_033):
    # 0.33.0 refuses a prefix_match_unit it would silently ignore (0.29.0 ignores it)
    case = make_case({"groups": [{"kind": "full_attention", "block_size": 32}], "prefix_match_unit": 16}, TINY)
    err = engine_033.run(case)["error"]
    assert (err["phase"], err["type"]) == ("setup", "ValueError")
    assert "prefix_match_unit=16" in err["message"]


def test_029_ignores_prefix_match_unit_on_a_single_group(engine_029):
    case = make_case(
        {"groups": [{"kind": "full_attention", "block_size": 32}], "prefix_match_unit": 16}, [[("A", 100)]] * 2
    )
    result = engine_029.run(case)
    assert "error" not in result
    assert result["knobs"]["hash_block_size"] == 32
    assert result["hits"] == [0, 96]


def test_option_missing_in_version_is_unsupported(engine_029):
    case = make_case(
        hybrid(16, 16, mamba_count=1),
        TINY,
        {"method": "mtp", "num_speculative_tokens": 1, "disable_eagle_block_drop": True},
    )
    with pytest.raises(Unsupported, match=r"^speculative.disable_eagle_block_drop=True: not an option of vLLM 0.29.0"):
        engine_029.run(case)
    # still serving
    assert engine_029.ping()["vllm_version"] == "0.29.0"


def test_a_hung_worker_is_a_structured_error_and_restarts(engine_033):
    case = make_case(hybrid(16, 16, mamba_count=1), [[("A", 3000)]] * 2, MTP_DROP)
    result = engine_033.run(case, timeout=0.001)
    assert result["error"]["kind"] == "worker"
    assert "timed out" in result["error"]["message"]
    # the killed worker is restarted by the next call
    again = engine_033.run(case)
    assert again["hits"][0] == 0 and again["hits"][1] > 0


def test_a_deployment_vllm_refuses_when_its_scheduler_starts_is_rejected(engine_033):
    """A retention interval that is no multiple of the resolved block passes
    vLLM's config (the block is only known once resolved) and is refused
    when the KV-cache coordinator starts, as `vllm serve` refuses to start:
    a rejected deployment (one line), never a vLLM error that could become
    a finding. (Seen as a spurious engine_error when the spec_on_off oracle
    dropped --speculative-config from a Qwen3-Next MTP deployment at
    interval 1152: without MTP its H100 block is 1088.)"""
    from ground.errors import DeploymentRejected

    case = {
        "schema": 1,
        "trace": [{"prompt": [{"segment": "A", "length": 1}]}],
        "deployment": {
            "model": "qwen3_next",
            "platform": "cuda",
            "device": "h100",
            "vllm_args": [
                "--enable-prefix-caching",
                "--kv-cache-dtype",
                "fp8",
                "--prefix-cache-retention-interval",
                "1152",
            ],
        },
    }
    with pytest.raises(
        DeploymentRejected,
        match=r"prefix_cache_retention_interval \(1152\) must be .* a multiple of scheduler_block_size \(1088\)",
    ):
        engine_033.run(case)
    assert engine_033.ping()["vllm_version"] == "0.33.0"
