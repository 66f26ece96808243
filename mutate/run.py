"""The loop over mutants: select, prepare what every mutant shares, run each
mutant as one independent task, here or on Ray.

The rule: what all mutants share is made once, before any task (the
selection ``OUT/mutants.json``, the fixed cases ``OUT/cases.json``, vLLM's
tests' baseline); each mutant is then ``mutate.kill.run_mutant`` with the
same budget and options, so the order and the place it runs change nothing.
Without ``ray`` the tasks run here one after another; with ``ray``
(``auto``, ``local`` or ``HOST:PORT``) they go to ``fuzz.distribute.run_tasks``
(a worker that dies has its mutant retried; a result is keyed by the
mutant's id, so it is counted once). A mutant already judged in ``OUT`` is
not run again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from reference.case import write_json_atomic

#: Per-task wall bound on Ray: build, engine start, budget, vLLM's tests.
TASK_OVERHEAD_S = 900.0


def _quiet(_line: str) -> None:
    pass


def select_mutants(release: str, *, n: int | None, only: list[str] | None, seed: int) -> list[dict]:
    from mutate.generate import positions, select
    from mutate.targets import release_vllm_root

    root = release_vllm_root(release)
    return select(root, positions(root), n=n, only=only, seed=seed)


def run(release: str, *, out: Path, budget: float, n: int | None = 20, only: list[str] | None = None, seed: int = 1, vllm_tests: bool = True,
        keep_builds: bool = False, ray: str | None = None, tests_only: bool = False, progress=None) -> list[dict]:
    """Judge the selected mutants; return their results (also on disk).

    ``tests_only``: add vLLM's tests to the mutants an earlier kvspec-only
    pass (``vllm_tests=False``) judged, and touch no other mutant (a
    second process can follow a running kvspec pass)."""
    from mutate.kill import fixed_cases, read_result, run_mutant

    say = progress or _quiet
    out = Path(out)
    mutants = select_mutants(release, n=n, only=only, seed=seed)
    if not tests_only:
        write_json_atomic(out / "mutants.json", {"release": release, "seed": seed, "budget_s": budget, "mutants": mutants})
    say(f"[mutate] {len(mutants)} mutant(s) of vllm=={release}, {budget:g}s kvspec budget each")
    cases = out / "cases.json" if tests_only else fixed_cases(release, out, progress=say)
    options = {"out": str(out), "release": release, "seed": seed, "vllm_tests": vllm_tests, "keep_build": keep_builds, "cases": str(cases)}
    if vllm_tests:
        from mutate.vllm_tests import baseline
        from kvspec.home import kvspec_home

        baseline(release, progress=say)
        options["baseline"] = str(kvspec_home() / "mutate" / f"vllm-tests-{release}" / "baseline.json")
    started = time.monotonic()
    if ray:
        from fuzz.distribute import run_tasks

        tasks = [{"id": m["id"], "kwargs": {"mutant": m, "budget": budget, "options": options}} for m in mutants]
        envelopes = run_tasks(run_mutant, tasks, ray_address=ray, out=out / "tasks", retries=2, timeout_s=len(tasks) * (budget + TASK_OVERHEAD_S) + 60,
                              progress=lambda env: say(f"[mutate] {env['id']}: {env['status']}"))
        results = []
        for m, env in zip(mutants, envelopes):
            res = read_result(out, m["id"])
            if res is None:
                res = {"id": m["id"], **{k: m.get(k) for k in ("area", "file", "function", "operator", "line", "before", "after")},
                       "status": "harness", "reason": f"task {env['status']}: {env.get('error')}"}
            results.append(res)
    else:
        results = []
        for i, m in enumerate(mutants, 1):
            if tests_only and read_result(out, m["id"]) is None:
                continue
            res = run_mutant(m, budget, options)
            kv, vt = res.get("kvspec") or {}, res.get("vllm_tests") or {}
            say(f"[mutate] {i}/{len(mutants)} {m['id']} {m['function']} line {m['line']}: {res['status']}"
                + (f", kvspec {'killed in %.1fs' % kv['seconds_to_kill'] if kv.get('killed') else 'missed'}, vLLM tests {'killed' if vt.get('killed') else 'missed'}" if res["status"] == "ran" else f" ({res.get('reason', '')[:120]})"))
            results.append(res)
    if tests_only:
        return results
    write_json_atomic(out / "run.json", {"release": release, "budget_s": budget, "mutants": len(mutants), "wall_s": round(time.monotonic() - started, 1), "ray": ray})
    return results
