"""engine_adapter/devcheck/gpu_classes.py on CPU: its plan (the tiny
configs, the cases, the serve commands) and its verdict lines. The GPU run
itself is not run here (docs/live.md, "The GPU classes")."""

from __future__ import annotations

import json

from engine_adapter.devcheck import gpu_classes as G


def test_the_plan_writes_tiny_configs_with_the_example_s_per_rank_shapes(tmp_path):
    rows = {r["class"]: r for r in G.plan(tmp_path)}
    assert set(rows) == {"dense-below-sparse", "resend-beside-checkpoint", "stale-state"}
    qwen = json.loads((tmp_path / "dense-below-sparse" / "model" / "config.json").read_text())
    # Qwen3-Next at TP 2: 2 KV heads, 16/32 GDN heads -> one GPU holds 1 and 8/16; one full-attention period of 4 layers
    assert (qwen["num_key_value_heads"], qwen["linear_num_key_heads"], qwen["linear_num_value_heads"]) == (1, 8, 16)
    assert (
        qwen["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
        and qwen["num_hidden_layers"] == 4
        and qwen["vocab_size"] == 1024
    )
    falcon = json.loads((tmp_path / "stale-state" / "model" / "config.json").read_text())
    assert (falcon["mamba_n_heads"], falcon["mamba_d_ssm"], falcon["num_key_value_heads"]) == (32, 256, 2)  # TP 4
    serve = rows["dense-below-sparse"]["serve"]
    assert serve[serve.index("--tensor-parallel-size") + 1] == "1" and serve[serve.index("--host") + 1] == "127.0.0.1"
    assert (
        "--load-format" in serve
        and serve[serve.index("--load-format") + 1] == "dummy"
        and "--prefix-match-unit" in serve
    )
    cold = rows["stale-state"]["cold_serve"]
    assert (
        "--no-enable-prefix-caching" in cold
        and "--enable-prefix-caching" not in cold
        and rows["dense-below-sparse"]["cold_serve"] is None
    )
    case = json.loads((tmp_path / "stale-state" / "case.json").read_text())
    assert case["deployment"]["model"] == str(tmp_path / "stale-state" / "model") and rows["stale-state"][
        "prompts"
    ] == [17, 428, 313, 205]
    assert json.loads((tmp_path / "plan.json").read_text())[0]["class"] == "dense-below-sparse"


def test_the_verdict_line_per_class():
    row = {"class": "stale-state", "block": 144, "release": [0, 16, 144, 144], "promise": [0, 16, 144, 144]}
    assert (
        G.verdict(row, 160, None, None)
        == "class=stale-state geometry=differs block=160 example=144 verdict=inconclusive"
    )
    line = G.verdict(row, 144, [0, 16, 144, 144], ([[1, 2], [3], [4], [5]], [[1, 2], [3], [9], [5]]))
    assert line.endswith("verdict=hits as on CPU greedy=differ at requests [2]")
    assert "greedy=inconclusive" in G.verdict(row, 144, [0, 16, 144, 144], ([[1, 2]], [[7, 7]]))
    r1 = {"class": "resend-beside-checkpoint", "block": 320, "release": [0, 1280], "promise": [0, 1632]}
    assert "verdict=reproduced" in G.verdict(r1, 320, [0, 1280], None) and "verdict=the promise holds" in G.verdict(
        r1, 320, [0, 1632], None
    )
    assert "verdict=inconclusive" in G.verdict(r1, 320, None, None)


def test_the_plan_command_line_starts_nothing(tmp_path, capsys):
    assert G.main(["--plan", str(tmp_path), "--classes", "stale-state"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(
        "class=stale-state block=144 prompts=[17, 428, 313, 205] serve=python -m vllm.entrypoints.openai.api_server"
    )
