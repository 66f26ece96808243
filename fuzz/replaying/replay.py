"""Replay a finding (or a bare case) on an in-process or worker engine.

The verdict is the judge's (:mod:`fuzz.judge.verdict`): **reproduced** when the
finding's oracle fires again, at the same first diverging request, with the
same observed hits; **not reproduced** otherwise; **inconclusive** when the
engine did not run the case (a harness failure, never vLLM's); and for a
bare case **agrees** / **diverges** (any oracle). A deployment case is
judged with the geometry the engine resolved for it. A ``versions`` finding
runs on both engines: the one named by ``--engine`` and the other one the
finding names. The table puts the model and the engine side by side per
request, the first divergence marked, as in a finding file.
"""

from __future__ import annotations

from pathlib import Path

from engine_adapter.host.versions import engine_name as name_of
from fuzz.judge.oracles import request_kinds
from fuzz.judge.verdict import Claim, observe_and_judge, typed_engine
from fuzz.results.findings import load_finding
from ground.engines import EngineSpec
from ground.errors import Unsupported
from reference.case import Case
from reference.knobs import implemented_rule, resolve_knobs
from reference.predict import predict_with_knobs


class _WithOptions:
    """An engine whose every run takes the finding's run options
    (``finding.harness.options``: llama.cpp's ``first_server_n_ubatch``,
    finding L1); the engine's driver refuses any it does not take."""

    def __init__(self, engine, options: dict) -> None:
        if not isinstance(options, dict):
            raise Unsupported(f"finding.harness.options={options!r}: allowed: an object of the engine's run options")
        self.engine, self.options, self.version = engine, dict(options), engine.version

    def run(self, case, options: dict | None = None, **kw):
        return self.engine.run(case, {**self.options, **(options or {})}, **kw)

    def resolve(self, case, **kw):
        return self.engine.resolve(case, **kw)


def replay_case(case: Case, finding: dict, engine, other=None) -> dict:
    """Run ``case`` on ``engine`` (and ``other`` for a ``versions``
    finding) and judge it (:func:`fuzz.judge.verdict.observe_and_judge`)."""
    version, typed = engine.version, typed_engine(engine)
    claim = Claim.of(finding) if finding else None
    if claim is not None and claim.oracle == "versions" and claim.other_version == version:
        claim = claim.swapped()  # replayed from the other engine's side
    options = ((finding or {}).get("harness") or {}).get("options")
    if options:  # the run options the finding was observed with (its driver checks them)
        engine = _WithOptions(engine, options)
    judged = observe_and_judge(case, claim, engine, other)
    obs = judged.observation
    rule = implemented_rule(typed)
    promise = implemented = None
    note = None
    if judged.case.geometry is not None:
        try:
            knobs = resolve_knobs(judged.case, typed)
            promise = predict_with_knobs(judged.case, knobs, "promise")["hits"]
            implemented = predict_with_knobs(judged.case, knobs, rule)["hits"]
        except Unsupported as e:
            note = f"no reference prediction: {e}"
    kinds = request_kinds(case)
    observed = obs.get("hits") or []
    other_hits = (judged.other_observation or {}).get("hits") or []
    rows = []
    for i, request in enumerate(case.trace):
        row = {
            "request": i,
            "kind": kinds[i],
            "prompt_tokens": request.num_prompt_tokens,
            "promise": promise[i] if promise else None,
            rule: implemented[i] if implemented else None,
        }
        if claim is not None and claim.observed is not None:
            row["finding"] = claim.observed[i] if i < len(claim.observed) else None
        if judged.other_observation is not None:
            row[name_of(other.version)] = other_hits[i] if i < len(other_hits) else None
        row["observed"] = observed[i] if i < len(observed) else None
        rows.append(row)
    resolution = obs.get("resolution")
    return {
        "verdict": judged.verdict.verdict,
        "reasons": judged.verdict.reasons,
        "engine": name_of(version),
        "other_engine": name_of(other.version) if other is not None and judged.other_observation is not None else None,
        "oracle": claim.oracle if claim else None,
        "first_divergence": judged.verdict.first,
        "divergences": [{"oracle": d.oracle, "requests": d.requests, "detail": d.detail} for d in judged.divergences],
        "resolved": None
        if resolution is None or resolution.get("geometry") is None  # llama.cpp: no geometry, token by token
        else {
            "scheduler_block_size": resolution["geometry"]["scheduler_block_size"],
            "hash_block_size": resolution["geometry"]["hash_block_size"],
        },
        "note": note,
        "rows": rows,
        "observed": obs,
    }


def replay_on_engine(
    path: str | Path, engine: EngineSpec | str, *, other: EngineSpec | str | None = None, warm: bool | None = None
) -> dict:
    """Load a finding/case file and replay it on ``engine`` (the typed
    engine a command parsed at its edge; a test's name is read once here);
    a ``versions`` finding also on the other engine it names (or ``other``):
    the finding's own engine when ``engine`` is the other one. ``warm``: on
    the versions' warm engines (``engine_adapter.host.warm``) or on workers
    of this call's own; default as ``kvspec replay --engine`` does (warm
    unless ``KVSPEC_WARM=0``)."""
    from engine_adapter import open_engine
    from engine_adapter.host import warm as warm_engines
    from engine_adapter.host.versions import spec_of

    if warm is None:
        warm = warm_engines.enabled()

    case, finding = load_finding(path)
    spec = spec_of(engine, "--engine")
    version = spec.version
    other_spec = None
    if finding.get("oracle") == "versions":
        claim = Claim.of(finding)
        under_test = str((finding.get("engine") or {}).get("version") or "")
        if other is not None:
            other_spec = spec_of(other, "other")
        elif claim.other_version and claim.other_version != version:
            other_spec = spec_of(claim.other_version, "finding.other_engine")  # the file's text, read once
        elif under_test and under_test != version:
            other_spec = spec_of(under_test, "finding.engine.version")
        if other_spec is None:
            raise Unsupported(
                f"finding.other_engine={claim.other_version!r}: a versions finding names the engine it was compared with; allowed: a finding that names it (schema 2), beside --engine"
            )
    engine = open_engine(spec, warm=warm)
    other = None
    try:
        if other_spec is not None:
            other = open_engine(other_spec, warm=warm)
        return replay_case(case, finding, engine, other)
    finally:
        for e in (engine, other):
            if e is not None and hasattr(e, "close"):
                e.close()


def render_replay(result: dict, console) -> None:
    from rich.table import Table

    title = (
        f"{result['engine']}"
        + (f" vs {result['other_engine']}" if result.get("other_engine") else "")
        + f": {result['verdict']}"
    )
    table = Table(title=title)
    columns = [c for c in result["rows"][0] if c != "request"] if result["rows"] else []
    table.add_column("request", justify="right")
    for c in columns:
        table.add_column(c, justify="right" if c != "kind" else "left")
    for row in result["rows"]:
        mark = " <-" if row["request"] == result["first_divergence"] else ""
        table.add_row(str(row["request"]) + mark, *("-" if row[c] is None else str(row[c]) for c in columns))
    console.print(table)
    if result.get("resolved"):
        r = result["resolved"]
        console.print(
            f"  resolved by {result['engine']}: scheduler block {r['scheduler_block_size']}, hash block {r['hash_block_size']}",
            highlight=False,
        )
    if result.get("note"):
        console.print(f"  note: {result['note']}", highlight=False)
    console.print(f"verdict: {result['verdict']}", highlight=False)
    for reason in result.get("reasons", [])[:20]:
        console.print(f"  - {reason}", highlight=False)
    for d in result["divergences"]:
        console.print(f"  {d['oracle']}: requests {d['requests']} {d['detail']}".rstrip(), highlight=False)
    err = result["observed"].get("error")
    if err:
        console.print(f"  engine raised: {err.get('type')}: {err.get('message')}", highlight=False)
