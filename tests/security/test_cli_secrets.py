"""A key typed on the command line by mistake is never echoed back, and no
option is read as an abbreviation of another (``--api-key X`` is not
``--api-key-env X``)."""

from __future__ import annotations

import pytest

from kvspec.cli import main, redact_values

SECRET = "sk-kvspec-test-secret-0123456789"

PROBES = [
    ["replay", "f.json", "--server", "http://127.0.0.1:9", "--api-key", SECRET],
    ["replay", "f.json", "--server", "http://127.0.0.1:9", f"--api-key={SECRET}"],
    ["replay", "f.json", "--server", "http://127.0.0.1:9", f"--api-ke={SECRET}"],
    ["advise", "--model", "qwen3_next", f"--api-ke={SECRET}"],
    ["fuzz", "--engine", "vllm==0.33.0", f"--toke={SECRET}", SECRET],
]


@pytest.mark.parametrize("argv", PROBES, ids=lambda a: " ".join(a[:1] + a[-1:]).replace(SECRET, "KEY"))
def test_a_misplaced_key_is_not_echoed(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err
    assert SECRET not in err


def test_no_abbreviation_is_read_as_another_option(capsys):
    # --api-key-e is a prefix of --api-key-env: an abbreviation argparse
    # would accept by default.
    with pytest.raises(SystemExit) as e:
        main(["replay", "f.json", "--server", "http://127.0.0.1:9", "--api-key-e", "KVSPEC_NO_SUCH_VAR"])
    assert e.value.code == 2
    assert "unrecognized arguments: --api-key-e" in capsys.readouterr().err


def test_redaction_keeps_option_names_and_drops_values():
    assert redact_values(f"--api-key={SECRET} {SECRET} -x -3") == "--api-key=... ... -x ..."


@pytest.mark.parametrize(
    "argv",
    [
        ["advise", "case.json", "--server", f"http://user:{SECRET}@127.0.0.1:9"],
        ["advise", "--model", "qwen3_next", "--server", f"https://{SECRET}@127.0.0.1:9/v1"],
    ],
    ids=["case+server", "model+server"],
)
def test_a_server_password_is_not_echoed_by_a_source_conflict(argv, capsys):
    # Two sources (a case file and --server) are one line naming both; the
    # URL's user:password@ part is masked there as in every --server error.
    assert main(argv) == 2
    got = capsys.readouterr()
    assert got.err.startswith("kvspec: source=") and got.err.count("\n") == 1
    assert SECRET not in got.err + got.out
    assert "***@127.0.0.1:9" in got.err
