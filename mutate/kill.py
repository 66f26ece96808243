"""One mutant, one task: its build, kvspec's kill, vLLM's tests' kill.

The rule (``run_mutant``): pure in and out (a JSON-able mutant, budget and
options in; a JSON-able result out), idempotent (a finished mutant's
``result.json`` is returned as it is, so a retried task is never counted
twice), and every file it writes goes under ``OUT/mutants/<id>/``
atomically. The verdicts:

* ``status``: ``ran`` (both checks ran), ``crash`` (the build's import-only
  self-test failed: vLLM's modules no longer import; counted apart, never a
  kill; a mutant that imports but raises, stalls or answers nonsense on a
  case is judged by kvspec's oracles like any other), ``harness``
  (kvspec itself failed: the build could not be made, the engine could not
  start, harness errors above the limit; counted apart, never a kill);
* ``kvspec.killed``: the oracles that judge a build
  (``fuzz.judge.oracle_registry.BUILD_ORACLES``, ``junction`` included; never the
  release's own rule), given ``budget`` seconds from the engine's
  start (the examples and the proofs' boundary cases on deployments,
  :func:`fixed_cases`, then seeded random cases over deployments), found a
  finding, vLLM raising included (``engine_error``); ``seconds_to_kill``
  from the engine being ready to the first finding, with its promise
  (``fuzz.replaying.checkbuild.promise_of``), oracle and case;
* ``vllm_tests.killed``: :func:`mutate.vllm_tests.run_for_mutant`.

The build (``vllm==X+mutant-<id>.HASH``) is removed afterwards unless
``options["keep_build"]``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from fuzz.judge.oracle_registry import KNOWN_ORACLES
from ground.errors import EngineError, KvspecError
from ground.files import write_json_atomic, write_text_atomic

#: Share of the budget spent on the examples and boundary cases; the rest is random cases.
CASES_SHARE = 0.6
RESULT_SCHEMA = 1


def _quiet(_line: str) -> None:
    pass


def result_path(out: Path, mid: str) -> Path:
    return Path(out) / "mutants" / mid / "result.json"


def read_result(out: Path, mid: str) -> dict | None:
    path = result_path(out, mid)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if data.get("schema") == RESULT_SCHEMA else None


def _build(mutant: dict, release: str, diff_path: Path, base_patches: list[str] = ()) -> tuple[str | None, dict | None]:
    """(engine name, None) or (None, the crash/harness verdict). The build
    is the release with the base patches, then the mutant's diff."""
    from engine_adapter.host.builds import prepare

    try:
        return prepare(
            f"vllm=={release}", patches=[*base_patches, str(diff_path)], selftest="import", progress=_quiet
        ), None
    except EngineError as e:
        msg = str(e)
        if "self-test failed" in msg or "self-test timed out" in msg:
            return None, {"status": "crash", "reason": msg[:400]}
        return None, {"status": "harness", "reason": f"build: {msg[:400]}"}
    except KvspecError as e:
        return None, {"status": "harness", "reason": f"build: {str(e)[:400]}"}


def fixed_cases(release: str, out: Path, *, progress=None) -> Path:
    """The cases every mutant is checked on first, in order, written once
    per run to ``OUT/cases.json``: the examples check-build runs, then the
    proofs' boundary cases mapped onto deployments (resolved by the
    release), interleaved by speculative mode."""
    from engine_adapter import open_engine
    from engine_adapter.models.shipped import deployment_cases
    from fuzz.draw.seeds import load_seed_cases, on_deployments, seed_dir
    from fuzz.driving.campaign import Campaign
    from fuzz.replaying.checkbuild import example_cases, interleave
    from ground.home import kvspec_home
    from reference.case import case_to_dict

    path = Path(out) / "cases.json"
    if path.exists():
        return path
    say = progress or _quiet
    cases = [c for _n, c in example_cases()]
    engine = open_engine(f"vllm=={release}")
    try:
        t0 = time.monotonic()
        for case in deployment_cases():  # warms vLLM's model-inspection cache before the control's budget
            try:
                engine.resolve(case)
            except KvspecError:  # the release does not serve it as a hybrid: its answer, not a failure
                pass
        say(f"[mutate] resolved each shipped model once ({time.monotonic() - t0:.0f}s)")
        say("[mutate] mapping the proofs' boundary cases onto deployments")
        seeds = [c for c in load_seed_cases(seed_dir(kvspec_home())) if c.deployment is None]
        campaign = Campaign(engine, Path(out) / "cases-probe", seed=1)
        cases += interleave(on_deployments(seeds, campaign.resolver))
    finally:
        engine.close()
    write_json_atomic(path, [case_to_dict(c) for c in cases])
    return path


def _kvspec_kill(engine_name: str, budget: float, out: Path, seed: int, cases_path: Path | None) -> dict:
    """The fixed cases, then seeded random cases over deployments, until the
    first finding or ``budget`` seconds after the engine started."""
    from engine_adapter import open_engine
    from fuzz.driving.campaign import Campaign
    from fuzz.driving.drivers import BoundedEngine, run_random
    from fuzz.driving.outcome import HARNESS_ERROR_LIMIT, outcome
    from fuzz.replaying.checkbuild import promise_of
    from reference.case import parse_case

    t0 = time.monotonic()
    try:
        engine = open_engine(engine_name)
        if hasattr(engine, "start"):
            engine.start()
    except KvspecError as e:
        return {"killed": False, "harness": True, "reason": f"the engine cannot be started: {str(e)[:300]}"}
    start_s = time.monotonic() - t0
    ready = time.monotonic()
    deadline = ready + budget
    first: list[tuple[float, Path, dict]] = []

    def on_finding(path: Path, finding: dict) -> None:
        if not first:
            first.append((time.monotonic() - ready, path, finding))

    campaign = Campaign(
        BoundedEngine(engine, deadline),
        out,
        oracles=KNOWN_ORACLES,
        seed=seed,
        shrink_calls=0,
        on_finding=on_finding,
        deadline=deadline,
    )
    fixed = 0
    try:
        cases = [parse_case(raw) for raw in json.loads(Path(cases_path).read_text())] if cases_path else []
        for case in cases:
            if first or time.monotonic() >= deadline:
                break
            campaign.check(case)
            fixed += 1
        if not first and time.monotonic() < deadline:
            run_random(campaign, seed, max_time=max(0.0, deadline - time.monotonic()), stop_on_finding=True)
    finally:
        engine.close()
    s = campaign.stats
    res = {
        "engine_start_s": round(start_s, 1),
        "fixed_cases": fixed,
        "execs": s.execs,
        "harness_errors": s.harness_errors,
        "rejected": s.rejected,
        "unsupported": s.unsupported,
        "cut_at_deadline": getattr(s, "cut_at_deadline", 0),
    }
    if first:
        secs, path, finding = first[0]
        res.update(
            {
                "killed": True,
                "seconds_to_kill": round(secs, 2),
                "promise": promise_of(finding),
                "oracle": finding.get("oracle"),
                "summary": (finding.get("summary") or "")[:300],
                "finding": str(path),
                "case": (finding.get("case") or {}).get("name"),
            }
        )
        return res
    code, why = outcome(
        execs=s.execs, harness_errors=s.harness_errors, new_findings=0, workers_died=0, limit=HARNESS_ERROR_LIMIT
    )
    res["killed"] = False
    if code == 3:
        res.update({"harness": True, "reason": f"harness failed: {why}"})
    return res


def _put_vllm_tests(result: dict, tests: dict) -> None:
    """Record vLLM's tests' verdict in a mutant's result; a run that could
    not start (``harness``) is kept apart under ``vllm_tests_harness`` and
    leaves ``vllm_tests`` unset (not run: a later pass runs them again)."""
    if tests.get("harness"):
        result.pop("vllm_tests", None)
        result["vllm_tests_harness"] = tests["harness"]
    else:
        result.pop("vllm_tests_harness", None)
        result["vllm_tests"] = tests


def _needs_vllm_tests(done: dict, options: dict) -> bool:
    return bool(options.get("vllm_tests", True)) and done.get("status") == "ran" and "vllm_tests" not in done


def _vllm_tests(engine: str, mutant: dict, options: dict, folder: Path) -> dict:
    """vLLM's tests on the mutant: the files whose baseline run executed the
    mutated function (by its span in the release's source: the baseline's
    line numbers); a killing test is checked on the base build, and one that
    fails there too is set aside (it tests what the base patches changed)
    and the run repeated without it, at most twice."""
    from mutate.targets import release_vllm_root, spans
    from mutate.vllm_tests import files_for_span, run_for_mutant, run_one

    base = json.loads(Path(options["baseline"]).read_text())
    release = options.get("release", "0.33.0")
    span = next(
        (s for s in spans(release_vllm_root(release)) if s.function == mutant["function"] and s.file == mutant["file"]),
        None,
    )
    files = files_for_span(base, span) if span else []
    extra: list[str] = []
    res: dict = {}
    for _ in range(3):
        res = run_for_mutant(engine, base, files, junit=folder / "vllm-tests.xml", deselect=extra)
        test = res.get("killing_test")
        if not (res.get("killed") and test and options.get("base_engine")):
            break
        passes = run_one(options["base_engine"], base, test)
        if passes is None:  # the base could not run it: kvspec's failure, not a verdict
            return {"harness": f"engine={options['base_engine']}: could not run {test} on the base to check the kill"}
        if passes:
            break  # passes on the base: a real kill
        extra.append(test)
        res = {**res, "killed": False}
    if extra:
        res["set_aside"] = extra
    return res


def reused_vllm_tests(mutant: dict, engine: str | None, options: dict) -> dict | None:
    """vLLM's tests' verdict on this mutant from an earlier run's folder
    (``options["vllm_tests_from"]``), when that run judged the same build:
    the same mutant diff planted in the same base (the same engine name,
    which hashes the patches). vLLM's tests do not depend on kvspec, so a
    kvspec-only pass can be scored against them without running them again.
    None when there is no such verdict."""
    src = options.get("vllm_tests_from")
    if not src:
        return None
    folder = Path(src) / "mutants" / mutant["id"]
    earlier = read_result(Path(src), mutant["id"])
    try:
        diff = (folder / "mutant.diff").read_text()
    except OSError:
        return None
    if (
        not earlier
        or "vllm_tests" not in earlier
        or diff != mutant["diff"]
        or (engine is not None and earlier.get("engine") != engine)
    ):
        return None
    return {**earlier["vllm_tests"], "reused_from": str(folder / "result.json")}


def _add_vllm_tests(done: dict, mutant: dict, options: dict) -> dict:
    """A result judged by kvspec only (``vllm_tests`` off in that pass), its
    vLLM tests run now on the same build (rebuilt from the same diff when it
    was not kept: the same name, the same files), or taken from an earlier
    run of the same build (:func:`reused_vllm_tests`)."""
    out = Path(options["out"])
    folder = out / "mutants" / mutant["id"]
    reused = reused_vllm_tests(mutant, done.get("engine"), options)
    if reused is not None:
        done = {**done, "vllm_tests": reused}
        write_json_atomic(result_path(out, mutant["id"]), done)
        return done
    engine, verdict = _build(
        mutant, options.get("release", "0.33.0"), folder / "mutant.diff", options.get("base_patches") or []
    )
    if verdict is not None:
        return done
    try:
        done = dict(done)
        _put_vllm_tests(done, _vllm_tests(engine, mutant, options, folder))
    finally:
        _drop_build(engine, options)
    write_json_atomic(result_path(out, mutant["id"]), done)
    return done


def _drop_build(engine: str, options: dict) -> None:
    """Remove the mutant's build unless ``keep_build`` (a failed removal is
    left for ``kvspec engines remove``)."""
    if options.get("keep_build"):
        return
    from engine_adapter.host.environments import remove

    try:
        remove(engine.split("==", 1)[1], progress=_quiet)
    except (KvspecError, OSError):
        pass


def run_mutant(mutant: dict, budget: float, options: dict) -> dict:
    """Judge one mutant (see the module's rule); returns its result dict.

    ``options``: ``out`` (the run's folder), ``release`` (``0.33.0``),
    ``seed``, ``vllm_tests`` (bool: run them), ``baseline`` (path of the
    vLLM tests' baseline JSON), ``vllm_tests_from`` (an earlier run's folder
    whose vLLM tests' verdicts on the same builds are taken as they are),
    ``keep_build``, ``cases`` (the fixed cases' JSON). A mutant judged
    earlier by kvspec only gets its vLLM tests added when ``vllm_tests`` is
    on now (the kvspec verdict is kept as it was)."""
    out = Path(options["out"])
    mid = mutant["id"]
    done = read_result(out, mid)
    if done is not None and not _needs_vllm_tests(done, options):
        return done
    if done is not None:  # judged by kvspec in an earlier pass with the build kept: add vLLM's tests
        return _add_vllm_tests(done, mutant, options)
    folder = out / "mutants" / mid
    release = options.get("release", "0.33.0")
    diff_path = folder / "mutant.diff"
    write_text_atomic(diff_path, mutant["diff"])
    fields = {
        k: mutant.get(k)
        for k in ("id", "area", "file", "function", "operator", "occurrence", "line", "before", "after")
    }
    result: dict = {"schema": RESULT_SCHEMA, **fields, "budget_s": budget}
    t0 = time.monotonic()
    engine, verdict = _build(mutant, release, diff_path, options.get("base_patches") or [])
    result["build_s"] = round(time.monotonic() - t0, 1)
    if verdict is not None:
        result.update(verdict)
        write_json_atomic(result_path(out, mid), result)
        return result
    result["engine"] = engine
    try:
        cases = options.get("cases")
        # a mutant judged again (its result removed) starts from an empty
        # findings folder: a campaign counts a signature already on disk as
        # a duplicate, so an earlier run's finding would hide the kill
        shutil.rmtree(folder / "kvspec", ignore_errors=True)
        kv = _kvspec_kill(
            engine, budget, folder / "kvspec", int(options.get("seed", 1)), Path(cases) if cases else None
        )
        result["kvspec"] = kv
        if kv.get("harness"):
            result.update({"status": "harness", "reason": f"kvspec: {kv.get('reason')}"})
        else:
            result["status"] = "ran"
        if options.get("vllm_tests", True) and result["status"] == "ran":
            _put_vllm_tests(
                result, reused_vllm_tests(mutant, engine, options) or _vllm_tests(engine, mutant, options, folder)
            )
    finally:
        _drop_build(engine, options)
    result["elapsed_s"] = round(time.monotonic() - t0, 1)
    write_json_atomic(result_path(out, mid), result)
    return result
