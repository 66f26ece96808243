"""A finding's cost, read from the finding and shown: the ``cost`` object a
finding is written with, the cost column of ``kvspec findings`` and the
"Impact" section of ``kvspec report``'s ISSUE.md.

The arithmetic and its sources are :mod:`fuzz.results.cost`; this module gathers
its inputs from a finding: the severity and whether the oracle has a token
cost (``fuzz.judge.oracle_registry``), the hits, the model config of a deployment
case (a shipped model of ``engine_adapter/models`` or the config.json its
path names, with ``model_overrides`` applied: the model *as the case
carries it*), the tensor parallelism (the resolution's facts, else
``--tensor-parallel-size`` / ``-tp`` of a vLLM deployment's flags or
``--tp-size`` of an SGLang one's, else 1), the device, one Mamba state's
bytes (the resolution's facts), and the Mamba states to compare
(:func:`memory_states`: the retention oracle's, else the states the engine
held before the first divergence against the promise's, else the stale
states).

Readers recompute the cost from the finding's fields (:func:`cost_of`)
rather than trusting a ``cost`` object in the file: a finding written before
costs existed lists the same way, and a stranger's file cannot state its
own numbers.
"""

from __future__ import annotations

import hashlib
from array import array

from engine_adapter.models.served import model_config_dict
from fuzz.judge.oracle_registry import BY_NAME, SEVERITIES
from fuzz.judge.oracle_states import held_states, stale_keys
from fuzz.results.cost import GPUS, UTILISATION, Placement, finding_cost, model_dims
from ground.engines import DEFAULT_FAMILY, FAMILIES, load
from ground.errors import KvspecError
from reference.case import Case, parse_case, prompt_tokens
from reference.deployment import get_flag, parse_deployment
from reference.knobs import DEFAULT_VERSION, resolve_knobs
from reference.predict import predict_with_knobs
from reference.vllm_flags import canonical_flag, is_number


def is_shipped_model(name: object) -> bool:
    """Whether ``name`` is a model shipped with kvspec (``engine_adapter.models.SHIPPED``)."""
    from engine_adapter.models import SHIPPED

    return isinstance(name, str) and name in SHIPPED


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


def placement(deployment: dict | None, facts: dict, *, read_model: bool = True) -> Placement:
    """Where a deployment runs, as its cost reads it: its model read and
    measured (:func:`_model`; with ``read_model`` off: not read, tokens
    only), its tensor parallelism (:func:`_tensor_parallel`) and its device
    (the deployment's, else the resolution's). None (a server, a hand
    geometry): no model, tokens only."""
    if deployment is None:
        return Placement()
    dims, model, note = (
        _model(deployment) if read_model else (None, None, "a local model folder, not read: tokens only")
    )
    device = str(deployment.get("device") or facts.get("device") or "") or None
    return Placement(dims, model, _tensor_parallel(deployment, facts), device, note)


def _tensor_parallel(deployment: dict, facts: dict) -> int:
    """The resolution's ``tensor_parallel_size``, else the flag's value as
    vLLM's parser reads it (an alias or ``_`` spelling is its long flag; the
    last one given wins), else 1."""
    tp = facts.get("tensor_parallel_size")
    if type(tp) is int and tp >= 1:
        return tp
    family = FAMILIES.get(deployment.get("engine") or DEFAULT_FAMILY)
    if family is None:
        return 1
    # each family's own spelling (SGLang's allow-list spells it --tp-size only: reference.sglang_flags)
    canonical = canonical_flag if family.canonical_flag is None else load(family.canonical_flag)
    args = tuple(_canonical(str(a), canonical) for a in deployment.get(family.args_field) or [])
    value = get_flag(args, family.tp_flag)
    return max(int(value), 1) if value is not None and value.isdigit() else 1


def _canonical(token: str, canonical=canonical_flag) -> str:
    """A flag token spelled as its long flag by the family's ``canonical``
    (vLLM's by default; SGLang's reads ``_`` as ``-`` and leaves any other
    token alone), its ``=value`` kept; a value as it is."""
    if not token.startswith("-") or is_number(token):
        return token
    _, eq, value = token.partition("=")
    return canonical(token) + eq + value


def _state_key(prompts: list[list[int]], j: int, p: int) -> tuple[int, str]:
    """One Mamba state: the position and the tokens before it (two
    requests' states at ``p`` are one when their prompts share ``p`` tokens)."""
    return p, hashlib.sha256(array("q", prompts[j][:p]).tobytes()).hexdigest()


def _engine_held(e: dict) -> set[int] | None:
    """The states an engine's explain record says it holds on the request's
    prompt (:func:`fuzz.judge.oracle_states.held_states`); SGLang's records name
    the states its prefill tracked (``tracked``) instead."""
    held = held_states(e) if isinstance(e, dict) else None
    if held is None and isinstance(e, dict) and isinstance(e.get("tracked"), list):
        held = {int(p) for p in e["tracked"] if type(p) is int}
    return held


def memory_states(finding: dict, oracle: str) -> tuple[list | None, list | None, str, str]:
    """(promise's states, engine's states, basis, reason): what the memory
    figure compares (``fuzz.results.cost``, "Memory"), or Nones and why not."""
    exp = finding.get("expected") if isinstance(finding.get("expected"), dict) else {}
    obs = finding.get("observed") if isinstance(finding.get("observed"), dict) else {}
    if isinstance(exp.get("states"), list) and isinstance(obs.get("states"), list):
        return exp["states"], obs["states"], "retention", ""
    explain = finding.get("explain") if isinstance(finding.get("explain"), dict) else {}
    engine = [e for e in explain.get("engine") or [] if isinstance(e, dict)]
    if not engine or len(engine) != len(explain.get("engine") or []):
        return (
            None,
            None,
            "",
            "not measured: the finding carries no per-request engine record (a crash, or a setting judged without a run)",
        )
    try:
        case = parse_case(finding["case"])
        prompts = [prompt_tokens(r) for r in case.trace]
    except (KvspecError, KeyError, TypeError, ValueError):
        return None, None, "", "not measured: the finding's case cannot be read"
    if oracle == "stale":
        stale = {
            _state_key(prompts, j, p)
            for j, ps in enumerate(stale_keys(case, {"explain": engine}))
            if j < len(prompts)
            for p in ps
            if p <= len(prompts[j])
        }
        return [[]], [sorted(stale)], "stale", ""
    first = finding.get("first_divergence")
    if type(first) is not int or first < 0 or case.geometry is None:
        return None, None, "", "not measured: no diverging request on a resolved geometry"
    promise = _promise_explain(case, finding)
    if promise is None:
        return None, None, "", "not measured: the reference model does not predict this case's states"
    needed, held = set(), set()
    for j in range(min(first, len(engine), len(prompts))):
        mine = _engine_held(engine[j])
        if mine is None:
            return None, None, "", "not measured: the engine did not report the Mamba states it holds"
        theirs = held_states(promise[j]) if j < len(promise) and isinstance(promise[j], dict) else None
        if theirs is None:
            return None, None, "", "not measured: the reference model does not predict this case's states"
        needed |= {_state_key(prompts, j, p) for p in theirs if 0 < p <= len(prompts[j])}
        held |= {_state_key(prompts, j, p) for p in mine if 0 < p <= len(prompts[j])}
    return [sorted(needed)], [sorted(held)], "before", ""


def _promise_explain(case: Case, finding: dict) -> list | None:
    """The promise's per-request explain for the case (``reference.predict``,
    as the ``promise`` oracle computes it), at the finding's engine version."""
    version = str((finding.get("engine") or {}).get("version") or "") if isinstance(finding.get("engine"), dict) else ""
    try:
        return predict_with_knobs(case, resolve_knobs(case, version or DEFAULT_VERSION), "promise")["explain"]
    except (KvspecError, ValueError, KeyError, TypeError, IndexError):
        return None


def cost_of(finding: dict, *, local_models: bool = True) -> dict:
    """The ``cost`` object (:func:`fuzz.results.cost.finding_cost`) of a finding in
    schema 2's shape (``fuzz.results.findings.upgrade``), recomputed from its fields
    (see the module docstring): an old finding without one gets the same.
    ``local_models=False``: a model that is not shipped with kvspec (a
    folder named by the finding) is not read: tokens only (a shared report
    carries no figures derived from the reader's own files)."""
    rule = BY_NAME.get(str(finding.get("oracle")))
    severity, token_cost = (rule.severity, rule.token_cost) if rule else ("lost reuse", False)
    exp = (finding.get("expected") or {}) if isinstance(finding.get("expected"), dict) else {}
    obs = (finding.get("observed") or {}) if isinstance(finding.get("observed"), dict) else {}
    hits_e = [h for h in exp.get("hits") or [] if type(h) is int]
    hits_o = [h for h in obs.get("hits") or [] if type(h) is int]
    requests = [i for i in finding.get("diverging_requests") or [] if type(i) is int and i >= 0]
    case = finding.get("case") if isinstance(finding.get("case"), dict) else {}
    deployment = case.get("deployment") if isinstance(case.get("deployment"), dict) else None
    facts = (
        ((finding.get("resolution") or {}).get("facts") or {}) if isinstance(finding.get("resolution"), dict) else {}
    )
    facts = facts if isinstance(facts, dict) else {}
    where = placement(
        deployment, facts, read_model=deployment is None or local_models or is_shipped_model(deployment.get("model"))
    )
    page, layers = facts.get("mamba_page_size_bytes"), facts.get("mamba_layers")
    state_bytes = None
    if deployment is not None and type(page) is int:
        if type(layers) is int:
            state_bytes = page * layers
        elif where.dims:
            state_bytes = page * where.dims["mamba_layers"]
    want, held, basis, reason = memory_states(finding, str(finding.get("oracle")))
    return finding_cost(
        severity=severity,
        token_cost=token_cost,
        expected=hits_e,
        observed=hits_o,
        requests=requests,
        placement=where,
        states=(want, held),
        state_bytes=state_bytes,
        memory_basis=basis or "retention",
        memory_reason=reason or "not measured",
    )


#: What ``kvspec advise``'s cost says of memory: its retention table holds it.
WORKLOAD_MEMORY = "per retention setting, in the Retention table (Mamba states kept, bytes per GPU)"


def workload_cost(implemented: list[int], promise: list[int], deployment: dict | None, facts: dict | None) -> dict:
    """The cost of a workload's lost reuse (``kvspec advise``), by the same
    arithmetic as a finding's (:func:`fuzz.results.cost.finding_cost`): every request
    is judged, tokens recomputed where the deployment's rule hits less than
    the promise; the model, tensor parallelism and device read from the
    deployment as :func:`cost_of` reads a finding's. Severity ``lost reuse``
    when a request loses, else ``none``. A server or a hand geometry has no
    model: tokens only."""
    lost = any(p > i for i, p in zip(implemented, promise))
    return finding_cost(
        severity="lost reuse" if lost else "none",
        token_cost=True,
        expected=list(promise),
        observed=list(implemented),
        requests=list(range(len(promise))),
        placement=placement(deployment, facts if isinstance(facts, dict) else {}),
        memory_reason=WORKLOAD_MEMORY,
    )


def severity_rank(cost: dict) -> int:
    """0 for the worst severity (:data:`fuzz.judge.oracle_registry.SEVERITIES`)."""
    return SEVERITIES.index(cost["severity"]) if cost.get("severity") in SEVERITIES else len(SEVERITIES)


def _seconds(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def _size(n: int) -> str:
    """Bytes as B / KiB / MiB / GiB (binary)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):,.1f} {unit}"
    return f"{n} B"


def _bytes(mem: dict, key: str) -> str:
    return f" ({_size(mem[key])} per GPU)" if mem.get(key) else ""


def memory_text(mem) -> str:
    """The memory figure in one phrase (its basis: ``fuzz.results.cost``, "Memory")."""
    if not isinstance(mem, dict):
        return str(mem)
    size = "" if mem.get("state_bytes") else "; one state's bytes not resolved"
    if mem.get("basis") == "stale":
        return f"{mem['extra_states']} Mamba state(s) held that no prefill wrote{_bytes(mem, 'extra_bytes')}{size}"
    if mem.get("basis") == "before":
        return (
            f"before the first divergence the engine held {mem.get('kept_states', 0)} Mamba state(s) where the promise keeps {mem.get('promise_states', 0)}: "
            f"{mem['missing_states']} the promise keeps not held{_bytes(mem, 'missing_bytes')}, {mem['extra_states']} held beyond it{_bytes(mem, 'extra_bytes')}{size}"
        )
    return f"{mem['extra_states']} Mamba state(s) kept beyond what the promise needs{_bytes(mem, 'extra_bytes')}, {mem['missing_states']} it needs dropped{size}"


def short(cost: dict) -> str:
    """One cell, every column: severity, tokens, seconds on an H100 (and on
    the deployment's GPU when another), memory:
    ``lost reuse: 1,360 token(s) recomputed, 22.8 ms on h100 (TP 1); memory: ...``."""
    text = cost["severity"]
    if cost.get("tokens_total") is not None:
        text += f": {cost['tokens_total']:,} token(s) recomputed"
        secs = cost.get("prefill_seconds")
        if secs and cost["tokens_total"]:
            text += f", {_seconds(secs['h100'])} on h100"
            gpu = cost.get("device")
            if gpu in secs and gpu != "h100":
                text += f", {_seconds(secs[gpu])} on {gpu}"
            text += f" (TP {cost['tensor_parallel']})"
        elif cost.get("note") and cost["tokens_total"]:
            text += " (no model: tokens only)"
    else:
        text += ": no token cost"
    mem = cost.get("memory")
    return text + "; memory: " + (memory_text(mem) if mem is not None else "not measured")


def impact_lines(cost: dict) -> list[str]:
    """ISSUE.md's "Impact" section (markdown lines, numbers only: every
    text is kvspec's own)."""
    lines = ["## Impact", "", f"Severity: **{cost['severity']}**."]
    if cost.get("tokens_total") is None:
        lines.append(
            "No token cost: this oracle compares no hit counts (the hits agree, or the engine raised, or only its settings are judged)."
        )
    else:
        per = (
            ", ".join(
                f"request {r['request']}: {r['tokens']:,} (hit {r['from']:,} of {r['to']:,})"
                for r in cost["tokens_per_request"]
            )
            or "none"
        )
        lines.append(f"Prefill tokens recomputed: {cost['tokens_total']:,} over the trace ({per}).")
        secs = cost.get("prefill_seconds")
        if secs and cost["tokens_total"]:
            d = cost["model_dims"]
            lines += [
                "",
                f"Prefill time lost per occurrence, model `{cost['model']}` (about {d['active_params'] / 1e9:.2f} B active non-embedding parameters, "
                f"{d['attention_layers']} full-attention layers of width {d['attention_width']}), tensor parallelism {cost['tensor_parallel']}: "
                f"{cost['flops'] / 1e12:,.2f} TFLOP.",
                "",
                "| GPU | dense BF16 peak | prefill time lost |",
                "|---|---|---|",
            ]
            lines += [f"| {GPUS[g][0]} | {GPUS[g][1] / 1e12:,.0f} TFLOPS | {_seconds(s)} |" for g, s in secs.items()]
            lines += [
                "",
                f"Assumptions: FLOPs = 2 x active non-embedding parameters per token plus 4 x layers x width x context for full attention "
                f"(embeddings, LM head, norms, convolutions, the recurrence and the draft model not counted); {UTILISATION:.0%} of the dense BF16 peak; "
                "perfect scaling over tensor parallelism. The loss recurs every time the request pattern recurs (kvspec's `fuzz/results/cost.py`).",
            ]
        elif cost["tokens_total"]:
            lines.append("No model (a hand geometry, or a config kvspec cannot read): tokens only.")
    mem = cost.get("memory")
    text = memory_text(mem) if mem is not None else "not measured"
    lines.append(f"Memory: {text[0].upper() + text[1:]}." if isinstance(mem, dict) else f"Memory: {text}.")
    if isinstance(mem, dict) and mem.get("state_bytes"):
        lines.append(
            f"One Mamba state: {mem['state_bytes']:,} bytes per GPU (the resolution's Mamba page x Mamba layers; kvspec's `fuzz/results/cost.py`)."
        )
    return lines + [""]
