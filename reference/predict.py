"""``predict``: the reference model's answer for a case, as one JSON object.

``hits[i]`` is what ``vllm:prefix_cache_hits_total`` grows by for request i
(the hit tokens recorded at admission); ``queries[i]`` is what
``vllm:prefix_cache_queries_total`` grows by (the prompt length). Other tools
read these names; keep them.

A concurrent trace (requests sharing scheduler steps, ``arrival``): the
model predicts its serial prefix (``reference.case.serial_prefix``: the
requests that ran alone before any two shared the scheduler), and
``predicted`` says how many; the hits of the rest are ``null``. Where a
request resumes then depends on how the engine batches steps, which the
model does not simulate: the rules that still hold are stated as oracles
(``fuzz.oracles.CONCURRENT_ORACLES``: no request resumes from a state whose
step has not run, no block table holds a freed block, every block given
back).
"""

from __future__ import annotations

from dataclasses import replace

from reference.case import Case, serial_prefix
from reference.knobs import DEFAULT_VERSION, Knobs, resolve_knobs
from reference.serial import simulate


def predict_with_knobs(case: Case, knobs: Knobs, rule: str = "promise") -> dict:
    k = serial_prefix(case)
    steps = simulate(replace(case, trace=case.trace[:k]), knobs, rule) if k else []
    rest = len(case.trace) - k
    return {
        "rule": rule,
        "hits": [s.hit for s in steps] + [None] * rest,
        "queries": [s.prompt_tokens for s in steps] + [r.num_prompt_tokens for r in case.trace[k:]],
        "knobs": knobs.as_dict(),
        "explain": [s.as_dict() for s in steps] + [None] * rest,
        "predicted": k,
    }


def predict(case: Case, as_version: str = DEFAULT_VERSION, rule: str = "promise") -> dict:
    """Predict hits and queries of every request of ``case``, with the knobs
    vLLM ``as_version`` resolves and the retention ``rule``."""
    return predict_with_knobs(case, resolve_knobs(case, as_version), rule)
