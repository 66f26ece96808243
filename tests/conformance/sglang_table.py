"""docs/conformance-sglang.md: SGLang's own Mamba radix-cache unit tests,
their expectations, and what SGLang 0.5.23's engine (its UnifiedRadixCache
and prefill path, driven by ``engine_adapter.sglang_engine``) observes.

The data is ``tests/conformance/sglang/manifest.json`` and the case files
next to it (JSON only). ``python -m tests.conformance.sglang_table`` runs
every expressed case on both tree cores and rewrites the document;
``tests/conformance/test_sglang_conformance.py`` checks the engine against
each value and the document's counts against the manifest.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent / "sglang"
MANIFEST = HERE / "manifest.json"
REPO_ROOT = Path(__file__).resolve().parents[2]
DOC = REPO_ROOT / "docs" / "conformance-sglang.md"
OK, BAD = "✓", "✗"
#: Appended after the table: the wheel's own multi-turn decode assertion,
#: checked by tests/engine/test_sglang.py (not a manifest entry).
DECODE_ADDENDUM = """
## SGLang 0.5.23's own multi-turn decode assertion (issue 42, decode)

Beyond the unit tests above, SGLang 0.5.23's wheel ships the assertions its
Mamba server tests apply to decode hits: `sglang/test/kl_multiturn_utils.py:92-119`
`make_mamba_decode_assert(track_interval)` (a turn quoting the previous
turn's output has `cached_tokens >= floor((history + output - 1) /
track_interval) * track_interval`), used by
`sglang/test/kits/unified_radix_cache_kit.py:105-131`
`test_multiturn_decode_cache_hit_branching` (a 512-token base shared by the
branches, 512 new tokens per turn, suffixes of 512 then 256). Now that
kvspec drives SGLang's decode steps, it is expressed:
`tests/engine/test_sglang.py::test_the_wheels_own_multiturn_decode_assert_holds_on_decode_hits`
(Qwen3-Next, `extra_buffer`, page 64, track interval 256; two branches,
three turns, served one after another). SGLang 0.5.23 meets the assertion
on all four follow-up turns, and the replay rule (`reference/sglang_prefill.py`)
states the same hits: both rules agree. Not expressed: the KL and GSM8K
halves of those tests (outputs of a real model), and the interleaving of
branches in one batch (concurrent waves are driven since stop 47, this
interleaving is not written as a case yet).
`test_unified_radix_cache_unittest.py`: sampled, above ("Not inventoried").
"""
#: What was read of the unified radix cache's own unit suite (stop 47).
UNIFIED_UNITTEST_NOTE = (
    "- `test_unified_radix_cache_unittest.py` (488,024 characters in the index, at `0014205ebcfb`): sampled, not",
    "  inventoried in full (stop 47; characters 0-48,000 and 240,000-256,000 read). It is one fixture suite",
    "  (`build_fixture(CacheConfig)`: page, components FULL/SWA/MAMBA, extra buffer, `is_eagle`) driving the tree's",
    "  own API (`insert`, `match_prefix`, `evict`, `init_hicache`, KV events) directly; the parts read assert load-back",
    "  ownership, allocation-time eviction of auxiliary (SWA, Mamba) values, HiCache write-back and demotion, L3",
    "  storage keys and KV events: eviction, host tiers and events, which the SGLang driver does not drive (no entry",
    "  expressible). One contract bears on the speculative rule: `TestUnifiedRadixCacheEagleHiCacheStorageKey`",
    "  (`test_l3_prefetch_uses_bigram_radix_key`, `test_buffer_anchor_rematch_preserves_bigram_boundary`) inserts",
    "  N+1 raw tokens with N values into an EAGLE tree and matches N (`len(match.device_indices) == len(tokens) - 1`):",
    "  a bigram key spans one raw token more than the KV it holds (0.5.23: `radix_cache.py:60`,",
    "  `unified_cache/components/swa.py:1021`). At request level the bigram tree keys and matches the lengths rules 1",
    "  and 4 of the replay rule state: rule 6 and SGLang 0.5.23 agree on 9 hand probes (resends at and past a page, a",
    "  sibling at the last token, pages 1 and 64) and on the 30 drawn cases of the `spec-extra_buffer` group of",
    "  `python -m tests.conformance.sglang_replay_table`. Not a manifest entry: its asserts are on the tree's API,",
    "  and the index gives no line numbers for this file.",
)


def manifest() -> dict:
    return json.loads(MANIFEST.read_text())


def entries(expressed: bool | None = None) -> list[dict]:
    return [e for e in manifest()["entries"] if expressed is None or e["expressed"] == expressed]


def case(path: str) -> dict:
    return json.loads((HERE / path).read_text())


def case_paths() -> list[str]:
    return sorted({e["case"] for e in entries(True)})


def observed(obs: dict, check: dict):
    """The observation's value for one check (manifest ``observation``)."""
    return obs["explain"][check["request"]][check["field"]]


def show(check: dict, value) -> str:
    return f"{check['field']}[{check['request']}]={json.dumps(value)}"


def counts(man: dict | None = None) -> dict:
    """What the manifest says; the engine tests make each xfail a real
    disagreement and every other check a real agreement."""
    man = man or manifest()
    es = man["entries"]
    expr = [e for e in es if e["expressed"]]
    checks = [c for e in expr for c in e["checks"]]
    return {
        "entries": len(es),
        "expressed": len(expr),
        "exact": sum(e["fidelity"] == "exact" for e in expr),
        "adapted": sum(e["fidelity"] == "adapted" for e in expr),
        "not_expressible": len(es) - len(expr),
        "categories": dict(sorted(collections.Counter(e["category"] for e in es if not e["expressed"]).items())),
        "case_files": len({e["case"] for e in expr}),
        "checks": len(checks),
        "checks_agree": sum("xfail" not in c for c in checks),
        "entries_agree": sum(all("xfail" not in c for c in e["checks"]) for e in expr),
    }


def summary_lines(man: dict | None = None) -> list[str]:
    n = counts(man)
    cats = ", ".join(f"{k} {v}" for k, v in n["categories"].items())
    return [
        f"- {n['entries']} entries: **{n['expressed']} expressed** ({n['exact']} exact, {n['adapted']} adapted) in {n['case_files']} case files,"
        f" **{n['not_expressible']} not expressible** ({cats}).",
        f"- Engine vs test, both tree cores (python, rust): {n['checks_agree']}/{n['checks']} asserted values agree;"
        f" {n['entries_agree']}/{n['expressed']} expressed entries agree on every value.",
    ]


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _where(e: dict) -> str:
    return f"`{e['source'].rsplit('/', 1)[-1]}`"


def render(runs: dict) -> str:
    """``runs``: {(case path, tree core): observation}."""
    man = manifest()
    src = man["source"]
    rows, disagreements = [], []
    for e in man["entries"]:
        if not e["expressed"]:
            rows.append(
                [
                    _where(e),
                    _cell(e["asserts"]),
                    "—",
                    _cell(f"`{e['id']}`; **not expressible** ({e['category']}): {e['reason']}"),
                ]
            )
            continue
        expect = "; ".join(f"{show(c, c['expect'])} (:{c['line']})" for c in e["checks"])
        parts = []
        for c in e["checks"]:
            vals = {core: observed(runs[(e["case"], core)], c) for core in man["tree_cores"]}
            same = len({json.dumps(v) for v in vals.values()}) == 1
            shown = show(c, vals["python"]) if same else ", ".join(f"{core}: {show(c, v)}" for core, v in vals.items())
            ok = all(v == c["expect"] for v in vals.values())
            parts.append(f"{shown} {OK if ok else BAD}")
            if "xfail" in c:
                disagreements.append(
                    f"- `{e['id']}` ({e['source'].rsplit('/', 1)[-1].rsplit(':', 1)[0]}:{c['line']}): expected {show(c, c['expect'])}, observed {shown}. {c['xfail']}"
                )
        notes = [f"`{e['id']}`", f"case `{e['case']}`", f"adapted: {e['adaptation']}" if e["adaptation"] else "exact"]
        notes += [f"**disagrees (xfail)** at :{c['line']}" for c in e["checks"] if "xfail" in c]
        rows.append([_where(e), _cell(f"{e['asserts']}: {expect}"), _cell("; ".join(parts)), _cell("; ".join(notes))])
    commits = ", ".join(f"`{f}` at `{c[:12]}`" for f, c in src["commits"].items())
    out = [
        "# SGLang's own Mamba radix-cache tests as kvspec conformance cases",
        "",
        "Generated by `python -m tests.conformance.sglang_table` from `tests/conformance/sglang/manifest.json`",
        "and the case files in `tests/conformance/sglang/cases/`; checked by `tests/conformance/test_sglang_conformance.py`.",
        f"Source: `{src['repo']}`, `{src['dir']}/` ({commits}), read through the code index:",
        "SGLang's unit tests are not on PyPI, and the stored versions are later than 0.5.23.",
        "They test `MambaRadixCache`, which 0.5.23 does not ship; each expectation is checked on what 0.5.23 runs for a",
        "hybrid model, `UnifiedRadixCache` with FULL and MAMBA, through the scheduler's prefill path",
        "(`Req.init_next_round_input`, where the lookup is capped at N-1, then `release_kv_cache`). The tests build their",
        "cache with page 1 and no extra buffer, so every case is Qwen3-Next with `--mamba-radix-cache-strategy no_buffer",
        "--page-size 1` (a Mamba state only where a prefill ends; checkpoint grid 64, the tests' `CHUNK`).",
        "",
        "Each expressed entry is a serial kvspec case (segments give the test's prefix relations; one request per",
        "insert the test makes, and one per lookup) and the values the test asserts, each with the line of its assert.",
        "`hit[i]` is request i's prefix length after the scheduler's match, `branching[i]` its `mamba_branching_seqlen`.",
        "`exact`: the case's lookups are the test's keys (a resend's N-1 lookup is the test's shorter key);",
        "`adapted`: the note says how the case reaches the test's key. Both tree cores (Python and the bundled Rust one) run every case.",
        "",
        "## Summary",
        "",
        *summary_lines(man),
        "",
    ]
    if disagreements:
        out += ["### Disagreements (xfail, strict)", "", *disagreements, ""]
    out += [
        "### Not inventoried",
        "",
        *UNIFIED_UNITTEST_NOTE,
        "- `test_mamba_unittest.py` (at `024f9a6860ce`): pool and `MambaRadixCache` tests whose match asserts all follow",
        "  a hand `evict` (eviction), plus KV-event, LRU-order and allocator accounting (internal); no entry expressible.",
        "- Two more `MambaRadixCache` test files were seen only by content search (no path to cite): a `--mamba-checkpoint-interval`",
        '  suite (a flag 0.5.23 does not have) and an eviction "gauntlet".',
        "",
        "## Table",
        "",
        "| SGLang test (file) | expectation | SGLang 0.5.23 observation (python and rust tree cores) | note |",
        "|---|---|---|---|",
    ]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    out.append("")
    return "\n".join(out) + DECODE_ADDENDUM


def run_all(engine) -> dict:
    man = manifest()
    runs = {}
    for path in case_paths():
        for core in man["tree_cores"]:
            obs = engine.run(case(path), {"tree_core": core})
            if obs.get("error"):
                raise RuntimeError(f"{path} ({core}): {obs['error']['message']}")
            runs[(path, core)] = obs
    return runs


def main() -> int:
    from tests.conformance.runner import regenerate

    return regenerate(manifest()["engine"], lambda engine: render(run_all(engine)), DOC)


if __name__ == "__main__":
    raise SystemExit(main())
