"""The parts of a finding as text, for every family and segment kind: the
one place a prompt segment, a prompt and a deployment are written out.
``fuzz.results.findings.render`` (``kvspec findings``, ``check-build``'s
counterexamples), ``fuzz.draw.generate.describe`` (campaign lines),
``fuzz.results.report`` (``kvspec report``'s ISSUE.md) and replay's headline read
them, so a segment quoting an earlier output (``{"output": j}``) or an
SGLang deployment (``sglang_args``) prints the same everywhere.

Each function takes the case's JSON form (``reference.case.case_to_dict``,
as a finding file holds it) and never raises on a field it does not know:
a printer shows what is there.
"""

from __future__ import annotations

from ground.engines import DEFAULT_FAMILY, FAMILIES


def segment_text(s: dict, *, style: str = "short") -> str:
    """One prompt segment: ``A:5000`` (the first 5000 tokens of stream A)
    or ``out0`` (request 0's output). ``style="prose"``: ``A[:5000]`` and
    ``output of 0`` (a report's table)."""
    if "output" in s:
        return f"output of {s['output']}" if style == "prose" else f"out{s['output']}"
    return f"{s.get('segment')}[:{s.get('length')}]" if style == "prose" else f"{s.get('segment')}:{s.get('length')}"


def prompt_text(prompt: list, *, sep: str = " + ", style: str = "short") -> str:
    """A request's prompt: its segments, in order."""
    return sep.join(segment_text(s, style=style) for s in prompt)


def engine_title(name: str | None) -> str:
    """The family title of an engine name (``vllm==X`` -> ``vLLM``); the
    name itself when it is no family's."""
    head = (name or "").partition("==")[0]
    return FAMILIES[head].title if head in FAMILIES else (name or "?")


def serve_args(deployment: dict) -> tuple[str, list[str]]:
    """The serve command of a deployment's family and its flags
    (``vllm serve``, ``vllm_args``; ``python -m sglang.launch_server``,
    ``sglang_args``)."""
    family = FAMILIES.get(deployment.get("engine") or DEFAULT_FAMILY)
    if family is None:
        return f"{deployment.get('engine')} (unknown family)", []
    return family.serve, [str(a) for a in deployment.get(family.args_field) or []]


def deployment_title(deployment: dict) -> str:
    """The title of a deployment's family (``vLLM``, ``SGLang``)."""
    family = FAMILIES.get(deployment.get("engine") or DEFAULT_FAMILY)
    return family.title if family is not None else "the engine"


def deployment_text(deployment: dict) -> str:
    """``MODEL on PLATFORM[/DEVICE]: SERVE FLAGS...``."""
    serve, args = serve_args(deployment)
    where = f"{deployment.get('platform')}" + (f"/{deployment['device']}" if deployment.get("device") else "")
    return f"{deployment.get('model')} on {where}: {' '.join([serve, *args])}"
