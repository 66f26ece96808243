"""Hostile builds (issue 29): patches, source trees and wheels from strangers
stay bounded and inside the build folder.

A generated corpus, each probe bounded by its own ``timeout``: symlinks out
of a ``path:`` tree, a 0600 source file, a FIFO named ``x.py``, patches with
NUL / CR in a file name, ``/dev/null`` on both sides, malformed hunk
headers, a 5 MB patch pair, zip bombs built here with :mod:`zipfile` (small
on disk, large inflated), ``../`` and absolute names. Each is refused in one
line (exit 2 from the CLI) or read correctly, and nothing is written outside
the build folder.

No engine is needed: ``release_double`` is a test double of a release's
site-packages (a few files of ``vllm/``) that stands in for
``builds._release_env``; ``build()`` runs with doubles of the self-test and
the release's fingerprint. The engine test at the end reads the real
``_version.py`` of vLLM 0.33.0.
"""

from __future__ import annotations

import os
import re
import stat
import struct
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path

import pytest

from engine_adapter.host import builds, environments, patches, source_files
from ground.errors import InvalidArgument
from ground.home import REPO_ROOT

SOURCE = "".join(f"line {i}\n" for i in range(1, 21))


def _files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def release_double(tmp_path, monkeypatch):
    """A stand-in for release 0.33.0's site-packages, put where
    ``builds._release_env`` looks (no engine environment needed)."""
    monkeypatch.setenv("KVSPEC_HOME", str(tmp_path / "home"))
    sp = tmp_path / "home" / "engines" / "vllm-0.33.0" / "lib" / "python3.11" / "site-packages"
    (sp / "vllm" / "v1").mkdir(parents=True)
    (sp / "vllm" / "__init__.py").write_text("")
    (sp / "vllm" / "x.py").write_text(SOURCE)
    (sp / "vllm" / "v1" / "y.py").write_text("a = 1\n")
    monkeypatch.setattr(builds, "_release_env", lambda release: sp)
    return sp


def _one_line(e: pytest.ExceptionInfo, *needles: str) -> str:
    msg = str(e.value)
    assert "\n" not in msg and "\r" not in msg and "\x00" not in msg, repr(msg)
    for needle in needles:
        assert needle in msg, msg
    return msg


def _cli(args: list[str], home: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvspec.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=timeout,
        env=dict(os.environ, KVSPEC_HOME=str(home)),
    )


def _assert_refused(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("kvspec: ") and "Traceback" not in line, line
    for needle in needles:
        assert needle in line, line
    return line


# ---------------------------------------------------------------- path:DIR


def _tree(root: Path, version: str | None = "0.33.0") -> Path:
    pkg = root / "vllm"
    (pkg / "v1").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "x.py").write_text(SOURCE.replace("line 3\n", "line three\n"))
    if version:
        (pkg / "_version.py").write_text(
            f"__version__ = version = '{version}'\n__version_tuple__ = version_tuple = (0, 33, 0)\n"
        )
    return pkg


@pytest.mark.timeout(30)
@pytest.mark.parametrize("where", ["file", "folder", "package", "version_file"])
def test_a_symlink_out_of_the_tree_is_refused_in_one_line_naming_it(tmp_path, release_double, where):
    secret = tmp_path / "outside"
    (secret / "pkg").mkdir(parents=True)
    (secret / "secret.py").write_text("TOKEN = 'do-not-copy'\n")
    (secret / "secret.py").chmod(0o600)
    (secret / "pkg" / "__init__.py").write_text("TOKEN = 'do-not-copy'\n")
    root = tmp_path / "src"
    if where == "package":
        real = secret / "vllm"
        _tree(secret)
        root.mkdir()
        (root / "vllm").symlink_to(real)
        link = root / "vllm"
    else:
        pkg = _tree(root)
        link = {"file": pkg / "v1" / "leak.py", "folder": pkg / "v1" / "leak", "version_file": pkg / "_version.py"}[
            where
        ]
        if where == "version_file":
            link.unlink()
        link.symlink_to({"folder": secret / "pkg"}.get(where, secret / "secret.py"))
    with pytest.raises(InvalidArgument) as e:
        builds.overlay_from_tree(str(root))
    msg = _one_line(e, f"{str(link)!r} is a symlink to ", "outside", "allowed: files and folders inside the tree")
    assert "do-not-copy" not in msg
    assert not (tmp_path / "home" / "engines" / "vllm-0.33.0+local").exists()


@pytest.mark.timeout(30)
def test_symlinks_inside_the_tree_are_read_at_their_target_once(tmp_path, release_double):
    pkg = _tree(tmp_path / "src")
    (pkg / "v1" / "y.py").symlink_to(pkg / "x.py")  # a file link inside
    (pkg / "v1" / "again").symlink_to(pkg)  # a folder link inside (a cycle): not walked
    overlay = builds.overlay_from_tree(str(tmp_path / "src"))
    assert sorted(overlay.files) == ["vllm/_version.py", "vllm/v1/y.py", "vllm/x.py"]
    assert overlay.files["vllm/v1/y.py"] == overlay.files["vllm/x.py"] == (pkg / "x.py").read_bytes()


@pytest.mark.timeout(30)
def test_a_fifo_or_a_deep_tree_is_refused_without_blocking(tmp_path, release_double):
    pkg = _tree(tmp_path / "src")
    os.mkfifo(pkg / "v1" / "pipe.py")
    with pytest.raises(InvalidArgument) as e:
        builds.overlay_from_tree(str(tmp_path / "src"))
    _one_line(e, "pipe.py", "is not a regular file")
    (pkg / "v1" / "pipe.py").unlink()
    deep = pkg
    for _ in range(source_files.MAX_TREE_DEPTH + 2):
        deep = deep / "d"
    deep.mkdir(parents=True)
    with pytest.raises(InvalidArgument) as e:
        builds.overlay_from_tree(str(tmp_path / "src"))
    _one_line(e, f"folders below vllm/; allowed: at most {source_files.MAX_TREE_DEPTH}")


@pytest.mark.timeout(30)
def test_a_tree_with_too_many_entries_is_refused(tmp_path, release_double, monkeypatch):
    pkg = _tree(tmp_path / "src")
    monkeypatch.setattr(source_files, "MAX_TREE_ENTRIES", 50)
    for i in range(60):
        (pkg / "v1" / f"m{i}.txt").write_text("")
    with pytest.raises(InvalidArgument) as e:
        builds.overlay_from_tree(str(tmp_path / "src"))
    _one_line(e, "has more than 50 entries under vllm/")


@pytest.mark.timeout(30)
def test_the_version_is_read_from_vllm_s_own_version_file_as_text(tmp_path, release_double):
    # setuptools-scm's (vcs-versioning's) file as vLLM 0.32.0 and 0.33.0 ship it
    scm = (
        'from __future__ import annotations\n\n__all__ = ["__version__", "version"]\n\nversion: str\n__version__: str\n'
        "__version_tuple__: tuple[int | str, ...]\n\n__version__ = version = '0.33.0'\n__version_tuple__ = version_tuple = (0, 33, 0)\n\n__commit_id__ = commit_id = 'g5df63a720'\n"
    )
    assert source_files.version_in(scm) == "0.33.0"
    assert source_files.version_in('__version__ = "0.33.0.dev3+gabc"\n') == "0.33.0.dev3+gabc"
    assert source_files.version_in("version: str = '0.32.0'\n") == "0.32.0"
    assert source_files.version_in("x = 1\n") is None
    pkg = _tree(tmp_path / "src", version=None)
    marker = tmp_path / "ran"
    (pkg / "_version.py").write_text(
        scm.replace("from __future__ import annotations\n", f"open({str(marker)!r}, 'w').close()\n")
    )
    overlay = builds.overlay_from_tree(str(tmp_path / "src"))  # no --base: the tree's own version
    assert overlay.release == "0.33.0" and overlay.version.startswith("0.33.0+local.")
    assert not marker.exists()  # read, never run
    (pkg / "_version.py").write_text("__version__ = version = '0.31.0'\n")
    with pytest.raises(InvalidArgument) as e:
        builds.overlay_from_tree(str(tmp_path / "src"))
    _one_line(e, "vLLM '0.31.0' is based on no release kvspec has an environment for; allowed: --base vllm==X")
    (pkg / "_version.py").write_text("__version__ = '0.33.0\x1b[2J'\n")  # not a version: never shown raw
    with pytest.raises(InvalidArgument) as e:
        builds.overlay_from_tree(str(tmp_path / "src"))
    assert "\x1b" not in _one_line(e, "its vLLM release is unknown (version None)")


@pytest.mark.timeout(60)
def test_a_0600_source_file_is_written_0600_in_the_build_and_nothing_lands_outside_it(
    tmp_path, release_double, monkeypatch
):
    pkg = _tree(tmp_path / "src")
    (pkg / "x.py").chmod(0o600)
    (pkg / "v1" / "new.py").write_text("b = 2\n")
    (pkg / "v1" / "new.py").chmod(0o640)
    overlay = builds.overlay_from_tree(str(tmp_path / "src"))
    assert overlay.modes["vllm/x.py"] == 0o600
    env = release_double.parents[2]
    (env / "bin").mkdir()
    (env / "bin" / "python").write_text("")
    monkeypatch.setattr(
        environments, "_selftest", lambda version, import_only=False: {"double": True}
    )  # a test double: no vLLM here
    monkeypatch.setattr(environments, "fingerprint", lambda release: "double")
    before = _files(tmp_path)
    builds.build(overlay, progress=lambda line: None)
    sp = builds.site_packages(environments.env_dir(overlay.version))
    assert (sp / "vllm" / "x.py").read_bytes() == (pkg / "x.py").read_bytes()
    assert stat.S_IMODE(os.stat(sp / "vllm" / "x.py").st_mode) == 0o600  # was 0644 (the release's file mode)
    assert stat.S_IMODE(os.stat(sp / "vllm" / "v1" / "new.py").st_mode) == 0o640  # a new file: 0644 & the source's
    assert (
        stat.S_IMODE(os.stat(release_double / "vllm" / "x.py").st_mode) != 0o600
        and (release_double / "vllm" / "x.py").read_text() == SOURCE
    )
    after = _files(tmp_path)
    build_dir = environments.env_dir(overlay.version).relative_to(tmp_path).as_posix()
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert changed and all(
        k.startswith(build_dir) or k.startswith("home/engines/.") or k.endswith(".lock") for k in changed
    ), sorted(changed)[:10]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("spec", ["path:/src/vl\x00lm", "wheel:/tmp/vllm-0.33.0\r-x.whl", "path:/src/\x1b[2Jvllm"])
def test_an_engine_path_with_a_control_character_is_one_line(spec):
    with pytest.raises(InvalidArgument) as e:
        builds.prepare(spec, progress=lambda line: None)
    _one_line(e, f"--engine={spec!r}: ", "names a path with a control character")


@pytest.mark.timeout(60)
def test_the_cli_refuses_a_tree_with_a_link_out_in_one_line(tmp_path):
    pkg = _tree(tmp_path / "src")
    (tmp_path / "secret").write_text("x")
    (pkg / "leak.py").symlink_to(tmp_path / "secret")
    proc = _cli(["check-build", "--engine", f"path:{tmp_path / 'src'}"], tmp_path / "home")
    _assert_refused(
        proc, f"kvspec: --engine='path:{tmp_path / 'src'}': '{pkg / 'leak.py'}' is a symlink to '{tmp_path / 'secret'}'"
    )


# ---------------------------------------------------------------- patches


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


HEADER_PROBES = [
    (
        "--- a/vllm/x\x00.py\n+++ b/vllm/x\x00.py\n@@ -1 +1 @@\n-line 1\n+one\n",
        "line 1: path 'vllm/x\\x00.py' holds a control character",
    ),
    (
        "--- a/vllm/x.py\n+++ b/vllm/x\r.py\n@@ -1 +1 @@\n-line 1\n+one\n",
        "line 2: path 'vllm/x\\r.py' holds a control character",
    ),
    ("prose\n--- /dev/null\n+++ /dev/null\n@@ -0,0 +1 @@\n+x\n", "line 2: both sides of the file header are /dev/null"),
    (
        "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1 +1 @@\n-line 1\n+one\n@@ -99999999999 +1 @@\n-a\n+b\n",
        "line 6: '@@ -99999999999 +1 @@' is not a hunk header",
    ),
    ("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1" + "0" * 5000 + " +1 @@\n-a\n+b\n", "line 3: "),
    ("--- a/vllm/..\\x.py\n+++ b/vllm/..\\x.py\n@@ -1 +1 @@\n-a\n+b\n", "or a backslash"),
    (
        "--- a/../../etc/passwd\n+++ b/../../etc/passwd\n@@ -1 +1 @@\n-a\n+b\n",
        "line 1: path '../../etc/passwd' is not a file of vLLM's vllm/ tree",
    ),
    ("--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-a\n+b\n", "is not a file of vLLM's vllm/ tree"),
    ("--- a/vllm/" + "d/" * 600 + "x.py\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n", "is longer than 1024 characters"),
    (
        "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,2 +1,2 @@\n line 1\n-line 2\n",
        "line 3: hunk 1 of vllm/x.py (@@ -1,2 +1,2 @@) is cut short",
    ),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("diff, needle", HEADER_PROBES)
def test_malformed_patches_are_one_line_naming_the_patch_and_the_line(tmp_path, release_double, diff, needle):
    patch = _write(tmp_path, "bad.diff", diff)
    with pytest.raises(InvalidArgument) as e:
        builds.overlay_from_patches("0.33.0", [patch])
    msg = _one_line(e, f"--patch={str(patch)!r}: ", needle)
    assert len(msg) < 600


@pytest.mark.timeout(60)
def test_the_cli_refuses_bad_patches_in_one_line_before_it_needs_an_engine(tmp_path):
    home = tmp_path / "home"  # no engine environment at all
    nul = _write(tmp_path, "nul.diff", HEADER_PROBES[0][0])
    _assert_refused(
        _cli(["check-build", "--engine", "vllm==0.33.0", "--patch", str(nul)], home),
        f"kvspec: --patch={str(nul)!r}: line 1: path 'vllm/x\\x00.py'",
    )
    both = _write(tmp_path, "both.diff", HEADER_PROBES[2][0])
    _assert_refused(
        _cli(["check-build", "--engine", "vllm==0.33.0", "--patch", str(both)], home),
        "line 2: both sides of the file header are /dev/null",
    )
    big = _write(tmp_path, "big.diff", b"#" * (patches.MAX_PATCH_BYTES + 1))
    _assert_refused(
        _cli(["check-build", "--engine", "vllm==0.33.0", "--patch", str(big)], home),
        f"is larger than {patches.MAX_PATCH_BYTES} bytes",
    )
    _assert_refused(
        _cli(["check-build", "--engine", "vllm==0.33.0", "--patch", str(big), "--against", "vllm==0.33.0;rm"], home),
        "kvspec: --against='vllm==0.33.0;rm'",
    )
    assert not (home / "engines").exists() or not any(
        p.name.startswith("vllm-0.33.0+") for p in (home / "engines").iterdir()
    )


@pytest.mark.timeout(30)
def test_patch_bytes_and_counts_are_bounded_before_anything_is_applied(tmp_path, release_double, monkeypatch):
    half = _write(tmp_path, "half.diff", b"#" * (patches.MAX_PATCH_BYTES // 2 + 1))
    with pytest.raises(InvalidArgument) as e:
        builds.overlay_from_patches("0.33.0", [half, half])
    _one_line(e, f"the patches hold more than {patches.MAX_PATCH_BYTES} bytes together")
    with pytest.raises(InvalidArgument) as e:
        builds.overlay_from_patches("0.33.0", [half] * (patches.MAX_PATCHES + 1))
    _one_line(e, f"allowed: at most {patches.MAX_PATCHES}")
    lines = _write(tmp_path, "lines.diff", "\n" * (patches.MAX_PATCH_LINES + 1))
    with pytest.raises(InvalidArgument) as e:
        builds.overlay_from_patches("0.33.0", [lines])
    _one_line(e, f"the patches hold more than {patches.MAX_PATCH_LINES} lines together")
    monkeypatch.setattr(
        builds, "_release_env", lambda release: pytest.fail("the release is read before the bounds are checked")
    )
    many = "--- a/vllm/x.py\n+++ b/vllm/x.py\n" + "@@ -1 +1 @@\n-line 1\n+one\n" * 30
    monkeypatch.setattr(patches, "MAX_HUNKS", 20)
    with pytest.raises(InvalidArgument) as e:
        builds.overlay_from_patches("0.33.0", [_write(tmp_path, "a.diff", many)])
    _one_line(e, "line 63: more than 20 hunks in the build's patches")
    monkeypatch.setattr(patches, "MAX_FILE_PATCHES", 3)
    files = "".join(f"--- a/vllm/f{i}.py\n+++ b/vllm/f{i}.py\n@@ -1 +1 @@\n-a\n+b\n" for i in range(4))
    with pytest.raises(InvalidArgument) as e:
        builds.overlay_from_patches("0.33.0", [_write(tmp_path, "b.diff", files)])
    _one_line(e, "line 16: more than 3 file patches")


@pytest.mark.timeout(30)
def test_patches_never_touch_a_folder_or_a_binary_file_of_the_release(tmp_path, release_double):
    (release_double / "vllm" / "_C.so").write_bytes(b"\x7fELF\xff\xfe")
    probes = [
        ("--- /dev/null\n+++ b/vllm/v1\n@@ -0,0 +1 @@\n+x\n", "vllm/v1 is a folder in vLLM 0.33.0"),
        ("--- /dev/null\n+++ b/vllm/x.py/z.py\n@@ -0,0 +1 @@\n+x\n", "vllm/x.py/z.py lies below vllm/x.py, a file"),
        ("--- a/vllm/_C.so\n+++ b/vllm/_C.so\n@@ -1 +1 @@\n-a\n+b\n", "vllm/_C.so is not UTF-8 text in vLLM 0.33.0"),
    ]
    for diff, needle in probes:
        with pytest.raises(InvalidArgument) as e:
            builds.overlay_from_patches("0.33.0", [_write(tmp_path, "p.diff", diff)])
        _one_line(e, needle)


def _pair(tmp_path: Path, n: int = 300_000, step: int = 5, shift: int = 0) -> tuple[Path, Path, list[str]]:
    """A patch that creates a file of ``n`` lines (about 5 MB) and one that
    changes every ``step``-th line of it (about 6 MB of hunks), its line
    numbers off by ``shift``; and the lines expected after both."""
    lines = [f"v{i:07d} = {i}\n" for i in range(n)]
    a = "--- /dev/null\n+++ b/vllm/big.py\n@@ -0,0 +1,%d @@\n" % n + "".join("+" + t for t in lines)
    hunks, want = [], list(lines)
    for k in range(1, n - 2, step):
        hunks.append(
            f"@@ -{k + shift},3 +{k + shift},3 @@\n {lines[k - 1]}-{lines[k]}+{lines[k][:-1]}  # changed\n {lines[k + 1]}"
        )
        want[k] = lines[k][:-1] + "  # changed\n"
    return (
        _write(tmp_path, "a.diff", a),
        _write(tmp_path, "b.diff", "--- a/vllm/big.py\n+++ b/vllm/big.py\n" + "".join(hunks)),
        want,
    )


@pytest.mark.timeout(20)
def test_two_5mb_patches_apply_in_seconds(tmp_path, release_double):
    a, b, want = _pair(tmp_path)
    assert a.stat().st_size > 4_800_000 and b.stat().st_size > 4_800_000
    overlay = builds.overlay_from_patches("0.33.0", [a, b])  # was past 60 s (a full scan of the file per hunk)
    assert overlay.files["vllm/big.py"] == "".join(want).encode()


@pytest.mark.timeout(20)
def test_hunks_whose_line_numbers_are_off_are_found_in_linear_time(tmp_path, release_double):
    a, b, want = _pair(tmp_path, n=200_000, shift=40)
    overlay = builds.overlay_from_patches("0.33.0", [a, b])
    assert overlay.files["vllm/big.py"] == "".join(want).encode()


@pytest.mark.timeout(20)
def test_a_hunk_not_in_the_file_is_refused_after_one_scan(tmp_path, release_double):
    n = 200_000
    a = _write(tmp_path, "a.diff", "--- /dev/null\n+++ b/vllm/xy.py\n@@ -0,0 +1,%d @@\n" % n + "+x\n+y\n" * (n // 2))
    # every hunk wants 'x','x', which is nowhere: each would scan the whole file
    b = _write(
        tmp_path, "b.diff", "--- a/vllm/xy.py\n+++ b/vllm/xy.py\n" + "@@ -1,3 +1,3 @@\n x\n-x\n+z\n y\n" * 20_000
    )
    with pytest.raises(InvalidArgument) as e:
        builds.overlay_from_patches("0.33.0", [a, b])
    _one_line(e, "hunk 1 of vllm/xy.py (@@ -1,3 +1,3 @@) does not apply to vLLM 0.33.0")


@pytest.mark.timeout(20)
def test_the_search_for_a_moved_hunk_is_bounded_and_refused_in_one_line(tmp_path, release_double, monkeypatch):
    n = 20_000
    a = _write(
        tmp_path,
        "a.diff",
        "--- /dev/null\n+++ b/vllm/xy.py\n@@ -0,0 +1,%d @@\n" % (n + 2) + "+x\n+y\n" * (n // 2) + "+x\n+x\n",
    )
    # 'x','x' is only at the end; the hunk says line 1: n/2 candidates lie between
    b = _write(tmp_path, "b.diff", "--- a/vllm/xy.py\n+++ b/vllm/xy.py\n@@ -1,2 +1,2 @@\n x\n-x\n+z\n")
    assert (
        builds.overlay_from_patches("0.33.0", [a, b]).files["vllm/xy.py"].endswith(b"y\nx\nz\n")
    )  # within the bound: found
    monkeypatch.setattr(patches, "SEARCH_FACTOR", 0)
    monkeypatch.setattr(patches, "SEARCH_SLACK", 1000)
    with pytest.raises(InvalidArgument) as e:
        builds.overlay_from_patches("0.33.0", [a, b])
    _one_line(
        e,
        f"--patch={str(b)!r}: line 3: hunk 1 of vllm/xy.py (@@ -1,2 +1,2 @@) is far from its line number and was not found",
    )


def test_a_zero_context_insertion_goes_after_the_line_it_names():
    # diff -U0 of inserting X, Y after line 5 (GNU patch puts them there too)
    (fp,) = patches.parse_patch("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -5,0 +6,2 @@\n+X\n+Y\n", "--patch='t.diff'")
    out = "".join(patches.apply_hunks(patches.split_lines(SOURCE), fp, "--patch='t.diff'", "0.33.0"))
    assert out.startswith("line 1\nline 2\nline 3\nline 4\nline 5\nX\nY\nline 6\n")


# ---------------------------------------------------------------- wheels


def _wheel(tmp_path: Path, members: dict[str, bytes], name: str = "vllm-0.33.0-cp38-abi3-linux_x86_64.whl") -> Path:
    path = tmp_path / name
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for member, data in members.items():
            z.writestr(member, data)
    return path


def _streamed_member(z: zipfile.ZipFile, name: str, size: int) -> None:
    info = zipfile.ZipInfo(name)
    info.compress_type = zipfile.ZIP_DEFLATED
    with z.open(info, "w") as f:
        for _ in range(size // 2**20):
            f.write(b"#" * 2**20)


@pytest.mark.timeout(30)
def test_a_wheel_s_python_files_are_read_and_its_names_stay_inside(tmp_path, release_double):
    whl = _wheel(
        tmp_path,
        {
            "vllm/__init__.py": b"",
            "vllm/x.py": SOURCE.replace("line 2", "two").encode(),
            "vllm/lib.so": b"\x7fELF",
            "vllm-0.33.0.dist-info/METADATA": b"",
        },
    )
    overlay = builds.overlay_from_wheel(str(whl))
    assert overlay.release == "0.33.0" and list(overlay.files) == ["vllm/x.py"]
    for bad, needle in [
        ("vllm/../../evil.py", "path 'vllm/../../evil.py' is not a file of vLLM's vllm/ tree"),
        ("vllm/x\r.py", "holds a control character"),
        ("vllm/v1/..\\..\\evil.py", "or a backslash"),
    ]:
        whl = _wheel(tmp_path, {"vllm/__init__.py": b"", bad: b"x = 1\n"})
        with pytest.raises(InvalidArgument) as e:
            builds.overlay_from_wheel(str(whl))
        _one_line(e, f"--engine='wheel:{whl}': member: ", needle)
    # names outside vllm/ are never read (and nothing is ever extracted)
    whl = _wheel(tmp_path, {"vllm/__init__.py": b"", "/etc/evil.py": b"x", "../evil.py": b"x"})
    assert builds.overlay_from_wheel(str(whl)).files == {}
    assert not (tmp_path.parent / "evil.py").exists() and not Path("/etc/evil.py").exists()


@pytest.mark.timeout(60)
def test_zip_bombs_are_refused_from_the_central_directory(tmp_path, release_double, monkeypatch):
    whl = tmp_path / "vllm-0.33.0-cp38-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("vllm/__init__.py", b"")
        _streamed_member(z, "vllm/bomb.py", 64 * 2**20)
    assert whl.stat().st_size < 2**20  # small on disk, 64 MiB inflated
    with pytest.raises(InvalidArgument) as e:
        builds.overlay_from_wheel(str(whl))
    _one_line(
        e, f"member 'vllm/bomb.py' inflates to {64 * 2**20} bytes; allowed: at most {source_files.MAX_SOURCE_BYTES}"
    )
    with zipfile.ZipFile(whl, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("vllm/__init__.py", b"")
        _streamed_member(z, "vllm/ratio.py", 8 * 2**20)
    with pytest.raises(InvalidArgument) as e:
        builds.overlay_from_wheel(str(whl))
    _one_line(e, f"allowed: at most {source_files.MAX_RATIO} to 1")
    monkeypatch.setattr(source_files, "MAX_SOURCES_BYTES", 3 * 2**20)
    whl = _wheel(
        tmp_path, {"vllm/__init__.py": b"", **{f"vllm/m{i}.py": os.urandom(2**20) for i in range(4)}}
    )  # each under the bounds, 4 MiB together
    with pytest.raises(InvalidArgument) as e:
        builds.overlay_from_wheel(str(whl))
    _one_line(e, f"inflate to more than {3 * 2**20} bytes")


@pytest.mark.timeout(60)
def test_a_member_that_lies_about_its_size_is_inflated_in_bounded_memory(tmp_path, release_double):
    """The central directory says 1 MiB; the deflate stream holds 256 MiB.
    kvspec inflates 1 MiB at a time and stops at the declared size (the CRC
    then fails): one line, and far less memory than the stream holds."""
    whl = tmp_path / "vllm-0.33.0-cp38-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("vllm/__init__.py", b"")
        _streamed_member(z, "vllm/liar.py", 256 * 2**20)
        info = z.getinfo("vllm/liar.py")
    raw = bytearray(whl.read_bytes())
    lie = struct.pack("<I", 2**20)
    raw[info.header_offset + 22 : info.header_offset + 26] = lie  # the local header's uncompressed size
    at = raw.index(b"vllm/liar.py", raw.index(b"PK\x01\x02")) - 46  # its central directory entry
    assert raw[at : at + 4] == b"PK\x01\x02"
    raw[at + 24 : at + 28] = lie
    whl.write_bytes(bytes(raw))
    assert zipfile.ZipFile(whl).getinfo("vllm/liar.py").file_size == 2**20
    tracemalloc.start()
    try:
        with pytest.raises(InvalidArgument) as e:
            builds.overlay_from_wheel(str(whl))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _one_line(e, "cannot be read as a wheel", "allowed: wheel:FILE.whl, a vLLM wheel")
    assert peak < 64 * 2**20, peak  # was the whole 256 MiB stream at once


@pytest.mark.timeout(30)
def test_a_wheel_with_too_many_members_or_no_zip_at_all_is_one_line(tmp_path, release_double, monkeypatch):
    monkeypatch.setattr(source_files, "MAX_WHEEL_MEMBERS", 10)
    whl = _wheel(tmp_path, {"vllm/__init__.py": b"", **{f"vllm/m{i}.txt": b"" for i in range(20)}})
    with pytest.raises(InvalidArgument) as e:
        builds.overlay_from_wheel(str(whl))
    _one_line(e, "its central directory lists 21 members")
    whl.write_bytes(b"not a zip" * 100)
    with pytest.raises(InvalidArgument) as e:
        builds.overlay_from_wheel(str(whl))
    _one_line(e, "is not a zip file")


@pytest.mark.timeout(60)
def test_the_cli_refuses_a_zip_bomb_in_one_line(tmp_path):
    whl = tmp_path / "vllm-0.33.0-cp38-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("vllm/__init__.py", b"")
        _streamed_member(z, "vllm/bomb.py", 64 * 2**20)
    _assert_refused(
        _cli(["check-build", "--engine", f"wheel:{whl}"], tmp_path / "home"), "member 'vllm/bomb.py' inflates to"
    )


# ---------------------------------------------------------------- the real release (engine)


@pytest.mark.engine
@pytest.mark.timeout(300)
def test_vllm_0_33_0_s_own_version_file_names_its_release():
    from tests.engine.conftest import ensure_env

    ensure_env("0.33.0")
    sp = builds.site_packages(environments.env_dir("0.33.0"))
    data, _ = source_files.read_regular(sp / "vllm" / "_version.py", "--engine", "path:release", follow=False)
    assert source_files.version_in(data.decode()) == "0.33.0"


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_a_copy_of_the_release_tree_builds_without_base_keeps_a_0600_file_private_and_the_release_intact(tmp_path):
    """``path:DIR`` over vLLM 0.33.0's own files: the release comes from the
    tree's ``_version.py`` (no ``--base``), the one changed file (0600) is
    0600 in the build, and every file of the release's ``vllm/`` hashes the
    same after the build."""
    import hashlib
    import shutil

    from tests.engine.conftest import ensure_env

    ensure_env("0.33.0")
    sp = builds.site_packages(environments.env_dir("0.33.0"))

    def release_hashes() -> dict[str, str]:
        return {
            p.relative_to(sp).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((sp / "vllm").rglob("*"))
            if p.is_file()
        }

    before = release_hashes()
    src = tmp_path / "src"
    shutil.copytree(
        sp / "vllm",
        src / "vllm",
        ignore=lambda folder, names: [
            n for n in names if n == "__pycache__" or (not n.endswith(".py") and not (Path(folder) / n).is_dir())
        ],
    )
    rel = "vllm/v1/core/block_pool.py"
    (src / rel).write_text((src / rel).read_text() + "# a local change\n")
    (src / rel).chmod(0o600)
    overlay = builds.overlay_from_tree(str(src))
    assert overlay.release == "0.33.0" and list(overlay.files) == [rel]
    try:
        builds.build(overlay, selftest="import", progress=lambda line: None)
        built = builds.site_packages(environments.env_dir(overlay.version)) / rel
        assert built.read_bytes() == (src / rel).read_bytes() and stat.S_IMODE(built.stat().st_mode) == 0o600
        assert release_hashes() == before and len(before) > 5000
    finally:
        environments.remove(overlay.version, progress=lambda line: None)


# ---------------------------------------------------- issue 40 item 7: label


@pytest.mark.parametrize("stem", ["x" * 240, "a" * 100 + "-" + "b" * 100, "vllm-0.33.0-" + "-".join(["w"] * 120)])
def test_a_long_patch_name_gives_a_bounded_hashed_label(tmp_path, release_double, stem):
    """A 240-character patch file name (the most a file system allows is 255)
    made a build folder name past 255 bytes: ``OSError: File name too long``."""
    patch = _write(
        tmp_path, stem[:240] + ".diff", "--- a/vllm/v1/y.py\n+++ b/vllm/v1/y.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"
    )
    overlay = builds.overlay_from_patches("0.33.0", [patch])
    assert len(overlay.label) <= builds.MAX_LABEL and len(overlay.name.encode()) < 100
    assert re.fullmatch(r"[a-z0-9.-]+", overlay.label)


def test_two_long_labels_stay_apart():
    a, b = builds.bounded_label("x" * 60 + "a"), builds.bounded_label("x" * 60 + "b")
    assert a != b and len(a) == len(b) <= builds.MAX_LABEL
    assert builds.bounded_label("longer-sibling") == "longer-sibling"
