"""Builds of a release (engine_adapter.host.builds): the strict patch applier,
names, one-line errors, and (engine) a patched environment that shares the
release's files by hard links without touching the ones it replaces."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from engine_adapter.host import builds, environments, patches
from engine_adapter.host.versions import is_build, parse_engine, release_of
from ground.errors import InvalidArgument
from ground.home import REPO_ROOT

FIXES = REPO_ROOT / "fixes"
LONGER_SIBLING = FIXES / "vllm-0.33.0-longer-sibling-of-aligned-prompt.diff"
STALE_STATE = FIXES / "vllm-0.33.0-stale-state-after-partial-hit.diff"

SOURCE = "".join(f"line {i}\n" for i in range(1, 21))


def _apply(diff: str, source: str = SOURCE, path: str = "vllm/x.py") -> str:
    (fp,) = patches.parse_patch(diff, "--patch='t.diff'")
    assert fp.path == path
    return "".join(patches.apply_hunks(patches.split_lines(source), fp, "--patch='t.diff'", "0.33.0"))


# ---------------------------------------------------------------- the applier (no engine)


def test_a_hunk_applies_where_its_context_is_even_when_the_line_numbers_moved():
    diff = "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -4,3 +4,3 @@\n line 9\n-line 10\n+line ten\n line 11\n"
    out = _apply(diff)
    assert "line ten\n" in out and "line 10\n" not in out
    assert out.count("\n") == 20


def test_two_hunks_and_a_git_header_and_no_newline_at_end():
    diff = (
        "diff --git a/vllm/x.py b/vllm/x.py\nindex 1..2 100644\n"
        "--- a/vllm/x.py\n+++ b/vllm/x.py\n"
        "@@ -1,2 +1,3 @@\n line 1\n+inserted\n line 2\n"
        "@@ -19,2 +20,2 @@\n line 19\n-line 20\n+last\n\\ No newline at end of file\n"
    )
    out = _apply(diff)
    assert out.startswith("line 1\ninserted\nline 2\n")
    assert out.endswith("line 19\nlast")


def test_an_empty_context_line_without_its_space_and_no_newline_after_a_context_line():
    source = "a\n\nb\nc"
    diff = "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,4 +1,4 @@\n-a\n+A\n\n b\n c\n\\ No newline at end of file\n"
    assert _apply(diff, source) == "A\n\nb\nc"
    diff = "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -3,2 +3,2 @@\n b\n-c\n\\ No newline at end of file\n+C\n"
    assert _apply(diff, source) == "a\n\nb\nC\n"


def test_a_hunk_whose_context_is_not_there_is_one_line_naming_the_file_and_hunk():
    diff = "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,2 +1,2 @@\n line 1\n-line 2\n+two\n@@ -5,2 +5,2 @@\n line 5\n-line 99\n+x\n"
    with pytest.raises(InvalidArgument) as e:
        _apply(diff)
    msg = str(e.value)
    assert msg.startswith(
        "--patch='t.diff': hunk 2 of vllm/x.py (@@ -5,2 +5,2 @@) does not apply to vLLM 0.33.0: its context and removed lines are not in the file"
    )
    assert "\n" not in msg


@pytest.mark.parametrize(
    "diff, needle",
    [
        (
            "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,3 +1,3 @@\n line 1\n-line 2\n",
            "hunk 1 of vllm/x.py (@@ -1,3 +1,3 @@) is cut short",
        ),
        ("--- a/setup.py\n+++ b/setup.py\n@@ -1 +1 @@\n-a\n+b\n", "path 'setup.py' is not a file of vLLM's vllm/ tree"),
        ("--- a/vllm/../x.py\n+++ b/vllm/../x.py\n@@ -1 +1 @@\n-a\n+b\n", "is not a file of vLLM's vllm/ tree"),
        ("@@ -1 +1 @@\n-a\n+b\n", "comes before any '--- a/...' / '+++ b/...' file header"),
    ],
)
def test_malformed_patches_are_one_line(diff, needle):
    with pytest.raises(InvalidArgument) as e:
        patches.parse_patch(diff, "--patch='t.diff'")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_build_names_are_local_versions_of_a_release():
    assert parse_engine("vllm==0.33.0+longer-sibling.1a2b3c") == "0.33.0+longer-sibling.1a2b3c"
    assert release_of("0.33.0+longer-sibling.1a2b3c") == "0.33.0" and is_build("0.33.0+x.1") and not is_build("0.33.0")
    assert builds.patch_label(LONGER_SIBLING, "0.33.0") == "longer-sibling"
    assert builds.patch_label("x/undo-54713.diff", "0.33.0") == "undo-54713"
    from ground.errors import Unsupported

    with pytest.raises(Unsupported, match="vLLM 0.31.0 has no kvspec engine environment"):
        parse_engine("vllm==0.31.0+fix.abcdef")
    # the reference model judges a build by its release's rule
    from reference.knobs import implemented_rule, parse_version

    assert parse_version("vllm==0.33.0+fix.abcdef") == "0.33.0" and implemented_rule("0.29.0+x.1") == "legacy"
    from fuzz.judge.oracles import oracles_for

    assert "reference" not in oracles_for("0.33.0+fix.abcdef") and "knobs" not in oracles_for("0.33.0+fix.abcdef")
    assert "reference" in oracles_for("0.33.0")


def test_patch_options_attach_to_the_engine_before_them():
    from kvspec.cli import build_parser

    args = build_parser().parse_args(
        ["fuzz", "--engine", "vllm==0.33.0", "--patch", "a.diff", "--patch", "b.diff", "--engine", "vllm==0.33.0"]
    )
    assert args.engine == ["vllm==0.33.0", "vllm==0.33.0"] and args.engine_patches == {0: ["a.diff", "b.diff"]}
    args = build_parser().parse_args(["run", "case.json", "--patch", "a.diff"])
    assert args.engine is None and args.engine_patches == {0: ["a.diff"]}
    args = build_parser().parse_args(
        ["report", "f.json", "--matrix", "vllm==0.33.0", "--matrix", "vllm==0.33.0", "--patch", "a.diff"]
    )
    assert args.matrix_patches == {1: ["a.diff"]}


def test_removing_a_build_removes_only_its_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSPEC_HOME", str(tmp_path))
    fake = tmp_path / "engines" / "vllm-0.33.0+fake.abcdef"
    (fake / "bin").mkdir(parents=True)
    (tmp_path / "engines" / "vllm-0.33.0").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "kvspec.cli", "engines", "remove", "vllm==0.33.0+fake.abcdef"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
        env=dict(os.environ, KVSPEC_HOME=str(tmp_path)),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "vllm==0.33.0+fake.abcdef: removed"
    assert not fake.exists() and (tmp_path / "engines" / "vllm-0.33.0").is_dir()


# ---------------------------------------------------------------- builds (engine)


@pytest.fixture(scope="module")
def release_033():
    from tests.engine.conftest import ensure_env

    ensure_env("0.33.0")
    return builds.site_packages(environments.env_dir("0.33.0"))


@pytest.mark.engine
def test_a_patch_that_does_not_apply_is_one_line_naming_the_file_and_hunk(release_033, tmp_path):
    bad = tmp_path / "bad.diff"
    bad.write_text(
        LONGER_SIBLING.read_text().replace("return (num_prompt_tokens - 1,)", "return (num_prompt_tokens - 2,)")
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvspec.cli",
            "run",
            "examples/r2-block-aligned-extension-qwen3_next.json",
            "--engine",
            "vllm==0.33.0",
            "--patch",
            str(bad),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert line.startswith(
        f"kvspec: --patch='{bad}': hunk 1 of vllm/v1/core/kv_cache_coordinator.py (@@ -79,7 +79,9 @@) does not apply to vLLM 0.33.0: its context and removed lines are not in the file"
    ), line
    assert not any(
        p.name.startswith("vllm-0.33.0+") and "bad" in p.name for p in environments.env_dir("0.33.0").parent.iterdir()
    )


@pytest.mark.engine
def test_a_patched_build_shares_the_release_files_by_hard_links_and_replaces_only_its_own(release_033):
    overlay = builds.overlay_from_patches("0.33.0", [LONGER_SIBLING])
    assert list(overlay.files) == ["vllm/v1/core/kv_cache_coordinator.py"]
    rel = "vllm/v1/core/kv_cache_coordinator.py"
    before = hashlib.sha256((release_033 / rel).read_bytes()).hexdigest()
    builds.build(overlay)
    version = overlay.version
    assert version.startswith("0.33.0+longer-sibling.") and len(version.rsplit(".", 1)[1]) == builds.HASH_DIGITS
    assert environments.is_ready(version)
    sp = builds.site_packages(environments.env_dir(version))
    patched, original = os.stat(sp / rel), os.stat(release_033 / rel)
    assert patched.st_ino != original.st_ino  # a file of its own
    assert hashlib.sha256((release_033 / rel).read_bytes()).hexdigest() == before  # the release's is untouched
    assert "return (num_prompt_tokens - 1,)\n" in (release_033 / rel).read_text()
    assert (sp / rel).read_bytes() == overlay.files[rel]
    for other in ("vllm/v1/core/block_pool.py", "vllm/v1/core/sched/scheduler.py", "vllm/__init__.py"):
        a, b = os.stat(sp / other), os.stat(release_033 / other)
        assert a.st_ino == b.st_ino and a.st_nlink >= 2, other  # shared, not copied
    marker = environments.read_marker(version)
    assert marker["engine"] == f"vllm=={version}" and marker["build"]["release"] == "0.33.0"
    assert marker["build"]["files"] == {rel: hashlib.sha256(overlay.files[rel]).hexdigest()}
    assert marker["build"]["sources"][0]["sha256"] == hashlib.sha256(LONGER_SIBLING.read_bytes()).hexdigest()
    assert not (environments.env_dir("0.33.0") / ".kvspec-ready.json").samefile(
        environments.env_dir(version) / ".kvspec-ready.json"
    )
    # listed, and found again by name (the same content, the same build)
    proc = subprocess.run(
        [sys.executable, "-m", "kvspec.cli", "engines", "list", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    rows = {r["engine"]: r for r in json.loads(proc.stdout)}
    assert rows[f"vllm=={version}"]["state"] == "ready" and rows[f"vllm=={version}"]["base"] == "vllm==0.33.0"
    assert builds.overlay_from_patches("0.33.0", [LONGER_SIBLING]).version == version
    assert builds.prepare("vllm==0.33.0", [str(LONGER_SIBLING)]) == f"vllm=={version}"
