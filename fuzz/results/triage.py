"""Triage: finding files grouped into classes, one minimal representative each.

A class is (oracle, request kind, geometry class, root-cause hint):

* request kind: the first diverging request's kind (``fresh``, ``resend``,
  ``extension``, ``sibling``; ``-`` where no request diverges, e.g. knobs);
* geometry class: ``uniform`` (one block size), ``mixed`` (attention and
  Mamba blocks differ), ``partial`` (mixed, with partial hash hits);
* hint: a short guess at the cause, derived from the finding alone: for a
  hit divergence the request kind and direction (``resend low``), whether
  the prompt is block-aligned, mixed attention/Mamba blocks; for
  ``engine_error`` the exception type (and the phase); for ``knobs`` the
  knob names; for ``versions`` the other version. Finer distinctions (the
  speculative knobs, the retention mode) stay in the finding's signature,
  which deduplicates; a class is coarser on purpose.

The representative is the smallest case of the class: fewest requests,
then fewest prompt tokens (then the path, so the choice is stable). A file
that cannot be read as a finding is listed apart with a one-line reason;
reading never raises on a file's content.
"""

from __future__ import annotations

import re
from pathlib import Path

from fuzz.judge.oracles import request_kinds
from fuzz.results.findings import KNOWN_ORACLES, SIGNATURE, check_fields, load_finding
from fuzz.results.impact import cost_of, severity_rank
from fuzz.results.known_classes import classify
from reference.case import Case, parse_case


def geometry_class(case: Case, knobs: dict) -> str:
    """``uniform``, ``mixed`` or ``partial`` (as in a finding's signature);
    ``unresolved`` for a deployment case judged before it was resolved (a
    ``resolution`` finding)."""
    if case.geometry is None:
        return "unresolved"
    if len({g.block_size for g in case.geometry.groups}) == 1:
        return "uniform"
    return "partial" if knobs.get("partial_hash_hits") else "mixed"


def first_kind(case: Case, first) -> str:
    """The kind of the first diverging request, ``-`` if none."""
    if not isinstance(first, int) or not 0 <= first < len(case.trace):
        return "-"
    return request_kinds(case)[first]


def direction(finding: dict, first) -> str | None:
    """``low`` / ``high``: the engine hit less / more than expected."""
    exp = (finding.get("expected") or {}).get("hits") or []
    obs = (finding.get("observed") or {}).get("hits") or []
    if not isinstance(first, int) or not (0 <= first < len(exp) and first < len(obs)):
        return None
    if not isinstance(exp[first], int) or not isinstance(obs[first], int) or exp[first] == obs[first]:
        return None
    return "low" if obs[first] < exp[first] else "high"


def hint(finding: dict, case: Case) -> str:
    """A short root-cause hint (see the module docstring)."""
    oracle = finding.get("oracle")
    first = finding.get("first_divergence")
    knobs = (finding.get("engine") or {}).get("knobs") or {}
    detail = str((finding.get("expected") or {}).get("detail") or "")
    if oracle == "engine_error":
        err = (finding.get("observed") or {}).get("error") or {}
        kind = str(err.get("type") or detail.split(":")[0] or "error")
        return kind + (f" in {err['phase']}" if err.get("phase") else "")
    if oracle == "knobs":
        names = re.findall(r"(\w+) model=", detail)
        return "knobs differ: " + (", ".join(names) if names else detail[:80])
    if oracle == "resolution":
        return "flag not applied: " + " ".join(re.findall(r"--[\w-]+", detail)[:1])
    parts = [
        " ".join(x for x in (first_kind(case, first), direction(finding, first)) if x and x != "-") or "hits differ"
    ]
    if (
        isinstance(first, int)
        and 0 <= first < len(case.trace)
        and case.geometry is not None  # llama.cpp: token by token, no block
        and case.trace[first].num_prompt_tokens % case.geometry.scheduler_block_size == 0
    ):
        parts.append("block-aligned prompt")
    if geometry_class(case, knobs) not in ("uniform", "unresolved"):
        parts.append("mixed attention/Mamba blocks")
    if oracle == "versions" and detail:
        parts.append(detail.replace("expected = ", "vs "))
    return ", ".join(parts)


def case_size(case: Case) -> tuple[int, int]:
    """The order of representatives: requests, then prompt tokens."""
    return len(case.trace), sum(r.num_prompt_tokens for r in case.trace)


def describe(path: str, finding: dict) -> dict:
    """One finding's class key and size; raises on a malformed finding."""
    if not isinstance(finding, dict) or not isinstance(finding.get("oracle"), str) or "case" not in finding:
        raise ValueError("not a finding (needs 'oracle' and 'case')")
    case = parse_case(finding["case"])
    knobs = (finding.get("engine") or {}).get("knobs") or {}
    if not isinstance(knobs, dict):
        raise ValueError("engine.knobs must be an object")
    requests, tokens = case_size(case)
    return {
        "path": path,
        "key": (
            finding["oracle"],
            first_kind(case, finding.get("first_divergence")),
            geometry_class(case, knobs),
            hint(finding, case),
        ),
        "requests": requests,
        "tokens": tokens,
        "summary": str(finding.get("summary", ""))[:300],
        "cost": cost_of(finding),
        "known": classify(finding),
    }


def triage(described: list[dict], new: set[str] = frozenset()) -> list[dict]:
    """Group described findings into classes, the worst severity first, then
    the most tokens recomputed, then the largest class; each with its
    count, how many of its files are in ``new``, the smallest finding as its
    representative, and the cost of its costliest member (``cost``: see
    :mod:`fuzz.results.cost`)."""
    groups: dict[tuple, list[dict]] = {}
    for d in described:
        groups.setdefault(tuple(d["key"]), []).append(d)
    classes = []
    for key, members in groups.items():
        rep = min(members, key=lambda d: (d["requests"], d["tokens"], d["path"]))
        costliest = max(members, key=lambda d: (d["cost"].get("tokens_total") or 0, d["path"]))["cost"]
        classes.append(
            {
                "oracle": key[0],
                "request_kind": key[1],
                "geometry": key[2],
                "hint": key[3],
                "count": len(members),
                "new": sum(d["path"] in new for d in members),
                "representative": {k: rep[k] for k in ("path", "requests", "tokens", "summary")},
                "paths": sorted(d["path"] for d in members),
                "severity": costliest["severity"],
                "cost": costliest,
                # the known classes (fuzz.results.known_classes) its members belong to
                "known": sorted({d["known"] for d in members if d.get("known")}),
                # how many of its members no known class names
                "unknown": sum(not d.get("known") for d in members),
            }
        )
    return sorted(
        classes,
        key=lambda c: (
            severity_rank(c["cost"]),
            -(c["cost"].get("tokens_total") or 0),
            -c["count"],
            c["oracle"],
            c["request_kind"],
            c["geometry"],
            c["hint"],
        ),
    )


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return f"{type(e).__name__}: {text}"[:200]


def _check_names(finding: dict) -> None:
    """The checks ``report`` makes (:func:`fuzz.results.findings.check_fields`) on the
    two names a class is keyed and filed by: a signature, when the finding
    has one, is hex; an oracle, when it names one, is one kvspec has. One
    line naming the field (the file is listed as malformed)."""
    probe = {k: finding[k] for k in ("signature", "oracle") if finding.get(k) is not None}
    if "signature" in probe and not (isinstance(probe["signature"], str) and SIGNATURE.match(probe["signature"])):
        check_fields(probe)  # raises, naming signature=
    if "oracle" in probe and probe["oracle"] not in KNOWN_ORACLES:
        check_fields({"signature": "0" * 8, **probe})  # raises, naming oracle=


def read_findings(folder: Path) -> tuple[list[dict], list[tuple[str, str]]]:
    """The finding files (``*.json``, not recursive) in ``folder``, read by
    the one loader (:func:`fuzz.results.findings.load_finding`), their signature and
    oracle checked as ``report`` checks them (:func:`_check_names`), and
    described; and
    the malformed ones (a bare case among them) as (path, one-line reason)."""
    described, malformed = [], []
    for path in sorted(folder.glob("*.json")):
        if path.name.startswith("."):
            continue  # a temporary file of an atomic write
        try:
            finding = load_finding(path)[1]
            _check_names(finding)
            described.append(describe(str(path), finding))
        except Exception as e:  # noqa: BLE001 - any content is listed, never raised
            malformed.append((str(path), _one_line(e)))
    return described, malformed
