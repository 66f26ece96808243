"""The one oracle registry (fuzz/judge/oracle_registry.py): every oracle an
oracle module can produce is in it, every list of oracles is derived from
it, and the help and the docs' table say what it says."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from fuzz.judge import oracle_registry as registry
from fuzz.judge.oracle_registry import (
    BUILD_ORACLES,
    CONCURRENT_ORACLES,
    EXTRA_ORACLES,
    HIT_ORACLES,
    KNOWN_ORACLES,
    NEUTRAL_ORACLES,
    NOT_BY_COUNTERS,
    ORACLES,
    REGISTRY,
    SAME_HITS_ORACLES,
    SINGLE_ENGINE_ORACLES,
    VARIANT_ORACLES,
)
from fuzz.judge.oracles import SINGLE_RUN_CHECKS
from kvspec.commands import check_build
from kvspec.commands import fuzz as fuzz_command
from kvspec.engine_options import NOTE

ROOT = Path(__file__).resolve().parents[2]
#: A divergence an oracle module makes names its oracle first.
PRODUCES = re.compile(r"\b(?:Divergence|same_hits)\(\s*\"(\w+)\"")


def produced(text: str) -> set[str]:
    """The oracle names a module's source makes divergences of."""
    return set(PRODUCES.findall(text))


def test_the_lists_keep_what_they_held_before_the_registry():
    """The literals each list was written as before it was derived (issue
    28): the same names in the same order; CONCURRENT_ORACLES and the
    oracles hit counters cannot judge were only ever tested by membership,
    so their order is the registry's. ``resumed_state`` joined with SGLang
    (issue 26), before ``versions``; the safety oracles ``cap``, ``keys`` and
    ``draft_keys`` (issue 39) after ``stale``."""
    assert ORACLES == (
        "promise",
        "stale",
        "cap",
        "keys",
        "draft_keys",
        "retention",
        "split",
        "checkpoint",
        "hit_blocks",
        "shared_prefix",
        "block_table",
        "resolution",
        "reference",
        "knobs",
        "sparse_dense",
        "spec_on_off",
        "resumed_state",
        "versions",
        "engine_error",
    )
    assert BUILD_ORACLES == (
        "promise",
        "stale",
        "cap",
        "keys",
        "draft_keys",
        "retention",
        "split",
        "checkpoint",
        "hit_blocks",
        "shared_prefix",
        "block_table",
        "resolution",
        "sparse_dense",
        "spec_on_off",
        "resumed_state",
        "versions",
        "engine_error",
        "junction",
    )
    assert NEUTRAL_ORACLES == (
        "promise",
        "stale",
        "cap",
        "keys",
        "draft_keys",
        "resumed_state",
        "versions",
        "engine_error",
        "outputs",
    )  # outputs: issue 44, run when asked
    assert EXTRA_ORACLES == ("outputs", "junction") and KNOWN_ORACLES == ORACLES + ("outputs", "junction")
    assert SAME_HITS_ORACLES == (
        "retention",
        "split",
        "checkpoint",
        "hit_blocks",
        "shared_prefix",
        "block_table",
        "outputs",
    )
    assert SINGLE_ENGINE_ORACLES == tuple(o for o in ORACLES if o != "versions")
    assert HIT_ORACLES == ("promise", "sparse_dense", "spec_on_off")
    assert set(CONCURRENT_ORACLES) == {
        "knobs",
        "stale",
        "block_table",
        "engine_error",
        "versions",
        "resolution",
        "resumed_state",
        "cap",
        "keys",
        "draft_keys",
        "outputs",
    }
    assert set(NOT_BY_COUNTERS) == {"knobs", "engine_error", "resolution", "resumed_state", *SAME_HITS_ORACLES}
    assert VARIANT_ORACLES == ("sparse_dense", "spec_on_off", "junction")


def test_each_oracle_is_named_once_and_its_flags_agree():
    names = [o.name for o in REGISTRY]
    assert len(names) == len(set(names)) and tuple(names) == KNOWN_ORACLES
    for o in REGISTRY:
        assert o.judges and "\n" not in o.judges, o.name
        assert not (o.same_hits and o.counters), o.name  # a live server sees only hits
        assert not (o.variant and o.second_engine), o.name
        assert not (o.hit and o.same_hits), o.name


def test_every_oracle_a_module_can_produce_is_registered_and_every_registered_one_is_produced():
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "fuzz").rglob("oracle*.py")):
        for name in produced(path.read_text()):
            found.setdefault(name, []).append(path.name)
    assert set(found) == set(KNOWN_ORACLES), found
    # the dispatch runs each registered oracle through one path or another
    dispatched = (
        {n for n, _check in SINGLE_RUN_CHECKS} | set(VARIANT_ORACLES) | {"engine_error", "versions", "resolution"}
    )
    assert dispatched == set(KNOWN_ORACLES)


def test_the_producer_scan_sees_a_planted_oracle():
    text = 'return [Divergence("planted", version, [], [], [])]\nreturn same_hits("other", version, hits, {}, str)'
    assert produced(text) == {"planted", "other"}
    assert not produced(text) <= set(KNOWN_ORACLES)


def test_fuzz_help_names_every_oracle_on_its_own_line():
    parser = argparse.ArgumentParser(prog="kvspec fuzz")
    fuzz_command.configure(parser)
    text = parser.format_help()
    listed = set(re.findall(r"^  (\w+) +[*b]*v?2? ", text, re.M))
    assert listed >= set(KNOWN_ORACLES), set(KNOWN_ORACLES) - listed
    assert registry.build_sentence() in " ".join(text.split())


def judged(text: str) -> list[str]:
    """The oracles a help text's "judged by the A, B and C oracles" names."""
    part = " ".join(text.split())
    part = part[part.index("judged by the ") + len("judged by the ") :]
    return re.split(r", | and ", part[: part.index(" oracles")])


def test_the_build_texts_name_the_build_oracles():
    """--patch's note (a campaign's default oracles) and check-build's
    epilog (every oracle of one engine) name the build oracles."""
    assert judged(NOTE) == [o.name for o in REGISTRY if o.default and o.build]
    assert judged(check_build.EPILOG) == [o.name for o in REGISTRY if o.build and not o.second_engine]
    assert judged(registry.build_sentence()) == judged(NOTE)
    assert judged("is judged by the promise and stale oracles") == ["promise", "stale"]


def test_the_docs_table_is_in_sync_with_the_registry():
    text = registry.DOCS.read_text()
    assert registry.BEGIN in text and registry.END in text
    assert registry.with_table(text) == text, (
        "docs/judge.md's oracle table is stale: python -m fuzz.judge.oracle_registry --write-docs"
    )
    for name in KNOWN_ORACLES:
        assert f"| `{name}` |" in text, name


def test_write_docs_rewrites_a_stale_table_and_check_docs_sees_it(tmp_path, monkeypatch):
    docs = tmp_path / "docs" / "judge.md"
    docs.parent.mkdir()
    stale = f"# t\n\n{registry.BEGIN}\n| `promise` | old |\n{registry.END}\n\nafter\n"
    docs.write_text(stale)
    monkeypatch.setattr(registry, "DOCS", docs)
    assert registry.main(["--check-docs"]) == 1
    assert registry.main(["--write-docs"]) == 0
    assert registry.main(["--check-docs"]) == 0
    text = docs.read_text()
    assert text.startswith("# t\n\n") and text.endswith(f"{registry.END}\n\nafter\n") and registry.docs_table() in text


def test_a_docs_file_without_the_markers_is_refused():
    with pytest.raises(ValueError, match="markers"):
        registry.with_table("# no table here\n")
