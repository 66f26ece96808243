"""vLLM's tests on a mutant: a run that cannot start is kvspec's failure,
never a kill (mutate.vllm_tests.run_for_mutant, mutate.kill._put_vllm_tests).

The fresh-machine failure this pins: mutant builds made by a kvspec-only
pass had no pytest, and every later vLLM-tests pass "killed" all 40
mutants with ``No module named pytest``. TEST DOUBLES: the build's
interpreter is a shell script standing in for one without pytest, or
with a test that fails; no vLLM runs here."""

from __future__ import annotations

import json
import os
from pathlib import Path

import mutate.vllm_tests as vt
from mutate.kill import _needs_vllm_tests, _put_vllm_tests


def _sdist(tmp_path: Path) -> Path:
    sdist = tmp_path / "vllm-0.33.0"
    (sdist / "tests" / "v1" / "core").mkdir(parents=True)
    (sdist / "pyproject.toml").write_text("[tool.pytest.ini_options]\nmarkers = ['slow']\n")
    return sdist


def _python(tmp_path: Path, body: str) -> str:
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


def _base(sdist: Path) -> dict:
    return {
        "sdist": str(sdist),
        "files": {"tests/v1/core/test_x.py": {"seconds": 1.0, "tests": {"tests/v1/core/test_x.py::test_a": "passed"}}},
    }


def test_a_run_that_cannot_start_is_a_harness_failure_and_a_failing_test_a_kill(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSPEC_HOME", str(tmp_path / "home"))
    sdist = _sdist(tmp_path)
    monkeypatch.setattr(vt, "pytest_env", lambda version, root: dict(os.environ))
    monkeypatch.setattr("engine_adapter.host.testtools.ensure_pytest", lambda python, timeout=None: True)
    # no pytest in the build: exit 1, no test ran
    monkeypatch.setattr(vt, "_python", lambda engine: _python(tmp_path, 'echo "No module named pytest" >&2; exit 1\n'))
    res = vt.run_for_mutant(
        "vllm==0.33.0+m.000000", _base(sdist), ["tests/v1/core/test_x.py"], junit=tmp_path / "j.xml"
    )
    assert "killed" not in res and "No module named pytest" in res["harness"]
    # a test that fails: a kill, named
    junit = '<testsuite><testcase classname="tests.v1.core.test_x" name="test_a" file="tests/v1/core/test_x.py"><failure message="boom"/></testcase></testsuite>'
    body = (
        'for a in "$@"; do case "$a" in --junitxml=*) printf \'%s\' \''
        + junit
        + '\' > "${a#--junitxml=}";; esac; done; exit 1\n'
    )
    monkeypatch.setattr(vt, "_python", lambda engine: _python(tmp_path, body))
    res = vt.run_for_mutant(
        "vllm==0.33.0+m.000000", _base(sdist), ["tests/v1/core/test_x.py"], junit=tmp_path / "j.xml"
    )
    assert res["killed"] is True and res.get("killing_test")
    # pytest that cannot be installed
    monkeypatch.setattr("engine_adapter.host.testtools.ensure_pytest", lambda python, timeout=None: False)
    assert (
        "cannot install pytest"
        in vt.run_for_mutant(
            "vllm==0.33.0+m.000000", _base(sdist), ["tests/v1/core/test_x.py"], junit=tmp_path / "j.xml"
        )["harness"]
    )


def test_a_killing_test_the_base_cannot_run_is_no_verdict_on_the_base(tmp_path, monkeypatch):
    """run_one on the base: None when it cannot run there (no pytest: the
    base build of a fresh machine had none, so every real kill was set
    aside as 'fails on the base too'), True / False when it ran."""
    monkeypatch.setenv("KVSPEC_HOME", str(tmp_path / "home"))
    sdist = _sdist(tmp_path)
    monkeypatch.setattr(vt, "pytest_env", lambda version, root: dict(os.environ))
    node = "tests/v1/core/test_x.py::test_a"
    monkeypatch.setattr("engine_adapter.host.testtools.ensure_pytest", lambda python, timeout=None: False)
    assert vt.run_one("vllm==0.33.0+base.000000", _base(sdist), node) is None
    monkeypatch.setattr("engine_adapter.host.testtools.ensure_pytest", lambda python, timeout=None: True)
    monkeypatch.setattr(vt, "_python", lambda engine: _python(tmp_path, 'echo "No module named pytest" >&2; exit 1\n'))
    assert vt.run_one("vllm==0.33.0+base.000000", _base(sdist), node) is None
    monkeypatch.setattr(vt, "_python", lambda engine: _python(tmp_path, "exit 1\n"))
    assert vt.run_one("vllm==0.33.0+base.000000", _base(sdist), node) is False
    monkeypatch.setattr(vt, "_python", lambda engine: _python(tmp_path, "exit 0\n"))
    assert vt.run_one("vllm==0.33.0+base.000000", _base(sdist), node) is True


def test_a_harness_failure_leaves_vllm_tests_not_run_so_a_later_pass_runs_them():
    result = {"status": "ran", "vllm_tests": {"killed": True, "reason": "pytest exit 1: No module named pytest"}}
    _put_vllm_tests(result, {"harness": "engine=x: pytest exit 1: No module named pytest"})
    assert "vllm_tests" not in result and "No module named pytest" in result["vllm_tests_harness"]
    assert _needs_vllm_tests(result, {"vllm_tests": True})
    _put_vllm_tests(result, {"killed": False, "files": [], "seconds": 1.0})
    assert result["vllm_tests"]["killed"] is False and "vllm_tests_harness" not in result
    assert not _needs_vllm_tests(result, {"vllm_tests": True})
    assert json.dumps(result)


def test_a_baseline_file_that_timed_out_is_run_again_not_reused(tmp_path, monkeypatch):
    """baseline(): a file cut by kvspec's time limit is recorded (rc
    ``timeout``, no usable test) but not trusted from the cache: the next
    call runs it again. A run beside a busy test suite had cached a
    timed-out file, and every later run would have counted its tests as
    unusable. TEST DOUBLE: the release's interpreter is a shell script."""
    sdist = _sdist(tmp_path)
    f = "tests/v1/core/test_x.py"
    monkeypatch.setattr(vt, "sdist_root", lambda release: sdist)
    monkeypatch.setattr(vt, "test_files", lambda root: [f])
    monkeypatch.setattr(vt, "run_root", lambda s: sdist)
    monkeypatch.setattr(vt, "pytest_env", lambda version, root: dict(os.environ))
    monkeypatch.setattr(
        vt, "target_paths", lambda version: [str(tmp_path / "site-packages" / "vllm" / "v1" / "core" / "x.py")]
    )
    monkeypatch.setattr("engine_adapter.host.testtools.ensure_pytest", lambda python, timeout=None: True)
    monkeypatch.setattr("engine_adapter.host.testtools.ensure_coverage", lambda python, timeout=None: True)
    monkeypatch.setattr(vt, "FILE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(vt, "_python", lambda release: _python(tmp_path, "sleep 5\n"))
    first = vt.baseline("0.33.0", out=tmp_path / "base")
    assert first["files"][f]["rc"] == "timeout" and vt.usable(first, f) == []
    junit = '<testsuite><testcase classname="tests.v1.core.test_x" name="test_a" file="tests/v1/core/test_x.py"/></testsuite>'
    body = (
        'for a in "$@"; do case "$a" in --junitxml=*) printf \'%s\' \''
        + junit
        + '\' > "${a#--junitxml=}";; esac; done; exit 0\n'
    )
    monkeypatch.setattr(vt, "_python", lambda release: _python(tmp_path, body))
    again = vt.baseline("0.33.0", out=tmp_path / "base")
    assert again["files"][f]["rc"] == 0 and vt.usable(again, f) == ["tests/v1/core/test_x.py::test_a"]
    assert vt.baseline("0.33.0", out=tmp_path / "base") == again  # a settled file is reused
