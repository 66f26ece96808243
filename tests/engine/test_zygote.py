"""Worker starts by fork (engine_adapter.host.zygote, engine_adapter.inside.zygote),
on a zygote that imports no engine and forks a test double of a worker
(tests/engine/zygote_child_double.py): what the child sees, its streams,
its exit code and a kill relayed as ``Popen`` would, refusals in one line,
and the zygote's own end. The engine side (a forked vLLM worker observes
what a plain one does) is tests/engine/test_warm.py's."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from engine_adapter.host import zygote
from ground.errors import EngineError
from ground.home import REPO_ROOT

DOUBLE = "tests.engine.zygote_child_double"


@pytest.fixture
def served(tmp_path):
    """A zygote of this interpreter (no engine imported) that may run the double."""
    sock = tmp_path / "z.sock"
    cmd = [sys.executable, "-m", "engine_adapter.inside.zygote", "--socket", str(sock), "--allow", DOUBLE]
    proc = subprocess.Popen(cmd + ["--idle-timeout", "30"], cwd=str(REPO_ROOT), stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("kvspec zygote ready")
    yield sock, proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def _fork(sock, mode, streams=zygote.PIPES):
    env = {**os.environ, "KVSPEC_DOUBLE": "asked-for"}
    return zygote.fork_from(sock, DOUBLE, [mode], env=env, streams=streams)


def test_a_forked_child_runs_with_the_requests_streams_environment_and_exit_code(served):
    sock, server = served
    os.environ.pop("KVSPEC_DOUBLE", None)
    child = _fork(sock, "echo")
    child.stdin.write("hello\n")
    seen = json.loads(child.stdout.readline())
    assert seen == {
        "line": "hello",
        "env": "asked-for",
        "cwd": str(REPO_ROOT),
        "own_session": False,
        "ppid": server.pid,
        "argv": ["echo"],
    }
    assert child.stderr.readline().strip() == "double on stderr"
    assert child.wait(timeout=20) == 7
    assert child.poll() == 7


def test_a_new_session_and_stderr_into_stdout_as_popen_gives_them(served):
    sock, _ = served
    child = _fork(sock, "echo", replace(zygote.PIPES, stderr=subprocess.STDOUT, new_session=True))
    child.stdin.write("x\n")
    lines = [child.stdout.readline(), child.stdout.readline()]
    assert lines[0].strip() == "double on stderr"
    assert json.loads(lines[1])["own_session"] is True
    assert child.wait(timeout=20) == 7


def test_a_killed_child_reports_minus_the_signal_and_wait_is_bounded(served):
    sock, _ = served
    child = _fork(sock, "sleep")
    assert child.stderr.readline().strip() == "double on stderr"
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.5)
    assert child.poll() is None
    child.kill()
    assert child.wait(timeout=20) == -signal.SIGKILL


def test_a_module_outside_the_allow_list_is_refused_in_one_line(served):
    sock, _ = served
    with pytest.raises(EngineError, match=r"module='os': one of engine_adapter\.inside\.worker, tests\.engine"):
        zygote.fork_from(sock, "os", [], env=dict(os.environ), streams=zygote.Streams())


def test_a_request_without_three_descriptors_or_not_json_is_answered_and_the_zygote_goes_on(served):
    sock, _ = served
    for raw in (b'{"op": "spawn", "module": "engine_adapter.inside.worker"}\n', b"not json\n"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(sock))
            s.settimeout(10)
            s.sendall(raw)
            assert "error" in json.loads(s.recv(4096).split(b"\n")[0])
    child = _fork(sock, "echo")
    child.stdin.write("still\n")
    assert json.loads(child.stdout.readline())["line"] == "still"
    assert child.wait(timeout=20) == 7


def test_stop_ends_the_zygote_once_its_children_are_gone(served):
    sock, server = served
    child = _fork(sock, "sleep")
    assert zygote.stop(sock)
    assert not sock.exists()  # the next client starts a fresh zygote
    time.sleep(0.5)
    assert server.poll() is None  # a child still lives
    child.kill()
    assert child.wait(timeout=20) == -signal.SIGKILL
    assert server.wait(timeout=20) == 0


def test_a_zygote_whose_socket_is_removed_exits_when_idle(served):
    sock, server = served
    assert sock.stat().st_mode & 0o777 == 0o600
    sock.unlink()
    assert server.wait(timeout=20) == 0


def test_settings_outside_their_range_are_one_line(monkeypatch):
    monkeypatch.setenv("KVSPEC_ZYGOTE_MAX", "0")
    with pytest.raises(Exception, match=r"KVSPEC_ZYGOTE_MAX='0'.*1 <= N <= 64"):
        zygote.max_zygotes()
    monkeypatch.setenv("KVSPEC_ZYGOTE_IDLE_S", "soon")
    with pytest.raises(Exception, match=r"KVSPEC_ZYGOTE_IDLE_S='soon'"):
        zygote.idle_timeout()
    monkeypatch.setenv("KVSPEC_ZYGOTE", "0")
    assert not zygote.enabled()


def test_stop_all_of_a_folder_that_was_never_made_makes_none(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSPEC_ZYGOTE_DIR", str(tmp_path / "never"))
    assert zygote.stop_all() == 0 and not (tmp_path / "never").exists()
