"""A shared warm engine that one command cannot wedge, kill for another, or
lend its environment to (issue 29), on the stand-in warm engine of
tests/engine/test_warm_lifecycle.py (the real worker loop, a named test
double for vLLM's driver) with real processes; the real 0.33.0 engine in
the one ``engine``-marked test at the end.

* a request past its own bound costs its engine, not the next command: the
  next one gets a fresh engine within its own time and says so;
* a queued client never kills the engine busy with another command's
  request: it gives up its own wait, or starts a fresh engine and says so;
* the environment is part of the engine's identity;
* ``KVSPEC_WARM_DIR`` is never chmod-ed; a shared or foreign folder gets a
  private subfolder, a doubtful one is refused in one line;
* a ``--config`` file is read by the client, regular files only.
"""

from __future__ import annotations

import json
import os
import signal
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
from engine_adapter.inside import warm_server
from ground.errors import InvalidArgument
from ground.home import REPO_ROOT
from tests.engine.test_warm_lifecycle import case, folder, stand_in, wait_gone  # noqa: F401 - fixtures

__all__ = ["folder", "stand_in"]


def client(stand_in, folder, said=None, **kw) -> WarmClient:
    kw.setdefault("start_timeout", 60)
    return WarmClient(
        "0.33.0", "cuda", python=stand_in, directory=folder, say=(said.append if said is not None else None), **kw
    )


def run(c: WarmClient, timeout=60, **options) -> dict:
    return c.request("run", timeout, case=case(), options=options)


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "config.yaml"
    os.mkfifo(path)
    return path


def in_thread(fn):
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn()), daemon=True)
    t.start()
    return t, out


# ------------------------------------------------------------------ wedge and queue


def test_a_wedged_request_costs_its_engine_and_the_next_command_gets_a_fresh_one(stand_in, folder, fifo, tmp_path):
    """A client whose request blocks on a FIFO is killed (it can no longer
    kill anything); its request's bound (3 s) ends the engine; the next
    command, queued behind it, gets a fresh engine well within its own time,
    and says so."""
    pid = run(client(stand_in, folder))["result"]["pid"]
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from engine_adapter.host.warm import WarmClient\n"
        "from tests.engine.test_warm_lifecycle import case\n"
        "c = WarmClient('0.33.0', 'cuda', python=sys.argv[2], directory=__import__('pathlib').Path(sys.argv[3]))\n"
        "print('sent', flush=True); c.request('run', 3.0, case=case(), options={'open': sys.argv[4]})\n"
    )
    wedger = subprocess.Popen(
        [sys.executable, "-c", code, str(REPO_ROOT), stand_in, str(folder), str(fifo)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        assert wedger.stdout.readline().strip() == "sent"
        time.sleep(1.0)  # its request has begun on the engine
        wedger.kill()  # no client left to kill the engine: only its bound does
        wedger.wait(10)
        said: list[str] = []
        t0 = time.monotonic()
        out = run(client(stand_in, folder, said, queue_wait=10.0), timeout=30)
        wall = time.monotonic() - t0
    finally:
        wedger.kill()
        wedger.wait(10)
    assert out["ok"], out
    assert out["result"]["pid"] != pid and wall < 15, (wall, out)
    assert wait_gone(pid)
    assert said == [
        "kvspec: the warm engine vllm==0.33.0 was killed (a request ran past its time limit); started a fresh one"
    ], said


def test_a_queued_client_with_a_short_timeout_never_kills_the_busy_engine(stand_in, folder):
    first = client(stand_in, folder)
    pid = run(first)["result"]["pid"]
    t, busy = in_thread(lambda: run(first, timeout=30, sleep=4))
    time.sleep(0.5)
    said: list[str] = []
    t0 = time.monotonic()
    out = run(client(stand_in, folder, said), timeout=1.0)
    assert time.monotonic() - t0 < 3
    assert not out["ok"] and "busy with another command's request (left running)" in out["error"]["message"], out
    t.join(30)
    assert busy["r"]["ok"] and busy["r"]["result"]["pid"] == pid, busy  # the healthy run finished
    assert run(first)["result"]["pid"] == pid and said == []  # and its engine still serves


def test_a_queued_client_with_time_left_starts_a_fresh_engine_and_says_so(stand_in, folder):
    first = client(stand_in, folder)
    pid = run(first)["result"]["pid"]
    t, busy = in_thread(lambda: run(first, timeout=60, sleep=5))
    time.sleep(0.5)
    said: list[str] = []
    out = run(client(stand_in, folder, said, queue_wait=1.0), timeout=30)
    assert out["ok"] and out["result"]["pid"] != pid, out
    assert said == ["kvspec: the warm engine vllm==0.33.0 is busy with another command; started a fresh one"]
    t.join(30)
    assert busy["r"]["ok"] and busy["r"]["result"]["pid"] == pid, busy  # not killed: it finished, then left
    assert wait_gone(pid)
    assert json.loads(Paths.of("0.33.0", "cuda", folder).state.read_text())["pid"] == out["result"]["pid"]


def test_the_server_skips_a_request_whose_client_gave_up_in_the_queue(stand_in, folder):
    first = client(stand_in, folder)
    pid = run(first)["result"]["pid"]
    t, busy = in_thread(lambda: run(first, timeout=30, sleep=2))
    time.sleep(0.3)
    gave_up = run(client(stand_in, folder), timeout=0.5, sleep=3)  # queued, gives up
    assert not gave_up["ok"]
    t.join(30)
    t0 = time.monotonic()
    out = run(first, timeout=30)
    assert out["ok"] and out["result"]["pid"] == pid  # the same engine, not killed
    assert time.monotonic() - t0 < 2  # and the abandoned 3 s request never ran on it


def test_a_request_bound_that_is_not_a_number_is_a_protocol_error(stand_in, folder):
    c = client(stand_in, folder)
    run(c)
    sock = sockets.connect(c.paths.sock, 5)
    try:
        sockets.send_line(sock, b'{"id": 1, "op": "ping", "timeout_s": "NaN"}\n', time.monotonic() + 5)
        resp = json.loads(sockets.read_line(sock, time.monotonic() + 5))
    finally:
        sock.close()
    assert resp["error"]["kind"] == "protocol" and "timeout_s" in resp["error"]["message"]


# ------------------------------------------------------------------ identity


def test_a_different_environment_starts_and_uses_another_engine(stand_in, folder, monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    plain = run(client(stand_in, folder))["result"]
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    hinted_client = client(stand_in, folder)
    hinted = run(hinted_client)["result"]
    assert hinted["pid"] != plain["pid"] and hinted["env"] == "1" and plain["env"] is None
    monkeypatch.setenv("VLLM_API_KEY", "s3cr3t-do-not-print")
    secret = client(stand_in, folder)
    assert secret.paths.sock != hinted_client.paths.sock
    run(secret)
    for path in folder.iterdir():  # names and state hold a hash, never a value
        assert "s3cr3t" not in path.name
        if path.suffix == ".json":
            assert "s3cr3t" not in path.read_text()
    monkeypatch.delenv("VLLM_API_KEY")
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN")
    assert run(client(stand_in, folder))["result"]["pid"] == plain["pid"]  # each keeps its own
    assert {r["pid"] for r in warm.list_warm(folder)} >= {plain["pid"], hinted["pid"]}
    rows = warm.list_warm(folder)
    assert all(r["engine"] == "vllm==0.33.0" for r in rows) and len({r["env"] for r in rows}) == len(rows)


def test_the_warm_engines_own_settings_are_not_part_of_its_identity(monkeypatch):
    env = {"VLLM_X": "1", "KVSPEC_HOME": "/h", "PATH": "/bin", "TERM": "xterm"}
    base = warm.env_id(env)
    assert (
        warm.env_id({**env, "KVSPEC_WARM_IDLE_S": "5", "KVSPEC_WARM_DIR": "/x", "PATH": "/usr/bin", "TERM": "dumb"})
        == base
    )
    for key in (
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
        "KVSPEC_PLATFORM",
        "PYTHONPATH",
        "HF_HOME",
        "OMP_NUM_THREADS",
        "LD_PRELOAD",
    ):
        assert warm.env_id({**env, key: "1"}) != base, key


# ------------------------------------------------------------------ KVSPEC_WARM_DIR


def test_a_missing_folder_is_created_private(stand_in, tmp_path):
    d = tmp_path / "new" / "warm"
    try:
        assert run(client(stand_in, d))["ok"]
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700 and any(d.glob("vllm-*.sock"))
    finally:
        warm.stop(directory=d)


def test_a_private_existing_folder_keeps_its_mode(stand_in, tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    d.chmod(0o755)
    try:
        assert run(client(stand_in, d))["ok"]
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o755 and any(d.glob("vllm-*.sock"))
    finally:
        warm.stop(directory=d)


@pytest.mark.parametrize("mode, owner", [(0o1777, None), (0o775, None), (0o755, 65534)])
def test_a_shared_or_foreign_folder_is_never_chmodded_and_gets_a_private_subfolder(
    stand_in, tmp_path, monkeypatch, mode, owner
):
    d = tmp_path / "shared"
    d.mkdir()
    if owner is not None:
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(d, owner, owner)
    d.chmod(mode)
    monkeypatch.setenv("KVSPEC_WARM_DIR", str(d))
    try:
        out = run(client(stand_in, None))
        assert out["ok"], out
        assert stat.S_IMODE(os.stat(d).st_mode) == mode  # never chmod-ed
        sub = d / f"kvspec-warm-{os.geteuid()}"
        assert stat.S_IMODE(os.lstat(sub).st_mode) == 0o700 and any(sub.glob("vllm-*.sock"))
        assert not list(d.glob("vllm-*")) and [r["pid"] for r in warm.list_warm()] == [out["result"]["pid"]]
    finally:
        warm.stop()


@pytest.mark.parametrize("bad", ["symlink", "wide", "file"])
def test_a_doubtful_private_subfolder_is_refused_in_one_line(stand_in, tmp_path, monkeypatch, bad):
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o1777)
    sub = d / f"kvspec-warm-{os.geteuid()}"
    if bad == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        sub.symlink_to(tmp_path / "elsewhere")
    elif bad == "wide":
        sub.mkdir()
        sub.chmod(0o777)
    else:
        sub.write_text("")
    monkeypatch.setenv("KVSPEC_WARM_DIR", str(d))
    with pytest.raises(InvalidArgument) as e:
        run(client(stand_in, None))
    assert str(e.value).startswith(f"KVSPEC_WARM_DIR={str(d)!r}: ") and "\n" not in str(e.value)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o1777
    if bad == "wide":
        assert stat.S_IMODE(os.stat(sub).st_mode) == 0o777  # nor chmod-ed either


def test_engines_list_through_the_cli_says_a_doubtful_folder_in_one_line(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o1777)
    (d / f"kvspec-warm-{os.geteuid()}").symlink_to("/")
    proc = subprocess.run(
        [sys.executable, "-m", "kvspec.cli", "engines", "list"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KVSPEC_WARM_DIR": str(d)},
    )
    assert (
        proc.returncode == 2
        and proc.stderr.startswith("kvspec: KVSPEC_WARM_DIR=")
        and len(proc.stderr.strip().splitlines()) == 1
    ), proc.stderr


# ------------------------------------------------------------------ the real engine


@pytest.mark.engine
def test_the_command_after_a_wedged_real_warm_engine_gets_a_fresh_one_within_its_time(tmp_path):
    """The issue's case on the real 0.33.0 warm engine: ``--config`` naming a
    FIFO is refused before any engine sees it (exit 2, one line), and the
    warm engine keeps serving; then the engine is wedged outright (SIGSTOP:
    it answers no one and its own bound cannot fire, the worst case) and
    the next command gets a fresh engine within its own time, says so, and
    resolves the same. Prints the next command's wall time."""
    from tests.engine.conftest import ensure_env

    ensure_env("0.33.0")
    d = tmp_path / "warm"
    env = {**os.environ, "KVSPEC_WARM_DIR": str(d)}
    env.pop("KVSPEC_WARM", None)
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)

    def resolve(*flags, timeout=400):
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "kvspec.cli", "resolve", "--model", "qwen3_5", "--json", "--", *flags],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
        return proc, time.monotonic() - t0

    def serving() -> tuple[int, str]:
        (row,) = warm.list_warm(d)
        return row["pid"], json.loads(Path(row["socket"]).with_suffix(".json").read_text())["fingerprint"]

    first, _ = resolve()
    assert first.returncode == 0, first.stderr
    pid, fp = serving()
    hostile, hostile_s = resolve("--config", str(fifo), timeout=60)
    assert (
        hostile.returncode == 2
        and hostile.stderr.startswith("kvspec: deployment.vllm_args")
        and len(hostile.stderr.strip().splitlines()) == 1
    ), hostile.stderr
    again, again_s = resolve()
    assert again.returncode == 0, again.stderr
    now, now_fp = serving()
    assert (
        now == pid or now_fp != fp
    )  # the same engine serves (unless kvspec's sources changed meanwhile: a shared checkout)
    os.kill(now, signal.SIGSTOP)
    try:
        nxt, wall = resolve()
    finally:
        os.kill(now, signal.SIGKILL)
    print(
        f"\nthe --config FIFO command: {hostile_s:.1f}s (exit 2); the next command: {again_s:.1f}s; "
        f"the command after a wedged engine: {wall:.1f}s (queue wait {warm.QUEUE_WAIT_S:.0f}s + a fresh engine)"
    )
    assert nxt.returncode == 0, nxt.stderr
    assert "kvspec: the warm engine vllm==0.33.0 is busy with another command; started a fresh one" in nxt.stderr
    assert json.loads(nxt.stdout)["geometry"] == json.loads(first.stdout)["geometry"]
    assert wall < warm.QUEUE_WAIT_S + 180
    warm.stop(directory=d)


def test_a_request_that_holds_the_gil_past_its_bound_still_ends_its_engine(stand_in, folder):
    """The watchdog thread cannot run while a C call holds the GIL; the
    kernel's SIGALRM still ends the engine, and the next request gets a
    fresh one."""
    c = client(stand_in, folder)
    pid = run(c)["result"]["pid"]
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from engine_adapter.host.warm import WarmClient\n"
        "from tests.engine.test_warm_lifecycle import case\n"
        "c = WarmClient('0.33.0', 'cuda', python=sys.argv[2], directory=__import__('pathlib').Path(sys.argv[3]))\n"
        "print('sent', flush=True); c.request('run', 1.0, case=case(), options={'gil': True})\n"
    )
    hog = subprocess.Popen(
        [sys.executable, "-c", code, str(REPO_ROOT), stand_in, str(folder)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert hog.stdout.readline().strip() == "sent"
        time.sleep(0.5)
        hog.kill()  # its client gone: only the engine's own bound can end it
        hog.wait(10)
        assert wait_gone(pid, 1.0 + warm_server.OVERRUN_GRACE_S + warm_server.HARD_GRACE_S + 5)
    finally:
        hog.kill()
        hog.wait(10)
        if not warm_state._exited(pid):
            os.kill(pid, signal.SIGKILL)
    out = run(c, timeout=30)
    assert out["ok"] and out["result"]["pid"] != pid


# ------------------------------------------- issue 40 item 8: a cap, names


def test_at_most_kvspec_warm_max_engines_stay_resident_least_recently_used_goes(stand_in, folder, monkeypatch):
    """Three engines (three environments) with ``KVSPEC_WARM_MAX=2``: the
    third start stops the least recently used, saying so in one line."""
    monkeypatch.setenv("KVSPEC_WARM_MAX", "2")
    said: list[str] = []
    pids = []
    for value in ("a", "b", "c"):
        monkeypatch.setenv("VLLM_KVSPEC_TEST_CAP", value)  # another environment: another engine
        c = client(stand_in, folder, said)
        pids.append(run(c)["result"]["pid"])
        if value == "a":
            time.sleep(1.1)  # socket times a second apart: "a" is the least recently used
            run(c)
        if value == "b":
            time.sleep(1.1)
    live = {r["pid"] for r in warm.list_warm(folder)}
    assert len(set(pids)) == 3 and len(live) == 2
    assert pids[0] not in live and {pids[1], pids[2]} <= live
    assert any("stopped the warm engine vllm==0.33.0" in s and "KVSPEC_WARM_MAX" in s for s in said), said


@pytest.mark.parametrize("raw", ["0", "-1", "x", "65", "1e3"])
def test_a_bad_warm_max_is_one_line(raw, monkeypatch):
    monkeypatch.setenv("KVSPEC_WARM_MAX", raw)
    with pytest.raises(InvalidArgument, match=r"^KVSPEC_WARM_MAX=.*allowed: an integer in 1-64"):
        warm.max_warm()


def test_an_sglang_worker_is_listed_and_stopped_under_its_own_name(folder):
    """A warm SGLang worker's files (as ``WarmClient("sglang==0.5.23")``
    names them) with a test double process in its place (a sleeper whose
    command line names the worker and its socket): listed and stopped as
    ``sglang==0.5.23``, never ``vllm==sglang==0.5.23``."""
    import subprocess
    import sys

    base = warm_state.private_dir(folder, create=True) / "vllm-sglang==0.5.23-cpu-0123456789ab"
    paths = Paths.named(base)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(120)",
            "engine_adapter.inside.worker",
            "--socket",
            str(paths.sock),
        ]
    )
    try:
        for _ in range(100):  # until it has exec'd (its command line is the sleeper's)
            if str(paths.sock) in (warm_state._cmdline(proc.pid) or []):
                break
            time.sleep(0.05)
        paths.state.write_text(
            json.dumps(
                {
                    "pid": proc.pid,
                    "platform": "cpu",
                    "version": "0.5.23",
                    "fingerprint": "x",
                    "idle_timeout_s": 600,
                    "started": time.time(),
                }
            )
        )
        rows = warm.list_warm(folder)
        assert [r["engine"] for r in rows] == ["sglang==0.5.23"]
        stopped = warm.stop(directory=folder)
        assert [r["engine"] for r in stopped] == ["sglang==0.5.23"] and proc.wait(timeout=30) is not None
    finally:
        proc.kill()
        proc.wait(timeout=10)
