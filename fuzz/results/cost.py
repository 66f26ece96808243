"""What a finding costs a user: arithmetic only (no file, no engine).

Users ask what a bug costs before whether it is one (vLLM #53670: "1,648-token
recompute per hit, 30-40% batch throughput loss"; #45238: a 20K prompt
prefilled twice before it hits). :func:`finding_cost` answers from a
finding's own numbers; :mod:`fuzz.results.impact` feeds it (the model config, the
tensor parallelism) and shows it.

**Severity** (``fuzz.judge.oracle_registry``: one per oracle), worst first:
``wrong output possible`` (``stale``: a state resumed that no prefill wrote;
``cap``, ``keys``, ``resumed_state``: a target model's KV or state reused
past the last prompt token, over other tokens, or holding other tokens;
``block_table``: a running request's table holds a freed block another
request may rewrite), ``crash`` (``engine_error``), ``draft acceptance``
(``draft_keys``: only a drafter's KV reused over another next token; the
target verifies every draft, so the output is right and fewer drafts are
accepted), ``lost reuse`` (the hit
oracles, and ``reference``, ``knobs``, ``resolution``: fewer hits than must
hold), ``memory only`` (``retention``, ``split``, ``checkpoint``,
``hit_blocks``, ``shared_prefix``: the hits right, what the cache holds or
how it schedules wrong).

**Tokens recomputed.** Only oracles that compare hit counts have a token
cost (``token_cost`` in the registry: ``promise``, ``reference``,
``sparse_dense``, ``spec_on_off``, ``versions``, ``junction``). For each
request the judge names (``diverging_requests``)::

    recomputed[i] = max(0, expected[i] - observed[i])     # the engine hit less
    total         = sum(recomputed[i])                    # the whole trace

A request that hit *more* than expected costs no prefill (whether it was
safe is the safety oracles' question: ``stale``, ``cap``, ``keys``,
``draft_keys``, ``resumed_state``). The other oracles have no
token cost: their hits agree (``stale``, the ``memory only`` ones), no hit
is compared (``knobs``, ``resolution``), or vLLM raised (``engine_error``).

**Prefill FLOPs** of recomputing positions ``[o, e)`` of one request, from
the model config (:func:`model_dims`)::

    F = 2 * P * (e - o)  +  4 * A * W * sum_{p=o}^{e-1} (p + 1)

* ``P``: the parameters one token multiplies through (non-embedding, *active*:
  a MoE layer counts ``experts_per_tok`` routed experts plus its shared
  expert and router), 2 FLOPs per multiply-add (Kaplan et al. 2020,
  "Scaling Laws for Neural Language Models", Table 1: C_forward ~ 2N).
  Counted: attention projections (q, k, v, o; q doubled for the Qwen3-Next /
  Qwen3.5 output gate), Gated DeltaNet and Mamba-1/2 in/out projections, the
  MLP (3 matrices gated, 2 for ``relu2``) or the active MoE. Not counted:
  embeddings and the LM head (a prefill takes logits at its last position
  only), norms, convolutions, biases, the recurrence's own state update
  (O(state) per token), the draft (MTP/EAGLE) model.
* ``A * W``: full-attention layers times their query width (heads x
  head_dim); a token at position ``p`` attends to ``p + 1`` keys, 2 FLOPs
  per multiply-add for ``QK^T`` and again for ``softmax @ V`` (Hoffmann et
  al. 2022, "Training Compute-Optimal LLMs", Appendix F).

**Prefill time** on a GPU::

    seconds = F / (TP * peak_bf16_dense * U)

with ``TP`` the deployment's tensor parallelism (perfect scaling assumed;
1 for a hand geometry), ``U`` = :data:`UTILISATION` = 40% of the dense BF16
peak (a typical prefill model-FLOPs utilisation; an assumption, not a
measurement), and the peaks of :data:`GPUS` (vendor datasheets, dense, i.e.
without 2:4 sparsity):

=====  ============================  ======================  ==========================================
GPU    part                          dense BF16 TFLOPS       source
=====  ============================  ======================  ==========================================
h100   H100 SXM5                     989                     NVIDIA H100 datasheet (1,979 with sparsity)
h200   H200 SXM                      989                     NVIDIA H200 datasheet (same Hopper die)
a100   A100 SXM4                     312                     NVIDIA A100 datasheet (624 with sparsity)
b200   B200 (HGX B200)               2,250                   NVIDIA HGX B200 datasheet: 36 PFLOPS FP16/BF16
                                                             sparse for 8 GPUs = 2.25 PFLOPS dense each
=====  ============================  ======================  ==========================================

A hand geometry has no model: its cost is tokens only.

**Memory** (:func:`memory`): Mamba states, compared as two sets, on one of
three bases (``basis``), chosen from what the finding carries
(:mod:`fuzz.results.impact`):

* ``retention``: the states each request leaves held (``observed.states``)
  against those the promise allows (``expected.states``), summed over
  requests;
* ``before``: for the oracles that compare hits, the distinct states the
  engine held on the prompts of the requests before the first divergence
  (its explain: ``retained_mamba_tokens`` / ``retained_mamba_blocks``,
  SGLang's ``tracked``) against those the promise's reference model keeps
  for the same requests (``reference.predict``): what the cache held when the
  request that lost reuse arrived. A state is a prompt position and the
  tokens before it (two requests' states at p are one state when their
  prompts share p tokens);
* ``stale``: the states held that no prefill wrote (``fuzz.judge.oracle_states.
  stale_keys``): bytes of the cache holding another prefix's state.

::

    extra   = |observed - expected|       # held beyond what the promise keeps
    missing = |expected - observed|       # the promise keeps, the engine did not
    bytes   = states x mamba_page_size_bytes x Mamba layers   (per GPU)

One state's bytes per GPU are ``mamba_page_size_bytes`` (vLLM's MambaSpec
page, already one tensor-parallel rank's shard) times the Mamba layers, from
the resolution's facts; where the resolution has no page size (SGLang's) the
counts stand without bytes. Where the finding carries no states (no engine
explain, a crash, a setting judged without a run) memory is a sentence
saying why it is not measured.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Dense BF16 tensor-core peak per GPU (FLOPS) and where the number is from.
GPUS: dict[str, tuple[str, float, str]] = {
    "h100": ("H100 SXM5", 989e12, "NVIDIA H100 datasheet, 1,979 TFLOPS with sparsity"),
    "h200": ("H200 SXM", 989e12, "NVIDIA H200 datasheet, same Hopper compute as H100 SXM"),
    "a100": ("A100 SXM4", 312e12, "NVIDIA A100 datasheet, 624 TFLOPS with sparsity"),
    "b200": ("B200", 2250e12, "NVIDIA HGX B200 datasheet, 36 PFLOPS sparse FP16/BF16 for 8 GPUs"),
}
#: The GPUs every cost names (the deployment's own device is added).
SHOWN_GPUS = ("h100", "a100", "b200")
#: Model-FLOPs utilisation assumed for prefill (fraction of the dense peak).
UTILISATION = 0.40
#: The version of the ``cost`` object's shape in a finding.
COST_SCHEMA = 1

_ATTENTION = ("full_attention", "attention", "attn")
_MAMBA1 = ("JambaForCausalLM", "FalconMambaForCausalLM", "MambaForCausalLM")
_MAMBA_ONLY = ("Mamba2ForCausalLM", "FalconMambaForCausalLM", "MambaForCausalLM")
_GATED_Q = ("Qwen3NextForCausalLM", "Qwen3_5ForCausalLM")


def _get(cfg: dict, *keys, default=None):
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def layer_plan(cfg: dict) -> list[tuple[bool, bool, str]]:
    """Per decoder layer: (has full attention, has a Mamba/linear mixer, its
    FFN: ``dense``, ``moe`` or ``none``), read the way each shipped
    architecture lays its layers out."""
    arch = (cfg.get("architectures") or [""])[0]
    n = int(_get(cfg, "num_hidden_layers", "num_layers", "n_layer", default=0) or 0)
    experts = _get(cfg, "num_experts", "num_local_experts", "n_routed_experts")
    ffn = "moe" if experts else ("dense" if cfg.get("intermediate_size") else "none")
    if isinstance(cfg.get("layers_block_type"), list):  # Nemotron-H: one block kind per layer
        out = []
        for t in cfg["layers_block_type"]:
            out.append(
                (
                    t in _ATTENTION,
                    t in ("mamba", "linear_attention"),
                    "moe" if t == "moe" else "dense" if t == "mlp" else "none",
                )
            )
        return out
    if isinstance(cfg.get("hybrid_override_pattern"), str):
        kinds = {
            "*": (True, False, "none"),
            "M": (False, True, "none"),
            "-": (False, False, "dense"),
            "E": (False, False, "moe"),
        }
        return [kinds.get(c, (False, False, "none")) for c in cfg["hybrid_override_pattern"]]
    if isinstance(cfg.get("layer_types"), list):
        skip = set(cfg.get("mlp_only_layers") or [])
        return [
            (t in _ATTENTION, t not in _ATTENTION, "dense" if i in skip and ffn == "moe" else ffn)
            for i, t in enumerate(cfg["layer_types"])
        ]
    if arch in _MAMBA_ONLY:
        return [(False, True, "none")] * n
    if arch.startswith("FalconH1"):  # attention and Mamba-2 side by side in every layer
        return [(True, True, "dense")] * n
    if cfg.get("attn_layer_period"):  # Jamba
        period, offset = int(cfg["attn_layer_period"]), int(cfg.get("attn_layer_offset") or 0)
        eperiod, eoffset = int(cfg.get("expert_layer_period") or 1), int(cfg.get("expert_layer_offset") or 0)
        return [
            (i % period == offset, i % period != offset, "moe" if experts and i % eperiod == eoffset else "dense")
            for i in range(n)
        ]
    attn = set(cfg.get("attn_layer_indices") or [])  # Bamba: None is Mamba everywhere
    return [(i in attn, i not in attn, ffn) for i in range(n)]


def attention_params(cfg: dict) -> tuple[int, int]:
    """(parameters of one attention layer's projections, its query width)."""
    h = int(cfg["hidden_size"])
    nq = int(_get(cfg, "num_attention_heads", default=1))
    nkv = int(_get(cfg, "num_key_value_heads", default=nq))
    d = int(_get(cfg, "head_dim", default=h // nq))
    q = nq * d * (2 if (cfg.get("architectures") or [""])[0] in _GATED_Q else 1)
    return h * q + 2 * h * nkv * d + nq * d * h, nq * d


def mixer_params(cfg: dict) -> int:
    """Parameters of one Gated DeltaNet or Mamba-1/2 mixer's projections."""
    h = int(cfg["hidden_size"])
    if cfg.get("linear_num_value_heads"):  # Gated DeltaNet (Qwen3-Next, Qwen3.5)
        nk, dk = int(cfg["linear_num_key_heads"]), int(cfg["linear_key_head_dim"])
        nv, dv = int(cfg["linear_num_value_heads"]), int(cfg["linear_value_head_dim"])
        return h * (2 * nk * dk + 2 * nv * dv) + h * 2 * nv + nv * dv * h
    state = int(_get(cfg, "mamba_d_state", "ssm_state_size", "state_size", default=16))
    expand = int(_get(cfg, "mamba_expand", "expand", default=2))
    heads = _get(cfg, "mamba_n_heads", "mamba_num_heads", "num_heads")
    arch = (cfg.get("architectures") or [""])[0]
    if heads and arch not in _MAMBA1:  # Mamba-2
        hd = int(_get(cfg, "mamba_d_head", "mamba_head_dim", "head_dim", default=64))
        inner = int(_get(cfg, "mamba_d_ssm", default=int(heads) * hd))
        groups = int(_get(cfg, "mamba_n_groups", "n_groups", default=1))
        return h * (2 * inner + 2 * groups * state + int(heads)) + inner * h
    inner = expand * h  # Mamba-1 (Jamba, Falcon-Mamba)
    rank = int(_get(cfg, "mamba_dt_rank", "time_step_rank", default=-(-h // 16)))
    return h * 2 * inner + inner * (rank + 2 * state) + rank * inner + inner * h


def ffn_params(cfg: dict, kind: str) -> int:
    """Active parameters of one layer's FFN (``dense``, ``moe``, ``none``)."""
    if kind == "none":
        return 0
    h = int(cfg["hidden_size"])
    mats = 2 if str(_get(cfg, "mlp_hidden_act", "hidden_act", default="")) == "relu2" else 3
    if kind == "dense":
        return mats * h * int(cfg["intermediate_size"])
    experts = int(_get(cfg, "num_experts", "num_local_experts", "n_routed_experts"))
    per = int(_get(cfg, "moe_intermediate_size", "intermediate_size"))
    shared = int(
        _get(
            cfg,
            "shared_expert_intermediate_size",
            "moe_shared_expert_intermediate_size",
            "shared_intermediate_size",
            default=0,
        )
    )
    shared *= int(cfg.get("n_shared_experts") or 1)
    return int(cfg.get("num_experts_per_tok") or 1) * mats * h * per + mats * h * shared + h * experts


def model_dims(cfg: dict) -> dict:
    """The model's per-token numbers: ``active_params`` (P), ``attention_layers``
    (A), ``attention_width`` (W), ``mamba_layers``. A ``text_config`` is read
    in place of the top level when there is one."""
    cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    plan = layer_plan(cfg)
    attn, width = attention_params(cfg) if any(a for a, _, _ in plan) else (0, 0)
    mixer = mixer_params(cfg) if any(m for _, m, _ in plan) else 0
    params = sum((attn if a else 0) + (mixer if m else 0) + ffn_params(cfg, f) for a, m, f in plan)
    return {
        "active_params": params,
        "attention_layers": sum(a for a, _, _ in plan),
        "attention_width": width,
        "mamba_layers": sum(m for _, m, _ in plan),
    }


def recompute_flops(dims: dict, start: int, end: int) -> float:
    """F for positions ``[start, end)`` of one request (module docstring)."""
    if end <= start:
        return 0.0
    keys = (end * (end + 1) - start * (start + 1)) // 2
    return 2.0 * dims["active_params"] * (end - start) + 4.0 * dims["attention_layers"] * dims["attention_width"] * keys


def seconds(flops: float, gpu: str, tp: int = 1, utilisation: float = UTILISATION) -> float:
    """``flops / (tp * peak * utilisation)`` on ``gpu`` (a key of :data:`GPUS`)."""
    return flops / (max(tp, 1) * GPUS[gpu][1] * utilisation)


def recomputed(expected: list, observed: list, requests: list[int]) -> list[dict]:
    """Per request the judge names: the tokens the engine prefilled again
    because it hit less than expected (requests that hit as much or more
    are left out)."""
    out = []
    for i in requests:
        if i < len(expected) and i < len(observed) and expected[i] > observed[i]:
            out.append({"request": i, "tokens": expected[i] - observed[i], "from": observed[i], "to": expected[i]})
    return out


#: What each memory basis compares (module docstring).
MEMORY_BASES = ("retention", "before", "stale")


def memory(
    expected_states: list | None,
    observed_states: list | None,
    state_bytes: int | None,
    basis: str = "retention",
    reason: str = "not measured",
) -> dict | str:
    """Mamba states held beyond / short of what the promise keeps, summed
    over the lists' entries (a request each, or one set), with bytes per
    GPU where one state's size is known; ``reason`` where the finding
    carries no states. ``basis``: :data:`MEMORY_BASES`."""
    if not isinstance(expected_states, list) or not isinstance(observed_states, list):
        return reason
    extra = missing = kept = needed = 0
    for e, o in zip(expected_states, observed_states):
        e, o = set(e or []), set(o or [])
        extra += len(o - e)
        missing += len(e - o)
        kept += len(o)
        needed += len(e)
    out = {
        "extra_states": extra,
        "missing_states": missing,
        "state_bytes": state_bytes,
        "basis": basis,
        "kept_states": kept,
        "promise_states": needed,
    }
    out["extra_bytes"] = extra * state_bytes if state_bytes else None
    out["missing_bytes"] = missing * state_bytes if state_bytes else None
    return out


@dataclass(frozen=True)
class Placement:
    """Where a deployment runs, as a cost reads it: the model's dimensions
    (:func:`model_dims`; None: tokens only) and name, its tensor
    parallelism, its device, and a note saying why there is no model
    (``fuzz.results.impact.placement`` reads it from a deployment)."""

    dims: dict | None = None
    model: str | None = None
    tp: int = 1
    device: str | None = None
    note: str = ""


def finding_cost(
    *,
    severity: str,
    token_cost: bool,
    expected: list,
    observed: list,
    requests: list[int],
    placement: Placement,
    states: tuple = (None, None),
    state_bytes: int | None = None,
    memory_basis: str = "retention",
    memory_reason: str = "not measured",
) -> dict:
    """The ``cost`` object of a finding (``cost_schema`` 1): severity, tokens
    recomputed per request and in all, the prefill seconds on each GPU of
    :data:`SHOWN_GPUS` (and ``device``) where there is a model, and memory;
    the placement's note, where it has one."""
    dims, model, tp, device = placement.dims, placement.model, placement.tp, placement.device
    per = recomputed(expected, observed, requests) if token_cost else []
    total = sum(r["tokens"] for r in per)
    out = {
        "cost_schema": COST_SCHEMA,
        "severity": severity,
        "token_cost": token_cost,
        "tokens_per_request": per,
        "tokens_total": total if token_cost else None,
        "model": model,
        "tensor_parallel": tp,
        "device": device,
        "utilisation": UTILISATION,
        "flops": None,
        "prefill_seconds": None,
        "memory": memory(states[0], states[1], state_bytes, memory_basis, memory_reason),
    }
    if dims is None:
        out["note"] = placement.note or "no model: tokens only"
        return out
    out["model_dims"] = dims
    if token_cost:
        flops = sum(recompute_flops(dims, r["from"], r["to"]) for r in per)
        gpus = SHOWN_GPUS + ((device,) if device in GPUS and device not in SHOWN_GPUS else ())
        out["flops"] = flops
        out["prefill_seconds"] = {g: seconds(flops, g, tp) for g in gpus}
    if placement.note:
        out["note"] = placement.note
    return out
