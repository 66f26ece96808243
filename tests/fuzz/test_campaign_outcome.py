"""One verdict you can trust (issue 10): harness errors are not findings,
the exit-code rule, progress and resume lines, the libFuzzer output parser,
and triage of finding files (``kvspec findings``). Test doubles stand in
for an engine only where the machinery is under test."""

from __future__ import annotations

import itertools
import json
import os
import time

import pytest

from fuzz.driving.atheris_runner import WorkerState, _parse, argv_with_deadline
from fuzz.driving.campaign import Campaign, harness_error_of
from fuzz.driving.drivers import random_cases, run_cases
from fuzz.driving.outcome import EXIT_FINDINGS, EXIT_HARNESS, EXIT_OK, outcome
from fuzz.driving.progress import Heartbeat, progress_line, resume_line
from fuzz.judge.oracles import Divergence
from fuzz.results import findings as F
from fuzz.results.triage import read_findings, triage
from kvspec.cli import main as kvspec
from tests.conftest import MTP_DROP, hybrid, make_case
from tests.fuzz.doubles import BrokenHarnessDouble, ReferenceDouble, UnreachableDouble

# ------------------------------------------------------------ harness errors


@pytest.mark.parametrize(
    "error, judged",
    [
        (None, True),
        ({"kind": "vllm", "type": "ValueError", "message": "bad budget", "request": 0}, True),
        ({"kind": "worker", "message": "worker died (exit -9): (no stderr)"}, False),
        ({"kind": "internal", "message": "KeyError: 'x'", "traceback": "Traceback ..."}, False),
        ({"type": "ValueError", "message": "no kind given"}, False),
        ("not an object", False),
    ],
)
def test_only_an_error_of_kind_vllm_is_judged(error, judged):
    obs = {"hits": [0], "queries": [1]} if error is None else {"hits": [], "error": error}
    assert (harness_error_of(obs) is None) == judged


@pytest.mark.parametrize("kind", ["worker", "internal"])
def test_worker_and_internal_errors_are_stored_apart_and_never_findings(tmp_path, kind):
    engine = BrokenHarnessDouble(every=4, kind=kind)
    campaign = Campaign(engine, tmp_path, oracles=("promise", "engine_error"), shrink_calls=30)
    run_cases(campaign, itertools.islice(random_cases(2), 80))
    s = campaign.stats
    assert s.harness_errors > 0
    assert not list(tmp_path.glob("engine_error-*.json")), "a harness error was filed as 'vLLM raised'"
    stored = list((tmp_path / "harness-errors").glob("*.json"))
    assert stored
    for path in stored:
        record = json.loads(path.read_text())
        assert f"{kind} error: worker died" in record["traceback"] and record["case"]["schema"] == 1
    # The real divergences (the legacy rule's resend misses) are still found.
    assert s.findings and all(json.loads(open(p).read())["oracle"] == "promise" for p in s.findings)


def test_an_unreachable_engine_is_a_harness_error(tmp_path):
    campaign = Campaign(UnreachableDouble(), tmp_path)
    assert campaign.check(make_case(hybrid(16, 16), [[("A", 40)]] * 2)) == []
    assert campaign.stats.harness_errors == 1 and campaign.stats.findings == []
    (path,) = (tmp_path / "harness-errors").glob("*.json")
    assert "did not start" in json.loads(path.read_text())["traceback"]


def test_a_run_cut_at_the_deadline_is_not_a_harness_error(tmp_path):
    campaign = Campaign(BrokenHarnessDouble(every=1), tmp_path, deadline=time.monotonic() - 1)
    assert campaign.check(make_case(hybrid(16, 16), [[("A", 40)]] * 2)) == []
    assert (campaign.stats.harness_errors, campaign.stats.cut_at_deadline) == (0, 1)
    assert not (tmp_path / "harness-errors").exists()


# ------------------------------------------------------------ exit codes


@pytest.mark.parametrize(
    "execs, harness, new, died, code",
    [
        (100, 0, 0, 0, EXIT_OK),
        (100, 0, 2, 0, EXIT_FINDINGS),
        (0, 0, 0, 0, EXIT_HARNESS),  # no execution at all
        (0, 50, 0, 0, EXIT_HARNESS),
        (100, 0, 2, 1, EXIT_HARNESS),  # a worker died: 3 wins over 1
        (20, 3, 0, 0, EXIT_HARNESS),  # 3 > 10% of 20
        (20, 3, 1, 0, EXIT_HARNESS),
        (40, 3, 0, 0, EXIT_OK),  # 3 is not above 10% of 40
        (2, 2, 0, 0, EXIT_OK),  # below the minimum of 3
        (2, 2, 1, 0, EXIT_FINDINGS),
    ],
)
def test_exit_code_rule(execs, harness, new, died, code):
    got, reason = outcome(execs=execs, harness_errors=harness, new_findings=new, workers_died=died)
    assert got == code
    assert ("harness failed" in reason) == (code == EXIT_HARNESS)


def test_harness_error_limit_is_an_option():
    assert outcome(execs=100, harness_errors=30, new_findings=0, limit=0.5)[0] == EXIT_OK
    assert outcome(execs=100, harness_errors=30, new_findings=0, limit=0.2)[0] == EXIT_HARNESS


def test_fuzz_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as done:
        kvspec(["fuzz", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for line in (
        "0  the campaign ran and wrote no finding",
        "1  the campaign wrote at least one finding this run",
        "2  usage",
        "3  the harness failed",
        "--harness-error-limit",
        "wall limit of the whole command, engine start-up included",
    ):
        assert line in " ".join(text.split()) or line in text, line


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--max-time", "nan"], "--max-time="),
        (["--max-time", "-5"], "--max-time="),
        (["--harness-error-limit", "nan"], "--harness-error-limit="),
        (["--harness-error-limit", "2"], "--harness-error-limit="),
        (
            ["--driver", "atheris", "--case", "examples/seed-53504.json"],
            "--case=",
        ),  # atheris reads a corpus, not case files
        # atheris's own options, refused with the default driver (random)
        (["--corpus", "corpus"], "--corpus="),
        (["--jobs", "2"], "--jobs="),
        (["--driver", "cases", "--jobs", "2"], "--jobs="),
        (["--", "-runs=10"], "libfuzzer="),
    ],
)
def test_fuzz_usage_errors_exit_2_with_one_line(capsys, argv, field):
    assert kvspec(["fuzz", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kvspec: {field}")


def test_a_missing_engine_environment_exits_3_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KVSPEC_HOME", str(tmp_path / "home"))
    assert kvspec(["fuzz", "--engine", "vllm==0.33.0", "--no-z3-seeds", "--out", str(tmp_path / "out")]) == EXIT_HARNESS
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "environment missing" in err[0] and "kvspec engines install vllm==0.33.0" in err[0]


# ------------------------------------------------------------ progress


def test_progress_line_names_every_counter():
    line = progress_line(12.34, 120, 9.7, None, 2, 1)
    for part in ("12.3s", "execs 120", "9.7 exec/s", "cov -", "findings 2", "harness errors 1"):
        assert part in line
    assert "cov 456" in progress_line(1.0, 1, 1, 456, 0, 0)


def test_heartbeat_emits_on_its_period_and_stops():
    lines: list[str] = []
    with Heartbeat(lambda: f"tick {len(lines)}", lines.append, every=0.05):
        end = time.monotonic() + 5
        while len(lines) < 3 and time.monotonic() < end:
            time.sleep(0.01)
    assert lines[:3] == ["tick 0", "tick 1", "tick 2"]
    n = len(lines)
    time.sleep(0.2)
    assert len(lines) == n, "the heartbeat kept going after the campaign"


def test_resume_line_counts_prior_findings_and_corpus_inputs(tmp_path):
    out, corpus = tmp_path / "out", tmp_path / "corpus"
    assert resume_line(out, corpus) is None
    out.mkdir()
    corpus.mkdir()
    assert resume_line(out, corpus) is None
    for name in ("promise-a.json", "reference-b.json", ".promise-c.json.1.tmp"):
        (out / name).write_text("{}")
    (out / "harness-errors").mkdir()
    for i in range(3):
        (corpus / f"input{i}").write_bytes(b"x")
    line = resume_line(out, corpus)
    assert "2 prior finding(s)" in line and "3 corpus input(s)" in line
    assert "prior finding" in resume_line(out, None) and "corpus" not in resume_line(out, None)


def test_libfuzzer_lines_are_parsed_with_and_without_coverage():
    st = WorkerState()
    for line, (execs, cov) in (
        ("#2\tINITED exec/s: 0 rss: 50Mb", (2, 0)),
        ("#256\tpulse  corp: 1/1b lim: 6 exec/s: 128 rss: 50Mb", (256, 0)),
        ("#300\tNEW    cov: 1234 ft: 5 corp: 2/2b lim: 6 exec/s: 12 rss: 51Mb L: 1/1 MS: 1 ChangeBit-", (300, 1234)),
        ("stat::number_of_executed_units: 567", (567, 1234)),
        ("kvspec-harness-error\t/x/harness-errors/a.json", (567, 1234)),
        ("kvspec-stats\t10\t2\t0\t7\t1", (567, 1234)),
    ):
        _parse(line, st)
        assert (st.execs, st.cov) == (execs, cov), line
    assert (st.harness_errors, st.unsupported, st.duplicates) == (1, 2, 7)


@pytest.mark.parametrize(
    "returncode, stopped, died",
    [
        (0, False, False),
        (1, False, True),
        (-9, False, True),
        (-15, True, False),
        (72, True, False),
        (None, False, False),
    ],
)
def test_a_worker_died_when_it_exited_non_zero_unasked(returncode, stopped, died):
    assert WorkerState(returncode=returncode, stopped=stopped).died == died


def test_libfuzzer_time_limit_is_what_is_left_of_the_deadline():
    argv = ["fuzz_engine.py", "-seed=1", "-max_total_time=60", "corpus"]
    assert argv_with_deadline(argv, None) == argv
    assert argv_with_deadline(argv, 17.9) == ["fuzz_engine.py", "-max_total_time=17", "-seed=1", "corpus"]
    assert argv_with_deadline(argv, 600) == ["fuzz_engine.py", "-max_total_time=60", "-seed=1", "corpus"]
    assert argv_with_deadline(argv, -3) == ["fuzz_engine.py", "-max_total_time=1", "-seed=1", "corpus"]


# ------------------------------------------------------------ triage


def _finding(case, oracle, first, expected, observed, *, knobs=None, error=None, detail=""):
    div = Divergence(oracle, "0.29.0", [first], expected, observed, detail)
    obs = {"hits": observed, "queries": [], "knobs": knobs or {}, "explain": []}
    if error:
        obs["error"] = error
    return F.make_finding(case, div, obs)


def _write(folder, name, finding):
    from ground.files import write_json_atomic

    write_json_atomic(folder / name, finding)


def _three_findings_in_two_classes(folder):
    small = make_case(hybrid(16, 16), [[("A", 48)]] * 2, MTP_DROP)
    large = make_case(hybrid(16, 16), [[("A", 96)]] * 3, MTP_DROP)
    knobs = {"eagle_drop": True}
    _write(folder, "promise-large.json", _finding(large, "promise", 1, [0, 80, 80], [0, 64, 80], knobs=knobs))
    _write(folder, "promise-small.json", _finding(small, "promise", 1, [0, 32], [0, 16], knobs=knobs))
    raised = make_case(hybrid(16, 16, max_num_batched_tokens=2), [[("A", 5)]] * 2, MTP_DROP)
    error = {
        "kind": "vllm",
        "phase": "config",
        "type": "ValueError",
        "message": "max_num_batched_tokens too small",
        "request": 0,
    }
    _write(
        folder,
        "engine_error-x.json",
        _finding(raised, "engine_error", 0, [], [], error=error, detail="ValueError: max_num_batched_tokens too small"),
    )


def test_findings_group_into_classes_with_the_smallest_representative(tmp_path):
    _three_findings_in_two_classes(tmp_path)
    described, malformed = read_findings(tmp_path)
    assert malformed == []
    classes = triage(described)
    # worst severity first (a crash before lost reuse), then tokens recomputed, then the count
    assert [(c["oracle"], c["request_kind"], c["geometry"], c["count"]) for c in classes] == [
        ("engine_error", "fresh", "uniform", 1),
        ("promise", "resend", "uniform", 2),
    ]
    raised, promise = classes
    assert promise["hint"] == "resend low, block-aligned prompt"
    assert promise["representative"]["path"].endswith("promise-small.json")
    assert (promise["representative"]["requests"], promise["representative"]["tokens"]) == (2, 96)
    assert raised["hint"] == "ValueError in config"


def test_mixed_blocks_and_a_high_miss_are_another_class(tmp_path):
    mixed = make_case(hybrid(32, 16), [[("A", 49)]] * 2)
    _write(tmp_path, "a.json", _finding(mixed, "promise", 1, [0, 32], [0, 0]))
    _write(tmp_path, "b.json", _finding(mixed, "reference", 1, [0, 32], [0, 48]))
    classes = triage(read_findings(tmp_path)[0])
    assert sorted(c["hint"] for c in classes) == [
        "resend high, mixed attention/Mamba blocks",
        "resend low, mixed attention/Mamba blocks",
    ]
    assert {c["geometry"] for c in classes} == {"mixed"}


MALFORMED = {
    "not-json.json": b"{not json",
    "binary.json": bytes(range(256)),
    "utf16.json": '{"oracle": "promise"}'.encode("utf-16"),
    "nested.json": b"[" * 100_000 + b"]" * 100_000,
    "big-int.json": b"1" * 5000,
    "list.json": b"[]",
    "bad-case.json": json.dumps({"oracle": "promise", "case": {"schema": 1, "trace": []}}).encode(),
}


def test_kvspec_findings_lists_classes_and_malformed_files_one_line_each(tmp_path, capsys):
    _three_findings_in_two_classes(tmp_path)
    for name, data in MALFORMED.items():
        (tmp_path / name).write_bytes(data)
    os.mkfifo(tmp_path / "fifo.json")  # never opened (it would block)
    assert kvspec(["findings", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    lines = out.out.splitlines()
    assert lines[0] == f"3 finding(s) in 2 class(es) in {tmp_path}"
    bad = [line for line in lines if line.startswith(f"  {tmp_path}/")]
    assert sorted(line.split(":")[0].strip() for line in bad) == sorted(
        str(tmp_path / n) for n in [*MALFORMED, "fifo.json"]
    )
    assert f"{len(MALFORMED) + 1} malformed file(s), not findings:" in lines
    assert kvspec(["findings", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["findings"] == 3 and [c["count"] for c in report["classes"]] == [1, 2]
    assert len(report["malformed"]) == len(MALFORMED) + 1


def test_a_campaign_s_findings_read_as_fewer_classes_than_files(tmp_path):
    campaign = Campaign(
        ReferenceDouble("0.29.0", "legacy"), tmp_path, oracles=("promise", "reference"), shrink_calls=20
    )
    run_cases(campaign, itertools.islice(random_cases(2), 150))
    files = list(tmp_path.glob("*.json"))
    classes = triage(read_findings(tmp_path)[0])
    assert files and sum(c["count"] for c in classes) == len(files)
    assert len(classes) < len(files)
    for c in classes:  # the representative is the smallest of its class
        members = [json.loads(open(p).read()) for p in c["paths"]]
        smallest = min(
            (len(m["case"]["trace"]), sum(s["length"] for r in m["case"]["trace"] for s in r["prompt"]))
            for m in members
        )
        assert (c["representative"]["requests"], c["representative"]["tokens"]) == smallest


def test_kvspec_findings_of_a_missing_folder_exits_2(tmp_path, capsys):
    assert kvspec(["findings", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvspec: DIR=")


class _ResolveDouble:
    """A test double for the engine's resolver only: ``mamba2`` crashes (vLLM
    raised an IndexError building the KV cache), ``jamba`` is refused,
    ``bamba`` fails in kvspec's worker (a model class its environment cannot
    import), anything else resolves to block 544."""

    version = "0.33.0"

    def resolve(self, case):
        from ground.errors import DeploymentCrashes, DeploymentRejected

        model = case.deployment.model
        if model == "mamba2":
            raise DeploymentCrashes(
                "deployment='mamba2': vLLM crashes building its KV cache: IndexError: list index out of range"
            )
        if model == "jamba":
            raise DeploymentRejected("deployment='jamba': vLLM rejects it: ValueError: no")
        if model == "bamba":
            from ground.errors import EngineError

            raise EngineError(
                "engine='vllm==0.33.0': resolve failed (internal): ValidationError: Model architectures ['BambaForCausalLM'] failed to be inspected"
            )
        return {"geometry": {"scheduler_block_size": 544, "hash_block_size": 544}, "facts": {"max_model_len": 32768}}


def test_a_deployment_vllm_crashes_on_is_drawn_and_one_it_refuses_is_not(tmp_path):
    """The generator draws on what the engine resolves: a refused deployment
    is redrawn (never run), a crash is drawn all the same, so its run is the
    ``engine_error`` finding."""
    import random

    from fuzz.draw.choosers import RandomChooser
    from fuzz.draw.generate import build_deployment_case
    from fuzz.driving.campaign import CRASH_TRACE_BLOCK

    campaign = Campaign(_ResolveDouble(), tmp_path, oracles=("engine_error",))
    dep = {"model": "mamba2", "vllm_args": ["--enable-prefix-caching"], "platform": "cuda", "device": "h100"}
    assert campaign.resolver(dep)["block"] == CRASH_TRACE_BLOCK
    assert campaign.resolver({**dep, "model": "jamba"}) is None
    assert campaign.resolver({**dep, "model": "qwen3_next"})["block"] == 544
    rng = random.Random(5)
    models = {build_deployment_case(RandomChooser(rng), campaign.resolver).deployment.model for _ in range(200)}
    assert "mamba2" in models and "jamba" not in models


def test_a_deployment_kvspec_fails_to_resolve_is_a_harness_error_not_a_refusal(tmp_path):
    """kvspec failing to resolve a deployment (``EngineError``: here a model
    class its engine environment cannot import) is not drawn and is counted
    and stored as a harness error, never taken silently for vLLM's refusal."""
    campaign = Campaign(_ResolveDouble(), tmp_path, oracles=("engine_error",))
    dep = {"model": "bamba", "vllm_args": ["--enable-prefix-caching"], "platform": "cuda", "device": "h100"}
    assert campaign.resolver(dep) is None
    assert campaign.stats.harness_errors == 1
    (stored,) = (tmp_path / "harness-errors").glob("*.json")
    assert "failed to be inspected" in stored.read_text()
    assert campaign.resolver({**dep, "model": "jamba"}) is None and campaign.stats.harness_errors == 1


class _StopsAfter(ReferenceDouble):
    """TEST DOUBLE: vLLM 0.29.0's legacy rule whose runs stop after
    ``limit`` (EngineError, as a worker past the campaign's deadline)."""

    def __init__(self, limit: int):
        super().__init__("0.29.0", "legacy")
        self.limit = limit

    def run(self, case):
        from ground.errors import EngineError

        if self.calls >= self.limit:
            raise EngineError("engine='0.29.0': not run: past the campaign's deadline")
        return super().run(case)


def test_a_confirmed_divergence_is_written_when_the_deadline_cuts_its_shrink(tmp_path):
    """The run, its confirmation, then nothing more: the shrink and the final
    judgement cannot run, and the confirmed original is the finding (it was
    lost before: the final judgement's error ended the case as cut)."""
    case = make_case(hybrid(16, 16), [[("A", 64)], [("A", 64)]])
    campaign = Campaign(_StopsAfter(2), tmp_path, oracles=("promise",), shrink_calls=30)
    written = campaign.check(case)
    assert len(written) == 1 and campaign.stats.harness_errors == 0
    assert json.loads(written[0].read_text())["oracle"] == "promise"
