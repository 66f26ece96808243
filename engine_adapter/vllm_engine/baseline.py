"""A bare loop over the same vLLM calls the driver makes, for bench/engine.py
and bench/fuzz.py ``--vs-bare``.

Same setup (``VllmDriver.build``), same requests, same simulated model, but
no observation: no wrapped methods, no explain records, no block-pool scan.
The difference in requests/s between this and ``VllmDriver.run`` is the
adapter's overhead.

It steps as the driver's one step loop does (``steploop.serve``), with the
driver's own stand-ins, not copies of them: what keeps it stepping
(``steploop._stepping``: with a KV connector, until its transfers are done),
the stood-in model runner's output with the stood-in connector workers'
report (``steploop._runner_output``), and drafts for a speculative
scheduler. Every request is bounded by steps (the driver's bound: prompt +
max_tokens + 64 steps, and ``MAX_IDLE_STEPS`` steps scheduling nothing):
past it, :class:`BareLoopStuck`, never a loop without end. Output
segments are not resolved (a bare prompt is the request's own tokens).
"""

from __future__ import annotations

import time

from engine_adapter.vllm_engine.driver import SAMPLED_TOKEN, VllmDriver  # first: it sets up vLLM's platform

# isort: split

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.outputs import DraftTokenIds  # noqa: E402
from vllm.v1.request import Request as VllmRequest  # noqa: E402

from engine_adapter.vllm_engine.steploop import MAX_IDLE_STEPS, _runner_output, _stepping  # noqa: E402
from reference.case import Case, prompt_tokens  # noqa: E402


class BareLoopStuck(RuntimeError):
    """The bare loop made no progress within its step bound."""


def bare_run(driver: VllmDriver, case: Case) -> tuple[list[int], float, float, float]:
    """Returns (hits per request, setup seconds, loop seconds, loop CPU seconds)."""
    t0 = time.perf_counter()
    built = driver.build(case, {})
    t1, c1 = time.perf_counter(), time.process_time()
    s = built["scheduler"]
    hasher = built["hasher"]
    stepping = _stepping(s)
    num_drafts = int(getattr(s, "num_spec_tokens", 0) or 0)
    hits: list[int] = []
    for i, creq in enumerate(case.trace):
        tokens = prompt_tokens(creq)
        rid = f"req-{i}"
        s.add_request(
            VllmRequest(
                request_id=rid,
                prompt_token_ids=tokens,
                sampling_params=SamplingParams(max_tokens=creq.max_tokens),
                pooling_params=None,
                block_hasher=hasher,
            )
        )
        h = steps = idle = 0
        max_steps = len(tokens) + creq.max_tokens + 64
        drafting = num_drafts > 0 and creq.max_tokens > 1
        while stepping():
            so = s.schedule()
            ids = list(so.num_scheduled_tokens)
            sampled = [
                [SAMPLED_TOKEN] if s.requests[r].num_computed_tokens >= s.requests[r].num_tokens else [] for r in ids
            ]
            out = s.update_from_output(so, _runner_output(s, so, ids, sampled))
            if drafting and rid in ids and rid in s.requests and not s.requests[rid].is_finished():
                s.update_draft_token_ids(DraftTokenIds([rid], [[SAMPLED_TOKEN] * num_drafts]))
            for eco in out.values():
                stats = eco.scheduler_stats
                if stats is not None and stats.prefix_cache_stats is not None:
                    h += stats.prefix_cache_stats.hits
                external = getattr(stats, "connector_prefix_cache_stats", None) if stats is not None else None
                if external is not None:
                    h += external.hits
            steps += 1
            idle = idle + 1 if not ids else 0
            if idle > MAX_IDLE_STEPS or steps > max_steps:
                raise BareLoopStuck(
                    f"request {i}: still unfinished after {steps} steps (bound {max_steps}, {idle} idle)"
                )
        hits.append(h)
    return hits, t1 - t0, time.perf_counter() - t1, time.process_time() - c1
