"""Equivalent mutants: a mutant that changes no behaviour cannot be killed,
so it is excluded from every score, but only once a person has reviewed it.

The rules:

* **The check** (:func:`check`): over ``n`` seeded random cases on
  deployments, the mutant's engine observation equals the release's on
  every one (hits, queries, knobs, the explanation, retained states, any
  vLLM error; the engine's name, timing, file digest and harness fields
  aside). Passing it makes a mutant a *candidate*, no more.
* **The reviewed list** (``mutate/equivalent.json``): ``[{"id", "argument",
  "check"}]``, ``argument`` one line saying why no input can tell the
  mutant from the release (read from vLLM's source), ``check`` what
  :func:`check` found. Only ids on this list are counted as equivalent.
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


def behaviour(obs: dict) -> dict:
    return {k: v for k, v in obs.items() if k not in IGNORED}


def check(mutant_engine: str, release: str, *, n: int = 30, seed: int = 1, cases_path: Path | None = None, out: Path | None = None) -> dict:
    """Run the fixed cases (``cases_path``) and ``n`` seeded random cases on
    deployments on both engines; the first case whose behaviour differs, or
    none."""
    from engine_adapter import open_engine
    from reference.case import case_to_dict, parse_case

    from fuzz.campaign import Campaign
    from fuzz.drivers import random_cases

    cases = [parse_case(raw) for raw in json.loads(Path(cases_path).read_text())] if cases_path else []
    mutant, base = open_engine(mutant_engine), open_engine(f"vllm=={release}")
    compared = 0
    try:
        resolver = Campaign(base, Path(out or "/nonexistent-unused"), seed=seed).resolver
        gen = random_cases(random.Random(seed).randrange(2**31), resolver=resolver)
        for i in range(len(cases) + n):
            case = cases[i] if i < len(cases) else next(gen)
            a, b = behaviour(mutant.run(case)), behaviour(base.run(case))
            compared += 1
            if a != b:
                return {"equal": False, "compared": compared, "case": case_to_dict(case)}
    finally:
        mutant.close()
        base.close()
    return {"equal": True, "compared": compared}
