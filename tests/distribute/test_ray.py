"""fuzz/driving/distribute.py on a local Ray cluster of 2 CPUs (one for the whole
module: Ray takes seconds to start), and ``kvspec fuzz --jobs 2 --ray`` on
the real vLLM 0.29.0 engine.

The cluster listens on 127.0.0.1 only, keeps its files under
``$KVSPEC_HOME/ray`` and is shut down after the module."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fuzz.driving.distribute import run_tasks
from fuzz.driving.ray_cluster import MAX_TEMP_DIR, RaySession, check_temp_dir, resolve_address
from ground.errors import InvalidArgument
from tests.distribute import tasks as T

ROOT = Path(__file__).resolve().parents[2]
ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster of 2 CPUs on 127.0.0.1, started by this process
    and stopped after the module; yields its GCS address."""
    from fuzz.driving.ray_cluster import ray_temp_dir

    # 'local' starts a cluster of its own even where `ray start` left an
    # address behind (here a dead one)
    stale = ray_temp_dir() / "ray_current_cluster"
    planted = not stale.exists()
    if planted:
        stale.parent.mkdir(parents=True, exist_ok=True)
        stale.write_text("127.0.0.1:1")
    try:
        with RaySession("local", num_cpus=2):
            yield ray.get_runtime_context().gcs_address
    finally:
        if planted:
            stale.unlink(missing_ok=True)
    assert not ray.is_initialized()


def _kill_when_written(path: Path, release: Path, killed: list[int], wait_s: float = 60) -> threading.Thread:
    """A thread that SIGKILLs the pid written to ``path``, then creates ``release``."""

    def run():
        end = time.monotonic() + wait_s
        try:
            while time.monotonic() < end:
                if path.exists() and path.read_text().strip():
                    pid = int(path.read_text())
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
                time.sleep(0.02)
        finally:
            release.touch()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# ------------------------------------------------------------------ on Ray


def test_the_cluster_is_local_and_keeps_its_files_in_kvspecs_home(cluster):
    from ground.home import kvspec_home

    host, _, port = cluster.rpartition(":")
    assert host == "127.0.0.1" and port.isdigit()
    assert ray.cluster_resources().get("CPU") == 2
    session = Path(ray._private.worker._global_node.get_session_dir_path())
    assert session.parent == kvspec_home() / "ray"
    assert not Path("/tmp/ray").exists() or not any(p.name == session.name for p in Path("/tmp/ray").iterdir())


def test_tasks_complete_once_each_keyed_by_id(cluster, tmp_path):
    tasks = [{"id": f"t{i}", "x": i} for i in range(6)]
    results = run_tasks(T.square, tasks, ray_address=cluster, out=tmp_path, retries=1, timeout_s=60)
    assert [r["id"] for r in results] == [t["id"] for t in tasks]
    assert [(r["status"], r["mode"], r["attempt"], r["result"]["square"]) for r in results] == [
        ("ok", "ray", 0, i * i) for i in range(6)
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"t{i}.json" for i in range(6))
    assert json.loads((tmp_path / "t3.json").read_text())["result"]["square"] == 9
    # a second call resumes: nothing runs again, the same envelopes come back
    again = run_tasks(
        T.square, tasks + [{"id": "t6", "x": 6}], ray_address=cluster, out=tmp_path, retries=1, timeout_s=60
    )
    assert [r.get("resumed", False) for r in again] == [True] * 6 + [False]
    assert again[6]["result"]["square"] == 36 and len(list(tmp_path.iterdir())) == 7


def test_keyword_tasks_call_a_function_of_several_arguments(cluster, tmp_path):
    tasks = [
        {"id": f"m{i}", "kwargs": {"mutant": {"id": f"m{i}"}, "budget": 60.0, "options": {"kill": i % 2 == 0}}}
        for i in range(3)
    ]
    results = run_tasks(T.run_like_a_mutant, tasks, ray_address=cluster, out=tmp_path, timeout_s=60)
    assert [r["result"] for r in results] == [
        {"mutant": f"m{i}", "budget": 60.0, "killed": i % 2 == 0} for i in range(3)
    ]


def test_a_worker_killed_mid_task_is_retried_and_counted_once(cluster, tmp_path, capfd):
    pids, out, killed = tmp_path / "pids", tmp_path / "results", []
    pids.mkdir()
    killer = _kill_when_written(pids / "k1.0.pid", pids / "release", killed)
    tasks = [{"id": f"k{i}", "dir": str(pids), "wait_s": 60} for i in range(3)]
    results = run_tasks(T.record_pid_and_wait, tasks, ray_address=cluster, out=out, retries=2, timeout_s=90)
    killer.join(5)
    assert len(killed) == 1, "the first attempt of k1 should have been killed"
    by_id = {r["id"]: r for r in results}
    assert [r["status"] for r in results] == ["ok"] * 3
    # k1 ran twice (attempt 0 killed, attempt 1 finished) on another worker process
    assert sorted(p.name for p in pids.glob("k1.*.pid")) == ["k1.0.pid", "k1.1.pid"]
    assert by_id["k1"]["attempt"] == 1 and by_id["k1"]["result"]["attempts_seen"] == 2
    assert by_id["k1"]["pid"] != killed[0]
    # the others ran once; one result file per task, nothing lost, nothing twice
    assert [by_id[k]["attempt"] for k in ("k0", "k2")] == [0, 0]
    assert sorted(p.name for p in out.iterdir()) == ["k0.json", "k1.json", "k2.json"]
    # Ray's word about the dead worker goes to stderr, never into stdout (kvspec's JSON)
    time.sleep(1.5)
    assert "(raylet)" not in capfd.readouterr().out


def test_a_task_whose_worker_dies_past_its_retries_is_lost_not_missing(cluster, tmp_path):
    pids, killed = tmp_path / "pids", []
    pids.mkdir()
    killer = _kill_when_written(pids / "k.0.pid", pids / "release", killed)
    (result,) = run_tasks(
        T.record_pid_and_wait,
        [{"id": "k", "dir": str(pids), "wait_s": 60}],
        ray_address=cluster,
        out=tmp_path / "r",
        retries=0,
        timeout_s=60,
    )
    killer.join(5)
    assert killed and result["status"] == "lost" and result["error"].startswith("WorkerCrashedError after 0 retries")
    assert json.loads((tmp_path / "r" / "k.json").read_text())["status"] == "lost"


def test_a_task_that_raises_a_harness_error_is_not_retried(cluster, tmp_path):
    (result,) = run_tasks(
        T.harness_error,
        [{"id": "h", "dir": str(tmp_path)}],
        ray_address=cluster,
        out=tmp_path / "r",
        retries=3,
        timeout_s=60,
    )
    assert (result["status"], result["error_type"], result["attempt"]) == ("error", "EngineError", 0)
    assert result["error"] == "engine=vllm==9.9.9: worker did not start (test h)"
    assert len(list(tmp_path.glob("h.*.run"))) == 1


def test_the_deadline_bounds_every_wait(cluster, tmp_path):
    start = time.monotonic()
    results = run_tasks(
        T.sleep,
        [{"id": "long", "seconds": 120}, {"id": "short", "seconds": 0.1}],
        ray_address=cluster,
        out=tmp_path,
        timeout_s=4,
    )
    assert time.monotonic() - start < 15
    assert [(r["id"], r["status"]) for r in results] == [("long", "timeout"), ("short", "ok")]


# ------------------------------------------------------------------ without Ray


def test_here_inline_and_in_a_child_process(tmp_path):
    tasks = [{"id": f"t{i}", "x": i} for i in range(3)]
    inline = run_tasks(T.square, tasks, ray_address=None, out=tmp_path / "inline", timeout_s=30)
    assert [(r["status"], r["mode"], r["result"]["pid"]) for r in inline] == [("ok", "inline", os.getpid())] * 3
    pids, killed = tmp_path / "pids", []
    pids.mkdir()
    killer = _kill_when_written(pids / "k0.0.pid", pids / "release", killed)
    (child,) = run_tasks(
        T.record_pid_and_wait,
        [{"id": "k0", "dir": str(pids), "wait_s": 30}],
        ray_address=None,
        out=tmp_path / "child",
        timeout_s=60,
        local="process",
    )
    killer.join(5)
    assert killed and (child["status"], child["mode"], child["attempt"]) == ("ok", "process", 1)
    assert child["pid"] not in (os.getpid(), killed[0])


def test_bad_arguments_are_one_line(tmp_path, monkeypatch):
    with pytest.raises(InvalidArgument, match=r"^fn=.*must be a top-level function"):
        run_tasks(lambda t: t, [{"id": "a"}], ray_address=None, out=tmp_path, timeout_s=1)
    with pytest.raises(InvalidArgument, match=r"^tasks\[1\]\.id='a': must be unique"):
        run_tasks(T.square, [{"id": "a", "x": 1}, {"id": "a", "x": 2}], ray_address=None, out=tmp_path, timeout_s=1)
    start = time.monotonic()
    with pytest.raises(InvalidArgument, match=r"^--ray='127\.0\.0\.1:1': must be a reachable Ray cluster"):
        resolve_address("127.0.0.1:1")
    assert time.monotonic() - start < 10
    monkeypatch.setenv("KVSPEC_HOME", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(InvalidArgument, match=r"^--ray='auto': no running cluster found"):
        resolve_address("auto")
    with pytest.raises(InvalidArgument, match=rf"at most {MAX_TEMP_DIR} bytes; set KVSPEC_HOME to a shorter folder$"):
        check_temp_dir(Path("/" + "d" * MAX_TEMP_DIR))


# ------------------------------------------------------------------ kvspec fuzz --ray


@pytest.mark.engine
def test_fuzz_on_ray_finds_53504_once_in_one_folder(cluster, tmp_path):
    from tests.engine.conftest import ensure_env

    ensure_env("0.29.0")
    out = tmp_path / "findings"
    # two workers (seeds 1 and 2) run #53504's deployment on vLLM 0.29.0:
    # both find the same bugs; the folder keeps one file per signature
    cmd = [
        sys.executable,
        "-m",
        "kvspec.cli",
        "fuzz",
        "--engine",
        "vllm==0.29.0",
        "--driver",
        "cases",
        "--case",
        str(ROOT / "examples" / "seed-53504-deployment.json"),
        "--no-z3-seeds",
        "--jobs",
        "2",
        "--ray",
        cluster,
        "--max-time",
        "240",
        "--out",
        str(out),
        "--json",
    ]
    # ends when both workers have run the case (~100 s: two vLLM start-ups on 2 cores); --max-time is the bound
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=330)
    assert done.returncode == 1, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert [(t["id"], t["status"], t["attempt"]) for t in summary["ray_tasks"]] == [
        ("job-0", "ok", 0),
        ("job-1", "ok", 0),
    ]
    # each worker finds the bug: it reports it, or, where the other worker
    # wrote it first into the shared folder (a campaign starts by taking the
    # folder's signatures as seen), counts it as a duplicate
    assert all(t["findings_reported"] + t["duplicates"] >= 1 for t in summary["ray_tasks"]), summary["ray_tasks"]
    assert sum(t["findings_reported"] for t in summary["ray_tasks"]) >= 1, summary["ray_tasks"]
    assert summary["workers_died"] == 0 and summary["harness_errors"] == 0 and summary["execs"] > 0
    assert (
        summary["case_files"]["given"] == summary["case_files"]["run"] == 1
        and summary["case_files"]["unfinished"] == []
    )
    files = sorted(out.glob("*.json"))
    paths = [f["path"] for f in summary["findings"]]
    assert len(paths) == len(set(paths)) == len(files) >= 1
    signatures = [json.loads(p.read_text())["signature"] for p in files]
    assert len(signatures) == len(set(signatures))
    resend = [c for c in summary["classes"] if (c["oracle"], c["request_kind"]) == ("promise", "resend")]
    assert resend and resend[0]["count"] == 1 and "hit 0, spec says 1600" in resend[0]["representative"]["summary"]
    assert sum(c["count"] for c in summary["classes"]) == len(files)
    assert sorted(p.name for p in (out / "ray-tasks").iterdir().__next__().iterdir()) == ["job-0.json", "job-1.json"]
    assert "kvspec fuzz: exit 1:" in done.stderr


@pytest.mark.engine
def test_fuzz_with_an_unreachable_ray_address_is_one_line_exit_2(tmp_path):
    from tests.engine.conftest import ensure_env

    ensure_env("0.29.0")
    start = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvspec.cli",
            "fuzz",
            "--engine",
            "vllm==0.29.0",
            "--driver",
            "cases",
            "--no-z3-seeds",
            "--case",
            str(ROOT / "examples" / "seed-53504.json"),
            "--ray",
            "127.0.0.1:1",
            "--max-time",
            "30",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.strip().splitlines()[-1]
        == "kvspec: --ray='127.0.0.1:1': must be a reachable Ray cluster: 127.0.0.1:1 did not answer within 5 s (ConnectionRefusedError)"
    )
    assert time.monotonic() - start < 45
