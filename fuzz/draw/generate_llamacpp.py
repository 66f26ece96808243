"""llama.cpp's deployments and traces: the family's generator
(``ground.engines`` ``generator``), drawn by ``kvspec fuzz --engine
llamacpp==X`` through the common campaign (``fuzz.driving.drivers.random_cases``:
``build_case`` then more traces on the same deployment with ``case_on``),
judged by the one judge (``fuzz.judge.verdict``; the family's own ``reference``
and ``promise`` checks: ``fuzz.judge.oracle_llamacpp``; ``outputs`` against a
cold server; the safety oracles).

A deployment: one of kvspec's three tiny GGUF architectures x the
allow-listed server flags that shape its cache (``--parallel`` {1, 2},
``--ubatch-size``, ``--batch-size``, ``--ctx-checkpoints``,
``--checkpoint-min-step``, ``--cache-ram`` {0, default}, sometimes
``--no-cache-prompt``). A trace: 2..6 serial requests, each a fresh prompt,
a resend of an earlier one, a longer sibling (an earlier prompt plus new
tokens) or a sibling diverging inside an earlier prompt (cut anywhere),
1..4 generated tokens. The shapes are the engine-neutral ones kvspec draws
for every engine; no length is taken from a known finding. Every choice
goes through the campaign's chooser (seeded).
"""

from __future__ import annotations

from fuzz.draw.choosers import Chooser
from reference.case import Case, parse_case

MODELS = ("granitemoehybrid", "nemotron_h", "qwen3_next")
MAX_LEN = 1500
#: The most tokens a longer or diverging sibling adds.
MAX_ADDED = 400


def _percent(c: Chooser, p: int) -> bool:
    return c.integer(0, 99) < p


def draw_deployment(c: Chooser) -> dict:
    """One llama.cpp deployment (the flags a ``llama-server`` takes)."""
    args = ["--ctx-size", "16384", "--parallel", str(c.choice((1, 1, 2)))]
    batch = c.choice((256, 512, 1024, 2048))
    args += ["--batch-size", str(batch), "--ubatch-size", str(c.choice([u for u in (64, 128, 256, 512) if u <= batch]))]
    if _percent(c, 50):
        args += ["--ctx-checkpoints", str(c.choice((0, 1, 2, 3, 8)))]
    if _percent(c, 40):
        args += ["--checkpoint-min-step", str(c.choice((0, 16, 256)))]
    if _percent(c, 25):
        args += ["--cache-ram", "0"]
    if _percent(c, 10):
        args += ["--no-cache-prompt"]
    return {"model": c.choice(MODELS), "engine": "llamacpp", "llamacpp_args": args}


def draw_trace(c: Chooser, n: int) -> list[dict]:
    prompts: list[list[dict]] = []
    trace = []
    fresh = 0
    for _ in range(n):
        kind = c.choice(("fresh", "resend", "longer", "diverge")) if prompts else "fresh"
        if kind == "fresh":
            fresh += 1
            p = [{"segment": f"s{fresh}", "length": c.integer(8, MAX_LEN)}]
        elif kind == "resend":
            p = list(c.choice(prompts))
        elif kind == "longer":
            base = c.choice(prompts)
            fresh += 1
            p = base + [{"segment": f"s{fresh}", "length": c.integer(1, MAX_ADDED)}]
        else:
            base = c.choice(prompts)
            total = sum(s["length"] for s in base)
            cut = c.integer(1, max(1, total - 1))
            p, left = [], cut
            for s in base:
                take = min(left, s["length"])
                if take:
                    p.append({"segment": s["segment"], "length": take})
                left -= take
            fresh += 1
            p.append({"segment": f"s{fresh}", "length": c.integer(1, MAX_ADDED)})
        prompts.append(p)
        trace.append({"prompt": p, "max_tokens": c.integer(1, 4)})
    return trace


def case_on(c: Chooser, deployment: dict, info: dict | None, name: str | None) -> Case:
    """A trace on a llama.cpp deployment (``info``: what it resolved to;
    llama.cpp matches prompts token by token, no unit to draw on)."""
    return parse_case({"schema": 1, "name": name, "deployment": deployment, "trace": draw_trace(c, c.integer(2, 6))})


def build_case(c: Chooser, resolver, name: str | None = None) -> Case:
    """A drawn deployment (up to four draws the server accepts; the last
    drawn otherwise, whose run is then llama.cpp's answer) and a trace on it."""
    dep = draw_deployment(c)
    for _ in range(3):
        if resolver is None or resolver(parse_case(_probe(dep)).deployment.as_dict()) is not None:
            break
        dep = draw_deployment(c)
    return case_on(c, parse_case(_probe(dep)).deployment.as_dict(), None, name)


def _probe(dep: dict) -> dict:
    return {"schema": 1, "deployment": dep, "trace": [{"prompt": [{"segment": "A", "length": 1}]}]}
