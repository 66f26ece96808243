"""Reports and terminal output from a stranger's finding (issue 29).

A generated corpus of hostile findings: each payload (a closing ``\"\"\"`` or
``'''`` followed by code that would write a marker file, a line break then
code, a closing code fence, ``ESC [2J``, an OSC 8 hyperlink, bidi overrides,
``/``, ``..``, NUL, an HTML comment) is put in each string field of a
finding that kvspec reads. For each one ``kvspec report``:

* refuses a malformed checked field (signature, oracle, engine version) in
  one line, exit 2, writing nothing;
* or writes a bundle whose Python files compile and whose top level runs
  (torch and vLLM replaced by a test double module) without the payload's
  side effect; whose ISSUE.md holds no control character and has the same
  headings and code fences as the report of the same finding without the
  payload (the text cannot add a line, a heading or close a fence); and
  nothing is written outside ``--out``.

``kvspec findings`` and ``fuzz.results.findings.render`` print the same findings
without a control character. A finding with ``observed``/``expected``
missing, null or ``[]``, or an engine without a version is one line, exit
2. A full or read-only disk (a test double for the atomic writer raising
``ENOSPC`` / ``EROFS``) is one line, exit 2, and leaves no half-written
folder (an earlier report stays whole).
"""

from __future__ import annotations

import copy
import errno
import json
import re
import sys
import types
from pathlib import Path

import pytest

import ground.files
from fuzz.results.findings import render
from kvspec.cli import main as kvspec

ROOT = Path(__file__).resolve().parents[2]
BASE = json.loads((ROOT / "tests/engine/data/finding-longer-sibling-qwen3-next.json").read_text())

#: Characters no terminal line or report may hold (``\n`` separates lines).
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def payloads(marker: Path) -> dict[str, str]:
    """{name: hostile text}; the code ones write ``marker`` when run."""
    code = f"open({str(marker)!r}, 'w').write('ran')"
    return {
        "triple-double": f'x"""\n{code}\n"""',
        "triple-single": f"x'''\n{code}\n'''",
        "newline-code": f"x\n{code}\n# ",
        "fence": f"```\n{code}\n```\n# Injected heading",
        "clear-screen": "\x1b[2J\x1b[Hgone",
        "osc8": "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\",
        "bidi": "a\u202eevil\u2066b\u2069\u202c",
        "c1-csi": "x\x9b31mred\r\x08",
        "slash": "a/b",
        "dotdot": "../../escape",
        "nul": "a\x00b",
        "html": "<!-- hidden\n## Fake section",
    }


def _set(path: str, value):
    """A setter of one field of a finding (dotted path; ``[]`` appends)."""

    def apply(f: dict) -> None:
        *parents, last = path.split(".")
        node = f
        for p in parents:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        if last.endswith("[]"):
            node.setdefault(last[:-2], []).append(value)
        else:
            node[last] = value

    return apply


#: Fields kvspec checks: a payload there is refused (one line, exit 2).
CHECKED = ("signature", "oracle", "engine.version")
#: Free-text fields: a payload there is written, escaped (exit 0).
FREE = (
    "summary",
    "expected.detail",
    "observed.error",
    "case_kind",
    "reachability",
    "resolution.assumptions[]",
    "case.name",
    "engine.name",
    "harness.platform",
    "kvspec.commit",
)
#: Fields of the case's deployment: a payload there is written escaped, or
#: refused by the case's own rules (NUL, a model name) in one line.
DEPLOYMENT = ("case.deployment.model", "case.deployment.vllm_args[]", "case.deployment.device")


def _hostile(place: str, text: str, *, classified: bool = True) -> dict:
    f = copy.deepcopy(BASE)
    if place == "observed.error":
        f["observed"]["error"] = {"type": text, "message": text}
    elif place == "case.deployment.model":
        f["case"]["deployment"]["model"] = "/models/" + text
    else:
        _set(place, text)(f)
    if not classified:  # no known class: the summary is the title
        f["oracle"] = "reference"
    return f


class _Stub(types.ModuleType):
    """A test double for torch and vLLM's modules: any attribute is another
    stub, so a generated test's top level imports without them."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub(f"{self.__name__}.{name}")


def _run_top_level(path: Path, monkeypatch) -> None:
    """Execute a generated module's top level (definitions only; no test
    function is called), torch and vLLM stubbed."""
    import ast

    source = path.read_text()
    tree = ast.parse(source)
    names = set()
    for node in ast.walk(tree):
        mods = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module]
            if isinstance(node, ast.ImportFrom) and node.module
            else []
        )
        for m in mods:
            if m.split(".")[0] in ("torch", "vllm"):
                parts = m.split(".")
                names.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    with monkeypatch.context() as m:
        for name in names:
            m.setitem(sys.modules, name, _Stub(name))
        exec(compile(source, str(path), "exec"), {"__name__": "kvspec_generated", "__file__": str(path)})


def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def _structure(issue: str) -> list[str]:
    """ISSUE.md's headings (their level, and kvspec's own section names)
    and fence lines, in order."""
    return [
        line if line.startswith("##") else re.match(r"^(#+|`{3,}\w*)", line).group(1)
        for line in issue.splitlines()
        if line.startswith("#") or line.startswith("```")
    ]


def _prose(issue: str) -> str:
    """ISSUE.md without its fenced blocks and code spans (where ``<`` is text)."""
    out, fence = [], None
    for line in issue.splitlines():
        m = re.match(r"^(`{3,})", line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and line.strip() == fence:
            fence = None
        elif fence is None:
            out.append(re.sub(r"(`+)(.+?)\1(?!`)", "", line))
    return "\n".join(out)


def _report(tmp_path: Path, finding: dict, capsys, name: str = "finding.json"):
    src = tmp_path / "in"
    src.mkdir(exist_ok=True)
    path = src / name
    path.write_text(json.dumps(finding))
    out = tmp_path / "out"
    before = _tree(tmp_path)
    code = kvspec(["report", str(path), "--out", str(out)])
    got = capsys.readouterr()
    assert "Traceback" not in got.out + got.err
    return code, got, out, _tree(tmp_path) - before


@pytest.fixture(scope="module")
def benign_structure(tmp_path_factory):
    from fuzz.results.report import bundle

    return {cls: _structure(bundle(_hostile("summary", "benign", classified=cls))["ISSUE.md"]) for cls in (True, False)}


CORPUS = [(place, name, True) for place in CHECKED + FREE + DEPLOYMENT for name in payloads(Path("m"))] + [
    ("summary", name, False) for name in payloads(Path("m"))
]


@pytest.mark.parametrize("place, payload, classified", CORPUS)
def test_a_hostile_field_is_refused_or_written_escaped(
    tmp_path, capsys, monkeypatch, benign_structure, place, payload, classified
):
    marker = tmp_path / "MARKER"
    text = payloads(marker)[payload]
    code, got, out, new = _report(tmp_path, _hostile(place, text, classified=classified), capsys)
    if place in CHECKED:
        assert code == 2
    elif place in FREE:
        assert code == 0, got.err
    if code == 2:
        assert got.err.startswith("kvspec: ") and got.err.count("\n") == 1 and got.out == ""
        assert new == set(), "a refused finding writes nothing"
        return
    assert code == 0, got.err
    assert new == {"out", *(f"out/{n}" for n in json.loads(got.out)["files"])}, "nothing outside --out"
    tests = sorted(out.glob("test_*.py"))
    assert tests, "the deployment finding has a regression test"
    for py in tests:
        compile(py.read_text(), str(py), "exec")
        _run_top_level(py, monkeypatch)
    assert not marker.exists(), "the payload's code ran"
    issue = (out / "ISSUE.md").read_text()
    assert not CONTROL.search(issue), repr(CONTROL.search(issue).group())
    assert _structure(issue) == benign_structure[classified]
    assert "<!--" not in _prose(issue), "an HTML comment would hide the rest of the issue"


def test_the_hostile_summary_is_a_literal_of_the_test(tmp_path, capsys):
    """The unclassified finding's summary is the test's TITLE, read back equal
    to the finding's summary without control characters."""
    from ground.printable import printable

    text = payloads(tmp_path / "MARKER")["triple-double"]
    code, got, out, _ = _report(tmp_path, _hostile("summary", text, classified=False), capsys)
    assert code == 0, got.err
    (py,) = out.glob("test_*.py")
    assert py.name == f"test_reference_{BASE['signature']}.py"
    namespace: dict = {}
    titles = [line for line in py.read_text().splitlines() if line.startswith("TITLE = ")]
    exec(titles[0], namespace)  # one line: a literal
    assert namespace["TITLE"] == printable(text)


# ------------------------------------------------------------ kvspec findings / render


def test_kvspec_findings_and_render_print_no_control_character(tmp_path, capsys):
    texts = payloads(tmp_path / "MARKER")
    folder = tmp_path / "findings"
    folder.mkdir()
    for i, (name, text) in enumerate(texts.items()):
        for place in ("summary", "expected.detail", "observed.error", "oracle"):
            f = _hostile(place, text)
            if place == "observed.error":
                f["oracle"] = "engine_error"
            (folder / f"{i}-{place}.json").write_text(json.dumps(f))
            if place != "oracle":
                lines = render(f).split("\n")
                assert not any(CONTROL.search(line) for line in lines), (name, place)
                assert len(lines) == len(render(_hostile(place, "plain")).split("\n")), (name, place)
    (folder / "name-\x1b[2J-\u202e.json").write_text("{not json")  # a hostile file name, listed as malformed
    assert kvspec(["findings", str(folder)]) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    assert out.out.strip() and not CONTROL.search(out.out), repr(CONTROL.search(out.out).group())
    assert "malformed file(s)" in out.out


# ------------------------------------------------------------ malformed findings


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("observed", None, "kvspec: observed=None: must be an object with 'hits'"),
        ("observed", [], "kvspec: observed=[]: must be an object with 'hits'"),
        ("expected", None, "kvspec: expected=None: must be an object with 'hits'"),
        ("expected", KeyError, "kvspec: expected: missing; required field"),
        ("observed", {"hits": None}, "kvspec: observed.hits=None: must be a list of hit counts"),
        ("expected", {"hits": [0, "544"]}, "kvspec: expected.hits=[0, '544']: must be a list of hit counts"),
        ("engine", "vllm", "kvspec: engine='vllm': must be an object whose version is an engine version"),
        ("engine", {"name": "vllm"}, "kvspec: engine={'name': 'vllm'}: must be an object whose version"),
        ("signature", KeyError, "kvspec: signature=None: must be 6 to 64 lowercase hex digits"),
        ("signature", "5f328a45/../x", "kvspec: signature='5f328a45/../x': must be 6 to 64 lowercase hex digits"),
        ("first_divergence", "1", "kvspec: first_divergence='1': must be a request index"),
        ("first_divergence", 10**9, "kvspec: first_divergence=1000000000: must be a request index (an integer in [0, "),
        ("diverging_requests", [10**9], "kvspec: diverging_requests=[1000000000]: must be a list of request indices"),
        ("expected", "MORE_HITS_THAN_REQUESTS", "kvspec: expected.hits="),
        ("diverging_requests", None, "kvspec: diverging_requests=None: must be a list of request indices"),
        ("summary", ["x"], "kvspec: summary=['x']: must be a string or absent"),
        ("resolution", {"assumptions": "x"}, "kvspec: resolution.assumptions='x': must be a list of strings"),
    ],
)
def test_a_malformed_finding_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, field, value, message):
    f = copy.deepcopy(BASE)
    if value is KeyError:
        del f[field]
    elif value == "MORE_HITS_THAN_REQUESTS":  # a hit count for a request the trace does not have
        f[field]["hits"] = [0] * (len(f["case"]["trace"]) + 1)
    else:
        f[field] = value
    code, got, out, new = _report(tmp_path, f, capsys)
    assert code == 2 and got.err.startswith(message), got.err
    assert got.err.count("\n") == 1 and got.out == ""
    assert new == set()


def test_the_default_out_is_beside_the_finding_and_named_by_its_checked_signature(tmp_path, capsys):
    path = tmp_path / "f.json"
    path.write_text(json.dumps(BASE))
    assert kvspec(["report", str(path)]) == 0, capsys.readouterr().err
    assert (tmp_path / f"report-{BASE['signature']}" / "ISSUE.md").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json", f"report-{BASE['signature']}"]


# ------------------------------------------------------------ full and read-only disks


def _failing_writer(err: int, after: int):
    """A test double for ground.files.write_bytes_atomic: writes ``after``
    files, then raises OSError(err) as a full or read-only disk does."""
    real = ground.files.write_bytes_atomic
    calls = []

    def write(path, data):
        calls.append(path)
        if len(calls) > after:
            raise OSError(err, __import__("os").strerror(err))
        real(path, data)

    return write


@pytest.mark.parametrize("err, after", [(errno.ENOSPC, 0), (errno.ENOSPC, 2), (errno.EROFS, 0)])
def test_a_full_or_read_only_disk_is_one_line_and_no_half_written_folder(tmp_path, capsys, monkeypatch, err, after):
    monkeypatch.setattr(ground.files, "write_bytes_atomic", _failing_writer(err, after))
    code, got, out, new = _report(tmp_path, BASE, capsys)
    assert code == 2
    assert (
        got.err
        == f"kvspec: --out={str(out)!r}: cannot be written ({__import__('os').strerror(err)}); nothing was written; allowed: a writable folder with room for the report\n"
    )
    assert new == set(), "no folder, no temporary folder"


def test_a_failed_write_keeps_the_earlier_report_whole(tmp_path, capsys, monkeypatch):
    code, got, out, _ = _report(tmp_path, BASE, capsys)
    assert code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(ground.files, "write_bytes_atomic", _failing_writer(errno.ENOSPC, 1))
    f = copy.deepcopy(BASE)
    f["summary"] = "another summary"
    code, got, _, new = _report(tmp_path, f, capsys)
    assert code == 2 and "No space left on device" in got.err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and new == set()


def test_an_earlier_report_is_replaced_whole_and_another_folder_is_refused(tmp_path, capsys):
    code, _, out, _ = _report(tmp_path, BASE, capsys)
    assert code == 0
    (out / "test_stale_old_name.py").write_text("# from an earlier report\n")
    (out / "__pycache__").mkdir()
    code, got, _, _ = _report(tmp_path, BASE, capsys)
    assert code == 0, got.err
    assert sorted(p.name for p in out.iterdir()) == sorted(json.loads(got.out)["files"])
    (out / "notes.txt").write_text("mine")
    code, got, _, new = _report(tmp_path, BASE, capsys)
    assert code == 2 and got.err.startswith(
        f"kvspec: --out={str(out)!r}: holds 1 file(s) that are not a report's ('notes.txt', ...)"
    ), got.err
    assert (out / "notes.txt").read_text() == "mine" and new == set()


# ------------------------------------------------------------ the one sanitiser


@pytest.mark.parametrize(
    "text, keep, want",
    [
        ("a\x1b[2Jb", "", "ab"),  # CSI removed whole, not just its ESC
        ("x\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\y", "", "xclicky"),  # OSC 8 hyperlink
        ("x\x1b]0;title\x07y", "", "xy"),  # OSC window title, BEL-terminated
        ("x\x9b31mred", "", "xred"),  # 8-bit CSI
        ("l\u202eevil\u2066z\u2069", "", "levilz"),
        ("a\x00b\x7fc\x85d", "", "abcd"),
        ("a\nb\tc\rd", "", "a b c d"),
        ("a\nb\tc\rd", "\n\t", "a\nb\tc d"),
        ("plain é 中 `code`", "", "plain é 中 `code`"),
    ],
)
def test_printable_removes_terminal_control(text, keep, want):
    from ground.printable import printable

    assert printable(text, keep=keep) == want


# ------------------------------------------------------------ on the real vLLM


@pytest.mark.engine
def test_a_hostile_finding_s_regression_test_runs_on_vllm_without_the_payload(tmp_path):
    """The regression test of a finding whose summary (its title: no known
    class) closes the docstring and writes a marker: pytest in vLLM 0.33.0's
    environment collects and runs it (it fails on its assertion: the
    release's bug), and the marker is never written."""
    from fuzz.results.report import bundle
    from tests.engine.conftest import ensure_env
    from tests.engine.test_patched_engines import _pytest

    ensure_env("0.33.0")
    marker = tmp_path / "MARKER"
    files = bundle(_hostile("summary", payloads(marker)["triple-double"], classified=False))
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (test,) = [n for n in files if n.startswith("test_")]
    proc = _pytest("0.33.0", [tmp_path / test])
    assert proc.returncode == 1 and f"FAILED {test}::" in proc.stdout and "1 failed" in proc.stdout, proc.stdout[-3000:]
    assert not marker.exists()


def test_say_prints_a_message_without_control_characters(capsys):
    """kvspec's one stderr line writer (every ``kvspec: <message>``): a
    message quoting a stranger's text reaches the terminal without its
    control characters; line breaks and tabs stay."""
    from ground.console import say

    say("kvspec: vLLM said \x1b[2J\x1b]8;;http://evil.example/\x1b\\here\x1b]8;;\x1b\\ \u202eok\tdone\nnext")
    assert capsys.readouterr().err == "kvspec: vLLM said here ok\tdone\nnext\n"


def test_a_connector_deployment_s_report_says_why_the_drop_is_in_force_and_names_only_a_plain_connector():
    from fuzz.results.report import issue_markdown
    from tests.fuzz.test_cost import _finding

    finding = _finding()
    assert "KV connector" not in issue_markdown(finding)
    finding["resolution"] = {"facts": {"kv_connector": "OffloadingConnector"}}
    text = issue_markdown(finding)
    assert "- KV connector: `OffloadingConnector`; with a KV connector vLLM keeps the legacy block hashes" in text
    finding["resolution"] = {"facts": {"kv_connector": "Evil`](http://x)\n# injected"}}
    text = issue_markdown(finding)
    assert "- KV connector: one; " in text and "injected" not in text
