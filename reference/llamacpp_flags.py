"""Which ``llama-server`` flags a llama.cpp deployment may carry: an
allow-list of the settings that shape its prompt cache and prefill (the
flag names of llama.cpp's ``common/arg.cpp``), the same rule as
:mod:`reference.sglang_flags`.

A deployment with ``"engine": "llamacpp"`` gives them as
``deployment.llamacpp_args``; inside llama.cpp's environment each one sets
the ``CommonParams`` field the server reads
(``engine_adapter.llamacpp_engine.resolve``), and what the server made of
them is read back from the server itself. Everything else (a model path, a
chat template, a slot-save path, a host) is refused: the model is the
deployment's ``model``.
"""

from __future__ import annotations

import re

from ground.errors import InvalidArgument

MAX_ARGS = 32
#: flag -> (CommonParams field, kind): ``value`` an integer, ``switch`` True,
#: ``off`` False.
FLAGS: dict[str, tuple[str, str]] = {
    "--ctx-size": ("n_ctx", "value"),
    "--parallel": ("n_parallel", "value"),
    "--ctx-checkpoints": ("n_ctx_checkpoints", "value"),
    "--checkpoint-min-step": ("checkpoint_min_step", "value"),
    "--cache-ram": ("cache_ram_mib", "value"),
    "--ubatch-size": ("n_ubatch", "value"),
    "--batch-size": ("n_batch", "value"),
    "--cache-reuse": ("n_cache_reuse", "value"),
    "--no-cache-prompt": ("cache_prompt", "off"),
    "--swa-full": ("swa_full", "switch"),
    "--kv-unified": ("kv_unified", "switch"),
    "--no-cache-idle-slots": ("cache_idle_slots", "off"),
}
#: Bounds of an integer value (llama.cpp takes any int; these keep a run small).
RANGES: dict[str, tuple[int, int]] = {
    "--ctx-size": (0, 262144),
    "--parallel": (1, 8),
    "--ctx-checkpoints": (0, 256),
    "--checkpoint-min-step": (0, 262144),
    "--cache-ram": (-1, 65536),
    "--ubatch-size": (1, 8192),
    "--batch-size": (1, 16384),
    "--cache-reuse": (0, 262144),
}
_INT = re.compile(r"^-?[0-9]{1,9}$")


def allowed_text() -> str:
    return ", ".join(FLAGS)


def parse_llamacpp_args(args: object) -> dict[str, int | bool]:
    """The ``CommonParams`` fields the flags set (field -> value); one-line
    errors naming the index and the token for anything outside the list."""
    if not isinstance(args, list) or len(args) > MAX_ARGS:
        raise InvalidArgument(
            f"deployment.llamacpp_args={str(args)[:60]}: a list of at most {MAX_ARGS} strings, as given to `llama-server`"
        )
    out: dict[str, int | bool] = {}
    i = 0
    while i < len(args):
        token, where = args[i], f"deployment.llamacpp_args[{i}]"
        if not isinstance(token, str) or not token.startswith("--"):
            raise InvalidArgument(
                f"{where}={str(token)[:60]!r}: not a flag or a flag's value; allowed flags: {allowed_text()}"
            )
        flag, eq, inline = token.partition("=")
        if flag not in FLAGS:
            raise InvalidArgument(
                f"{where}={token[:60]!r}: not a prompt-cache or prefill setting of llama-server; allowed: {allowed_text()}"
            )
        field, kind = FLAGS[flag]
        if kind != "value":
            if eq:
                raise InvalidArgument(f"{where}={token[:60]!r}: {flag} takes no value")
            out[field] = kind == "switch"
            i += 1
            continue
        if eq:
            value, step = inline, 1
        elif i + 1 < len(args) and isinstance(args[i + 1], str):
            value, step = args[i + 1], 2
        else:
            raise InvalidArgument(f"{where}={token[:60]!r}: {flag} needs a value")
        lo, hi = RANGES[flag]
        if not _INT.match(value) or not lo <= int(value) <= hi:
            raise InvalidArgument(f"{where}: {flag}={value[:60]!r}: allowed: an integer in [{lo}, {hi}]")
        out[field] = int(value)
        i += step
    return out
