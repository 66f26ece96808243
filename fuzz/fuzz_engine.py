#!/usr/bin/env python3
"""atheris target: fuzzer bytes -> case -> the real vLLM scheduler -> oracles.

    python fuzz/fuzz_engine.py [libFuzzer flags] CORPUS_DIR [SEED_DIR ...]

libFuzzer owns argv; kvspec's settings come from the environment:

* ``KVSPEC_FUZZ_ENGINE``: the engine under test (default ``vllm==0.33.0``);
* ``KVSPEC_FUZZ_OTHER``: a second engine for the ``versions`` oracle;
* ``KVSPEC_FUZZ_OUT``: the findings folder (default ``$KVSPEC_HOME/findings``);
* ``KVSPEC_FUZZ_SEED``: recorded in findings.

When this interpreter can import the engine's vLLM (run from that version's
environment), the engine runs in-process and only vLLM's ``vllm/v1/core``
is instrumented, so its coverage guides the search. Otherwise the engine
runs in a worker process and the reference model is instrumented instead,
as a proxy. A finding is not a crash: it is written as a JSON file and the
campaign goes on; so is an exception raised inside vLLM.

Laid out for OSS-Fuzz / ClusterFuzzLite: one ``fuzz_*.py`` file, a ``main()``
guard, ``atheris.Setup`` + ``atheris.Fuzz``.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

import atheris

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

CAMPAIGN = None
_LAST_REPORT = [0.0]


def _instrumented_engine(name: str):
    """Open the engine; instrument vllm/v1/core if it runs in this process."""
    from engine_adapter.engine import inprocess_vllm_version, open_engine
    from engine_adapter.versions import parse_engine

    if inprocess_vllm_version() == parse_engine(name):
        with atheris.instrument_imports(include=["vllm.v1.core"]):
            import vllm.v1.core.block_pool  # noqa: F401
            import vllm.v1.core.kv_cache_coordinator  # noqa: F401
            import vllm.v1.core.kv_cache_manager  # noqa: F401
            import vllm.v1.core.kv_cache_utils  # noqa: F401
            import vllm.v1.core.sched.scheduler  # noqa: F401
            import vllm.v1.core.single_type_kv_cache_manager  # noqa: F401
        return open_engine(name, mode="inprocess")
    with atheris.instrument_imports(include=["reference"]):
        import reference.serial  # noqa: F401
    return open_engine(name, mode="worker")


def _report(kind: str, *fields) -> None:
    print("kvspec-" + kind, *fields, sep="\t", file=sys.stderr, flush=True)


def _setup() -> None:
    global CAMPAIGN
    from engine_adapter.home import kvspec_home

    from fuzz.campaign import Campaign

    engine = _instrumented_engine(os.environ.get("KVSPEC_FUZZ_ENGINE", "vllm==0.33.0"))
    other_name = os.environ.get("KVSPEC_FUZZ_OTHER")
    other = None
    if other_name:
        from engine_adapter.engine import open_engine

        other = open_engine(other_name, mode="worker")
    out = Path(os.environ.get("KVSPEC_FUZZ_OUT") or kvspec_home() / "findings")
    seed = os.environ.get("KVSPEC_FUZZ_SEED")
    CAMPAIGN = Campaign(
        engine,
        out,
        other=other,
        seed=int(seed) if seed else None,
        on_finding=lambda path, f: _report("finding", f"{CAMPAIGN.stats.elapsed:.3f}", path, f["summary"]),
    )


def TestOneInput(data: bytes) -> None:
    from fuzz.codec import decode

    case = decode(data)
    try:
        CAMPAIGN.check(case)
    except Exception:  # a harness bug: record it, keep fuzzing
        from fuzz.findings import write_harness_error

        path = write_harness_error(case, traceback.format_exc(), CAMPAIGN.out_dir)
        _report("harness-error", path)
    now = time.monotonic()
    if now - _LAST_REPORT[0] > 1.0:
        _LAST_REPORT[0] = now
        s = CAMPAIGN.stats
        _report("stats", s.execs, s.unsupported, len(s.findings), s.duplicates)


def main() -> None:
    _setup()
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
