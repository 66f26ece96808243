"""``kvspec run CASE --engine llamacpp==X --compare``: llama.cpp's server
beside the reference model's llama.cpp rule (``reference.llamacpp``) on the
settings the server resolved, request by request: hits, the checkpoint
restored, the checkpoints the slot holds after, the generated tokens (and
the cold server's, judged by the output oracle ``fuzz.judge.oracle_outputs``).
The verdict is the one judge's (``fuzz.judge.verdict.judge``)."""

from __future__ import annotations

import json
import sys

from reference.case import Case


def compare(case: Case, observed: dict, name: str, as_json: bool) -> int:
    from fuzz.judge.oracle_outputs import check_outputs
    from fuzz.judge.verdict import differences, divergences, judge
    from ground.engines import version_key
    from reference.llamacpp import Settings, predict

    res = observed.get("resolution") or {}
    reference = (
        predict(case, Settings.of(res.get("server") or {}, res.get("params") or {}))
        if res.get("server")
        else {"hits": [], "queries": [], "explain": []}
    )
    outputs = check_outputs(case, name, observed)
    mismatches = differences(reference, observed)
    # the one judge, on the oracles that judge this family (its rule and
    # promise: fuzz.judge.oracle_llamacpp; outputs; the safety oracles)
    divs = divergences(case, version_key(name), observed)
    verdict = judge(None, observed, divs)
    if as_json:
        print(
            json.dumps(
                {
                    "engine": name,
                    "rule": "llamacpp",
                    "verdict": verdict.verdict,
                    "reasons": verdict.reasons,
                    "reference": reference,
                    "observed": observed,
                    "mismatches": mismatches,
                    "outputs": [d.detail for d in outputs],
                    "divergences": [{"oracle": d.oracle, "first": d.first, "detail": d.detail} for d in divs],
                },
                indent=2,
            )
        )
    else:
        _render(reference, observed, name, verdict, outputs)
    sys.stdout.flush()
    return verdict.exit_code


def _ids(ids) -> str:
    return " ".join(map(str, ids or [])) if ids is not None else "-"


def _render(reference: dict, observed: dict, name: str, verdict, outputs) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(width=None if sys.stdout.isatty() else 220)
    table = Table(title=f"reference (llama.cpp rule) vs observed ({name})")
    for col in (
        "",
        "req",
        "tokens",
        "hit ref",
        "hit llama.cpp",
        "restored ref",
        "restored llama.cpp",
        "held ref",
        "held llama.cpp",
        "output",
        "output cold",
    ):
        table.add_column(col, justify="right" if col in ("req", "tokens", "hit ref", "hit llama.cpp") else "left")
    rex, oex = reference.get("explain") or [], observed.get("explain") or []
    bad = {d for div in outputs for d in div.requests}
    for i in range(max(len(rex), len(oex))):
        r = rex[i] if i < len(rex) else {}
        o = oex[i] if i < len(oex) else {}
        same = r.get("hit") == o.get("hit") and r.get("checkpoints_held") == o.get("checkpoints_held") and i not in bad
        table.add_row(
            Text("ok" if same else "MISMATCH", style="green" if same else "red"),
            str(i),
            str(o.get("prompt_tokens", r.get("prompt_tokens", ""))),
            str(r.get("hit", "")),
            str(o.get("hit", "")),
            str(r.get("checkpoint_restored")),
            str(o.get("checkpoint_restored")),
            Text(_ids(r.get("checkpoints_held"))),
            Text(_ids(o.get("checkpoints_held"))),
            Text(_ids(o.get("output_ids"))),
            Text(_ids(o.get("cold_output_ids"))),
        )
    console.print(table)
    server = (observed.get("resolution") or {}).get("server") or {}
    console.print(Text(f"resolved by {name}: {json.dumps(server, sort_keys=True)}"))
    if observed.get("error"):
        e = observed["error"]
        console.print(
            Text(f"llama.cpp raised in {e.get('phase')} (request {e.get('request')}): {e.get('message')}", style="red")
        )
    for d in outputs:
        console.print(Text(f"outputs fires at request {d.first}: {d.detail}", style="red"))
    if verdict.verdict == "agrees":
        console.print(
            Text(
                "agrees: no oracle fires (the rule's hits and checkpoints held, the promise for one live state per slot, outputs equal a cold server's, the safety oracles)",
                style="green",
            )
        )
    else:
        console.print(Text(f"{verdict.verdict}", style="red"))
        for reason in verdict.reasons:
            console.print(Text(f"  - {reason}"))
