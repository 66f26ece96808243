"""Builds of a release: patched, local-tree and wheel engines (SGLang: patched only).

A *build* is a release's engine environment with some of its Python files
replaced (``--engine sglang==X --patch FILE.diff``: a diff of SGLang's
``sglang/`` tree, the same way). Three sources:

* ``--engine vllm==X --patch FILE.diff [--patch ...]``: unified diffs against
  release X's ``vllm/`` tree (paths ``a/vllm/v1/core/...``), applied in
  order by kvspec's own strict applier (exact context, a hunk may move, never
  fuzz);
* ``--engine path:/src/vllm`` (or its checkout root): a local vLLM source
  tree; its Python files that differ from the release's overlay it (the
  compiled parts stay the release's). The release is read (as text) from
  the tree's ``vllm/_version.py`` or given with ``--base vllm==X``;
* ``--engine wheel:FILE.whl``: the Python files of a vLLM wheel, the same way
  (release from the wheel's version, or ``--base``).

Each build gets its own environment, ``$KVSPEC_HOME/engines/vllm-X+LABEL.HASH``,
named ``vllm==X+LABEL.HASH`` (a PEP 440 local version of X: LABEL from the
patch files' names, ``local`` or ``wheel``; HASH the first 6 hex digits of
the sha256 of the release and the overlay's files). It is built in seconds
from the release's ready environment:

1. a hard-link copy of the release environment (``os.link`` per file,
   symlinks re-created; the release's ready marker is not copied);
2. the overlay's files written as *new* files (:func:`ground.files.write_bytes_atomic`
   writes a temporary file and renames it over the link), so the release's
   files are never touched; their stale ``__pycache__`` entries are unlinked
   in the build only;
3. the self-test (the worker drives the real scheduler once);
4. the ready marker, written last and atomically, with what the build is
   made of (release, sources and their sha256, the files it replaces and
   their sha256). Steps 1-4 are one install transaction
   (:func:`engine_adapter.host.venvs.install`: under the build's lock, a
   failure removes the half-built directory).

A build's state (ready, stale, incomplete, missing), its row in ``kvspec
engines list``, its listing and its removal are
:mod:`engine_adapter.host.environments`' (every engine environment's state is
read there); this module makes builds and imports that one, never the other
way round.

Patches, trees and wheels come from strangers: they are read as data, never
run, bounded before any work (:mod:`engine_adapter.host.patches`: patch bytes,
counts, malformed headers, a linear-time applier;
:mod:`engine_adapter.host.source_files`: no symlink out of a tree, a wheel judged
by its central directory, permissions that never widen), and every file a
build writes is a file of ``vllm/`` inside the build's own site-packages. A
patch that does not apply, like every refused input, is one line naming the
patch, the file and the hunk or line (InvalidArgument, exit 2). The reference model judges a build by its
release's rule (``reference.knobs.parse_version`` reads ``X+LABEL`` as X),
so the ``reference`` and ``knobs`` oracles describe the release, not the
build (:func:`fuzz.judge.oracles.oracles_for`).

This module never imports vLLM.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine_adapter.host import environments, source_files, venvs
from engine_adapter.host import patches as patches_mod
from engine_adapter.host.versions import (
    FAMILY_TITLES,
    SUPPORTED_VERSIONS,
    EngineSpec,
    engine_name,
    is_build,
    parse_engine,
    release_number,
    release_of,
)
from ground.console import say as _say
from ground.errors import EngineError, InvalidArgument, invalid, shown
from ground.files import write_bytes_atomic

Progress = Callable[[str], None]
#: Hex digits of the content hash in a build's name.
HASH_DIGITS = 6
KINDS = ("patch", "path", "wheel")


# ------------------------------------------------------------------ names


def site_packages(root: Path) -> Path | None:
    found = sorted(Path(root).glob("lib/python3*/site-packages"))
    return found[0] if found else None


def _label(text: str) -> str:
    """A name part for a build label: lower-case letters, digits and dashes."""
    text = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return text or "build"


#: Characters a build's label may have: with the release and the hash the
#: build folder's name stays far below a file system's 255 bytes.
MAX_LABEL = 48


def bounded_label(label: str) -> str:
    """``label`` when at most :data:`MAX_LABEL` characters, else its start
    and 8 hex digits of its SHA-256 (a 240-character patch name cannot make
    a folder name too long; two long names stay apart)."""
    if len(label) <= MAX_LABEL:
        return label
    digest = hashlib.sha256(label.encode()).hexdigest()[:8]
    return label[: MAX_LABEL - 9].rstrip("-.") + "-" + digest


def patch_label(path: str | os.PathLike, release: str) -> str:
    """``fixes/vllm-0.33.0-longer-sibling-of-aligned-prompt.diff`` ->
    ``longer-sibling`` (the release prefix dropped, two words kept)."""
    stem = Path(path).name
    for suffix in (".diff", ".patch"):
        stem = stem.removesuffix(suffix)
    stem = re.sub(rf"^(vllm|sglang)-?{re.escape(release_number(release))}-?", "", stem)
    words = [w for w in _label(stem).split("-") if w]
    return bounded_label("-".join(words[:2]) or "patch")


# ------------------------------------------------------------------ overlays


@dataclass(frozen=True)
class Overlay:
    """What a build replaces in its release: ``files`` maps a path relative to
    site-packages (``vllm/...``) to its new bytes, or None for a file the
    build deletes; ``modes`` the most permission each written file may have
    (its source's bits: a 0600 source file is written 0600). The modes are
    not part of the name: the same bytes are the same build."""

    release: str
    kind: str
    label: str
    files: dict[str, bytes | None]
    sources: list[dict] = field(default_factory=list)
    modes: dict[str, int] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        h = hashlib.sha256(f"{engine_name(self.release)}\0".encode())
        for rel in sorted(self.files):
            data = self.files[rel]
            h.update(rel.encode() + b"\0" + (b"D" if data is None else b"F" + hashlib.sha256(data).digest()) + b"\0")
        return h.hexdigest()

    @property
    def version(self) -> str:
        return f"{self.release}+{self.label}.{self.digest[:HASH_DIGITS]}"

    @property
    def name(self) -> str:
        return engine_name(self.version)

    def describe(self) -> dict:
        return {
            "release": self.release,
            "kind": self.kind,
            "sources": self.sources,
            "files": {
                rel: (None if data is None else hashlib.sha256(data).hexdigest())
                for rel, data in sorted(self.files.items())
            },
            "digest": self.digest,
        }


def _release_env(release: str) -> Path:
    """The release's ready environment's site-packages (a build starts there)."""
    if not environments.is_ready(release):
        state = environments.status(release)["state"]
        raise EngineError(
            f"engine={engine_name(release)!r}: environment {state} at {environments.env_dir(release)}; a build starts from the release's ready environment; run: kvspec engines install {engine_name(release)}"
        )
    sp = site_packages(environments.env_dir(release))
    if sp is None:
        raise EngineError(
            f"engine={engine_name(release)!r}: no lib/python3*/site-packages under {environments.env_dir(release)}"
        )
    return sp


def _check_paths(
    sp: Path, files: dict[str, bytes | None], flag: str, what: str, release: str, package: str = "vllm"
) -> None:
    """Every file a build writes is a file: not a folder of the release, not
    below a file of the release or of the build (else writing it would fail
    half-way through the build)."""
    written, title = {rel for rel, data in files.items() if data is not None}, FAMILY_TITLES.get(package, package)
    for rel in sorted(written):
        path = sp / rel
        if path.is_dir() and not path.is_symlink():
            raise invalid(
                flag,
                what,
                f"{rel} is a folder in {title} {release_number(release)}; allowed: files of {title}'s {package}/ tree",
            )
        for parent in list(Path(rel).parents)[:-1]:
            if parent.as_posix() in written or ((sp / parent).exists() and not (sp / parent).is_dir()):
                raise invalid(
                    flag,
                    what,
                    f"{rel} lies below {parent.as_posix()}, a file; allowed: files of {title}'s {package}/ tree",
                )


def overlay_from_patches(release: str, patches: list[str | os.PathLike], *, flag: str = "--patch") -> Overlay:
    """Apply ``patches`` in order to release's vLLM files; the overlay is the
    files that end up different from the release's. The patches are read
    and bounded (:mod:`engine_adapter.host.patches`: bytes, count, file patches,
    hunks) before any is applied; a file they make keeps no more permission
    than the patches that made it."""
    spec = (
        release if isinstance(release, EngineSpec) else EngineSpec.parse(release, "--engine")
    )  # parsed at the edge, or here
    # the release's version key (vLLM's bare X; sglang==X), its package tree and its name in messages
    release, package, title, shown_release = (
        spec.release_spec.version,
        spec.family,
        FAMILY_TITLES[spec.family],
        spec.release,
    )
    if not patches:
        raise invalid(flag, [], "give at least one patch file")
    if len(patches) > patches_mod.MAX_PATCHES:
        raise invalid(
            flag, [str(p) for p in patches], f"{len(patches)} patches; allowed: at most {patches_mod.MAX_PATCHES}"
        )
    read, total, nlines = [], 0, 0
    for p in patches:
        raw, mode = source_files.read_regular(p, flag, str(p), limit=patches_mod.MAX_PATCH_BYTES)
        total += len(raw)
        if total > patches_mod.MAX_PATCH_BYTES:
            raise invalid(
                flag,
                str(p),
                f"the patches hold more than {patches_mod.MAX_PATCH_BYTES} bytes together; allowed: at most {patches_mod.MAX_PATCH_BYTES}",
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise invalid(flag, str(p), f"is not UTF-8 text (byte {e.start}); allowed: a unified diff") from None
        nlines += text.count("\n")
        if nlines > patches_mod.MAX_PATCH_LINES:
            raise invalid(
                flag,
                str(p),
                f"the patches hold more than {patches_mod.MAX_PATCH_LINES} lines together; allowed: at most {patches_mod.MAX_PATCH_LINES}",
            )
        read.append((p, raw, mode, text))
    parsed, nfiles, nhunks = [], 0, 0
    for p, raw, mode, text in read:
        where = f"{flag}={str(p)!r}"
        fps = patches_mod.parse_patch(
            text,
            where,
            max_files=patches_mod.MAX_FILE_PATCHES - nfiles,
            max_hunks=patches_mod.MAX_HUNKS - nhunks,
            package=package,
        )
        if not fps:
            raise invalid(
                flag,
                str(p),
                f"holds no file patch ('--- a/{package}/...' / '+++ b/{package}/...' with hunks); allowed: a unified diff against {title}'s {package}/ tree",
            )
        nfiles += len(fps)
        nhunks += sum(len(fp.hunks) for fp in fps)
        parsed.append((p, raw, mode, fps))
    sp = _release_env(release)
    state: dict[str, list[str] | None] = {}
    modes: dict[str, int] = {}
    sources, labels = [], []

    def current(rel: str, where: str) -> list[str] | None:
        if rel not in state:
            path = sp / rel
            if not path.is_file():
                state[rel] = None
            else:
                try:
                    state[rel] = patches_mod.split_lines(path.read_bytes().decode("utf-8"))
                except UnicodeDecodeError:
                    raise InvalidArgument(
                        f"{where}: {rel} is not UTF-8 text in {title} {shown_release}; allowed: patches to {title} {shown_release}'s text files"
                    ) from None
        return state[rel]

    for p, raw, mode, fps in parsed:
        where = f"{flag}={str(p)!r}"
        for fp in fps:
            if fp.old is None:  # a new file
                if current(fp.new, where) is not None:
                    raise InvalidArgument(
                        f"{where}: {fp.new} is created by the patch but exists in {title} {shown_release}; allowed: a unified diff against {title} {shown_release}'s {package}/ tree"
                    )
                lines: list[str] = []
            else:
                lines = current(fp.old, where)
                if lines is None:
                    raise InvalidArgument(
                        f"{where}: {fp.old}: no such file in {title} {shown_release}; allowed: a unified diff against {title} {shown_release}'s {package}/ tree"
                    )
            result = patches_mod.apply_hunks(lines, fp, where, shown_release, package)
            if fp.new is None:
                state[fp.old] = None
            else:
                if fp.old is not None and fp.old != fp.new:
                    state[fp.old] = None
                state[fp.new] = result
                modes[fp.new] = modes.get(fp.new, 0o777) & mode
        sources.append({"kind": "patch", "path": str(p), "sha256": hashlib.sha256(raw).hexdigest()})
        labels.append(patch_label(p, release))
    files: dict[str, bytes | None] = {}
    for rel, lines in state.items():
        orig = sp / rel
        if lines is None:
            if orig.is_file():
                files[rel] = None
            continue
        data = "".join(lines).encode("utf-8")
        if not orig.is_file() or orig.read_bytes() != data:
            files[rel] = data
    _check_paths(sp, files, flag, [str(p) for p in patches], release, package)
    label = bounded_label(".".join(dict.fromkeys(labels)))
    return Overlay(release, "patch", label, files, sources, {rel: m for rel, m in modes.items() if rel in files})


# ---- local trees and wheels


_RELEASE = re.compile(r"^(\d+\.\d+\.\d+)")


def _pick_release(found: str | None, base: str | None, what: str, flag: str) -> str:
    if base is not None:
        return release_of(parse_engine(base, "--base"))
    m = _RELEASE.match(found or "")
    if m is None:
        raise invalid(
            flag,
            what,
            f"its vLLM release is unknown (version {found!r}); allowed: --base vllm==X naming the release it is based on",
        )
    if m.group(1) not in SUPPORTED_VERSIONS:
        raise invalid(
            flag,
            what,
            f"vLLM {shown(found)} is based on no release kvspec has an environment for; allowed: --base vllm==X with X one of {', '.join(SUPPORTED_VERSIONS)}",
        )
    return m.group(1)


def _overlay_of(
    release: str, kind: str, label: str, members: dict[str, source_files.Source], source: dict, flag: str, what: str
) -> Overlay:
    sp = _release_env(release)
    files, modes = {}, {}
    for rel, (data, mode) in members.items():
        orig = sp / rel
        if not orig.is_file() or orig.read_bytes() != data:
            files[rel] = data
            modes[rel] = mode
    _check_paths(sp, files, flag, what, release)
    return Overlay(release, kind, bounded_label(label), files, [source], modes)


def overlay_from_tree(path: str, base: str | None = None, *, flag: str = "--engine") -> Overlay:
    """The Python files of a local vLLM source tree (its ``vllm`` package
    folder, or the checkout holding it) that differ from the release's,
    read by :func:`engine_adapter.host.source_files.tree_files` (no symlink out of
    the tree, bounded). The release is the one its ``vllm/_version.py``
    states (read as text), or ``base``."""
    root = Path(path).expanduser()
    what = f"path:{path}"
    if (root / "vllm" / "__init__.py").is_file():
        pkg = root / "vllm"
    elif root.name == "vllm" and (root / "__init__.py").is_file():
        pkg = root
    else:
        raise invalid(
            flag,
            what,
            "is not a vLLM source tree (no vllm/__init__.py there); allowed: path:/src/vllm or the checkout holding it",
        )
    members = source_files.tree_files(root, pkg, flag, what)
    version_file = members.get("vllm/_version.py")
    found = source_files.version_in(version_file[0].decode("utf-8", "replace")) if version_file else None
    release = _pick_release(found, base, what, flag)
    h = hashlib.sha256()
    for rel in sorted(members):
        h.update(rel.encode() + b"\0" + hashlib.sha256(members[rel][0]).digest())
    return _overlay_of(
        release,
        "path",
        "local",
        members,
        {"kind": "path", "path": str(pkg.resolve()), "version": found, "sha256": h.hexdigest()},
        flag,
        what,
    )


def overlay_from_wheel(path: str, base: str | None = None, *, flag: str = "--engine") -> Overlay:
    """The Python files of a vLLM wheel that differ from the release's, read
    by :func:`engine_adapter.host.source_files.wheel_files` (judged by its central
    directory first; nothing extracted)."""
    whl = Path(path).expanduser()
    what = f"wheel:{path}"
    if not whl.is_file():
        raise invalid(flag, what, "is not a file; allowed: wheel:FILE.whl, a vLLM wheel")
    parts = whl.name.split("-")
    if not whl.name.endswith(".whl") or len(parts) < 3 or parts[0].lower() != "vllm":
        raise invalid(flag, what, "is not a vLLM wheel (vllm-VERSION-...whl); allowed: wheel:FILE.whl, a vLLM wheel")
    members, digest = source_files.wheel_files(whl, flag, what)
    if "vllm/__init__.py" not in members:
        raise invalid(flag, what, "holds no vllm/__init__.py; allowed: wheel:FILE.whl, a vLLM wheel")
    release = _pick_release(parts[1], base, what, flag)
    return _overlay_of(
        release,
        "wheel",
        "wheel",
        members,
        {"kind": "wheel", "path": str(whl.resolve()), "version": parts[1], "sha256": digest},
        flag,
        what,
    )


# ------------------------------------------------------------------ environments


def link_tree(src: Path, dst: Path, *, skip_top: tuple[str, ...] = ()) -> int:
    """Hard-link every file of ``src`` into ``dst`` (symlinks re-created as
    they are); return the number of files linked."""
    n = 0
    src, dst = Path(src), Path(dst)
    for root, dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        target = dst if rel == "." else dst / rel
        target.mkdir(parents=True, exist_ok=True)
        for d in list(dirs):
            s = os.path.join(root, d)
            if os.path.islink(s):
                os.symlink(os.readlink(s), target / d)
                dirs.remove(d)
        for f in files:
            if rel == "." and f in skip_top:
                continue
            s = os.path.join(root, f)
            if os.path.islink(s):
                os.symlink(os.readlink(s), target / f)
            else:
                os.link(s, target / f)
                n += 1
    return n


def build(overlay: Overlay, *, force: bool = False, selftest: str = "run", progress: Progress = _say) -> dict:
    """Build (or find) the environment of ``overlay``; returns its marker.

    ``selftest``: ``run`` (import vLLM and drive one MTP case, the default)
    or ``import`` (import only: a mutant's build, whose behaviour kvspec's
    oracles judge; its marker says so)."""
    if selftest not in ("run", "import"):
        raise invalid("selftest", selftest, "one of: run, import")
    version = overlay.version
    name = engine_name(version)
    prefix = f"[{name}]"
    target = environments.env_dir(version)
    release = overlay.release
    release_dir = environments.env_dir(release)

    def ready() -> bool:  # (a build only import-checked is remade when its case must run)
        marker = environments.read_marker(version) or {}
        return environments.is_ready(version) and not (
            selftest == "run" and (marker.get("selftest") or {}).get("import_only")
        )

    def make() -> dict:
        start = time.monotonic()
        with venvs.install_lock(
            release_dir, wait_s=environments.LOCK_WAIT_S, label=engine_name(release), progress=progress
        ):
            _release_env(release)  # still ready under its lock
            try:
                linked = link_tree(release_dir, target, skip_top=(venvs.MARKER_NAME,))
            except OSError as e:
                raise EngineError(
                    f"engine={name!r}: cannot hard-link {release_dir} into {target} ({e.strerror or e}); allowed: an engines folder on one file system"
                ) from None
        link_s = time.monotonic() - start
        own = _write_overlay(overlay, site_packages(target), name)
        progress(
            f"{prefix} linked {linked} files of {engine_name(release)} in {link_s:.1f}s; wrote {len(overlay.files)} file(s): {', '.join(sorted(overlay.files)) or 'none'}"
        )
        progress(f"{prefix} self-test ({'imports vLLM' if selftest == 'import' else 'drives the real scheduler once'})")
        selftest_result = environments._selftest(version, import_only=selftest == "import")
        return {
            "engine": name,
            "version": version,
            "build": overlay.describe(),
            "base_fingerprint": environments.fingerprint(release),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "python": sys.version.split()[0],
            "link_seconds": round(link_s, 2),
            "build_seconds": round(time.monotonic() - start, 1),
            "own_bytes": own,
            "selftest": selftest_result,
        }

    return venvs.install(
        target,
        label=name,
        wait_s=environments.BUILD_LOCK_WAIT_S,
        is_ready=ready,
        build=make,
        force=force,
        progress=progress,
        stale_line=f"{prefix} removing incomplete or stale build {target}",
        built_line=lambda marker: f"{prefix} ready in {marker['build_seconds']}s at {target}",
    )


def _write_overlay(overlay: Overlay, sp: Path, name: str) -> int:
    """Write the overlay's files into the build's site-packages ``sp`` as new
    files (never more permission than the release's file nor the source's),
    unlink their stale bytecode and the files it deletes; return the bytes
    written."""
    own = 0
    for rel, data in sorted(overlay.files.items()):
        path = sp / rel
        if not path.parent.resolve().is_relative_to(sp.resolve()):  # a folder linked out of the build
            raise EngineError(f"engine={name!r}: {rel} would be written outside {sp}")
        cache = path.parent / "__pycache__"
        for pyc in cache.glob(f"{path.stem}.*.pyc") if cache.is_dir() else ():
            pyc.unlink()
        if data is None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            continue
        mode = (path.stat().st_mode & 0o777 if path.exists() else 0o644) & overlay.modes.get(rel, 0o777)
        write_bytes_atomic(path, data)  # a new file (created 0600): the release's stays as it was
        path.chmod(mode)  # never more than the release's file nor the source's
        own += len(data)
    return own


def describe(version: str) -> dict | None:
    """What a build is made of (its marker's ``build``), or None."""
    marker = environments.read_marker(version) if is_build(version) else None
    return (marker or {}).get("build")


# ------------------------------------------------------------------ engine specs


def prepare(
    spec: str | EngineSpec,
    patches: list[str] | None = None,
    base: str | None = None,
    *,
    flag: str = "--engine",
    selftest: str = "run",
    progress: Progress = _say,
) -> str:
    """An engine spec from the command line -> an engine name, building the
    build it names first: ``vllm==X`` (with ``patches``: the patched build),
    ``vllm==X+LABEL.HASH`` (a build made earlier), ``path:DIR``,
    ``wheel:FILE.whl`` (``base``: the release they are based on)."""
    patches = list(patches or [])
    text = spec.strip() if isinstance(spec, str) else spec
    if isinstance(text, str) and text.startswith(("path:", "wheel:")):
        if patches:
            raise invalid("--patch", patches[0], f"applies to a release (--engine vllm==X --patch FILE), not to {text}")
        kind, _, where = text.partition(":")
        if not where:
            raise invalid(flag, text, f"{kind}: needs a {'folder' if kind == 'path' else 'wheel file'} after the colon")
        if any(ord(c) < 32 or ord(c) == 127 for c in where):
            raise invalid(flag, text, f"{kind}: names a path with a control character; allowed: a printable path")
        overlay = (
            overlay_from_tree(where, base, flag=flag) if kind == "path" else overlay_from_wheel(where, base, flag=flag)
        )
    else:
        parsed = text if isinstance(text, EngineSpec) else EngineSpec.parse(text, flag)  # parsed at the edge, or here
        version = parsed.version
        if base is not None:
            raise invalid("--base", base, "goes with --engine path:DIR or wheel:FILE.whl")
        if not patches:
            return engine_name(version)
        if is_build(version):
            raise invalid(
                "--patch",
                patches[0],
                f"applies to a release (vllm=={release_of(version)}), not to the build {engine_name(version)}",
            )
        overlay = overlay_from_patches(parsed, patches)
    if not overlay.files:
        progress(
            f"[{overlay.name}] note: the overlay changes no vLLM file: the build equals {engine_name(overlay.release)}"
        )
    build(overlay, selftest=selftest, progress=progress)
    return overlay.name


def inprocess_build_version(prefix: str | None = None) -> str | None:
    """The build whose environment this interpreter runs in (``sys.prefix``),
    or None: there the vLLM importable in-process is that build, not its
    release."""
    root = Path(prefix or sys.prefix)
    if "+" not in root.name or not root.name.startswith("vllm-"):
        return None
    marker = venvs.read_marker(root)
    version = (marker or {}).get("version")
    return version if isinstance(version, str) and is_build(version) else None


def run_python(version: str, args: list[str], *, timeout: float, platform: str = "cuda") -> subprocess.CompletedProcess:
    """Run the build's (or release's) interpreter with kvspec's worker
    environment, bounded by ``timeout``."""
    return subprocess.run(
        [str(environments.env_python(version)), *args],
        env=environments.worker_env(version, platform),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(environments.REPO_ROOT),
    )
