"""The one list of oracles: every oracle kvspec has is one :class:`OracleRule`
of :data:`REGISTRY`, and every other list of oracle names (the campaign's
default set, the oracles that judge a build, those a live server's hit
counters cannot judge, the text of ``kvspec fuzz --help`` and the docs'
table) is derived from it, never written out again.

The rules the oracles state are in the modules that check them
(:mod:`fuzz.judge.oracle_hits`, :mod:`fuzz.judge.oracle_safety`, :mod:`fuzz.judge.oracle_states`,
:mod:`fuzz.judge.oracle_schedule`, :mod:`fuzz.judge.oracle_resolution`); the
dispatch is :func:`fuzz.judge.oracles.check_all`.

The docs' table (docs/judge.md, between :data:`BEGIN` and :data:`END`) is
regenerated with ``python -m fuzz.judge.oracle_registry --write-docs``; a test
fails when it is out of date.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from ground.files import write_text_atomic


@dataclass(frozen=True)
class OracleRule:
    """One oracle and what kind of judge it is."""

    name: str
    #: What it judges, in one line.
    judges: str
    #: In a campaign's default set (``kvspec fuzz``); else run only when
    #: asked (``kvspec check-build``, ``kvspec mutate``).
    default: bool = True
    #: Judges a build of a release (version ``X+LABEL.HASH``: a patched,
    #: local-tree or wheel engine). ``reference`` and ``knobs`` compare
    #: with the rule the *release* implements, which a patch is meant to
    #: change.
    build: bool = True
    #: Needs a variant run: the same engine runs the case again with one
    #: knob flipped (retention, speculative decoding).
    variant: bool = False
    #: Needs a second engine (another vLLM version) to compare with.
    second_engine: bool = False
    #: Judges something other than the hits (chunks, blocks, held states,
    #: the junction, Mamba block tables): its divergences carry the hits
    #: unchanged.
    same_hits: bool = False
    #: Its rule holds for every request of a concurrent trace (requests
    #: that share scheduler steps); the others judge the serial prefix.
    concurrent: bool = False
    #: Judges one request's hit against what must hold (a finding of it
    #: names one broken hit: ``fuzz.results.known_classes``).
    hit: bool = False
    #: A finding of it can be judged from a live server's hit counters
    #: alone (no knobs, explain or exception there).
    counters: bool = True
    #: What a finding of it costs a user, one of :data:`SEVERITIES`
    #: (``fuzz.results.cost``): ``wrong output possible`` (a target model's KV or
    #: state resumed over other tokens, or that no prefill wrote), ``crash``
    #: (vLLM raised), ``draft acceptance`` (only a drafter's KV reused over
    #: another next token: the target still verifies every draft, so the
    #: output is right and fewer drafts are accepted), ``lost reuse`` (fewer hits
    #: than what must hold), ``memory only`` (the hits right, what the cache
    #: holds or how it schedules wrong).
    severity: str = ""
    #: Its divergences compare hit counts (expected vs observed per request):
    #: where the engine hit less, the difference is prefill recomputed
    #: (``fuzz.results.cost``). The others have no token cost (the hits agree, or no
    #: hit is compared).
    token_cost: bool = False
    #: States the promise itself, about hybrid prefix caches and not one
    #: engine's code: it judges every engine family (SGLang too). The
    #: others state one engine's rules (vLLM's align-mode chunks, block
    #: tables, knobs, its retention rule) and judge that engine only.
    neutral: bool = False
    #: A safety rule: it judges a hit that is too *high* (a state or KV
    #: reused that may not be). A hit above the promise is judged by these
    #: and never by the promise's number alone (``kvspec run --compare``,
    #: ``fuzz.judge.verdict``).
    safety: bool = False
    #: Its rule holds under pressure (a request evicted cached blocks, or
    #: was preempted and resumed: ``explain[i].evicted`` /
    #: ``preempted_steps``), so it judges every request of such a trace;
    #: the others judge the requests before the first wave under pressure
    #: (docs/judge.md, "Under pressure"). Every safety oracle holds there.
    pressure: bool = False
    #: Its rule is the local prefix cache's own, so it judges the requests
    #: before the first one a KV connector loaded for
    #: (:func:`fuzz.judge.oracle_base.first_load`): a connector's lookup is
    #: its own, and what it loads is in the local cache afterwards. The
    #: others judge what a connector loads too (the promise, every safety
    #: oracle). docs/judge.md, "Under pressure".
    local: bool = False


REGISTRY: tuple[OracleRule, ...] = (
    OracleRule(
        "promise",
        "an identical resend or a longer sibling hits exactly what kvspec's promise predicts",
        hit=True,
        severity="lost reuse",
        token_cost=True,
        neutral=True,
    ),
    OracleRule(
        "stale",
        "every hit resumes from a Mamba state an earlier prefill or decode step wrote over the same tokens; no request keys a state it never computed (a KV connector's load of an earlier write is no such key)",
        concurrent=True,
        severity="wrong output possible",
        neutral=True,
        safety=True,
    ),
    OracleRule(
        "cap",
        "no hit reaches the last prompt token, which the engine must compute for its logits (a hit <= N-1, or the family's own cap), whatever supplied it",
        concurrent=True,
        severity="wrong output possible",
        neutral=True,
        safety=True,
    ),
    OracleRule(
        "keys",
        "a hit covers only tokens an earlier request keyed: kvspec's own block-hash chain over the case's tokens, not the engine's",
        concurrent=True,
        severity="wrong output possible",
        neutral=True,
        safety=True,
    ),
    OracleRule(
        "draft_keys",
        "under lookahead block hashes a hit's last block was keyed by an earlier request with the same lookahead tokens (the drafter's KV)",
        concurrent=True,
        severity="draft acceptance",
        neutral=True,
        safety=True,
    ),
    OracleRule(
        "retention",
        "sparse or periodic retention keeps only states a later request can resume at, and periodic every segment end written",
        same_hits=True,
        counters=False,
        severity="memory only",
    ),
    OracleRule(
        "split",
        "a prefill chunk other than the last ends only where align mode needs a state; no step after the prefill is cut",
        same_hits=True,
        counters=False,
        severity="memory only",
    ),
    OracleRule(
        "checkpoint",
        "a last chunk whose internal prefill checkpoint the kernel can export is not split there",
        same_hits=True,
        counters=False,
        severity="memory only",
    ),
    OracleRule(
        "hit_blocks",
        "a request takes exactly the full-attention blocks its hit covers",
        same_hits=True,
        counters=False,
        severity="memory only",
    ),
    OracleRule(
        "shared_prefix",
        "the junction a request reports is 0, or above its hit and within what full attention can have cached",
        same_hits=True,
        counters=False,
        severity="memory only",
    ),
    OracleRule(
        "block_table",
        "a running request's Mamba block table holds no freed or unretired block; a finished request leaks none",
        same_hits=True,
        concurrent=True,
        counters=False,
        severity="wrong output possible",
        pressure=True,
    ),
    OracleRule(
        "resolution",
        "the geometry vLLM resolved keeps its flags: hash block = --prefix-match-unit, dividing every block size",
        concurrent=True,
        counters=False,
        severity="lost reuse",
        pressure=True,
    ),
    OracleRule(
        "reference",
        "every request hits what the reference model predicts for the rule its release implements (the local prefix cache: no request from the first one a KV connector loaded for on)",
        build=False,
        severity="lost reuse",
        token_cost=True,
        local=True,
    ),
    OracleRule(
        "knobs",
        "the engine resolved the same knobs as the reference model",
        build=False,
        concurrent=True,
        counters=False,
        severity="lost reuse",
        pressure=True,
    ),
    OracleRule(
        "sparse_dense",
        "no promised request hits less under sparse retention than under dense on the same engine, capped by the promise",
        variant=True,
        hit=True,
        severity="lost reuse",
        token_cost=True,
    ),
    OracleRule(
        "spec_on_off",
        "speculative decoding moves the first resend's hit only by the documented EAGLE drop (the local lookup's: not where a KV connector loaded)",
        variant=True,
        hit=True,
        severity="lost reuse",
        token_cost=True,
        local=True,
    ),
    OracleRule(
        "resumed_state",
        "a request that resumes reads a Mamba state computed over exactly the tokens it resumes with, where the engine's state can be read",
        concurrent=True,
        counters=False,
        severity="wrong output possible",
        neutral=True,
        safety=True,
    ),
    OracleRule(
        "versions",
        "two engines agree on every request's hit (two vLLM versions, or SGLang's Python and Rust tree cores)",
        second_engine=True,
        concurrent=True,
        severity="lost reuse",
        token_cost=True,
        neutral=True,
    ),
    OracleRule(
        "engine_error",
        "the engine raised on a case the model accepts",
        concurrent=True,
        counters=False,
        severity="crash",
        neutral=True,
        pressure=True,
    ),
    OracleRule(
        "outputs",
        "a request served from the cache generates the same greedy tokens and top log-probabilities (within 5e-3) as on a cold engine, where the engine runs real weights",
        default=False,
        build=False,
        counters=False,
        same_hits=True,
        concurrent=True,
        severity="wrong output possible",
        neutral=True,
    ),  # fuzz/judge/oracle_outputs.py; no build of a real-weights engine yet
    OracleRule(
        "junction",
        "under sparse retention a sibling diverging inside an earlier prompt hits the promise at the junction, capped by dense",
        default=False,
        variant=True,
        severity="lost reuse",
        token_cost=True,
    ),
)

BY_NAME = {o.name: o for o in REGISTRY}

#: Severities, worst first: a silent wrong answer, then a crash, then a
#: drafter's KV reused over other tokens (drafts rejected, output right),
#: then prefill recomputed, then memory held (``kvspec findings`` orders
#: classes by this, then by tokens recomputed).
SEVERITIES = ("wrong output possible", "crash", "draft acceptance", "lost reuse", "memory only")


def names(keep=lambda o: True) -> tuple[str, ...]:
    """The names of the oracles ``keep`` holds for, in the registry's order."""
    return tuple(o.name for o in REGISTRY if keep(o))


#: A campaign's default set (``kvspec fuzz``).
ORACLES = names(lambda o: o.default)
#: Oracles a campaign runs only when asked (``kvspec check-build``).
EXTRA_ORACLES = names(lambda o: not o.default)
#: Every oracle a finding may name.
KNOWN_ORACLES = ORACLES + EXTRA_ORACLES
#: The oracles that judge a build of a release (version ``X+LABEL.HASH``).
BUILD_ORACLES = names(lambda o: o.build)
#: The oracles whose divergences carry the hits unchanged.
SAME_HITS_ORACLES = names(lambda o: o.same_hits)
#: The oracles whose rules hold for every request of a concurrent trace.
CONCURRENT_ORACLES = names(lambda o: o.concurrent)
#: The default oracles judged on one engine's observation.
SINGLE_ENGINE_ORACLES = names(lambda o: o.default and not o.second_engine)
#: Oracles that judge one request's hit against what must hold.
HIT_ORACLES = names(lambda o: o.hit)
#: Oracles whose findings a live server's hit counters cannot judge.
NOT_BY_COUNTERS = names(lambda o: not o.counters)
#: Oracles that run the case again on the same engine with a knob flipped.
VARIANT_ORACLES = names(lambda o: o.variant)
#: Oracles that judge every engine family (the promise's own rules).
NEUTRAL_ORACLES = names(lambda o: o.neutral)
#: The safety oracles: what judges a hit above the promise.
SAFETY_ORACLES = names(lambda o: o.safety)
#: The oracles whose rules hold under pressure (every safety oracle among them).
PRESSURE_ORACLES = names(lambda o: o.safety or o.pressure)
#: The oracles of the local prefix cache: not judged from a KV connector's first load on.
LOCAL_ORACLES = names(lambda o: o.local)


def listed(items) -> str:
    """``a, b and c``."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def build_sentence(oracles: tuple[str, ...] = ORACLES) -> str:
    """Which of ``oracles`` judge a build, and why the others do not."""
    judged = [o for o in oracles if BY_NAME[o].build]
    left = [o for o in oracles if not BY_NAME[o].build]
    return (
        f"A build is judged by the {listed(judged)} oracles: the {listed(left)} oracles state the rule of its release, "
        "which a patch is meant to change."
    )


def help_text(width: int = 78) -> str:
    """Every oracle, one line each, for ``kvspec fuzz --help``."""
    wide = max(len(o.name) for o in REGISTRY)
    lines = [
        "oracles (fuzz/judge/oracle_registry.py; * only when asked: check-build, mutate;",
        "b judges a build; v reruns the case with a knob flipped; 2 needs --engine twice):",
    ]
    for o in REGISTRY:
        marks = (
            ("" if o.default else "*")
            + ("b" if o.build else "")
            + ("v" if o.variant else "")
            + ("2" if o.second_engine else "")
        )
        head = f"  {o.name:<{wide}}  {marks:<3} "
        lines += textwrap.wrap(o.judges, width, initial_indent=head, subsequent_indent=" " * len(head))
    return "\n".join(lines)


BEGIN = "<!-- oracles: generated from fuzz/judge/oracle_registry.py by `python -m fuzz.judge.oracle_registry --write-docs`; do not edit -->"
END = "<!-- oracles: end -->"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "judge.md"


def _yes(flag: bool) -> str:
    return "yes" if flag else ""


def docs_table() -> str:
    """The docs' table of every oracle."""
    rows = [
        "| oracle | what it judges | default | build | variant run | concurrent | hit counters | severity |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in REGISTRY:
        rows.append(
            f"| `{o.name}` | {o.judges} | {_yes(o.default)} | {_yes(o.build)} | {'second engine' if o.second_engine else _yes(o.variant)} "
            f"| {_yes(o.concurrent)} | {_yes(o.counters)} | {o.severity}{' (tokens)' if o.token_cost else ''} |"
        )
    return "\n".join(rows)


def with_table(text: str) -> str:
    """``text`` with the part between :data:`BEGIN` and :data:`END` replaced
    by :func:`docs_table`; a text without both markers is an error."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the markers {BEGIN!r} and {END!r} are not both in the docs, in that order")
    return text[: start + len(BEGIN)] + "\n" + docs_table() + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fuzz.judge.oracle_registry", description="the oracle registry's generated text"
    )
    parser.add_argument(
        "--write-docs", action="store_true", help=f"rewrite the oracle table in {DOCS.relative_to(DOCS.parents[1])}"
    )
    parser.add_argument("--check-docs", action="store_true", help="exit 1 when the table is out of date")
    args = parser.parse_args(argv)
    text = DOCS.read_text()
    if args.write_docs:
        if with_table(text) != text:
            write_text_atomic(DOCS, with_table(text))
        return 0
    if args.check_docs:
        return 0 if with_table(text) == text else 1
    print(help_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
