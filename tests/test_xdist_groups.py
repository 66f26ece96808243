"""``make test``'s parallel run: which tests share one pytest-xdist worker
(``tests/conftest.py``), read from this session's own collection, and
whether ``--dist loadgroup`` really keeps a group on one worker."""

from __future__ import annotations

import re
import subprocess
import sys

from ground.home import REPO_ROOT
from tests.conftest import SGLANG_ENGINE_TESTS


def test_the_live_server_and_build_tests_each_stay_in_one_group(request):
    """The live server's tests and every user of the session's in-process
    0.32.0 engine in one group; the builds in another; SGLang's engine tests
    (one SGLang worker per module, started once) in a third; nothing else grouped."""
    items = request.session.items
    groups = {item.nodeid: (m.args[0] if (m := item.get_closest_marker("xdist_group")) else None) for item in items}
    live = [item.nodeid for item in items if {"live_servers", "engine_032"} & set(item.fixturenames)]
    builds = [
        item.nodeid
        for item in items
        if item.path.parent.name == "mutate"
        or item.path.name
        in ("test_patched_engines.py", "test_planted_faults.py", "test_builds.py", "test_environments.py")
    ]
    assert all(groups[n] == "live-server" for n in live)
    assert all(groups[n] == "builds" for n in builds if n not in live)
    sglang = [item.nodeid for item in items if item.path.name in SGLANG_ENGINE_TESTS]  # SGLang's worker and builds
    assert all(groups[n] == "sglang" for n in sglang)
    assert all(groups[n] is None for n in groups if n not in live and n not in builds and groups[n] != "sglang")
    assert all("sglang" in n.split("::")[0] for n in groups if groups[n] == "sglang")
    if getattr(request.config.option, "loadgroup", False):
        # On an xdist worker under --dist loadgroup: the scheduler groups by
        # the "@<group>" suffix of the node id, not by the mark.
        assert all(n.endswith(f"@{g}") for n, g in groups.items() if g is not None), [
            n for n, g in groups.items() if g and not n.endswith(f"@{g}")
        ][:3]


def test_loadgroup_runs_a_group_on_one_worker():
    """Four quick tests of the "builds" group and two ungrouped ones on two
    workers: the four run on one worker. (With pytest 9.2, pytest-xdist
    3.8's own group suffix was lost and they spread over both.)"""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-v",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "tests/engine/test_builds.py",
            "tests/reference/test_token_draw.py",
            "-k",
            "malformed or rejections or the_check_can_fail",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ran = re.findall(r"^\[(gw\d)\] .*?PASSED (\S+)", proc.stdout, re.M)
    grouped = {w for w, nodeid in ran if "test_builds.py" in nodeid}
    assert (
        len([n for _w, n in ran if "test_builds.py" in n]) == 4
        and len([n for _w, n in ran if "test_token_draw.py" in n]) == 2
    ), ran
    assert len(grouped) == 1, ran
