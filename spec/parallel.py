"""A process pool for independent solver calls (z3 work is CPU-bound and
its Python API holds the GIL). Results must pickle (verdicts, numbers,
cases, never z3 objects).

Workers come from a fork server that has only imported ``spec`` (never run
a solver): forking a process that has used z3 can deadlock the child on a
lock held by z3's timeout timer thread."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")
R_ = TypeVar("R_")

#: No single batch of proofs takes this long; a hung worker fails instead.
POOL_TIMEOUT_S = 900
_PRELOAD = ["spec.catalogue", "spec.sweep", "spec.seeds", "spec.fidelity", "spec.minimal"]


def cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _context():
    try:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        return ctx
    except ValueError:  # pragma: no cover - no fork server on this platform
        return multiprocessing.get_context("spawn")


#: Processes when neither the caller nor ``$KVSPEC_JOBS`` says (None: the
#: CPUs). ``spec/conftest.py`` sets 1 for the default tier of ``pytest
#: spec/``: for its ~6 s of CPU a pool (forkserver start, preloaded imports)
#: gains little at moderate load and loses under heavy load on a shared
#: 2-core machine (``bench/spec.py`` times both side by side).
DEFAULT_JOBS: int | None = None


#: The share of each slow task list a session runs: every N-th task from
#: the K-th (``pytest spec/ --shard K/N``, set by ``spec/conftest.py``);
#: (0, 1), the default: every task. ``make test`` runs one quarter, chosen
#: by the commit; ``make test-slow`` all.
SHARD: tuple[int, int] = (0, 1)


def sharded(tasks: Iterable[T]) -> list[T]:
    """This session's share of ``tasks`` (:data:`SHARD`)."""
    k, n = SHARD
    return list(tasks)[k::n]


def pmap(fn: Callable[[T], R_], items: Iterable[T], jobs: int | None = None, chunksize: int = 2) -> list[R_]:
    """``[fn(x) for x in items]``, in ``jobs`` processes (default:
    ``$KVSPEC_JOBS``, else ``DEFAULT_JOBS``, else the CPUs, at most 8);
    in-process for one job or a handful of items."""
    items = list(items)
    jobs = min(jobs or int(os.environ.get("KVSPEC_JOBS", 0) or DEFAULT_JOBS or cpus()), 8)
    if jobs <= 1 or len(items) < 4:
        return [fn(x) for x in items]
    with _context().Pool(jobs) as pool:
        return pool.map_async(fn, items, chunksize=chunksize).get(POOL_TIMEOUT_S)
