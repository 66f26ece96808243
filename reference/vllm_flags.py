"""Which ``vllm serve`` flags a deployment may carry: an allow-list.

A case or finding comes from a stranger, and kvspec hands its
``deployment.vllm_args`` to vLLM's own parser inside a (warm, shared)
engine process. Many of vLLM's flags load code or data by name
(``--trust-remote-code``, ``--worker-cls``, ``--compilation-config``'s
``inductor_passes``, ``--kv-transfer-config``'s ``kv_connector_module_path``,
``--config FILE.yaml``, ``--hf-overrides``, ``--tokenizer``, ...), so the
rule is an allow-list, not a deny-list:

* every token that starts with ``-`` and is not a negative integer
  (``--seed -1``; ``-0.5`` is refused: vLLM's parser reads a token with a
  ``-`` and a ``.`` as a dotted key and takes the next token as its value)
  must name, exactly, a flag of :data:`FLAGS`: the
  cache geometry, scheduling, parallelism and speculative decoding, plus the
  two kvspec itself passes (``--load-format dummy``, ``--skip-tokenizer-init``);
* before matching, a flag is read as vLLM reads it: ``--flag=value`` is the
  flag and its value, ``_`` in a long flag's name is ``-`` (vLLM's
  ``FlexibleArgumentParser``); a short alias (``-tp``) is its long flag.
  Anything else is refused, which covers argparse's abbreviations (a prefix
  of a long flag), vLLM's dotted JSON keys (``--speculative-config.method``:
  spell the keys in the JSON value instead) and ``--config FILE``;
* a flag that takes a value takes the next token (or its ``=value``); a
  token that is neither a flag nor a flag's value is refused;
* a JSON-valued flag (``--speculative-config``) must hold a JSON object of
  at most :data:`MAX_ARG_CHARS` characters whose keys are all in its own
  allow-list (:data:`SPECULATIVE_KEYS`: no ``model``, ``tokenizer``,
  ``revision``, ``code_revision``, ``quantization``, class or module path),
  each of the stated type;
* a size flag's value is ASCII digits (optionally with vLLM's k/m/g/t or
  K/M/G/T suffix; ``None``, ``auto``, ``-1`` where vLLM reads them) of at
  most its bound (:func:`int_bounds`, ``reference.case``'s documented
  limits), so vLLM never sizes anything from an unbounded number (Python's
  ``int`` would also read ``1_000_000_000``); a flag with fixed values takes only those
  (:data:`FIXED_VALUES`).

Every refusal is one line naming the index and the token:
``deployment.vllm_args[3]='--trust-remote-code': loads code or is not a
cache setting; allowed: ...``. Whether vLLM accepts an allowed flag's value
is still vLLM's answer (its parser, its config checks).
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

from ground.errors import InvalidArgument, invalid

MAX_ARG_CHARS = 4096
#: A flag takes no value (``switch``), one value (``value``), or one JSON
#: object checked key by key (``json``).
FLAGS: dict[str, str] = {
    # cache geometry
    "--block-size": "value",
    "--kv-cache-dtype": "value",
    "--enable-prefix-caching": "switch",
    "--no-enable-prefix-caching": "switch",
    "--disable-prefix-caching": "switch",
    "--prefix-cache-retention-interval": "value",
    "--prefix-match-unit": "value",
    "--prefix-caching-hash-algo": "value",
    "--mamba-cache-mode": "value",
    "--mamba-block-size": "value",
    "--mamba-cache-dtype": "value",
    "--mamba-ssm-cache-dtype": "value",
    "--enable-mamba-shared-prefix-checkpoint": "switch",
    "--no-enable-mamba-shared-prefix-checkpoint": "switch",
    "--disable-mamba-shared-prefix-checkpoint": "switch",
    "--disable-hybrid-kv-cache-manager": "switch",
    "--gpu-memory-utilization": "value",
    # the block pool's size (vLLM 0.33.0 kv_cache_planning.py:1515-1530: the
    # planned memory becomes this many blocks' worth): a cache under pressure
    "--num-gpu-blocks-override": "value",
    "--dtype": "value",
    "--gdn-prefill-backend": "value",
    # scheduling
    "--max-num-batched-tokens": "value",
    "--max-num-scheduled-tokens": "value",
    "--max-num-seqs": "value",
    "--max-model-len": "value",
    "--long-prefill-token-threshold": "value",
    "--scheduling-policy": "value",
    "--enable-chunked-prefill": "switch",
    "--no-enable-chunked-prefill": "switch",
    "--disable-chunked-prefill": "switch",
    "--async-scheduling": "switch",
    "--no-async-scheduling": "switch",
    "--enforce-eager": "switch",
    "--no-enforce-eager": "switch",
    "--seed": "value",
    # parallelism
    "--tensor-parallel-size": "value",
    "--pipeline-parallel-size": "value",
    "--data-parallel-size": "value",
    # speculative decoding
    "--speculative-config": "json",
    # KV connectors: CPU offloading (vLLM's own connector, scheduler side on CPU)
    "--kv-offloading-size": "value",
    "--kv-offloading-backend": "value",
    # what kvspec passes itself (the live server's flags)
    "--load-format": "value",
    "--skip-tokenizer-init": "switch",
}
#: Short aliases vLLM's parser knows, read as their long flag.
ALIASES = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
    "-sc": "--speculative-config",
}
#: Flags whose value is fixed: no weights are ever loaded.
FIXED_VALUES = {"--load-format": ("dummy",), "--kv-offloading-backend": ("native",)}
#: Why each is fixed.
FIXED_WHY = {
    "--load-format": "no weights are loaded",
    "--kv-offloading-backend": "lmcache's connector needs an LMCache server and package; vLLM's own CPU offloading runs in-process",
}
MAX_PARALLEL = 1024
MAX_SEQS = 1 << 16
#: The largest ``--num-gpu-blocks-override`` a case may set (the block
#: pool's construction is linear in its blocks; kvspec's own pools stop at
#: ``engine_adapter.vllm_engine.resolve.MAX_BLOCKS`` too).
MAX_POOL_BLOCKS = 200_000
#: Flags that take a decimal number (ASCII digits, an optional fraction)
#: above 0 and at most this: CPU memory for the offloading connector, GiB.
DECIMAL_BOUNDS = {"--kv-offloading-size": 1024}
_DECIMAL = re.compile(r"^[0-9]{1,6}(\.[0-9]{1,6})?$")


@cache
def int_bounds() -> dict[str, int]:
    """The largest integer each size flag takes (``reference.case``'s
    documented limits; read late: ``reference.case`` imports this module)."""
    from reference.limits import MAX_BATCHED_TOKENS, MAX_BLOCK_SIZE, MAX_PROMPT_TOKENS, MAX_RETENTION_INTERVAL

    return {
        "--block-size": MAX_BLOCK_SIZE,
        "--mamba-block-size": MAX_BLOCK_SIZE,
        "--prefix-match-unit": MAX_BLOCK_SIZE,
        "--prefix-cache-retention-interval": MAX_RETENTION_INTERVAL,
        "--max-num-batched-tokens": MAX_BATCHED_TOKENS,
        "--max-num-scheduled-tokens": MAX_BATCHED_TOKENS,
        "--long-prefill-token-threshold": MAX_BATCHED_TOKENS,
        "--max-model-len": 16 * MAX_PROMPT_TOKENS,
        "--max-num-seqs": MAX_SEQS,
        "--num-gpu-blocks-override": MAX_POOL_BLOCKS,
        "--tensor-parallel-size": MAX_PARALLEL,
        "--pipeline-parallel-size": MAX_PARALLEL,
        "--data-parallel-size": MAX_PARALLEL,
    }


#: ``--speculative-config`` keys (vLLM 0.33.0 ``SpeculativeConfig``'s plain
#: numeric and boolean knobs) and the type each takes.
SPECULATIVE_KEYS: dict[str, type | tuple[type, ...]] = {
    "method": str,
    "num_speculative_tokens": int,
    "disable_lookahead_block_hashes": bool,
    "disable_eagle_block_drop": bool,
    "disable_padded_drafter_batch": bool,
    "parallel_drafting": bool,
    "enforce_eager": bool,
    "draft_tensor_parallel_size": int,
    "tensor_parallel_size": int,
    "max_model_len": int,
    "prompt_lookup_max": int,
    "prompt_lookup_min": int,
    "kv_cache_dtype": str,
}
#: Speculative methods a deployment may name: kvspec's (``mtp``; ``eagle``
#: and ``eagle3``, whose drafter is kvspec's own, never a model by name:
#: ``engine_adapter.models.served.drafter_config``; ``ngram``: prompt
#: lookup, no drafter model, no drafter KV) and vLLM's per-model MTP names
#: (``qwen3_next_mtp``, ...).
SPECULATIVE_METHODS = ("mtp", "eagle", "eagle3", "ngram")
_MTP_NAME = re.compile(r"^[a-z0-9]+(_[a-z0-9]+)*_mtp$")
_PLAIN_WORD = re.compile(r"^[a-z0-9_]{1,32}$")
#: A negative integer: a value, not a flag (argparse agrees; without a ``.``,
#: vLLM's dotted-key step leaves it alone).
_NEGATIVE_NUMBER = re.compile(r"^-\d+$")
#: A size as vLLM's ``human_readable_int`` reads it (ASCII digits only:
#: Python's ``int`` would also take ``1_000_000`` and other scripts' digits).
_INT_VALUE = re.compile(r"^\s*([0-9]{1,20})(?:\.([0-9]{1,6}))?([kKmMgGtT]?)\s*$")
_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
#: Values vLLM reads as "unset" or "automatic" for a size flag.
_UNSET = ("None", "", "-1", "auto")


def allowed_text() -> str:
    """The allowed flags, for an error message."""
    return ", ".join([*FLAGS, *ALIASES])


def _refuse(i: int, token: str, why: str) -> InvalidArgument:
    return invalid(f"deployment.vllm_args[{i}]", token, f"{why}; allowed: {allowed_text()}")


def canonical_flag(token: str) -> str:
    """The flag ``token`` names as vLLM's parser reads it: before ``=``,
    ``_`` as ``-`` in a long flag, a short alias as its long flag."""
    flag = token.split("=", 1)[0]
    if flag.startswith("--"):
        flag = "--" + flag[2:].replace("_", "-")
    return ALIASES.get(flag, flag)


def is_number(token: str) -> bool:
    """Whether ``token`` is a negative integer (a value, not a flag)."""
    return bool(_NEGATIVE_NUMBER.match(token))


def check_vllm_args(args: list[str]) -> None:
    """Refuse any flag outside :data:`FLAGS` and any bad value of one (one
    line naming ``deployment.vllm_args[i]``)."""
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("-") or is_number(token):
            raise _refuse(i, token, "a value with no flag before it")
        flag = canonical_flag(token)
        if flag not in FLAGS:
            name = token.split("=", 1)[0]
            if "." in name and canonical_flag(name.split(".", 1)[0]) in FLAGS:
                raise _refuse(i, token, "a dotted JSON key; spell the keys inside the flag's JSON value")
            if name.startswith("--") and len(name) > 2 and any(f.startswith(canonical_flag(name)) for f in FLAGS):
                raise _refuse(
                    i,
                    token,
                    "an abbreviation (argparse would expand it, perhaps to a flag that loads code); spell the flag in full",
                )
            raise _refuse(i, token, "loads code or is not a cache setting")
        kind = FLAGS[flag]
        explicit = "=" in token
        if kind == "switch":
            if explicit:
                raise _refuse(i, token, f"{flag} takes no value")
            i += 1
            continue
        if explicit:
            value, at = token.split("=", 1)[1], i
            i += 1
        else:
            if i + 1 >= len(args) or (args[i + 1].startswith("-") and not is_number(args[i + 1])):
                raise _refuse(i, token, f"{flag} takes a value")
            value, at = args[i + 1], i + 1
            i += 2
        check_flag_value(flag, value, f"deployment.vllm_args[{at}]")


def check_flag_value(flag: str, value: str, where: str) -> None:
    """A value of an allowed flag: fixed values, integer bounds, JSON keys."""
    if flag in FIXED_VALUES and value not in FIXED_VALUES[flag]:
        raise invalid(where, value, f"{flag} takes {', '.join(FIXED_VALUES[flag])} only ({FIXED_WHY[flag]})")
    bounds = int_bounds()
    if flag in bounds and value.strip() not in _UNSET:
        m = _INT_VALUE.match(value)
        if m is None:
            raise invalid(
                where, value, f"{flag} takes an integer of ASCII digits (optionally k/m/g/t or K/M/G/T), None or auto"
            )
        whole, frac, suffix = m.groups()
        scale = _SUFFIX[suffix]
        size = int(whole) * scale + (int(frac) * scale) // 10 ** len(frac) if frac else int(whole) * scale
        if size > bounds[flag]:
            raise invalid(where, value, f"{flag} at most {bounds[flag]:,} (kvspec's documented limits)")
    if flag in DECIMAL_BOUNDS:
        top = DECIMAL_BOUNDS[flag]
        if not _DECIMAL.match(value) or not 0 < float(value) <= top:
            raise invalid(
                where,
                value,
                f"{flag} takes a decimal number above 0 and at most {top} (ASCII digits, an optional fraction)",
            )
    if FLAGS[flag] == "json":
        check_speculative_config(value, where)


def check_speculative_config(text: str, where: str) -> dict[str, Any]:
    """``--speculative-config``'s JSON: an object of :data:`SPECULATIVE_KEYS`
    only, each of its type; ``method`` a speculative method by name."""
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise invalid(where, text, "a JSON object (--speculative-config)") from None
    if not isinstance(doc, dict):
        raise invalid(where, text, "a JSON object (--speculative-config)")
    keys = ", ".join(SPECULATIVE_KEYS)
    for key, value in doc.items():
        field = f"{where}.{key}"
        if key not in SPECULATIVE_KEYS:
            raise invalid(
                field,
                value,
                f"--speculative-config key loads code or a model by name, or is not a cache setting; allowed keys: {keys}",
            )
        want = SPECULATIVE_KEYS[key]
        ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
        if not ok:
            raise invalid(field, value, f"a {want.__name__}")
        if want is int:
            from reference.limits import MAX_SPECULATIVE_TOKENS

            top = MAX_SPECULATIVE_TOKENS if key == "num_speculative_tokens" else int_bounds()["--max-model-len"]
            if not 1 <= value <= top:
                raise invalid(field, value, f"an integer from 1 to {top:,}")
        if want is str and not _PLAIN_WORD.match(value):
            raise invalid(field, value, "a plain name of [a-z0-9_] (no module or class path)")
        if key == "method" and value not in SPECULATIVE_METHODS and not _MTP_NAME.match(value):
            raise invalid(
                field, value, f"allowed: {', '.join(SPECULATIVE_METHODS)} or a model's MTP name (qwen3_next_mtp, ...)"
            )
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
