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
(``fuzz.judge.oracles.CONCURRENT_ORACLES``: no request resumes from a state whose
step has not run, no block table holds a freed block, every block given
back).

For those requests ``bounds[i]`` (:func:`resume_bounds`) is the most a
request can hit whatever the batching: a request cannot resume past the
tokens some request sent before it computed. A live server's counters
give a wave's summed hits only; the judge holds them against these bounds
(``fuzz.judge.verdict``).
"""

from __future__ import annotations

from dataclasses import replace

from ground.engines import EngineSpec
from reference.case import Case, prompt_tokens, serial_prefix
from reference.knobs import DEFAULT_VERSION, Knobs, resolve_knobs
from reference.serial import common_prefix, known_common, simulate


def predict_with_knobs(case: Case, knobs: Knobs, rule: str = "promise") -> dict:
    k = serial_prefix(case)
    steps = simulate(replace(case, trace=case.trace[:k]), knobs, rule) if k else []
    rest = len(case.trace) - k
    out = {
        "rule": rule,
        "hits": [s.hit for s in steps] + [None] * rest,
        "queries": [s.prompt_tokens for s in steps] + [r.num_prompt_tokens for r in case.trace[k:]],
        "knobs": knobs.as_dict(),
        "explain": [s.as_dict() for s in steps] + [None] * rest,
        "predicted": k,
    }
    if rest:
        out["bounds"] = unpredicted_bounds(case)
    return out


def unpredicted_bounds(case: Case) -> list[int | None] | None:
    """:func:`resume_bounds` for the requests past the serial prefix (the
    ones :func:`predict` leaves ``null``), None for the others; None for a
    serial trace, whose every request is predicted."""
    k = serial_prefix(case)
    if k == len(case.trace):
        return None
    return [None] * k + resume_bounds(case)[k:]


def resume_bounds(case: Case) -> list[int]:
    """For every request, the most tokens it can resume from whatever the
    scheduler batches with it: no request resumes past what a request sent
    before it computed (engine-neutral; the promise's "no request resumes
    from a state no prefill wrote").

    Request j computes its prompt and all but the last of its generated
    tokens. So request i can reuse, from request j < i, the prefix the two
    prompts share, and when i's prompt holds all of j's, up to
    ``max_tokens_j - 1`` tokens more (i's next tokens may be j's output,
    which the trace does not know); never its own last token:
    ``bound_i = min(N_i - 1, max_j<i reach(i, j))``, 0 for the first."""
    tokens = [prompt_tokens(r) for r in case.trace]
    out = []
    for i, req in enumerate(case.trace):
        best = 0
        for j in range(i):
            shared = common_prefix(tokens[j], tokens[i], known_common(case.trace[j].prompt, req.prompt))
            if shared == len(tokens[j]):
                shared += max(case.trace[j].max_tokens - 1, 0)
            best = max(best, shared)
        out.append(max(0, min(len(tokens[i]) - 1, best)))
    return out


def predict(case: Case, as_version: str | EngineSpec = DEFAULT_VERSION, rule: str = "promise") -> dict:
    """Predict hits and queries of every request of ``case``, with the knobs
    vLLM ``as_version`` resolves (a version key, or an engine parsed at the
    command line's edge) and the retention ``rule``."""
    return predict_with_knobs(case, resolve_knobs(case, as_version), rule)
