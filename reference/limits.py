"""The limits of a case, at what vLLM itself accepts (why each is where it
is: :mod:`reference.case`'s docstring, and docs/case-format.md). A leaf:
the case parser and the ``vllm serve`` flag checker both read them."""

MAX_PROMPT_TOKENS = 1 << 20
MAX_MAX_TOKENS = 1 << 20
MAX_SEGMENTS = 256
MAX_REQUESTS = 1000
MAX_CASE_TOKENS = 1 << 22
MAX_BLOCK_SIZE = 1 << 20
MAX_GROUPS = 256
MAX_GROUP_COUNT = MAX_GROUPS
MAX_SPECULATIVE_TOKENS = 64
MAX_RETENTION_INTERVAL = 1 << 20
#: A request's ``arrival`` (scheduler steps after the previous request).
MAX_ARRIVAL_STEPS = 1 << 20
MAX_BATCHED_TOKENS = 1 << 20
