"""SGLang's known classes, declared by its family (``ground.engines``'
``classes`` entry names this module): :data:`CLASSES` join
``fuzz.results.known_classes.KNOWN_CLASSES``, the one registry, and :func:`classify`
tells a low-hit SGLang finding's class (``fuzz.results.known_classes.classify``
asks it). The rules: ``reference/sglang_prefill.py``.
"""

from __future__ import annotations

from fuzz.judge.oracles import request_kinds
from ground.errors import KvspecError
from reference.case import parse_case, prompt_tokens

#: ``(id, release, promise, rule)`` each (``fuzz.results.known_classes.KnownClass``'s fields).
CLASSES = (
    (
        "sglang-grid-resend",
        "sglang==0.5.23",
        "R1",
        "SGLang: an identical resend of a prompt of k x grid tokens hits below the promise",
    ),
    (
        "sglang-sibling-branch",
        "sglang==0.5.23",
        "R2",
        "SGLang: a resend or extension of a sibling hits below the promise (the sibling kept its branching point only)",
    ),
)


def classify(finding: dict, kind: str, g: dict) -> str | None:
    """An SGLang finding's class: the first low request's earliest prefix
    in the trace (the request it resends or extends) was itself a sibling
    (it diverged inside an earlier prompt): ``sglang-sibling-branch``; else
    a resend of a prompt of a whole number of grids (the geometry's block):
    ``sglang-grid-resend``."""
    if kind not in ("resend", "extension"):
        return None
    try:
        case = parse_case(finding["case"])
    except (KvspecError, KeyError, TypeError):
        return None
    i = finding["first_divergence"]
    prompts = [prompt_tokens(r) for r in case.trace[: i + 1]]
    mine = prompts[i]
    earlier = [j for j in range(i) if mine[: len(prompts[j])] == prompts[j]]  # its prefixes among the earlier prompts
    if not earlier:
        return None
    longest = max(len(prompts[j]) for j in earlier)
    first = min(
        j for j in earlier if len(prompts[j]) == longest
    )  # the first request that sent the prompt it repeats or extends
    kinds = request_kinds(case)
    if kinds[first] == "sibling":
        return "sglang-sibling-branch"
    grid = g.get("scheduler_block_size")
    if kind == "resend" and isinstance(grid, int) and grid > 0 and len(mine) % grid == 0:
        return "sglang-grid-resend"
    return None
