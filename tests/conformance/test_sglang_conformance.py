"""SGLang's own Mamba radix-cache unit tests as a conformance source.

``tests/conformance/sglang/manifest.json`` lists every test of the
inventoried files (SGLang's ``test/registered/unit/mem_cache/``, read through
the code index; they are not on PyPI) with its ``file:line``: the expressed
ones as a kvspec SGLang case plus the values the test asserts, the others
with why not. Each asserted value is checked on the real SGLang 0.5.23 engine
(``engine_adapter.sglang_engine``), on both tree cores. An understood
disagreement is an ``xfail(strict=True)`` whose reason is in the manifest
(and docs/conformance-sglang.md); anything else fails.
"""

from __future__ import annotations

import json
import re

import pytest

from engine_adapter.host.engine import WorkerEngine
from reference.case import parse_case
from tests.conformance import sglang_table as table
from tests.engine.conftest import ensure_env

MAN = table.manifest()
CORES = MAN["tree_cores"]


def _check_params():
    out = []
    for e in table.entries(True):
        for c in e["checks"]:
            for core in CORES:
                marks = [pytest.mark.xfail(strict=True, reason=c["xfail"])] if "xfail" in c else []
                out.append(pytest.param(e, c, core, id=f"{e['id']}:{c['line']}:{core}", marks=marks))
    return out


@pytest.fixture(scope="module")
def sglang():
    ensure_env(MAN["engine"])
    engine = WorkerEngine(MAN["engine"])
    engine.start()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def runs(sglang):
    cache: dict = {}

    def get(path: str, core: str) -> dict:
        if (path, core) not in cache:
            obs = sglang.run(table.case(path), {"tree_core": core})
            assert "error" not in obs, obs.get("error")
            assert obs["harness"]["tree_core"] == core
            cache[(path, core)] = obs
        return cache[(path, core)]

    return get


# --------------------------------------------------------- the manifest itself


def test_manifest_is_well_formed():
    categories = MAN["not_expressible_categories"]
    ids = [e["id"] for e in MAN["entries"]]
    assert len(ids) == len(set(ids))
    assert table.entries(True) and table.entries(False)
    for e in MAN["entries"]:
        path, line = e["source"].rsplit(":", 1)
        assert path.startswith(MAN["source"]["dir"] + "/") and int(line) > 0, e["id"]
        assert e["commit"] == MAN["source"]["commits"][path.rsplit("/", 1)[-1]], e["id"]
        assert re.fullmatch(r"[0-9a-f]{40}", e["commit"]), e["id"]
        assert e["asserts"].strip() and e["test"].strip(), e["id"]
        if e["expressed"]:
            assert e["fidelity"] in ("exact", "adapted") and (e["fidelity"] == "adapted") == bool(e["adaptation"]), e[
                "id"
            ]
            assert e["checks"], e["id"]
            for c in e["checks"]:
                assert c["field"] in MAN["observation"] and c["line"] > 0 and c["what"].strip(), (e["id"], c)
                assert "xfail" not in c or c["xfail"].strip(), (e["id"], c)
        else:
            assert e["category"] in categories and e["reason"].strip(), e["id"]


def test_cases_are_json_sglang_deployments_and_all_used():
    on_disk = {f"cases/{p.name}" for p in (table.HERE / "cases").glob("*")}
    assert on_disk == set(table.case_paths())
    for path in on_disk:
        doc = json.loads((table.HERE / path).read_text())
        case = parse_case(doc)
        assert case.deployment is not None and case.deployment.engine == "sglang", path
        assert all(r.max_tokens == 1 for r in case.trace), path
        for e in table.entries(True):
            if e["case"] == path:
                assert all(c["request"] < len(case.trace) for c in e["checks"]), e["id"]


def test_docs_counts_match_the_manifest():
    text = table.DOC.read_text()
    for line in table.summary_lines(MAN):
        assert line in text, line
    for e in MAN["entries"]:
        assert f"`{e['id']}`" in text, e["id"]
    n = table.counts(MAN)
    rows = [r for r in text.splitlines() if r.startswith("| `")]
    assert len(rows) == n["entries"]
    assert sum("**not expressible**" in r for r in rows) == n["not_expressible"]
    assert text.count("**disagrees (xfail)**") == n["checks"] - n["checks_agree"]


# --------------------------------------------------------- the engine


@pytest.mark.parametrize("entry, check, core", _check_params())
def test_sglang_engine_gives_the_tests_value(runs, entry, check, core):
    obs = runs(entry["case"], core)
    value = table.observed(obs, check)
    assert value == check["expect"], (
        f"{entry['source']}: {table.show(check, value)}, the test asserts {table.show(check, check['expect'])}"
    )


def test_both_tree_cores_agree_and_resumed_states_are_their_tokens(runs):
    for path in table.case_paths():
        by_core = {core: runs(path, core) for core in CORES}
        first = by_core[CORES[0]]
        for core, obs in by_core.items():
            assert [(e["hit"], e["branching"], e["chunk_ends"], e["tracked"]) for e in obs["explain"]] == [
                (e["hit"], e["branching"], e["chunk_ends"], e["tracked"]) for e in first["explain"]
            ], (path, core)
            for e in obs["explain"]:
                assert e["hit"] == 0 or e["resumed_state"] == {"tokens": e["hit"], "same_tokens": True}, (path, core, e)
