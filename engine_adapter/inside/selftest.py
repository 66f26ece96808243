"""What every family's self-test does first and last (``python -m
engine_adapter.inside.worker --selftest``, before an install or a build is
marked ready): import the engine through the family's driver, check it is
the release the environment was built for and that torch is the CPU build
kvspec installs, and, for an import-only self-test (a mutant's build),
import the modules kvspec drives and print one JSON line. Family-neutral:
the family's module passes its own driver, name and modules."""

from __future__ import annotations

import importlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path


def case_beside(driver_file: str) -> dict:
    """A family's self-test case: ``selftest-case.json`` beside its driver
    module (a case in kvspec's own format, like ``examples/``)."""
    return json.loads(Path(driver_file).with_name("selftest-case.json").read_text())


def load(get_driver: Callable, title: str, expect_version: str | None):
    """``(driver, import seconds)``, or None after one line on stderr when
    the environment holds another release or a CUDA torch."""
    t0 = time.perf_counter()
    driver = get_driver()  # imports the engine
    import_s = time.perf_counter() - t0
    if expect_version and driver.version != expect_version:
        print(f"selftest: this environment has {title} {driver.version}, expected {expect_version}", file=sys.stderr)
        return None
    try:
        import torch
    except ImportError:  # a family without torch (llama.cpp's): nothing to check
        return driver, import_s
    if torch.version.cuda is not None:
        print(f"selftest: torch {torch.__version__} is a CUDA build; kvspec engines use the CPU build", file=sys.stderr)
        return None
    return driver, import_s


def import_only(out, modules: tuple[str, ...], summary: dict) -> int:
    """Import ``modules`` and print ``summary`` marked import-only."""
    for mod in modules:
        importlib.import_module(mod)
    out.write(json.dumps({**summary, "import_only": True}) + "\n")
    out.flush()
    return 0
