"""Speculative methods other than MTP, as vLLM 0.33.0 resolves and runs them
for the shipped models (issue 27, item 2).

- ``ngram`` (prompt lookup): vLLM builds it for every shipped model with no
  drafter model (``SpeculativeConfig.__post_init__`` sets its model to
  ``"ngram"`` and its ``draft_model_config`` to the target's); no drafter
  KV (``uses_draft_kv_cache`` False: kvspec registers no draft layer), so no
  EAGLE block drop (``needs_eagle_block_drop`` False) and no lookahead
  hashes, whatever ``disable_eagle_block_drop`` and
  ``disable_lookahead_block_hashes`` say; its drafts still widen each
  decode step and size the Mamba groups' speculative blocks;
- ``eagle`` and ``eagle3`` need a drafter ``model``, which no deployment
  may name; kvspec supplies its own one-layer EAGLE head sized to the
  target (``served.drafter_config``; without one vLLM refuses: "without
  speculative model"). Its KV layer joins the attention group: the EAGLE
  block drop, or one lookahead-hash token (the drop's replacement in
  0.33.0), or neither with ``disable_eagle_block_drop``, as single-module
  MTP. EAGLE-3 needs a target class with ``SupportsEagle3`` (vLLM's worker
  refuses the others when it loads the model);
- ``draft_model``, ``dflash`` and ``suffix`` are refused before vLLM (the
  allow-list: they need a model by name, or Arctic Inference).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fuzz.judge.oracle_resolution import resolved
from ground.errors import DeploymentRejected, InvalidArgument, Unsupported
from reference.case import parse_case
from reference.knobs import resolve_knobs
from reference.predict import predict

pytestmark = pytest.mark.engine

MODELS = ("qwen3_next", "qwen3_5", "nemotron_h", "falcon_h1", "granitemoehybrid", "jamba", "mamba2", "falcon_mamba")


def _case(model: str, config: dict, *flags: str, trace=None) -> dict:
    args = ["--enable-prefix-caching", "--speculative-config", json.dumps(config), *flags]
    trace = trace or [
        {"prompt": [{"segment": "A", "length": 2000}], "max_tokens": 4},
        {"prompt": [{"segment": "A", "length": 2000}], "max_tokens": 4},
        {"prompt": [{"segment": "A", "length": 2500}], "max_tokens": 2},
    ]
    return {
        "schema": 1,
        "deployment": {"model": model, "vllm_args": args, "platform": "cuda", "device": "h100"},
        "trace": trace,
    }


@pytest.mark.parametrize("model", MODELS)
def test_ngram_resolves_on_every_shipped_model_with_no_drafter_kv(engine_033, model):
    r = engine_033.resolve(parse_case(_case(model, {"method": "ngram", "num_speculative_tokens": 2})))
    assert r["speculative"] == {"method": "ngram", "num_speculative_tokens": 2}
    assert r["facts"]["num_hash_lookahead_tokens"] == 0
    assert r["facts"]["draft_attention_layers"] == 0


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"disable_eagle_block_drop": True},
        {"disable_lookahead_block_hashes": True},
        {"disable_eagle_block_drop": True, "disable_lookahead_block_hashes": True, "prompt_lookup_max": 3},
    ],
)
def test_an_ngram_case_runs_and_agrees_with_the_reference_drop_options_on_and_off(engine_033, options):
    """The drop options change nothing for ngram: no drop, no lookahead, the
    hits of the reference (the resend hits, the longer prompt hits too)."""
    raw = _case("qwen3_next", {"method": "ngram", "num_speculative_tokens": 2, **options})
    observed = engine_033.run(parse_case(raw))
    judged = resolved(parse_case(raw), observed, "0.33.0")
    reference = predict(judged, "vllm==0.33.0", "replay")
    assert observed["hits"] == reference["hits"], (observed["hits"], reference["hits"])
    assert observed["hits"][1] > 0 and observed["hits"][2] >= observed["hits"][1]


@pytest.mark.parametrize(
    ("config", "kept"),
    [
        ({"method": "ngram", "num_speculative_tokens": 1}, False),
        ({"method": "eagle", "num_speculative_tokens": 1, "disable_eagle_block_drop": True}, False),
        ({"method": "eagle", "num_speculative_tokens": 1}, True),
    ],
)
def test_the_shared_prefix_checkpoint_acts_only_with_an_eagle_group(engine_033, config, kept):
    """``--enable-mamba-shared-prefix-checkpoint`` acts only with an EAGLE
    group (a drafter's KV layer, flagged under the block drop or lookahead
    hashes): ngram has none, and an EAGLE drafter with the drop disabled is
    not flagged; the reference's knob says the same, and the hits agree."""
    raw = _case(
        "qwen3_next",
        config,
        "--prefix-match-unit",
        "64",
        "--enable-mamba-shared-prefix-checkpoint",
        trace=[
            {"prompt": [{"segment": "A", "length": 1500}]},
            {"prompt": [{"segment": "A", "length": 896}, {"segment": "B", "length": 300}]},
            {"prompt": [{"segment": "A", "length": 896}, {"segment": "C", "length": 400}]},
        ],
    )
    observed = engine_033.run(parse_case(raw))
    judged = resolved(parse_case(raw), observed, "0.33.0")
    assert judged.geometry.shared_prefix_checkpoint and judged.geometry.hash_block_size == 64
    assert bool(observed["knobs"]["eagle_group_ids"]) is kept
    assert resolve_knobs(judged, "0.33.0").shared_prefix_checkpoint is kept
    assert observed["hits"] == predict(judged, "vllm==0.33.0", "replay")["hits"]


def test_an_eagle_deployment_gets_kvspecs_drafter_and_nothing_else_changes(tmp_path, monkeypatch):
    """The drafter is written under kvspec's home, sized to the target; the
    flag keeps its spelling; other methods pass as they are."""
    from engine_adapter.models import load_config
    from engine_adapter.models.served import drafter_config, model_dir
    from engine_adapter.vllm_engine.resolve import with_drafter

    monkeypatch.setenv("KVSPEC_HOME", str(tmp_path))
    target = model_dir(load_config("nemotron_h"))
    out = with_drafter(
        [
            "--enable-prefix-caching",
            "--speculative_config=" + json.dumps({"method": "eagle3", "num_speculative_tokens": 2}),
        ],
        target,
    )
    flag, value = out[1].split("=", 1)
    doc = json.loads(value)
    assert flag == "--speculative_config" and doc["method"] == "eagle3" and doc["model"].startswith(str(tmp_path))
    written = json.loads((Path(doc["model"]) / "config.json").read_text())
    cfg = load_config("nemotron_h")
    assert (
        written == drafter_config(cfg)
        and written["hidden_size"] == cfg["hidden_size"]
        and written["vocab_size"] == cfg["vocab_size"]
    )
    for config in ({"method": "ngram", "num_speculative_tokens": 1}, {"method": "mtp", "num_speculative_tokens": 1}):
        args = ["--speculative-config", json.dumps(config)]
        assert with_drafter(args, target) == args


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@pytest.mark.parametrize(
    ("options", "drop", "lookahead"),
    [
        ({}, False, 1),
        ({"disable_lookahead_block_hashes": True}, True, 0),
        ({"disable_eagle_block_drop": True}, False, 0),
    ],
)
@pytest.mark.parametrize("model", ["qwen3_next", "nemotron_h"])
def test_eagle_with_kvspecs_drafter_resolves_runs_and_agrees(engine_033, method, options, drop, lookahead, model):
    raw = _case(
        model,
        {"method": method, "num_speculative_tokens": 2, **options},
        trace=[
            {"prompt": [{"segment": "A", "length": 1152}], "max_tokens": 4},
            {"prompt": [{"segment": "A", "length": 1152}], "max_tokens": 2},
            {"prompt": [{"segment": "A", "length": 1300}]},
            {"prompt": [{"segment": "A", "length": 700}, {"segment": "B", "length": 100}]},
        ],
    )
    r = engine_033.resolve(parse_case(raw))
    assert r["speculative"]["method"] == method and r["facts"]["draft_attention_layers"] == 1
    assert r["facts"]["num_hash_lookahead_tokens"] == lookahead
    observed = engine_033.run(parse_case(raw))
    # the drafter's group is flagged unless the drop is disabled (vLLM flags it only under use_eagle_block_drop)
    assert observed["knobs"]["eagle_drop"] is drop and bool(observed["knobs"]["eagle_group_ids"]) is (
        drop or lookahead > 0
    )
    judged = resolved(parse_case(raw), observed, "0.33.0")
    assert observed["hits"] == predict(judged, "vllm==0.33.0", "replay")["hits"]


@pytest.mark.parametrize("model", ["falcon_h1", "granitemoehybrid", "jamba"])
def test_eagle3_on_a_target_without_its_interface_is_vllms_refusal(engine_033, model):
    with pytest.raises(DeploymentRejected, match="does not support EAGLE3 interface"):
        engine_033.resolve(parse_case(_case(model, {"method": "eagle3", "num_speculative_tokens": 2})))


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@pytest.mark.parametrize("model", ["mamba2", "falcon_mamba"])
def test_an_eagle_drafter_on_an_attention_free_model_is_unsupported_not_a_crash(engine_033, method, model):
    """kvspec's draft stand-in takes the target's attention shape, which an
    attention-free model has not (vLLM's grouping divided by its zero page
    size: a campaign's engine_error that was kvspec's, not vLLM's)."""
    with pytest.raises(Unsupported, match="attention-free"):
        engine_033.resolve(
            parse_case(
                _case(model, {"method": method, "num_speculative_tokens": 1, "disable_lookahead_block_hashes": True})
            )
        )


@pytest.mark.parametrize("method", ["draft_model", "dflash", "suffix", "ngram_gpu", "custom_class"])
def test_a_method_needing_a_model_or_a_package_is_refused_before_vllm(method):
    with pytest.raises(InvalidArgument, match="method"):
        parse_case(_case("qwen3_next", {"method": method, "num_speculative_tokens": 2}))


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_ngram_under_either_scheduling_policy_reaches_vllm(engine_033, policy):
    raw = _case("nemotron_h", {"method": "ngram", "num_speculative_tokens": 3}, "--scheduling-policy", policy)
    res = engine_033.resolve(parse_case(raw))
    assert res["facts"]["scheduling_policy"] == policy
    observed = engine_033.run(parse_case(raw))
    assert observed["hits"] == predict(resolved(parse_case(raw), observed, "0.33.0"), "vllm==0.33.0", "replay")["hits"]
