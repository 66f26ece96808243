"""Variants of a case that an oracle compares against the case itself.

Each variant changes one setting and nothing else, for a hand geometry (in
the geometry) and for a deployment alike (in the ``vllm serve`` flags, so
the engine resolves the variant with vLLM's own code, as a user changing that
one flag would get it):

* :func:`with_retention`: the retention interval (None = dense, 0 = sparse,
  k > 0 periodic): ``--prefix-cache-retention-interval``;
* :func:`without_speculative`: speculative decoding off:
  ``--speculative-config`` removed.

A resolved deployment case loses its resolution (the engine resolves the
variant again).
"""

from __future__ import annotations

from dataclasses import replace

from reference.case import Case
from reference.deployment import drop_flag, set_flag

RETENTION_FLAG = "--prefix-cache-retention-interval"
SPECULATIVE_FLAG = "--speculative-config"


def _redeploy(case: Case, args: tuple[str, ...]) -> Case:
    assert case.deployment is not None
    return Case(None, None, case.trace, case.name, replace(case.deployment, vllm_args=args))


def with_retention(case: Case, interval: int | None) -> Case:
    """The case under another retention interval."""
    if case.deployment is not None:
        return _redeploy(
            case, set_flag(case.deployment.vllm_args, RETENTION_FLAG, "None" if interval is None else str(interval))
        )
    assert case.geometry is not None
    return replace(case, geometry=replace(case.geometry, retention_interval=interval))


def without_speculative(case: Case) -> Case:
    """The case with speculative decoding off."""
    if case.deployment is not None:
        return _redeploy(case, drop_flag(case.deployment.vllm_args, SPECULATIVE_FLAG))
    return replace(case, speculative=None)


def has_speculative(case: Case) -> bool:
    if case.speculative is not None:
        return True
    return case.deployment is not None and any(
        a == SPECULATIVE_FLAG or a.startswith(SPECULATIVE_FLAG + "=") for a in case.deployment.vllm_args
    )


def retention(case: Case) -> int | None | str:
    """The case's retention interval ("unresolved" for an unresolved deployment)."""
    if case.geometry is not None:
        return case.geometry.retention_interval
    return "unresolved"
