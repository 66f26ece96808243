"""kvspec predict CASE.json [--as ENGINE] [--rule promise|replay|legacy]

A hand case is predicted as it is. A deployment case is predicted on the
geometry vLLM X resolves for it: its own geometry when the case was resolved
by X (``resolved_by``), else resolved now through X's engine
(``kvspec resolve``'s code path; the engine environment must be installed).
The output then carries ``resolved_by``.
"""

from __future__ import annotations

import json

from engine_adapter.models.served import check_case_model
from ground.engines import EngineSpec, load
from ground.errors import Unsupported, invalid
from kvspec.rule_option import add_rule_argument
from reference.case import Case, load_case
from reference.knobs import DEFAULT_VERSION
from reference.predict import predict

HELP = "predict every request's prefix-cache hits with the reference model (a deployment: as vLLM X resolves it)"


def configure(parser) -> None:
    parser.add_argument("case", help="case file (JSON, schema 1) or a finding file")
    parser.add_argument(
        "--as",
        dest="version",
        default=f"vllm=={DEFAULT_VERSION}",
        help="resolve knobs (and a deployment) as this engine release does: vllm==X or sglang==X (default: %(default)s)",
    )
    add_rule_argument(parser, what="retention rule")


def resolution(case: Case, spec: EngineSpec) -> dict:
    """Engine ``spec``'s own resolution of a deployment case, raw (the
    geometry, or a family's settings: ``kvspec resolve``'s code path)."""
    from engine_adapter import open_engine

    with open_engine(spec) as engine:
        return engine.resolve(case)


def _own_deployment(case: Case, spec: EngineSpec, said: str) -> None:
    """A family's predictor takes a deployment of its own family only."""
    if case.deployment is None or case.deployment.engine != spec.family:
        raise invalid("--as", spec.name, f"{said}; allowed: an engine of the case's family")


def resolved_as(case: Case, spec: EngineSpec) -> Case:
    """``case`` with the geometry engine ``spec`` resolves: a hand case as
    it is; a deployment resolved by that engine's release as it is; any
    other deployment resolved now through that release's engine."""
    name = spec.release_spec.name
    if case.deployment is None or case.resolved_by == name:
        return case
    from reference.case import with_resolution

    r = resolution(case, spec.release_spec)
    if r.get("geometry") is None:  # the family resolved a cache the promise is not stated for
        raise Unsupported(
            f"--as={name}: {spec.family_entry.title} resolved {case.deployment.describe()} to a cache kvspec does not predict; allowed: a deployment it resolves to a stated geometry"
        )
    return with_resolution(case, r["geometry"], r["speculative"], name)


def predict_llamacpp(case: Case, spec: EngineSpec, rule: str) -> dict:
    """A llama.cpp case: the settings its server resolves (through its
    engine), then llama.cpp's rule (``reference.llamacpp``; the rule
    llama.cpp implements whatever ``rule`` names: its own table judges it)."""
    from reference.llamacpp import Settings
    from reference.llamacpp import predict as predict_llamacpp_rule

    _own_deployment(
        case, spec, f'a {spec.family_entry.title} engine predicts a deployment case with "engine": "{spec.family}"'
    )
    r = resolution(case, spec)
    out = predict_llamacpp_rule(case, Settings.of(r["server"], r["params"]))
    out["resolved_by"] = spec.name
    return out


def predict_sglang(case: Case, spec: EngineSpec, rule: str) -> dict:
    """An SGLang deployment case (``--as sglang==X``): resolved through
    SGLang X's engine, then predicted by SGLang's implemented rule
    (``replay``: :mod:`reference.sglang_prefill`) or the promise (on the
    geometry SGLang resolved; not stated under ``no_buffer``)."""
    from reference.case import with_resolution
    from reference.sglang_prefill import SglangSetting
    from reference.sglang_prefill import predict as sglang_predict

    name = spec.name
    _own_deployment(case, spec, f'predicts a deployment case with "engine": "{spec.family}"')
    if rule not in ("promise", "replay"):
        raise invalid("--rule", rule, f"with --as {name}: promise or replay (SGLang's implemented rule)")
    r = resolution(case, spec)
    if rule == "replay":
        out = sglang_predict(case, SglangSetting.from_resolution(r), name)
    else:
        if r.get("geometry") is None:
            raise Unsupported(
                f"--as={name}: {spec.family_entry.title} resolved {case.deployment.describe()} to a cache the promise is not stated for (strategy {r.get('mamba_radix_cache_strategy')}); allowed: --rule replay"
            )
        out = predict(with_resolution(case, r["geometry"], None, name), spec, "promise")
    out["resolved_by"] = name
    return out


def main(args) -> int:
    spec = EngineSpec.parse(args.version, "--as")  # the name parsed once, here
    case = load_case(args.case)
    check_case_model(case)  # a config naming code: one line before any engine starts
    if case.deployment is not None and case.deployment.engine != spec.family:
        raise invalid(
            "--as",
            args.version,
            f"the case's deployment is for {case.deployment.engine}; allowed: an engine of that family",
        )
    if spec.family_entry.predictor:  # a family with a prediction of its own
        print(json.dumps(load(spec.family_entry.predictor)(case, spec, args.rule), indent=2))
        return 0
    case = resolved_as(case, spec)
    result = predict(case, spec, args.rule)  # the typed engine, not its name again
    if case.deployment is not None:
        result["resolved_by"] = case.resolved_by
    print(json.dumps(result, indent=2))
    return 0
