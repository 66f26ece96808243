"""vLLM's source distributions (``vllm-X.tar.gz`` on PyPI), unpacked under
``$KVSPEC_HOME/src``.

The sdist carries what the wheel lacks: vLLM's own tests (``tests/v1/core``),
which the conformance suite cites line by line and ``kvspec mutate`` runs
against each mutant. :func:`sdist_dir` finds the unpacked tree or fetches it:
the release's sdist URL and sha256 from PyPI's simple index (JSON), downloaded with a
size and time bound, checked against the digest and written atomically, then unpacked
(tarfile's ``data`` filter: no links out of the tree, no devices) with a
marker written last, so a killed fetch leaves no tree taken for whole.
Nothing is imported from vLLM; nothing is written outside ``$KVSPEC_HOME``.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
from pathlib import Path

from ground.errors import EngineError
from ground.files import write_bytes_atomic, write_text_atomic
from ground.home import kvspec_home

#: PyPI's simple index, JSON form (PEP 691).
PYPI_SIMPLE = "https://pypi.org/simple/vllm/"
#: vLLM 0.33.0's sdist is 47 MB; refuse anything past this.
MAX_SDIST_BYTES = 256 * 1024 * 1024
TIMEOUT_S = 600.0


def src_dir() -> Path:
    return kvspec_home() / "src"


def _sdist_url(version: str, client) -> tuple[str, str]:
    r = client.get(PYPI_SIMPLE, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    if r.status_code != 200:
        raise EngineError(f"vllm=={version}: PyPI's simple index answered {r.status_code}")
    for f in r.json().get("files", []):
        if f.get("filename") == f"vllm-{version}.tar.gz" and f.get("url") and (f.get("hashes") or {}).get("sha256"):
            return f["url"], f["hashes"]["sha256"]
    raise EngineError(f"vllm=={version}: PyPI lists no sdist for this release")


def _download(version: str, dest: Path) -> None:
    """Fetch the sdist (bounded in size and time, checked against PyPI's
    sha256) and write it atomically to ``dest``."""
    import httpx

    with httpx.Client(timeout=httpx.Timeout(60.0), follow_redirects=True) as client:
        url, sha = _sdist_url(version, client)
        digest, chunks, size = hashlib.sha256(), [], 0
        with client.stream("GET", url, timeout=httpx.Timeout(TIMEOUT_S)) as r:
            if r.status_code != 200:
                raise EngineError(f"vllm=={version}: the sdist download answered {r.status_code}")
            for chunk in r.iter_bytes(1 << 20):
                size += len(chunk)
                if size > MAX_SDIST_BYTES:
                    raise EngineError(f"vllm=={version}: the sdist is over {MAX_SDIST_BYTES} bytes")
                digest.update(chunk)
                chunks.append(chunk)
    if digest.hexdigest() != sha:
        raise EngineError(f"vllm=={version}: the sdist's sha256 {digest.hexdigest()} is not PyPI's {sha}")
    write_bytes_atomic(dest, b"".join(chunks))


MARKER = ".kvspec-unpacked"


def sdist_dir(version: str, *, fetch: bool = True) -> Path:
    """The unpacked sdist of ``vllm==version`` (a folder holding ``vllm/``
    and ``tests/``), fetched from PyPI on first use unless ``fetch`` is
    False (then an EngineError says it is missing). The tree counts as
    unpacked once its marker is written, last; a half tree is unpacked
    again."""
    root = src_dir()
    tree = root / f"vllm-{version}"
    if (tree / MARKER).is_file():
        return tree
    if not fetch:
        raise EngineError(f"vllm=={version}: no sdist unpacked at {tree}")
    archive = root / f"vllm-{version}.tar.gz"
    if not archive.is_file():
        _download(version, archive)
    if tree.exists():
        shutil.rmtree(tree)
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name == f"vllm-{version}" or m.name.startswith(f"vllm-{version}/")]
        if not any(m.name.startswith(f"vllm-{version}/tests/") for m in members):
            archive.unlink(missing_ok=True)  # not the sdist we expect: fetch it again next time
            raise EngineError(f"vllm=={version}: the sdist holds no vllm-{version}/tests")
        tar.extractall(root, members=members, filter="data")
    write_text_atomic(tree / MARKER, f"vllm=={version}\n")
    return tree
