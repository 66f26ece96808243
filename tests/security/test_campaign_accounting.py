"""Campaign accounting (issue 29): no false all-clear, bounded jobs and
time, output-folder errors before any work.

* A generated corpus of bad ``--out``, ``--corpus``, ``--jobs`` and
  ``--max-time`` values: each is one line naming the flag, exit 2, before
  any engine work (``KVSPEC_HOME`` is an empty tmp folder, which stays
  empty: no engine environment, warm engine or z3 seed is touched; without
  the check the run would reach the engine and exit 3).
* The ``--case`` accounting: a test double engine (named as one) whose
  second case runs past the deadline; the exit is 3 naming that file,
  never 0 "no finding".
* One engine-marked run of the real vLLM 0.33.0 with two case files and a
  deadline too short for them: exit 3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fuzz.driving.campaign import Campaign
from fuzz.driving.drivers import BoundedEngine, run_given
from fuzz.driving.outcome import EXIT_FINDINGS, EXIT_HARNESS, EXIT_OK, outcome
from ground.errors import EngineError, InvalidArgument
from kvspec.cli import main as kvspec
from kvspec.options import cores, output_dir, output_file
from reference.case import case_to_dict
from tests.conftest import hybrid, make_case
from tests.fuzz.doubles import ReferenceDouble

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------ bad values, before any work


def _bad_folders(tmp: Path) -> dict[str, str]:
    """Paths no folder can be written into, by kind."""
    a_file = tmp / "a-file"
    a_file.write_text("x")
    return {
        "a file": str(a_file),
        "under a file": str(a_file / "sub"),
        "deeper under a file": str(a_file / "a" / "b"),
        "/dev/null": "/dev/null",
        "/proc/self": "/proc/self",
        "under /proc/self": "/proc/self/kvspec-out",
        "a NUL byte": str(tmp / "a\0b"),
    }


def _bad_numbers() -> list[tuple[str, str]]:
    over = str(2 * cores() + 1)
    return [("--jobs", v) for v in ("0", "-1", "1000000", over)] + [
        ("--max-time", v) for v in ("nan", "inf", "-inf", "-1", "0", "1e9")
    ]


def _argvs(tmp: Path) -> list[tuple[str, list[str]]]:
    out = []
    for kind, path in _bad_folders(tmp).items():
        for driver in ("atheris", "random", "cases"):
            out.append(("--out", ["fuzz", "--driver", driver, "--max-time", "30", "--out", path]))
        out.append(
            (
                "--corpus",
                ["fuzz", "--driver", "atheris", "--max-time", "30", "--out", str(tmp / "ok"), "--corpus", path],
            )
        )
        out.append(("--out", ["check-build", "--max-time", "30", "--out", path]))
        out.append(("--out", ["mutate", "--report", "--out", path]))
    for flag, value in _bad_numbers():
        for driver in ("atheris", "random"):
            out.append((flag, ["fuzz", "--driver", driver, f"{flag}={value}", "--out", str(tmp / "ok")]))
    for value in (
        "-jobs=1000000",
        "-workers=64",
        "-fork=8",
        "-merge=1",
    ):  # libFuzzer's own processes, out of --jobs' reach
        out.append(
            (
                "libfuzzer",
                ["fuzz", "--driver", "atheris", "--max-time", "30", "--out", str(tmp / "ok"), "--", "-runs=10", value],
            )
        )
    return out


def test_every_bad_output_folder_jobs_and_max_time_is_one_line_exit_2_before_any_engine(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("KVSPEC_HOME", str(home))
    monkeypatch.setenv("KVSPEC_WARM", "0")
    probes = _argvs(tmp_path)
    assert len(probes) > 60
    for flag, argv in probes:
        t0 = time.monotonic()
        code = kvspec(argv)
        took = time.monotonic() - t0
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2, (argv, code, err)
        assert len(err) == 1 and err[0].startswith(f"kvspec: {flag}="), (argv, err)
        assert "Traceback" not in err[0] and "\0" not in err[0]
        assert took < 5, (argv, took)
        assert not list(home.iterdir()), (argv, list(home.iterdir()))  # no engine, warm engine or seed touched
    assert not (tmp_path / "ok").exists()  # nothing created for a run that never started


def test_jobs_bound_names_this_machine_s_cores(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KVSPEC_HOME", str(tmp_path / "home"))
    assert kvspec(["fuzz", "--jobs", "1000000", "--out", str(tmp_path / "o")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert (
        line
        == f"kvspec: --jobs=1000000: must be an integer in [1, {2 * cores()}] (2 per core of this machine's {cores()} cores)"
    )


class ReadOnlyMountDouble:
    """A TEST DOUBLE for ``os.statvfs`` saying the folder is on a read-only
    mount (root cannot make one here; ``os.access`` says yes to root)."""

    def __init__(self, real):
        self.real = real

    def __call__(self, path):
        st = self.real(path)
        return os.statvfs_result(
            (
                st.f_bsize,
                st.f_frsize,
                st.f_blocks,
                st.f_bfree,
                st.f_bavail,
                st.f_files,
                st.f_ffree,
                st.f_favail,
                st.f_flag | os.ST_RDONLY,
                st.f_namemax,
            )
        )


def test_a_read_only_mount_is_refused_even_for_root(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "statvfs", ReadOnlyMountDouble(os.statvfs))
    for path in (tmp_path, tmp_path / "new" / "deeper"):
        with pytest.raises(InvalidArgument, match="read-only file system"):
            output_dir("--out", path)


def test_a_folder_where_no_file_can_be_created_is_refused(tmp_path, monkeypatch):
    """A TEST DOUBLE for ``tempfile.TemporaryFile`` failing as it does for a
    non-root user in a read-only folder; os.access is not trusted."""
    import tempfile

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    with pytest.raises(InvalidArgument, match="is not writable"):
        output_dir("--corpus", tmp_path)


def test_a_writable_folder_is_accepted_and_left_as_it_was(tmp_path):
    assert output_dir("--out", tmp_path) == tmp_path
    assert output_dir("--out", tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert list(tmp_path.iterdir()) == []  # the probe file is removed, nothing created


def test_an_output_file_over_a_device_is_refused(tmp_path):
    with pytest.raises(InvalidArgument, match="not a regular file"):
        output_file("--chart", "/dev/null")
    assert output_file("--chart", tmp_path / "c.png") == tmp_path / "c.png"


# ------------------------------------------------------------ --case accounting


class SlowCaseDouble(ReferenceDouble):
    """A TEST DOUBLE engine (the reference model as vLLM 0.33.0): a case
    named ``slow`` takes ``delay`` seconds and then comes back as a worker
    cut off by its timeout does (error kind ``worker``)."""

    def __init__(self, delay: float):
        super().__init__("0.33.0", "replay")
        self.delay, self.ran = delay, []

    def run(self, case):
        self.ran.append(case.name)
        if case.name == "slow":
            time.sleep(self.delay)
            return {
                "hits": [],
                "queries": [],
                "knobs": None,
                "explain": [],
                "error": {
                    "kind": "worker",
                    "phase": "worker",
                    "request": None,
                    "type": "worker",
                    "message": "timed out",
                    "traceback": None,
                },
            }
        return super().run(case)

    def close(self):
        pass


def _case(name: str):
    return make_case(hybrid(16, 16), [[("A", 40)], [("A", 40)]], name=name)


def test_a_case_cut_at_the_deadline_is_unfinished_work_not_a_verdict(tmp_path):
    engine = SlowCaseDouble(delay=0.6)
    campaign = Campaign(engine, tmp_path, oracles=("promise",), deadline=time.monotonic() + 0.3)
    counts = run_given(
        campaign,
        [("fast.json", _case("fast")), ("slow.json", _case("slow")), ("after.json", _case("after"))],
        deadline=campaign.deadline,
    )
    assert engine.ran == ["fast", "slow"]
    assert {k: counts[k] for k in ("given", "run", "cut_at_deadline", "harness_error", "not_started")} == {
        "given": 3,
        "run": 1,
        "cut_at_deadline": 1,
        "harness_error": 0,
        "not_started": 1,
    }
    assert counts["unfinished"] == [
        {"path": "slow.json", "why": "cut_at_deadline"},
        {"path": "after.json", "why": "not_started"},
    ]
    code, line = outcome(
        execs=campaign.stats.execs, harness_errors=campaign.stats.harness_errors, new_findings=0, cases=counts
    )
    assert code == EXIT_HARNESS and "no finding" not in line
    assert (
        "2 of 3 --case file(s) not run to completion: slow.json (cut at the deadline), after.json (not started)" in line
    )


def test_outcome_of_case_files_every_branch():
    every = {"given": 2, "run": 2, "cut_at_deadline": 0, "harness_error": 0, "not_started": 0, "unfinished": []}
    cut = {
        "given": 2,
        "run": 1,
        "cut_at_deadline": 1,
        "harness_error": 0,
        "not_started": 0,
        "unfinished": [{"path": "b\x1b[2J.json", "why": "cut_at_deadline"}],
    }
    assert outcome(execs=2, harness_errors=0, new_findings=0, cases=every) == (EXIT_OK, "ran; no finding")
    code, line = outcome(execs=2, harness_errors=0, new_findings=0, cases=cut)
    assert (
        code == EXIT_HARNESS and "1 of 2 --case file(s)" in line and "\x1b" not in line and "'b\\x1b[2J.json'" in line
    )
    code, line = outcome(execs=2, harness_errors=0, new_findings=1, cases=cut)
    assert code == EXIT_FINDINGS and "1 finding(s) written" in line and "1 of 2 --case file(s)" in line


def test_kvspec_fuzz_cases_exits_3_naming_the_case_cut_at_the_deadline(tmp_path, monkeypatch, capsys):
    """The CLI end to end with a test double engine in place of the worker:
    two case files, the second cut by --max-time; never exit 0."""
    import engine_adapter
    import fuzz.driving.runner
    import kvspec.commands.fuzz as fuzz_cmd

    double = SlowCaseDouble(delay=1.6)
    monkeypatch.setenv("KVSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(engine_adapter, "open_engine", lambda name, **k: double)
    monkeypatch.setattr(
        fuzz.driving.runner, "open_engine", lambda name, **k: double
    )  # bound there when an earlier test imported it
    monkeypatch.setattr(fuzz_cmd, "unusable_engine", lambda engines: None)
    files = []
    for name in ("fast", "slow"):
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(case_to_dict(_case(name))))
    argv = [
        "fuzz",
        "--engine",
        "vllm==0.33.0",
        "--driver",
        "cases",
        "--no-z3-seeds",
        "--max-time",
        "3",
        "--out",
        str(tmp_path / "out"),
        "--json",
    ]
    for f in files:
        argv += ["--case", str(f)]
    t0 = time.monotonic()
    assert kvspec(argv) == EXIT_HARNESS
    assert time.monotonic() - t0 < 3 + 2  # --max-time, and a margin for a loaded machine
    out = capsys.readouterr()
    summary = json.loads(out.out)
    assert (
        summary["case_files"]["given"] == 2
        and summary["case_files"]["run"] == 1
        and summary["case_files"]["cut_at_deadline"] == 1
    )
    assert (
        double.ran[0] == "fast" and double.ran[-1] == "slow" and set(double.ran) == {"fast", "slow"}
    )  # the --case files, in order (an oracle may run one twice)
    assert summary["findings"] == []
    last = out.err.strip().splitlines()[-1]
    assert (
        last.startswith("kvspec fuzz: exit 3: harness failed: 1 of 2 --case file(s) not run to completion:")
        and f"{files[1]} (cut at the deadline)" in last
    )
    double.ran.clear()
    assert (
        kvspec([a for a in argv if a != "--json"] + ["--out", str(tmp_path / "out2")]) == EXIT_HARNESS
    )  # the table names the counts too
    assert (
        "--case files: 2 given, 1 run, 1 cut at the deadline, 0 a harness error, 0 not started"
        in capsys.readouterr().out
    )


def test_ray_workers_case_files_merge_run_when_any_worker_ran_it():
    from fuzz.driving.ray_runner import _case_files

    names = ["a.json", "b.json", "c.json"]
    first = {
        "given": 3,
        "unfinished": [{"path": "b.json", "why": "cut_at_deadline"}, {"path": "c.json", "why": "not_started"}],
    }
    second = {"given": 3, "unfinished": [{"path": "c.json", "why": "harness_error"}]}
    merged = _case_files([first, None, second], names)
    assert {k: merged[k] for k in ("given", "run", "cut_at_deadline", "harness_error", "not_started")} == {
        "given": 3,
        "run": 2,
        "cut_at_deadline": 0,
        "harness_error": 1,
        "not_started": 0,
    }
    assert merged["unfinished"] == [{"path": "c.json", "why": "harness_error"}]  # the furthest a worker got
    assert _case_files([None, None], names)["not_started"] == 3  # every worker died: none ran
    assert _case_files([first], []) is None


# ------------------------------------------------------------ --max-time bounds start-up


class NeverStartsDouble:
    """A TEST DOUBLE worker engine whose worker never says hello: each
    start waits out its start timeout, as a too-slow vLLM import does."""

    mode = "worker"
    version = "0.33.0"

    def __init__(self):
        self.starts = 0
        outer = self

        class Proc:
            start_timeout = 180.0

            def start(self):
                outer.starts += 1
                time.sleep(min(self.start_timeout, 0.2))
                raise EngineError("engine='vllm==0.33.0': worker did not start")

        self.proc = Proc()

    def process(self, platform="cuda"):
        return self.proc

    def run(self, case, timeout=None):
        self.proc.start()

    def resolve(self, case, timeout=None):
        self.proc.start()


def test_a_worker_that_cannot_start_is_started_once_and_nothing_starts_past_the_deadline(tmp_path):
    from fuzz.draw.seeds import on_deployments

    double = NeverStartsDouble()
    bounded = BoundedEngine(double, time.monotonic() + 5)
    campaign = Campaign(bounded, tmp_path, oracles=("promise",), deadline=bounded.deadline)
    with pytest.raises(EngineError):
        bounded.start()
    seeds = [_case(f"seed-{i}") for i in range(40)]  # uniform hand geometries, as the z3 seeds are
    t0 = time.monotonic()
    on_deployments(seeds, campaign.resolver, stop=campaign.past_deadline)
    assert double.starts == 1 and time.monotonic() - t0 < 1.0
    late = BoundedEngine(NeverStartsDouble(), time.monotonic() - 1)
    with pytest.raises(EngineError, match="past the campaign's deadline"):
        late.run(_case("x"))
    assert late.engine.starts == 0


@pytest.mark.parametrize("driver", ["random", "hypothesis"])
def test_a_driver_draws_nothing_once_the_engine_is_down_or_the_deadline_passed(tmp_path, driver):
    """Drawing a deployment case asks the engine to resolve deployments:
    none is drawn (no resolution, no harness error, no cut) when the worker
    could not start, or past the deadline."""
    import hypothesis  # noqa: F401 - imported before the clock (seconds on a loaded machine)

    from fuzz.draw.generate import hypothesis_cases  # noqa: F401
    from fuzz.driving.drivers import run_hypothesis, run_random

    run = run_random if driver == "random" else run_hypothesis
    down = BoundedEngine(NeverStartsDouble(), time.monotonic() + 5)
    with pytest.raises(EngineError):
        down.start()
    late = BoundedEngine(NeverStartsDouble(), time.monotonic() - 1)
    for bounded, budget in ((down, 3.0), (late, 0.0)):
        campaign = Campaign(bounded, tmp_path / driver, oracles=("promise",), deadline=bounded.deadline)
        t0 = time.monotonic()
        run(campaign, 1, max_time=budget)
        s = campaign.stats
        assert (s.cases, s.harness_errors, s.cut_at_deadline) == (0, 0, 0) and time.monotonic() - t0 < 2.5
        assert bounded.engine.starts == (1 if bounded is down else 0)


# ------------------------------------------------------------ the real engine


@pytest.mark.engine
def test_real_engine_two_case_files_and_a_tiny_deadline_exit_3(tmp_path):
    """vLLM 0.33.0's worker with two case files and --max-time 0.05: the
    worker cannot even start in time, so neither file is run: exit 3, both
    named, within the deadline plus a few seconds. (At --max-time 3 a
    worker forked from a warm zygote ran the first case in a fresh clone's
    default tier, so that deadline no longer kept both from running.)"""
    cases = [ROOT / "examples" / "seed-53504.json", ROOT / "examples" / "r2-block-aligned-extension.json"]
    env = {**os.environ, "KVSPEC_WARM": "0"}
    cmd = [
        sys.executable,
        "-m",
        "kvspec.cli",
        "fuzz",
        "--engine",
        "vllm==0.33.0",
        "--driver",
        "cases",
        "--no-z3-seeds",
        "--max-time",
        "0.05",
        "--out",
        str(tmp_path / "out"),
    ]
    for c in cases:
        cmd += ["--case", str(c)]
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert done.returncode == EXIT_HARNESS, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "no finding" not in last and "2 of 2 --case file(s) not run to completion" in last, last
    assert took < 0.05 + 10, took


def test_fuzz_help_states_the_accounting_rules(capsys):
    with pytest.raises(SystemExit) as done:
        kvspec(["fuzz", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for rule in (
        "If any was not run to completion the exit is 3, with one line naming how many and which, never 0",
        "a finding written still gives 1",
        "--jobs is at most 2 per core of this machine",
        "nothing is started past it",
    ):
        assert rule in text, rule


def test_a_full_file_system_is_refused_before_any_work(tmp_path, monkeypatch):
    """A TEST DOUBLE for ``os.statvfs`` answering as a full file system
    does (a 64 KiB tmpfs with nothing left): ``advise``, ``report`` and
    ``fuzz`` learn it up front, not at their first write after the work."""
    import os as os_module

    import kvspec.options as options

    real = os_module.statvfs

    class Full:
        def __init__(self, st):
            self.f_flag, self.f_frsize, self.f_bavail = st.f_flag, st.f_frsize, 0

    monkeypatch.setattr(options.os, "statvfs", lambda path: Full(real(path)))
    with pytest.raises(InvalidArgument, match="less than 1 MiB free"):
        output_dir("--out", tmp_path / "advice")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------- issue 40 item 5: a full disk


def test_a_disk_that_fills_up_mid_campaign_is_exit_3_in_one_line(tmp_path, monkeypatch, capsys):
    """Two diverging --case files on a TEST DOUBLE engine (the reference
    model's legacy rule as vLLM 0.29.0); the finding and harness-error
    writers (test doubles for a disk that fills up) raise ENOSPC after the
    first finding: exit 3, one line naming ENOSPC and the finding
    already written, which stays whole and readable."""
    import errno

    import engine_adapter
    import fuzz.driving.runner
    import fuzz.results.findings
    import kvspec.commands.fuzz as fuzz_cmd
    from fuzz.results.findings import load_finding
    from tests.fuzz.doubles import ReferenceDouble

    class Double(ReferenceDouble):
        def close(self):
            pass

    double = Double("0.29.0", "legacy")
    monkeypatch.setenv("KVSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(engine_adapter, "open_engine", lambda name, **k: double)
    monkeypatch.setattr(fuzz.driving.runner, "open_engine", lambda name, **k: double)
    monkeypatch.setattr(fuzz_cmd, "unusable_engine", lambda engines: None)
    real = fuzz.results.findings.write_finding
    written = []

    def fill_up(finding, out_dir):
        if written:
            raise OSError(errno.ENOSPC, "No space left on device", str(out_dir))
        written.append(real(finding, out_dir))
        return written[-1]

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fuzz.results.findings, "write_finding", fill_up)
    monkeypatch.setattr(fuzz.results.findings, "write_harness_error", full)  # the disk is full for it too
    seed = json.loads((Path(__file__).resolve().parents[2] / "examples/seed-53504.json").read_text())
    argv = [
        "fuzz",
        "--engine",
        "vllm==0.29.0",
        "--driver",
        "cases",
        "--no-z3-seeds",
        "--max-time",
        "60",
        "--out",
        str(tmp_path / "out"),
    ]
    for name, length in (("one", 11910), ("two", 9000)):
        seed["name"] = name
        seed["trace"] = [{"prompt": [{"segment": "A", "length": length}]}] * 3
        (tmp_path / f"{name}.json").write_text(json.dumps(seed))
        argv += ["--case", str(tmp_path / f"{name}.json")]
    rc = kvspec(argv)
    err = capsys.readouterr().err
    assert len(written) == 1, err[-600:]
    assert rc == 3 and "Traceback" not in err, err[-1500:]
    line = [x for x in err.splitlines() if "ENOSPC" in x]
    assert len(line) == 1 and "1 finding(s) already written" in line[0] and "exit 3" in line[0]
    load_finding(written[0])  # whole and valid
