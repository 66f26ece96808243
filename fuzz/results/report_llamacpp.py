"""An upstream-ready report for a llama.cpp finding (``kvspec report`` on a
finding whose engine is ``llamacpp==X``): ``ISSUE.md`` in llama.cpp's bug
template (Name and Version, Operating systems, Which llama.cpp modules,
Command line, Problem description & steps to reproduce, First Bad Commit,
Relevant log output), a regression test in the style of llama.cpp's
``tools/server/tests/unit/`` (pytest, ``from utils import *``, a
``ServerPreset`` hybrid model, ``server.make_request("POST",
"/completion", ...)``, ``timings.cache_n``), the fix where the finding's
class names one (``fixes/llamacpp-*.diff``), and the finding.

The fix is **stated, not built**: the ``xllamacpp`` wheel ships llama.cpp
compiled and cannot be rebuilt here, so no patched build validated it.

What the test can show: llama.cpp's suite starts one ``llama-server``
process per server (``utils.ServerProcess``), so a defect of process-wide
state (L1) holds there on the release too. The test keeps the contract the
fix must keep (a sibling diverging inside a prompt resumes at the
checkpoint ``4 + n_ubatch`` tokens before that prompt's end, the server's
own ``n_ubatch``); L1 itself fails where two server contexts share a
process, which kvspec shows in-process (``kvspec replay FINDING.json
--engine llamacpp==X``: the finding carries the run option that starts the
first server).

A finding is a stranger's file: every value the test holds is a Python
literal (:func:`fuzz.results.report._literal`); ISSUE.md shows its text escaped.
"""

from __future__ import annotations

from pathlib import Path
from string import Template

from fuzz.results.findings import check_fields
from fuzz.results.report import _case_of, _code, _fence, _issue_facts, _literal, _text, with_fix_and_finding
from ground.printable import printable

ROOT = Path(__file__).resolve().parents[2]

#: The llama.cpp source the rules were read from (the wheel reports no commit).
SOURCE = "ggml-org/llama.cpp@001d906a6d86 tools/server/server-context.cpp"

#: Per known llama.cpp class: what goes wrong, where, the fix, prior art.
LLAMACPP_CLASSES = {
    "llamacpp-static-checkpoint-offsets": {
        "title": "context checkpoints placed with the first server's n_ubatch (function-static checkpoint_offsets)",
        "why": "`server_context_impl::update_slots`, the prompt batch loop, declares "
        "`static const int checkpoint_offsets[] = {4 + n_ubatch, 4};` "
        f"({SOURCE}, under `if (do_checkpoint)`, PR #20288): a function-local static is initialised once per process, "
        "by the first server that reaches it, so every later server context in the same process cuts its prompt "
        "batches (and so places its checkpoints) 4 + n_ubatch tokens before the end for the *first* server's n_ubatch. "
        "`llama-server` runs one server per process and is not affected; embedders that run several server contexts "
        "in one process (the `xllamacpp` bindings, or any program linking `server-context`) are",
        "fix": ["fixes/llamacpp-2026.10.11549-checkpoint-offsets-per-server.diff"],
        "prior": "Not found among upstream issues (searched `checkpoint_offsets`); the two-offset scheme is from PR #20288.",
    },
}

#: The family this module reports for (``ground.engines.FAMILIES``' ``reporter``).
FAMILY = "llamacpp"


def classify(finding: dict) -> str | None:
    """The known class of a llama.cpp finding, or None: L1 where it was
    observed with a first server of another ``n_ubatch`` in the process."""
    options = (finding.get("harness") or {}).get("options") or {}
    if isinstance(options, dict) and options.get("first_server_n_ubatch") is not None:
        return "llamacpp-static-checkpoint-offsets"
    return None


def regression_test_name(finding: dict) -> str:
    cls = classify(finding)
    return (cls.removeprefix("llamacpp-") if cls else f"finding_{finding['signature']}").replace("-", "_")


def _flag(args: list[str], name: str, default: int) -> int:
    for i, a in enumerate(args[:-1]):
        if a == name:
            return int(args[i + 1])
    return default


def segment_runs(case) -> list[list[list[int]]]:
    """Each prompt as runs of consecutive token ids, ``[[first, length],
    ...]``: one run per segment, each segment name its own disjoint ids (from
    100 on), so prompts share exactly the prefixes the case's prompts share."""
    base: dict[str, int] = {}
    longest: dict[str, int] = {}
    for r in case.trace:
        for seg in r.prompt:
            longest[seg.segment] = max(longest.get(seg.segment, 0), seg.length)
    nxt = 100
    for name, n in longest.items():
        base[name], nxt = nxt, nxt + n
    return [[[base[seg.segment], seg.length] for seg in r.prompt] for r in case.trace]


def issue_markdown(finding: dict, *, matrix: list[dict] | None = None, finding_path: str = "FINDING.json") -> str:
    case = _case_of(finding)
    cls_id = classify(finding)
    cls = LLAMACPP_CLASSES.get(cls_id or "")
    version, exp, obs, title = _issue_facts(finding, cls)
    args = list(case.deployment.args) if case.deployment else []
    options = (finding.get("harness") or {}).get("options") or {}
    lines = [
        f"# Misc. bug: llama-server: {_text(title)}",
        "",
        "### Name and Version",
        "",
        f"llama.cpp as shipped in the `xllamacpp` wheel {_code(version.split('==')[-1])} (its `BUILD_INFO` reports no commit); "
        f"the code cited is {_code(SOURCE)}, where the same lines stand.",
        "",
        "### Operating systems",
        "",
        "Linux (x86_64, CPU backend)",
        "",
        "### Which llama.cpp modules do you know to be affected?",
        "",
        "llama-server (`tools/server`, `server_context`)",
        "",
        "### Command line",
        "",
        *_fence("shell", [f"llama-server -m MODEL.gguf {' '.join(args)}".rstrip()]),
        "",
    ]
    if options.get("first_server_n_ubatch") is not None:
        lines += [
            f"in a process where a server context with {_code('--ubatch-size ' + str(options['first_server_n_ubatch']))} "
            "already processed a prompt (an embedder running a second server context: here `xllamacpp.Server`).",
            "",
        ]
    lines += [
        "### Problem description & steps to reproduce",
        "",
        f"Model: a hybrid (recurrent + attention) model, {_text(case.deployment.model if case.deployment else '?')} "
        "architecture (kvspec's tiny random-weight GGUF; any hybrid model shows it). Greedy `/completion` requests with "
        "token-id prompts, one after another, `cache_prompt: true`:",
        "",
        "| request | prompt tokens | cached (`timings.cache_n`) expected | observed |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for i, r in enumerate(case.trace):
        e = exp[i] if i < len(exp) else None
        o = obs[i] if i < len(obs) else None
        lines.append(f"| {i} | {r.num_prompt_tokens} | {_text(e)} | {_text(o)} |")
    lines += ["", _text(finding.get("summary") or ""), ""]
    if cls:
        lines += [f"**Why.** {cls['why']}.", "", f"**Fix.** {_code(cls['fix'][0])} (one line, attached):", ""]
        for f in cls["fix"]:
            p = ROOT / f
            if p.is_file():
                lines += _fence("diff", p.read_text().splitlines())
        lines += [
            "",
            "The fix is stated, not built here: the wheel kvspec ran ships llama.cpp compiled. "
            "A regression test in the style of `tools/server/tests/unit/` is attached; note that the suite starts one "
            "`llama-server` process per server, so it keeps the contract the fix must keep rather than failing on this "
            "defect, which needs two server contexts in one process.",
            "",
            f"**Prior art.** {cls['prior']}",
            "",
        ]
    if matrix:
        lines += ["| engine | hits | error |", "| --- | --- | --- |"]
        lines += [f"| {_text(m['engine'])} | {_text(m.get('hits'))} | {_text(m.get('error') or '')} |" for m in matrix]
        lines.append("")
    lines += [
        "### First Bad Commit",
        "",
        "The two-offset checkpoint scheme of PR #20288 (not bisected).",
        "",
        "### Relevant log output",
        "",
    ]
    engine = (finding.get("explain") or {}).get("engine") or []
    lines += _fence(
        "text",
        [
            f"request {e.get('request')}: cache_n {e.get('hit')}, checkpoints created {e.get('checkpoints_created')}, "
            f"restored {e.get('checkpoint_restored')}, held after {e.get('checkpoints_held')}"
            for e in engine
            if isinstance(e, dict)
        ]
        or ["(no per-request log in the finding)"],
    )
    lines += [
        "",
        f"Found by kvspec; replay: {_code(f'kvspec replay {finding_path} --engine {version}')}.",
    ]
    return "\n".join(lines) + "\n"


_TEST_TEMPLATE = Template('''"""Regression test (kvspec finding $signature): $title.

A hybrid model keeps context checkpoints; a prompt that diverges from the
slot's tokens resumes at the newest checkpoint below the divergence. The
checkpoints of a prompt of N tokens land at N - 4 - n_ubatch and N - 4 of
*this* server's n_ubatch (update_slots, checkpoint_offsets).
"""

import pytest
from utils import *

server: ServerProcess

# the prompts as runs of consecutive token ids: [[first id, length], ...]
PROMPTS = $prompts
N_PREDICT = $n_predict
# timings.cache_n of each request as llama.cpp's rule places the checkpoints
EXPECTED_CACHE_N = $expected


@pytest.fixture(autouse=True)
def create_server():
    global server
    server = ServerPreset.tinylfm2()  # hybrid (recurrent + attention): the server makes context checkpoints
    server.n_slots = 1
    server.n_ctx = $n_ctx
    server.n_batch = $n_batch
    server.n_ubatch = $n_ubatch
    server.temperature = 0.0
    server.cache_ram = $cache_ram


def tokens(runs):
    return [t for first, n in runs for t in range(first, first + n)]


def test_$name():
    global server
    server.start()
    for i, (runs, n_predict, expected) in enumerate(zip(PROMPTS, N_PREDICT, EXPECTED_CACHE_N)):
        res = server.make_request("POST", "/completion", data={
            "prompt": tokens(runs),
            "n_predict": n_predict,
            "cache_prompt": True,
            "temperature": 0.0,
            "top_k": 1,
        })
        assert res.status_code == 200
        assert res.body["timings"]["cache_n"] == expected, f"request {i}"
''')


def regression_test(finding: dict) -> str:
    case = _case_of(finding)
    args = list(case.deployment.args) if case.deployment else []
    expected = (finding.get("expected") or {}).get("hits") or []
    model = (finding.get("explain") or {}).get("model") or []
    if model and all(isinstance(m, dict) and "hit" in m for m in model):
        expected = [m["hit"] for m in model]  # the rule's hits at every request, not only the diverging ones
    n_batch = _flag(args, "--batch-size", 2048)
    return _TEST_TEMPLATE.substitute(
        signature=printable(finding["signature"]),
        title=printable(LLAMACPP_CLASSES.get(classify(finding) or "", {}).get("title") or "a kvspec finding").replace(
            '"""', "'''"
        ),
        prompts=_literal(segment_runs(case), "case.trace"),
        n_predict=_literal([int(r.max_tokens) for r in case.trace], "case.trace.max_tokens"),
        expected=_literal([int(h) for h in expected], "expected.hits"),
        n_ctx=_literal(max(_flag(args, "--ctx-size", 4096), 256), "--ctx-size"),
        n_batch=_literal(n_batch, "--batch-size"),
        n_ubatch=_literal(min(_flag(args, "--ubatch-size", 512), n_batch), "--ubatch-size"),
        cache_ram=_literal(_flag(args, "--cache-ram", 8192), "--cache-ram"),
        name=regression_test_name(finding),
    )


def bundle(finding: dict, *, matrix: list[dict] | None = None, finding_path: str = "FINDING.json") -> dict[str, str]:
    """The report's files by name: ISSUE.md, the regression test, the fix
    (where the class names one), the finding."""
    check_fields(finding)
    files = {
        "ISSUE.md": issue_markdown(finding, matrix=matrix, finding_path=finding_path),
        f"test_{regression_test_name(finding)}.py": regression_test(finding),
    }
    cls = LLAMACPP_CLASSES.get(classify(finding) or "")
    return with_fix_and_finding(files, list(cls["fix"]) if cls else [], finding)


#: Finding L1's case: a 1,200-token prompt, then a sibling diverging at 800
#: (on a server of n_ubatch 512 whose process ran a server of n_ubatch 128).
L1_CASE = {
    "schema": 1,
    "name": "llamacpp-L1-checkpoint-offsets",
    "deployment": {"model": "granitemoehybrid", "engine": "llamacpp", "llamacpp_args": ["--ubatch-size", "512"]},
    "trace": [
        {"prompt": [{"segment": "A", "length": 1200}], "max_tokens": 1},
        {"prompt": [{"segment": "A", "length": 800}, {"segment": "C", "length": 100}], "max_tokens": 1},
    ],
}
L1_FIRST_N_UBATCH = 128


def reproduce_l1(engine, out_dir: Path) -> Path | None:
    """Run :data:`L1_CASE` on ``engine`` after a first server of
    :data:`L1_FIRST_N_UBATCH` in the same process (the run option
    ``first_server_n_ubatch``), judge it with the one judge, and write the
    ``reference`` divergence as a finding (None when it does not fire)."""
    from fuzz.judge.verdict import divergences
    from fuzz.results import findings as F
    from reference.case import parse_case

    case = parse_case(L1_CASE)
    obs = engine.run(case, {"first_server_n_ubatch": L1_FIRST_N_UBATCH})
    div = next((d for d in divergences(case, engine.version, obs) if d.oracle == "reference"), None)
    if div is None:
        return None
    return F.write_finding(F.make_finding(case, div, obs, platform="cpu"), out_dir)


def main(argv: list[str] | None = None) -> int:
    """``python -m fuzz.results.report_llamacpp --reproduce-l1 DIR``: write finding L1."""
    import argparse

    from engine_adapter.host.engine import WorkerEngine

    p = argparse.ArgumentParser(prog="python -m fuzz.results.report_llamacpp")
    p.add_argument("--reproduce-l1", type=Path, required=True, metavar="DIR", help="folder for the finding")
    p.add_argument("--engine", default="llamacpp==2026.10.11549")
    a = p.parse_args(argv)
    engine = WorkerEngine(a.engine)
    engine.start()
    try:
        path = reproduce_l1(engine, a.reproduce_l1)
    finally:
        engine.close()
    print(path if path else "L1 not reproduced: the reference oracle does not fire")
    return 0 if path else 1


if __name__ == "__main__":
    raise SystemExit(main())
