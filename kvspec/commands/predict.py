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


def predict_sglang(case: Case, name: str, rule: str) -> dict:
    """An SGLang deployment case (``--as sglang==X``): resolved through
    SGLang X's engine, then predicted by SGLang's implemented rule
    (``replay``: :mod:`reference.sglang_prefill`) or the promise (on the
    geometry SGLang resolved; not stated under ``no_buffer``)."""
    from engine_adapter import open_engine
    from ground.errors import Unsupported, invalid
    from reference.case import with_resolution
    from reference.sglang_prefill import SglangSetting
    from reference.sglang_prefill import predict as sglang_predict

    if case.deployment is None or case.deployment.engine != "sglang":
        raise invalid("--as", name, "predicts a deployment case with \"engine\": \"sglang\"; allowed: vllm==X for other cases")
    if rule not in ("promise", "replay"):
        raise invalid("--rule", rule, f"with --as {name}: promise or replay (SGLang's implemented rule)")
    with open_engine(name) as engine:
        r = engine.resolve(case)
    if rule == "replay":
        out = sglang_predict(case, SglangSetting.from_resolution(r), name)
    else:
        if r.get("geometry") is None:
            raise Unsupported(f"--rule promise: {name} resolved {case.deployment.describe()} to a cache the promise is not stated for (strategy {r.get('mamba_radix_cache_strategy')}); allowed: --rule replay")
        out = predict(with_resolution(case, r["geometry"], None, name), name, "promise")
    out["resolved_by"] = name
    return out


def main(args) -> int:
    if str(args.version).startswith("sglang=="):
        name = parse_version(args.version)
        print(json.dumps(predict_sglang(load_case(args.case), name, args.rule), indent=2))
        return 0
    version = parse_version(args.version)
    case = resolved_as(load_case(args.case), version)
    result = predict(case, version, args.rule)
    if case.deployment is not None:
        result["resolved_by"] = case.resolved_by
    print(json.dumps(result, indent=2))
    return 0
