"""The one judge (fuzz/judge/verdict.py) on constructed finding/observation pairs,
finding schema 2 (and schema 1 files still loading), and the commands that
take their verdict from it (replay --engine, run --compare, matrix, predict
of a deployment).

Engines here are TEST DOUBLES (the reference model under a rule, pretending
to be a vLLM version): the machinery is under test, not vLLM. The real
engines replay a versions finding in tests/engine/test_replay_versions.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fuzz.judge.oracles import Divergence, check_all, check_versions, resolved
from fuzz.judge.verdict import (
    AGREES,
    DIVERGES,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    Claim,
    Target,
    judge,
    observe_and_judge,
)
from fuzz.replaying.matrix import load_cases, run_matrix, to_markdown
from fuzz.replaying.replay import replay_case
from fuzz.results import findings as F
from ground.errors import InvalidArgument
from kvspec.cli import main as cli_main
from reference.case import case_to_dict, parse_case, with_resolution
from reference.knobs import resolve_knobs
from reference.predict import predict_with_knobs
from tests.conftest import MTP_DROP, hybrid, make_case
from tests.fuzz.doubles import ReferenceDouble

SPEC = '{"method": "mtp", "num_speculative_tokens": 2, "disable_lookahead_block_hashes": true}'


def seed():
    return make_case(hybrid(1600, 1600), [[("A", 11910)]] * 3, MTP_DROP, name="seed-53504")


def finding_of(case, engine, oracle="promise", **kw):
    """Run ``case`` on a double, judge it like the campaign, and build the finding."""
    obs = engine.run(case)
    judged = resolved(case, obs, engine.version)
    (div,) = [d for d in check_all(judged, engine.version, obs, None, (oracle,))]
    return F.make_finding(judged, div, obs, **kw)


# ---------------------------------------------------------------- the definition


def test_a_finding_replayed_on_its_engine_is_reproduced():
    old = ReferenceDouble("0.29.0", "legacy")
    finding = finding_of(seed(), old)
    assert finding["first_divergence"] == 1 and finding["observed"]["hits"] == [0, 0, 9600]
    result = replay_case(seed(), finding, old)
    assert result["verdict"] == REPRODUCED, result["reasons"]
    assert result["first_divergence"] == 1


def test_the_oracle_not_firing_is_not_reproduced():
    finding = finding_of(seed(), ReferenceDouble("0.29.0", "legacy"))
    result = replay_case(seed(), finding, ReferenceDouble("0.33.0", "replay"))
    assert result["verdict"] == NOT_REPRODUCED
    assert "promise does not fire" in result["reasons"]


def _div(oracle, first, expected, observed):
    return Divergence(oracle, "0.29.0", [first] if first is not None else [], expected, observed)


def _finding(oracle="promise", first=1, expected=(0, 9600, 9600), observed=(0, 0, 9600), **extra):
    return {
        "kvspec_finding": 2,
        "oracle": oracle,
        "first_divergence": first,
        "expected": {"hits": list(expected), "detail": ""},
        "observed": {"hits": list(observed), "queries": [], "error": None},
        **extra,
    }


def test_the_same_oracle_at_another_request_is_not_reproduced():
    obs = {"hits": [0, 0, 9600]}
    v = judge(_finding(first=2), obs, [_div("promise", 1, [0, 9600, 9600], [0, 0, 9600])])
    assert v.verdict == NOT_REPRODUCED
    assert v.reasons == ["promise fires first at request 1, the finding at request 2"]
    assert judge(_finding(first=1), obs, [_div("promise", 1, [0, 9600, 9600], [0, 0, 9600])]).verdict == REPRODUCED


def test_other_observed_hits_are_not_reproduced_even_if_the_oracle_fires_at_the_same_request():
    v = judge(_finding(), {"hits": [0, 0, 8000]}, [_div("promise", 1, [0, 9600, 9600], [0, 0, 8000])])
    assert v.verdict == NOT_REPRODUCED and v.reasons == ["request 2: observed hits 8000, the finding observed 9600"]


def test_another_oracle_firing_does_not_reproduce_the_finding():
    v = judge(_finding(), {"hits": [0, 0, 9600]}, [_div("reference", 1, [0, 9600, 9600], [0, 0, 9600])])
    assert v.verdict == NOT_REPRODUCED and "promise does not fire" in v.reasons


@pytest.mark.parametrize("kind", ["worker", "internal", None])
def test_a_harness_error_is_inconclusive_never_a_verdict_on_vllm(kind):
    err = {"message": "worker died (exit -9)", **({"kind": kind} if kind else {})}
    v = judge(_finding(), {"hits": [], "error": err}, [])
    assert v.verdict == INCONCLUSIVE and "kvspec's own failure" in v.reasons[0]
    # the other engine of a versions finding too
    v = judge(_finding("versions"), {"hits": [0, 0, 9600]}, [], other_observation={"hits": [], "error": err})
    assert v.verdict == INCONCLUSIVE and v.reasons[0].startswith("the other engine did not run the case")
    # a bare case against a target too
    assert judge(Target([0, 9600, 9600]), {"hits": [], "error": err}).verdict == INCONCLUSIVE


def test_vllm_raising_now_is_not_reproduced():
    err = {"kind": "vllm", "type": "ValueError", "message": "no", "request": 0}
    v = judge(_finding(), {"hits": [], "error": err}, [])
    assert v.verdict == NOT_REPRODUCED and v.reasons[0].startswith("vLLM raised now at request 0: ValueError")


def test_engine_error_findings_need_the_same_exception_type():
    raised = {"kind": "vllm", "type": "ValueError", "message": "budget", "request": 1}
    finding = {**_finding("engine_error", 1, (), (0,)), "observed": {"hits": [0], "queries": [], "error": raised}}
    div = Divergence("engine_error", "0.33.0", [1], [], [], "ValueError: budget")
    assert judge(finding, {"hits": [0], "error": raised}, [div]).verdict == REPRODUCED
    other = {**raised, "type": "AssertionError"}
    v = judge(finding, {"hits": [0], "error": other}, [div])
    assert v.verdict == NOT_REPRODUCED and v.reasons == ["vLLM raised AssertionError, the finding ValueError"]


def test_a_knobs_finding_has_no_first_request():
    finding = _finding("knobs", None, (True,), (0, 0))
    div = Divergence("knobs", "0.33.0", [], [True], [False], "knobs differ: eagle_drop model=True engine=False")
    assert judge(finding, {"hits": [0, 0]}, [div]).verdict == REPRODUCED
    assert judge(finding, {"hits": [0, 0]}, []).verdict == NOT_REPRODUCED


# ---------------------------------------------------------------- hits only (a live server)


def test_hits_only_reproduced_means_the_observed_hits_and_a_divergence_at_the_first_request():
    assert judge(_finding(), {"hits": [0, 0, 9600]}).verdict == REPRODUCED
    v = judge(_finding(), {"hits": [0, 9600, 9600]})
    assert v.verdict == NOT_REPRODUCED and v.reasons == ["request 1: observed hits 9600, the finding observed 0"]
    # a finding whose own expected hits equal its observed ones at its first divergence: the oracle cannot fire there
    assert judge(_finding(expected=(0, 0, 9600)), {"hits": [0, 0, 9600]}).verdict == NOT_REPRODUCED
    # live counters are floats
    assert judge(_finding(), {"hits": [0.0, 0.0, 9600.0]}).verdict == REPRODUCED


def test_hits_only_cannot_judge_knobs_or_a_finding_without_expected_hits():
    assert judge(_finding("knobs", None), {"hits": [0, 0, 9600]}).verdict == INCONCLUSIVE
    finding = _finding()
    finding["expected"] = {"hits": None}
    assert judge(finding, {"hits": [0, 0, 9600]}).verdict == INCONCLUSIVE


def test_a_schema_1_finding_without_first_divergence_diverges_where_expected_and_observed_part():
    finding = _finding()
    del finding["first_divergence"]
    assert Claim.of(finding).first == 1


def test_malformed_claims_are_one_line():
    with pytest.raises(InvalidArgument, match=r"^finding.oracle='bogus': allowed: promise"):
        Claim.of(_finding("bogus"))
    with pytest.raises(InvalidArgument, match=r"^finding.first_divergence=-1"):
        Claim.of(_finding(first=-1))
    with pytest.raises(InvalidArgument, match=r"^finding.observed.hits='x'"):
        Claim.of({**_finding(), "observed": {"hits": "x"}})


# ---------------------------------------------------------------- bare cases


def test_a_bare_case_against_a_target_agrees_or_diverges():
    obs = {"hits": [0, 9600], "queries": [11910, 11910], "knobs": {"eagle_drop": True, "hash_block_size": 1600}}
    assert judge(Target([0, 9600], "replay", [11910, 11910], {"eagle_drop": True}), obs).verdict == AGREES
    v = judge(Target([0, 11200], "promise"), obs)
    assert v.verdict == DIVERGES and v.reasons == ["request 1: observed hits 9600, target 11200"]
    assert judge(Target([0, 9600], None, [11910, 5]), obs).verdict == DIVERGES
    assert judge(Target([0, 9600], None, None, {"eagle_drop": False, "unreported": 1}), obs).reasons == [
        "knob eagle_drop: observed True, target False"
    ]
    raised = {"hits": [], "error": {"kind": "vllm", "type": "ValidationError", "message": "x", "request": 0}}
    assert judge(Target([0]), raised).verdict == DIVERGES


def test_a_bare_case_with_the_oracles_agrees_when_none_fires():
    assert judge(None, {"hits": [0]}, []).verdict == AGREES
    v = judge(None, {"hits": [0, 0]}, [_div("promise", 1, [0, 9600], [0, 0])])
    assert v.verdict == DIVERGES and v.first == 1 and v.oracle == "promise"


# ---------------------------------------------------------------- versions findings


def test_a_versions_finding_records_both_engines_and_replays_on_both():
    old, new = ReferenceDouble("0.29.0", "legacy"), ReferenceDouble("0.33.0", "replay")
    case = seed()
    obs, other = old.run(case), new.run(case)
    obs["vllm_files_sha256"], other["vllm_files_sha256"] = "a" * 64, "b" * 64
    (div,) = check_versions(case, "0.29.0", obs, "0.33.0", other)
    finding = F.make_finding(case, div, obs, other_observation=other)
    assert finding["kvspec_finding"] == 2
    assert finding["engine"]["name"] == "vllm==0.29.0" and finding["engine"]["vllm_files_sha256"] == "a" * 64
    assert finding["other_engine"] == {"name": "vllm==0.33.0", "version": "0.33.0", "vllm_files_sha256": "b" * 64}
    assert replay_case(case, finding, old, new)["verdict"] == REPRODUCED
    # from the other engine's side: the claim swaps observed and expected
    assert replay_case(case, finding, new, old)["verdict"] == REPRODUCED
    # the other engine now behaving like the engine under test: the oracle does not fire
    result = replay_case(case, finding, old, Pretending("0.33.0", old))
    assert result["verdict"] == NOT_REPRODUCED and "versions does not fire" in result["reasons"]
    # without the other engine a versions finding cannot be judged
    assert replay_case(case, finding, old)["verdict"] == INCONCLUSIVE


class Pretending(ReferenceDouble):
    """Another engine's behaviour under this version's name."""

    def __init__(self, version, like):
        super().__init__(version, like.rule)
        self.like = like

    def run(self, case):
        return self.like.run(case)


def test_a_versions_finding_whose_other_engine_differs_from_the_finding_is_not_reproduced():
    old = ReferenceDouble("0.29.0", "legacy")
    finding = _finding(
        "versions", 1, (0, 9600, 9600), (0, 0, 9600), other_engine={"name": "vllm==0.33.0", "version": "0.33.0"}
    )
    div = Divergence(
        "versions", "0.29.0", [1], [0, 8000, 8000], [0, 0, 9600], "expected = vllm==0.33.0", {"other_version": "0.33.0"}
    )
    v = judge(finding, old.run(seed()), [div], other_observation={"hits": [0, 8000, 8000]})
    assert v.verdict == NOT_REPRODUCED
    assert "request 1: the other engine hit 8000, the finding's other engine 9600" in v.reasons


def test_replay_on_engine_opens_the_other_engine_a_versions_finding_names(tmp_path, monkeypatch):
    doubles = {"0.29.0": ReferenceDouble("0.29.0", "legacy"), "0.33.0": ReferenceDouble("0.33.0", "replay")}
    opened = []
    monkeypatch.setattr(
        "engine_adapter.host.engine.open_engine",
        lambda spec, **kw: opened.append(spec.name) or doubles[spec.version],  # the typed engine, handed down
    )
    case = seed()
    obs, other = doubles["0.29.0"].run(case), doubles["0.33.0"].run(case)
    (div,) = check_versions(case, "0.29.0", obs, "0.33.0", other)
    path = F.write_finding(F.make_finding(case, div, obs), tmp_path)
    assert cli_main(["replay", str(path), "--engine", "vllm==0.29.0"]) == 0
    assert opened == ["vllm==0.29.0", "vllm==0.33.0"]
    assert cli_main(["replay", str(path), "--engine", "vllm==0.33.0"]) == 0
    assert opened[2:] == ["vllm==0.33.0", "vllm==0.29.0"]
    # a doctored finding: the oracle fires at request 1, the file says 2
    raw = json.loads(path.read_text())
    raw["first_divergence"] = 2
    path.write_text(json.dumps(raw))
    assert cli_main(["replay", str(path), "--engine", "vllm==0.29.0"]) == 1


# ---------------------------------------------------------------- deployments


class ResolvingDouble(ReferenceDouble):
    """A double that resolves a deployment case to a fixed scheduler block
    (per version, as real versions differ), reading the retention interval
    and the speculative config from the vllm serve flags."""

    def __init__(self, version, rule, block):
        super().__init__(version, rule)
        self.block = block

    def run(self, case):
        if case.deployment is None:
            return super().run(case)
        args = list(case.deployment.vllm_args)
        flag = lambda name, default: args[args.index(name) + 1] if name in args else default  # noqa: E731
        retention = flag("--prefix-cache-retention-interval", "0")
        geometry = hybrid(self.block, self.block, retention_interval=None if retention == "None" else int(retention))
        spec = flag("--speculative-config", None)
        spec = json.loads(spec) if spec else None
        res = with_resolution(case, geometry, spec, f"vllm=={self.version}")
        out = super().run(res)
        out["resolution"] = {"geometry": case_to_dict(res)["geometry"], "speculative": spec}
        return out


def deployment_case(prompts=(11910, 11910, 11910), spec=True):
    args = (["--speculative-config", SPEC] if spec else []) + ["--prefix-cache-retention-interval", "0"]
    return parse_case(
        {
            "schema": 1,
            "name": "dep",
            "deployment": {"model": "qwen3_next", "vllm_args": args},
            "trace": [{"prompt": [{"segment": "A", "length": n}]} for n in prompts],
        }
    )


def test_a_deployment_finding_is_judged_on_the_geometry_the_engine_resolved():
    old = ResolvingDouble("0.29.0", "legacy", 1600)
    finding = finding_of(deployment_case(), old)
    assert (
        finding["case"]["resolved_by"] == "vllm==0.29.0" and finding["case"]["geometry"]["scheduler_block_size"] == 1600
    )
    assert (
        finding["case_kind"] == "deployment"
        and finding["reachable"] is True
        and finding["resolution"]["geometry"]["scheduler_block_size"] == 1600
    )
    case, loaded = F.load_finding(_write(finding))
    assert replay_case(case, loaded, old)["verdict"] == REPRODUCED
    # the same deployment resolved to another block elsewhere: other hits, not reproduced
    result = replay_case(case, loaded, ResolvingDouble("0.29.0", "legacy", 1568))
    assert result["verdict"] == NOT_REPRODUCED and result["resolved"]["scheduler_block_size"] == 1568


def test_the_matrix_shows_each_version_s_resolved_block_and_verdict(tmp_path):
    path = tmp_path / "dep.json"
    path.write_text(json.dumps(case_to_dict(deployment_case())))
    rows = run_matrix(
        load_cases([str(path)]), [ResolvingDouble("0.29.0", "legacy", 1568), ResolvingDouble("0.33.0", "replay", 1600)]
    )
    cells = rows[0]["cells"]
    assert cells["0.29.0"]["block"] == 1568 and cells["0.33.0"]["block"] == 1600
    assert cells["0.29.0"]["verdict"] == DIVERGES and cells["0.33.0"]["verdict"] == AGREES
    md = to_markdown(rows, ["0.29.0", "0.33.0"])
    assert (
        "miss/miss/hit (0/0/9408) [block 1568] diverges" in md
        and "miss/hit/hit (0/9600/9600) [block 1600] agrees" in md
    )


def test_the_matrix_judges_a_finding_per_engine(tmp_path):
    finding = finding_of(seed(), ReferenceDouble("0.29.0", "legacy"))
    path = F.write_finding(finding, tmp_path)
    rows = run_matrix(
        load_cases([str(path)]), [ReferenceDouble("0.29.0", "legacy"), ReferenceDouble("0.33.0", "replay")]
    )
    assert (
        rows[0]["cells"]["0.29.0"]["verdict"] == REPRODUCED and rows[0]["cells"]["0.33.0"]["verdict"] == NOT_REPRODUCED
    )


def test_a_harness_error_in_a_variant_run_is_inconclusive():
    class VariantDies(ReferenceDouble):
        def run(self, case):
            if case.geometry is not None and case.geometry.retention_interval is None:
                return {"hits": [], "error": {"kind": "worker", "message": "timed out after 600s"}}
            return super().run(case)

    # the legacy rule misses the resend, so the dense variant must run (a
    # case that keeps the promise needs no variant: the oracle cannot fire)
    judged = observe_and_judge(seed(), None, VariantDies("0.29.0", "legacy"))
    assert judged.verdict.verdict == INCONCLUSIVE and "a variant of the case did not run" in judged.verdict.reasons[0]


def _write(finding, tmp=None):
    import tempfile

    folder = tmp or tempfile.mkdtemp(prefix="kvspec-verdict-")
    return F.write_finding(finding, folder)


# ---------------------------------------------------------------- schema


def test_schema_2_records_kvspec_the_harness_and_the_engine():
    obs = ReferenceDouble("0.29.0", "legacy").run(seed())
    obs.update({"vllm_files_sha256": "c" * 64, "harness": {"mode": "worker", "platform": "cuda"}})
    case = seed()
    (div,) = check_all(case, "0.29.0", obs, None, ("promise",))
    f = F.make_finding(case, div, obs)
    assert f["kvspec_finding"] == F.FINDING_SCHEMA == 2
    assert f["engine"] == {
        "name": "vllm==0.29.0",
        "version": "0.29.0",
        "vllm_files_sha256": "c" * 64,
        "knobs": obs["knobs"],
    }
    assert f["other_engine"] is None
    assert f["harness"] == {"mode": "worker", "platform": "cuda"}
    assert f["kvspec"]["version"] == "0.1.0" and (f["kvspec"]["commit"] is None or len(f["kvspec"]["commit"]) == 40)
    assert {"case_kind", "reachable", "reachability", "resolution"} <= set(f)
    assert "harness: worker on cuda; kvspec 0.1.0" in F.render(f)


def test_schema_1_files_still_load_and_replay(tmp_path):
    v1 = {  # a finding as kvspec wrote it before schema 2
        "kvspec_finding": 1,
        "summary": "request 1 (resend) hit 0, expected 9600 (expected = vllm==0.33.0)",
        "oracle": "versions",
        "signature": "0123456789abcdef",
        "engine": {"version": "0.29.0", "knobs": {}},
        "first_divergence": 1,
        "diverging_requests": [1],
        "expected": {"hits": [0, 9600, 9600], "detail": "expected = vllm==0.33.0"},
        "observed": {"hits": [0, 0, 9600], "queries": [11910] * 3, "error": None},
        "explain": {"model": [], "engine": []},
        "reproduced_twice": True,
        "seed": None,
        "found_at": "2025-01-01T00:00:00Z",
        "case": case_to_dict(seed()),
    }
    path = tmp_path / "versions-0123456789abcdef.json"
    path.write_text(json.dumps(v1))
    case, finding = F.load_finding(path)
    assert finding["kvspec_finding"] == 1
    assert finding["engine"]["name"] == "vllm==0.29.0" and finding["other_engine"]["version"] == "0.33.0"
    assert finding["kvspec"] is None and finding["harness"] is None and finding["resolution"] is None
    assert (
        replay_case(case, finding, ReferenceDouble("0.29.0", "legacy"), ReferenceDouble("0.33.0", "replay"))["verdict"]
        == REPRODUCED
    )
    v1["kvspec_finding"] = 3
    path.write_text(json.dumps(v1))
    with pytest.raises(InvalidArgument, match=r"^kvspec_finding=3: this kvspec reads finding schemas 1, 2$"):
        F.load_finding(path)


# ---------------------------------------------------------------- run --compare and predict of a deployment


class _Opened:
    def __init__(self, engine):
        self.engine, self.mode = engine, "inprocess"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @property
    def version(self):
        return self.engine.version

    def run(self, case, options=None, timeout=None):
        return self.engine.run(case)

    def resolve(self, case):
        out = self.engine.run(case)
        return out["resolution"]


def test_run_compare_predicts_a_deployment_on_its_resolution_and_exits_by_the_judge(tmp_path, monkeypatch, capsys):
    # a block-aligned prompt's one-token extension: 0.33.0 resumes at the replay boundary 1152, the promise says 1280
    path = tmp_path / "dep.json"
    path.write_text(json.dumps(case_to_dict(deployment_case((1280, 1281), spec=False))))
    monkeypatch.setattr(
        "engine_adapter.host.engine.open_engine", lambda name, **kw: _Opened(ResolvingDouble("0.33.0", "replay", 128))
    )
    assert cli_main(["run", str(path), "--engine", "vllm==0.33.0", "--compare", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == AGREES and out["reference"]["hits"] == [0, 1152] and out["observed"]["hits"] == [0, 1152]
    assert cli_main(["run", str(path), "--engine", "vllm==0.33.0", "--compare", "--json", "--rule", "promise"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == DIVERGES and out["reasons"] == ["request 1: observed hits 1152, target 1280"]


def test_run_exits_3_when_the_engine_did_not_run_the_case(tmp_path, monkeypatch, capsys):
    class Dead(ReferenceDouble):
        def run(self, case):
            return {
                "engine": "vllm==0.33.0",
                "hits": [],
                "queries": [],
                "knobs": None,
                "explain": [],
                "error": {"kind": "worker", "type": "worker", "message": "worker died (exit -9)"},
            }

    path = tmp_path / "seed.json"
    path.write_text(json.dumps(case_to_dict(seed())))
    monkeypatch.setattr("engine_adapter.host.engine.open_engine", lambda name, **kw: _Opened(Dead("0.33.0", "replay")))
    for extra in ([], ["--compare"]):
        assert cli_main(["run", str(path), "--engine", "vllm==0.33.0", *extra]) == 3
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "kvspec's own failure, not vLLM's" in err


def test_predict_resolves_a_deployment_through_the_engine_of_its_version(tmp_path, monkeypatch, capsys):
    path = tmp_path / "dep.json"
    path.write_text(json.dumps(case_to_dict(deployment_case())))
    opened = []
    monkeypatch.setattr(
        "engine_adapter.host.engine.open_engine",
        lambda spec, **kw: opened.append(spec.name) or _Opened(ResolvingDouble(spec.version, "replay", 1568)),
    )  # the typed engine, parsed once
    assert cli_main(["predict", str(path), "--as", "vllm==0.29.0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (
        opened == ["vllm==0.29.0"]
        and out["resolved_by"] == "vllm==0.29.0"
        and out["knobs"]["scheduler_block_size"] == 1568
    )
    # a case resolved by that very version: its own geometry, no engine
    res = ResolvingDouble("0.33.0", "replay", 1600).run(deployment_case())["resolution"]
    resolved_case = with_resolution(deployment_case(), res["geometry"], res["speculative"], "vllm==0.33.0")
    path.write_text(json.dumps(case_to_dict(resolved_case)))
    assert cli_main(["predict", str(path), "--as", "vllm==0.33.0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (
        opened == ["vllm==0.29.0"]
        and out["hits"] == predict_with_knobs(resolved_case, resolve_knobs(resolved_case, "0.33.0"), "promise")["hits"]
    )
    # ... by another version: resolved again by this one
    assert cli_main(["predict", str(path), "--as", "vllm==0.29.0"]) == 0
    assert (
        opened == ["vllm==0.29.0", "vllm==0.29.0"]
        and json.loads(capsys.readouterr().out)["knobs"]["scheduler_block_size"] == 1568
    )


def test_predict_as_an_sglang_release_is_parsed_as_sglang_not_vllm(tmp_path, monkeypatch, capsys):
    """``kvspec predict --as sglang==0.5.23`` (issue 41): the name is parsed
    once, as SGLang's; it never becomes ``vllm==sglang==0.5.23``. A vLLM
    deployment asked as SGLang is one line, exit 2; so is a deployment
    SGLang resolves to a cache the promise is not stated for."""
    path = tmp_path / "dep.json"
    path.write_text(json.dumps(case_to_dict(deployment_case())))
    opened = []
    monkeypatch.setattr("engine_adapter.host.engine.open_engine", lambda spec, **kw: opened.append(spec) or None)
    assert cli_main(["predict", str(path), "--as", "sglang==0.5.23"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "--as='sglang==0.5.23'" in err
        and "deployment is for vllm" in err
        and "vllm==sglang" not in err
    )
    assert opened == []
    sglang = tmp_path / "sglang.json"
    sglang.write_text(
        (Path(__file__).resolve().parents[2] / "examples" / "sglang-no-buffer-qwen3_next.json").read_text()
    )

    class Unstated:  # a test double: SGLang's answer for a no-buffer cache (no geometry)
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def resolve(self, case):
            return {"geometry": None, "speculative": None}

    monkeypatch.setattr(
        "engine_adapter.host.engine.open_engine", lambda spec, **kw: opened.append(spec.name) or Unstated()
    )
    assert cli_main(["predict", str(sglang), "--as", "sglang==0.5.23"]) == 2
    err = capsys.readouterr().err
    assert opened == ["sglang==0.5.23"] and err.count("\n") == 1 and "--as=sglang==0.5.23: SGLang resolved" in err
