"""The limits of a case, at what vLLM itself accepts. Each is refused with
one line naming the field (docs/case-format.md's case-file section states
the same). A leaf: the case parser and the ``vllm serve`` flag checker both
read them.

* a prompt: 1 to ``MAX_PROMPT_TOKENS`` = 1,048,576 tokens. vLLM refuses a
  prompt longer than ``max_model_len``, which it bounds by the model's
  ``max_position_embeddings``; the hybrid models kvspec targets (Qwen3-Next,
  Qwen3.5) have 262,144 natively and about one million with YaRN scaling.
  ``max_tokens`` has the same bound (the output shares ``max_model_len``).
* at most ``MAX_SEGMENTS`` = 256 segments per prompt, ``MAX_REQUESTS`` =
  1,000 requests and ``MAX_CASE_TOKENS`` = 4,194,304 prompt tokens per case
  (the model holds every prompt's token ids, about 50 bytes a token, and
  compares each request with the earlier ones that share its first token);
* block sizes (``block_size``, ``hash_block_size``, ``prefix_match_unit``,
  ``scheduler_block_size``, the LCM of the group block sizes) at most
  ``MAX_BLOCK_SIZE`` = 1,048,576 (no block can be longer than the longest
  prompt), at most ``MAX_GROUPS`` = 256 KV cache groups in all (counts
  summed), ``retention_interval`` and ``max_num_batched_tokens`` at most
  1,048,576, ``num_speculative_tokens`` at most ``MAX_SPECULATIVE_TOKENS`` =
  64 (far above what vLLM's MTP/EAGLE drafters propose);
* ``schema`` is exactly the integer 1 (``true`` and ``1.0`` are not).
"""

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
