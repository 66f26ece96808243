"""An upstream-ready report from a finding: ISSUE.md, a vLLM-style regression
test, and a candidate fix.

``bundle(finding, ...)`` returns the files' texts; ``kvspec report`` writes
them. Nothing here imports vLLM: the vLLM lines a report cites are read from
the engine environment's installed source as text.

* ``ISSUE.md`` reads like a good vLLM issue: a one-paragraph summary, the
  deployment (model, flags, resolved geometry), expected vs observed per
  request, the version matrix when the report was given one, live-server
  evidence when given, the vLLM function and line where the two numbers part,
  the workaround and what it costs, and how to reproduce.
* ``test_<name>.py`` drives ``vllm.v1.core``'s ``Scheduler`` the way vLLM's
  own ``tests/v1/core`` tests do (configs, KV cache groups, the request block
  hasher, ``schedule()`` / ``update_from_output()``), for the finding's
  resolved geometry and trace; it imports nothing of kvspec. A finding where
  vLLM hits *less* than the promise asserts the promise's hits; one where it
  hits *more* than any state it wrote allows asserts that every Mamba state
  the block pool holds was written by a prefill chunk ending there.
* ``fix.diff``: the patch under ``fixes/`` that the finding's class names
  (:data:`KNOWN_CLASSES`), when there is one.

A finding is a stranger's file, so its text never becomes code or markup:
the finding's fields are checked first (``fuzz.results.findings.check_fields``: the
signature is hex, the oracle one kvspec has; file and test names come only
from those two or a class id of :data:`KNOWN_CLASSES`); every value the
regression test holds is a Python literal written with ``repr`` (and read
back equal, else refused), never text inside a docstring or a comment;
ISSUE.md shows a finding's text without control characters
(``ground.printable``), prose and table cells through
``ground.printable.markdown_text`` (``<`` and ``&`` as entities, ``[ ] ` |``
escaped: no link, image, HTML or extra cell), code spans and fences longer than any backtick run inside
them (a text cannot close them), and shell lines with every word quoted.

The bug prose of each known class and the regression test's template are
data files under ``fuzz/data/`` (``report_vllm_classes.json``,
``regression_test_vllm.py.tmpl``), read with :mod:`importlib.resources`.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from importlib import resources
from pathlib import Path

from fuzz.results.finding_text import deployment_title, prompt_text, serve_args
from fuzz.results.findings import check_fields
from fuzz.results.impact import cost_of, impact_lines, is_shipped_model
from fuzz.results.known_classes import classify as known_class
from ground.errors import KvspecError, invalid
from ground.home import engines_dir as default_dir
from ground.printable import markdown_text, printable
from reference.case import case_to_dict, parse_case

ROOT = Path(__file__).resolve().parents[2]


def report_data(name: str) -> str:
    """A report's prose or template, kept as a data file under ``fuzz/data/``."""
    return resources.files("fuzz").joinpath("data", name).read_text(encoding="utf-8")


#: The report prose of known classes (``classes``: the ids of
#: ``fuzz.results.known_classes``, the one registry, it tells; where vLLM's two
#: numbers part, the fix, the workaround, what vLLM's own tests say): data,
#: not code (``fuzz/data/report_vllm_classes.json``).
KNOWN_CLASSES = tuple(json.loads(report_data("report_vllm_classes.json")))


def _case_of(finding: dict):
    return parse_case(finding["case"])


def _issue_facts(finding: dict, cls: dict | None) -> tuple[str, list, list, str]:
    """What another family's issue opens with: the engine's version (printable),
    the expected and observed hits, and the title (its known class's, else the
    finding's summary, printable)."""
    version = printable(str(finding["engine"]["version"]))
    exp, obs = (finding.get("expected") or {}).get("hits") or [], (finding.get("observed") or {}).get("hits") or []
    title = cls["title"] if cls else printable(finding.get("summary") or "a kvspec finding")
    return version, exp, obs, title


def classify(finding: dict) -> dict | None:
    """The report prose of a finding's known class (the one registry,
    ``fuzz.results.known_classes.classify``), or None: a class with no prose here
    is reported as an unknown one."""
    known = known_class(finding)
    return next((c for c in KNOWN_CLASSES if known in c["classes"]), None)


def vllm_line(version: str, path: str, anchor: str, needle: str, engines_dir: Path | None = None) -> str | None:
    """``path:line`` of ``needle`` after ``anchor`` in the installed vLLM of
    ``version`` (its engine environment), read as text; None if not found."""

    base = (engines_dir or default_dir()) / f"vllm-{version}"
    for site in sorted(base.glob("lib/python3*/site-packages")):
        f = site / path
        if not f.is_file():
            continue
        lines = f.read_text(errors="replace").splitlines()
        start = next((i for i, x in enumerate(lines) if anchor in x), None)
        if start is None:
            continue
        for i in range(start, min(len(lines), start + 400)):
            if needle in lines[i]:
                return f"{path}:{i + 1}"
        return f"{path}:{start + 1}"
    return None


def _name(finding: dict) -> str:
    """The test's name: the class id, else oracle and signature (both
    checked by ``check_fields``: a known oracle, hex digits)."""
    cls = classify(finding)
    base = cls["id"] if cls else f"{finding['oracle']}-{finding['signature']}"
    return re.sub(r"[^a-z0-9_]+", "_", base.lower()).strip("_")


# ------------------------------------------------------------- escaping


def _text(value) -> str:
    """A stranger's text as Markdown prose (``ground.printable.markdown_text``):
    one line, no control characters, ``<`` and ``&`` as entities (no HTML,
    no comment hiding the rest), ``[ ] ` | \\`` backslash-escaped (no
    ``[x](javascript:...)`` link, no image, no code span, no cell)."""
    return markdown_text(value)


def _cell(value) -> str:
    """:func:`_text` for a table cell (``|`` escaped there too)."""
    return markdown_text(value)


def _ticks(text: str) -> int:
    """The longest run of backticks in ``text``."""
    return max((len(m) for m in re.findall(r"`+", text)), default=0)


def _code(value) -> str:
    """A code span no text can close: more backticks than any run inside
    (never at a line's start: three backticks there open a fence)."""
    text = printable(value)
    fence = "`" * (_ticks(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _fence(lang: str, body_lines: list[str]) -> list[str]:
    """A fenced code block no line can close: a fence longer than any
    backtick run inside; each line without control characters."""
    body = [printable(x) for x in body_lines]
    fence = "`" * max(3, _ticks("\n".join(body)) + 1)
    return [fence + lang, *body, fence]


def _literal(value, field: str) -> str:
    """``repr(value)``, a Python literal that reads back equal (so no NaN,
    no object whose repr is code); else one line naming the field."""
    text = repr(value)
    try:
        same = ast.literal_eval(text) == value
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        same = False
    if not same:
        raise invalid(
            field, value, "must be plain data (numbers, strings, lists, objects) to be written into the regression test"
        )
    return text


# ------------------------------------------------------------- ISSUE.md


#: A KV connector's class name, as a report may print it (a finding is a
#: stranger's text: anything else is not named).
_CONNECTOR_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


def _connector_text(finding: dict) -> list[str]:
    """The KV connector the resolution names, and what it does to the
    hashes (vLLM 0.33.0 ``VllmConfig.num_hash_lookahead_tokens``: 0 with any
    connector, so the EAGLE block drop stays in force)."""
    facts = (finding.get("resolution") or {}).get("facts") if isinstance(finding.get("resolution"), dict) else None
    name = facts.get("kv_connector") if isinstance(facts, dict) else None
    if not name:
        return []
    shown = f"`{name}`" if isinstance(name, str) and _CONNECTOR_NAME.match(name) else "one"
    return [
        f"- KV connector: {shown}; with a KV connector vLLM keeps the legacy block hashes (`VllmConfig.num_hash_lookahead_tokens` is 0), so EAGLE/MTP keeps the block drop, as `disable_lookahead_block_hashes` would"
    ]


def _geometry_text(case) -> list[str]:
    g = case.geometry
    if g is None:  # a resolution finding, or vLLM raised before it built one
        return ["- no geometry kvspec could judge (see the summary)"]
    groups = ", ".join(f"{x.count}x {x.kind} (block {x.block_size})" for x in g.groups)
    out = [
        f"- KV cache groups: {groups}",
        f"- scheduler block {g.scheduler_block_size}, hash block {g.hash_block_size}"
        + (f" (`--prefix-match-unit {g.prefix_match_unit}`)" if g.prefix_match_unit else ""),
        f"- retention interval: {'dense (None)' if g.retention_interval is None else g.retention_interval}, chunk budget {g.max_num_batched_tokens}",
    ]
    if g.prefill_checkpoint_grid is not None:
        out.append(f"- internal Mamba prefill checkpoints on a {g.prefill_checkpoint_grid}-token grid")
    out.append(
        f"- speculative decoding: {json.dumps(None if case.speculative is None else {'method': case.speculative.method, 'num_speculative_tokens': case.speculative.num_speculative_tokens, **case.speculative.options})}"
    )
    return out


def issue_markdown(
    finding: dict, *, matrix: list[dict] | None = None, live: dict | None = None, finding_path: str = "FINDING.json"
) -> str:
    case = _case_of(finding)
    cls = classify(finding)
    engine = finding.get("engine", {})
    version = engine.get("version", "?")
    title = cls["title"] if cls else f"Hybrid prefix cache: {_text(finding.get('summary') or '')}"
    lines = [f"# [Bug]: {title}", ""]
    lines += ["## Summary", ""]
    exp = finding["expected"]["hits"]
    obs = finding["observed"]["hits"]
    i = finding.get("first_divergence")
    para = f"On vLLM {version}, {_text(finding.get('summary') or '')}."
    if cls:
        para += " " + cls["why"]
    lines += [para, ""]
    dep = case.deployment
    lines += ["## Deployment", ""]
    if dep is not None:
        where = _text(dep.platform) + (f" ({_text(dep.device)})" if dep.device else "")
        lines.append(
            "Model "
            + _code(dep.model)
            + (f" with config overrides {_code(json.dumps(dep.model_overrides))}" if dep.model_overrides else "")
            + f" on {where}:"
        )
        serve, serve_flags = serve_args(dep.as_dict())
        lines += (
            [""]
            + _fence("sh", [f"{serve} <model> " + shlex.join(printable(a) for a in serve_flags)])
            + ["", f"{deployment_title(dep.as_dict())} resolves it to:"]
        )
    else:
        lines.append(
            f"A hand-written geometry (kvspec case kind {_code(finding.get('case_kind') or 'synthetic')}, reachable: {_text(finding.get('reachable'))}: {_text(finding.get('reachability') or '')}):"
        )
    lines += [""] + _geometry_text(case) + _connector_text(finding) + [""]
    res = finding.get("resolution") or {}
    if res.get("assumptions"):
        lines += [
            "kvspec answered vLLM's hardware questions as: " + "; ".join(_text(a) for a in res["assumptions"]) + ".",
            "",
        ]
    lines += [
        "## Expected vs observed",
        "",
        "Requests run one after another on a fresh server (each finishes before the next starts). Hits are what `vllm:prefix_cache_hits_total` grows by.",
        "",
    ]
    lines += ["| request | prompt | tokens | expected hits | observed hits |", "|---|---|---|---|---|"]
    for j, r in enumerate(case.trace):
        prompt = _cell(prompt_text(case_to_dict(case)["trace"][j]["prompt"], style="prose"))
        mark = " **<-**" if j == i else ""
        lines.append(
            f"| {j} | {prompt} | {r.num_prompt_tokens} | {exp[j] if j < len(exp) else '-'} | {obs[j] if j < len(obs) else '-'}{mark} |"
        )
    lines += [
        "",
        "Prompts sharing a name share that many leading tokens (a prefix of one token stream)."
        " Expected: kvspec's promise, where a request resumes under dense retention (every Mamba state written is kept)"
        + (
            ", and never on a state no prefill chunk wrote"
            if cls and cls["id"] == "stale-state-after-partial-hit"
            else ""
        )
        + ".",
        "",
    ]
    # a model that is not shipped is a folder on someone's machine: never read for a shared report
    lines += impact_lines(cost_of(finding, local_models=False))
    if dep is not None and not is_shipped_model(dep.model):
        lines += [
            f"Model {_code(dep.model)} is not one kvspec ships: its config was not read here, so no figure above comes from it (tokens only).",
            "",
        ]
    if matrix:
        lines += ["## Versions", "", "| engine | hits |", "|---|---|"]
        for row in matrix:
            lines.append(f"| {_cell(row['engine'])} | {_cell(row.get('hits', row.get('error')))} |")
        lines.append("")
    if live:
        lines += _live_section(live)
    lines += ["## Where it goes wrong", ""]
    if cls:
        at = vllm_line(version, *cls["where"])
        lines.append(f"`{at or cls['where'][0]}` ({cls['where'][1].replace('def ', '')}): {cls['why']}")
        for c in cls.get("cites", []):
            lines.append(f"See also {c}.")
    else:
        lines.append(
            "kvspec's explain records, per request, the scheduler's boundary, the junction, the prefill chunk ends and the Mamba states kept; the first request where they part is marked above."
        )
    lines.append("")
    if cls:
        lines += [
            "## Workaround",
            "",
            f"{cls['workaround']}. It keeps more Mamba states (one per written block) and so more KV cache memory.",
            "",
        ]
        fix = ROOT / cls["fix"]
        if fix.is_file():
            lines += ["## Candidate fix", "", f"`fix.diff` (also `{cls['fix']}` in kvspec).", ""]
    lines += (
        ["## Reproduce", ""]
        + _fence(
            "sh",
            [
                f"pytest test_{_name(finding)}.py            # vLLM {version}: fails; with fix.diff applied: passes",
                f"kvspec replay {shlex.quote(printable(finding_path))} --engine vllm=={version}   # kvspec's judge",
            ],
        )
        + [""]
    )
    return "\n".join(printable(line, keep="\t") for line in lines)


def live_summary(raw, path: str, requests: int) -> dict:
    """The parts of a live replay report (``kvspec replay --server URL --json
    REPORT.json``: ``fuzz.replaying.live_report.Report.as_dict``) that
    ISSUE.md quotes; a document of another shape is one line."""

    shape = "a JSON object written by kvspec replay --server --json"
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("requests"), list)
        or not isinstance(raw.get("verdict"), str)
    ):
        raise invalid("--live", path, shape)
    rows = raw["requests"]
    if len(rows) != requests or not all(isinstance(r, dict) for r in rows):
        raise invalid(
            "--live", path, f"{shape}, for the finding's case ({requests} requests; the report has {len(rows)})"
        )

    def column(key: str) -> list:
        return [r.get(key) for r in rows]

    return {
        "verdict": raw["verdict"],
        "kind": raw.get("kind"),
        "name": raw.get("name"),
        "server_version": raw.get("server_version"),
        "model": raw.get("model"),
        "server_knobs": raw.get("server_knobs") if isinstance(raw.get("server_knobs"), dict) else {},
        "rule": raw.get("rule"),
        "prompt_tokens": column("prompt_tokens"),
        "observed_hits": column("hits"),
        "target_hits": column("target"),
        "expected_hits": column("expected"),
        "reasons": [str(x) for x in raw.get("reasons") or []],
        "unverified": [str(x) for x in raw.get("unverified") or []],
    }


def _live_section(live: dict) -> list[str]:
    """The live replay (``kvspec report --live REPORT.json``): the server, the
    verdict of kvspec's one judge, the hits per request, what the server
    does not expose."""
    knobs = live.get("server_knobs") or {}
    shown = ", ".join(
        f"{k}={_text(knobs[k])}"
        for k in ("block_size", "hash_block_size", "retention_interval", "mamba_cache_mode", "num_speculative_tokens")
        if k in knobs
    )
    lines = ["## Live server", ""]
    lines.append(
        f"Replayed against a running vLLM {_text(live.get('server_version') or '(version unknown)')} OpenAI server"
        + (f" (model {_code(live['model'])}" + (f"; {shown}" if shown else "") + ")" if live.get("model") else "")
        + ", one request at a time, hits read from `vllm:prefix_cache_hits_total`:"
        + f" verdict **{_text(live.get('verdict'))}**"
        + (
            " (the server shows the finding's observed hits at every request)"
            if live.get("verdict") == "reproduced"
            else ""
        )
        + "."
    )
    observed, target, expected, tokens = (
        live.get(k) or [] for k in ("observed_hits", "target_hits", "expected_hits", "prompt_tokens")
    )

    def cell(xs: list, j: int) -> str:
        x = xs[j] if j < len(xs) else None
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return "-" if x is None else _cell(x)
        return str(int(x)) if float(x).is_integer() else str(x)

    if observed:
        lines += [
            "",
            "| request | tokens | expected hits | finding's observed hits | live hits |",
            "|---|---|---|---|---|",
        ]
        for j in range(len(observed)):
            lines.append(f"| {j} | {cell(tokens, j)} | {cell(expected, j)} | {cell(target, j)} | {cell(observed, j)} |")
    if live.get("unverified"):
        assumed = [
            u.replace(" (not exposed by the server)", "").replace("; not exposed by the server)", ")")
            for u in live["unverified"]
        ]
        lines += [
            "",
            "Not exposed by the server, assumed as the case states: " + "; ".join(_text(a) for a in assumed) + ".",
        ]
    if live.get("reasons") and live.get("verdict") not in ("reproduced", "agrees"):
        lines += ["", "Reasons: " + "; ".join(_text(r) for r in live["reasons"][:10]) + "."]
    return lines + [""]


# ------------------------------------------------------------- the test


#: The regression test's template (vLLM test code, ``str.format``): data,
#: ``fuzz/data/regression_test_vllm.py.tmpl``.
_TEST_TEMPLATE = report_data("regression_test_vllm.py.tmpl")


def regression_test(finding: dict) -> str:
    """The vLLM-style regression test's source for a finding (checked with
    ``check_fields`` first). Every value from the finding is a literal
    (:func:`_literal`); the docstring holds only kvspec's own class title."""

    check_fields(finding)
    case = _case_of(finding)
    g = case.geometry
    if g is None or len({x.block_size for x in g.groups}) != 1:
        raise ValueError("a regression test needs a resolved geometry with one block size (a deployment's)")
    if any(s.output is not None for r in case.trace for s in r.prompt):
        raise ValueError(
            "a regression test for a prompt quoting an earlier output (an output segment) is not written: its template serves one-token outputs"
        )
    cls = classify(finding)
    check = "written" if (cls and cls["id"] == "stale-state-after-partial-hit") else "hits"
    spec = None
    if case.speculative is not None:
        spec = {
            "method": case.speculative.method,
            "num_speculative_tokens": case.speculative.num_speculative_tokens,
            **case.speculative.options,
        }
    mamba_groups = sum(x.count for x in g.groups if x.kind == "mamba")
    prompts = [[(s.segment, s.length) for s in r.prompt] for r in case.trace]
    return _TEST_TEMPLATE.format(
        doc_title=cls["title"] if cls else "a kvspec finding",
        title=_literal(cls["title"] if cls else printable(finding.get("summary") or ""), "summary"),
        signature=_literal(finding["signature"], "signature"),
        block=_literal(g.scheduler_block_size, "case.geometry"),
        pmu=_literal(g.prefix_match_unit, "case.geometry"),
        retention=_literal(g.retention_interval, "case.geometry"),
        budget=_literal(g.max_num_batched_tokens, "case.geometry"),
        grid=_literal(g.prefill_checkpoint_grid, "case.geometry"),
        mamba_groups=_literal(mamba_groups, "case.geometry"),
        speculative=_literal(spec, "case.speculative"),
        prompts=_literal(prompts, "case.trace"),
        expected=_literal(finding["expected"]["hits"], "expected.hits"),
        check=_literal(check, "check"),
        name=_name(finding),
    )


def bundle(
    finding: dict, *, matrix: list[dict] | None = None, live: dict | None = None, finding_path: str = "FINDING.json"
) -> dict[str, str]:
    """{file name: text} of the report bundle; a malformed finding field is
    one line naming it (``fuzz.results.findings.check_fields``), before any text is
    made."""

    check_fields(finding)
    files = {"ISSUE.md": issue_markdown(finding, matrix=matrix, live=live, finding_path=finding_path)}
    try:
        files[f"test_{_name(finding)}.py"] = regression_test(finding)
    except KvspecError:
        raise
    except ValueError:  # no resolved geometry of one block size: no test
        pass
    cls = classify(finding)
    return with_fix_and_finding(files, [cls["fix"]] if cls else [], finding)


def with_fix_and_finding(files: dict[str, str], fixes: list[str], finding: dict) -> dict[str, str]:
    """A report's files closed by the class's fix (those of ``fixes``, paths
    under the repository, that exist, as one ``fix.diff``) and the finding."""
    found = [ROOT / f for f in fixes if (ROOT / f).is_file()]
    if found:
        files["fix.diff"] = "".join(p.read_text() for p in found)
    files["finding.json"] = json.dumps(finding, indent=2) + "\n"
    return files
