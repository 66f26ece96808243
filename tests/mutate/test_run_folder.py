"""A mutate run folder is resumed only by the judge that started it
(``mutate.run.claim_folder``): plain files, no engine."""

from __future__ import annotations

import pytest

from mutate import run as runmod


def test_a_run_folder_resumes_only_under_the_judge_that_started_it(tmp_path):
    from ground.errors import InvalidArgument

    ident = {
        "kvspec_sources_sha256": runmod.sources_sha256(),
        "release": "0.33.0",
        "base": "vllm==0.33.0+x.1",
        "budget_s": 30.0,
        "seed": 1,
    }
    runmod.claim_folder(tmp_path, ident)
    runmod.claim_folder(tmp_path, ident)  # the same judge resumes
    with pytest.raises(
        InvalidArgument, match=r"^--out=.*judged with other kvspec_sources_sha256; allowed: a fresh folder"
    ):
        runmod.claim_folder(tmp_path, {**ident, "kvspec_sources_sha256": "0" * 64})
    with pytest.raises(InvalidArgument, match="other base, budget_s"):
        runmod.claim_folder(tmp_path, {**ident, "base": "vllm==0.33.0", "budget_s": 5.0})
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "control.json").write_text('{"killed": true}')
    with pytest.raises(InvalidArgument, match="no record of what judged it"):
        runmod.claim_folder(legacy, ident)
    # the judging sources' digest moves with any of their files
    root = tmp_path / "tree"
    for pkg in runmod.JUDGING_PACKAGES:
        (root / pkg).mkdir(parents=True)
        (root / pkg / "a.py").write_text("x = 1\n")
    before = runmod.sources_sha256(root)
    (root / "fuzz" / "a.py").write_text("x = 2\n")
    assert runmod.sources_sha256(root) != before
