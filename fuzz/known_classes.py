"""The known vLLM bug classes, and how a finding is recognised as one.

A class is named by the rule it breaks, not by a trace: a finding belongs
to it when its oracle, the kind of its first diverging request, the
direction of the error and the deployment's retention, hash unit and
speculative mode say so (:func:`classify`). Nothing here tells a campaign
where to look: ``bench/rediscovery.py`` counts how soon a campaign from an
empty corpus finds each class by itself (time to bug, as FuzzBench and
Magma measure it), and ``examples/README.md`` holds each class's
deployment, cause and fix.

===========================  ========  =========================================
class                        release   recognised by
===========================  ========  =========================================
``resend-53504``             0.29.0    an identical resend hits below the promise
                                       under the EAGLE drop (vLLM #53504)
``longer-sibling``           0.33.0    R2: an extension hits below the promise,
                                       sparse retention, hash block = block
``hashed-longer-sibling``    0.33.0    R2 with a hash unit below the block,
                                       sparse retention (first seen on Falcon-H1:
                                       A:288 then A:300, block 144, unit 16, hits
                                       272 where the promise gives 288)
``stale-state``              0.33.0    the ``stale`` oracle: a hit resumes from
                                       a state no prefill wrote
``resend-beside-checkpoint`` 0.33.0    R1: a resend hits below the promise under
                                       the drop, a hash unit below the block,
                                       periodic or dense retention
``dense-below-sparse``       0.33.0    an extension hits below the promise under
                                       dense or periodic retention (which keep
                                       more than sparse) with a hash unit below
                                       the block (where sparse retention holds)
===========================  ========  =========================================

The promise-breaking oracles that speak of one request's hit (``promise``,
``sparse_dense``, ``spec_on_off``) are taken alike: a campaign writes
whichever fires first, and each names the same broken hit.
"""

from __future__ import annotations

from dataclasses import dataclass

from reference.case import parse_case
from ground.errors import KvspecError

from fuzz.oracle_registry import HIT_ORACLES
from fuzz.oracles import SAME_STEP_READ, request_kinds


@dataclass(frozen=True)
class KnownClass:
    id: str
    release: str  # the newest release kvspec has that shows it
    promise: str  # the promise it breaks (fuzz.checkbuild.PROMISES)
    rule: str  # what a finding of it says, in one line


KNOWN_CLASSES = (
    KnownClass("resend-53504", "0.29.0", "R1", "an identical resend hits below the promise under the EAGLE drop (vLLM #53504)"),
    KnownClass("longer-sibling", "0.33.0", "R2", "a longer sibling hits below the promise under sparse retention, hash block = block"),
    KnownClass("hashed-longer-sibling", "0.33.0", "R2", "a longer sibling hits below the promise under sparse retention with a hash unit below the block (seen on Falcon-H1)"),
    KnownClass("stale-state", "0.33.0", "no-stale", "a hit resumes from a Mamba state no prefill wrote (the stale oracle)"),
    KnownClass("resend-beside-checkpoint", "0.33.0", "R1", "an identical resend hits below the promise under the EAGLE drop, a hash unit below the block, periodic or dense retention"),
    KnownClass("dense-below-sparse", "0.33.0", "R2", "a longer sibling hits below the promise under dense or periodic retention with a hash unit below the block"),
)
BY_ID = {k.id: k for k in KNOWN_CLASSES}


def _low_hit(finding: dict) -> tuple[str, dict] | None:
    """(the first diverging request's kind, the case's geometry) when the
    finding says that request hit less than it must; None otherwise."""
    if finding.get("oracle") not in HIT_ORACLES:
        return None
    i = finding.get("first_divergence")
    exp = (finding.get("expected") or {}).get("hits") or []
    obs = (finding.get("observed") or {}).get("hits") or []
    if not isinstance(i, int) or i >= len(exp) or i >= len(obs) or obs[i] >= exp[i]:
        return None
    raw = finding.get("case")
    if not isinstance(raw, dict) or not isinstance(raw.get("geometry"), dict):
        return None
    try:
        return request_kinds(parse_case(raw))[i], raw["geometry"]
    except (KvspecError, IndexError):
        return None


def classify(finding: dict) -> str | None:
    """The known class a finding belongs to (an id of :data:`KNOWN_CLASSES`),
    or None. Reads only the finding's own fields; a case it cannot read is
    None, never an exception."""
    if finding.get("oracle") == "stale":
        # the known class is serial: a hit that read a state in the step
        # computing it (a concurrent trace; fuzz.oracles.check_stale) is another
        if SAME_STEP_READ in str((finding.get("expected") or {}).get("detail") or ""):
            return None
        return "stale-state"
    low = _low_hit(finding)
    if low is None:
        return None
    kind, g = low
    knobs = (finding.get("engine") or {}).get("knobs") or {}
    drop = bool(knobs.get("eagle_drop"))
    hashed = g.get("hash_block_size") is not None and g["hash_block_size"] < g["scheduler_block_size"]
    retention = {None: "dense", 0: "sparse"}.get(g.get("retention_interval"), "periodic")
    version = str((finding.get("engine") or {}).get("version") or "")
    if kind == "resend":
        if hashed and drop and retention != "sparse":
            return "resend-beside-checkpoint"
        if drop and version.startswith("0.29."):
            return "resend-53504"
        return None
    if kind == "extension":
        if retention != "sparse" and hashed:
            return "dense-below-sparse"
        if hashed and retention == "sparse":
            return "hashed-longer-sibling"
        if retention == "sparse" and not hashed:
            return "longer-sibling"
    return None
