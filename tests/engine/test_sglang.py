"""SGLang 0.5.23's hybrid radix cache through kvspec's worker (the real
wheel in its own environment, ``engine_adapter.sglang_engine``): the
resolution, the run on both tree cores, the resumed states, and the
promise's verdict on the grid-multiple resend (examples/README.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine_adapter.host.engine import WorkerEngine
from reference.case import parse_case, with_resolution
from reference.predict import predict
from tests.engine.conftest import ensure_env

VERSION = "sglang==0.5.23"
ROOT = Path(__file__).resolve().parents[2]
CASE = ROOT / "examples" / "sglang-grid-resend-qwen3_next.json"


@pytest.fixture(scope="module")
def sglang():
    ensure_env(VERSION)
    engine = WorkerEngine(VERSION)
    engine.start()
    yield engine
    engine.close()


def _case(strategy_args: list[str], lengths: list[list[tuple[str, int]]]) -> dict:
    return {
        "schema": 1,
        "name": "t",
        "deployment": {"model": "qwen3_next", "engine": "sglang", "sglang_args": strategy_args},
        "trace": [{"prompt": [{"segment": s, "length": n} for s, n in p]} for p in lengths],
    }


def test_resolution_is_sglangs_own(sglang):
    res = sglang.resolve(json.loads(CASE.read_text()))
    assert res["mamba_radix_cache_strategy"] == "extra_buffer" and res["extra_buffer"] is True
    assert res["page_size"] == 64 and res["chunked_prefill_size"] == 2048
    assert (
        res["checkpoint_grid"] == 64 and res["track_grid"] == 256
    )  # lcm(64, page) and lcm(grid, --mamba-track-interval 256)
    auto = sglang.resolve(_case([], [[("A", 10)]]))
    assert auto["mamba_radix_cache_strategy"] == "extra_buffer"  # "auto" for Qwen3-Next on CUDA, as SGLang resolves it


def test_sglang_refuses_what_it_refuses(sglang):
    with pytest.raises(Exception) as e:
        sglang.resolve(_case(["--mamba-radix-cache-strategy", "no_buffer", "--page-size", "64"], [[("A", 10)]]))
    assert "no_buffer only supports page_size=1" in str(e.value)


def test_both_tree_cores_agree_and_every_resumed_state_is_its_tokens(sglang):
    case = json.loads(CASE.read_text())
    runs = {core: sglang.run(case, {"tree_core": core}) for core in ("python", "rust")}
    assert runs["python"]["harness"]["tree_core_class"] != runs["rust"]["harness"]["tree_core_class"]
    assert runs["python"]["hits"] == runs["rust"]["hits"]
    for run in runs.values():
        assert "error" not in run
        for e in run["explain"]:
            assert e["hit"] == 0 or e["resumed_state"] == {"tokens": e["hit"], "same_tokens": True}, e


def test_grid_multiple_resend_misses_the_promise(sglang):
    """A prompt of k x grid tokens (3,200 = 50 x 64) keeps its tracked state
    at 3,200; the resend is capped at 3,199, so it resumes at the chunk end
    (2,048) and only the third request reaches 3,136. The 3,300-token
    prompt, off the grid, is kept at 3,264 and its resend hits that."""
    raw = json.loads(CASE.read_text())
    obs = sglang.run(raw)
    res = obs["resolution"]
    promised = predict(
        with_resolution(parse_case(raw), res["geometry"], res["speculative"], VERSION), VERSION, "promise"
    )["hits"]
    grid = res["checkpoint_grid"]
    assert promised[1] == (3200 - 1) // grid * grid
    assert obs["hits"][1] < promised[1]  # the class: the resend loses reuse
    assert obs["hits"][2] == promised[2]  # the third resumes where the promise says the second should
    assert obs["hits"][3:] == promised[3:]  # off the grid: as promised
    assert 3200 in obs["explain"][0]["tracked"] and 3136 not in obs["explain"][0]["tracked"]


def test_no_buffer_keeps_states_where_prefills_end(sglang):
    obs = sglang.run(
        _case(
            [
                "--mamba-radix-cache-strategy",
                "no_buffer",
                "--disable-overlap-schedule",
                "--chunked-prefill-size",
                "2048",
            ],
            [[("A", 3300)], [("A", 3300)], [("A", 3300), ("B", 100)]],
        )
    )
    assert obs["resolution"]["geometry"] is None  # the promise is not stated for it
    assert (
        obs["hits"][0] == 0 and obs["hits"][1] == 2048 and obs["hits"][2] == 3300
    )  # a chunk end; the whole earlier prompt
    assert all(e["written"] == e["chunk_ends"] for e in obs["explain"])


def test_cli_compare_exits_1_on_the_divergence_from_the_promise():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvspec.cli",
            "run",
            str(CASE),
            "--engine",
            VERSION,
            "--compare",
            "--rule",
            "promise",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["verdict"] == "diverges" and out["engine"] == VERSION and out["rule"] == "promise"


def test_cli_compare_agrees_with_sglangs_own_rule_by_default():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvspec.cli",
            "run",
            str(CASE),
            "--engine",
            VERSION,
            "--compare",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert (
        out["verdict"] == "agrees"
        and out["rule"] == "replay"
        and out["reference"]["hits"] == [0, 2048, 3136, 0, 3264, 3264]
    )


def test_a_hit_above_the_promise_by_a_chunk_end_state_is_not_a_divergence(tmp_path):
    """Issue 42's trace: request 1 is the grid class (below the promise);
    request 3 resumes at 512, a chunk end SGLang's prefill wrote, where the
    promise says 0: that one is legitimate."""
    case = _case(
        ["--mamba-radix-cache-strategy", "extra_buffer", "--chunked-prefill-size", "512"],
        [[("A", 1024)], [("A", 1024)], [("A", 1024), ("B", 40)], [("A", 700), ("C", 300)]],
    )
    path = tmp_path / "c.json"
    path.write_text(json.dumps(case))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvspec.cli",
            "run",
            str(path),
            "--engine",
            VERSION,
            "--compare",
            "--rule",
            "promise",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    out = json.loads(proc.stdout)
    assert out["observed"]["hits"][3] == 512 and out["reference"]["hits"][3] == 512, out["reference"]["hits"]
    assert [r.split(":")[0] for r in out["reasons"]] == ["request 1"], out["reasons"]  # the grid class only


def test_predict_replay_equals_sglang_on_its_examples_and_drawn_cases(sglang):
    """The acceptance figure's test (5 drawn per strategy here; the table
    with 30: ``python -m tests.conformance.sglang_replay_table``)."""
    from tests.conformance.sglang_replay_table import STRATEGY_NAMES, compare, drawn_cases, example_cases

    cases = example_cases() + [c for s in STRATEGY_NAMES for c in drawn_cases(sglang, s, 5, 7)]
    assert len(cases) == len(example_cases()) + 10 == 16
    rows = [compare(sglang, c) for c in cases]
    assert [r["case"] for r in rows if not r["agrees"]] == [], rows


def test_every_boundary_deployment_is_one_sglang_launches(sglang):
    """check-build's boundary cases leave out a deployment SGLang refuses
    (``sglang_boundary_cases``): kvspec's own list must hold none, or its
    cases vanish without a word (two did, once the resolver ran the launch
    check)."""
    from fuzz.draw.generate_sglang import BOUNDARY_DEPLOYMENTS

    for model, args in BOUNDARY_DEPLOYMENTS:
        res = sglang.resolve(
            {**_case(args, [[("A", 10)]]), "deployment": {"model": model, "engine": "sglang", "sglang_args": args}}
        )
        assert res["chunked_prefill_size"] == int(args[args.index("--chunked-prefill-size") + 1]), (model, args)


def test_sglangs_launch_check_refuses_a_budget_off_the_page(sglang):
    """``check_server_args`` (``validation_hook.py:241-246``), which
    ``Engine._launch_subprocesses`` runs after ``resolve_once``
    (``entrypoints/engine.py:1153``, ``:1165``): a chunk budget off the
    page never serves, so the off-page key it showed (a continuing chunk
    from 1,960 keyed at 2,880 with a state over 2,920 tokens,
    examples/rejected-sglang-off-page-key-qwen3_next.json) is no finding. On the
    page it resolves."""
    off = ["--mamba-radix-cache-strategy", "extra_buffer", "--page-size", "64", "--chunked-prefill-size", "1000"]
    with pytest.raises(Exception) as e:
        sglang.resolve(_case(off, [[("A", 3000)]] * 3))
    assert "chunked_prefill_size must be divisible by page_size" in str(e.value)
    with pytest.raises(Exception) as e:
        sglang.resolve(json.loads((ROOT / "examples" / "rejected-sglang-off-page-key-qwen3_next.json").read_text()))
    assert "chunked_prefill_size must be divisible by page_size" in str(e.value)
    on = sglang.resolve(_case(off[:-1] + ["1024"], [[("A", 3000)]] * 3))
    assert on["chunked_prefill_size"] == 1024


def test_decode_tracks_every_interval_and_a_turn_quoting_the_output_resumes_inside_it(sglang):
    """Decode through SGLang's own ``prepare_for_decode`` and result
    processor (``engine_adapter/sglang_engine/decode.py``): a 1,000-token
    prompt decoding 600 tokens tracks 960 in its prefill and 1,024, 1,280,
    1,536 in decode (track grid 256); the turn quoting its output resumes
    at 1,536 over its own tokens, a sibling of the prompt at 960; the
    replay rule states the same (``tests/reference/test_sglang_prefill.py``)."""
    from reference.sglang_prefill import SglangSetting, simulate

    a = [{"segment": "A", "length": 1000}]
    case = parse_case(
        {
            "schema": 1,
            "name": "decode",
            "deployment": {
                "model": "qwen3_next",
                "engine": "sglang",
                "sglang_args": ["--mamba-radix-cache-strategy", "extra_buffer", "--page-size", "64"],
            },
            "trace": [
                {"prompt": a, "max_tokens": 600},
                {"prompt": a + [{"output": 0}, {"segment": "B", "length": 50}], "max_tokens": 3},
                {"prompt": a + [{"segment": "C", "length": 10}]},
            ],
        }
    )
    obs = sglang.run(case)
    assert "error" not in obs, obs.get("error")
    assert obs["hits"] == [0, 1536, 960]
    first = obs["explain"][0]
    assert first["tracked"] == [960, 1024, 1280, 1536] and len(first["decode_steps"]) == 599
    assert first["computed_tokens"] == 1599
    assert all(e["resumed_state"]["same_tokens"] for e in obs["explain"][1:])
    steps = simulate(case, SglangSetting.from_resolution(obs["resolution"]))
    assert [r.hit for r in steps] == obs["hits"] and [r.tracked for r in steps] == [
        e["tracked"] for e in obs["explain"]
    ]


def test_the_wheels_own_multiturn_decode_assert_holds_on_decode_hits(sglang):
    """SGLang 0.5.23's own server-test assertion for Mamba decode hits,
    restated (its wheel: ``sglang/test/kl_multiturn_utils.py:92-119
    make_mamba_decode_assert``: a turn that quotes the previous turn's
    output has ``cached_tokens >= floor((history + output - 1) /
    track_interval) * track_interval``), on the shape of
    ``sglang/test/kits/unified_radix_cache_kit.py:105-131
    test_multiturn_decode_cache_hit_branching`` (a 512-token base shared by
    the branches, 512 new tokens per turn, suffixes of 512 then 256), two
    branches, served one after another. Qwen3-Next, ``extra_buffer``, page
    64, SGLang's track interval (256 here); the replay rule states the same hits."""
    from reference.sglang_prefill import SglangSetting, simulate

    out = 512
    base = [{"segment": "G", "length": 512}]
    trace, prompts = [], []
    for turn, suffix in enumerate((0, 512, 256)):
        for b in range(2):
            if turn == 0:
                prompt = list(base)
            else:
                j = (turn - 1) * 2 + b
                prompt = prompts[j] + [{"output": j}, {"segment": f"S{turn}{b}", "length": suffix}]
            prompts.append(prompt)
            trace.append({"prompt": prompt, "max_tokens": out})
    case = parse_case(
        {
            "schema": 1,
            "name": "kit-multiturn-decode",
            "deployment": {
                "model": "qwen3_next",
                "engine": "sglang",
                "sglang_args": ["--mamba-radix-cache-strategy", "extra_buffer", "--page-size", "64"],
            },
            "trace": trace,
        }
    )
    obs = sglang.run(case)
    assert "error" not in obs, obs.get("error")
    interval = obs["resolution"]["track_grid"]
    history = [sum(s.length for s in r.prompt) for r in case.trace]
    for i in range(2, len(trace)):
        expected = (history[i - 2] + out - 1) // interval * interval
        assert obs["hits"][i] >= expected, (i, obs["hits"], expected)
    steps = simulate(case, SglangSetting.from_resolution(obs["resolution"]))
    assert [r.hit for r in steps] == obs["hits"]


def _spec_args(steps: int = 3, topk: int = 1, page: str = "64") -> list[str]:
    return [
        "--mamba-radix-cache-strategy",
        "extra_buffer",
        "--page-size",
        page,
        "--speculative-algorithm",
        "NEXTN",
        "--speculative-num-steps",
        str(steps),
        "--speculative-eagle-topk",
        str(topk),
        "--speculative-num-draft-tokens",
        str(steps + 1),
    ]


def test_eagle_verify_steps_track_where_they_cross_the_grid_and_the_rule_says_the_same(sglang):
    """Speculative decoding through SGLang's own spec scheduling and result
    code (``decode.run_spec_decode``; NEXTN resolves to EAGLE, 4 tokens a
    verify): a 1,000-token prompt decoding 24 tokens verifies 1,000 -> 1,004
    ... -> 1,024 (25 outputs, capped at 24) and tracks 1,024 where a step
    crosses the track grid (256); unlike a plain decode (1,023 computed
    tokens), its 24 outputs are all computed, so the finished request
    donates the state at 1,024 (``_select_finished_checkpoint``) and a turn
    quoting outputs resumes there. Every resumed state is its tokens, and
    rule 6 of the replay rule states the same hits and tracked points."""
    from reference.sglang_prefill import SglangSetting, simulate

    a = [{"segment": "A", "length": 1000}]
    case = parse_case(
        {
            "schema": 1,
            "name": "spec",
            "deployment": {"model": "qwen3_next", "engine": "sglang", "sglang_args": _spec_args()},
            "trace": [
                {"prompt": [{"segment": "Z", "length": 5}], "max_tokens": 30},
                {"prompt": a, "max_tokens": 24},
                {"prompt": a + [{"output": 0}, {"segment": "C", "length": 10}]},
                {"prompt": a + [{"output": 1}, {"segment": "C", "length": 10}], "max_tokens": 600},
            ],
        }
    )
    obs = sglang.run(case)
    assert "error" not in obs, obs.get("error")
    assert (
        obs["resolution"]["speculative_algorithm"] == "EAGLE" and obs["resolution"]["speculative_num_draft_tokens"] == 4
    )
    second = obs["explain"][1]
    assert second["tracked"] == [960, 1024] and second["decode_steps"][0] == [1000, 4, 4]
    assert len(second["decode_steps"]) == 6  # 1 + 6 * 4 = 25 outputs >= 24
    assert obs["hits"] == [0, 0, 1024, 1024]
    assert obs["explain"][3]["tracked"] == [1280, 1536]
    assert all(e["resumed_state"]["same_tokens"] for e in obs["explain"] if e["resumed_state"])
    steps = simulate(case, SglangSetting.from_resolution(obs["resolution"]))
    assert [r.hit for r in steps] == obs["hits"]
    assert [r.tracked for r in steps] == [e["tracked"] for e in obs["explain"]]


def test_a_draft_tree_is_refused_with_what_sglang_resolved(sglang):
    """A draft tree (topk > 1) is not driven: refused in one line naming
    SGLang's own resolution, never guessed."""
    with pytest.raises(Exception) as e:
        sglang.run(_case(_spec_args(steps=3, topk=2), [[("A", 300)]]))
    text = str(e.value)
    assert "speculative decoding (" in text and "as SGLang resolved it" in text and "\n" not in text, text


def test_a_concurrent_wave_shares_extends_and_resumes_only_written_states(sglang):
    """Several requests per batch through SGLang's own scheduler loop
    (``engine_adapter/sglang_engine/batching.py``; chunks of 1,024, page
    64): A:1,500 and A:1,500+B:200 sent into the same step. The first
    takes the whole budget (chunk end 1,024); the next step extends its
    last 476 tokens beside the second's first chunk (a mixed chunk), which
    resumes at 1,024, the state the first stashed between its chunks. A
    third, sent two steps later, resumes at 1,472, where the first's
    finished extend tracked. Every resumed state is its tokens; the replay
    rule states the serial prefix only (``predicted``), as for vLLM, and
    the judge's concurrent oracles (``stale``) find nothing."""
    from fuzz.judge.oracle_states import check_stale
    from reference.sglang_prefill import SglangSetting
    from reference.sglang_prefill import predict as sglang_predict

    a = [{"segment": "A", "length": 1500}]
    case = parse_case(
        {
            "schema": 1,
            "name": "wave",
            "deployment": {
                "model": "qwen3_next",
                "engine": "sglang",
                "sglang_args": [
                    "--mamba-radix-cache-strategy",
                    "extra_buffer",
                    "--page-size",
                    "64",
                    "--chunked-prefill-size",
                    "1024",
                ],
            },
            "trace": [
                {"prompt": [{"segment": "Z", "length": 70}]},
                {"prompt": a},
                {"prompt": a + [{"segment": "B", "length": 200}], "arrival": 0, "max_tokens": 40},
                {"prompt": a + [{"segment": "D", "length": 10}], "arrival": 2},
            ],
        }
    )
    obs = sglang.run(case)
    assert "error" not in obs, obs.get("error")
    assert obs["hits"] == [0, 0, 1024, 1472]
    first, second, third = obs["explain"][1:]
    assert first["chunk_ends"] == [1024, 1500] and second["chunk_ends"][0] == 1536
    assert second["first_step"] == first["first_step"] + 1  # its first chunk beside the first's last one
    assert all(e["resumed_state"]["same_tokens"] for e in obs["explain"] if e["resumed_state"])
    assert len(second["decode_steps"]) == 39
    assert check_stale(case, VERSION, obs) == []
    p = sglang_predict(case, SglangSetting.from_resolution(obs["resolution"]))
    assert p["predicted"] == 1 and p["hits"] == [0, None, None, None]
    assert all(h <= b for h, b in zip(obs["hits"][1:], p["bounds"][1:])), p["bounds"]


def test_speculation_in_a_concurrent_trace_is_refused_in_one_line(sglang):
    case = _case(_spec_args(), [[("A", 300)], [("A", 300)]])
    case["trace"][1]["arrival"] = 0
    with pytest.raises(Exception) as e:
        sglang.run(case)
    text = str(e.value)
    assert "concurrent trace (arrival) with speculative decoding" in text and "\n" not in text, text


def test_predict_as_sglang_answers_with_either_rule():
    for rule, hits in (("replay", [0, 2048, 3136, 0, 3264, 3264]), ("promise", [0, 3136, 3136, 0, 3264, 3264])):
        proc = subprocess.run(
            [sys.executable, "-m", "kvspec.cli", "predict", str(CASE), "--as", VERSION, "--rule", rule],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stderr[-1000:]
        assert json.loads(proc.stdout)["hits"] == hits


def test_cli_refuses_a_vllm_case_on_sglang():
    proc = subprocess.run(
        [sys.executable, "-m", "kvspec.cli", "run", str(ROOT / "examples" / "seed-53504.json"), "--engine", VERSION],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and "--engine='sglang==0.5.23'" in proc.stderr, proc.stderr[-500:]


def test_a_campaign_finds_both_sglang_classes_by_itself(sglang, tmp_path):
    """A default SGLang campaign from an empty folder (seeded, bounded by
    runs, not time): deployments drawn from SGLang's knobs, traces from the
    promise's shapes; every finding is one of the two SGLang classes, the
    two tree cores agree on every case, and nothing is a harness error."""
    import time

    from fuzz.driving.campaign import Campaign
    from fuzz.driving.drivers import BoundedEngine, TreeCoreTwin, run_random
    from fuzz.results.known_classes import classify

    bounded = BoundedEngine(sglang, time.monotonic() + 600)
    campaign = Campaign(bounded, tmp_path, other=TreeCoreTwin(bounded), seed=2)
    stats = run_random(campaign, 2, max_time=500, max_execs=300)
    assert stats.harness_errors == 0
    found = [json.loads(Path(p).read_text()) for p in stats.findings]
    classes = {classify(f) for f in found}
    assert classes == {"sglang-grid-resend", "sglang-sibling-branch"}, [(f["oracle"], f["summary"]) for f in found]
    assert all(f["engine"]["name"] == VERSION for f in found)
    assert not any(f["oracle"] == "versions" for f in found)  # Python and Rust tree cores: the same hits throughout


def test_fuzz_refuses_what_the_sglang_family_does_not_drive():
    for extra, flag in (
        (["--driver", "atheris"], "--driver"),
        (["--synthetic-geometry"], "--synthetic-geometry"),
        (["--engine", "vllm==0.33.0"], "--engine"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "kvspec.cli", "fuzz", "--engine", VERSION, *extra, "--max-time", "5"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert proc.returncode == 2 and f"kvspec: {flag}=" in proc.stderr, (extra, proc.stderr[-400:])


@pytest.mark.slow  # over a minute on 2 cores: `make test-slow` (Makefile, test tiers)
def test_a_matrix_across_families_judges_each_engine_on_its_own_resolution():
    """``kvspec matrix`` with a vLLM and an SGLang engine: each deployment
    case runs on the other family with that engine's default flags (the
    cell says so), and each cell is judged against the promise on the
    geometry its own engine resolved."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvspec.cli",
            "matrix",
            str(CASE),
            str(ROOT / "examples" / "seed-53504-deployment.json"),
            "--engine",
            "vllm==0.33.0",
            "--engine",
            VERSION,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert proc.returncode in (0, 1), proc.stderr[-1500:]
    rows = {r["name"]: r["cells"] for r in json.loads(proc.stdout)}
    grid = rows["sglang-grid-resend-qwen3_next"]
    assert grid[VERSION]["verdict"] == "diverges" and "flags" not in grid[VERSION]
    assert grid["0.33.0"]["flags"] == "vllm's defaults" and grid["0.33.0"]["verdict"] == "agrees"
    seed = rows["seed-53504-qwen3.5-27b-tp2-fp8-mtp2"]
    assert seed[VERSION]["flags"] == "sglang's defaults" and seed[VERSION]["block"] == 64
    assert seed[VERSION]["promise"] != seed["0.33.0"]["promise"]  # each judged on its own resolution


FIX = ROOT / "fixes" / "sglang-0.5.23-keep-cut.diff"


@pytest.mark.slow  # over a minute on 2 cores: `make test-slow` (Makefile, test tiers)
def test_a_patched_sglang_build_keeps_the_promise_on_both_classes(tmp_path):
    """``--engine sglang==0.5.23 --patch fixes/sglang-0.5.23-keep-cut.diff``:
    the build (SGLang's sglang/ tree overlaid, hard-linked from the release)
    keeps the promise on both examples the release breaks it on."""
    from engine_adapter.host.builds import overlay_from_patches, prepare

    overlay = overlay_from_patches(VERSION, [str(FIX)])
    assert list(overlay.files) == ["sglang/srt/managers/schedule_policy.py"] and overlay.version.startswith(
        "sglang==0.5.23+keep-cut."
    )
    name = prepare(VERSION, [str(FIX)])
    assert name == overlay.name
    for example in (CASE, ROOT / "examples" / "sglang-sibling-branch-qwen3_next.json"):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "kvspec.cli",
                "run",
                str(example),
                "--engine",
                name,
                "--compare",
                "--json",
                "--mode",
                "worker",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stderr[-1500:]
        out = json.loads(proc.stdout)
        assert out["verdict"] == "agrees" and out["engine"] == name


def test_an_sglang_patch_stays_in_sglangs_tree(tmp_path):
    from engine_adapter.host.builds import overlay_from_patches
    from ground.errors import InvalidArgument

    bad = tmp_path / "bad.diff"
    bad.write_text(
        "--- a/vllm/v1/core/sched/scheduler.py\n+++ b/vllm/v1/core/sched/scheduler.py\n@@ -1 +1 @@\n-a\n+b\n"
    )
    with pytest.raises(
        InvalidArgument,
        match=r"is not a file of SGLang's sglang/ tree; allowed: paths like a/sglang/srt/managers/schedule_policy.py",
    ):
        overlay_from_patches(VERSION, [str(bad)])


def test_kvspec_resolve_prints_what_sglang_built_and_relays_its_refusal():
    ok = subprocess.run(
        [sys.executable, "-m", "kvspec.cli", "resolve", str(CASE), "--engine", VERSION],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert (
        ok.returncode == 0
        and "strategy:          extra_buffer" in ok.stdout
        and "the promise reads: block 64" in ok.stdout
    ), ok.stdout + ok.stderr[-500:]
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvspec.cli",
            "resolve",
            "--model",
            "qwen3_next",
            "--engine",
            VERSION,
            "--",
            "--mamba-radix-cache-strategy",
            "no_buffer",
            "--page-size",
            "64",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "KVSPEC_WARM": "0"},  # the tests' shared warm pool says its housekeeping on stderr
    )
    assert (
        refused.returncode == 2
        and refused.stderr.strip() == "kvspec: deployment: SGLang refused it: no_buffer only supports page_size=1."
    ), refused.stderr[-500:]


def test_a_deployment_resolved_again_runs_under_its_own_arguments(sglang):
    """Resolutions are kept per deployment in the worker; SGLang's
    scheduler reads process-wide arguments, so a deployment met again (A,
    then B, then A) must run under A's, as it did the first time."""
    a = json.loads(CASE.read_text())
    b = _case(
        ["--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule", "--chunked-prefill-size", "2048"],
        [[("A", 3200)], [("A", 3200)]],
    )
    first = sglang.run(a)
    other = sglang.run(b)
    again = sglang.run(a)
    assert other["resolution"]["mamba_radix_cache_strategy"] == "no_buffer"
    assert again["hits"] == first["hits"] and [e["tracked"] for e in again["explain"]] == [
        e["tracked"] for e in first["explain"]
    ]


def test_a_pinned_pool_evicts_the_first_prompt_and_only_safety_judges_past_it(sglang):
    """``examples/sglang-pressure-eviction-qwen3_next.json`` (issue 43): a
    token pool of 4,096 (``--max-total-tokens``, floored to the page as
    SGLang sizes it) and 8 Mamba slots (``--max-mamba-cache-size``). B's
    allocation makes the radix cache evict A's prefix (its own
    ``_evict``: 2,944 tokens and A's two states), the resend of B, the
    prompt just cached, still hits 2,944, and A again hits 0 and evicts B.
    The judge: no oracle fires (safety judges every request; the promise
    only those before the pressure, request 0), while the promise judging
    every request would have fired at request 3: the line under pressure
    is what keeps it quiet, not an absent observation."""
    from fuzz.judge.oracles import before_pressure, check_all, oracles_for, resolved

    case = parse_case(json.loads((ROOT / "examples" / "sglang-pressure-eviction-qwen3_next.json").read_text()))
    obs = sglang.run(case)
    assert "error" not in obs, obs.get("error")
    r = obs["resolution"]
    assert r["token_pool"] == 4096 and r["mamba_pool"] == 8 and r["facts"]["pool_set_by_deployment"] is True
    assert obs["hits"] == [0, 0, 2944, 0]
    evicted = [e.get("evicted") for e in obs["explain"]]
    assert evicted == [None, [["full_attention", 2944], ["mamba", 2]], None, [["full_attention", 2944], ["mamba", 2]]]
    assert all(e["resumed_state"]["same_tokens"] for e in obs["explain"] if e["resumed_state"])
    judged = resolved(case, obs, VERSION)
    assert before_pressure(judged, obs) == 1
    assert check_all(judged, VERSION, obs, None, oracles_for(VERSION)) == []
    unpinned = {**obs, "resolution": {**r, "facts": {**r["facts"], "pool_set_by_deployment": False}}}
    fired = check_all(judged, VERSION, unpinned, None, oracles_for(VERSION))
    assert [(d.oracle, d.first) for d in fired] == [("promise", 3)], fired
