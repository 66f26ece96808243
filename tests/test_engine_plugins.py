"""The engine as one typed object, the family as a plug-in (issue 41).

* One parse: a command reads each ``--engine`` / ``--as`` name once, at its
  edge (``ground.engines.EngineSpec.parse``), and hands the typed engine
  down; the tests count the parses of ``run``, ``predict`` and ``fuzz``'s
  options (a ratchet lists the re-reads below the edge that remain).
* No family-name switch outside the parser and the families' own package:
  code outside ``engine_adapter/`` asks a family's capability
  (``ground.engines.Capability``) or its registry entry, never compares its
  name (``== "sglang"``, ``.startswith("vllm==")``). A ratchet: the switches
  that stand are listed and the list only shrinks (today: none).
"""

from __future__ import annotations

import ast
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from fuzz.driving.config import RunConfig
from ground import engines as registry
from ground.engines import FAMILIES, Capability, EngineSpec

ROOT = Path(__file__).resolve().parents[1]

#: Packages outside ``engine_adapter/`` (the families' home) the switch
#: test reads; ``ground/engines.py`` is the parser and the registry.
OUTSIDE = ("ground", "reference", "spec", "fuzz", "advise", "mutate", "kvspec")
PARSER = "ground/engines.py"
#: Family-name switches that stand outside engine_adapter/ (path, line
#: text): none today. A new one fails; a listed one that is gone fails too.
KNOWN_SWITCHES: set[tuple[str, str]] = set()


def _is_family_name(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return any(node.value == f or node.value.startswith(f + "==") for f in FAMILIES)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_family_name(e) for e in node.elts)
    return False


def family_switches(root: Path = ROOT) -> list[tuple[str, str]]:
    """Every comparison with a family's name (``x == "sglang"``, ``x in
    ("vllm", ...)``) and every ``startswith``/``endswith`` of one
    (``"vllm=="``) outside engine_adapter/ and the parser."""
    found = []
    for pkg in OUTSIDE:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = str(path.relative_to(root))
            if rel == PARSER or path.name.startswith("test_") or path.name == "conftest.py":
                continue
            text = path.read_text()
            for node in ast.walk(ast.parse(text, rel)):
                if isinstance(node, ast.Compare):
                    hit = _is_family_name(node.left) or any(_is_family_name(c) for c in node.comparators)
                elif (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("startswith", "endswith", "removeprefix")
                ):
                    hit = any(_is_family_name(a) for a in node.args)
                else:
                    hit = False
                if hit:
                    found.append((rel, ast.get_source_segment(text, node) or ""))
    return found


def test_no_family_name_switch_outside_the_families():
    found = set(family_switches())
    new, gone = found - KNOWN_SWITCHES, KNOWN_SWITCHES - found
    assert not new, (
        f"switch on a family's name outside engine_adapter/ (ask its capability, ground.engines.Capability): {sorted(new)}"
    )
    assert not gone, f"strike these from KNOWN_SWITCHES (the count only goes down): {sorted(gone)}"


def test_the_switch_finder_finds_a_switch(tmp_path):
    """The finder itself can fail: a planted switch is found."""
    (tmp_path / "fuzz").mkdir()
    (tmp_path / "fuzz" / "planted.py").write_text('def f(v):\n    return v.startswith("sglang==") or v == "vllm"\n')
    assert sorted(s for _p, s in family_switches(tmp_path)) == ['v == "vllm"', 'v.startswith("sglang==")']


#: Where an engine is read again below the command line's edge, per
#: command: a ratchet (a new re-read fails; a listed one that is gone fails
#: too, strike it). The engine (here a test double) receives the typed
#: engine, and so does the judge: every engine-neutral check takes the
#: ``EngineSpec`` the command parsed (``fuzz.judge.oracles.check_all``), so
#: ``reference.knobs`` reads no key again.
KNOWN_REPARSES: dict[str, list[str]] = {
    "run": [],
    "predict": [],
    "fuzz": [],
    "replay": [],
    "check-build": [],
    "advise": [],
}


@pytest.fixture
def parses(monkeypatch):
    """Every call of the one parser: (the text, the file that called it)."""
    import traceback

    seen: list[tuple[str, str]] = []
    original = EngineSpec.parse.__func__

    def counting(cls, text, field="engine"):
        caller = traceback.extract_stack(limit=2)[0]
        seen.append((text, str(Path(caller.filename).resolve().relative_to(ROOT))))
        return original(cls, text, field)

    monkeypatch.setattr(EngineSpec, "parse", classmethod(counting))
    return seen


def _once_at_the_edge(parses, command: str, names: list[str], edge: str) -> None:
    at_edge = [(t, f) for t, f in parses if f == edge]
    assert at_edge == [(n, edge) for n in names], parses  # each command-line name: once, at the edge
    again = [f for _t, f in parses if f != edge]
    assert again == KNOWN_REPARSES[command], (
        f"engine read again below the edge (hand the typed EngineSpec down): {parses}"
    )


class _Opened:
    """A test double of an opened engine (a context manager) around ``inner``."""

    mode = "inprocess"

    def __init__(self, inner):
        self.inner = inner

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def run(self, case, options=None, **kw):
        return self.inner.run(case)

    def resolve(self, case):
        return self.inner.run(case)["resolution"]


def _resend_file(tmp_path: Path) -> Path:
    """A case file: A:40 sent twice, on a 16-token hybrid geometry."""
    from reference.case import case_to_dict
    from tests.conftest import hybrid, make_case

    path = tmp_path / "case.json"
    path.write_text(json.dumps(case_to_dict(make_case(hybrid(16, 16), [[("A", 40)], [("A", 40)]]))))
    return path


def _hand_engines(monkeypatch, wrap=lambda engine: engine) -> list:
    """``open_engine`` replaced by a test double of the engine (the
    reference model under ``replay``, wrapped by ``wrap``); returns the
    list of what each call was handed."""
    from tests.fuzz.doubles import ReferenceDouble

    handed = []
    monkeypatch.setattr(
        "engine_adapter.host.engine.open_engine",
        lambda spec, **kw: handed.append(spec) or wrap(ReferenceDouble(spec, "replay")),
    )
    return handed


def test_kvspec_run_parses_its_engine_once(parses, monkeypatch, tmp_path, capsys):
    from kvspec.cli import main

    path, handed = _resend_file(tmp_path), _hand_engines(monkeypatch, _Opened)
    assert main(["run", str(path), "--engine", "vllm==0.33.0", "--compare"]) == 0, capsys.readouterr()
    _once_at_the_edge(parses, "run", ["vllm==0.33.0"], "kvspec/engine_options.py")
    assert [type(s) for s in handed] == [EngineSpec]  # the typed engine handed down, not a name to read again


def test_kvspec_predict_parses_its_engine_once(parses, capsys):
    from kvspec.cli import main

    assert main(["predict", str(ROOT / "examples" / "seed-53504.json"), "--as", "vllm==0.29.0"]) == 0
    _once_at_the_edge(parses, "predict", ["vllm==0.29.0"], "kvspec/commands/predict.py")


def test_kvspec_fuzz_reads_its_engines_once_before_any_build(parses):
    import argparse

    from kvspec.commands import fuzz as command
    from kvspec.engine_options import engine_specs, parse_engine_options

    parser = argparse.ArgumentParser()
    command.configure(parser)
    args = parser.parse_args(["--engine", "vllm==0.33.0", "--engine", "vllm==0.32.0"])
    options = parse_engine_options(args, default="vllm==0.33.0")
    command._validate(args, options)
    specs = engine_specs(args, parsed=options)
    assert [s.name for s in specs] == ["vllm==0.33.0", "vllm==0.32.0"]
    _once_at_the_edge(parses, "fuzz", ["vllm==0.33.0", "vllm==0.32.0"], "kvspec/engine_options.py")


def test_kvspec_replay_parses_its_engine_once(parses, monkeypatch, tmp_path, capsys):
    from kvspec.cli import main

    path, handed = _resend_file(tmp_path), _hand_engines(monkeypatch)
    assert main(["replay", str(path), "--engine", "vllm==0.33.0"]) == 0, capsys.readouterr()
    _once_at_the_edge(parses, "replay", ["vllm==0.33.0"], "kvspec/engine_options.py")
    assert handed == [EngineSpec("vllm", "0.33.0")]  # the typed engine, opened as it was parsed


def test_kvspec_check_build_parses_its_engine_once(parses, monkeypatch, tmp_path, capsys):
    from fuzz.replaying import checkbuild
    from kvspec.cli import main

    handed = []

    def check_build(engine, *, out, **kw):
        handed.append(engine)
        return checkbuild.BuildReport(engine.name, out=str(out))

    monkeypatch.setattr(checkbuild, "check_build", check_build)
    assert main(["check-build", "--engine", "vllm==0.33.0", "--out", str(tmp_path / "out")]) == 0, capsys.readouterr()
    _once_at_the_edge(parses, "check-build", ["vllm==0.33.0"], "kvspec/engine_options.py")
    assert handed == [EngineSpec("vllm", "0.33.0")]


def test_kvspec_advise_parses_its_engine_once(parses, tmp_path, capsys):
    from kvspec.cli import main

    argv = ["advise", str(ROOT / "examples" / "seed-53504.json"), "--engine", "vllm==0.29.0", "--no-confirm"]
    assert main([*argv, "--out", str(tmp_path), "--json"]) == 0, capsys.readouterr()
    _once_at_the_edge(parses, "advise", ["vllm==0.29.0"], "kvspec/commands/advise.py")


def test_atheris_workers_receive_the_typed_engines_as_serialized_values(parses, monkeypatch, tmp_path):
    """``kvspec fuzz --driver atheris`` hands its runner the parsed engines;
    each libFuzzer worker gets them as ``EngineSpec.to_json`` in its
    environment, with no name read again on the way."""
    import subprocess

    from engine_adapter.host import environments
    from fuzz.driving import atheris_runner

    started = []

    class Started(Exception):
        pass

    def popen(cmd, env=None, **kw):
        started.append((cmd, env))
        raise Started

    monkeypatch.setattr(environments, "is_ready", lambda version: False)  # kvspec's interpreter, no install
    monkeypatch.setattr(subprocess, "Popen", popen)
    engine = EngineSpec("vllm", "0.33.0", "fix", "1a2b3c", ("fixes/a.diff",))
    other = EngineSpec("vllm", "0.32.0")
    config = RunConfig("atheris", 7, jobs=2, libfuzzer=("-max_len=4096",))
    with pytest.raises(Started):
        atheris_runner.run_atheris(engine, config, tmp_path / "out", tmp_path / "corpus", None, 30, other=other)
    ((cmd, env),) = started
    assert "-seed=7" in cmd and "-max_len=4096" in cmd  # the campaign's flags, as the command read them
    assert EngineSpec.from_json(env["KVSPEC_FUZZ_ENGINE"]) == engine
    assert EngineSpec.from_json(env["KVSPEC_FUZZ_OTHER"]) == other
    assert parses == []


def test_ray_tasks_carry_the_typed_engines_as_serialized_values(parses, monkeypatch, tmp_path):
    from fuzz.driving import distribute, ray_runner

    sent = []

    def run_tasks(fn, tasks, **kw):
        sent.extend(tasks)
        return []

    monkeypatch.setattr(distribute, "run_tasks", run_tasks)
    config = RunConfig("random", 5, connector="always", pressure="none", jobs=2)
    engines = [EngineSpec("vllm", "0.33.0", "fix", "1a2b3c", ("fixes/a.diff",)), EngineSpec("vllm", "0.32.0")]
    now = time.monotonic()
    summary = ray_runner.run_on_ray(
        config, engines, tmp_path, None, None, [], now, now + 60, address="local", retries=0, say=lambda line: None
    )
    assert [ray_runner._engines(task) for task in sent] == [engines, engines]
    # each worker reads the campaign back typed, with its own seed
    assert [ray_runner._config(task) for task in sent] == [
        replace(config, seed=5, jobs=1),
        replace(config, seed=6, jobs=1),
    ]
    assert summary.to_dict()["engine"] == "vllm==0.33.0+fix.1a2b3c"
    assert parses == []


def test_every_family_is_declared_whole():
    """Each registry line names parts that load and releases that parse."""
    for family in FAMILIES.values():
        assert family.default_release in family.releases
        assert EngineSpec.parse(family.default_engine).family == family.name
        assert callable(registry.load(family.flags)) and callable(registry.load(family.knobs))
        for part in (family.generator, family.twin, family.classes, family.canonical_flag):
            if part is not None:
                assert registry.load(part) is not None, part
        assert set(family.capabilities) <= set(Capability)
    assert (
        EngineSpec.parse("sglang==0.5.23").name == "sglang==0.5.23"
        and EngineSpec.parse("0.33.0").name == "vllm==0.33.0"
    )


def test_a_registry_table_is_read_whole_and_a_stray_key_is_refused_by_name():
    """families.toml's tables become Family values (lists as tuples, the
    capability names as Capability); a key no Family field has is one error."""
    from ground.errors import InvalidArgument

    entry = {
        "title": "Toy",
        "releases": ["1.0"],
        "default_release": "1.0",
        "args_field": "toy_args",
        "serve": "toy serve",
        "package": "toy",
        "driver": "tests.toy_engine.driver",
        "flags": "reference.vllm_flags:check_vllm_args",
        "knobs": "reference.knobs:vllm_knobs",
        "capabilities": ["decode"],
        "platforms": ["cpu"],
    }
    toy = registry._declared("toy", entry)
    assert toy.releases == ("1.0",) and toy.platforms == ("cpu",)
    assert toy.capabilities == frozenset({Capability.DECODE})
    assert registry._declared("toy", {**entry, "capabilities": "all"}).capabilities == frozenset(Capability)
    with pytest.raises(InvalidArgument, match=r"\[toy\]\.relases: not a Family field; allowed: .*releases"):
        registry._declared("toy", {**entry, "relases": ["1.0"]})
    with pytest.raises(InvalidArgument, match=r"capabilities='decoding': no such capability; allowed: .*decode"):
        registry._declared("toy", {**entry, "capabilities": ["decoding"]})


#: The toy family's registry line (the TEST DOUBLE of tests/toy_engine/):
#: with its package, all a family needs.
TOY = registry.Family(
    "toy",
    "Toy",
    ("1.0.0",),
    "1.0.0",
    "toy_args",
    "toy-serve",
    "toy_engine",
    "tests.toy_engine.driver",
    "tests.toy_engine.driver:check",
    "tests.toy_engine.driver:knobs",
    frozenset({Capability.GEOMETRY, Capability.IN_PROCESS}),
)
TOY_TRACE = [
    {"prompt": [{"segment": "A", "length": 200}]},
    {"prompt": [{"segment": "A", "length": 200}]},
    {"prompt": [{"segment": "A", "length": 300}]},
]


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(FAMILIES, "toy", TOY)  # the one registry line
    return TOY


def _toy_case(tmp_path, resolved: bool = False) -> Path:
    from reference.case import case_to_dict, parse_case, with_resolution
    from tests.toy_engine.driver import get_driver

    case = parse_case(
        {
            "schema": 1,
            "name": "toy",
            "deployment": {"model": "qwen3_next", "engine": "toy", "toy_args": ["--block", "64"]},
            "trace": TOY_TRACE,
        }
    )
    if resolved:
        case = with_resolution(case, get_driver().resolve(case)["geometry"], None, "toy==1.0.0")
    path = tmp_path / ("resolved.json" if resolved else "case.json")
    path.write_text(json.dumps(case_to_dict(case)))
    return path


def test_a_toy_family_plugs_in_by_one_package_and_one_registry_line(toy, tmp_path, capsys):
    """The toy family (a test double) runs ``predict``, ``run`` and a short
    campaign through kvspec's own code: names, deployments, knobs, the
    engine, the judge and the campaign ask its registry entry."""
    import argparse

    from engine_adapter.host.engine import InProcessEngine
    from fuzz.driving.campaign import Campaign
    from fuzz.driving.drivers import run_random
    from ground.errors import InvalidArgument
    from kvspec.cli import main
    from kvspec.commands import fuzz as command
    from kvspec.engine_options import parse_engine_options

    assert EngineSpec.parse("toy==1.0.0").name == "toy==1.0.0"
    # predict: a deployment the toy resolved (its own geometry, no engine)
    assert main(["predict", str(_toy_case(tmp_path, resolved=True)), "--as", "toy==1.0.0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hits"] == [0, 192, 192] and out["resolved_by"] == "toy==1.0.0"
    # run: the toy's driver, in this process, judged against the promise
    assert main(["run", str(_toy_case(tmp_path)), "--engine", "toy==1.0.0", "--mode", "inprocess", "--compare"]) == 0, (
        capsys.readouterr()
    )
    assert "agree" in capsys.readouterr().out
    # a short campaign on hand geometries (the toy declares GEOMETRY)
    campaign = Campaign(InProcessEngine("toy==1.0.0"), tmp_path / "findings", seed=1)
    stats = run_random(campaign, seed=1, max_time=20, max_execs=25, synthetic=True)
    assert stats.execs >= 10 and stats.harness_errors == 0 and not stats.findings, stats
    # what it did not declare (CONNECTORS) is refused in one line
    parser = argparse.ArgumentParser()
    command.configure(parser)
    args = parser.parse_args(["--engine", "toy==1.0.0", "--kv-connector", "offloading"])
    with pytest.raises(InvalidArgument, match="^--kv-connector=.*Toy deployments carry none"):
        command._validate(args, parse_engine_options(args))


def test_without_its_registry_line_the_toy_is_no_family(tmp_path):
    from ground.errors import KvspecError

    with pytest.raises(KvspecError, match="allowed: vllm==0.29.0"):
        EngineSpec.parse("toy==1.0.0")


def test_the_worker_receives_the_engine_as_one_serialized_value(parses, monkeypatch):
    """A worker is started with ``--engine JSON`` (``EngineSpec.to_json``):
    the typed engine, read back whole, with no name or version key on its
    command line and no parse on the way."""
    import subprocess
    import sys

    from engine_adapter.host import engine as host

    started = []

    class Started(Exception):
        pass

    def popen(cmd, **kw):
        started.append(cmd)
        raise Started

    monkeypatch.setattr(subprocess, "Popen", popen)
    spec = registry.EngineSpec("sglang", "0.5.23", "fix", "1a2b3c", ("fixes/a.diff",))
    with pytest.raises(Started):
        host.WorkerProcess(spec, python=sys.executable).start()
    (cmd,) = started
    assert EngineSpec.from_json(cmd[cmd.index("--engine") + 1]) == spec
    assert "--family" not in cmd and not [c for c in cmd if c.startswith(("sglang==", "0.5.23"))], cmd
    assert parses == []
