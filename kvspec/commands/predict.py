"""kvspec predict CASE.json [--as vllm==X] [--rule promise|replay|legacy]

A hand case is predicted as it is. A deployment case is predicted on the
geometry vLLM X resolves for it: its own geometry when the case was resolved
by X (``resolved_by``), else resolved now through X's engine
(``kvspec resolve``'s code path; the engine environment must be installed).
The output then carries ``resolved_by``.
"""

from __future__ import annotations

import json

from reference.case import Case, load_case
from reference.knobs import DEFAULT_VERSION, parse_version
from reference.predict import predict
from reference.serial import RULES

HELP = "predict every request's prefix-cache hits with the reference model (a deployment: as vLLM X resolves it)"


def configure(parser) -> None:
    parser.add_argument("case", help="case file (JSON, schema 1) or a finding file")
    parser.add_argument("--as", dest="version", default=f"vllm=={DEFAULT_VERSION}", help="resolve knobs (and a deployment) as this vLLM version does (default: %(default)s)")
    parser.add_argument("--rule", choices=RULES, default="promise", help="retention rule (default: %(default)s)")


def resolved_as(case: Case, version: str) -> Case:
    """``case`` with the geometry vLLM ``version`` resolves: a hand case as
    it is; a deployment resolved by that version as it is; any other
    deployment resolved now through that version's engine."""
    if case.deployment is None or case.resolved_by == f"vllm=={version}":
        return case
    from engine_adapter import open_engine
    from reference.case import with_resolution

    with open_engine(f"vllm=={version}") as engine:
        r = engine.resolve(case)
    return with_resolution(case, r["geometry"], r["speculative"], f"vllm=={version}")


def predict_llamacpp(case: Case, name: str) -> dict:
    """A llama.cpp case: the settings its server resolves (through its
    engine), then llama.cpp's rule (``reference.llamacpp``)."""
    from engine_adapter import open_engine
    from engine_adapter.host.versions import EngineSpec
    from reference.llamacpp import Settings
    from reference.llamacpp import predict as predict_llamacpp_rule

    spec = EngineSpec.parse(name, "--as")
    if case.deployment is None or case.deployment.engine != "llamacpp":
        from ground.errors import invalid

        raise invalid("--as", name, "a llama.cpp engine predicts a deployment case with \"engine\": \"llamacpp\"; allowed: vllm==X for other cases")
    with open_engine(spec) as engine:
        r = engine.resolve(case)
    out = predict_llamacpp_rule(case, Settings.of(r["server"], r["params"]))
    out["resolved_by"] = spec.name
    return out


def main(args) -> int:
    if str(args.version).startswith("llamacpp=="):
        print(json.dumps(predict_llamacpp(load_case(args.case), args.version), indent=2))
        return 0
    version = parse_version(args.version)
    case = resolved_as(load_case(args.case), version)
    result = predict(case, version, args.rule)
    if case.deployment is not None:
        result["resolved_by"] = case.resolved_by
    print(json.dumps(result, indent=2))
    return 0
