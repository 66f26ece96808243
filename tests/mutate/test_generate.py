"""Mutants: Cosmic Ray's mutations inside the target functions, as diffs
the builds machinery applies (no engine run; the release's source is read)."""

from __future__ import annotations

import pytest

from ground.errors import InvalidArgument
from mutate.generate import materialize, operator_names, positions, select
from mutate.targets import AREAS, release_vllm_root, spans

pytestmark = pytest.mark.engine  # reads vllm==0.33.0's installed source


@pytest.fixture(scope="module")
def root():
    from tests.engine.conftest import ensure_env

    ensure_env("0.33.0")
    return release_vllm_root("0.33.0")


@pytest.fixture(scope="module")
def cands(root):
    return positions(root)


def test_every_target_is_found_and_every_area_has_positions(root, cands):
    names = {s.function for s in spans(root)}
    assert {
        "replay_boundaries",
        "HybridKVCacheCoordinator.find_longest_cache_hit",
        "Scheduler._mamba_block_aligned_split",
        "resolve_kv_cache_block_sizes",
        "get_mamba_prefill_checkpoint_position",
        "MambaManager.cache_blocks",
    } <= names
    assert {c["area"] for c in cands} == set(AREAS)
    assert len({c["id"] for c in cands}) == len(cands)
    assert all(name.startswith("core/") for name in operator_names())


def test_selection_is_seeded_round_robin_and_every_diff_applies_inside_its_function(root, cands):
    picked = select(root, cands, n=len(AREAS), seed=3)
    assert [m["area"] for m in picked] == list(AREAS)
    assert [m["id"] for m in select(root, cands, n=len(AREAS), seed=3)] == [m["id"] for m in picked]
    by_fn = {s.function: s for s in spans(root)}
    for m in picked:
        s = by_fn[m["function"]]
        assert s.body_start <= m["line"] <= s.end
        assert m["before"] != m["after"]
        assert m["diff"].startswith(f"--- a/vllm/{m['file']}\n+++ b/vllm/{m['file']}\n")


def test_a_diff_is_what_the_builds_applier_takes(root, cands, tmp_path):
    from engine_adapter.host.builds import overlay_from_patches

    m = select(root, cands, only=["replay-82bcea0f"])[0]
    assert (m["before"], m["after"]) == (
        "resend = (num_prompt_tokens - 1) // block * block",
        "resend = (num_prompt_tokens - 1) // block // block",
    )
    path = tmp_path / "m.diff"
    path.write_text(m["diff"])
    overlay = overlay_from_patches("0.33.0", [str(path)])
    assert list(overlay.files) == ["vllm/v1/core/kv_cache_coordinator.py"]
    assert b"// block // block" in overlay.files["vllm/v1/core/kv_cache_coordinator.py"]


def test_an_unknown_id_is_one_line(root, cands):
    with pytest.raises(InvalidArgument, match=r"^--only=.*not a valid mutant"):
        select(root, cands, only=["replay-00000000"])
    assert materialize(root, {**cands[0], "line": 1}) is None  # outside every target
