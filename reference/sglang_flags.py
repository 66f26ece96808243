"""Which ``sglang serve`` flags a deployment may carry: an allow-list
(SGLang 0.5.23's flag names; the same rule as :mod:`reference.vllm_flags`).

A deployment with ``"engine": "sglang"`` gives its flags as
``deployment.sglang_args``; kvspec hands them to SGLang's own parser and
resolution pipeline inside SGLang's environment. SGLang has flags that load
code or data by name (``--trust-remote-code``, ``--tokenizer-path``,
``--json-model-override-args``, ``--config FILE``, ...), so only the flags
that shape the prefix cache and the prefill are allowed:

* every token that starts with ``-`` must name, exactly, a flag of
  :data:`FLAGS` (``--flag=value`` is the flag and its value; ``_`` in a long
  name is ``-``); anything else is refused, including abbreviations;
* a flag that takes a value takes the next token (or its ``=value``); a
  token that is neither a flag nor a flag's value is refused;
* an integer flag's value is an optional ``-`` and at most 9 ASCII digits;
  a flag with fixed values takes only those (:data:`CHOICES`).

* a size flag the driver runs (:data:`RANGES`) takes a value in its range:
  ``--page-size`` at least 1 (SGLang 0.5.23's parser takes any int,
  ``sglang/srt/arg_groups/fields/schedule.py:143``, and its own code
  asserts ``page_size > 0``, ``sglang/srt/arg_groups/cuda_graph_hook.py:456``);
  ``--chunked-prefill-size`` at least 1 (SGLang also takes ``-1``, "disabling
  chunked prefill", ``fields/schedule.py:52-55``, and skips its divisibility
  check for any value ``<= 0``, ``arg_groups/validation_hook.py:241-246``;
  kvspec's driver cuts every prefill into chunks of that size, so it runs
  only a chunk of at least one token); both at most the case limits'
  ``MAX_BLOCK_SIZE`` / ``MAX_BATCHED_TOKENS`` (2^20);
  ``--max-total-tokens`` and ``--max-mamba-cache-size`` (the pools a
  deployment pins: a cache under pressure, issue 43) at least 1.

Whether SGLang accepts an allowed value is SGLang's answer (its parser and
its resolution hooks, e.g. ``no_buffer only supports page_size=1``,
``chunked_prefill_size must be divisible by page_size``), reported in one
line by the resolver.
"""

from __future__ import annotations

import re

from ground.errors import InvalidArgument

MAX_ARGS = 64
#: ``value`` (an integer), ``choice`` (one of :data:`CHOICES`), ``switch``.
FLAGS: dict[str, str] = {
    "--page-size": "value",
    "--chunked-prefill-size": "value",
    "--max-prefill-tokens": "value",
    "--max-running-requests": "value",
    "--max-total-tokens": "value",
    "--max-mamba-cache-size": "value",
    "--mamba-radix-cache-strategy": "choice",
    "--mamba-track-interval": "value",
    "--mamba-max-states-per-path": "value",
    "--mamba-ssm-dtype": "choice",
    "--disable-overlap-schedule": "switch",
    "--disable-radix-cache": "switch",
    "--speculative-algorithm": "choice",
    "--speculative-num-steps": "value",
    "--speculative-eagle-topk": "value",
    "--speculative-num-draft-tokens": "value",
    "--tp-size": "value",
    "--attention-backend": "choice",
    "--schedule-policy": "choice",
    "--kv-cache-dtype": "choice",
}
CHOICES: dict[str, tuple[str, ...]] = {
    "--mamba-radix-cache-strategy": ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"),
    "--mamba-ssm-dtype": ("float32", "bfloat16", "float16"),
    "--speculative-algorithm": ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"),
    "--attention-backend": ("triton", "flashinfer", "fa3", "torch_native", "trtllm_mha"),
    "--schedule-policy": ("lpm", "random", "fcfs", "dfs-weight", "lof", "priority"),
    "--kv-cache-dtype": ("auto", "fp8_e4m3", "fp8_e5m2", "bfloat16"),
}
_INT = re.compile(r"^-?[0-9]{1,9}$")
#: flag -> (least, most) value the driver runs (see the module's docstring).
RANGES: dict[str, tuple[int, int]] = {
    "--page-size": (1, 1 << 20),
    "--chunked-prefill-size": (1, 1 << 20),
    "--max-total-tokens": (1, 1 << 20),
    "--max-mamba-cache-size": (1, 1 << 20),
}
_WHY = {
    "--page-size": "SGLang 0.5.23 asserts page_size > 0",
    "--chunked-prefill-size": "kvspec's driver runs chunked prefill only; SGLang's -1 disables it",
    "--max-total-tokens": "the token pool's size: a positive count (SGLang takes the smaller of it and the profiled pool)",
    "--max-mamba-cache-size": "the Mamba state pool's slots: a positive count (SGLang refuses one that serves no request)",
}


def allowed_text() -> str:
    return ", ".join(FLAGS)


def canonical_flag(token: str) -> str:
    """``--chunked_prefill_size=4096`` -> ``--chunked-prefill-size``."""
    name = token.split("=", 1)[0]
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def check_sglang_args(args: list[str]) -> None:
    """Refuse, in one line naming the index and the token, any argument
    outside the allow-list."""
    if not isinstance(args, list) or len(args) > MAX_ARGS:
        raise InvalidArgument(
            f"deployment.sglang_args={str(args)[:60]}: a list of at most {MAX_ARGS} strings, as given to `sglang serve`"
        )
    i = 0
    while i < len(args):
        token = args[i]
        where = f"deployment.sglang_args[{i}]"
        if not isinstance(token, str) or not token.startswith("-"):
            raise InvalidArgument(
                f"{where}={str(token)[:60]!r}: not a flag or a flag's value; allowed flags: {allowed_text()}"
            )
        flag = canonical_flag(token)
        kind = FLAGS.get(flag)
        if kind is None:
            raise InvalidArgument(
                f"{where}={token[:60]!r}: loads code or is not a cache or prefill setting; allowed: {allowed_text()}"
            )
        if kind == "switch":
            if "=" in token:
                raise InvalidArgument(f"{where}={token[:60]!r}: {flag} takes no value")
            i += 1
            continue
        if "=" in token:
            value, step = token.split("=", 1)[1], 1
        elif i + 1 < len(args) and isinstance(args[i + 1], str):
            value, step = args[i + 1], 2
        else:
            raise InvalidArgument(f"{where}={token[:60]!r}: {flag} needs a value")
        if kind == "value" and not _INT.match(value):
            raise InvalidArgument(f"{where}: {flag}={value[:60]!r}: allowed: an integer of at most 9 digits")
        if kind == "value" and flag in RANGES and not RANGES[flag][0] <= int(value) <= RANGES[flag][1]:
            lo, hi = RANGES[flag]
            raise InvalidArgument(f"{where}: {flag}={value}: allowed: {lo} to {hi:,} ({_WHY[flag]})")
        if kind == "choice" and value not in CHOICES[flag]:
            raise InvalidArgument(f"{where}: {flag}={value[:60]!r}: allowed: {', '.join(CHOICES[flag])}")
        i += step
