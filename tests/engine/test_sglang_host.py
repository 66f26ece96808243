"""The host side of the SGLang family, engine-free: its environment's
names and process environment, its row in ``kvspec engines list``, the
torchvision stand-in its driver installs, and the CLI refusing a case of
one family on the other's engine before any engine work."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from engine_adapter.host import environments
from ground.home import REPO_ROOT


def test_sglang_environment_names_and_process_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSPEC_HOME", str(tmp_path))
    v = "sglang==0.5.23"
    assert (
        environments.env_dir(v).name == "sglang-0.5.23"
        and environments.requirements_file(v).name == "sglang-0.5.23.txt"
    )
    assert environments.requirements_file(v).is_file()
    assert environments.env_dir("0.33.0").name == "vllm-0.33.0"  # vLLM's names unchanged
    env = environments.worker_env(v)
    assert (
        env["PYTHONPATH"] == str(REPO_ROOT) and env["KVSPEC_TORCHVISION_STUB"] == "0"
    )  # the driver brings its own stand-in
    assert environments.worker_env("0.33.0")["KVSPEC_TORCHVISION_STUB"] == "1"
    rows = {r["engine"]: r for r in environments.list_engines()}
    assert rows[v]["state"] == "missing" and "vllm==0.33.0" in rows


def test_the_lock_pins_every_package_and_names_no_cuda_build():
    lines = [
        x.strip()
        for x in environments.requirements_file("sglang==0.5.23").read_text().splitlines()
        if x.strip() and not x.startswith("#")
    ]
    assert "sglang==0.5.23" in lines and "torch==2.13.0+cpu" in lines
    assert all("==" in x for x in lines), [x for x in lines if "==" not in x]
    assert not any(x.split("==")[0].lower().startswith(("nvidia-", "torchvision")) for x in lines)


@pytest.fixture
def stubbed():
    """The stand-in installed in this interpreter, removed afterwards."""
    from engine_adapter.sglang_engine import stubs

    before = {k: v for k, v in sys.modules.items() if k == "torchvision" or k.startswith("torchvision.")}
    had = importlib.util.find_spec("torchvision") is not None and not isinstance(
        sys.modules.get("torchvision"), stubs.StubModule
    )
    stubs.install()
    yield stubs, had
    sys.meta_path[:] = [f for f in sys.meta_path if f is not stubs._FINDER]
    for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
        del sys.modules[k]
    sys.modules.update(before)


def test_the_torchvision_stand_in_names_but_never_runs(stubbed):
    stubs, had_real = stubbed
    if had_real:
        pytest.fail(
            "a real torchvision is importable in kvspec's interpreter; the stand-in must be tested where SGLang runs, without one"
        )
    import torchvision.transforms as T
    from torchvision.transforms.functional import InterpolationMode

    assert (
        isinstance(T, stubs.StubModule)
        and InterpolationMode.BICUBIC.__name__ == "torchvision.transforms.functional.InterpolationMode.BICUBIC"
    )

    class Uses(T.Compose):  # a class body may name a stub as its base
        pass

    with pytest.raises(stubs.TorchvisionStubCalled, match=r"torchvision.transforms.Resize\(\.\.\.\) was called"):
        T.Resize((8, 8))
    assert Uses.__mro__[-1] is object


def test_a_case_of_one_family_is_refused_on_the_other_before_any_engine():
    for case, engine in (
        ("examples/sglang-grid-resend-qwen3_next.json", "vllm==0.33.0"),
        ("examples/seed-53504.json", "sglang==0.5.23"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "kvspec.cli", "run", case, "--engine", engine],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO_ROOT,
        )
        assert (
            proc.returncode == 2
            and f"--engine='{engine}'" in proc.stderr
            and len(proc.stderr.strip().splitlines()) == 1
        ), proc.stderr[-400:]
