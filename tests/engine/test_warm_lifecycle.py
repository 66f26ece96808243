"""Warm engines' lifecycle (engine_adapter.host.warm), on a stand-in driver.

The server here is the real ``python -m engine_adapter.inside.worker --socket``
loop with a stand-in for ``engine_adapter.vllm_engine.driver`` (no vLLM: it echoes the
case, sleeps or dies when asked), so start, reuse, idle exit, stale files,
a changed fingerprint, concurrency, time-outs and crashes are checked in
seconds. tests/engine/test_warm.py runs the real engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine_adapter import sockets
from engine_adapter.host import warm, warm_state
from engine_adapter.host.warm import Paths, WarmClient
from ground.errors import InvalidArgument
from ground.home import REPO_ROOT

STAND_IN = r"""
import os, sys, time, types
sys.path.insert(0, os.environ["KVSPEC_TEST_REPO"])
class Driver:
    version = "0.33.0"
    def run(self, case, options):
        options = options or {}
        if options.get("die"):
            os._exit(3)
        t0 = time.time()
        if options.get("open"):  # as vLLM opens a `--config` file: a FIFO blocks here
            open(options["open"]).read()
        if options.get("gil"):  # a C call that never lets another thread run
            import re; re.match(r"(a+)+$", "a" * 64 + "b")
        time.sleep(float(options.get("sleep", 0)))
        return {"engine": "vllm==0.33.0", "hits": [len(case["trace"])], "queries": [], "knobs": {}, "explain": [],
                "name": case.get("name"), "pid": os.getpid(), "t": [t0, time.time()], "harness": {"platform": "cuda"},
                "env": os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN")}
    def resolve(self, case):
        return {"pid": os.getpid()}
fake = types.ModuleType("engine_adapter.vllm_engine.driver")
fake.get_driver = lambda: Driver()
sys.modules["engine_adapter.vllm_engine.driver"] = fake
from engine_adapter.inside.worker import main
sys.exit(main(sys.argv[3:]))
"""


@pytest.fixture
def stand_in(tmp_path):
    """A ``python`` for WarmClient that runs the worker with the stand-in driver."""
    os.environ["KVSPEC_TEST_REPO"] = str(REPO_ROOT)  # before any Paths.of: part of the engines' identity
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -c '{STAND_IN}' \"$@\"\n")
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "warm"
    yield d
    warm.stop(directory=d)


def case(name="c", n=1) -> dict:
    return {
        "schema": 1,
        "name": name,
        "geometry": {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16}]},
        "trace": [{"prompt": [{"segment": "A", "length": 32}]}] * n,
    }


def client(stand_in, folder, **kw) -> WarmClient:
    os.environ["KVSPEC_TEST_REPO"] = str(REPO_ROOT)
    kw.setdefault("start_timeout", 60)
    return WarmClient("0.33.0", "cuda", python=stand_in, directory=folder, **kw)


def run(c: WarmClient, timeout=60, **options) -> dict:
    return c.request("run", timeout, case=case(), options=options)


def wait_gone(pid: int, seconds: float = 15) -> bool:
    """Until the process has exited and closed its socket (gone, or a zombie with no thread left)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if warm_state._exited(pid):
            return True
        time.sleep(0.05)
    return False


def test_started_once_reused_listed_and_stopped(stand_in, folder):
    first = run(client(stand_in, folder))
    assert first["ok"], first
    pid = first["result"]["pid"]
    again = run(client(stand_in, folder))  # another client, as a later command
    assert again["ok"] and again["result"]["pid"] == pid
    paths = Paths.of("0.33.0", "cuda", folder)
    assert stat.S_IMODE(os.stat(paths.sock).st_mode) == 0o600 and stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    (row,) = warm.list_warm(folder)
    assert (
        row["pid"] == pid
        and row["engine"] == "vllm==0.33.0"
        and row["platform"] == "cuda"
        and 0 < row["idle_left_s"] <= row["idle_timeout_s"]
    )
    (gone,) = warm.stop(directory=folder)
    assert gone["pid"] == pid and gone["how"] == "shutdown"
    assert wait_gone(pid) and not paths.sock.exists() and not paths.state.exists()
    assert warm.list_warm(folder) == []


def test_exits_by_itself_after_its_idle_timeout(stand_in, folder):
    c = client(stand_in, folder, idle_timeout=1.0)
    pid = run(c)["result"]["pid"]
    paths = Paths.of("0.33.0", "cuda", folder)
    assert wait_gone(pid, 20)
    assert not paths.sock.exists() and not paths.state.exists()
    assert run(c)["result"]["pid"] != pid  # the next request starts a fresh one


def test_a_stale_socket_and_a_dead_pid_are_cleaned(stand_in, folder):
    paths = Paths.of("0.33.0", "cuda", folder)
    folder.mkdir(mode=0o700)
    dead = subprocess.Popen(["true"])
    dead.wait()
    s = socket.socket(socket.AF_UNIX)
    with sockets.address(
        paths.sock
    ) as address:  # a deep tmp_path (the engine's name carries its environment) passes 107 bytes
        s.bind(address)  # a socket file nobody listens on
    s.close()
    paths.state.write_text(
        json.dumps(
            {
                "pid": dead.pid,
                "version": "0.33.0",
                "platform": "cuda",
                "fingerprint": "x",
                "socket_inode": os.stat(paths.sock).st_ino,
            }
        )
    )
    assert warm.list_warm(folder) == []  # a dead server is not listed (its state is removed)
    out = run(client(stand_in, folder))
    assert out["ok"] and out["result"]["pid"] != dead.pid
    assert json.loads(paths.state.read_text())["pid"] == out["result"]["pid"]


def test_other_sources_make_the_client_start_a_fresh_server(stand_in, folder):
    old = client(stand_in, folder)
    old.fingerprint = "0" * 64  # as if kvspec's sources or the environment had changed since
    old_pid = run(old)["result"]["pid"]
    new = client(stand_in, folder)
    assert new.fingerprint != old.fingerprint
    out = run(new)
    assert out["ok"] and out["result"]["pid"] != old_pid
    assert wait_gone(old_pid)  # the old one saw its socket taken over and left
    assert json.loads(Paths.of("0.33.0", "cuda", folder).state.read_text())["fingerprint"] == new.fingerprint


def test_concurrent_clients_are_served_one_at_a_time(stand_in, folder):
    run(client(stand_in, folder))  # started
    results: dict[int, dict] = {}

    def go(i: int) -> None:
        c = client(stand_in, folder)
        results[i] = c.request("run", 60, case=case(f"c{i}", n=i + 1), options={"sleep": 0.3})

    threads = [threading.Thread(target=go, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [0, 1, 2]
    for i, r in results.items():
        assert r["ok"] and r["result"]["name"] == f"c{i}" and r["result"]["hits"] == [i + 1]
    spans = sorted(r["result"]["t"] for r in results.values())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # never two at once


def test_a_request_past_its_time_limit_kills_the_server(stand_in, folder):
    c = client(stand_in, folder)
    pid = run(c)["result"]["pid"]
    out = run(c, timeout=1.0, sleep=30)
    assert not out["ok"] and out["error"]["kind"] == "worker" and "timed out" in out["error"]["message"]
    assert wait_gone(pid)
    assert run(c)["result"]["pid"] != pid


def test_a_server_that_dies_mid_request_is_a_worker_error_then_replaced(stand_in, folder):
    c = client(stand_in, folder)
    pid = run(c)["result"]["pid"]
    out = run(c, die=True)
    assert not out["ok"] and out["error"]["kind"] == "worker"
    assert wait_gone(pid)
    again = run(c)
    assert again["ok"], again


def test_a_deep_kvspec_home_still_fits_a_unix_socket_address(stand_in, tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "warm"
    try:
        out = run(client(stand_in, deep))
        assert out["ok"] and len(str(Paths.of("0.33.0", "cuda", deep).sock)) > 108
    finally:
        warm.stop(directory=deep)


def test_kvspec_warm_0_opens_a_worker_of_its_own(monkeypatch):
    from engine_adapter.host import environments
    from engine_adapter.host.engine import WarmEngine, WorkerEngine, open_engine

    if not environments.is_ready("0.33.0"):
        pytest.skip("vllm==0.33.0 not installed")
    monkeypatch.delenv("KVSPEC_WARM", raising=False)
    assert warm.enabled() and isinstance(open_engine("vllm==0.33.0", warm=warm.enabled()), WarmEngine)
    assert isinstance(open_engine("vllm==0.33.0"), WorkerEngine)  # the library default: campaigns keep their own
    monkeypatch.setenv("KVSPEC_WARM", "0")
    assert not warm.enabled() and isinstance(open_engine("vllm==0.33.0", warm=warm.enabled()), WorkerEngine)


def test_a_bad_idle_timeout_is_one_line(monkeypatch):
    monkeypatch.setenv("KVSPEC_WARM_IDLE_S", "nan")
    with pytest.raises(InvalidArgument, match="KVSPEC_WARM_IDLE_S='nan': must be a finite number of seconds"):
        warm.idle_timeout_default()
    monkeypatch.setenv("KVSPEC_WARM_IDLE_S", "30")
    assert warm.idle_timeout_default() == 30.0


def test_a_zombie_leader_whose_thread_still_runs_has_not_exited():
    """The leader of a multithreaded process shows ``Z`` while another thread
    still holds its files (a listening socket accepts, then resets); only a
    zombie with no thread left has exited."""
    code = (
        "import ctypes, os, socket, sys, threading, time\n"
        "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(8)\n"
        "threading.Thread(target=lambda: (time.sleep(3), os._exit(0))).start()\n"
        "ctypes.CDLL(None).pthread_exit(None)\n"
    )
    path = f"/tmp/kvspec-zombie-{os.getpid()}.sock"
    proc = subprocess.Popen([sys.executable, "-c", code, path])
    try:
        end = time.monotonic() + 10
        while warm_state._proc_state(proc.pid) != "Z" and time.monotonic() < end:
            time.sleep(0.01)
        assert warm_state._proc_state(proc.pid) == "Z" and len(os.listdir(f"/proc/{proc.pid}/task")) == 2
        assert not warm_state._exited(proc.pid)
        sockets.connect(Path(path), 1.0).close()  # its socket still accepts
        assert wait_gone(proc.pid, 10) and proc.wait(5) == 0
    finally:
        proc.kill()
        proc.wait(5)
        with contextlib.suppress(OSError):
            os.unlink(path)
