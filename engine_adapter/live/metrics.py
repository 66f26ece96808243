"""Read vLLM's Prometheus ``/metrics`` text with prometheus_client's parser.

Only what replay needs: the two prefix-cache counters (summed over engines,
optionally filtered by ``model_name``), the ``vllm:cache_config_info`` labels,
and what the spec-decode counters reveal about speculative decoding (vLLM
creates them only when a speculative config is set; the per-position counter
has one ``position`` label per speculative token).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from ground.errors import EngineError

QUERIES = "vllm:prefix_cache_queries_total"
HITS = "vllm:prefix_cache_hits_total"
CACHE_CONFIG_INFO = "vllm:cache_config_info"
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
#: Sums of running/waiting requests; non-zero between our requests = foreign traffic.
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
#: Finished requests of any kind, summed over finished_reason: catches foreign
#: requests that skip the prefix-cache lookup (prompt_logprobs, pooling) and
#: so never show in the two prefix-cache counters.
FINISHED = "vllm:request_success_total"
#: prometheus_client's process collector: changes when the server restarts.
START_TIME = "process_start_time_seconds"


@dataclass(frozen=True)
class Snapshot:
    """One scrape of /metrics, reduced to what replay reads."""

    queries: float | None
    hits: float | None
    running: float | None = None
    waiting: float | None = None
    cache_config: dict[str, str] = field(default_factory=dict)
    #: None: no spec-decode counters (spec off); else the number of positions.
    spec_positions: int | None = None
    spec_drafts: float | None = None
    model_names: frozenset[str] = frozenset()
    start_time: float | None = None
    finished: float | None = None


def parse_metrics(text: str, model: str | None = None) -> Snapshot:
    """Parse /metrics text; ``model`` filters samples by their model_name label.

    Raises EngineError (one line) when the text is not Prometheus exposition.
    """
    sums: dict[str, float] = {}
    cache_config: dict[str, str] = {}
    positions: set[str] = set()
    models: set[str] = set()
    start_time: float | None = None
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser raises ValueError/TypeError/IndexError on junk
        raise EngineError(
            f"metrics={text[:40]!r}: not Prometheus text ({type(e).__name__}: {str(e)[:80]}); allowed: vLLM's /metrics exposition"
        ) from None
    for fam in families:
        for s in fam.samples:
            name = s.name
            labels = s.labels
            if "model_name" in labels:
                models.add(labels["model_name"])
                if model is not None and labels["model_name"] != model:
                    continue
            if name == START_TIME and start_time is None:
                start_time = float(s.value)
                continue
            if name == CACHE_CONFIG_INFO:
                if not cache_config or labels.get("engine") == "0":
                    cache_config = {k: v for k, v in labels.items()}
                continue
            if name == SPEC_PER_POS and "position" in labels:
                positions.add(labels["position"])
            if name in (QUERIES, HITS, RUNNING, WAITING, SPEC_DRAFTS, SPEC_PER_POS, FINISHED):
                sums[name] = sums.get(name, 0.0) + float(s.value)
    return Snapshot(
        queries=sums.get(QUERIES),
        hits=sums.get(HITS),
        running=sums.get(RUNNING),
        waiting=sums.get(WAITING),
        cache_config=cache_config,
        spec_positions=(len(positions) if (positions or SPEC_DRAFTS in sums) else None),
        spec_drafts=sums.get(SPEC_DRAFTS),
        model_names=frozenset(models),
        start_time=start_time,
        finished=sums.get(FINISHED),
    )
