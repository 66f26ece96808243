"""A key never travels in clear by accident (issue 40 item 4).

``replay --server`` and ``advise --server`` with ``--api-key-env`` refuse a
plain-http URL whose host is not loopback, in one line naming ``--server``,
exit 2, before any connection (a test double for ``socket.socket`` and
``getaddrinfo`` records any attempt); https, or http to a loopback host,
go on as before (the stub server on 127.0.0.1 sees the key); so does plain
http with ``--send-key-in-clear``, the flag naming the risk. Tests send
traffic to loopback only.
"""

from __future__ import annotations

import json
import socket

import pytest

from kvspec.cli import main as kvspec
from reference.case import case_to_dict
from tests.live.stub_server import StubVllm
from tests.live.test_replay_unit import follows, predicted, repeat_case

SECRET = "sk-kvspec-transport-5e1f"

#: Hosts a key must not reach over plain http without the flag.
REMOTE = [
    "http://10.0.0.7:8000",
    "http://example.com",
    "http://[2001:db8::1]:8000",
    "http://127.0.0.1.evil.example:80",
    "http://localhost.evil.example",
    "http://0.0.0.0:8000",
    "http://user:pw@192.168.1.2:8000",
]


@pytest.fixture
def no_network(monkeypatch):
    """A test double for the socket layer: any connection attempt fails the test."""
    tried = []

    def refuse(*a, **k):
        tried.append(a)
        raise AssertionError(f"a connection was attempted: {a!r}")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return tried


def _case(tmp_path):
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case_to_dict(repeat_case())))
    return str(path)


@pytest.mark.parametrize("url", REMOTE)
@pytest.mark.parametrize("command", ["replay", "advise"])
def test_a_key_over_plain_http_to_another_host_is_refused_before_connecting(
    tmp_path, capsys, monkeypatch, no_network, url, command
):
    monkeypatch.setenv("KVSPEC_T_KEY", SECRET)
    argv = (
        ["replay", _case(tmp_path), "--server", url]
        if command == "replay"
        else ["advise", "--server", url, "--workload", "resend"]
    )
    rc = kvspec(argv + ["--api-key-env", "KVSPEC_T_KEY"])
    err = capsys.readouterr().err
    assert rc == 2 and no_network == []
    assert err.startswith("kvspec: --server=") and "in clear" in err and err.count("\n") == 1
    assert SECRET not in err and "pw@" not in err


def test_a_key_to_loopback_goes_as_before(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVSPEC_T_KEY", SECRET)
    case = repeat_case()
    with StubVllm(follows(predicted(case)), api_key=SECRET) as stub:
        rc = kvspec(
            [
                "replay",
                _case(tmp_path),
                "--server",
                stub.url.replace("127.0.0.1", "localhost"),
                "--gap",
                "0",
                "--api-key-env",
                "KVSPEC_T_KEY",
            ]
        )
        assert set(stub.seen_auth) == {f"Bearer {SECRET}"}
    assert rc == 0, capsys.readouterr().err[-300:]


def test_the_rule_itself():
    from engine_adapter.live.client import check_key_transport, is_loopback_host
    from ground.errors import InvalidArgument

    for host in ("127.0.0.1", "127.9.9.9", "::1", "[::1]", "localhost", "LOCALHOST."):
        assert is_loopback_host(host)
    for host in ("0.0.0.0", "10.0.0.1", "example.com", "localhost.evil.example", "", None):
        assert not is_loopback_host(host)
    check_key_transport("https://example.com", True)
    check_key_transport("http://example.com", False)
    check_key_transport("http://example.com", True, in_clear_ok=True)
    check_key_transport("http://[::1]:8000", True)
    with pytest.raises(InvalidArgument, match=r"^--server='http://example.com': would send the API key in clear"):
        check_key_transport("http://example.com", True)
