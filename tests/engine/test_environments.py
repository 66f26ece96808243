"""Engine environments: idempotent, atomic, contained in KVSPEC_HOME."""

from __future__ import annotations

import json
import time

import pytest

from engine_adapter.host import environments
from ground.errors import EngineError
from ground.home import kvspec_home
from tests.engine.conftest import ensure_env


def test_status_states(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSPEC_HOME", str(tmp_path))
    assert environments.status("0.30.0")["state"] == "missing"
    d = environments.env_dir("0.30.0")
    (d / "bin").mkdir(parents=True)
    (d / "bin" / "python").write_text("")
    assert environments.status("0.30.0")["state"] == "incomplete"  # no marker: never ready
    assert not environments.is_ready("0.30.0")
    environments.marker_path("0.30.0").write_text(json.dumps({"fingerprint": "0" * 64}))
    assert environments.status("0.30.0")["state"] == "stale"  # built from another lock
    environments.marker_path("0.30.0").write_text(json.dumps({"fingerprint": environments.fingerprint("0.30.0")}))
    assert environments.status("0.30.0")["state"] == "ready"


def test_requirement_files_are_locks():
    for v in ("0.29.0", "0.30.0", "0.33.0"):
        lines = [
            x.strip()
            for x in environments.requirements_file(v).read_text().splitlines()
            if x.strip() and not x.startswith("#")
        ]
        assert lines[0] == "torch==2.13.0+cpu"  # the CPU build, never an unpinned torch
        assert f"vllm=={v}" in lines
        assert all("==" in x for x in lines), [x for x in lines if "==" not in x]
        names = {x.split("==")[0].lower() for x in lines}
        assert "triton" not in names and not any(n.startswith("nvidia") for n in names)
        assert {"xgrammar", "transformers", "pydantic", "msgspec"} <= names


@pytest.mark.engine
def test_failed_install_leaves_nothing_that_looks_ready(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSPEC_HOME", str(tmp_path / "home"))
    reqs = tmp_path / "reqs"
    reqs.mkdir()
    (reqs / "vllm-0.30.0.txt").write_text("kvspec-no-such-package-for-tests==0.0.1\n")
    monkeypatch.setattr(environments, "REQUIREMENTS_DIR", reqs)
    lines = []
    with pytest.raises(
        EngineError, match=r"^\[vllm==0.30.0\] `(python -m pip install|uv pip install --python) \.\.\.` failed"
    ):
        environments.install("0.30.0", progress=lines.append)
    assert any("step 2/3" in x for x in lines)
    assert not environments.env_dir("0.30.0").exists()
    assert environments.status("0.30.0")["state"] == "missing"
    assert not environments.is_ready("0.30.0")


@pytest.mark.engine
def test_install_is_idempotent_and_contained():
    ensure_env("0.33.0")
    before = environments.read_marker("0.33.0")
    lines = []
    t = time.monotonic()
    marker = environments.install("0.33.0", progress=lines.append)
    assert time.monotonic() - t < 10
    assert marker == before
    assert lines and "ready at" in lines[-1]
    env = environments.env_dir("0.33.0")
    assert env.is_relative_to(kvspec_home())
    assert marker["selftest"]["torch_version"].endswith("+cpu")
    # vLLM's inspection cache was written inside kvspec's home, per version
    assert (kvspec_home() / "cache" / "vllm-0.33.0" / "modelinfos").is_dir()
    rows = {r["engine"]: r for r in environments.list_engines()}
    assert rows["vllm==0.33.0"]["state"] == "ready"
