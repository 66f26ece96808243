"""Equivalent mutants: a mutant that changes no behaviour cannot be killed,
so it is excluded from every score, but only once a person has reviewed it.

The rules:

* **The check** (:func:`check`): over the fixed cases and ``n`` seeded
  random cases on deployments, the mutant's engine observation equals the
  base's on every one: hits, queries, knobs, resolution, any vLLM error,
  and per request the scheduler's hit and junction, the chunk ends, the
  states written and the Mamba states retained. Left aside: what ran it
  (engine name, timing, file digest, harness fields) and the recorded
  arguments of vLLM's internal calls (``boundaries``: what
  ``replay_boundaries`` returned; ``cache_blocks``: the token counts passed
  to ``cache_blocks``), which restate the mutated code rather than what it
  does. Passing it makes a mutant a *candidate*, no more.
* **The reviewed list** (``mutate/equivalent.json``): ``[{"id", "kind",
  "argument", "check"}]``, ``argument`` one line read from vLLM's source,
  ``check`` what :func:`check` found. ``kind`` ``equivalent``: no input can
  tell the mutant from the base (counted apart); ``out of scope``: the
  mutant behaves differently only in configurations no deployment kvspec
  resolves has (a KV connector, one KV cache group, no prefix caching,
  another model's specs, a second spec group beside Mamba that is not full
  attention), so kvspec cannot reach it, though vLLM's own
  tests or another deployment may (still scored; ``mutate.report`` gives a
  second score without them).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

REVIEWED = Path(__file__).with_name("equivalent.json")
#: Observation fields that describe the run, not vLLM's behaviour.
IGNORED = ("engine", "timing", "vllm_files_sha256", "harness")


def reviewed(path: Path = REVIEWED) -> dict[str, dict]:
    """id -> entry of the reviewed list (empty when there is none)."""
    try:
        entries = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    return {e["id"]: e for e in entries}


#: Explain fields that record internal call arguments, not behaviour.
INTERNAL = ("boundaries", "cache_blocks")


def behaviour(obs: dict) -> dict:
    out = {k: v for k, v in obs.items() if k not in IGNORED}
    if isinstance(out.get("explain"), list):
        out["explain"] = [{k: v for k, v in e.items() if k not in INTERNAL} for e in out["explain"]]
    return out


def _observed(engine, case) -> dict:
    """The behaviour of ``engine`` on ``case``; a deployment vLLM rejects is
    behaviour too (the generator draws a --prefix-match-unit that does not
    divide the block, which the release must reject): the rejection's
    message."""
    from ground.errors import DeploymentRejected

    try:
        return behaviour(engine.run(case))
    except DeploymentRejected as e:
        return {"rejected": str(e)}


def check(
    mutant_engine: str,
    base_engine: str,
    *,
    n: int = 30,
    seed: int = 1,
    cases_path: Path | None = None,
    out: Path | None = None,
) -> dict:
    """Run the fixed cases (``cases_path``) and ``n`` seeded random cases on
    deployments on the mutant and on the base it was planted in (the
    release with the base patches); the first case whose behaviour
    differs, or none."""
    from engine_adapter import open_engine
    from fuzz.driving.campaign import Campaign
    from fuzz.driving.drivers import random_cases
    from reference.case import case_to_dict, parse_case

    cases = [parse_case(raw) for raw in json.loads(Path(cases_path).read_text())] if cases_path else []
    mutant, base = open_engine(mutant_engine), open_engine(base_engine)
    compared = 0
    try:
        resolver = Campaign(base, Path(out or "/nonexistent-unused"), seed=seed).resolver
        gen = random_cases(random.Random(seed).randrange(2**31), resolver=resolver)
        for i in range(len(cases) + n):
            case = cases[i] if i < len(cases) else next(gen)
            a, b = _observed(mutant, case), _observed(base, case)
            compared += 1
            if a != b:
                return {"equal": False, "compared": compared, "case": case_to_dict(case)}
    finally:
        mutant.close()
        base.close()
    return {"equal": True, "compared": compared}


def check_mutants(release: str, ids: list[str], *, out: Path, n: int = 30, seed: int = 1, progress=None) -> list[dict]:
    """:func:`check` for each mutant id (built in the run's base like
    ``kvspec mutate`` builds it, removed after); each result also written
    to ``OUT/equivalent/<id>.json``. A mutant whose build fails is
    reported, not checked. A build that existed before (kept by a run) is
    left in place; one made here is removed after."""
    from engine_adapter.host.environments import engines_dir, env_dir
    from ground.errors import KvspecError
    from ground.files import write_json_atomic, write_text_atomic
    from mutate.kill import _build, _drop_build, fixed_cases
    from mutate.run import base_engine, default_base_patches, select_mutants

    say = progress or (lambda _line: None)
    patches = default_base_patches(release)
    base = base_engine(release, patches)
    cases = fixed_cases(release, Path(out), progress=say)
    results = []
    for m in select_mutants(release, n=None, only=ids, seed=seed, base=base):
        folder = Path(out) / "equivalent"
        diff = folder / f"{m['id']}.diff"
        write_text_atomic(diff, m["diff"])
        existed = {p.name for p in engines_dir().iterdir()} if engines_dir().is_dir() else set()
        engine, verdict = _build(m, release, diff, patches)
        # a build kept by a run (--keep-builds) is that run's to remove
        mine = engine is not None and env_dir(engine.split("==", 1)[1]).name not in existed
        if verdict is not None:
            res = {"id": m["id"], "equal": None, "reason": verdict.get("reason")}
        else:
            try:
                res = {
                    "id": m["id"],
                    **check(engine, base, n=n, seed=seed, cases_path=cases, out=Path(out) / "equivalent" / "probe"),
                }
            except KvspecError as e:
                res = {"id": m["id"], "equal": None, "reason": str(e)[:300]}
            finally:
                _drop_build(engine, {"keep_build": not mine})
        res.update(
            {
                "function": m["function"],
                "line": m["line"],
                "before": m["before"],
                "after": m["after"],
                "base": base,
                "random_cases": n,
                "seed": seed,
            }
        )
        write_json_atomic(folder / f"{m['id']}.json", res)
        say(
            f"[mutate] {m['id']}: {'no difference over %d cases' % res['compared'] if res.get('equal') else 'differs' if res.get('equal') is False else 'not checked: ' + str(res.get('reason'))[:160]}"
        )
        results.append(res)
    return results
