"""The cases ``kvspec mutate`` resolves before its control: one deployment
case per shipped model, each a valid case (``engine_adapter.models.shipped``)."""

from __future__ import annotations

from engine_adapter.models.shipped import deployment_cases, names
from reference.case import parse_case


def test_one_valid_deployment_case_per_shipped_model_with_prefix_caching():
    cases = [parse_case(raw) for raw in deployment_cases()]
    assert [c.deployment.model for c in cases] == list(names())
    assert all("--enable-prefix-caching" in c.deployment.vllm_args for c in cases)
