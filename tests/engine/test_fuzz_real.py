"""The fuzzer against the REAL vLLM scheduler (0.29.0 and 0.33.0 environments).

Differential checks here use the real engine only; no test double."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fuzz.driving.campaign import Campaign
from fuzz.driving.drivers import run_cases
from fuzz.replaying.replay import replay_case
from fuzz.results.findings import load_finding
from spec.seeds import boundary_cases
from tests.engine.conftest import ensure_env
from tests.fuzz.test_worker_lifecycle import fuzz_workers

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[2]


def _resend_misses(campaign) -> list[str]:
    out = []
    for path in campaign.stats.findings:
        f = json.loads(Path(path).read_text())
        if f["oracle"] == "promise" and "(resend)" in f["summary"]:
            out.append(path)
    return out


def test_z3_seeded_campaign_finds_53504_on_029_and_it_is_fixed_in_033(engines, tmp_path):
    old, new = engines("0.29.0"), engines("0.33.0")
    campaign = Campaign(old, tmp_path, oracles=("promise",), shrink_calls=60)
    run_cases(campaign, boundary_cases(("1600",), modes=("drop/0.30",)), stop_on_finding=True)
    found = _resend_misses(campaign)
    assert found, "an identical resend under MTP must miss on 0.29.0"
    case, finding = load_finding(found[0])
    assert case.speculative is not None and case.speculative.option("disable_lookahead_block_hashes")
    # It replays from the file alone on 0.29.0 ...
    assert replay_case(case, finding, old)["verdict"] == "reproduced"
    # ... and 0.33.0, with the same knobs (the drop in force), keeps the promise.
    result = replay_case(case, finding, new)
    assert result["observed"]["knobs"]["eagle_drop"] is True
    assert result["verdict"] == "not reproduced"


def test_engine_error_inside_vllm_is_recorded_and_the_campaign_goes_on(engines, tmp_path):
    from tests.conftest import MTP_DROP, hybrid, make_case

    engine = engines("0.33.0")
    # vLLM refuses a token budget that does not exceed the drafter's
    # lookahead (MTP K=2, budget 2); the reference model accepts the case.
    bad = make_case(hybrid(16, 16, max_num_batched_tokens=2), [[("A", 5)]] * 2, MTP_DROP)
    good = make_case(hybrid(16, 16), [[("A", 40)]] * 2)
    campaign = Campaign(engine, tmp_path, oracles=("engine_error",), shrink_calls=5)
    assert campaign.check(bad)
    assert campaign.check(good) == []
    (error,) = tmp_path.glob("engine_error-*.json")
    finding = json.loads(error.read_text())
    assert "max_num_batched_tokens" in finding["observed"]["error"]["message"]
    assert engine.run(good)["hits"] == [0, 32]  # the worker is still usable


#: --max-time of the resumed run: the in-process engine's instrumented
#: start-up (~20-45 s on 2 busy cores) plus some fuzzing.
RESUME_S = 90


def _fuzz_cmd(out: Path, corpus: Path, seconds: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "kvspec.cli",
        "fuzz",
        "--driver",
        "atheris",
        "--engine",
        "vllm==0.29.0",
        "--max-time",
        str(seconds),
        "--seed",
        "1",
        "--out",
        str(out),
        "--corpus",
        str(corpus),
        "--json",
    ]


@pytest.mark.slow  # over a minute on 2 cores: `make test-slow` (Makefile, test tiers)
def test_atheris_campaign_on_029_finds_53504_and_survives_kill_9(tmp_path):
    ensure_env("0.29.0")
    out, corpus = tmp_path / "findings", tmp_path / "corpus"
    proc = subprocess.Popen(
        _fuzz_cmd(out, corpus, 300),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not list(out.glob("promise-*.json")):
        time.sleep(1)
    assert fuzz_workers(str(out)), "the libFuzzer worker should be running before the kill"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # The libFuzzer worker dies with the campaign's process group.
    end = time.monotonic() + 10
    while fuzz_workers(str(out)) and time.monotonic() < end:
        time.sleep(0.2)
    left = fuzz_workers(str(out))
    for pid in left:  # never leave one behind, even when failing
        os.kill(pid, signal.SIGKILL)
    assert not left, f"fuzz_engine.py workers outlived kill -9 of their group: {left}"
    found = list(out.glob("*.json"))
    assert any(p.name.startswith("promise-") for p in found)
    for path in found:  # every file written before the kill is whole
        json.loads(path.read_text())
    before = {p.name for p in corpus.iterdir()}
    # Resume from the same corpus, nothing lost; --max-time is the wall
    # limit, start-up included; on a non-TTY it says what it resumes from
    # and prints progress lines.
    start = time.monotonic()
    done = subprocess.run(
        _fuzz_cmd(out, corpus, RESUME_S), cwd=ROOT, capture_output=True, text=True, timeout=RESUME_S + 120
    )
    wall = time.monotonic() - start
    assert done.returncode in (0, 1), done.stderr[-2000:]  # 1: a signature not seen before
    summary = json.loads(done.stdout)
    assert summary["harness_errors"] == 0 and summary["workers_died"] == 0 and summary["execs"] > 0
    assert before <= {p.name for p in corpus.iterdir()}
    assert wall <= RESUME_S + 8, f"--max-time {RESUME_S} took {wall:.1f}s"
    err = done.stderr.splitlines()
    assert (
        f"kvspec fuzz: resuming: {len(found)} prior finding(s) in {out} (not reported again), {len(before)} corpus input(s) in {corpus}"
        in err
    )
    assert sum(line.startswith("kvspec fuzz: ") and " execs " in line for line in err) >= RESUME_S // 10 - 2
    # The summary triages every finding in --out into classes.
    assert sum(c["count"] for c in summary["classes"]) == len(list(out.glob("*.json")))


RESOLVE_QWEN35 = r"""
import json
from engine_adapter.vllm_engine.driver import get_driver
from reference.case import parse_case
from ground.errors import KvspecError

case = parse_case({"schema": 1, "deployment": {"model": "qwen3_5", "vllm_args": ["--enable-prefix-caching"], "platform": "cuda", "device": "h100"},
                   "trace": [{"prompt": [{"segment": "A", "length": 1}]}]})
try:
    print(json.dumps({"block": get_driver().resolve(case)["geometry"]["scheduler_block_size"]}))
except (KvspecError, ValueError) as e:  # the harness's error or vLLM's refusal: either way, not resolved
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
"""


def test_an_in_process_atheris_target_resolves_qwen3_5_deployments():
    """The atheris target runs in the engine environment with what every
    engine worker gets (``fuzz.driving.atheris_runner.target_env``). Without the
    torchvision stub vLLM cannot import Qwen3.5's model class: every Qwen3.5
    deployment failed to resolve, which kvspec had taken for vLLM's refusal,
    so the in-process campaigns never ran one."""
    from engine_adapter.host import environments
    from fuzz.driving.atheris_runner import target_env
    from ground.engines import EngineSpec
    from ground.home import contained_env

    ensure_env("0.33.0")

    def resolve_with(env: dict) -> dict:
        proc = subprocess.run(
            [str(environments.env_python("0.33.0")), "-c", RESOLVE_QWEN35],
            env=env,
            cwd=str(environments.REPO_ROOT),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    assert resolve_with(target_env(EngineSpec("vllm", "0.33.0"), in_process=True))["block"] > 0
    bare = {**contained_env(), "PYTHONPATH": str(environments.REPO_ROOT)}  # what the target had before
    assert "failed to be inspected" in resolve_with(bare).get("error", "")
