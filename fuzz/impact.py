"""A finding's cost, read from the finding and shown: the ``cost`` object a
finding is written with, the cost column of ``kvspec findings`` and the
"Impact" section of ``kvspec report``'s ISSUE.md.

The arithmetic and its sources are :mod:`fuzz.cost`; this module gathers
its inputs from a finding: the severity and whether the oracle has a token
cost (``fuzz.oracle_registry``), the hits, the model config of a deployment
case (a shipped model of ``engine_adapter/models`` or the config.json its
path names, with ``model_overrides`` applied: the model *as the case
carries it*), the tensor parallelism (the resolution's facts, else
``--tensor-parallel-size`` / ``-tp`` of its flags, else 1), the device, and
one Mamba state's bytes (the resolution's facts).

Readers recompute the cost from the finding's fields (:func:`cost_of`)
rather than trusting a ``cost`` object in the file: a finding written before
costs existed lists the same way, and a stranger's file cannot state its
own numbers.
"""

from __future__ import annotations

from engine_adapter.models.served import model_config_dict
from ground.errors import KvspecError
from reference.deployment import get_flag, parse_deployment
from reference.vllm_flags import canonical_flag, is_number

from fuzz.cost import GPUS, UTILISATION, finding_cost, model_dims
from fuzz.oracle_registry import BY_NAME, SEVERITIES


def _model(deployment: dict) -> tuple[dict | None, str | None, str]:
    """(dims, model name, note): the deployment's model config read and
    measured, or None and why not. It is read as a run reads it
    (:func:`engine_adapter.models.served.model_config_dict`: a shipped model,
    or a regular config.json of at most 4 MiB with no code-loading key and
    an architecture kvspec knows, overrides applied); anything else costs
    tokens only."""
    name = str(deployment.get("model") or "")
    try:
        cfg = model_config_dict(parse_deployment(deployment))
        return model_dims(cfg), name, ""
    except (KvspecError, OSError, ValueError, KeyError, TypeError) as e:
        return None, name, f"model config not readable ({type(e).__name__}): tokens only"


def _tensor_parallel(deployment: dict, facts: dict) -> int:
    """The resolution's ``tensor_parallel_size``, else the flag's value as
    vLLM's parser reads it (an alias or ``_`` spelling is its long flag; the
    last one given wins), else 1."""
    tp = facts.get("tensor_parallel_size")
    if type(tp) is int and tp >= 1:
        return tp
    args = tuple(_canonical(str(a)) for a in deployment.get("vllm_args") or [])
    value = get_flag(args, "--tensor-parallel-size")
    return max(int(value), 1) if value is not None and value.isdigit() else 1


def _canonical(token: str) -> str:
    """A flag token spelled as its long flag (its ``=value`` kept); a value as it is."""
    if not token.startswith("-") or is_number(token):
        return token
    _, eq, value = token.partition("=")
    return canonical_flag(token) + eq + value


def cost_of(finding: dict) -> dict:
    """The ``cost`` object (:func:`fuzz.cost.finding_cost`) of a finding in
    schema 2's shape (``fuzz.findings.upgrade``), recomputed from its fields
    (see the module docstring): an old finding without one gets the same."""
    rule = BY_NAME.get(str(finding.get("oracle")))
    severity, token_cost = (rule.severity, rule.token_cost) if rule else ("lost reuse", False)
    exp = (finding.get("expected") or {}) if isinstance(finding.get("expected"), dict) else {}
    obs = (finding.get("observed") or {}) if isinstance(finding.get("observed"), dict) else {}
    hits_e = [h for h in exp.get("hits") or [] if type(h) is int]
    hits_o = [h for h in obs.get("hits") or [] if type(h) is int]
    requests = [i for i in finding.get("diverging_requests") or [] if type(i) is int and i >= 0]
    case = finding.get("case") if isinstance(finding.get("case"), dict) else {}
    deployment = case.get("deployment") if isinstance(case.get("deployment"), dict) else None
    facts = ((finding.get("resolution") or {}).get("facts") or {}) if isinstance(finding.get("resolution"), dict) else {}
    facts = facts if isinstance(facts, dict) else {}
    dims = model = None
    note, tp, device, state_bytes = "", 1, None, None
    if deployment is not None:
        dims, model, note = _model(deployment)
        tp = _tensor_parallel(deployment, facts)
        device = str(deployment.get("device") or facts.get("device") or "") or None
        page, layers = facts.get("mamba_page_size_bytes"), facts.get("mamba_layers")
        if type(page) is int and type(layers) is int:
            state_bytes = page * layers
        elif type(page) is int and dims:
            state_bytes = page * dims["mamba_layers"]
    out = finding_cost(severity=severity, token_cost=token_cost, expected=hits_e, observed=hits_o, requests=requests, dims=dims, model=model,
                       tp=tp, device=device, states=(exp.get("states"), obs.get("states")), state_bytes=state_bytes)
    if note:
        out["note"] = note
    return out


def severity_rank(cost: dict) -> int:
    """0 for the worst severity (:data:`fuzz.oracle_registry.SEVERITIES`)."""
    return SEVERITIES.index(cost["severity"]) if cost.get("severity") in SEVERITIES else len(SEVERITIES)


def _seconds(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def short(cost: dict) -> str:
    """One cell: ``lost reuse: 1,360 tokens, 12.3 ms on h100 (TP 1)``."""
    text = cost["severity"]
    if cost.get("tokens_total") is not None:
        text += f": {cost['tokens_total']:,} token(s) recomputed"
        secs = cost.get("prefill_seconds")
        gpu = cost.get("device") if secs and cost.get("device") in secs else "h100"
        if secs and cost["tokens_total"]:
            text += f", {_seconds(secs[gpu])} on {gpu} (TP {cost['tensor_parallel']})"
        elif cost.get("note") and cost["tokens_total"]:
            text += " (no model: tokens only)"
    mem = cost.get("memory")
    if isinstance(mem, dict) and (mem["extra_states"] or mem["missing_states"]):
        text += f"; {mem['extra_states']} Mamba state(s) kept beyond the promise, {mem['missing_states']} it needs dropped"
    return text


def impact_lines(cost: dict) -> list[str]:
    """ISSUE.md's "Impact" section (markdown lines, numbers only: every
    text is kvspec's own)."""
    lines = ["## Impact", "", f"Severity: **{cost['severity']}**."]
    if cost.get("tokens_total") is None:
        lines.append("No token cost: this oracle compares no hit counts (the hits agree, or vLLM raised, or only its settings are judged).")
    else:
        per = ", ".join(f"request {r['request']}: {r['tokens']:,} (hit {r['from']:,} of {r['to']:,})" for r in cost["tokens_per_request"]) or "none"
        lines.append(f"Prefill tokens recomputed: {cost['tokens_total']:,} over the trace ({per}).")
        secs = cost.get("prefill_seconds")
        if secs and cost["tokens_total"]:
            d = cost["model_dims"]
            lines += ["", f"Prefill time lost per occurrence, model `{cost['model']}` (about {d['active_params'] / 1e9:.2f} B active non-embedding parameters, "
                      f"{d['attention_layers']} full-attention layers of width {d['attention_width']}), tensor parallelism {cost['tensor_parallel']}: "
                      f"{cost['flops'] / 1e12:,.2f} TFLOP.", "", "| GPU | dense BF16 peak | prefill time lost |", "|---|---|---|"]
            lines += [f"| {GPUS[g][0]} | {GPUS[g][1] / 1e12:,.0f} TFLOPS | {_seconds(s)} |" for g, s in secs.items()]
            lines += ["", f"Assumptions: FLOPs = 2 x active non-embedding parameters per token plus 4 x layers x width x context for full attention "
                      f"(embeddings, LM head, norms, convolutions, the recurrence and the draft model not counted); {UTILISATION:.0%} of the dense BF16 peak; "
                      "perfect scaling over tensor parallelism. The loss recurs every time the request pattern recurs (kvspec's `fuzz/cost.py`)."]
        elif cost["tokens_total"]:
            lines.append("No model (a hand geometry, or a config kvspec cannot read): tokens only.")
    mem = cost.get("memory")
    if isinstance(mem, dict):
        size = f" ({mem['extra_bytes']:,} bytes per GPU)" if mem.get("extra_bytes") else ""
        lines.append(f"Memory: {mem['extra_states']} Mamba state(s) kept beyond what the promise needs{size}, {mem['missing_states']} it needs dropped.")
    else:
        lines.append("Memory: not measured.")
    return lines + [""]
