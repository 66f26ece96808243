"""``make test``'s parallel run: which tests share one pytest-xdist worker
(``tests/conftest.py``), read from this session's own collection."""

from __future__ import annotations


def test_the_live_server_and_build_tests_each_stay_in_one_group(request):
    items = request.session.items
    groups = {item.nodeid: (m.args[0] if (m := item.get_closest_marker("xdist_group")) else None) for item in items}
    live = [item.nodeid for item in items if "live_servers" in item.fixturenames]
    builds = [item.nodeid for item in items if item.path.parent.name == "mutate" or item.path.name in ("test_patched_engines.py", "test_builds.py", "test_environments.py")]
    assert all(groups[n] == "live-server" for n in live)
    assert all(groups[n] == "builds" for n in builds if n not in live)
    assert all(groups[n] is None for n in groups if n not in live and n not in builds)
