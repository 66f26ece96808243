"""What a finding costs (fuzz/results/cost.py, fuzz/results/impact.py): the arithmetic on
hand-computed numbers, a severity for every oracle, tokens only without a
model, and old finding files (no ``cost``) still listed by ``kvspec
findings`` with their cost."""

from __future__ import annotations

import json

import pytest

from fuzz.judge.oracle_registry import BY_NAME, REGISTRY, SEVERITIES
from fuzz.judge.oracles import Divergence
from fuzz.results import findings as F
from fuzz.results.cost import GPUS, UTILISATION, model_dims, recompute_flops, recomputed, seconds
from fuzz.results.impact import cost_of, impact_lines, short
from fuzz.results.report import issue_markdown
from fuzz.results.triage import read_findings, triage
from kvspec.cli import main as kvspec
from tests.conftest import hybrid, make_case

#: A tiny Qwen3-Next-shaped config whose numbers are counted by hand below.
TINY = {
    "architectures": ["TinyHybrid"],
    "hidden_size": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 2,
    "intermediate_size": 8,
    "layer_types": ["linear_attention", "full_attention"],
    "linear_num_key_heads": 1,
    "linear_key_head_dim": 2,
    "linear_num_value_heads": 1,
    "linear_value_head_dim": 2,
}


def test_the_arithmetic_on_a_hand_counted_model():
    # attention: q 4*2*2=16, k+v 2*4*1*2=16, o 2*2*4=16 -> 48, width 2*2=4
    # Gated DeltaNet: qkvz 4*(2*1*2+2*1*2)=32, ba 4*2*1=8, out 1*2*4=8 -> 48
    # MLP (gated, 3 matrices): 3*4*8=96 in each of the 2 layers -> 192
    dims = model_dims(TINY)
    assert dims == {"active_params": 48 + 48 + 192, "attention_layers": 1, "attention_width": 4, "mamba_layers": 1}
    # positions [2, 5): 2*288*3 = 1728 for the weights; 4*1*4*(3+4+5) = 192 for attention
    assert recompute_flops(dims, 2, 5) == 1728 + 192
    assert recompute_flops(dims, 5, 5) == 0
    # 1920 FLOPs on 2 H100s at 40% of 989 TFLOPS
    assert (
        UTILISATION == 0.40 and GPUS["h100"][1] == 989e12 and GPUS["a100"][1] == 312e12 and GPUS["b200"][1] == 2250e12
    )
    assert seconds(1920, "h100", tp=2) == pytest.approx(1920 / (2 * 989e12 * 0.4))


def test_tokens_recomputed_count_only_requests_that_hit_less():
    per = recomputed(
        [0, 1360, 50, 32], [0, 0, 80, 16], [1, 2]
    )  # request 2 hit more; request 3 is not one the judge named
    assert per == [{"request": 1, "tokens": 1360, "from": 0, "to": 1360}]


def test_a_real_model_s_cost_by_hand():
    # Qwen3-Next (shipped defaults): P = 48 x 35,651,584 (MoE: 10 experts x 3 x 2048 x 512 + shared 3 x 2048 x 512 + router 2048 x 512)
    #   + 36 x 33,685,504 (Gated DeltaNet) + 12 x 27,262,976 (gated attention) = 3,251,109,888; 12 attention layers of width 16 x 256
    dims = model_dims(json.loads((F.REPO_ROOT / "engine_adapter" / "models" / "qwen3_next.json").read_text()))
    assert dims == {"active_params": 3_251_109_888, "attention_layers": 12, "attention_width": 4096, "mamba_layers": 36}
    # 1360 tokens from 0: 2 x 3,251,109,888 x 1360 + 4 x 12 x 4096 x (1360 x 1361 / 2) = 8,843,018,895,360 + 181,956,771,840 = 9,024,975,667,200 FLOPs
    assert recompute_flops(dims, 0, 1360) == 9_024_975_667_200
    assert seconds(9_024_975_667_200, "h100") == pytest.approx(0.022813, rel=1e-4)  # 22.8 ms on one H100


def test_every_registered_oracle_has_a_severity_and_the_mapping_is_the_documented_one():
    assert SEVERITIES == ("wrong output possible", "crash", "draft acceptance", "lost reuse", "memory only")
    assert all(o.severity in SEVERITIES for o in REGISTRY)
    assert BY_NAME["stale"].severity == "wrong output possible" and BY_NAME["engine_error"].severity == "crash"
    assert (
        BY_NAME["cap"].severity == BY_NAME["keys"].severity == "wrong output possible"
        and BY_NAME["draft_keys"].severity == "draft acceptance"
    )
    # unsafe reuse ranks above every lost-reuse class, a drafter's KV below a crash
    assert (
        SEVERITIES.index("wrong output possible")
        < SEVERITIES.index("draft acceptance")
        < SEVERITIES.index("lost reuse")
    )
    assert {o.name for o in REGISTRY if o.severity == "lost reuse"} == {
        "promise",
        "reference",
        "sparse_dense",
        "spec_on_off",
        "versions",
        "junction",
        "knobs",
        "resolution",
    }
    assert {o.name for o in REGISTRY if o.severity == "memory only"} == {
        "retention",
        "split",
        "checkpoint",
        "hit_blocks",
        "shared_prefix",
    }
    assert {o.name for o in REGISTRY if o.token_cost} == {
        "promise",
        "reference",
        "sparse_dense",
        "spec_on_off",
        "versions",
        "junction",
    }
    assert not any(o.token_cost and (o.same_hits or o.severity != "lost reuse") for o in REGISTRY)


def _finding(oracle="promise", expected=(0, 32), observed=(0, 16), context=None):
    case = make_case(hybrid(16, 16), [[("A", 48)]] * 2)
    div = Divergence(oracle, "0.29.0", [1], list(expected), list(observed), "", context or {})
    return F.make_finding(case, div, {"hits": list(observed), "queries": [], "knobs": {}, "explain": []})


def test_a_hand_geometry_costs_tokens_only():
    cost = _finding()["cost"]
    assert (
        cost["severity"] == "lost reuse"
        and cost["tokens_total"] == 16
        and cost["tokens_per_request"][0]["tokens"] == 16
    )
    assert cost["note"] == "no model: tokens only" and cost["prefill_seconds"] is None and cost["flops"] is None
    no_record = (
        "not measured: the finding carries no per-request engine record (a crash, or a setting judged without a run)"
    )
    assert cost["memory"] == no_record
    assert short(cost) == f"lost reuse: 16 token(s) recomputed (no model: tokens only); memory: {no_record}"
    assert "No model (a hand geometry, or a config kvspec cannot read): tokens only." in impact_lines(cost)


def test_a_deployment_costs_time_on_each_gpu_divided_by_tensor_parallelism():
    finding = _finding(expected=(0, 1360), observed=(0, 0))
    finding["case"]["deployment"] = {
        "model": "qwen3_next",
        "vllm_args": ["--tensor-parallel-size", "2"],
        "device": "a100",
    }
    cost = cost_of(finding)
    assert cost["model"] == "qwen3_next" and cost["tensor_parallel"] == 2 and cost["flops"] == 9_024_975_667_200
    assert set(cost["prefill_seconds"]) == {"h100", "a100", "b200"}
    assert cost["prefill_seconds"]["a100"] == pytest.approx(9_024_975_667_200 / (2 * 312e12 * 0.4))
    assert ", 11.4 ms on h100, 36.2 ms on a100 (TP 2); memory: " in short(
        cost
    )  # seconds on an H100 always, the deployment's GPU beside it


def test_oracles_without_a_token_cost_and_memory_where_states_are_carried():
    stale = cost_of(_finding("stale", (0, 16), (0, 16)))
    assert (
        stale["severity"] == "wrong output possible"
        and stale["tokens_total"] is None
        and short(stale).startswith("wrong output possible: no token cost; memory: not measured")
    )
    cost = _finding(
        "retention", (0, 16), (0, 16), {"expected_states": [[16], [32]], "observed_states": [[16, 32], []]}
    )["cost"]
    assert cost["severity"] == "memory only" and cost["memory"] == {
        "extra_states": 1,
        "missing_states": 1,
        "state_bytes": None,
        "extra_bytes": None,
        "missing_bytes": None,
        "basis": "retention",
        "kept_states": 2,
        "promise_states": 2,
    }


def test_the_cost_is_not_part_of_a_finding_s_identity():
    a, b = _finding(), _finding()
    b["cost"] = {"severity": "crash"}
    assert (
        a["signature"]
        == b["signature"]
        == F.signature(F.parse_case(a["case"]), Divergence("promise", "0.29.0", [1], [0, 32], [0, 16], ""), {})
    )


def test_old_finding_files_without_a_cost_still_list_with_their_cost(tmp_path, capsys):
    old = _finding()
    del old["cost"]
    (tmp_path / "promise-old.json").write_text(json.dumps(old))
    crash = _finding("engine_error", (), ())
    del crash["cost"]
    crash["observed"]["error"] = {"type": "ValueError", "message": "boom"}
    (tmp_path / "engine_error-old.json").write_text(json.dumps(crash))
    described, malformed = read_findings(tmp_path)
    assert malformed == [] and [c["severity"] for c in triage(described)] == ["crash", "lost reuse"]
    assert kvspec(["findings", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"2 finding(s) in 2 class(es) in {tmp_path}"
    assert (
        lines[1].startswith("  1. engine_error |")
        and "| crash: no token cost; memory: not measured: the finding carries no per-request engine record" in lines[1]
    )
    assert "| lost reuse: 16 token(s) recomputed (no model: tokens only); memory: not measured: " in lines[4] and lines[
        4
    ].endswith("  (1 file(s))")


def test_the_report_has_an_impact_section():
    text = issue_markdown(_finding())
    assert (
        "## Impact" in text
        and "Severity: **lost reuse**." in text
        and "Prefill tokens recomputed: 16 over the trace" in text
    )


def test_a_stranger_s_model_path_is_read_only_as_a_run_reads_it(tmp_path):
    """A finding comes from a stranger: its ``deployment.model`` path is read
    only if it is a regular config.json a run would accept; a FIFO (which
    would block a plain open) or a config naming code costs tokens only."""
    import os
    import time

    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    finding = _finding(expected=(0, 1360), observed=(0, 0))
    finding["case"]["deployment"] = {"model": str(fifo), "vllm_args": []}
    t0 = time.monotonic()
    cost = cost_of(finding)
    assert time.monotonic() - t0 < 5
    assert (
        cost["flops"] is None and cost["tokens_total"] == 1360 and cost["note"].startswith("model config not readable")
    )
    code = tmp_path / "code"
    code.mkdir()
    (code / "config.json").write_text('{"architectures": ["Qwen3NextForCausalLM"], "auto_map": {"AutoConfig": "x.Y"}}')
    finding["case"]["deployment"] = {"model": str(code), "vllm_args": []}
    cost = cost_of(finding)
    assert cost["flops"] is None and cost["note"].startswith("model config not readable")


def test_tensor_parallelism_is_read_as_vllm_s_parser_reads_the_flag():
    from fuzz.results.impact import _tensor_parallel

    assert _tensor_parallel({"vllm_args": ["-tp", "4"]}, {}) == 4
    assert _tensor_parallel({"vllm_args": ["--tensor_parallel_size=8"]}, {}) == 8
    assert _tensor_parallel({"vllm_args": ["--tensor-parallel-size", "2", "-tp=4"]}, {}) == 4  # the last one wins
    assert _tensor_parallel({"vllm_args": ["--enable-prefix-caching"]}, {}) == 1
    assert _tensor_parallel({"vllm_args": ["-tp", "4"]}, {"tensor_parallel_size": 2}) == 2  # the resolution first


def _explained(oracle, engine_explain, expected=(0, 32), observed=(0, 16), facts=None, deployment=None):
    """A finding on a 48-token resend at block 16 whose engine explain is
    ``engine_explain`` (the promise keeps the states after 32 and 48 tokens:
    reference.predict, the N-1 cap floored to the block, and the prompt end)."""
    case = make_case(hybrid(16, 16), [[("A", 48)]] * 2)
    div = Divergence(oracle, "0.29.0", [1], list(expected), list(observed), "", {})
    finding = F.make_finding(
        case,
        div,
        {
            "hits": list(observed),
            "queries": [],
            "knobs": {},
            "explain": engine_explain,
            "resolution": {"facts": facts or {}},
        },
    )
    if deployment:
        finding["case"].update(deployment=deployment, resolved_by="vllm==0.29.0")
    return finding


def test_memory_of_a_hit_finding_is_what_the_engine_held_against_the_promise_before_the_first_divergence():
    held_16 = [
        {"retained_mamba_tokens": {"0": [16], "1": [16]}, "written": [16, 48]},
        {"retained_mamba_tokens": {"0": [16]}, "written": [48]},
    ]
    cost = cost_of(
        _explained(
            "promise",
            held_16,
            facts={"mamba_page_size_bytes": 1000, "mamba_layers": 3},
            deployment={"model": "qwen3_next", "vllm_args": []},
        )
    )
    # before request 1: the engine held {16}; the promise keeps {32, 48}: 2 missing, 1 beyond; one state 3 x 1000 bytes
    assert cost["memory"] == {
        "extra_states": 1,
        "missing_states": 2,
        "state_bytes": 3000,
        "extra_bytes": 3000,
        "missing_bytes": 6000,
        "basis": "before",
        "kept_states": 1,
        "promise_states": 2,
    }
    assert (
        "memory: before the first divergence the engine held 1 Mamba state(s) where the promise keeps 2: 2 the promise keeps not held (5.9 KiB per GPU)"
        in short(cost)
    )
    assert "One Mamba state: 3,000 bytes per GPU" in "\n".join(impact_lines(cost))
    # an oracle whose expected side is another engine run (no model explain in the finding): the promise is predicted for the case
    assert cost_of(_explained("sparse_dense", held_16))["memory"]["missing_states"] == 2
    # the same state held by two requests over the same tokens is one state
    both = [{"retained_mamba_blocks": {"16": [1, 2]}}, {"retained_mamba_blocks": {"16": [1, 2]}}]
    assert (
        cost_of(_explained("promise", both, expected=(0, 32, 48), observed=(0, 32, 0)) | {})["memory"]["kept_states"]
        == 2
    )
    # an engine that did not report what it holds: a stated reason
    assert (
        cost_of(_explained("promise", [{"written": [48]}, {"written": [48]}]))["memory"]
        == "not measured: the engine did not report the Mamba states it holds"
    )


def test_memory_of_a_stale_finding_counts_the_states_no_prefill_wrote():
    explain = [
        {"retained_mamba_tokens": {"0": [16]}, "written": [16, 48]},
        {"retained_mamba_tokens": {"0": [16, 32]}, "written": [48]},
    ]
    mem = cost_of(_explained("stale", explain, (0, 16), (0, 16)))["memory"]
    assert (
        mem["basis"] == "stale" and mem["extra_states"] == 1 and mem["missing_states"] == 0
    )  # 32: held after request 1, written by no prefill
    assert short(cost_of(_explained("stale", explain, (0, 16), (0, 16)))).endswith(
        "memory: 1 Mamba state(s) held that no prefill wrote; one state's bytes not resolved"
    )


def test_sglang_findings_are_costed_from_their_own_flags_and_tracked_states():
    from fuzz.results.impact import _tensor_parallel

    assert _tensor_parallel({"engine": "sglang", "sglang_args": ["--tp-size", "4"]}, {}) == 4
    assert _tensor_parallel({"engine": "sglang", "sglang_args": ["--tp_size=2"]}, {}) == 2
    assert (
        _tensor_parallel({"engine": "sglang", "sglang_args": ["--page-size", "64"], "vllm_args": ["-tp", "8"]}, {}) == 1
    )  # vLLM's flags are not SGLang's
    tracked = [{"tracked": [48], "written": [48]}, {"tracked": [32], "written": [32, 48]}]
    dep = {
        "model": "qwen3_next",
        "engine": "sglang",
        "sglang_args": ["--tp-size", "2", "--page-size", "16"],
        "device": "h100",
    }
    cost = cost_of(_explained("promise", tracked, deployment=dep))
    assert cost["tensor_parallel"] == 2 and cost["prefill_seconds"]["h100"] > 0
    assert (
        cost["memory"]["basis"] == "before"
        and cost["memory"]["missing_states"] == 1
        and cost["memory"]["kept_states"] == 1
    )  # SGLang tracked 48 only; the promise keeps 32 too


def test_the_sglang_report_s_impact_section_is_what_the_cost_functions_give():
    """docs/sglang-report.md quotes the Impact lines of its two findings;
    they must be the lines kvspec computes from the files it names."""
    text = (F.REPO_ROOT / "docs" / "sglang-report.md").read_text()
    for name in ("sglang-grid-resend-qwen3_next", "sglang-sibling-branch-qwen3_next"):
        _, finding = F.load_finding(F.REPO_ROOT / "docs" / "data" / "findings" / f"{name}.json")
        cost = cost_of(finding)
        assert cost["tokens_total"] == 64 and cost["prefill_seconds"]["h100"] > 0 and isinstance(cost["memory"], dict)
        assert "\n".join(impact_lines(cost)).rstrip() in text


def test_the_example_sizes_in_the_sglang_report_are_the_cost_functions():
    from engine_adapter.models.served import model_config_dict
    from fuzz.results.cost import recompute_flops
    from reference.deployment import parse_deployment

    dims = model_dims(
        model_config_dict(parse_deployment({"model": "qwen3_next", "engine": "sglang", "sglang_args": []}))
    )
    assert recompute_flops(dims, 2048, 3136) / 1e12 == pytest.approx(7.63, abs=0.005) and seconds(
        recompute_flops(dims, 2048, 3136), "h100"
    ) == pytest.approx(0.0193, abs=5e-5)
    assert recompute_flops(dims, 640, 1024) / 1e12 == pytest.approx(2.56, abs=0.005) and seconds(
        recompute_flops(dims, 640, 1024), "h100"
    ) == pytest.approx(0.0065, abs=5e-5)


def test_a_report_s_impact_section_has_all_four_columns():
    held = [
        {"retained_mamba_tokens": {"0": [16]}, "written": [16, 48]},
        {"retained_mamba_tokens": {"0": [16]}, "written": [48]},
    ]
    finding = _explained(
        "promise",
        held,
        facts={"mamba_page_size_bytes": 1000, "mamba_layers": 3},
        deployment={"model": "qwen3_next", "vllm_args": []},
    )
    text = issue_markdown(finding)
    impact = text[text.index("## Impact") :]
    for column in (
        "Severity: **lost reuse**.",
        "Prefill tokens recomputed: 16 over the trace",
        "| H100 SXM5 | 989 TFLOPS |",
        "Memory: Before the first divergence the engine held 1 Mamba state(s) where the promise keeps 2",
    ):
        assert column in impact
