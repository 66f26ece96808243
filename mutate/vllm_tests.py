"""vLLM's own tests (``tests/v1/core`` of the release's sdist), run with
pytest inside an engine environment: the yardstick kvspec's kill is set
beside.

The rules:

* **Which files**: those under ``tests/v1/core`` that name a module the
  targets live in or build a scheduler or KV cache manager
  (:data:`RELEVANT`); the rest test other parts of vLLM.
* **Baseline** (:func:`baseline`, once per release, cached under
  ``$KVSPEC_HOME/mutate``): each file run on the unmutated release under
  ``coverage run --branch`` restricted to the target files; a test that
  fails or errors there (it needs a GPU, a model download, a package the
  engine environment lacks) is *not usable* and is deselected for every
  mutant, listed with its reason. What each file executes of the target
  files is kept too.
* **Per mutant** (:func:`run_for_mutant`): only the files whose baseline run
  executed the mutated line (a test that never runs a line cannot see a
  fault planted there), without the unusable tests, ``-x``; the mutant is
  *killed by vLLM's tests* when one of them fails or errors, or when the run
  outlives its bound (a hang fails CI too). A run that cannot start (no
  pytest in the build, or pytest exiting non-zero before any test ran) is
  kvspec's failure: recorded apart, never a kill, retried by a later pass.

pytest runs in a folder holding only a link to the sdist's ``tests``
(:func:`run_root`: vLLM's tests import ``tests.v1.core...``, and the sdist's
own ``vllm/`` sources must not shadow the build under test) and ``--confcutdir tests/v1/core`` (the sdist's
top ``tests/conftest.py`` imports test-only packages the engine environment
lacks and none of these files needs). Nothing here imports vLLM.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

from ground.errors import EngineError
from ground.files import write_json_atomic, write_text_if_changed

SUBDIR = "tests/v1/core"
#: A test file is relevant when it names one of these.
RELEVANT = re.compile(
    r"kv_cache_coordinator|single_type_kv_cache_manager|sched\.scheduler|kv_cache_utils|kv_cache_interface|KVCacheManager|create_scheduler"
)
#: Bound for one file's baseline run.
FILE_TIMEOUT_S = 300.0
#: A mutant's run is bounded by this many times the baseline seconds of its files, at least MIN_RUN_S.
RUN_FACTOR, MIN_RUN_S = 3.0, 120.0
BASELINE_SCHEMA = 2


def sdist_root(release: str) -> Path:
    """The release's unpacked sdist (downloaded once, ``engine_adapter.host.sources``)."""
    from engine_adapter.host.sources import sdist_dir

    root = Path(sdist_dir(release))
    if not (root / SUBDIR).is_dir():
        raise EngineError(
            f"vllm=={release}: its sdist at {root} has no {SUBDIR}; allowed: a release whose sdist ships its tests"
        )
    return root


def test_files(root: Path) -> list[str]:
    """The relevant test files, relative to the sdist root, sorted."""
    out = []
    for path in sorted((root / SUBDIR).rglob("test_*.py")):
        if RELEVANT.search(path.read_text(errors="replace")):
            out.append(str(path.relative_to(root)))
    return out


def run_root(sdist: Path) -> Path:
    """The folder pytest runs in: only a link ``tests`` to the sdist's
    tests, so ``tests.v1.core...`` imports while ``vllm`` comes from the
    engine environment (the sdist's own ``vllm/`` source tree must never
    shadow the build under test)."""
    from ground.home import kvspec_home

    root = kvspec_home() / "mutate" / "run-roots" / Path(sdist).name
    link = root / "tests"
    if not link.is_symlink() or link.resolve() != (Path(sdist) / "tests").resolve():
        root.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():
            link.unlink()
        link.symlink_to(Path(sdist).resolve() / "tests")
    write_text_if_changed(root / "pytest.ini", _pytest_ini(Path(sdist)))
    return root


def _pytest_ini(sdist: Path) -> str:
    """The sdist's own pytest settings (``[tool.pytest.ini_options]`` of its
    pyproject.toml: its markers) as the run folder's ``pytest.ini``, which
    also makes that folder pytest's rootdir."""
    opts = (
        tomllib.loads((sdist / "pyproject.toml").read_text()).get("tool", {}).get("pytest", {}).get("ini_options", {})
    )
    lines = ["[pytest]"]
    for key, value in opts.items():
        if isinstance(value, list):
            lines.append(f"{key} =")
            lines += [f"    {v}" for v in value]
        else:
            lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"


def _version(engine: str) -> str:
    """``vllm==X[+LABEL.HASH]`` or ``X[+LABEL.HASH]`` -> the version."""
    return engine.split("==", 1)[1] if "==" in engine else engine


def pytest_env(version: str, root: Path) -> dict[str, str]:
    from engine_adapter.host.environments import STUBS_DIR, worker_env

    env = worker_env(_version(version), "cpu")
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(STUBS_DIR)])
    return env


def _python(version: str) -> str:
    from engine_adapter.host.environments import env_python

    return str(env_python(_version(version)))


def target_paths(version: str) -> list[str]:
    """Absolute paths of the target files in an engine environment."""
    from engine_adapter.host.builds import site_packages
    from engine_adapter.host.environments import env_dir
    from mutate.targets import TARGETS

    sp = site_packages(env_dir(version))
    return [str(sp / "vllm" / f) for f in dict.fromkeys(f for _a, f, _q in TARGETS)]


def _junit(path: Path) -> dict[str, str]:
    """node id -> passed / failed / error / skipped, from a JUnit XML file."""
    out: dict[str, str] = {}
    try:
        tree = ET.parse(path)
    except (OSError, ET.ParseError):
        return out
    for tc in tree.iter("testcase"):
        cls, name = tc.get("classname", ""), tc.get("name", "")
        parts = cls.split(".")
        # classname "tests.v1.core.test_x" or "tests.v1.core.test_x.TestClass"
        mod = []
        for p in parts:
            mod.append(p)
            if p.startswith("test_"):
                break
        node = "/".join(mod) + ".py::" + "::".join(parts[len(mod) :] + [name])
        state = "passed"
        for child in tc:
            if child.tag in ("failure", "error"):
                state = "failed" if child.tag == "failure" else "error"
                msg = (child.get("message") or child.text or "").strip().splitlines()
                state += ": " + (msg[0][:200] if msg else "")
                break
            if child.tag == "skipped":
                state = "skipped: " + (child.get("message") or "")[:200]
        out[node] = state
    return out


def _pytest_cmd(
    version: str, files: list[str], junit: Path, *, stop_first: bool, deselect: list[str], coverage_data: Path | None
) -> list[str]:
    head = [_python(version)]
    if coverage_data is not None:
        head += [
            "-m",
            "coverage",
            "run",
            "--branch",
            f"--data-file={coverage_data}",
            f"--include={','.join(target_paths(version))}",
        ]
    cmd = head + ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--confcutdir", SUBDIR, f"--junitxml={junit}"]
    if stop_first:
        cmd.append("-x")
    for d in deselect:
        cmd += ["--deselect", d]
    return cmd + files


def _run_in_sdist(cmd: list[str], version: str, root: Path, timeout: float) -> subprocess.CompletedProcess:
    """``cmd`` (an engine environment's pytest or coverage) in the vLLM
    sdist's run root, with that environment's test variables
    (:func:`pytest_env`), its output captured; ``subprocess.TimeoutExpired``
    past ``timeout`` seconds, for the caller to read."""
    return subprocess.run(cmd, cwd=root, env=pytest_env(version, root), capture_output=True, text=True, timeout=timeout)


def _coverage_json(version: str, data: Path, out: Path, root: Path) -> dict:
    proc = _run_in_sdist(
        [_python(version), "-m", "coverage", "json", f"--data-file={data}", "-o", str(out), "--quiet"],
        version,
        root,
        300,
    )
    if proc.returncode != 0 or not out.exists():
        return {}
    return json.loads(out.read_text())


def baseline(
    release: str, *, out: Path | None = None, files: list[str] | None = None, progress=None, refresh: bool = False
) -> dict:
    """Run the relevant files on the release under coverage (cached)."""
    from engine_adapter.host.testtools import ensure_coverage, ensure_pytest
    from ground.home import kvspec_home

    say = progress or (lambda line: None)
    out = Path(out or kvspec_home() / "mutate" / f"vllm-tests-{release}")
    cache = out / "baseline.json"
    sdist = sdist_root(release)
    files = files or test_files(sdist)
    root = run_root(sdist)
    if cache.exists() and not refresh:
        data = json.loads(cache.read_text())
        if data.get("schema") == BASELINE_SCHEMA and all(_settled(data.get("files", {}).get(f)) for f in files):
            return data
    python = _python(release)
    if not ensure_pytest(python) or not ensure_coverage(python):
        raise EngineError(
            f"engine=vllm=={release}: cannot install pytest and coverage in its environment; allowed: an environment pip can install into"
        )
    result = {"schema": BASELINE_SCHEMA, "release": release, "sdist": str(sdist), "root": str(root), "files": {}}
    if cache.exists():
        result["files"] = json.loads(cache.read_text()).get("files", {})
    prefix = str(Path(target_paths(release)[0]).parents[len(Path("v1/core/x.py").parts) - 1])  # .../site-packages/vllm
    for f in files:
        if _settled(result["files"].get(f)) and not refresh:
            continue
        tag = f.replace("/", "_")
        junit, data, cov = out / f"{tag}.xml", out / f"{tag}.coverage", out / f"{tag}.cov.json"
        out.mkdir(parents=True, exist_ok=True)
        for p in (junit, data, cov):
            p.unlink(missing_ok=True)
        t = time.monotonic()
        say(f"[mutate] vLLM tests baseline: {f}")
        try:
            proc = _run_in_sdist(
                _pytest_cmd(release, [f], junit, stop_first=False, deselect=[], coverage_data=data),
                release,
                root,
                FILE_TIMEOUT_S,
            )
            rc, tail = proc.returncode, (proc.stdout + proc.stderr).strip().splitlines()[-1:]
        except subprocess.TimeoutExpired:
            rc, tail = "timeout", [f"timed out after {FILE_TIMEOUT_S:.0f}s"]
        seconds = round(time.monotonic() - t, 1)
        tests = _junit(junit)
        lines: dict[str, list[int]] = {}
        arcs: dict[str, list[list[int]]] = {}
        missing: dict[str, list[list[int]]] = {}
        if data.exists():
            for path, info in _coverage_json(release, data, cov, root).get("files", {}).items():
                rel = os.path.relpath(path, prefix)
                lines[rel] = info.get("executed_lines", [])
                arcs[rel] = info.get("executed_branches", [])
                missing[rel] = info.get("missing_branches", [])
        result["files"][f] = {
            "rc": rc,
            "seconds": seconds,
            "last_line": tail[0][:300] if tail else "",
            "tests": tests,
            "executed_lines": lines,
            "executed_branches": arcs,
            "missing_branches": missing,
        }
        say(
            f"[mutate]   rc={rc} {sum(v == 'passed' for v in tests.values())} passed, {sum(v != 'passed' for v in tests.values())} not usable, {seconds}s"
        )
        write_json_atomic(cache, result)
    return result


def _settled(info: dict | None) -> bool:
    """Whether a file's baseline entry is the release's answer: present and
    not cut by kvspec's time limit. A file that timed out (a machine too
    busy, as a run beside a test suite was: 0 tests in 300 s) says nothing
    of vLLM's tests; a later call runs it again instead of reusing it."""
    return info is not None and info.get("rc") != "timeout"


def usable(base: dict, f: str) -> list[str]:
    """The tests of file ``f`` that passed on the release."""
    return [n for n, s in base["files"].get(f, {}).get("tests", {}).items() if s == "passed"]


def unusable(base: dict) -> dict[str, str]:
    """node id -> why it cannot count (its result on the release), over every file."""
    out = {}
    for f, info in base["files"].items():
        if not info.get("tests"):
            out[f] = f"no test ran (rc={info.get('rc')}: {info.get('last_line', '')})"
        for n, s in info.get("tests", {}).items():
            if s != "passed":
                out[n] = s
    return out


def files_for(base: dict, file: str, line: int) -> list[str]:
    """The test files whose baseline run executed ``line`` of ``vllm/<file>``
    and that have a usable test."""
    return [
        f
        for f, info in base["files"].items()
        if line in set(info.get("executed_lines", {}).get(file, [])) and usable(base, f)
    ]


def files_for_span(base: dict, span) -> list[str]:
    """The test files whose baseline run executed a line of ``span``'s body
    and that have a usable test."""
    body = set(range(span.body_start, span.end + 1))
    return [
        f
        for f, info in base["files"].items()
        if body & set(info.get("executed_lines", {}).get(span.file, [])) and usable(base, f)
    ]


def run_one(engine: str, base: dict, node: str, timeout: float = 300.0) -> bool | None:
    """Does the one test ``node`` pass on ``engine``? None when it could not
    be run there (no pytest in that environment): kvspec's failure, which
    must not set a killing test aside as one that fails on the base too."""
    from engine_adapter.host.testtools import ensure_pytest

    if not ensure_pytest(_python(engine)):
        return None
    root = run_root(Path(base["sdist"]))
    try:
        proc = _run_in_sdist(
            [_python(engine), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--confcutdir", SUBDIR, node],
            engine,
            root,
            timeout,
        )
    except subprocess.TimeoutExpired:
        return False
    if proc.returncode != 0 and "No module named pytest" in proc.stderr:
        return None
    return proc.returncode == 0


def run_for_mutant(
    engine: str, base: dict, files: list[str], *, junit: Path, deselect: list[str] = (), progress=None
) -> dict:
    """Run the usable tests of ``files`` on a build; ``killed`` when one
    fails, errors or the run outlives its bound. A run that could not start
    (pytest cannot be installed in the build, or exits non-zero having run
    no test at all) is kvspec's failure, never a kill: ``{"harness": reason}``."""
    from engine_adapter.host.testtools import ensure_pytest

    if not files:
        return {"killed": False, "files": [], "seconds": 0.0, "reason": "no usable test executes the mutated line"}
    if not ensure_pytest(_python(engine)):
        return {"harness": f"engine={engine}: cannot install pytest in its environment"}
    root = run_root(Path(base["sdist"]))
    deselect = [*deselect, *(n for f in files for n, s in base["files"][f]["tests"].items() if s != "passed")]
    bound = max(MIN_RUN_S, RUN_FACTOR * sum(base["files"][f]["seconds"] for f in files))
    t = time.monotonic()
    junit = Path(junit).resolve()  # pytest runs in another folder
    junit.unlink(missing_ok=True)
    try:
        proc = _run_in_sdist(
            _pytest_cmd(engine, files, junit, stop_first=True, deselect=deselect, coverage_data=None),
            engine,
            root,
            bound,
        )
    except subprocess.TimeoutExpired:
        return {
            "killed": True,
            "files": files,
            "seconds": round(time.monotonic() - t, 1),
            "reason": f"timed out after {bound:.0f}s",
        }
    seconds = round(time.monotonic() - t, 1)
    tests = _junit(junit)
    bad = [(n, s) for n, s in tests.items() if not s.startswith(("passed", "skipped"))]
    if bad:
        return {"killed": True, "files": files, "seconds": seconds, "killing_test": bad[0][0], "reason": bad[0][1]}
    if proc.returncode not in (0, 5):
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:]
        why = f"pytest exit {proc.returncode}: {tail[0][:200] if tail else ''}"
        if not tests:  # no test ran, none failed: the run itself did not start
            return {"harness": f"engine={engine}: {why}"}
        return {"killed": True, "files": files, "seconds": seconds, "reason": why}
    return {"killed": False, "files": files, "seconds": seconds, "tests": len(tests)}
