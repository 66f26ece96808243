"""The loop over mutants: select, prepare what every mutant shares, run each
mutant as one independent task, here or on Ray.

The rule: mutants are planted in a *base* that kvspec's kill loop passes:
the release with kvspec's own fixes for it (``fixes/vllm-X-*.diff``; 0.33.0
fails R2 and serves stale states without them), checked first by the
*control* (the kill loop on the unmutated base, ``OUT/control.json``; a
base it kills stops the run). What all mutants share is made once, before
any task (the base build, the selection ``OUT/mutants.json``, the fixed
cases ``OUT/cases.json``, vLLM's tests' baseline); each mutant is then ``mutate.kill.run_mutant`` with the
same budget and options, so the order and the place it runs change nothing.
Without ``ray`` the tasks run here one after another; with ``ray``
(``auto``, ``local`` or ``HOST:PORT``) they go to ``fuzz.driving.distribute.run_tasks``
(a worker that dies has its mutant retried; a result is keyed by the
mutant's id, so it is counted once). A mutant already judged in ``OUT`` is
not run again.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from ground.errors import InvalidArgument
from ground.files import hash_files, write_json_atomic

#: Per-task wall bound on Ray: build, engine start, budget, vLLM's tests.
TASK_OVERHEAD_S = 900.0


def _quiet(_line: str) -> None:
    pass


ROOT = Path(__file__).resolve().parent.parent


#: The packages whose code decides a mutant's verdict (the kill loop, its
#: oracles and model, the engine it drives, the seeds it starts from).
JUDGING_PACKAGES = ("ground", "reference", "spec", "engine_adapter", "fuzz", "mutate")


def sources_sha256(root: Path = ROOT) -> str:
    """sha256 over kvspec's judging sources (:data:`JUDGING_PACKAGES`'
    ``*.py``, paths and contents)."""
    h = hashlib.sha256(b"kvspec-judging-sources\0")
    hash_files(h, root, [f"{pkg}/**/*.py" for pkg in JUDGING_PACKAGES])
    return h.hexdigest()


def claim_folder(out: Path, identity: dict) -> None:
    """A run folder's verdicts (the control, the fixed cases, each mutant's
    result) are reused when a run resumes, so they must come from the same
    judge: ``OUT/judged-by.json`` records ``identity`` (kvspec's judging
    sources, the base, the budget, the seed); a folder judged otherwise, or
    holding a run from before that record, is refused in one line."""
    path = out / "judged-by.json"
    try:
        held = json.loads(path.read_text())
    except FileNotFoundError:
        held = None
    except (OSError, ValueError):
        held = {}
    if held is None and not any(
        (out / name).exists() for name in ("control.json", "cases.json", "mutants.json", "mutants")
    ):
        write_json_atomic(path, identity)
        return
    if held != identity:
        what = (
            "no record of what judged it"
            if not held
            else "other " + ", ".join(k for k in identity if held.get(k) != identity[k])
        )
        raise InvalidArgument(
            f"--out={out}: a run folder judged with {what}; allowed: a fresh folder, or resuming with the same kvspec sources, base, budget and seed"
        )


def default_base_patches(release: str) -> list[str]:
    """kvspec's fixes for the release (``fixes/vllm-X-*.diff``): the base
    mutants are planted in must itself pass kvspec's check, or every mutant
    would be 'killed' by the release's own bugs."""
    return [str(p) for p in sorted((ROOT / "fixes").glob(f"vllm-{release}-*.diff"))]


def base_engine(release: str, base_patches: list[str]) -> str:
    from engine_adapter.host.builds import prepare

    return prepare(f"vllm=={release}", patches=base_patches or None, progress=_quiet)


def select_mutants(
    release: str, *, n: int | None, only: list[str] | None, seed: int, base: str | None = None
) -> list[dict]:
    """Mutants of the base's source (the release, or the release with the
    base patches: ``base`` its engine name)."""
    from mutate.generate import positions, select
    from mutate.targets import release_vllm_root

    root = release_vllm_root(base.split("==", 1)[1] if base else release)
    return select(root, positions(root), n=n, only=only, seed=seed)


def control(base: str, budget: float, out: Path, seed: int, cases: Path) -> dict:
    """kvspec's kill loop on the base itself: it must find nothing, or a
    kill means nothing (written to ``OUT/control.json``)."""
    from mutate.kill import _kvspec_kill

    path = out / "control.json"
    if path.exists():
        return json.loads(path.read_text())
    res = {"engine": base, "budget_s": budget, **_kvspec_kill(base, budget, out / "control", seed, cases)}
    write_json_atomic(path, res)
    return res


def run(
    release: str,
    *,
    out: Path,
    budget: float,
    n: int | None = 20,
    only: list[str] | None = None,
    seed: int = 1,
    vllm_tests: bool = True,
    keep_builds: bool = False,
    ray: str | None = None,
    tests_only: bool = False,
    base_patches: list[str] | None = None,
    vllm_tests_from: Path | None = None,
    progress=None,
) -> list[dict]:
    """Judge the selected mutants; return their results (also on disk).

    ``tests_only``: add vLLM's tests to the mutants an earlier kvspec-only
    pass (``vllm_tests=False``) judged, and touch no other mutant (a
    second process can follow a running kvspec pass). ``vllm_tests_from``:
    an earlier run's folder; where it judged the same build, its vLLM tests'
    verdict is taken instead of running them (``mutate.kill.reused_vllm_tests``)."""
    from ground.errors import EngineError
    from mutate.kill import fixed_cases, read_result, run_mutant

    say = progress or _quiet
    out = Path(out).resolve()
    base_patches = default_base_patches(release) if base_patches is None else base_patches
    base = base_engine(release, base_patches)
    say(f"[mutate] base: {base} ({', '.join(Path(p).name for p in base_patches) or 'the release'})")
    claim_folder(
        out,
        {"kvspec_sources_sha256": sources_sha256(), "release": release, "base": base, "budget_s": budget, "seed": seed},
    )
    mutants = select_mutants(release, n=n, only=only, seed=seed, base=base)
    if not tests_only:
        write_json_atomic(
            out / "mutants.json", {"release": release, "seed": seed, "budget_s": budget, "mutants": mutants}
        )
    say(f"[mutate] {len(mutants)} mutant(s) of vllm=={release}, {budget:g}s kvspec budget each")
    cases = out / "cases.json" if tests_only else fixed_cases(release, out, progress=say)
    options = {
        "out": str(out),
        "release": release,
        "seed": seed,
        "vllm_tests": vllm_tests,
        "keep_build": keep_builds,
        "cases": str(cases),
        "base_patches": base_patches,
        "base_engine": base,
        "vllm_tests_from": str(Path(vllm_tests_from).resolve()) if vllm_tests_from else None,
    }
    if not tests_only:
        ctl = control(base, budget, out, seed, cases)
        say(
            f"[mutate] control: kvspec on the base itself for {budget:g}s: {'KILLED' if ctl.get('killed') else 'nothing found'} ({ctl.get('execs')} runs)"
        )
        if ctl.get("killed") or ctl.get("harness"):
            raise EngineError(
                f"engine={base!r}: kvspec's kill loop {'finds ' + str(ctl.get('promise')) + ' on' if ctl.get('killed') else 'fails on'} the unmutated base ({ctl.get('summary') or ctl.get('reason')}); allowed: a base that passes (add its fixes with the base patches)"
            )
    if vllm_tests:
        from ground.home import kvspec_home
        from mutate.vllm_tests import baseline

        baseline(release, progress=say)
        options["baseline"] = str(kvspec_home() / "mutate" / f"vllm-tests-{release}" / "baseline.json")
    started = time.monotonic()
    if ray:
        from fuzz.driving.distribute import run_tasks

        tasks = [{"id": m["id"], "kwargs": {"mutant": m, "budget": budget, "options": options}} for m in mutants]
        envelopes = run_tasks(
            run_mutant,
            tasks,
            ray_address=ray,
            out=out / "tasks",
            retries=2,
            timeout_s=len(tasks) * (budget + TASK_OVERHEAD_S) + 60,
            progress=lambda env: say(f"[mutate] {env['id']}: {env['status']}"),
        )
        results = []
        for m, env in zip(mutants, envelopes):
            res = read_result(out, m["id"])
            if res is None:
                res = {
                    "id": m["id"],
                    **{k: m.get(k) for k in ("area", "file", "function", "operator", "line", "before", "after")},
                    "status": "harness",
                    "reason": f"task {env['status']}: {env.get('error')}",
                }
            results.append(res)
    else:
        results = []
        for i, m in enumerate(mutants, 1):
            if tests_only and read_result(out, m["id"]) is None:
                continue
            res = run_mutant(m, budget, options)
            kv, vt = res.get("kvspec") or {}, res.get("vllm_tests") or {}
            say(
                f"[mutate] {i}/{len(mutants)} {m['id']} {m['function']} line {m['line']}: {res['status']}"
                + (
                    f", kvspec {'killed in %.1fs' % kv['seconds_to_kill'] if kv.get('killed') else 'missed'}, vLLM tests {('killed' if vt.get('killed') else 'missed') if 'vllm_tests' in res else 'not run'}"
                    if res["status"] == "ran"
                    else f" ({res.get('reason', '')[:120]})"
                )
            )
            results.append(res)
    if tests_only:
        return results
    write_json_atomic(
        out / "run.json",
        {
            "release": release,
            "budget_s": budget,
            "mutants": len(mutants),
            "wall_s": round(time.monotonic() - started, 1),
            "ray": ray,
        },
    )
    return results
