"""``kvspec fuzz --jobs N --ray local|auto|HOST:PORT``: N campaign workers as
Ray tasks (:mod:`fuzz.driving.distribute`), one findings folder.

Worker ``j`` runs the campaign ``kvspec fuzz`` runs here (the same driver,
engines and oracles) with seed ``--seed + j``, the seeds libFuzzer's
``--jobs`` workers get locally, until the command's deadline
(``--max-time`` counts from the command's start, Ray's start-up included).
Each worker is one Ray task taking one CPU; with ``atheris`` it runs one
libFuzzer process, exactly as ``--jobs 1`` does here.

* **One corpus, one findings folder.** When a worker sees the driver's
  folders (same machine or a shared filesystem: it finds the run's marker
  file ``OUT/.kvspec-ray-<run>``), it fuzzes from and into ``--corpus``
  (libFuzzer reloads the folder, so the workers share what each adds) and
  writes findings straight into ``--out``. Elsewhere it works in
  ``$KVSPEC_HOME/ray-staging/<run>/<job>/`` on its node and sends its
  findings, harness errors and new corpus inputs back with its result; the
  driver writes them into ``--out`` and ``--corpus`` (atomically; a file
  already there is kept).
* **Deduplicated by the judge.** A finding file is named by its oracle and
  signature (``fuzz.results.findings.signature``, the judge's notion of "the same
  bug"), so two workers finding one bug, or a retried worker finding it
  again, leave one file. The findings of this run are the files in
  ``--out`` that were not there before it, counted once each.
* **Retried.** A worker whose process died (killed, out of memory, its node
  lost) is run again by Ray with the same seed until the same deadline
  (``--ray-retries``, default 2). A worker that raised (a harness error:
  the engine could not start) is not retried; nor one lost past its
  retries: both count as a dead worker (exit 3).
* **The summary** adds up the workers' execs, engine runs, cases,
  unsupported, rejected, duplicates and harness errors, the best coverage,
  and the earliest finding; ``case_files`` accounts for every ``--case``
  file (run when some worker ran it to completion); ``ray_tasks`` lists each worker's status,
  attempt, host and pid; the task envelopes are kept in
  ``OUT/ray-tasks/<run>/``. Exit codes are ``kvspec fuzz``'s.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import time
from dataclasses import replace
from pathlib import Path

from fuzz.driving.config import RunConfig
from fuzz.driving.summary import EMPTY_KEYS, RAY_KEYS, CampaignSummary
from fuzz.results.findings import is_finding
from ground.engines import EngineSpec
from ground.files import load_json, write_bytes_atomic, write_json_atomic, write_text_atomic

#: Seconds before the command's deadline at which workers are told to end,
#: so their results come back and are merged by the deadline.
COLLECT_S = 3.0
#: Caps on what one remote worker sends back (bytes of corpus inputs; files).
MAX_CORPUS_BYTES = 8 << 20
MAX_FILES = 1000


def _findings(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("*.json") if not p.name.startswith(".")} if folder.is_dir() else set()


def _files(folder: Path | None) -> set[str]:
    if folder is None or not folder.is_dir():
        return set()
    return {
        p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith(".") and not p.name.endswith(".tmp")
    }


# ------------------------------------------------------------ on the worker


def campaign_task(task: dict) -> dict:
    """One campaign worker (a Ray task): the campaign of ``task`` until
    ``task["deadline_unix"]``; returns its summary, and, when it could not
    see the driver's folders, what it found (see the module's docstring)."""
    from ground.home import kvspec_home

    if task.get("kvspec_home") and Path(task["kvspec_home"]).is_dir():
        os.environ["KVSPEC_HOME"] = task["kvspec_home"]
    started_unix = time.time()
    out, corpus = Path(task["out"]), (Path(task["corpus"]) if task.get("corpus") else None)
    shared = (out / f".kvspec-ray-{task['run']}").is_file()
    if not shared:
        stage = kvspec_home() / "ray-staging" / task["run"] / task["id"]
        out, corpus = stage / "findings", (stage / "corpus" if corpus is not None else None)
    out.mkdir(parents=True, exist_ok=True)
    corpus_before = _files(corpus)
    seed_dir = None
    if task.get("z3_seeds"):
        from fuzz.draw.seeds import seed_dir as z3_seed_dir

        given = Path(task["seed_dir"]) if task.get("seed_dir") else None
        seed_dir = given if shared and given is not None and (given / "READY").exists() else z3_seed_dir(kvspec_home())
    left = task["deadline_unix"] - time.time()
    summary = _empty(task) if left < 1.0 else _campaign(task, out, corpus, seed_dir, left)
    result = {
        "summary": summary.to_dict(),
        "shared": shared,
        "started_unix": started_unix,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "findings": [],
        "harness_errors": [],
        "corpus": [],
    }
    if not shared:  # send back what this worker's node holds
        result["findings"] = [
            {"name": p.name, "data": json.loads(p.read_text())} for p in sorted(out.glob("*.json"))[:MAX_FILES]
        ]
        herr = out / "harness-errors"
        result["harness_errors"] = (
            [
                {"name": p.name, "text": p.read_text(errors="replace")}
                for p in sorted(herr.glob("*"))[:MAX_FILES]
                if p.is_file()
            ]
            if herr.is_dir()
            else []
        )
        size = 0
        for name in sorted(_files(corpus) - corpus_before)[:MAX_FILES]:
            data = (corpus / name).read_bytes()
            size += len(data)
            if size > MAX_CORPUS_BYTES:
                break
            result["corpus"].append({"name": name, "b64": base64.b64encode(data).decode()})
    return result


def _empty(task: dict) -> CampaignSummary:
    """A worker's summary when nothing ran: every count at the type's default."""
    return CampaignSummary(EMPTY_KEYS, engine=_engines(task)[0].name, driver=task["driver"])


def _engines(task: dict) -> list[EngineSpec]:
    """The task's engines, typed: each sent as one serialized value
    (``EngineSpec.to_json``), read back whole, never by the name grammar."""
    return [EngineSpec.from_json(task["engine"], "task.engine")] + (
        [EngineSpec.from_json(task["other"], "task.other")] if task.get("other") else []
    )


def _config(task: dict) -> RunConfig:
    """The task's campaign, typed: one worker (its own seed) of the
    campaign the driver was given."""
    return RunConfig(
        driver=task["driver"],
        seed=task["seed"],
        synthetic=bool(task.get("synthetic")),
        connector=task.get("connector") or "drawn",
        pressure=task.get("pressure") or "drawn",
        libfuzzer=tuple(task.get("libfuzzer") or ()),
    )


def _campaign(task: dict, out: Path, corpus: Path | None, seed_dir: Path | None, left: float) -> CampaignSummary:
    started = time.monotonic()
    deadline = started + left
    engines, config = _engines(task), _config(task)
    if config.driver == "atheris":
        from fuzz.driving.atheris_runner import run_atheris

        other = engines[1] if len(engines) > 1 else None
        return run_atheris(engines[0], config, out, corpus, seed_dir, left, other=other, deadline=deadline)
    from fuzz.draw.seeds import load_seed_cases
    from fuzz.driving.runner import run_in_process
    from reference.case import parse_case

    seeds = load_seed_cases(seed_dir) if seed_dir else []
    raws = task.get("cases") or []  # the files' JSON, sent with the task
    names = task.get("case_names") or [f"case {i + 1}" for i in range(len(raws))]
    given = [(name, parse_case(raw["case"] if is_finding(raw) else raw)) for name, raw in zip(names, raws)]
    return run_in_process(config, engines, out, seeds, given, started, deadline)


# ------------------------------------------------------------ on the driver


def run_on_ray(
    config: RunConfig,
    engines: list[EngineSpec],
    out: Path,
    corpus: Path | None,
    seed_dir: Path | None,
    case_files: list[str],
    started: float,
    deadline: float,
    *,
    address: str,
    retries: int,
    say,
) -> CampaignSummary:
    """Run ``config.jobs`` campaign workers on Ray (at ``address``; a
    lost task tried again ``retries`` times) until ``deadline``
    (``time.monotonic()``), worker j with seed ``config.seed + j``, each
    running the ``case_files`` first; the summary ``kvspec fuzz`` prints."""
    from fuzz.driving.atheris_runner import STOP_GRACE_S
    from fuzz.driving.distribute import run_tasks
    from fuzz.driving.progress import Heartbeat, count_files
    from ground.home import kvspec_home

    run = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}"
    out.mkdir(parents=True, exist_ok=True)  # paths in the summary as given (triage marks the new ones by path)
    if corpus is not None:
        corpus = corpus.resolve()
        corpus.mkdir(parents=True, exist_ok=True)
    marker = out / f".kvspec-ray-{run}"
    write_text_atomic(marker, run + "\n")
    before = _findings(out)
    started_unix = time.time() - (time.monotonic() - started)
    end = deadline - STOP_GRACE_S  # results merged and the summary printed by the deadline
    tasks = [
        {
            "id": f"job-{j}",
            "run": run,
            "engine": engines[0].to_json(),
            "other": engines[1].to_json() if len(engines) > 1 else None,
            "driver": config.driver,
            "seed": config.seed + j,
            "deadline_unix": time.time() + (end - COLLECT_S - time.monotonic()),
            "out": str(out.resolve()),
            "corpus": str(corpus) if corpus is not None else None,
            "z3_seeds": seed_dir is not None,
            "seed_dir": str(seed_dir) if seed_dir is not None else None,
            "cases": [load_json(p, "case file") for p in case_files],
            "case_names": list(case_files),
            "synthetic": config.synthetic,
            "connector": config.connector,
            "pressure": config.pressure,
            "libfuzzer": list(config.libfuzzer),
            "kvspec_home": str(kvspec_home()),
        }
        for j in range(config.jobs)
    ]
    done: list[dict] = []

    def line() -> str:
        elapsed = time.monotonic() - started
        return f"kvspec fuzz: {elapsed:7.1f}s  ray {address}: {config.jobs - len(done)} worker(s) running, {len(done)} done  findings {max(0, count_files(out, '*.json') - len(before))}"

    say(
        f"kvspec fuzz: {config.jobs} worker(s) on Ray ({address}), seeds {config.seed}..{config.seed + config.jobs - 1}, findings into {out}"
    )
    try:
        with Heartbeat(line, say):
            results = run_tasks(
                campaign_task,
                tasks,
                ray_address=address,
                out=out / "ray-tasks" / run,
                retries=retries,
                timeout_s=max(1.0, end - time.monotonic()),
                num_cpus=config.jobs,
                resume=False,
                progress=done.append,
            )
    finally:
        try:
            marker.unlink()
        except OSError:
            pass
    return _merge(results, config, address, case_files, engines, out, corpus, before, started, started_unix)


def _case_files(reports: list[dict | None], names: list[str]) -> dict | None:
    """The --case files' accounting over every worker (each runs them all):
    a file is run when some worker ran it to completion; otherwise it is
    unfinished, for the furthest any worker got with it (a harness error,
    then cut at the deadline, then not started: also when no worker
    reported at all, every one died or ran out of time first)."""
    if not names:
        return None
    rank = {"not_started": 0, "cut_at_deadline": 1, "harness_error": 2, "run": 3}
    why = {name: "not_started" for name in names}
    for report in reports:
        if not report or report.get("given") != len(names):
            continue
        left = {u["path"]: u["why"] for u in report.get("unfinished", [])}
        for name in names:
            got = left.get(name, "run")
            if rank.get(got, 0) > rank[why[name]]:
                why[name] = got
    counts = {"given": len(names), "run": 0, "cut_at_deadline": 0, "harness_error": 0, "not_started": 0}
    for w in why.values():
        counts[w] += 1
    return {**counts, "unfinished": [{"path": n, "why": w} for n, w in why.items() if w != "run"]}


def _merge(
    results: list[dict],
    config: RunConfig,
    address: str,
    case_files: list[str],
    engines: list[EngineSpec],
    out: Path,
    corpus: Path | None,
    before: set[str],
    started: float,
    started_unix: float,
) -> CampaignSummary:
    """Write what remote workers sent back, then add up the summaries
    (:meth:`fuzz.driving.summary.CampaignSummary.merge`)."""
    firsts, tasks, failed, ready, workers = [], [], 0, [], []
    for env in results:
        res = env.get("result") or {}
        s = CampaignSummary.from_dict(res.get("summary") or {})
        workers.append(s)
        for f in res.get("findings", []):
            if not (out / f["name"]).exists():
                write_json_atomic(out / f["name"], f["data"])
        for h in res.get("harness_errors", []):
            if not (out / "harness-errors" / h["name"]).exists():
                write_text_atomic(out / "harness-errors" / h["name"], h["text"])
        if corpus is not None:
            for c in res.get("corpus", []):
                if not (corpus / c["name"]).exists():
                    write_bytes_atomic(corpus / c["name"], base64.b64decode(c["b64"]))
        if s.startup_s is not None and res.get("started_unix"):
            ready.append(res["started_unix"] - started_unix + float(s.startup_s))
        if s.first_finding_s is not None and res.get("started_unix"):
            firsts.append(res["started_unix"] - started_unix + float(s.first_finding_s))
        if env["status"] != "ok":
            failed += 1
        reported = "execs" in s.keys  # a worker that returned no summary reports none of its counts
        tasks.append(
            {
                "id": env["id"],
                "status": env["status"],
                "attempt": env.get("attempt"),
                "host": env.get("host"),
                "pid": env.get("pid"),
                "execs": s.execs if reported else None,
                "findings_reported": len(s.findings or []),
                "duplicates": s.duplicates if "duplicates" in s.keys else None,
                "harness_errors": s.harness_errors if "harness_errors" in s.keys else None,
                "error": env.get("error"),
            }
        )
    accounted = _case_files([s.case_files for s in workers], case_files)
    new = sorted(_findings(out) - before)
    findings = []
    for name in new:
        try:
            summary = json.loads((out / name).read_text()).get("summary")
        except (OSError, ValueError):
            summary = None
        findings.append({"path": str(out / name), "summary": summary})
    total = CampaignSummary(
        RAY_KEYS, engine=engines[0].name, driver=config.driver, ray=address, jobs=config.jobs
    ).merge(*workers)
    elapsed = time.monotonic() - started
    return replace(
        total,
        elapsed_s=round(elapsed, 2),
        exec_per_s=round(total.exec_per_s, 1),
        # start-up: until the last worker was ready (Ray's start included); rates per second of fuzzing, workers added up
        startup_s=round(max(ready), 2) if ready else None,
        engine_runs_per_s=round(total.engine_runs_per_s, 2),
        cases_per_s=round(total.cases_per_s, 2),
        workers_died=total.workers_died + failed,
        findings=findings,
        first_finding_s=round(min(firsts), 2) if firsts else None,
        case_files=accounted,
        ray_tasks=tasks,
        ray_retried=sum(1 for t in tasks if (t["attempt"] or 0) > 0),
        ray_nodes=sorted({t["host"] for t in tasks if t["host"]}),
    )
