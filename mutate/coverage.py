"""Branch coverage of the target functions: a kvspec campaign against
vLLM's own tests, side by side (issue 12, item 3).

The rules:

* **Under kvspec**: the cases of a campaign of ``campaign_s`` seconds on the
  release (the fixed cases of :func:`mutate.kill.fixed_cases`, then seeded
  random cases over deployments, judged by the build oracles as in
  ``kvspec mutate``) are recorded, then replayed in the release's engine
  environment under ``coverage run --branch`` restricted to the target
  files (:mod:`mutate.replay_cases`, the in-process engine): a case runs
  the same vLLM code whether judged or replayed.
* **Under vLLM's tests**: the union over the relevant test files of what
  their baseline run executed (:func:`mutate.vllm_tests.baseline`).
* **Per function**: a line or branch counts for the target function whose
  body holds it (a branch by its source line); a function's branches are
  those coverage.py found in its lines (executed + missing).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from fuzz.judge.oracle_registry import KNOWN_ORACLES
from ground.files import write_json_atomic
from mutate.targets import Span, spans


def campaign_cases(release: str, *, seconds: float, seed: int, out: Path, progress=None) -> Path:
    """Run a campaign of ``seconds`` on the release and record its cases."""
    from engine_adapter import open_engine
    from fuzz.driving.campaign import Campaign
    from fuzz.driving.drivers import BoundedEngine, run_random
    from mutate.kill import fixed_cases
    from reference.case import case_to_dict, parse_case

    say = progress or (lambda line: None)
    cases_path = fixed_cases(release, out, progress=say)
    engine = open_engine(f"vllm=={release}")
    if hasattr(engine, "start"):
        engine.start()
    deadline = time.monotonic() + seconds
    campaign = Campaign(
        BoundedEngine(engine, deadline),
        out / "coverage-campaign",
        oracles=KNOWN_ORACLES,
        seed=seed,
        shrink_calls=0,
        deadline=deadline,
    )
    ran: list[dict] = []
    check = campaign.check

    def recording(case):
        ran.append(case_to_dict(case))
        return check(case)

    campaign.check = recording
    try:
        for raw in json.loads(Path(cases_path).read_text()):
            if time.monotonic() >= deadline:
                break
            campaign.check(parse_case(raw))
        if time.monotonic() < deadline:
            run_random(campaign, seed, max_time=max(0.0, deadline - time.monotonic()))
    finally:
        engine.close()
    say(f"[mutate] coverage campaign: {len(ran)} cases in {seconds:g}s")
    path = out / "coverage-cases.json"
    write_json_atomic(path, ran, indent=None)
    return path


def replay_coverage(release: str, cases: Path, out: Path, jobs: int | None = None, timeout_s: float = 3600) -> dict:
    """coverage.py's JSON (files keyed by ``vllm/<file>``) of the cases
    replayed in the release's environment, in ``jobs`` processes (default:
    the CPUs, at most 4), each on every ``jobs``-th case under its own data
    file, combined: the union of what they executed is what one process
    would have. Each waits at most ``timeout_s``."""
    from engine_adapter.host.environments import REPO_ROOT, env_python, worker_env
    from engine_adapter.host.testtools import ensure_coverage
    from ground.errors import EngineError
    from mutate.vllm_tests import target_paths

    python = str(env_python(release))
    if not ensure_coverage(python):
        raise EngineError(
            f"engine=vllm=={release}: cannot install coverage in its environment; allowed: an environment pip can install into"
        )
    raw = json.loads(Path(cases).read_text())
    jobs = max(1, min(jobs or min(os.cpu_count() or 1, 4), len(raw) or 1))
    data, report = out / "campaign.coverage", out / "campaign.cov.json"
    env = worker_env(release, "cuda")
    include = f"--include={','.join(target_paths(release))}"
    procs = []
    for k in range(jobs):
        shard = out / f"coverage-cases.{k}.json"
        write_json_atomic(shard, raw[k::jobs], indent=None)
        log = open(out / f"campaign.coverage.{k}.log", "w")
        procs.append(
            (
                subprocess.Popen(
                    [
                        python,
                        "-m",
                        "coverage",
                        "run",
                        "--branch",
                        f"--data-file={data}.{k}",
                        include,
                        "-m",
                        "mutate.replay_cases",
                        str(shard),
                        release,
                    ],
                    cwd=REPO_ROOT,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                ),
                log,
            )
        )
    deadline = time.monotonic() + timeout_s
    replays, failed = [], None
    for k, (proc, log) in enumerate(procs):
        try:
            stdout, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, _ = proc.communicate()
            failed = failed or f"shard {k} ran past {timeout_s:g} s"
        log.close()
        if proc.returncode != 0:
            tail = (Path(log.name).read_text(errors="replace").strip().splitlines() or [""])[-1][:300]
            failed = failed or f"shard {k} exited {proc.returncode}: {tail}"
        else:
            replays.append(json.loads(stdout.strip().splitlines()[-1]))
    if failed:
        raise EngineError(f"engine=vllm=={release}: replaying the campaign's cases under coverage failed: {failed}")
    report.unlink(missing_ok=True)  # never read an earlier run's report
    for step in (
        ["combine", f"--data-file={data}", *(f"{data}.{k}" for k in range(jobs))],
        ["json", f"--data-file={data}", "-o", str(report), "--quiet"],
    ):
        done = subprocess.run(
            [python, "-m", "coverage", *step], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600
        )
        if done.returncode != 0:
            raise EngineError(
                f"engine=vllm=={release}: coverage {step[0]} failed: {(done.stderr.strip().splitlines() or [''])[-1][:300]}"
            )
    prefix = Path(target_paths(release)[0]).parents[2]  # .../site-packages/vllm
    files = {}
    for path, info in json.loads(report.read_text()).get("files", {}).items():
        files[os.path.relpath(path, prefix)] = info
    replay = {
        "ran": sum(r.get("ran", 0) for r in replays),
        "refused": sum(r.get("refused", 0) for r in replays),
        "jobs": jobs,
    }
    return {"replay": replay, "files": files}


def per_function(
    all_spans: list[Span], executed: dict[str, set], executed_arcs: dict[str, set], all_arcs: dict[str, set]
) -> dict:
    """function -> lines, executed lines, branches, executed branches."""
    out = {}
    for s in all_spans:
        body = range(s.body_start, s.end + 1)
        arcs = {a for a in all_arcs.get(s.file, set()) if a[0] in body}
        out[s.function] = {
            "file": s.file,
            "branches": len(arcs),
            "branches_executed": len(arcs & executed_arcs.get(s.file, set())),
            "lines_executed": len(set(body) & executed.get(s.file, set())),
        }
    return out


def _table(funcs: dict) -> dict:
    tot = sum(v["branches"] for v in funcs.values())
    ex = sum(v["branches_executed"] for v in funcs.values())
    return {"branches": tot, "executed": ex, "share": round(ex / tot, 3) if tot else None}


def compare(release: str, *, out: Path, campaign_s: float, seed: int = 1, progress=None) -> dict:
    """Branch coverage of the target functions under a ``campaign_s``
    campaign and under vLLM's tests; written to ``OUT/coverage.json`` and
    ``OUT/coverage.md``."""
    from ground.files import write_text_atomic
    from mutate.targets import release_vllm_root
    from mutate.vllm_tests import baseline

    out = Path(out)
    say = progress or (lambda line: None)
    all_spans = spans(release_vllm_root(release))
    cases = campaign_cases(release, seconds=campaign_s, seed=seed, out=out, progress=say)
    camp = replay_coverage(release, cases, out)
    tuple_set = lambda xs: {tuple(x) for x in xs}  # noqa: E731
    all_arcs: dict[str, set] = {}
    c_lines, c_arcs = {}, {}
    for f, info in camp["files"].items():
        c_lines[f] = set(info.get("executed_lines", []))
        c_arcs[f] = tuple_set(info.get("executed_branches", []))
        all_arcs[f] = c_arcs[f] | tuple_set(info.get("missing_branches", []))
    base = baseline(release, progress=say)
    t_lines: dict[str, set] = {}
    t_arcs: dict[str, set] = {}
    for info in base["files"].values():
        for f, xs in info.get("executed_lines", {}).items():
            t_lines.setdefault(f, set()).update(xs)
        for f, xs in info.get("executed_branches", {}).items():
            t_arcs.setdefault(f, set()).update(tuple_set(xs))
        for f, xs in info.get("missing_branches", {}).items():
            all_arcs.setdefault(f, set()).update(tuple_set(xs))
    for f in list(all_arcs):
        all_arcs[f] |= t_arcs.get(f, set()) | c_arcs.get(f, set())
    kv = per_function(all_spans, c_lines, c_arcs, all_arcs)
    vt = per_function(all_spans, t_lines, t_arcs, all_arcs)
    summary = {
        "release": release,
        "campaign_s": campaign_s,
        "campaign_cases": camp["replay"].get("ran"),
        "kvspec": _table(kv),
        "vllm_tests": _table(vt),
        "union": _table(
            {
                k: {
                    "branches": kv[k]["branches"],
                    "branches_executed": len(
                        {
                            a
                            for a in all_arcs.get(kv[k]["file"], set())
                            if a in c_arcs.get(kv[k]["file"], set()) | t_arcs.get(kv[k]["file"], set())
                            and a[0] in range(s.body_start, s.end + 1)
                        }
                    ),
                }
                for k, s in ((s.function, s) for s in all_spans)
            }
        ),
    }
    result = {"summary": summary, "per_function": {f: {"kvspec": kv[f], "vllm_tests": vt[f]} for f in kv}}
    write_json_atomic(out / "coverage.json", result)
    lines = [
        "# Branch coverage of the target functions",
        "",
        f"vllm=={release}; kvspec: a {campaign_s:g}s campaign ({summary['campaign_cases']} cases) replayed under coverage.py --branch; vLLM's tests: tests/v1/core (the relevant files, CPU).",
        "",
        f"- kvspec: {summary['kvspec']['executed']}/{summary['kvspec']['branches']} branches ({summary['kvspec']['share']})",
        f"- vLLM's tests: {summary['vllm_tests']['executed']}/{summary['vllm_tests']['branches']} branches ({summary['vllm_tests']['share']})",
        f"- either: {summary['union']['executed']}/{summary['union']['branches']} ({summary['union']['share']})",
        "",
        "| function | branches | kvspec | vLLM tests |",
        "|---|---|---|---|",
    ]
    for f in kv:
        lines.append(f"| `{f}` | {kv[f]['branches']} | {kv[f]['branches_executed']} | {vt[f]['branches_executed']} |")
    write_text_atomic(out / "coverage.md", "\n".join(lines) + "\n")
    return result
