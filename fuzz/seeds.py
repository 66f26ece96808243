"""The z3 boundary cases from ``spec/``, cached on disk as corpus inputs.

Computing them takes z3 some seconds; a campaign should not pay that each
time. They are written once (encoded with ``fuzz.codec.encode``) into
``$KVSPEC_HOME/seeds/z3-<fingerprint>``, where the fingerprint hashes the
sources of ``spec/`` and ``reference/``, so a changed rule recomputes them.
The folder is complete only when its ``READY`` marker exists (written last).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from reference.case import Case

from fuzz.codec import decode

_ROOT = Path(__file__).resolve().parent.parent


def fingerprint() -> str:
    h = hashlib.sha256()
    for folder in ("spec", "reference"):
        for path in sorted((_ROOT / folder).glob("*.py")):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:12]


def seed_dir(home: Path) -> Path:
    """The folder of encoded z3 seeds, computed on first use."""
    from fuzz.atheris_runner import write_seeds

    folder = home / "seeds" / f"z3-{fingerprint()}"
    if not (folder / "READY").exists():
        from spec.seeds import boundary_cases

        write_seeds(list(boundary_cases()), folder)
        (folder / "READY").write_text("complete\n")
    return folder


def load_seed_cases(folder: Path) -> list[Case]:
    return [decode(p.read_bytes()) for p in sorted(folder.iterdir()) if p.name != "READY" and not p.name.endswith(".tmp")]
