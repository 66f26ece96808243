"""Replay a finding (or a bare case) on an in-process or worker engine.

The verdict is **reproduced** when the finding's oracle fires again on the
named engine at the same first request, **not reproduced** when it does not,
and for a bare case **diverges** / **agrees** (any oracle). The table puts
the model and the engine side by side per request, the first divergence
marked, as in a finding file.
"""

from __future__ import annotations

from pathlib import Path

from reference.case import Case
from reference.knobs import implemented_rule, resolve_knobs
from reference.predict import predict_with_knobs

from fuzz.findings import load_finding
from fuzz.oracles import ORACLES, check_all, check_versions, request_kinds


def replay_case(case: Case, finding: dict, engine, other=None) -> dict:
    """Run ``case`` on ``engine`` and judge it like the campaign did."""
    version = engine.version
    obs = engine.run(case)
    oracle = finding.get("oracle")
    oracles = (oracle,) if oracle in ORACLES else ORACLES
    divs = []
    if oracle == "versions":
        if other is not None:
            divs = check_versions(case, version, obs, other.version, other.run(case))
    else:
        divs = check_all(case, version, obs, engine.run, oracles)
    knobs = resolve_knobs(case, version)
    promise = predict_with_knobs(case, knobs, "promise")["hits"]
    implemented = predict_with_knobs(case, knobs, implemented_rule(version))["hits"]
    first = divs[0].first if divs else None
    if finding:
        same = [d for d in divs if d.oracle == oracle]
        verdict = "reproduced" if same else "not reproduced"
        first = same[0].first if same else None
    else:
        verdict = "diverges" if divs else "agrees"
    kinds = request_kinds(case)
    rows = []
    observed = obs.get("hits", [])
    for i, request in enumerate(case.trace):
        rows.append({
            "request": i,
            "kind": kinds[i],
            "prompt_tokens": request.num_prompt_tokens,
            "promise": promise[i],
            implemented_rule(version): implemented[i],
            "observed": observed[i] if i < len(observed) else None,
        })
    return {
        "verdict": verdict,
        "engine": f"vllm=={version}",
        "oracle": oracle,
        "first_divergence": first,
        "divergences": [{"oracle": d.oracle, "requests": d.requests, "detail": d.detail} for d in divs],
        "rows": rows,
        "observed": obs,
    }


def replay_on_engine(path: str | Path, engine_name: str, *, other_name: str | None = None) -> dict:
    """Load a finding/case file and replay it on ``engine_name``."""
    from engine_adapter import open_engine

    case, finding = load_finding(path)
    engine = open_engine(engine_name)
    other = None
    if finding.get("oracle") == "versions":
        other_name = other_name or finding.get("other_engine")
        other = open_engine(other_name) if other_name else None
    try:
        return replay_case(case, finding, engine, other)
    finally:
        for e in (engine, other):
            if e is not None and hasattr(e, "close"):
                e.close()


def render_replay(result: dict, console) -> None:
    from rich.table import Table

    table = Table(title=f"{result['engine']}: {result['verdict']}")
    columns = [c for c in result["rows"][0] if c != "request"] if result["rows"] else []
    table.add_column("request", justify="right")
    for c in columns:
        table.add_column(c, justify="right" if c != "kind" else "left")
    for row in result["rows"]:
        mark = " <-" if row["request"] == result["first_divergence"] else ""
        table.add_row(str(row["request"]) + mark, *(str(row[c]) for c in columns))
    console.print(table)
    for d in result["divergences"]:
        console.print(f"  {d['oracle']}: requests {d['requests']} {d['detail']}".rstrip())
    err = result["observed"].get("error")
    if err:
        console.print(f"  engine raised: {err.get('type')}: {err.get('message')}")
