"""A bare loop over the same vLLM calls the driver makes, for bench/engine.py.

Same setup (``VllmDriver.build``), same requests, same simulated model, but
no observation: no wrapped methods, no explain records, no block-pool scan.
The difference in requests/s between this and ``VllmDriver.run`` is the
adapter's overhead.
"""

from __future__ import annotations

import time

from engine_adapter.vllm_engine.driver import SAMPLED_TOKEN, VllmDriver  # first: it sets up vLLM's platform

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request as VllmRequest  # noqa: E402
from reference.case import Case, prompt_tokens


def bare_run(driver: VllmDriver, case: Case) -> tuple[list[int], float, float, float]:
    """Returns (hits per request, setup seconds, loop seconds, loop CPU seconds)."""
    t0 = time.perf_counter()
    built = driver.build(case, {})
    t1, c1 = time.perf_counter(), time.process_time()
    s = built["scheduler"]
    hasher = built["hasher"]
    hits: list[int] = []
    for i, creq in enumerate(case.trace):
        s.add_request(VllmRequest(request_id=f"req-{i}", prompt_token_ids=prompt_tokens(creq), sampling_params=SamplingParams(max_tokens=creq.max_tokens), pooling_params=None, block_hasher=hasher))
        h = 0
        while s.has_unfinished_requests():
            so = s.schedule()
            ids = list(so.num_scheduled_tokens)
            sampled = [[SAMPLED_TOKEN] if s.requests[r].num_computed_tokens >= s.requests[r].num_tokens else [] for r in ids]
            out = s.update_from_output(so, ModelRunnerOutput(req_ids=ids, req_id_to_index={x: j for j, x in enumerate(ids)}, sampled_token_ids=sampled))
            for eco in out.values():
                if eco.scheduler_stats is not None and eco.scheduler_stats.prefix_cache_stats is not None:
                    h += eco.scheduler_stats.prefix_cache_stats.hits
        hits.append(h)
    return hits, t1 - t0, time.perf_counter() - t1, time.process_time() - c1
