"""The toy family's driver (a TEST DOUBLE, see the package docstring): a
deployment ``{"engine": "toy", "toy_args": ["--block", "N"]}`` resolves to a
one-Mamba-group hybrid geometry of block N, and a case runs as the reference
model predicts it under the promise."""

from __future__ import annotations

from dataclasses import replace

from ground.errors import InvalidArgument
from reference.case import Case, case_to_dict, with_resolution
from reference.knobs import Knobs, vllm_knobs
from reference.predict import predict_with_knobs

RELEASE = "1.0.0"


def check(args) -> None:
    """The toy's serve-flag allow-list: ``--block N`` (N a multiple of 16)."""
    if (
        not isinstance(args, list)
        or len(args) not in (0, 2)
        or (args and (args[0] != "--block" or not str(args[1]).isdigit() or int(args[1]) % 16))
    ):
        raise InvalidArgument(f"deployment.toy_args={args!r}: allowed: [] or ['--block', N] with N a multiple of 16")


def knobs(case: Case, version: str) -> Knobs:
    """The knobs the promise reads for a toy geometry: vLLM 0.33.0's rule
    shape on it (no speculative decoding)."""
    return vllm_knobs(case, "0.33.0")


def _geometry(block: int) -> dict:
    return {
        "groups": [{"kind": "full_attention", "block_size": block}, {"kind": "mamba", "block_size": block, "count": 2}]
    }


class ToyDriver:
    family = "toy"
    version = RELEASE

    def resolve(self, case: Case) -> dict:
        args = list(case.deployment.args)
        block = int(args[1]) if args else 64
        geometry = case_to_dict(with_resolution(case, _geometry(block), None, f"toy=={RELEASE}"))[
            "geometry"
        ]  # its full form
        return {
            "engine_family": "toy",
            "geometry": geometry,
            "speculative": None,
            "facts": {"platform": case.deployment.platform},
        }

    def run(self, case: Case, options: dict | None = None) -> dict:
        resolution = None
        if case.deployment is not None and case.geometry is None:
            resolution = self.resolve(case)
            case = with_resolution(case, resolution["geometry"], None, f"toy=={RELEASE}")
        if any(r.arrival is not None for r in case.trace):
            case = replace(case, trace=tuple(replace(r, arrival=None) for r in case.trace))
        out = predict_with_knobs(case, knobs(case, RELEASE), "promise")
        obs = {"hits": out["hits"], "queries": out["queries"], "knobs": out["knobs"], "explain": out["explain"]}
        return obs if resolution is None else {**obs, "resolution": resolution}


def get_driver() -> ToyDriver:
    return ToyDriver()
