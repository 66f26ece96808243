"""kvspec predict CASE.json [--as vllm==X] [--rule promise|replay|legacy]"""

from __future__ import annotations

import json

from reference.case import load_case
from reference.knobs import DEFAULT_VERSION
from reference.predict import predict
from reference.serial import RULES

HELP = "predict every request's prefix-cache hits with the reference model"


def configure(parser) -> None:
    parser.add_argument("case", help="case file (JSON, schema 1) or a finding file")
    parser.add_argument("--as", dest="version", default=f"vllm=={DEFAULT_VERSION}", help="resolve knobs as this vLLM version does (default: %(default)s)")
    parser.add_argument("--rule", choices=RULES, default="promise", help="retention rule (default: %(default)s)")


def main(args) -> int:
    result = predict(load_case(args.case), args.version, args.rule)
    print(json.dumps(result, indent=2))
    return 0
