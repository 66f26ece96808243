"""TEST DOUBLES for the fuzz machinery's unit tests.

These stand in for an engine only where the machinery itself is under test
(oracles, shrinking, dedup, finding files, drivers). They never stand in for
vLLM in a differential check: those run the real engine (tests/engine/).
"""

from __future__ import annotations

from dataclasses import replace
from unittest import mock

from ground.engines import EngineSpec
from reference.boundaries import floor_to
from reference.case import Case
from reference.knobs import resolve_knobs
from reference.predict import predict_with_knobs


class ReferenceDouble:
    """The reference model under ``rule`` pretending to be vLLM ``version``."""

    def __init__(self, version, rule: str):
        """``version``: a version key, or the typed engine a command handed
        down (``ground.engines.EngineSpec``: its knobs are resolved without
        reading a name again)."""
        self.engine = version
        self.version = getattr(version, "version", version)
        #: the typed engine, as a real engine object holds it (None for a key)
        self.spec = version if isinstance(version, EngineSpec) else None
        self.rule, self.calls = rule, 0

    def _predict(self, case: Case) -> dict:
        """The model's answer; a concurrent trace is served as an engine
        that never batches would serve it: one request at a time (the
        model predicts a serial trace only)."""
        if any(r.arrival is not None for r in case.trace):
            case = replace(case, trace=tuple(replace(r, arrival=None) for r in case.trace))
        return predict_with_knobs(case, resolve_knobs(case, self.engine), self.rule)

    def run(self, case: Case) -> dict:
        self.calls += 1
        out = self._predict(case)
        return {"hits": out["hits"], "queries": out["queries"], "knobs": out["knobs"], "explain": out["explain"]}


class HalfFixDouble(ReferenceDouble):
    """A planted half fix of the retention rule: it keeps only the longer
    sibling's boundary, so with the EAGLE drop (0.30.0 knobs) an identical
    resend misses exactly when S divides N and N >= 3S."""

    def __init__(self):
        super().__init__("0.30.0", "promise")

    def _predict(self, case: Case) -> dict:
        def extension_only(N, geometry, knobs):
            S = geometry.scheduler_block_size
            ext = floor_to(N - knobs.hash_lookahead_tokens, S) - (S if knobs.eagle_drop else 0)
            return (max(ext, 0),)

        with mock.patch("reference.serial.promise_boundaries", extension_only):
            return super()._predict(case)


class RaisingDouble(ReferenceDouble):
    """Raises 'inside the engine' on prompts longer than ``limit`` tokens, as
    vLLM reports it: an observation with ``error``."""

    def __init__(self, limit: int):
        super().__init__("0.33.0", "replay")
        self.limit = limit

    def run(self, case: Case) -> dict:
        self.calls += 1
        for i, r in enumerate(case.trace):
            if r.num_prompt_tokens > self.limit:
                return {
                    "error": {
                        "kind": "vllm",
                        "type": "ValueError",
                        "message": f"prompt of {r.num_prompt_tokens} tokens exceeds {self.limit}",
                        "traceback": "Traceback ...",
                        "request": i,
                    }
                }
        return super().run(case)


class BrokenHarnessDouble(ReferenceDouble):
    """The legacy rule (its resend misses are real divergences) behind a
    broken harness: every ``every``-th run comes back as ``WorkerEngine``
    reports a dead worker or an adapter exception (error kind ``worker`` or
    ``internal``, never ``vllm``)."""

    def __init__(self, every: int, kind: str = "worker"):
        super().__init__("0.29.0", "legacy")
        self.every, self.kind, self.runs = every, kind, 0

    def run(self, case: Case) -> dict:
        self.runs += 1
        if self.runs % self.every == 0:
            return {
                "engine": "vllm==0.29.0",
                "hits": [],
                "queries": [],
                "knobs": None,
                "explain": [],
                "error": {
                    "kind": self.kind,
                    "phase": "worker",
                    "request": None,
                    "type": self.kind,
                    "message": "worker died (exit -9): (no stderr)",
                    "traceback": None,
                },
            }
        return super().run(case)


class UnreachableDouble(ReferenceDouble):
    """An engine that cannot be reached: every run raises EngineError, as
    ``WorkerEngine`` does when its worker does not start."""

    def __init__(self):
        super().__init__("0.33.0", "replay")

    def run(self, case: Case) -> dict:
        from ground.errors import EngineError

        self.calls += 1
        raise EngineError("engine='vllm==0.33.0': worker did not start within 180s or exited: (no stderr)")


class ResolvingDouble:
    """An engine that 'resolves' every deployment case to one Qwen3-Next-like
    geometry (attention 544, Mamba 544) with the deployment's
    ``--prefix-match-unit`` and ``hash_block_size`` ``hashed``, and hits
    nothing: what a build that drops (``hashed`` != the unit) or keeps the
    flag reports, for the ``resolution`` oracle's machinery."""

    version = "0.33.0+drops-unit.000000"

    def __init__(self, hashed: int | None = None):
        self.hashed, self.calls = hashed, 0

    def run(self, case: Case) -> dict:
        self.calls += 1
        args = list(case.deployment.vllm_args)
        unit = int(args[args.index("--prefix-match-unit") + 1]) if "--prefix-match-unit" in args else None
        geometry = {
            "groups": [{"kind": "full_attention", "block_size": 544}, {"kind": "mamba", "block_size": 544, "count": 1}],
            "prefix_match_unit": unit,
            "hash_block_size": self.hashed or unit or 544,
            "retention_interval": 0,
            "max_num_batched_tokens": 2048,
        }
        n = len(case.trace)
        return {
            "hits": [0] * n,
            "queries": [r.num_prompt_tokens for r in case.trace],
            "knobs": {},
            "explain": [{} for _ in range(n)],
            "resolution": {"geometry": geometry, "speculative": None},
        }


class SetupErrorDouble:
    """An engine whose vLLM raises while building the scheduler for every
    deployment case (no resolution comes back), as a mutant that accepts a
    ``--prefix-match-unit`` vLLM rejects and then trips an assertion does."""

    version = "0.33.0+asserts.000000"

    def run(self, case: Case) -> dict:
        return {
            "hits": [],
            "queries": [],
            "knobs": None,
            "explain": [],
            "error": {
                "kind": "vllm",
                "phase": "setup",
                "request": None,
                "type": "AssertionError",
                "message": "AssertionError: ",
                "traceback": "Traceback ...",
            },
        }
