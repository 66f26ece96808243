"""Bad engine names and versions: one-line errors, no engine needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine_adapter.host.engine import open_engine
from engine_adapter.host.versions import parse_engine
from ground.errors import EngineError, InvalidArgument, Unsupported

ALLOWED = "allowed: vllm==0.29.0, vllm==0.30.0, vllm==0.32.0, vllm==0.33.0"


@pytest.mark.parametrize("name", ["vllm==0.33.0", "0.33.0", " vllm==0.29.0 "])
def test_good_names(name):
    assert parse_engine(name) in ("0.33.0", "0.29.0")


@pytest.mark.parametrize("name", ["vllm", "vllm>=0.33.0", "torch==2.13.0", "vllm==0.33", "", "vllm==0.33.0.post1"])
def test_malformed_names(name):
    with pytest.raises(InvalidArgument) as e:
        parse_engine(name)
    msg = str(e.value)
    assert msg == f"engine={name!r}: not an engine name of the form vllm==X.Y.Z; {ALLOWED}"
    assert "\n" not in msg


@pytest.mark.parametrize("name", ["vllm==0.31.0", "vllm==9.9.9", "0.28.0"])
def test_unsupported_versions(name):
    with pytest.raises(Unsupported, match=r"has no kvspec engine environment; allowed: vllm==0.29.0"):
        parse_engine(name)


def test_open_engine_rejects_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSPEC_HOME", str(tmp_path))
    with pytest.raises(Unsupported):
        open_engine("vllm==0.31.0")
    with pytest.raises(InvalidArgument, match=r"^mode='gpu': allowed: auto, inprocess, worker, warm$"):
        open_engine("vllm==0.33.0", mode="gpu")
    # a supported version whose environment is missing names the install command
    with pytest.raises(EngineError, match=r"environment missing at .*; run: kvspec engines install vllm==0.30.0$"):
        open_engine("vllm==0.30.0")
    # in-process needs that vLLM importable in this interpreter
    with pytest.raises(EngineError, match=r"in-process mode needs vLLM 0.30.0 importable here"):
        open_engine("vllm==0.30.0", mode="inprocess")
    assert not (tmp_path / "engines" / "vllm-0.30.0").exists()


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["run", "examples/seed-53504.json", "--engine", "vllm==0.31.0"], "kvspec: --engine='vllm==0.31.0': vLLM 0.31.0 has no kvspec engine environment"),
        (["run", "examples/seed-53504.json", "--engine", "sglang"], "kvspec: --engine='sglang': not an engine name of the form vllm==X.Y.Z"),
        (["engines", "install", "vllm==0.33.0", "vllm==1.0.0"], "kvspec: engine='vllm==1.0.0': vLLM 1.0.0 has no kvspec engine environment"),
        (["engines", "remove", "latest"], "kvspec: engine='latest': not an engine name"),
    ],
)
def test_cli_one_line_errors(argv, needle, tmp_path):
    import os

    from ground.home import REPO_ROOT

    env = dict(os.environ, KVSPEC_HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "kvspec.cli", *argv], capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith(needle), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "engines").exists() or not any((tmp_path / "engines").iterdir())
