"""fuzz.results.report_sglang: an SGLang finding's bundle (ISSUE.md in SGLang's
template, a mem_cache-style regression test, the fix): prior art cited for
the grid-resend class, every finding value a literal in the test, text
escaped in ISSUE.md."""

from __future__ import annotations

import ast

from fuzz.results.report_sglang import bundle, is_sglang, regression_test
from reference.case import case_to_dict
from tests.conftest import hybrid, make_case


def _finding(
    prompts,
    expected,
    observed,
    *,
    oracle="promise",
    args=("--mamba-radix-cache-strategy", "extra_buffer", "--page-size", "64"),
):
    case = case_to_dict(make_case(hybrid(64, 64, retention_interval=0), prompts, None))
    case.update(
        deployment={"model": "qwen3_next", "engine": "sglang", "sglang_args": list(args)}, resolved_by="sglang==0.5.23"
    )
    first = next((i for i, (e, o) in enumerate(zip(expected, observed)) if e != o), None)
    return {
        "signature": "abcdef12",
        "oracle": oracle,
        "first_divergence": first,
        "expected": {"hits": expected},
        "observed": {"hits": observed},
        "engine": {"name": "sglang==0.5.23", "version": "sglang==0.5.23", "knobs": {}},
        "case": case,
        "summary": "x",
    }


def test_a_grid_resend_bundle_cites_prior_art_and_carries_the_fix():
    f = _finding([[("A", 3200)]] * 2, [0, 3136], [0, 2048])
    assert is_sglang(f)
    files = bundle(f)
    assert set(files) == {"ISSUE.md", "test_sglang_grid_resend.py", "finding.json", "fix.diff"}
    issue = files["ISSUE.md"]
    assert "#30882" in issue and "#21350" in issue and "### Reproduction" in issue and "### Environment" in issue
    assert "mamba_keep_cut" in files["fix.diff"]
    test = next(v for k, v in files.items() if k.startswith("test_"))
    tree = ast.parse(test)
    assigns = {
        t.targets[0].id: ast.literal_eval(t.value)
        for t in tree.body
        if isinstance(t, ast.Assign)
        and isinstance(t.targets[0], ast.Name)
        and t.targets[0].id.isupper()
        and t.targets[0].id not in ("LAYERS",)
    }
    assert (
        assigns["EXPECTED_HITS"] == [0, 3136]
        and assigns["CHECK"] == "hits"
        and assigns["PROMPTS"] == [[("A", 3200)], [("A", 3200)]]
    )
    imported = {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    assert imported <= {"sglang", "torch", "json", "os", "tempfile", "unittest", "zlib", "array"}, (
        imported
    )  # nothing of kvspec


def test_a_resumed_state_finding_checks_resumed_states_and_names_no_class_or_fix():
    """SGLang has no known state class (its off-page key was found only on
    deployments its launch check refuses: docs/sglang.md), so a
    ``resumed_state`` finding is a new one: its test checks resumed
    states, and the bundle ships no fix."""
    f = _finding(
        [[("A", 3000)]] * 3,
        [0, 0, 0],
        [0, 2880, 2944],
        oracle="resumed_state",
        args=("--mamba-radix-cache-strategy", "extra_buffer", "--page-size", "64", "--chunked-prefill-size", "2048"),
    )
    f["first_divergence"] = 1
    files = bundle(f)
    assert "CHECK = 'resumed'" in regression_test(f) and "fix.diff" not in files


def test_finding_text_is_escaped_in_the_issue():
    f = _finding([[("A", 100)]] * 2, [0, 64], [0, 0])
    f["expected"]["detail"] = "<script>x</script>\x1b[31m"
    issue = bundle(f)["ISSUE.md"]
    assert "<script>" not in issue and "\x1b" not in issue
