"""Advice for an SGLang deployment (``kvspec advise --engine sglang==X``):
what SGLang's implemented rule (:mod:`reference.sglang_prefill`) hits on a
workload, what the promise asks (where it is stated: the extra buffer with
a chunk budget on the checkpoint grid) and the reuse lost between the two
(a budget off the page never reaches here: SGLang's launch check refuses
it, and so does kvspec's resolver). Confirmed on
SGLang's own scheduler and cache (the engine's hits against the rule's).

Pure over its inputs: the resolution summary SGLang reported and the
workload's case; the engine is the caller's.
"""

from __future__ import annotations

from reference.case import Case, with_resolution
from reference.predict import predict
from reference.sglang_prefill import SglangSetting, simulate


def share(hit: int, prompt: int) -> float:
    return round(hit / prompt, 4) if prompt else 0.0


def advise(case: Case, resolution: dict, version: str) -> dict:
    """Per request: SGLang's hit (its rule), the promise's (or None where it
    is not stated) and the tokens lost; totals; every stale resume the rule
    predicts (a state keyed below its tokens)."""
    setting = SglangSetting.from_resolution(resolution)
    steps = simulate(case, setting)
    promise = None
    if resolution.get("geometry") is not None:
        promise = predict(with_resolution(case, resolution["geometry"], None, version), version, "promise")["hits"]
    rows = []
    for i, s in enumerate(steps):
        p = promise[i] if promise is not None else None
        rows.append(
            {
                "request": i,
                "prompt_tokens": s.prompt_tokens,
                "implemented": s.hit,
                "promise": p,
                "lost": max(0, p - s.hit) if p is not None else None,
                "stale_resume": s.resumed_same_tokens is False,
            }
        )
    prompt = sum(r["prompt_tokens"] for r in rows)
    hit = sum(r["implemented"] for r in rows)
    out = {
        "engine": version,
        "setting": {
            k: getattr(setting, k) for k in ("page_size", "chunked_prefill_size", "strategy", "checkpoint_grid")
        },
        "requests": rows,
        "hit_tokens": hit,
        "prompt_tokens": prompt,
        "hit_share": share(hit, prompt),
        "stale_resumes": [r["request"] for r in rows if r["stale_resume"]],
    }
    if promise is not None:
        out["promise_hit_share"] = share(sum(promise), prompt)
        out["lost_tokens"] = sum(r["lost"] for r in rows)
    else:
        out["promise_not_stated"] = (
            f"strategy {setting.strategy} or a chunk budget off the checkpoint grid {setting.checkpoint_grid}: the promise is stated for the extra buffer with a budget on the grid"
        )
    return out


def notes(advice: dict) -> list[str]:
    """What a user should know, in lines."""
    out = []
    s = advice["setting"]
    if advice["stale_resumes"]:
        out.append(
            f"requests {advice['stale_resumes'][:8]} would resume a Mamba state keyed below the tokens it was computed "
            f"over (--chunked-prefill-size {s['chunked_prefill_size']} is off the page {s['page_size']}), but SGLang's "
            f"launch check refuses such a budget (chunked_prefill_size must be divisible by page_size): use a "
            f"multiple of {s['checkpoint_grid']}"
        )
    if advice.get("lost_tokens"):
        out.append(
            f"{advice['lost_tokens']:,} prompt tokens re-prefilled where the promise resumes (sglang-grid-resend / sglang-sibling-branch: "
            "fixes/sglang-0.5.23-keep-cut.diff)"
        )
    if "promise_not_stated" in advice:
        out.append(f"the promise is not stated here ({advice['promise_not_stated']}); no lost reuse is measured")
    if not out:
        out.append("SGLang keeps every state this workload resumes at")
    return out
