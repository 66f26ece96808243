"""The report of a ``kvspec mutate`` run: a table (markdown and JSON) and a
PNG of mutants x {kvspec, vLLM tests, both, neither}.

The rules of the count:

* a mutant whose build's self-test failed (``crash``: vLLM's modules no
  longer import; runs made before builds were only import-checked also
  list ``first run`` crashes, a case that raised, stalled or gave
  implausible hits) and one where kvspec's harness failed
  (``harness``) are listed apart and are in no score;
* a mutant on the reviewed list (``mutate/equivalent.json``) of kind
  ``equivalent`` (no input changes its behaviour) is listed apart and is in
  no score; one of kind ``out of scope`` (its behaviour differs only in
  configurations no deployment kvspec resolves has: a KV connector, a
  single KV cache group, no prefix caching, other models' specs, a second
  spec group beside Mamba that is not full attention) stays scored, and a
  second score leaves those out (``in_scope``);
* every other mutant is *scored*: killed by kvspec, by vLLM's tests, by
  both, or by neither; a score is killed / scored, per file, per function
  and overall; ``both + kvspec only + vLLM only + neither == scored``;
* kvspec's median time to kill: over the mutants kvspec killed, seconds
  from the engine being ready to the first finding;
* the survivors (neither killed them) are listed one by one: each is a
  candidate for a new oracle, generator bias or seed.
"""

from __future__ import annotations

import io
import statistics
from pathlib import Path

from ground.files import write_bytes_atomic, write_json_atomic, write_text_atomic
from mutate.equivalent import reviewed
from mutate.kill import read_result

CLASSES = ("both", "kvspec only", "vLLM tests only", "neither")


def load_results(out: Path) -> list[dict]:
    """Every judged mutant's result under ``OUT/mutants``, by id."""

    folder = Path(out) / "mutants"
    out_list = []
    for d in sorted(folder.iterdir()) if folder.is_dir() else ():
        res = read_result(Path(out), d.name)
        if res is not None:
            out_list.append(res)
    return out_list


def classify(res: dict, equivalent: dict[str, dict]) -> str:
    """``crash``, ``harness``, ``equivalent`` or one of :data:`CLASSES`."""
    if res.get("status") in ("crash", "harness"):
        return res["status"]
    if res["id"] in equivalent and equivalent[res["id"]].get("kind", "equivalent") == "equivalent":
        return "equivalent"
    k = bool((res.get("kvspec") or {}).get("killed"))
    v = bool((res.get("vllm_tests") or {}).get("killed"))
    return CLASSES[0] if k and v else CLASSES[1] if k else CLASSES[2] if v else CLASSES[3]


def crash_kind(res: dict) -> str | None:
    """A crash's kind: ``import`` when the self-test could not import vLLM
    (an ImportError, a SyntaxError), ``first run`` otherwise (vLLM imported,
    then raised, stalled or gave implausible hits on the self-test's case)."""
    if res.get("status") != "crash":
        return None
    reason = res.get("reason") or ""
    return (
        "import"
        if any(k in reason for k in ("ImportError", "ModuleNotFoundError", "SyntaxError", "No module named"))
        else "first run"
    )


def _score(rows: list[dict]) -> dict:
    scored = [r for r in rows if r["class"] in CLASSES]
    n = len(scored)
    k = sum(r["class"] in ("both", "kvspec only") for r in scored)
    v = sum(r["class"] in ("both", "vLLM tests only") for r in scored)
    return {
        "scored": n,
        "kvspec_killed": k,
        "vllm_tests_killed": v,
        "kvspec_score": round(k / n, 3) if n else None,
        "vllm_tests_score": round(v / n, 3) if n else None,
    }


def summarize(results: list[dict], equivalent: dict[str, dict] | None = None) -> dict:
    equivalent = reviewed() if equivalent is None else equivalent
    rows = []
    for r in results:
        kv = r.get("kvspec") or {}
        rows.append(
            {
                "id": r["id"],
                "area": r.get("area"),
                "file": r.get("file"),
                "function": r.get("function"),
                "line": r.get("line"),
                "operator": (r.get("operator") or "").removeprefix("core/"),
                "before": r.get("before"),
                "after": r.get("after"),
                "class": classify(r, equivalent),
                "seconds_to_kill": kv.get("seconds_to_kill"),
                "promise": kv.get("promise"),
                "oracle": kv.get("oracle"),
                "killing_test": (r.get("vllm_tests") or {}).get("killing_test")
                if (r.get("vllm_tests") or {}).get("killed")
                else None,
                "set_aside": (r.get("vllm_tests") or {}).get("set_aside"),
                "vllm_tests_run": "vllm_tests" in r,
                "reason": r.get("reason") or (equivalent.get(r["id"]) or {}).get("argument"),
                "crash": crash_kind(r),
                "out_of_scope": (equivalent.get(r["id"]) or {}).get("kind") == "out of scope",
            }
        )
    counts = {c: sum(r["class"] == c for r in rows) for c in (*CLASSES, "equivalent", "crash", "harness")}
    crashes = {k: sum(r["crash"] == k for r in rows) for k in ("import", "first run")}
    times = [
        r["seconds_to_kill"] for r in rows if r["class"] in ("both", "kvspec only") and r["seconds_to_kill"] is not None
    ]
    by_file = {f: _score([r for r in rows if r["file"] == f]) for f in sorted({r["file"] for r in rows if r["file"]})}
    by_function = {
        f: _score([r for r in rows if r["function"] == f])
        for f in sorted({r["function"] for r in rows if r["function"]})
    }
    not_run = sum(
        1
        for r, row in zip(results, rows)
        if r.get("status") == "ran" and "vllm_tests" not in r and row["class"] in CLASSES
    )
    in_scope = _score([r for r in rows if not r["out_of_scope"]])
    reused = sum(1 for r in results if (r.get("vllm_tests") or {}).get("reused_from"))
    return {
        "mutants": len(rows),
        "counts": counts,
        "crashes": crashes,
        "vllm_tests_not_run": not_run,
        "vllm_tests_reused": reused,
        **_score(rows),
        "out_of_scope": sum(r["out_of_scope"] and r["class"] in CLASSES for r in rows),
        "in_scope": in_scope,
        "median_seconds_to_kill": round(statistics.median(times), 2) if times else None,
        "by_file": by_file,
        "by_function": by_function,
        "survivors": [r for r in rows if r["class"] == "neither"],
        "rows": rows,
    }


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def markdown(s: dict) -> str:
    c = s["counts"]
    lines = [
        "# kvspec mutate",
        "",
        f"{s['mutants']} mutants: {s['scored']} scored, {c['equivalent']} equivalent, {c['crash']} crashes at the build's self-test ({s['crashes']['import']} at import, {s['crashes']['first run']} on its first case), {c['harness']} harness failures (none of these scored).",
        "",
        "| | vLLM tests kill | vLLM tests miss |",
        "|---|---|---|",
        f"| **kvspec** kills | both: {c['both']} | kvspec only: {c['kvspec only']} |",
        f"| **kvspec** misses | vLLM tests only: {c['vLLM tests only']} | neither: {c['neither']} |",
        "",
        *(
            [f"- vLLM's tests were not run on {s['vllm_tests_not_run']} scored mutant(s) (counted as missed by them)"]
            if s["vllm_tests_not_run"]
            else []
        ),
        *(
            [
                f"- vLLM's tests' verdicts on {s['vllm_tests_reused']} mutant(s) are taken from an earlier run of the same builds (`--vllm-tests-from`)"
            ]
            if s.get("vllm_tests_reused")
            else []
        ),
        f"- mutation score: kvspec {s['kvspec_killed']}/{s['scored']} ({_pct(s['kvspec_score'])}), vLLM's tests {s['vllm_tests_killed']}/{s['scored']} ({_pct(s['vllm_tests_score'])})",
        *(
            [
                f"- within kvspec's scope (leaving out {s['out_of_scope']} mutant(s) reviewed as out of scope: behaviour only configurations kvspec does not resolve reach): kvspec {s['in_scope']['kvspec_killed']}/{s['in_scope']['scored']} ({_pct(s['in_scope']['kvspec_score'])}), vLLM's tests {s['in_scope']['vllm_tests_killed']}/{s['in_scope']['scored']} ({_pct(s['in_scope']['vllm_tests_score'])})"
            ]
            if s["out_of_scope"]
            else []
        ),
        f"- kvspec's median time to kill: {s['median_seconds_to_kill']} s",
        "",
        "## Per file",
        "",
        "| file | scored | kvspec | vLLM tests |",
        "|---|---|---|---|",
    ]
    for f, v in s["by_file"].items():
        lines.append(
            f"| `{f}` | {v['scored']} | {v['kvspec_killed']} ({_pct(v['kvspec_score'])}) | {v['vllm_tests_killed']} ({_pct(v['vllm_tests_score'])}) |"
        )
    lines += ["", "## Per function", "", "| function | scored | kvspec | vLLM tests |", "|---|---|---|---|"]
    for f, v in s["by_function"].items():
        lines.append(
            f"| `{f}` | {v['scored']} | {v['kvspec_killed']} ({_pct(v['kvspec_score'])}) | {v['vllm_tests_killed']} ({_pct(v['vllm_tests_score'])}) |"
        )
    lines += ["", "## Survivors (candidates for a new oracle)", ""]
    if not s["survivors"]:
        lines.append("none")
    for r in s["survivors"]:
        why = f" (out of scope: {(r['reason'] or 'no argument recorded')[:300]})" if r["out_of_scope"] else ""
        lines.append(
            f"- `{r['id']}` {r['function']} line {r['line']} ({r['operator']}): `{r['before']}` -> `{r['after']}`{why}"
        )
    apart = [r for r in s["rows"] if r["class"] in ("crash", "harness", "equivalent")]
    if apart:
        lines += ["", "## Counted apart", ""]
        for r in apart:
            lines.append(
                f"- `{r['id']}` {r['function']} line {r['line']}: {r['class']}{' (' + r['crash'] + ')' if r['crash'] else ''}: `{r['before']}` -> `{r['after']}`: {(r['reason'] or '')[:200]}"
            )
    lines += [
        "",
        "## Every mutant",
        "",
        "| id | function | line | operator | class | kvspec: s to kill, promise | vLLM test that killed it |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in s["rows"]:
        kv = f"{r['seconds_to_kill']} s, {r['promise']}" if r["seconds_to_kill"] is not None else ""
        lines.append(
            f"| `{r['id']}` | {r['function']} | {r['line']} | {r['operator']} | {r['class']} | {kv} | {r['killing_test'] or ''} |"
        )
    return "\n".join(lines) + "\n"


def figure(s: dict):
    """Stacked bars per area: both / kvspec only / vLLM tests only / neither."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    areas = sorted({r["area"] for r in s["rows"] if r["class"] in CLASSES})
    colors = {"both": "#2b8a3e", "kvspec only": "#74c476", "vLLM tests only": "#6baed6", "neither": "#d62728"}
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    bottom = [0] * len(areas)
    for c in CLASSES:
        vals = [sum(r["class"] == c and r["area"] == a for r in s["rows"]) for a in areas]
        ax.bar(areas, vals, bottom=bottom, label=c, color=colors[c])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("mutants (scored)")
    ax.set_title(
        f"kvspec {_pct(s['kvspec_score'])} vs vLLM tests {_pct(s['vllm_tests_score'])} of {s['scored']} mutants; median kill {s['median_seconds_to_kill']} s"
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, never over one
    fig.tight_layout()
    return fig


def write(out: Path) -> dict:
    """Write ``OUT/report.md``, ``OUT/report.json`` and ``OUT/report.png``."""
    out = Path(out)
    s = summarize(load_results(out))
    write_json_atomic(out / "report.json", s)
    write_text_atomic(out / "report.md", markdown(s))
    fig = figure(s)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    write_bytes_atomic(out / "report.png", buf.getvalue())
    return s
