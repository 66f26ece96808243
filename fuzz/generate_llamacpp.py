"""llama.cpp cases and a short campaign (``python -m fuzz.generate_llamacpp``).

A deployment: one of kvspec's three tiny GGUF architectures x the
allow-listed server flags that shape its cache (``--parallel`` {1, 2},
``--ubatch-size``, ``--batch-size``, ``--ctx-checkpoints``,
``--checkpoint-min-step``, ``--cache-ram`` {0, default}, sometimes
``--no-cache-prompt``). A trace: 2..6 serial requests, each a fresh prompt,
a resend of an earlier one, a longer sibling (an earlier prompt plus new
tokens) or a sibling diverging inside an earlier prompt (cut anywhere),
1..4 generated tokens. The shapes are the engine-neutral ones kvspec draws
for every engine; no length is taken from a known finding. Seeded: a case is
a function of (seed, index).

The campaign runs each case on the engine with its cold server
(``options.cold``), judges the hits and held checkpoints against the
llama.cpp rule (``reference.llamacpp``) and the outputs with the output
oracle (``fuzz.oracle_outputs``), and writes each divergent case as a case
file that replays alone: ``kvspec run FILE --engine llamacpp==X --compare``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

MODELS = ("granitemoehybrid", "nemotron_h", "qwen3_next")
MAX_LEN = 1500


def draw_deployment(rng: random.Random) -> dict:
    args = ["--ctx-size", "16384", "--parallel", str(rng.choice((1, 1, 2)))]
    batch = rng.choice((256, 512, 1024, 2048))
    args += [
        "--batch-size",
        str(batch),
        "--ubatch-size",
        str(rng.choice([u for u in (64, 128, 256, 512) if u <= batch])),
    ]
    if rng.random() < 0.5:
        args += ["--ctx-checkpoints", str(rng.choice((0, 1, 2, 3, 8)))]
    if rng.random() < 0.4:
        args += ["--checkpoint-min-step", str(rng.choice((0, 16, 256)))]
    if rng.random() < 0.25:
        args += ["--cache-ram", "0"]
    if rng.random() < 0.1:
        args += ["--no-cache-prompt"]
    return {"model": rng.choice(MODELS), "engine": "llamacpp", "llamacpp_args": args}


def draw_trace(rng: random.Random, n: int) -> list[dict]:
    prompts: list[list[dict]] = []
    trace = []
    fresh = 0
    for i in range(n):
        kind = rng.choice(("fresh", "resend", "longer", "diverge")) if prompts else "fresh"
        if kind == "fresh":
            fresh += 1
            p = [{"segment": f"s{fresh}", "length": rng.randint(8, MAX_LEN)}]
        elif kind == "resend":
            p = list(rng.choice(prompts))
        elif kind == "longer":
            base = rng.choice(prompts)
            fresh += 1
            p = base + [{"segment": f"s{fresh}", "length": rng.randint(1, 400)}]
        else:
            base = rng.choice(prompts)
            total = sum(s["length"] for s in base)
            cut = rng.randint(1, max(1, total - 1))
            p, left = [], cut
            for s in base:
                take = min(left, s["length"])
                if take:
                    p.append({"segment": s["segment"], "length": take})
                left -= take
            fresh += 1
            p.append({"segment": f"s{fresh}", "length": rng.randint(1, 400)})
        prompts.append(p)
        trace.append({"prompt": p, "max_tokens": rng.randint(1, 4)})
    return trace


def draw_case(seed: int, index: int) -> dict:
    rng = random.Random(f"kvspec-llamacpp-{seed}-{index}")
    return {
        "schema": 1,
        "name": f"llamacpp-{seed}-{index}",
        "deployment": draw_deployment(rng),
        "trace": draw_trace(rng, rng.randint(2, 6)),
    }


def judge_case(case_dict: dict, observed: dict, engine: str) -> dict:
    """The hits, held checkpoints and outputs of one run against the rule."""
    from fuzz.oracle_outputs import check_outputs
    from reference.case import parse_case
    from reference.llamacpp import Settings, predict

    case = parse_case(case_dict)
    if observed.get("error"):
        return {"verdict": "engine_error", "detail": observed["error"].get("message")}
    res = observed["resolution"]
    ref = predict(case, Settings.of(res["server"], res["params"]))
    diffs = []
    for r, o in zip(ref["explain"], observed["explain"]):
        if r["hit"] != o["hit"]:
            diffs.append(f"request {o['request']}: hit {o['hit']} by llama.cpp, {r['hit']} by the rule")
        elif r["checkpoints_held"] != o["checkpoints_held"]:
            diffs.append(
                f"request {o['request']}: checkpoints held {o['checkpoints_held']} by llama.cpp, {r['checkpoints_held']} by the rule"
            )
    outputs = check_outputs(case, engine, observed)
    noise = 0.0
    for e in observed["explain"]:
        for a, b in zip(e.get("top_logprobs") or [], e.get("cold_top_logprobs") or []):
            da, db = {int(i): p for i, p in a}, {int(i): p for i, p in b}
            noise = max([noise] + [abs(da[i] - db[i]) for i in set(da) & set(db)])
    verdict = "agrees" if not diffs and not outputs else "diverges"
    return {
        "verdict": verdict,
        "rule": diffs,
        "outputs": [d.detail for d in outputs],
        "max_logprob_delta": noise,
        "hits": observed["hits"],
        "predicted": ref["hits"],
    }


def campaign(
    seed: int, cases: int, budget_s: float, out_dir: Path | None, engine_name: str, options: dict | None = None
) -> dict:
    from engine_adapter import open_engine
    from engine_adapter.host.versions import EngineSpec
    from fuzz.verdict import harness_error_of
    from ground.files import write_text_atomic

    spec = EngineSpec.parse(engine_name)
    t0 = time.monotonic()
    counts = {"agrees": 0, "diverges": 0, "engine_error": 0, "harness": 0}
    rows = []
    max_noise = 0.0
    for i in range(cases):
        if time.monotonic() - t0 > budget_s:
            break
        case = draw_case(seed, i)
        # one worker per case: llama.cpp keeps process-wide state across
        # servers (the checkpoint offsets: engine_adapter/llamacpp_engine/driver.py _PROCESS)
        with open_engine(spec, mode="worker") as engine:
            observed = engine.run(case, {"cold": True, **(options or {})}, timeout=300)
        if harness_error_of(observed) is not None:  # the judge's rule of what may be judged
            counts["harness"] += 1
            rows.append({"case": case["name"], "verdict": "harness", "detail": observed["error"].get("message")})
            continue
        j = judge_case(case, observed, spec.name)
        counts[j["verdict"]] += 1
        max_noise = max(max_noise, j.get("max_logprob_delta", 0.0))
        rows.append(
            {
                "case": case["name"],
                "model": case["deployment"]["model"],
                "args": case["deployment"]["llamacpp_args"],
                **j,
            }
        )
        if j["verdict"] != "agrees" and out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            write_text_atomic(out_dir / f"{case['name']}.json", json.dumps(case, indent=2) + "\n")
    return {
        "engine": spec.name,
        "seed": seed,
        "cases": len(rows),
        "counts": counts,
        "max_logprob_delta_agreeing": max_noise,
        "seconds": round(time.monotonic() - t0, 1),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    from ground.errors import KvspecError

    p = argparse.ArgumentParser(
        prog="python -m fuzz.generate_llamacpp",
        description="a short campaign on llama.cpp (hits, checkpoints, outputs)",
    )
    p.add_argument("--engine", default="llamacpp==2026.10.11549")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cases", type=int, default=30)
    p.add_argument("--budget", type=float, default=600.0, help="seconds (default %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="folder for divergent cases (each replays alone)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if not 1 <= a.cases <= 10000 or not 1 <= a.budget <= 36000:
        print("kvspec: --cases must be in [1, 10000] and --budget in [1, 36000]", file=sys.stderr)
        return 2
    try:
        result = campaign(a.seed, a.cases, a.budget, a.out, a.engine)
    except KvspecError as e:
        print(f"kvspec: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(result, indent=2))
    else:
        for r in result["rows"]:
            print(
                f"{r['case']:<18} {r.get('model', ''):<17} {r['verdict']:<9} hits {r.get('hits')} rule {r.get('predicted')} "
                f"dlogp {r.get('max_logprob_delta', 0):.1e} {' '.join(r.get('rule') or [])} {' '.join(r.get('outputs') or [])}"[
                    :400
                ]
            )
        print(
            f"{result['cases']} cases in {result['seconds']}s: {result['counts']}; max |logprob cached - cold| on agreeing cases {result['max_logprob_delta_agreeing']:.2e}"
        )
    if result["counts"]["harness"]:
        return 3  # kvspec's own failure, never the engine's
    return 0 if result["counts"]["diverges"] == 0 and result["counts"]["engine_error"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
