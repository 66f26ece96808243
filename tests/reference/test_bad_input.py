"""Bad input never gives a traceback, a hang or unbounded memory (issue 10,
point 6): one test per defect found by trying 441 malformed case files and
options, plus a property-based test of the loader over generated malformed
documents.

Every refusal is exactly one line ``kvspec: FIELD=VALUE: rule`` (or
``FIELD: missing; ...``) on stderr and exit status 2.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from ground.errors import InvalidArgument
from ground.files import MAX_FILE_BYTES
from kvspec.cli import EXIT_BROKEN_PIPE, main
from reference.case import MAX_CASE_TOKENS, MAX_PROMPT_TOKENS, MAX_REQUESTS, load_case
from tests.conftest import hybrid

REPO = Path(__file__).resolve().parents[2]
GOOD = {
    "schema": 1,
    "name": "ok",
    "geometry": hybrid(16, 16, 1),
    "trace": [
        {"prompt": [{"segment": "A", "length": 40}], "max_tokens": 1},
        {"prompt": [{"segment": "A", "length": 40}]},
    ],
}
#: One line naming a field: ``kvspec: FIELD=VALUE: ...`` or ``kvspec: FIELD: missing; ...``.
ONE_LINE = re.compile(r"^kvspec: [^\n=]+?(=[^\n]*|: missing[^\n]*)\n$")


def run_cli(argv: list[str]) -> tuple[int, str, str, float]:
    """kvspec in-process: (exit status, stdout, stderr, seconds)."""
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue(), time.perf_counter() - t0


def refused(argv: list[str], field: str | None = None, within_s: float = 10.0) -> str:
    rc, out, err, took = run_cli(argv)
    assert rc == 2, (rc, out[:200], err)
    assert ONE_LINE.match(err), err
    assert "Traceback" not in err
    assert took < within_s, took
    if field is not None:
        assert err.startswith(f"kvspec: {field}"), err
    return err


def write_bytes(tmp_path: Path, data: bytes, name: str = "case.json") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def write_doc(tmp_path: Path, doc) -> str:
    return write_bytes(tmp_path, json.dumps(doc).encode())


def mutated(path: list, value) -> dict:
    raw = json.loads(json.dumps(GOOD))
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return raw


# ---------------------------------------------------------------- bytes


@pytest.mark.parametrize(
    "data, says",
    [
        (json.dumps(GOOD).encode("utf-16"), "UTF-16 byte-order mark"),
        (json.dumps(GOOD).encode("utf-16-le"), "NUL byte"),  # UTF-16 without a mark
        (json.dumps(GOOD).encode("utf-32"), "UTF-32 byte-order mark"),
        (b"\xef\xbb\xbf" + json.dumps(GOOD).encode(), "UTF-8 byte-order mark"),
        (b'{"schema": 1, "name": "\xc3\x28"}', "is not UTF-8 (byte 0xc3 at offset 23"),
        (b'{"schema": 1, "name": "\xed\xa0\x80"}', "is not UTF-8"),  # an encoded surrogate
        (bytes(range(256)) * 4, "NUL byte"),
        (b"\x89PNG\r\n\x1a\n\xff\xfe\xfd", "is not UTF-8"),
        (b"", "is not valid JSON"),
    ],
)
def test_binary_utf16_and_invalid_utf8_files(tmp_path, data, says):
    err = refused(["predict", write_bytes(tmp_path, data)], "case file=")
    assert says in err


def test_deeply_nested_json(tmp_path):
    err = refused(["predict", write_bytes(tmp_path, b"[" * 100_000 + b"]" * 100_000)], "case file=")
    assert "nested too deeply; allowed: at most 64 levels" in err
    # within Python's recursion limit but beyond kvspec's: names where
    doc = mutated(["name"], json.loads("[" * 70 + "]" * 70))
    err = refused(["predict", write_doc(tmp_path, doc)], "name[0][0]")
    assert "nested too deeply" in err


@pytest.mark.parametrize("digits", [21, 4300, 4301, 100_000])
def test_huge_integer_literal_names_its_field(tmp_path, digits):
    text = json.dumps(GOOD).replace('"length": 40}], "max_tokens"', '"length": ' + "9" * digits + '}], "max_tokens"', 1)
    err = refused(["predict", write_bytes(tmp_path, text.encode())], "trace[0].prompt[0].length=")
    assert "too many digits" in err and len(err) < 400


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_nan_and_infinity_are_not_json(tmp_path, token):
    text = json.dumps(GOOD).replace('"max_tokens": 1', f'"max_tokens": {token}', 1)
    refused(["predict", write_bytes(tmp_path, text.encode())], "trace[0].max_tokens=")


@pytest.mark.timeout(30)
def test_special_files_are_refused_before_they_are_opened(tmp_path):
    refused(["predict", "/dev/zero"], "case file='/dev/zero': is a character device")
    fifo = tmp_path / "case.fifo"
    os.mkfifo(fifo)
    refused(["predict", str(fifo)], f"case file='{fifo}': is a FIFO", within_s=5)  # an open() would block forever
    refused(["predict", str(tmp_path)], f"case file='{tmp_path}': is a folder")
    refused(["predict", str(tmp_path / "missing.json")], "case file=")
    refused(["predict", str(tmp_path / "a\x00b.json")], "case file=")


def test_oversized_file(tmp_path):
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk, no memory
    err = refused(["predict", str(path)], "case file=")
    assert f"is {MAX_FILE_BYTES + 1:,} bytes" in err


def test_a_finding_file_goes_through_the_same_reader(tmp_path):
    path = write_bytes(tmp_path, json.dumps({"case": GOOD}).encode("utf-16"), "finding.json")
    with pytest.raises(InvalidArgument, match="UTF-16 byte-order mark"):
        load_case(path)


# ---------------------------------------------------------------- limits


@pytest.mark.parametrize(
    "path, value, field",
    [
        (["schema"], True, "schema=True"),
        (["schema"], 1.0, "schema=1.0"),
        (["schema"], "1", "schema='1'"),
        (
            ["geometry", "groups", 0, "block_size"],
            2**63,
            "geometry.groups[0].block_size=9223372036854775808: must be an integer in [1, 1,048,576]",
        ),
        (["geometry", "groups", 0, "count"], 10**6, "geometry.groups[0].count=1000000"),
        (["geometry", "groups"], [{"kind": "mamba", "block_size": 16}] * 257, "geometry.groups='<257 groups>'"),
        (
            ["geometry", "groups"],
            [
                {"kind": "mamba", "block_size": 16, "count": 200},
                {"kind": "full_attention", "block_size": 16, "count": 100},
            ],
            "geometry.groups[1].count=100: at most 256",
        ),
        (
            ["geometry", "groups"],
            [{"kind": "mamba", "block_size": 1048573}, {"kind": "full_attention", "block_size": 1048571}],
            "geometry.groups=[1048571, 1048573]: the LCM",
        ),
        (["geometry", "retention_interval"], 2**63, "geometry.retention_interval="),
        (["geometry", "max_num_batched_tokens"], 2**63, "geometry.max_num_batched_tokens="),
        (["geometry", "hash_block_size"], 2**40, "geometry.hash_block_size="),
        (["geometry", "scheduler_block_size"], 2**40, "geometry.scheduler_block_size="),
        (["speculative"], {"method": "mtp", "num_speculative_tokens": 10**6}, "speculative.num_speculative_tokens="),
        (
            ["trace", 0, "prompt", 0, "length"],
            10**9,
            "trace[0].prompt[0].length=1000000000: must be an integer in [1, 1,048,576]",
        ),
        (["trace", 0, "prompt", 0, "length"], 2**63, "trace[0].prompt[0].length="),
        (
            ["trace", 0, "prompt"],
            [{"segment": "A", "length": MAX_PROMPT_TOKENS}, {"segment": "B", "length": 1}],
            "trace[0].prompt='<1,048,577+ tokens>'",
        ),
        (["trace", 0, "prompt"], [{"segment": "A", "length": 1}] * 257, "trace[0].prompt='<257 segments>'"),
        (["trace", 0, "max_tokens"], 2**63, "trace[0].max_tokens="),
        (["trace", 0, "max_tokens"], True, "trace[0].max_tokens=True"),
        (
            ["trace"],
            [{"prompt": [{"segment": f"S{i}", "length": 1}]} for i in range(MAX_REQUESTS + 1)],
            "trace='<1001 requests>'",
        ),
        (
            ["trace"],
            [{"prompt": [{"segment": "A", "length": MAX_PROMPT_TOKENS}]}] * 5,
            "trace[4]='<5,242,880 prompt tokens so far>'",
        ),
        (["geometry", "groups", 0, "kind"], ["mamba"], "geometry.groups[0].kind=['mamba']"),
        (["speculative"], {"method": {"x": 1}, "num_speculative_tokens": 1}, "speculative.method={'x': 1}"),
    ],
)
def test_limits_name_the_field_and_the_range(tmp_path, path, value, field):
    refused(["predict", write_doc(tmp_path, mutated(path, value))], field, within_s=5)


def test_ten_thousand_requests_are_refused_at_once(tmp_path):
    doc = mutated(["trace"], [{"prompt": [{"segment": "A", "length": 100 + i}]} for i in range(10_000)])
    refused(
        ["predict", write_doc(tmp_path, doc)], "trace='<10000 requests>': at most 1,000 requests per case", within_s=3
    )


def test_the_limits_themselves_are_accepted(tmp_path):
    """At the limits (not above): a full case answers in seconds."""
    per = MAX_CASE_TOKENS // 4
    doc = mutated(["trace"], [{"prompt": [{"segment": "A", "length": per}]}] * 4)
    rc, out, err, took = run_cli(["predict", write_doc(tmp_path, doc)])
    assert rc == 0, err
    assert json.loads(out)["queries"] == [per] * 4
    assert took < 30


def test_unknown_key_with_a_line_break_stays_one_line(tmp_path):
    doc = dict(GOOD, **{"bad\nkey": 1})
    err = refused(["predict", write_doc(tmp_path, doc)], "case.'bad\\nkey'=1: unknown field")
    assert err.count("\n") == 1


# ---------------------------------------------------------------- options and pipes


def test_predict_into_a_closed_pipe_exits_quietly():
    read_end, write_end = os.pipe()
    os.close(read_end)  # like `| head -1` once head has exited
    try:
        p = subprocess.run(
            [sys.executable, "-m", "kvspec.cli", "predict", "examples/seed-53504.json"],
            cwd=REPO,
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert p.returncode == EXIT_BROKEN_PIPE == 141
    assert p.stderr == b""


def test_predict_piped_into_head_shows_no_traceback():
    p = subprocess.run(
        f"{sys.executable} -m kvspec.cli predict examples/seed-53504.json | head -c 1 >/dev/null; echo ${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        cwd=REPO,
        capture_output=True,
        timeout=120,
    )
    assert p.stderr == b""
    assert p.stdout.strip() in (b"0", b"141")  # 0 if it all fit in the pipe before head left


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-5", "0", "1e308"])
def test_run_timeout_must_be_a_finite_positive_number(tmp_path, value):
    refused(["run", write_doc(tmp_path, GOOD), f"--timeout={value}"], "--timeout=")


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--timeout", "-5"], "--timeout=-5"),
        (["--timeout", "0"], "--timeout=0"),
        (["--jobs", "0"], "--jobs=0"),
        (["--jobs", "-1"], "--jobs=-1"),
        (["--seed", "-1"], "--seed=-1"),
    ],
)
def test_prove_options(argv, field):
    refused(["prove", "--only", "no-such-row", *argv], field)


def test_prove_out_must_be_a_writable_folder(tmp_path):
    afile = tmp_path / "f"
    afile.write_text("x")
    refused(["prove", "--only", "no-such-row", "--out", str(afile)], "--out=")
    refused(["prove", "--only", "no-such-row", "--out", str(afile / "sub")], "--out=")


def test_matrix_chart_path_is_checked_before_any_engine(tmp_path):
    afile = tmp_path / "f"
    afile.write_text("x")
    refused(
        ["matrix", write_doc(tmp_path, GOOD), "--engine", "vllm==0.33.0", "--chart", str(afile / "chart.png")],
        "--chart=",
    )
    refused(["matrix", write_doc(tmp_path, GOOD), "--engine", "vllm==0.33.0", "--chart", str(tmp_path)], "--chart=")


# ---------------------------------------------------------------- property


def _set_at(doc, rnd: st.DataObject, value):
    """Replace a random node of ``doc`` (a JSON tree) with ``value``."""
    node = doc
    while True:
        keys = list(node.keys()) if isinstance(node, dict) else list(range(len(node))) if isinstance(node, list) else []
        if not keys:
            return value
        key = rnd.draw(st.sampled_from(keys))
        child = node[key]
        if not isinstance(child, (dict, list)) or rnd.draw(st.booleans()):
            node[key] = value
            return doc
        node = child


def _delete_at(doc, rnd: st.DataObject):
    node = doc
    while True:
        keys = list(node.keys()) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            return doc
        key = rnd.draw(st.sampled_from(keys))
        child = node[key]
        if not isinstance(child, (dict, list)) or not child or rnd.draw(st.booleans()):
            del node[key]
            return doc
        node = child


WRONG = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 2**63, 2**63 - 1, -(2**63), 10**25, MAX_PROMPT_TOKENS + 1]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=8), st.integers(), max_size=3),
    st.integers(65, 300).map(lambda d: json.loads("[" * d + "]" * d)),
)


@st.composite
def malformed(draw) -> bytes:
    rnd = draw(st.data())
    kind = draw(st.sampled_from(["set", "set", "delete", "add", "text", "bytes", "encode", "truncate", "flip"]))
    doc = json.loads(json.dumps(GOOD))
    if kind == "set":
        doc = _set_at(doc, rnd, draw(WRONG))
    elif kind == "delete":
        doc = _delete_at(doc, rnd)
    elif kind == "add":
        doc[draw(st.text(min_size=1, max_size=20))] = draw(WRONG)
    text = json.dumps(doc, allow_nan=True)
    if kind == "text":
        pos = draw(st.integers(0, len(text)))
        text = (
            text[:pos]
            + draw(st.sampled_from(["NaN", "1" * 5000, "[" * 2000, "}", '"\\ud800"', "-", "1e99999", "\u2028"]))
            + text[pos:]
        )
    data = text.encode()
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "encode":
        return text.encode(
            draw(st.sampled_from(["utf-16", "utf-16-be", "utf-32", "utf-8-sig", "latin-1"])), errors="replace"
        ) + (b"\xe9" if draw(st.booleans()) else b"")
    if kind == "truncate":
        return data[: draw(st.integers(0, max(0, len(data) - 1)))]
    if kind == "flip":
        pos = draw(st.integers(0, len(data) - 1))
        return data[:pos] + bytes([draw(st.integers(0, 255))]) + data[pos + 1 :]
    return data


@seed(20261130)
@settings(max_examples=400, deadline=None, derandomize=False, suppress_health_check=list(HealthCheck), database=None)
@given(malformed())
def test_the_loader_refuses_malformed_documents_with_one_line(tmp_path_factory, data):
    """Any document: exit 2 with exactly one line naming a field (never a
    traceback), or 0 with the documented output when the mutation left a
    valid case; either way within seconds."""
    path = write_bytes(tmp_path_factory.mktemp("m"), data)
    rc, out, err, took = run_cli(["predict", path])
    assert took < 10, took
    assert "Traceback" not in err
    if rc == 0:
        assert err == "" and set(json.loads(out)) >= {"hits", "queries"}
    else:
        assert rc == 2, (rc, err)
        assert ONE_LINE.match(err), err
        assert len(err) < 600, err
