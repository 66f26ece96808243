"""The inside side: what runs in an engine's own environment and is engine
family neutral. The worker serves cases over :mod:`engine_adapter.protocol`
and hands each to its family's driver (vLLM: :mod:`engine_adapter.vllm_engine`)."""
