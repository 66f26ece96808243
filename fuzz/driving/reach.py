"""What a campaign has run: deployment classes x trace shapes.

A campaign's power is measured (``bench/rediscovery.py``), and so is its
reach: which deployment classes (``fuzz.draw.generate.DeploymentClass``: model,
speculative mode, hash unit, retention, the features the promise's
boundaries depend on) it ran cases of, and which trace shapes (the kinds of
request a case holds: resend, extension, sibling, and a junction chain,
two siblings diverging at the same point) on each. ``kvspec fuzz`` prints
the count and the classes it never reached; ``--json`` has the table.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from fuzz.draw.generate import ANY_RETENTION, DeploymentClass, deployment_classes
from fuzz.judge.oracles import request_kinds
from reference.case import Case, is_concurrent, prompt_tokens
from reference.serial import common_prefix


def deployment_class_of(case: Case) -> DeploymentClass | None:
    """The class of a deployment case (None for a hand geometry)."""
    dep = case.deployment
    if dep is None:
        return None
    args = list(dep.vllm_args)

    def value(flag: str) -> str | None:
        return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None

    spec_text = value("--speculative-config")
    try:
        config = json.loads(spec_text) if spec_text is not None else None
    except ValueError:
        config = None
    if not isinstance(config, dict):
        spec = "off"
    elif config.get("method", "mtp") == "mtp" or str(config.get("method")).endswith("_mtp"):
        spec = "drop" if config.get("disable_lookahead_block_hashes") is True else "mtp"
    else:
        spec = "other"
    retention = {None: "sparse", "0": "sparse", "None": "dense"}.get(
        value("--prefix-cache-retention-interval"), "periodic"
    )
    if spec == "other":
        retention = ANY_RETENTION
    return DeploymentClass(dep.model, spec, "--prefix-match-unit" in args, retention)


def trace_shape(case: Case) -> str:
    """The kinds of request a case holds after its first, in a fixed order
    (``fresh`` only: a case of fresh prompts), plus ``junction-chain``
    where two siblings diverge from earlier prompts at the same point, and
    ``concurrent`` where requests share scheduler steps."""
    kinds = request_kinds(case)
    shape = sorted(set(kinds[1:]) - {"fresh"}) or ["fresh"]
    tokens = [prompt_tokens(r) for r in case.trace]
    points = []
    for i, kind in enumerate(kinds):
        if kind != "sibling":
            continue
        common = max((common_prefix(tokens[i], tokens[j]) for j in range(i)), default=0)
        points.append(common)
    if len(points) != len(set(points)):
        shape.append("junction-chain")
    if is_concurrent(case):
        shape.append("concurrent")
    return "+".join(shape)


def pressure_of(obs: dict) -> list[str]:
    """What the engine's observation of a case shows of a cache under
    pressure and of its scheduler: ``pinned`` (the deployment sized the
    pool, resolution fact ``pool_set_by_deployment``), ``evicted`` (a
    request's allocations evicted cached blocks: ``explain[i].evicted``),
    ``preempted`` (a request was preempted: ``preempted_steps``), and
    ``async`` or ``sync`` where the resolution says which scheduler served
    it (``async_scheduling``)."""
    facts = (obs.get("resolution") or {}).get("facts") or {}
    explain = [e for e in (obs.get("explain") or []) if isinstance(e, dict)]
    seen = []
    if facts.get("pool_set_by_deployment"):
        seen.append("pinned")
    if any(e.get("evicted") for e in explain):
        seen.append("evicted")
    if any(e.get("preempted_steps") for e in explain):
        seen.append("preempted")
    if "async_scheduling" in facts:
        seen.append("async" if facts["async_scheduling"] else "sync")
    return seen


@dataclass
class Reach:
    """Cases run per (deployment class label, trace shape), and cases whose
    observation showed pressure or a scheduler (:func:`pressure_of`)."""

    counts: Counter = field(default_factory=Counter)
    pressure: Counter = field(default_factory=Counter)

    def add(self, case: Case) -> None:
        cls = deployment_class_of(case)
        self.counts[(cls.label() if cls else "hand", trace_shape(case))] += 1

    def observed(self, obs: dict) -> None:
        self.pressure.update(pressure_of(obs))

    def as_dict(self) -> dict:
        labels = {cls.label() for cls in deployment_classes()}
        seen = {label for label, _shape in self.counts}
        return {
            "deployment_classes": len(seen & labels),
            "of": len(labels),
            "never_reached": sorted(labels - seen),
            "shapes": dict(Counter(shape for _label, shape in self.counts.elements())),
            "pressure": {k: self.pressure.get(k, 0) for k in ("pinned", "evicted", "preempted", "async", "sync")},
            "cases": {f"{label} | {shape}": n for (label, shape), n in sorted(self.counts.items())},
        }
