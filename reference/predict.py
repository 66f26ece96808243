"""``predict``: the reference model's answer for a case, as one JSON object.

``hits[i]`` is what ``vllm:prefix_cache_hits_total`` grows by for request i
(the hit tokens recorded at admission); ``queries[i]`` is what
``vllm:prefix_cache_queries_total`` grows by (the prompt length). Other tools
read these names; keep them.
"""

from __future__ import annotations

from reference.case import Case
from reference.knobs import DEFAULT_VERSION, Knobs, resolve_knobs
from reference.serial import simulate


def predict_with_knobs(case: Case, knobs: Knobs, rule: str = "promise") -> dict:
    steps = simulate(case, knobs, rule)
    return {
        "rule": rule,
        "hits": [s.hit for s in steps],
        "queries": [s.prompt_tokens for s in steps],
        "knobs": knobs.as_dict(),
        "explain": [s.as_dict() for s in steps],
    }


def predict(case: Case, as_version: str = DEFAULT_VERSION, rule: str = "promise") -> dict:
    """Predict hits and queries of every request of ``case``, with the knobs
    vLLM ``as_version`` resolves and the retention ``rule``."""
    return predict_with_knobs(case, resolve_knobs(case, as_version), rule)
