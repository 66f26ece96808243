"""An upstream-ready report for an SGLang finding (``kvspec report`` on a
finding whose engine is ``sglang==X``): ``ISSUE.md`` in SGLang's bug-report
template (Checklist, Describe the bug, Reproduction, Environment), a
regression test in the style of SGLang's ``test/registered/unit/mem_cache/``
CPU tests (``unittest``, ``register_cpu_ci``; it drives SGLang's own
``UnifiedRadixCache`` and the scheduler's prefill steps and imports nothing
of kvspec), the fix (``fixes/sglang-0.5.23-*.diff`` the finding's class
names) and the finding.

The test fails on the release and passes on the fixed build: a lost-reuse
finding asserts the promise's hits; a ``resumed_state`` finding asserts
every resumed Mamba state was computed over exactly the tokens it is keyed
by (the state the kernel copies is stood in by a fingerprint of the tokens
it covers, placed where SGLang's own track plan says:
``layers/attention/mamba/prefill_track_metadata.py``).

A finding is a stranger's file: every value the test holds is a Python
literal (:func:`fuzz.results.report._literal`: ``repr``, read back equal); ISSUE.md
shows its text escaped as :mod:`fuzz.results.report` does.
"""

from __future__ import annotations

import json
from pathlib import Path
from string import Template

from fuzz.results.findings import check_fields
from fuzz.results.known_classes import classify as known_class
from fuzz.results.report import (
    _case_of,
    _cell,
    _code,
    _fence,
    _issue_facts,
    _literal,
    _text,
    report_data,
    with_fix_and_finding,
)
from ground.engines import family_of

ROOT = Path(__file__).resolve().parents[2]

#: Per known SGLang class: what goes wrong, where (0.5.23 wheel), the fix, prior art.
SGLANG_CLASSES = json.loads(report_data("report_sglang_classes.json"))


def regression_test_name(finding: dict) -> str:
    """The regression test's name: the known class's id (kvspec's own
    text), else ``finding_`` and the checked hex signature."""
    cls = known_class(finding)
    return (cls if cls in SGLANG_CLASSES else f"finding_{finding['signature']}").replace("-", "_")


#: The family this module reports for (``ground.engines.FAMILIES``' ``reporter``).
FAMILY = "sglang"


def is_sglang(finding: dict) -> bool:
    return family_of(str((finding.get("engine") or {}).get("version") or "")) == FAMILY


def issue_markdown(finding: dict, *, matrix: list[dict] | None = None, finding_path: str = "FINDING.json") -> str:
    case = _case_of(finding)
    cls_id = known_class(finding)
    cls = SGLANG_CLASSES.get(cls_id or "")
    version, exp, obs, title = _issue_facts(finding, cls)
    flags = " ".join(case.deployment.sglang_args) if case.deployment else ""
    lines = [
        f"# [Bug] Mamba radix cache: {_text(title)} ({_text(version)})",
        "",
        "### Checklist",
        "",
        "- [x] I searched related issues (prior art below) and found no fix for this in the release.",
        "- [x] The bug persists on the release named here (kvspec drives its own scheduler and cache on CPU; no GPU server was run).",
        "- [x] A minimal reproduction and a regression test are included.",
        "",
        "### Describe the bug",
        "",
        _text(
            f"With {flags or 'the default flags'} on {case.deployment.model if case.deployment else '?'}, request "
            f"{finding.get('first_divergence')} of the trace below does not keep kvspec's promise ({finding.get('oracle')} oracle)."
        ),
        "",
    ]
    if cls:
        lines += [_text("Where: ") + cls["why"] + ".", "", _text(cls["prior"]), ""]
    lines += ["| request | prompt (segments) | expected | observed |", "|---|---|---|---|"]
    for i, r in enumerate(case.trace):
        segs = " + ".join(f"{s.segment}:{s.length}" for s in r.prompt)
        lines.append(
            f"| {i} | {_cell(segs)} | {_cell(exp[i] if i < len(exp) else '-')} | {_cell(obs[i] if i < len(obs) else '-')} |"
        )
    detail = (finding.get("expected") or {}).get("detail")
    if detail:
        lines += ["", _text(f"The oracle: {detail}")]
    if matrix:
        lines += ["", "Per engine:", "", "| engine | hits | error |", "|---|---|---|"]
        lines += [f"| {_cell(m['engine'])} | {_cell(m.get('hits'))} | {_cell(m.get('error') or '')} |" for m in matrix]
    lines += [
        "",
        "### Reproduction",
        "",
        "Serve the model with these flags and send the requests one after another, one output token each:",
        "",
    ]
    lines += _fence(
        "",
        [
            f"python -m sglang.launch_server --model-path <{case.deployment.model if case.deployment else 'model'}> {flags}"
        ],
    )
    lines += [
        "",
        f"Or with kvspec (SGLang's own scheduler and cache, in-process): {_code('kvspec replay ' + finding_path + ' --engine ' + version)}.",
        f"The regression test beside this file ({_code('test_' + regression_test_name(finding) + '.py')}) is a CPU unit test in the style of "
        f"{_code('test/registered/unit/mem_cache/')}: it fails on {_text(version)} and passes with the fix applied.",
        "",
    ]
    if cls:
        lines += ["The fix: " + ", ".join(_code(f) for f in cls["fix"]) + " (in `fix.diff`).", ""]
    lines += [
        "### Environment",
        "",
        f"- SGLang {_text(version)} (the PyPI wheel), torch CPU; the scheduler's prefill path and `UnifiedRadixCache` (Python and Rust tree cores).",
        "- Found by kvspec's SGLang campaign (`kvspec fuzz --engine sglang==X`).",
    ]
    return "\n".join(lines) + "\n"


#: The regression test's template (SGLang test code, ``string.Template``): data,
#: ``fuzz/data/regression_test_sglang.py.tmpl``.
_TEST_TEMPLATE = Template(report_data("regression_test_sglang.py.tmpl"))


def regression_test(finding: dict) -> str:
    """The SGLang-style regression test's source (every finding value a literal)."""
    from engine_adapter.models.served import model_config_dict

    check_fields(finding)
    case = _case_of(finding)
    if case.deployment is None or case.deployment.engine != FAMILY:
        raise ValueError("an SGLang regression test needs an SGLang deployment")
    if any(s.output is not None for r in case.trace for s in r.prompt) or any(r.max_tokens != 1 for r in case.trace):
        raise ValueError("an SGLang regression test serves one-token outputs and prompts of segments only")
    cls = SGLANG_CLASSES.get(known_class(finding) or "")
    check = "resumed" if finding.get("oracle") == "resumed_state" else "hits"
    prompts = [[(s.segment, s.length) for s in r.prompt] for r in case.trace]
    return _TEST_TEMPLATE.substitute(
        doc_title=cls["title"] if cls else "a kvspec finding",
        config=_literal(
            {k: v for k, v in model_config_dict(case.deployment).items() if not k.startswith("_kvspec")},
            "case.deployment.model",
        ),
        flags=_literal(list(case.deployment.sglang_args), "case.deployment.sglang_args"),
        prompts=_literal(prompts, "case.trace"),
        expected=_literal(finding["expected"]["hits"], "expected.hits"),
        check=_literal(check, "check"),
    )


def bundle(finding: dict, *, matrix: list[dict] | None = None, finding_path: str = "FINDING.json") -> dict[str, str]:
    """{file name: text} of an SGLang finding's report bundle."""
    check_fields(finding)
    files = {"ISSUE.md": issue_markdown(finding, matrix=matrix, finding_path=finding_path)}
    try:
        files[f"test_{regression_test_name(finding)}.py"] = regression_test(finding)
    except ValueError:
        pass
    cls = SGLANG_CLASSES.get(known_class(finding) or "")
    return with_fix_and_finding(files, list(cls["fix"]) if cls else [], finding)
