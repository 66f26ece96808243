"""Shared fixtures and the two tiers of ``pytest spec/``.

By default only the fast tier runs (seconds): tests marked ``slow`` (the
slow proof rows, the larger fidelity domain, the full sweep) are deselected
unless ``--slow`` is given. An explicit marker expression that names
``slow`` (``-m slow``, ``-m "not slow"``) decides by itself, as before.

The proof rows selected for this session are solved once, in parallel (one
process per CPU), and each row's test reads its result."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spec.catalogue import Result, run_rows

HERE = Path(__file__).resolve().parent


def pytest_addoption(parser) -> None:
    try:
        parser.addoption(
            "--slow",
            action="store_true",
            default=False,
            help="spec/: also run the slow tier (slow proof rows, the larger fidelity domain, the full sweep)",
        )
    except ValueError:  # another conftest or plugin already defines --slow
        pass
    parser.addoption(
        "--shard",
        default="0/1",
        metavar="K/N",
        help="spec/'s slow fidelity tests: run every N-th task of each from the K-th (0 <= K < N <= 64); default 0/1, all",
    )


def parse_shard(text: str) -> tuple[int, int]:
    """``K/N`` with 0 <= K < N <= 64; UsageError naming the option otherwise."""
    k, sep, n = text.partition("/")
    if sep and k.isdigit() and n.isdigit() and 0 <= int(k) < int(n) <= 64:
        return int(k), int(n)
    raise pytest.UsageError(f"--shard={text!r}: K/N with 0 <= K < N <= 64 (0/1: every task)")


def pytest_configure(config) -> None:
    """The default tier runs in one process (``spec.parallel.DEFAULT_JOBS``;
    ``$KVSPEC_JOBS`` still decides when set). A run of spec/ alone does
    without the Hypothesis plugin (no test here uses Hypothesis): at the end
    of every session it imports Hypothesis, about a second with assertion
    rewriting when bytecode is not cached (PYTHONDONTWRITEBYTECODE), a tenth
    of the default tier."""
    from spec import parallel

    parallel.SHARD = parse_shard(config.getoption("--shard", default="0/1"))
    if not slow_tier(config):
        parallel.DEFAULT_JOBS = 1  # a few seconds of work: no process pool
    paths = [Path(str(a).split("::")[0]).resolve() for a in config.args]
    if paths and all(p == HERE or HERE in p.parents for p in paths):
        plugin = config.pluginmanager.get_plugin("hypothesispytest")
        if plugin is not None:
            config.pluginmanager.unregister(plugin)


def slow_tier(config) -> bool:
    """Did the command line ask for the slow tier (``--slow``, or a marker
    expression naming ``slow``)?"""
    return bool(
        config.getoption("--slow", default=False) or re.search(r"\bslow\b", config.getoption("markexpr", "") or "")
    )


def pytest_generate_tests(metafunc) -> None:
    """The slow proof rows (``slow_row``) become test items only when the
    slow tier is asked for: collecting a thousand items just to deselect them
    would cost the default run a couple of seconds."""
    if "slow_row" in metafunc.fixturenames:
        from spec.catalogue import rows

        todo = [r for r in rows("all") if r.slow] if slow_tier(metafunc.config) else []
        metafunc.parametrize("slow_row", todo, ids=lambda r: r.id)


def pytest_collection_modifyitems(config, items) -> None:
    """Deselect spec/'s slow tests unless the slow tier is asked for (other
    folders are left alone)."""
    if slow_tier(config):
        return
    keep, slow = [], []
    for item in items:
        in_spec = HERE in Path(str(item.fspath)).resolve().parents
        (slow if in_spec and item.get_closest_marker("slow") is not None else keep).append(item)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = keep


def _selected_rows(session, fixture: str):
    rows = []
    for item in session.items:
        if fixture in getattr(item, "fixturenames", ()) and hasattr(item, "callspec"):
            row = item.callspec.params.get("row", item.callspec.params.get("slow_row"))
            if row is not None:
                rows.append(row)
    return list(dict.fromkeys(rows))


def _results(request, fixture: str) -> dict[str, Result]:
    rows = _selected_rows(request.session, fixture)
    return {r.row.id: r for r in run_rows(rows)}


@pytest.fixture(scope="session")
def proof_results(request) -> dict[str, Result]:
    return _results(request, "proof_results")


@pytest.fixture(scope="session")
def slow_proof_results(request) -> dict[str, Result]:
    return _results(request, "slow_proof_results")
