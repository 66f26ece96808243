#!/usr/bin/env python3
"""atheris target: fuzzer bytes -> case -> the real vLLM scheduler -> oracles.

    python fuzz/driving/fuzz_engine.py [libFuzzer flags] CORPUS_DIR [SEED_DIR ...]

libFuzzer owns argv; kvspec's settings come from the environment:

* ``KVSPEC_FUZZ_ENGINE``: the engine under test, one serialized value
  (``ground.engines.EngineSpec.to_json``; default vLLM 0.33.0);
* ``KVSPEC_FUZZ_OTHER``: a second engine for the ``versions`` oracle (the same form);
* ``KVSPEC_FUZZ_OUT``: the findings folder (default ``$KVSPEC_HOME/findings``);
* ``KVSPEC_FUZZ_SEED``: recorded in findings;
* ``KVSPEC_FUZZ_SYNTHETIC``: ``1`` draws hand geometries instead of
  deployments (``kvspec fuzz --synthetic-geometry``);
* ``KVSPEC_FUZZ_PARENT``: the pid of the runner; this worker dies with it
  (Linux ``PR_SET_PDEATHSIG``), so a ``kill -9`` of the runner leaves none;
* ``KVSPEC_FUZZ_DEADLINE``: wall-clock time (``time.time()``) after which a
  finding is no longer shrunk (the runner stops the worker soon after);
* ``KVSPEC_FUZZ_INSTRUMENT``: ``core`` instruments all of ``vllm.v1.core``
  (the default instruments the functions under test only);
* ``KVSPEC_FUZZ_GENERATOR``: ``random`` checks the random driver's cases
  instead of decoding the input, ``KVSPEC_FUZZ_GENERATOR_CASES`` of them at
  most (bench/fuzz.py: the random driver's coverage, counted by libFuzzer
  under the same instrumentation).

When this interpreter can import the engine's vLLM (run from that version's
environment), the engine runs in-process and only the vLLM functions under
test are instrumented (``engine_adapter.vllm_engine.coverage``: lookup, boundaries,
retention, the align-mode split, block-size resolution; not all of
``vllm/v1/core``: ``KVSPEC_FUZZ_INSTRUMENT=core`` brings that back), so
their coverage guides the search. Otherwise the engine
runs in a worker process and the reference model is instrumented instead,
as a proxy. A finding is not a crash: it is written as a JSON file and the
campaign goes on; so is an exception raised inside vLLM. A harness error
(kvspec's own bug, a dead engine worker) is stored apart and reported as
``kvspec-harness-error``, never as a finding.

Laid out for OSS-Fuzz / ClusterFuzzLite: one ``fuzz_*.py`` file, a ``main()``
guard, ``atheris.Setup`` + ``atheris.Fuzz``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
import traceback
from pathlib import Path


def _die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this worker when the runner that
    started it dies (``prctl(PR_SET_PDEATHSIG)``); if the runner is already
    gone (it died before this line ran), exit now."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    parent = os.environ.get("KVSPEC_FUZZ_PARENT")
    if parent and parent.isdigit() and os.getppid() != int(parent):
        os._exit(0)


_die_with_parent()

import atheris  # noqa: E402

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

CAMPAIGN = None
_LAST_REPORT = [0.0]


#: ``KVSPEC_FUZZ_INSTRUMENT``: ``under-test`` (default) instruments only the
#: vLLM functions under test (``engine_adapter.vllm_engine.coverage``); ``core`` all of
#: ``vllm.v1.core`` (5x slower per execution; kept for comparison).
INSTRUMENT_MODES = ("under-test", "core")


def _instrumented_engine(spec):
    """Open the engine; if it runs in this process, instrument the vLLM
    functions under test (``engine_adapter.vllm_engine.coverage.UNDER_TEST``: lookup,
    boundaries, retention, the align-mode split, block-size resolution), so
    that their coverage, and only theirs, guides the search."""
    from engine_adapter.host.engine import inprocess_vllm_version, open_engine

    if inprocess_vllm_version() == spec.version:
        if os.environ.get("KVSPEC_FUZZ_INSTRUMENT") == "core":
            with atheris.instrument_imports(include=["vllm.v1.core"]):
                import vllm.v1.core.block_pool  # noqa: F401
                import vllm.v1.core.kv_cache_coordinator  # noqa: F401
                import vllm.v1.core.kv_cache_manager  # noqa: F401
                import vllm.v1.core.kv_cache_utils  # noqa: F401
                import vllm.v1.core.sched.scheduler  # noqa: F401
                import vllm.v1.core.single_type_kv_cache_manager  # noqa: F401
            return open_engine(spec, mode="inprocess")
        engine = open_engine(spec, mode="inprocess")  # imports vLLM
        from engine_adapter.vllm_engine.coverage import functions_under_test

        funcs, _missing = functions_under_test()
        for func in funcs:
            atheris.instrument_func(func)
        return engine
    with atheris.instrument_imports(include=["reference"]):
        import reference.serial  # noqa: F401
    return open_engine(spec, mode="worker")


def _report(kind: str, *fields) -> None:
    """One tab-separated line for the runner. If the runner no longer reads
    (a broken pipe), the campaign has no one to report to: exit at once."""
    try:
        print("kvspec-" + kind, *fields, sep="\t", file=sys.stderr, flush=True)
    except OSError:
        os._exit(0)


def _deadline() -> float | None:
    """KVSPEC_FUZZ_DEADLINE (wall clock) as a ``time.monotonic()`` value."""
    raw = os.environ.get("KVSPEC_FUZZ_DEADLINE")
    try:
        return time.monotonic() + (float(raw) - time.time()) if raw else None
    except ValueError:
        return None


def _setup() -> None:
    global CAMPAIGN
    from fuzz.driving.campaign import Campaign
    from ground.engines import DEFAULT_FAMILY, FAMILIES, EngineSpec
    from ground.home import kvspec_home

    raw = os.environ.get("KVSPEC_FUZZ_ENGINE")
    default = EngineSpec(DEFAULT_FAMILY, FAMILIES[DEFAULT_FAMILY].default_release)
    engine = _instrumented_engine(EngineSpec.from_json(raw, "KVSPEC_FUZZ_ENGINE") if raw else default)
    raw_other = os.environ.get("KVSPEC_FUZZ_OTHER")
    other = None
    if raw_other:
        from engine_adapter.host.engine import open_engine

        other = open_engine(EngineSpec.from_json(raw_other, "KVSPEC_FUZZ_OTHER"), mode="worker")
    out = Path(os.environ.get("KVSPEC_FUZZ_OUT") or kvspec_home() / "findings")
    seed = os.environ.get("KVSPEC_FUZZ_SEED")
    CAMPAIGN = Campaign(
        engine,
        out,
        other=other,
        seed=int(seed) if seed else None,
        on_finding=lambda path, f: _report("finding", f"{CAMPAIGN.stats.elapsed:.3f}", path, f["summary"]),
        on_harness_error=lambda path: _report("harness-error", path),
        deadline=_deadline(),
    )
    _map_seeds()


def _map_seeds() -> None:
    """Deployment mode: write the z3 boundary cases, mapped onto real
    deployments by this worker's engine, into ``KVSPEC_FUZZ_MAPPED_SEEDS``
    (content-named, atomically) before libFuzzer reads that folder."""
    src, dst = os.environ.get("KVSPEC_FUZZ_Z3_SEEDS"), os.environ.get("KVSPEC_FUZZ_MAPPED_SEEDS")
    if not src or not dst or os.environ.get("KVSPEC_FUZZ_SYNTHETIC") == "1":
        return
    from fuzz.draw.seeds import load_seed_cases, on_deployments
    from fuzz.driving.atheris_runner import write_seeds

    try:
        write_seeds(on_deployments(load_seed_cases(Path(src)), CAMPAIGN.resolver), Path(dst))
    except Exception:  # a harness bug: record it, fuzz without the mapped seeds
        from fuzz.results.findings import write_harness_error

        _report("harness-error", write_harness_error(None, traceback.format_exc(), CAMPAIGN.out_dir))


_GENERATED = None


def _generated_cases():
    """``KVSPEC_FUZZ_GENERATOR=random``: the cases ``kvspec fuzz --driver
    random --seed N`` checks, in its order (the z3 seeds mapped onto
    deployments, then seeded random cases), one per libFuzzer input, the
    input's bytes ignored. bench/fuzz.py counts the coverage the random
    driver reaches this way, under the same instrumentation as atheris."""
    from fuzz.draw.seeds import load_seed_cases, on_deployments
    from fuzz.driving.drivers import random_cases

    synthetic = os.environ.get("KVSPEC_FUZZ_SYNTHETIC") == "1"
    src = os.environ.get("KVSPEC_FUZZ_Z3_SEEDS")
    seeds = load_seed_cases(Path(src)) if src else []
    if not synthetic:
        seeds = on_deployments([c for c in seeds if c.deployment is None], CAMPAIGN.resolver) + [
            c for c in seeds if c.deployment is not None
        ]
    yield from seeds
    yield from random_cases(
        int(os.environ.get("KVSPEC_FUZZ_SEED") or 1), **({} if synthetic else {"resolver": CAMPAIGN.resolver})
    )


def TestOneInput(data: bytes) -> None:
    global _GENERATED
    from fuzz.draw.codec import decode

    synthetic = os.environ.get("KVSPEC_FUZZ_SYNTHETIC") == "1"
    case = None
    try:
        if os.environ.get("KVSPEC_FUZZ_GENERATOR") == "random":
            limit = os.environ.get("KVSPEC_FUZZ_GENERATOR_CASES")
            if limit and CAMPAIGN.stats.cases >= int(limit):
                return  # as many cases as the random driver checked: nothing more to count
            if _GENERATED is None:
                _GENERATED = _generated_cases()
            case = next(_GENERATED)
        else:
            case = decode(data, None if synthetic else CAMPAIGN.resolver)
        CAMPAIGN.check(case)
    except Exception:  # a harness bug: record it, keep fuzzing
        from fuzz.results.findings import write_harness_error

        path = write_harness_error(case, traceback.format_exc(), CAMPAIGN.out_dir)  # case may be None
        _report("harness-error", path)
    now = time.monotonic()
    if now - _LAST_REPORT[0] > 1.0:
        _LAST_REPORT[0] = now
        s = CAMPAIGN.stats
        _report("stats", s.execs, s.unsupported, len(s.findings), s.duplicates, s.harness_errors, s.rejected, s.cases)


def main() -> None:
    _setup()
    from fuzz.driving.atheris_runner import argv_with_deadline

    deadline = CAMPAIGN.deadline
    atheris.Setup(argv_with_deadline(sys.argv, None if deadline is None else deadline - time.monotonic()), TestOneInput)
    _report("ready")  # start-up done: the runner counts the fuzzing time from here
    atheris.Fuzz()


if __name__ == "__main__":
    main()
