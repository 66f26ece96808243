"""The case format: round trip, resolution, and one-line errors."""

from __future__ import annotations

import json

import pytest

from ground.errors import InvalidArgument
from kvspec.cli import main
from reference.case import case_to_dict, load_case, parse_case, prompt_tokens, segment_tokens
from tests.conftest import hybrid, make_case

GOOD = {"schema": 1, "geometry": hybrid(1600, 1600), "trace": [{"prompt": [{"segment": "A", "length": 10}]}]}


def with_(path, value):
    raw = json.loads(json.dumps(GOOD))
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return raw


def test_round_trip_and_resolution():
    case = parse_case(GOOD)
    assert case.geometry.scheduler_block_size == 1600
    assert case.geometry.hash_block_size == 1600
    assert case.geometry.retention_interval == 0
    assert case.geometry.max_num_batched_tokens == 8192
    assert parse_case(case_to_dict(case)) == case


def test_mixed_geometry_defaults_to_lcm_and_gcd():
    case = parse_case(with_(["geometry"], hybrid(32, 48)))
    assert case.geometry.scheduler_block_size == 96
    assert case.geometry.hash_block_size == 16


def test_segments_are_prefix_streams():
    assert segment_tokens("A", 50) == segment_tokens("A", 100)[:50]
    assert segment_tokens("A", 20) != segment_tokens("B", 20)
    case = make_case(hybrid(16, 16), [[("A", 30), ("B", 5)]])
    tokens = prompt_tokens(case.trace[0])
    assert tokens[:30] == segment_tokens("A", 30) and tokens[30:] == segment_tokens("B", 5)
    assert all(1 <= t < 1024 for t in tokens)


def test_stream_is_stable_across_runs():
    # A fixed value: changing the stream would silently change every saved finding.
    assert segment_tokens("A", 5) == segment_tokens("A", 5)
    assert len(set(segment_tokens("A", 1000))) > 500


BAD = [
    (["geometry", "scheduler_block_size"], 2400, "geometry.scheduler_block_size", None),
    (["geometry", "hash_block_size"], 300, "geometry.hash_block_size", None),
    (["geometry", "groups", 0, "kind"], "sliding_window", "geometry.groups[0].kind", None),
    (["geometry", "groups", 0, "block_size"], 0, "geometry.groups[0].block_size", None),
    (["geometry", "retention_interval"], 800, "geometry.retention_interval", None),
    (["geometry", "retention_interval"], -1, "geometry.retention_interval", None),
    (["geometry", "colour"], 1, "geometry.colour", None),
    (["trace", 0, "prompt", 0, "length"], 0, "trace[0].prompt[0].length", None),
    (["trace", 0, "prompt", 0, "length"], -5, "trace[0].prompt[0].length", None),
    (["trace", 0, "max_tokens"], "1", "trace[0].max_tokens", None),
    (["speculative"], {"method": "draft_model", "num_speculative_tokens": 2}, "speculative.method", None),
    (["speculative"], {"method": "mtp", "num_speculative_tokens": 2, "fast": True}, "speculative.fast", None),
    (["schema"], 2, "schema", None),
    (["trace"], [], "trace", None),
]


@pytest.mark.parametrize("path,value,field,_", BAD)
def test_bad_input_is_one_line_naming_the_field(path, value, field, _):
    with pytest.raises(InvalidArgument) as e:
        parse_case(with_(path, value))
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(field)


def test_mamba_block_not_dividing_is_caught():
    raw = with_(["geometry"], {**hybrid(1600, 1000), "hash_block_size": 1600})
    with pytest.raises(InvalidArgument, match=r"geometry.hash_block_size=1600: must divide every group block size"):
        parse_case(raw)


@pytest.mark.parametrize("content", ["{not json", "[]", json.dumps({"schema": 1})])
def test_cli_bad_file_exits_2_with_one_line(tmp_path, capsys, content):
    path = tmp_path / "case.json"
    path.write_text(content)
    assert main(["predict", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvspec: ") and "\n" not in err and "Traceback" not in err


def test_cli_missing_file(tmp_path, capsys):
    assert main(["predict", str(tmp_path / "nope.json")]) == 2
    assert "case file=" in capsys.readouterr().err


def test_cli_bad_version(tmp_path, capsys):
    path = tmp_path / "case.json"
    path.write_text(json.dumps(GOOD))
    assert main(["predict", str(path), "--as", "vllm==0.1.0"]) == 2
    assert "--as='vllm==0.1.0'" in capsys.readouterr().err  # the flag named


def test_cli_predict_prints_the_documented_shape(tmp_path, capsys):
    assert main(["predict", "examples/seed-53504.json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"hits", "queries", "knobs", "explain"}
    assert out["hits"] == [0, 9600, 9600]
    assert main(["predict", "examples/seed-53504.json", "--as", "vllm==0.29.0", "--rule", "legacy"]) == 0
    assert json.loads(capsys.readouterr().out)["hits"] == [0, 0, 9600]


def test_finding_file_is_accepted(tmp_path):
    path = tmp_path / "finding.json"
    path.write_text(json.dumps({"case": GOOD, "oracle": "reference"}))
    assert load_case(path).trace[0].prompt[0].length == 10


def test_unsupported_option_for_version(tmp_path, capsys):
    raw = with_(["speculative"], {"method": "mtp", "num_speculative_tokens": 2, "disable_eagle_block_drop": True})
    path = tmp_path / "case.json"
    path.write_text(json.dumps(raw))
    assert main(["predict", str(path), "--as", "vllm==0.29.0"]) == 2
    assert "disable_eagle_block_drop" in capsys.readouterr().err
