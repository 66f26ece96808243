"""An upstream-ready report from a finding: ISSUE.md, a vLLM-style regression
test, and a candidate fix.

``bundle(finding, ...)`` returns the files' texts; ``kvspec report`` writes
them. Nothing here imports vLLM: the vLLM lines a report cites are read from
the engine environment's installed source as text.

* ``ISSUE.md`` reads like a good vLLM issue: a one-paragraph summary, the
  deployment (model, flags, resolved geometry), expected vs observed per
  request, the version matrix when the report was given one, live-server
  evidence when given, the vLLM function and line where the two numbers part,
  the workaround and what it costs, and how to reproduce.
* ``test_<name>.py`` drives ``vllm.v1.core``'s ``Scheduler`` the way vLLM's
  own ``tests/v1/core`` tests do (configs, KV cache groups, the request block
  hasher, ``schedule()`` / ``update_from_output()``), for the finding's
  resolved geometry and trace; it imports nothing of kvspec. A finding where
  vLLM hits *less* than the promise asserts the promise's hits; one where it
  hits *more* than any state it wrote allows asserts that every Mamba state
  the block pool holds was written by a prefill chunk ending there.
* ``fix.diff``: the patch under ``fixes/`` that the finding's class names
  (:data:`KNOWN_CLASSES`), when there is one.

A finding is a stranger's file, so its text never becomes code or markup:
the finding's fields are checked first (``fuzz.findings.check_fields``: the
signature is hex, the oracle one kvspec has; file and test names come only
from those two or a class id of :data:`KNOWN_CLASSES`); every value the
regression test holds is a Python literal written with ``repr`` (and read
back equal, else refused), never text inside a docstring or a comment;
ISSUE.md shows a finding's text without control characters
(``ground.printable``), prose and table cells through
``ground.printable.markdown_text`` (``<`` and ``&`` as entities, ``[ ] ` |``
escaped: no link, image, HTML or extra cell), code spans and fences longer than any backtick run inside
them (a text cannot close them), and shell lines with every word quoted.

The module is longer than 500 lines because about 170 of them are the
regression test's template (vLLM test code kept as one literal text,
``_TEST_TEMPLATE``), which stays beside the escaping that fills it.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

from fuzz.finding_text import deployment_title, prompt_text, serve_args
from fuzz.findings import check_fields
from fuzz.impact import cost_of, impact_lines, is_shipped_model
from ground.errors import KvspecError, invalid
from ground.home import engines_dir as default_dir
from ground.printable import markdown_text, printable
from reference.case import case_to_dict, parse_case

ROOT = Path(__file__).resolve().parent.parent

#: Known finding classes: how to recognise one (a predicate over the finding
#: and its case), where vLLM's two numbers part, the fix, the workaround.
KNOWN_CLASSES = (
    {
        "id": "longer-sibling-of-aligned-prompt",
        "title": "Hybrid prefix cache: a longer sibling of a block-aligned prompt gets one block less under sparse retention (no EAGLE)",
        "where": ("vllm/v1/core/kv_cache_coordinator.py", "def replay_boundaries", "if not use_eagle:"),
        "why": "Without EAGLE, `replay_boundaries` returns only `num_prompt_tokens - 1`. The retention mask keeps the Mamba state of the block that position floors to. For a prompt of N = k*B tokens that is block k-1 (state after N - B), while a longer sibling, which shares all N tokens, resumes at N: its state is written (the prefill's last chunk ends at N) but not kept. The function's own docstring names both positions (\"a resend ... capped at num_tokens - 1 ..., a longer sibling matches the final aligned block\"); only the EAGLE branch keeps both (#54713).",
        "fix": "fixes/vllm-0.33.0-longer-sibling-of-aligned-prompt.diff",
        "workaround": "`--prefix-cache-retention-interval B` (every block state written is kept, i.e. dense for written states)",
        "cites": [
            "vLLM's own `tests/v1/core/prefix_cache/test_hybrid_prefix_cache_hit_rate.py` asserts that without MTP each follow-up turn hits at least the previous prompt's length floored to the block: a block-aligned previous turn breaks that; its prompt lengths just never land on a block boundary."
        ],
    },
    {
        "id": "stale-state-after-partial-hit",
        "title": "Hybrid prefix cache: with internal Mamba prefill checkpoints, a partial hit's copied state is cached as the state after the next block boundary",
        "where": (
            "vllm/v1/core/sched/scheduler.py",
            "def _mamba_block_aligned_split",
            "if start % block_size != 0 and not use_internal_checkpoint",
        ),
        "why": "After a partial (sub-block) hit at s inside block k, the request's slot k holds a copy of the state after s. Normally the prefill stops at the next block boundary, so slot k is overwritten with the state after (k+1)*B. With an internal prefill checkpoint (Mamba-2 layers since 0.32.0, Qwen GDN on FlashInfer in 0.33.0) `_mamba_block_aligned_split` drops that stop, the chunk runs past (k+1)*B, and `MambaManager.cache_blocks` then publishes slot k under the hash of (k+1)*B tokens: a state after s tokens served as the state after (k+1)*B. The invariant vLLM's own `tests/v1/core/test_mamba_align_chunk_split.py` states (slot p holds the state after exactly (p+1)*block_size tokens; #43559) breaks on this path.",
        "fix": "fixes/vllm-0.33.0-stale-state-after-partial-hit.diff",
        "workaround": "`--prefix-cache-retention-interval 0` (sparse, the default) avoids it unless a replay boundary or a junction marks that block; or no `--prefix-match-unit` (no partial hits)",
        "cites": [
            "#43559 (the same invariant, another path)",
            "vLLM's `tests/v1/core/test_mamba_align_chunk_split.py`",
        ],
    },
)


def _case_of(finding: dict):
    return parse_case(finding["case"])


def classify(finding: dict) -> dict | None:
    """The known class of a finding, or None."""
    case = _case_of(finding)
    g = case.geometry
    if g is None:
        return None
    first = finding.get("first_divergence")
    exp = (finding.get("expected") or {}).get("hits") or []
    obs = (finding.get("observed") or {}).get("hits") or []
    if first is None or first >= len(exp) or first >= len(obs):
        return None
    low, high = obs[first] < exp[first], obs[first] > exp[first]
    B = g.scheduler_block_size
    lengths = [r.num_prompt_tokens for r in case.trace]
    spec_off = case.speculative is None
    if (
        low
        and spec_off
        and finding.get("oracle") in ("promise", "sparse_dense")
        and any(n % B == 0 for n in lengths[:first])
    ):
        return KNOWN_CLASSES[0]
    if high and g.prefill_checkpoint_grid is not None and g.prefix_match_unit is not None:
        return KNOWN_CLASSES[1]
    return None


def vllm_line(version: str, path: str, anchor: str, needle: str, engines_dir: Path | None = None) -> str | None:
    """``path:line`` of ``needle`` after ``anchor`` in the installed vLLM of
    ``version`` (its engine environment), read as text; None if not found."""

    base = (engines_dir or default_dir()) / f"vllm-{version}"
    for site in sorted(base.glob("lib/python3*/site-packages")):
        f = site / path
        if not f.is_file():
            continue
        lines = f.read_text(errors="replace").splitlines()
        start = next((i for i, x in enumerate(lines) if anchor in x), None)
        if start is None:
            continue
        for i in range(start, min(len(lines), start + 400)):
            if needle in lines[i]:
                return f"{path}:{i + 1}"
        return f"{path}:{start + 1}"
    return None


def _name(finding: dict) -> str:
    """The test's name: the class id, else oracle and signature (both
    checked by ``check_fields``: a known oracle, hex digits)."""
    cls = classify(finding)
    base = cls["id"] if cls else f"{finding['oracle']}-{finding['signature']}"
    return re.sub(r"[^a-z0-9_]+", "_", base.lower()).strip("_")


# ------------------------------------------------------------- escaping


def _text(value) -> str:
    """A stranger's text as Markdown prose (``ground.printable.markdown_text``):
    one line, no control characters, ``<`` and ``&`` as entities (no HTML,
    no comment hiding the rest), ``[ ] ` | \\`` backslash-escaped (no
    ``[x](javascript:...)`` link, no image, no code span, no cell)."""
    return markdown_text(value)


def _cell(value) -> str:
    """:func:`_text` for a table cell (``|`` escaped there too)."""
    return markdown_text(value)


def _ticks(text: str) -> int:
    """The longest run of backticks in ``text``."""
    return max((len(m) for m in re.findall(r"`+", text)), default=0)


def _code(value) -> str:
    """A code span no text can close: more backticks than any run inside
    (never at a line's start: three backticks there open a fence)."""
    text = printable(value)
    fence = "`" * (_ticks(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _fence(lang: str, body_lines: list[str]) -> list[str]:
    """A fenced code block no line can close: a fence longer than any
    backtick run inside; each line without control characters."""
    body = [printable(x) for x in body_lines]
    fence = "`" * max(3, _ticks("\n".join(body)) + 1)
    return [fence + lang, *body, fence]


def _literal(value, field: str) -> str:
    """``repr(value)``, a Python literal that reads back equal (so no NaN,
    no object whose repr is code); else one line naming the field."""
    text = repr(value)
    try:
        same = ast.literal_eval(text) == value
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        same = False
    if not same:
        raise invalid(
            field, value, "must be plain data (numbers, strings, lists, objects) to be written into the regression test"
        )
    return text


# ------------------------------------------------------------- ISSUE.md


#: A KV connector's class name, as a report may print it (a finding is a
#: stranger's text: anything else is not named).
_CONNECTOR_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


def _connector_text(finding: dict) -> list[str]:
    """The KV connector the resolution names, and what it does to the
    hashes (vLLM 0.33.0 ``VllmConfig.num_hash_lookahead_tokens``: 0 with any
    connector, so the EAGLE block drop stays in force)."""
    facts = (finding.get("resolution") or {}).get("facts") if isinstance(finding.get("resolution"), dict) else None
    name = facts.get("kv_connector") if isinstance(facts, dict) else None
    if not name:
        return []
    shown = f"`{name}`" if isinstance(name, str) and _CONNECTOR_NAME.match(name) else "one"
    return [
        f"- KV connector: {shown}; with a KV connector vLLM keeps the legacy block hashes (`VllmConfig.num_hash_lookahead_tokens` is 0), so EAGLE/MTP keeps the block drop, as `disable_lookahead_block_hashes` would"
    ]


def _geometry_text(case) -> list[str]:
    g = case.geometry
    if g is None:  # a resolution finding, or vLLM raised before it built one
        return ["- no geometry kvspec could judge (see the summary)"]
    groups = ", ".join(f"{x.count}x {x.kind} (block {x.block_size})" for x in g.groups)
    out = [
        f"- KV cache groups: {groups}",
        f"- scheduler block {g.scheduler_block_size}, hash block {g.hash_block_size}"
        + (f" (`--prefix-match-unit {g.prefix_match_unit}`)" if g.prefix_match_unit else ""),
        f"- retention interval: {'dense (None)' if g.retention_interval is None else g.retention_interval}, chunk budget {g.max_num_batched_tokens}",
    ]
    if g.prefill_checkpoint_grid is not None:
        out.append(f"- internal Mamba prefill checkpoints on a {g.prefill_checkpoint_grid}-token grid")
    out.append(
        f"- speculative decoding: {json.dumps(None if case.speculative is None else {'method': case.speculative.method, 'num_speculative_tokens': case.speculative.num_speculative_tokens, **case.speculative.options})}"
    )
    return out


def issue_markdown(
    finding: dict, *, matrix: list[dict] | None = None, live: dict | None = None, finding_path: str = "FINDING.json"
) -> str:
    case = _case_of(finding)
    cls = classify(finding)
    engine = finding.get("engine", {})
    version = engine.get("version", "?")
    title = cls["title"] if cls else f"Hybrid prefix cache: {_text(finding.get('summary') or '')}"
    lines = [f"# [Bug]: {title}", ""]
    lines += ["## Summary", ""]
    exp = finding["expected"]["hits"]
    obs = finding["observed"]["hits"]
    i = finding.get("first_divergence")
    para = f"On vLLM {version}, {_text(finding.get('summary') or '')}."
    if cls:
        para += " " + cls["why"]
    lines += [para, ""]
    dep = case.deployment
    lines += ["## Deployment", ""]
    if dep is not None:
        where = _text(dep.platform) + (f" ({_text(dep.device)})" if dep.device else "")
        lines.append(
            "Model "
            + _code(dep.model)
            + (f" with config overrides {_code(json.dumps(dep.model_overrides))}" if dep.model_overrides else "")
            + f" on {where}:"
        )
        serve, serve_flags = serve_args(dep.as_dict())
        lines += (
            [""]
            + _fence("sh", [f"{serve} <model> " + shlex.join(printable(a) for a in serve_flags)])
            + ["", f"{deployment_title(dep.as_dict())} resolves it to:"]
        )
    else:
        lines.append(
            f"A hand-written geometry (kvspec case kind {_code(finding.get('case_kind') or 'synthetic')}, reachable: {_text(finding.get('reachable'))}: {_text(finding.get('reachability') or '')}):"
        )
    lines += [""] + _geometry_text(case) + _connector_text(finding) + [""]
    res = finding.get("resolution") or {}
    if res.get("assumptions"):
        lines += [
            "kvspec answered vLLM's hardware questions as: " + "; ".join(_text(a) for a in res["assumptions"]) + ".",
            "",
        ]
    lines += [
        "## Expected vs observed",
        "",
        "Requests run one after another on a fresh server (each finishes before the next starts). Hits are what `vllm:prefix_cache_hits_total` grows by.",
        "",
    ]
    lines += ["| request | prompt | tokens | expected hits | observed hits |", "|---|---|---|---|---|"]
    for j, r in enumerate(case.trace):
        prompt = _cell(prompt_text(case_to_dict(case)["trace"][j]["prompt"], style="prose"))
        mark = " **<-**" if j == i else ""
        lines.append(
            f"| {j} | {prompt} | {r.num_prompt_tokens} | {exp[j] if j < len(exp) else '-'} | {obs[j] if j < len(obs) else '-'}{mark} |"
        )
    lines += [
        "",
        "Prompts sharing a name share that many leading tokens (a prefix of one token stream)."
        " Expected: kvspec's promise, where a request resumes under dense retention (every Mamba state written is kept)"
        + (
            ", and never on a state no prefill chunk wrote"
            if cls and cls["id"] == "stale-state-after-partial-hit"
            else ""
        )
        + ".",
        "",
    ]
    # a model that is not shipped is a folder on someone's machine: never read for a shared report
    lines += impact_lines(cost_of(finding, local_models=False))
    if dep is not None and not is_shipped_model(dep.model):
        lines += [
            f"Model {_code(dep.model)} is not one kvspec ships: its config was not read here, so no figure above comes from it (tokens only).",
            "",
        ]
    if matrix:
        lines += ["## Versions", "", "| engine | hits |", "|---|---|"]
        for row in matrix:
            lines.append(f"| {_cell(row['engine'])} | {_cell(row.get('hits', row.get('error')))} |")
        lines.append("")
    if live:
        lines += _live_section(live)
    lines += ["## Where it goes wrong", ""]
    if cls:
        at = vllm_line(version, *cls["where"])
        lines.append(f"`{at or cls['where'][0]}` ({cls['where'][1].replace('def ', '')}): {cls['why']}")
        for c in cls.get("cites", []):
            lines.append(f"See also {c}.")
    else:
        lines.append(
            "kvspec's explain records, per request, the scheduler's boundary, the junction, the prefill chunk ends and the Mamba states kept; the first request where they part is marked above."
        )
    lines.append("")
    if cls:
        lines += [
            "## Workaround",
            "",
            f"{cls['workaround']}. It keeps more Mamba states (one per written block) and so more KV cache memory.",
            "",
        ]
        fix = ROOT / cls["fix"]
        if fix.is_file():
            lines += ["## Candidate fix", "", f"`fix.diff` (also `{cls['fix']}` in kvspec).", ""]
    lines += (
        ["## Reproduce", ""]
        + _fence(
            "sh",
            [
                f"pytest test_{_name(finding)}.py            # vLLM {version}: fails; with fix.diff applied: passes",
                f"kvspec replay {shlex.quote(printable(finding_path))} --engine vllm=={version}   # kvspec's judge",
            ],
        )
        + [""]
    )
    return "\n".join(printable(line, keep="\t") for line in lines)


def live_summary(raw, path: str, requests: int) -> dict:
    """The parts of a live replay report (``kvspec replay --server URL --json
    REPORT.json``: ``fuzz.live_report.Report.as_dict``) that
    ISSUE.md quotes; a document of another shape is one line."""

    shape = "a JSON object written by kvspec replay --server --json"
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("requests"), list)
        or not isinstance(raw.get("verdict"), str)
    ):
        raise invalid("--live", path, shape)
    rows = raw["requests"]
    if len(rows) != requests or not all(isinstance(r, dict) for r in rows):
        raise invalid(
            "--live", path, f"{shape}, for the finding's case ({requests} requests; the report has {len(rows)})"
        )

    def column(key: str) -> list:
        return [r.get(key) for r in rows]

    return {
        "verdict": raw["verdict"],
        "kind": raw.get("kind"),
        "name": raw.get("name"),
        "server_version": raw.get("server_version"),
        "model": raw.get("model"),
        "server_knobs": raw.get("server_knobs") if isinstance(raw.get("server_knobs"), dict) else {},
        "rule": raw.get("rule"),
        "prompt_tokens": column("prompt_tokens"),
        "observed_hits": column("hits"),
        "target_hits": column("target"),
        "expected_hits": column("expected"),
        "reasons": [str(x) for x in raw.get("reasons") or []],
        "unverified": [str(x) for x in raw.get("unverified") or []],
    }


def _live_section(live: dict) -> list[str]:
    """The live replay (``kvspec report --live REPORT.json``): the server, the
    verdict of kvspec's one judge, the hits per request, what the server
    does not expose."""
    knobs = live.get("server_knobs") or {}
    shown = ", ".join(
        f"{k}={_text(knobs[k])}"
        for k in ("block_size", "hash_block_size", "retention_interval", "mamba_cache_mode", "num_speculative_tokens")
        if k in knobs
    )
    lines = ["## Live server", ""]
    lines.append(
        f"Replayed against a running vLLM {_text(live.get('server_version') or '(version unknown)')} OpenAI server"
        + (f" (model {_code(live['model'])}" + (f"; {shown}" if shown else "") + ")" if live.get("model") else "")
        + ", one request at a time, hits read from `vllm:prefix_cache_hits_total`:"
        + f" verdict **{_text(live.get('verdict'))}**"
        + (
            " (the server shows the finding's observed hits at every request)"
            if live.get("verdict") == "reproduced"
            else ""
        )
        + "."
    )
    observed, target, expected, tokens = (
        live.get(k) or [] for k in ("observed_hits", "target_hits", "expected_hits", "prompt_tokens")
    )

    def cell(xs: list, j: int) -> str:
        x = xs[j] if j < len(xs) else None
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return "-" if x is None else _cell(x)
        return str(int(x)) if float(x).is_integer() else str(x)

    if observed:
        lines += [
            "",
            "| request | tokens | expected hits | finding's observed hits | live hits |",
            "|---|---|---|---|---|",
        ]
        for j in range(len(observed)):
            lines.append(f"| {j} | {cell(tokens, j)} | {cell(expected, j)} | {cell(target, j)} | {cell(observed, j)} |")
    if live.get("unverified"):
        assumed = [
            u.replace(" (not exposed by the server)", "").replace("; not exposed by the server)", ")")
            for u in live["unverified"]
        ]
        lines += [
            "",
            "Not exposed by the server, assumed as the case states: " + "; ".join(_text(a) for a in assumed) + ".",
        ]
    if live.get("reasons") and live.get("verdict") not in ("reproduced", "agrees"):
        lines += ["", "Reasons: " + "; ".join(_text(r) for r in live["reasons"][:10]) + "."]
    return lines + [""]


# ------------------------------------------------------------- the test


_TEST_TEMPLATE = '''# SPDX-License-Identifier: Apache-2.0
"""Regression test: {doc_title}

Generated by kvspec (the finding: TITLE and FINDING_SIGNATURE below). It
drives vLLM's Scheduler the way tests/v1/core's tests do, with the geometry
vLLM resolved for the deployment (a tiny model config with the same KV cache
groups: block sizes, hash unit, retention and budget are what matter), and
serves the trace one request at a time. No kvspec import.
"""

import json
import random

import pytest
import torch

from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec, get_mamba_prefill_checkpoint_position
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

TITLE = {title}
FINDING_SIGNATURE = {signature}
BLOCK = {block}
PREFIX_MATCH_UNIT = {pmu}
RETENTION = {retention}
BUDGET = {budget}
CHECKPOINT_GRID = {grid}
NUM_MAMBA_GROUPS = {mamba_groups}
SPECULATIVE = {speculative}
# Each prompt: (stream name, length) segments; equal names share a prefix.
PROMPTS = {prompts}
EXPECTED_HITS = {expected}
CHECK = {check}
SAMPLED = 2000  # outside every stream's ids


def stream(name, n, _cache={{}}):
    s = _cache.setdefault(name, [])
    rng = _cache.setdefault(("rng", name), random.Random(name))
    while len(s) < n:
        s.append(1 + rng.randrange(1999))
    return s[:n]


def tokens(prompt):
    out = []
    for name, n in prompt:
        out += stream(name, n)
    return out


def make_scheduler(tmp_path):
    layer_types = ["linear_attention"] * NUM_MAMBA_GROUPS + ["full_attention"]
    config = {{
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "vocab_size": 4096,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": len(layer_types), "layer_types": layer_types,
        "full_attention_interval": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
        "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
        "max_position_embeddings": 1 << 20, "tie_word_embeddings": False, "num_nextn_predict_layers": 1,
        "torch_dtype": "bfloat16", "bos_token_id": 4094, "eos_token_id": 4095,
    }}
    (tmp_path / "config.json").write_text(json.dumps(config))
    longest = max(len(tokens(p)) for p in PROMPTS)
    max_model_len = max(8192, -(-(longest + 64) // 4096) * 4096)
    model_config = ModelConfig(model=str(tmp_path), skip_tokenizer_init=True, max_model_len=max_model_len)
    cache_kwargs = dict(block_size=BLOCK, enable_prefix_caching=True, mamba_cache_mode="align",
                        prefix_cache_retention_interval=RETENTION, mamba_block_size=BLOCK)
    if PREFIX_MATCH_UNIT is not None:
        cache_kwargs["prefix_match_unit"] = PREFIX_MATCH_UNIT
    cache_config = CacheConfig(**cache_kwargs)
    parallel_config = ParallelConfig()
    scheduler_config = SchedulerConfig(max_model_len=max_model_len, is_encoder_decoder=False, max_num_batched_tokens=BUDGET,
                                       max_num_seqs=max(1, min(128, BUDGET)), enable_chunked_prefill=True)
    spec_config = None
    k = 0
    if SPECULATIVE is not None:
        spec_config = SpeculativeConfig(target_model_config=model_config, target_parallel_config=parallel_config, **SPECULATIVE)
        k = SPECULATIVE["num_speculative_tokens"]
    vllm_config = VllmConfig(model_config=model_config, cache_config=cache_config, parallel_config=parallel_config,
                             scheduler_config=scheduler_config, speculative_config=spec_config, device_config=DeviceConfig(device="cpu"))
    extra = {{}}
    if CHECKPOINT_GRID is not None:
        extra = dict(num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=CHECKPOINT_GRID)
    groups = []
    for i in range(NUM_MAMBA_GROUPS):
        spec = MambaSpec(block_size=BLOCK, shapes=((3, 96), (4, 16, 16)), dtypes=(torch.bfloat16, torch.float32),
                         mamba_cache_mode="align", num_speculative_blocks=k, **extra)
        groups.append(KVCacheGroupSpec([f"model.layers.{{i}}.linear_attn"], spec))
    attn = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=16, dtype=torch.bfloat16)
    names = [f"model.layers.{{NUM_MAMBA_GROUPS}}.self_attn.attn"]
    if SPECULATIVE is not None:
        names.append("mtp.layers.0.self_attn.attn")
    groups.append(KVCacheGroupSpec(names, attn))
    if SPECULATIVE is not None and spec_config.use_eagle_block_drop():
        groups[-1].is_eagle_group = True  # the draft layer's group, as vLLM flags it
    num_blocks = 64 + sum(len(tokens(p)) // BLOCK + 8 + k for p in PROMPTS) * len(groups)
    kv_cache_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups,
                                    prefix_cache_retention_interval=RETENTION)
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    vllm_config.validate_block_size()
    sbs, hbs = kv_cache_utils.resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    kv_cache_config.hash_block_size = hbs
    kv_cache_config.cache_hit_alignment_tokens = kv_cache_utils.resolve_cache_hit_alignment_tokens(kv_cache_config, vllm_config, sbs, hbs)
    scheduler = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                          structured_output_manager=StructuredOutputManager(vllm_config), block_size=sbs, hash_block_size=hbs,
                          include_finished_set=False, log_stats=True)
    hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
    kv_cache_utils.init_none_hash(hash_fn)
    hasher = kv_cache_utils.get_request_block_hasher(hbs, hash_fn, vllm_config.num_hash_lookahead_tokens)
    return scheduler, hasher, hbs


def serve(scheduler, hasher, index, toks):
    """One request to completion; (hits, prefill chunk ends, the request)."""
    req = Request(request_id=f"req-{{index}}", prompt_token_ids=toks, sampling_params=SamplingParams(max_tokens=1),
                  pooling_params=None, block_hasher=hasher)
    scheduler.add_request(req)
    hits, ends = 0, []
    for _ in range(len(toks) + 64):
        if not scheduler.has_unfinished_requests():
            break
        so = scheduler.schedule()
        ids = list(so.num_scheduled_tokens)
        done = min(req.num_computed_tokens, len(toks))
        if req.request_id in ids and (not ends or ends[-1] < done) and req.num_output_tokens == 0:
            ends.append(done)
        sampled = [[SAMPLED] if scheduler.requests[r].num_computed_tokens >= scheduler.requests[r].num_tokens else [] for r in ids]
        out = scheduler.update_from_output(so, ModelRunnerOutput(req_ids=ids, req_id_to_index={{r: j for j, r in enumerate(ids)}},
                                                                  sampled_token_ids=sampled))
        for eco in (out or {{}}).values():
            if eco.scheduler_stats is not None and eco.scheduler_stats.prefix_cache_stats is not None:
                hits += eco.scheduler_stats.prefix_cache_stats.hits
    assert not scheduler.has_unfinished_requests()
    return hits, ends, req


def mamba_states_held(scheduler, req, hbs):
    """Token counts p whose Mamba state (group 0) the block pool holds for this prompt."""
    pool = scheduler.kv_cache_manager.block_pool
    return [(j + 1) * hbs for j, h in enumerate(req.block_hashes) if pool.get_cached_block(h, [0]) is not None]


def test_{name}(tmp_path):
    scheduler, hasher, hbs = make_scheduler(tmp_path)
    hits, written = [], set()
    for i, prompt in enumerate(PROMPTS):
        h, ends, req = serve(scheduler, hasher, i, tokens(prompt))
        hits.append(h)
        written |= set(ends)
        if CHECKPOINT_GRID is not None:  # the prompt checkpoint a kernel may export from inside a chunk
            written.add(get_mamba_prefill_checkpoint_position(len(req.prompt_token_ids), hbs, scheduler.use_eagle_block_drop,
                                                              num_hash_lookahead_tokens=scheduler.num_hash_lookahead_tokens))
        if CHECK == "written":
            # Every Mamba state keyed at p tokens was written by a prefill
            # chunk ending at p (or by vLLM's own prompt checkpoint: a sub-block
            # position, keyed as a partial block).
            for p in mamba_states_held(scheduler, req, hbs):
                assert p in written or p % BLOCK, (
                    f"request {{i}}: a Mamba state is cached as the state after {{p}} tokens, but no prefill chunk "
                    f"ended at {{p}} (chunk ends so far: {{sorted(written)}})")
    if CHECK == "hits":
        assert hits == EXPECTED_HITS
'''


def regression_test(finding: dict) -> str:
    """The vLLM-style regression test's source for a finding (checked with
    ``check_fields`` first). Every value from the finding is a literal
    (:func:`_literal`); the docstring holds only kvspec's own class title."""

    check_fields(finding)
    case = _case_of(finding)
    g = case.geometry
    if g is None or len({x.block_size for x in g.groups}) != 1:
        raise ValueError("a regression test needs a resolved geometry with one block size (a deployment's)")
    if any(s.output is not None for r in case.trace for s in r.prompt):
        raise ValueError(
            "a regression test for a prompt quoting an earlier output (an output segment) is not written: its template serves one-token outputs"
        )
    cls = classify(finding)
    check = "written" if (cls and cls["id"] == "stale-state-after-partial-hit") else "hits"
    spec = None
    if case.speculative is not None:
        spec = {
            "method": case.speculative.method,
            "num_speculative_tokens": case.speculative.num_speculative_tokens,
            **case.speculative.options,
        }
    mamba_groups = sum(x.count for x in g.groups if x.kind == "mamba")
    prompts = [[(s.segment, s.length) for s in r.prompt] for r in case.trace]
    return _TEST_TEMPLATE.format(
        doc_title=cls["title"] if cls else "a kvspec finding",
        title=_literal(cls["title"] if cls else printable(finding.get("summary") or ""), "summary"),
        signature=_literal(finding["signature"], "signature"),
        block=_literal(g.scheduler_block_size, "case.geometry"),
        pmu=_literal(g.prefix_match_unit, "case.geometry"),
        retention=_literal(g.retention_interval, "case.geometry"),
        budget=_literal(g.max_num_batched_tokens, "case.geometry"),
        grid=_literal(g.prefill_checkpoint_grid, "case.geometry"),
        mamba_groups=_literal(mamba_groups, "case.geometry"),
        speculative=_literal(spec, "case.speculative"),
        prompts=_literal(prompts, "case.trace"),
        expected=_literal(finding["expected"]["hits"], "expected.hits"),
        check=_literal(check, "check"),
        name=_name(finding),
    )


def bundle(
    finding: dict, *, matrix: list[dict] | None = None, live: dict | None = None, finding_path: str = "FINDING.json"
) -> dict[str, str]:
    """{file name: text} of the report bundle; a malformed finding field is
    one line naming it (``fuzz.findings.check_fields``), before any text is
    made."""

    check_fields(finding)
    files = {"ISSUE.md": issue_markdown(finding, matrix=matrix, live=live, finding_path=finding_path)}
    try:
        files[f"test_{_name(finding)}.py"] = regression_test(finding)
    except KvspecError:
        raise
    except ValueError:  # no resolved geometry of one block size: no test
        pass
    cls = classify(finding)
    if cls:
        fix = ROOT / cls["fix"]
        if fix.is_file():
            files["fix.diff"] = fix.read_text()
    files["finding.json"] = json.dumps(finding, indent=2) + "\n"
    return files
