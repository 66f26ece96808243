"""Bad engine names and versions: one-line errors, no engine needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine_adapter.host.engine import open_engine
from engine_adapter.host.versions import (
    EngineSpec,
    engine_name,
    env_slug,
    family_of,
    is_build,
    parse_engine,
    release_number,
    release_of,
)
from ground.errors import EngineError, InvalidArgument, Unsupported

ALLOWED = "allowed: vllm==0.29.0, vllm==0.30.0, vllm==0.32.0, vllm==0.33.0, sglang==0.5.23, llamacpp==2026.10.11549"


@pytest.mark.parametrize("name", ["vllm==0.33.0", "0.33.0", " vllm==0.29.0 "])
def test_good_names(name):
    assert parse_engine(name) in ("0.33.0", "0.29.0")


@pytest.mark.parametrize("name", ["vllm", "vllm>=0.33.0", "torch==2.13.0", "vllm==0.33", "", "vllm==0.33.0.post1"])
def test_malformed_names(name):
    with pytest.raises(InvalidArgument) as e:
        parse_engine(name)
    msg = str(e.value)
    assert (
        msg
        == f"engine={name!r}: not an engine name of the form vllm==X.Y.Z or sglang==X.Y.Z or llamacpp==X.Y.Z; {ALLOWED}"
    )
    assert "\n" not in msg


@pytest.mark.parametrize(
    "name, fields",
    [
        ("vllm==0.33.0", ("vllm", "0.33.0", None, None)),  # a release
        ("vllm==0.29.0+fix.1a2b3c4d5e6f", ("vllm", "0.29.0", "fix", "1a2b3c4d5e6f")),  # a patched build
        ("vllm==0.33.0+fix.other.0f0f0f0f0f0f", ("vllm", "0.33.0", "fix.other", "0f0f0f0f0f0f")),  # two patches' labels
        ("vllm==0.32.0+path-vllm.abcdef012345", ("vllm", "0.32.0", "path-vllm", "abcdef012345")),  # path:DIR
        (
            "vllm==0.30.0+wheel-vllm-0-30-0.123456abcdef",
            ("vllm", "0.30.0", "wheel-vllm-0-30-0", "123456abcdef"),
        ),  # wheel:FILE
        ("vllm==0.33.0+local", ("vllm", "0.33.0", "local", None)),  # a local label with no hash
    ],
)
def test_engine_spec_round_trips_every_name_form(name, fields):
    spec = EngineSpec.parse(name)
    assert (spec.family, spec.release, spec.label, spec.hash) == fields
    assert spec.name == name == engine_name(parse_engine(name))  # the canonical name, as engine_name gives it
    assert spec.version == parse_engine(name) == name.removeprefix("vllm==")
    assert spec.is_build == is_build(spec.version) == (fields[2] is not None)
    assert release_of(spec.version) == spec.release and spec.release_spec.name == f"vllm=={spec.release}"
    assert (
        EngineSpec.parse(spec.name) == spec == EngineSpec.parse(f"  {spec.version} ")
    )  # a bare version, spaced, is vLLM's
    with pytest.raises(AttributeError):
        spec.release = "0.29.0"  # frozen


@pytest.mark.parametrize(
    "name",
    [
        "vllm",
        "vllm>=0.33.0",
        "torch==2.13.0",
        "vllm==0.33",
        "",
        "vllm==0.33.0.post1",
        "vllm==0.33.0+",
        "vllm==0.33.0+Fix.1",
        "vllm==0.33.0+.x",
    ],
)
def test_engine_spec_rejects_malformed_names_with_todays_message(name):
    with pytest.raises(InvalidArgument) as e:
        EngineSpec.parse(name, "--engine")
    assert (
        str(e.value)
        == f"--engine={name!r}: not an engine name of the form vllm==X.Y.Z or sglang==X.Y.Z or llamacpp==X.Y.Z; {ALLOWED}"
    )
    with pytest.raises(InvalidArgument, match=r"^engine=3: must be a string like vllm==0.33.0; allowed: vllm==0.29.0"):
        EngineSpec.parse(3)
    with pytest.raises(
        Unsupported,
        match=r"^engine='vllm==0.31.0\+fix.1': vLLM 0.31.0 has no kvspec engine environment; allowed: vllm==0.29.0",
    ):
        EngineSpec.parse("vllm==0.31.0+fix.1")


def test_sglang_names_carry_their_family_in_the_version_key():
    """vLLM's version key stays the bare release (every cache and file name
    of a vLLM engine unchanged); SGLang's is its full name."""
    spec = EngineSpec.parse("sglang==0.5.23")
    assert (spec.family, spec.release, spec.version, spec.name) == (
        "sglang",
        "0.5.23",
        "sglang==0.5.23",
        "sglang==0.5.23",
    )
    assert family_of(spec.version) == "sglang" and family_of("0.33.0+fix.1") == "vllm"
    assert release_number(spec.version) == "0.5.23" and release_number("0.33.0+fix.1") == "0.33.0"
    assert env_slug(spec.version) == "sglang-0.5.23" and env_slug("0.33.0") == "vllm-0.33.0"
    assert engine_name(spec.version) == "sglang==0.5.23"
    with pytest.raises(
        Unsupported,
        match=r"^engine='sglang==0.33.0': SGLang 0.33.0 has no kvspec engine environment; allowed: .*sglang==0.5.23, llamacpp==2026.10.11549$",
    ):
        EngineSpec.parse("sglang==0.33.0")
    build = EngineSpec.parse("sglang==0.5.23+keep-cut.88f092")  # an SGLang build (--patch)
    assert (build.family, build.release, build.label, build.version) == (
        "sglang",
        "0.5.23",
        "keep-cut",
        "sglang==0.5.23+keep-cut.88f092",
    )
    assert env_slug(build.version) == "sglang-0.5.23+keep-cut.88f092" and build.release_spec.name == "sglang==0.5.23"


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
        (
            ["run", "examples/seed-53504.json", "--engine", "vllm==0.31.0"],
            "kvspec: --engine='vllm==0.31.0': vLLM 0.31.0 has no kvspec engine environment",
        ),
        (
            ["run", "examples/seed-53504.json", "--engine", "sglang"],
            "kvspec: --engine='sglang': not an engine name of the form vllm==X.Y.Z or sglang==X.Y.Z or llamacpp==X.Y.Z",
        ),
        (
            ["engines", "install", "vllm==0.33.0", "vllm==1.0.0"],
            "kvspec: engine='vllm==1.0.0': vLLM 1.0.0 has no kvspec engine environment",
        ),
        (["engines", "remove", "latest"], "kvspec: engine='latest': not an engine name"),
    ],
)
def test_cli_one_line_errors(argv, needle, tmp_path):
    import os

    from ground.home import REPO_ROOT

    env = dict(os.environ, KVSPEC_HOME=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "kvspec.cli", *argv], capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=120
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith(needle), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "engines").exists() or not any((tmp_path / "engines").iterdir())


def test_fuzz_patch_parses_each_engine_name_once_at_the_edge(tmp_path, monkeypatch, capsys):
    """``kvspec fuzz --engine vllm==0.33.0 --patch FILE.diff`` up to the
    engine's opening, with test doubles for the build (no environment is
    made) and the worker: the user's name is parsed once
    (``kvspec.engine_options.engine_specs``) and so is the build's name it
    makes; the build, the usability check and ``open_engine`` are handed the
    parsed engine (before EngineSpec: five parses)."""
    from engine_adapter.host import builds, engine, environments
    from fuzz.driving import runner
    from ground.errors import EngineError
    from kvspec.cli import main as kvspec

    parsed = []
    real_parse = EngineSpec.parse.__func__

    def counting(cls, text, field="engine"):
        parsed.append(text)
        return real_parse(cls, text, field)

    monkeypatch.setattr(EngineSpec, "parse", classmethod(counting))
    monkeypatch.setenv("KVSPEC_HOME", str(tmp_path / "home"))
    given = []
    monkeypatch.setattr(
        builds,
        "overlay_from_patches",
        lambda release, patches, **k: given.append(release) or builds.Overlay(release.release, "patch", "fix", {}),
    )
    monkeypatch.setattr(builds, "build", lambda overlay, **k: {})
    monkeypatch.setattr(environments, "is_ready", lambda version: True)
    monkeypatch.setattr(engine, "WorkerEngine", lambda version: ("worker", version))
    monkeypatch.setattr(engine, "inprocess_vllm_version", lambda: None)
    opened = []

    def run_double(config, engines, *a, **k):
        opened.extend(engine.open_engine(e) for e in engines)
        raise EngineError("stopped here by the test")

    monkeypatch.setattr(runner, "run_in_process", run_double)
    patch = "fixes/vllm-0.33.0-longer-sibling-of-aligned-prompt.diff"
    argv = [
        "fuzz",
        "--engine",
        "vllm==0.33.0",
        "--patch",
        patch,
        "--driver",
        "random",
        "--no-z3-seeds",
        "--max-time",
        "5",
        "--out",
        str(tmp_path / "out"),
    ]
    assert kvspec(argv) == 3
    assert "stopped here by the test (harness failed, exit 3)" in capsys.readouterr().err
    build = builds.Overlay("0.33.0", "patch", "fix", {}).version
    assert given == [EngineSpec("vllm", "0.33.0")]  # the build is handed the parsed release
    assert [(kind, spec.version) for kind, spec in opened] == [("worker", build)]  # the worker takes the build's spec
    assert parsed == ["vllm==0.33.0", f"vllm=={build}"]  # the user's name, and the name of the build made of it
