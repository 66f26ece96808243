"""Evaluate the conformance manifest against the reference model and the engine.

Shared by ``test_vllm_conformance.py`` and ``table.py``. Imports no vLLM:
the engine runs in its own environment (``engine_adapter.host.engine``).
"""

from __future__ import annotations

import json
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from fuzz.judge.oracles import held_states as oracle_held_states
from ground.files import load_json
from reference.case import Case, load_case
from reference.knobs import implemented_rule
from reference.predict import predict

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.json"
VERSION = "0.33.0"
REPO_ROOT = HERE.parents[1]


def sdist() -> Path:
    """vLLM {VERSION}'s unpacked sdist (fetched from PyPI on first use)."""
    from engine_adapter.host.sources import sdist_dir

    return sdist_dir(VERSION)


@lru_cache(maxsize=1)
def manifest() -> dict:
    return load_json(MANIFEST, "conformance manifest")


def entries(expressible: bool | None = None) -> list[dict]:
    out = manifest()["entries"]
    return [e for e in out if expressible is None or e["expressible"] == expressible]


def case_paths() -> list[str]:
    return sorted({e["case"] for e in entries(True)})


def load(case_path: str) -> Case:
    return load_case(HERE / case_path)


def rule() -> str:
    """The retention rule vLLM 0.33.0 implements (the reference's knob)."""
    return implemented_rule(VERSION)


@cache
def _reference(case_path: str) -> str:
    return json.dumps(predict(load(case_path), VERSION, rule()))


def reference(case_path: str) -> dict:
    """The reference model's prediction for a case (cached; a fresh copy)."""
    return json.loads(_reference(case_path))


# ------------------------------------------------------------------ checks


def held_states(explain: dict) -> set[int]:
    """Mamba states (token counts) held on a request's prompt, from either
    the reference's or the engine's explain record (union over groups;
    :func:`fuzz.judge.oracles.held_states`, empty where none were recorded)."""
    return oracle_held_states(explain) or set()


def observe(check: dict, result: dict) -> Any:
    """The value a check reads from a result (reference or engine)."""
    i = check["request"]
    ex = result["explain"][i]
    kind = check["kind"]
    if kind == "hit":
        return result["hits"][i]
    if kind == "junction":
        return ex.get("junction")
    if kind == "chunk_ends":
        return engine_chunk_ends(ex)
    if kind == "chunk":
        seq = [result["hits"][i], *engine_chunk_ends(ex)]
        if check["start"] not in seq[:-1]:
            return {"no chunk starts at": check["start"], "chunks": seq}
        return seq[seq.index(check["start"]) + 1]
    if kind == "states":
        return sorted(held_states(ex))
    raise ValueError(f"unknown check kind {kind!r}")


def holds(check: dict, observed: Any) -> bool:
    kind = check["kind"]
    if kind in ("hit", "junction", "chunk_ends"):
        return observed == check["value"]
    if kind == "chunk":
        return observed == check["end"]
    if kind == "states":
        held = set(observed)
        if "exactly" in check:
            return held == set(check["exactly"])
        return set(check["includes"]) <= held and not (set(check["excludes"]) & held)
    raise ValueError(f"unknown check kind {kind!r}")


def describe(check: dict) -> str:
    """A check's expectation in one short line."""
    i, kind = check["request"], check["kind"]
    if kind in ("hit", "junction"):
        return f"{kind}[{i}]={check['value']}"
    if kind == "chunk_ends":
        return f"chunk_ends[{i}]={check['value']}"
    if kind == "chunk":
        return f"chunk[{i}] {check['start']}->{check['end']}"
    parts = []
    if "exactly" in check:
        parts.append(f"={check['exactly']}")
    else:
        if check["includes"]:
            parts.append(f"has {check['includes']}")
        if check["excludes"]:
            parts.append(f"not {check['excludes']}")
    return f"states[{i}] " + ", ".join(parts)


def show(check: dict, observed: Any) -> str:
    """What a result shows for a check, in the same short form."""
    i, kind = check["request"], check["kind"]
    if kind == "chunk":
        return f"chunk[{i}] {check['start']}->{observed}" if isinstance(observed, int) else f"chunk[{i}] {observed}"
    if kind == "states":
        return f"states[{i}]={observed}"
    return f"{kind}[{i}]={observed}"


def evaluate(entry: dict, result: dict, role: str = "expect") -> list[tuple[dict, Any, bool]]:
    """(check, observed, holds) for the entry's checks of one role."""
    out = []
    for check in entry["checks"]:
        if check["role"] != role:
            continue
        observed = observe(check, result)
        out.append((check, observed, holds(check, observed)))
    return out


def failures(entry: dict, result: dict, role: str = "expect") -> list[str]:
    return [f"{describe(c)}: observed {show(c, o)}" for c, o, ok in evaluate(entry, result, role) if not ok]


def knob_failures(entry: dict, knobs: dict, case: Case, engine: bool, options: dict | None = None) -> list[str]:
    """Where the knobs a case resolved to differ from the entry's setup."""
    out = []
    for name, want in entry["setup"].items():
        if name == "cache_block_size" and not engine:
            got = min(g.block_size for g in case.geometry.groups)  # the reference's scheduler block (serial.chunks)
        else:
            got = knobs.get(name)
        if got != want:
            out.append(f"knob {name}: {got!r}, the test's setup has {want!r}")
    if engine and (options or {}).get("eagle_groups") == "all":
        want = list(range(case.geometry.num_groups))
        if knobs.get("eagle_group_ids") != want:
            out.append(f"eagle_group_ids: {knobs.get('eagle_group_ids')!r}, the test flags every group {want!r}")
    return out


# ----------------------------------------------------- reference vs engine


def engine_chunk_ends(explain: dict) -> list[int]:
    """The engine's chunk ends (``engine_adapter.vllm_engine.steploop.serve`` records the
    prompt's last one as N even when vLLM schedules draft-token slots past
    the prompt with it)."""
    return [int(x) for x in explain["chunk_ends"]]


def compare(ref: dict, eng: dict) -> list[str]:
    """Where the reference's prediction and the engine's observation differ
    on the same case: hits, junctions and chunk ends of every request, and
    the states the first request keeps (later requests' explain records
    differ by construction: the engine's holds earlier requests' states on a
    shared prefix, the reference's only the request's own)."""
    out = []
    if len(ref["hits"]) != len(eng["hits"]):
        return [f"{len(ref['hits'])} requests predicted, {len(eng['hits'])} observed"]
    for i, (r, e) in enumerate(zip(ref["explain"], eng["explain"])):
        if ref["hits"][i] != eng["hits"][i]:
            out.append(f"hit[{i}]: reference {ref['hits'][i]}, engine {eng['hits'][i]}")
        if (r.get("junction") or 0) != (e.get("junction") or 0):
            out.append(f"junction[{i}]: reference {r.get('junction')}, engine {e.get('junction')}")
        if list(r["chunk_ends"]) != engine_chunk_ends(e):
            out.append(f"chunk_ends[{i}]: reference {r['chunk_ends']}, engine {e['chunk_ends']}")
    if ref["explain"] and held_states(ref["explain"][0]) != held_states(eng["explain"][0]):
        out.append(
            f"states[0]: reference {sorted(held_states(ref['explain'][0]))}, engine {sorted(held_states(eng['explain'][0]))}"
        )
    return out


class EngineRuns:
    """Engine results per (case, options), one worker for the whole session.

    ``start`` is a callable returning a started engine (the ``engines``
    fixture's ``engines("0.33.0")``, or ``WorkerEngine`` for the table)."""

    def __init__(self, get_engine) -> None:
        self._get = get_engine
        self._runs: dict[tuple[str, str], dict] = {}

    def run(self, case_path: str, options: dict | None = None) -> dict:
        key = (case_path, json.dumps(options or {}, sort_keys=True))
        if key not in self._runs:
            result = self._get().run(load(case_path), options or {})
            if result.get("error"):
                err = result["error"]
                raise RuntimeError(
                    f"{case_path}: vLLM raised in {err.get('phase')}: {err.get('type')}: {err.get('message')}"
                )
            self._runs[key] = result
        return self._runs[key]


def regenerate(engine: str, text_of, target: Path) -> int:
    """Start one worker of ``engine``, write ``text_of(worker)`` to
    ``target`` atomically and stop the worker (a conformance table's
    ``python -m`` entry point)."""
    import sys

    from engine_adapter.host.engine import WorkerEngine
    from ground.files import write_text_atomic

    worker = WorkerEngine(engine)
    try:
        worker.start()
        text = text_of(worker)
    finally:
        worker.close()
    write_text_atomic(target, text)
    print(f"wrote {target}", file=sys.stderr)
    return 0
