"""Case generation from a stream of choices, shared by Hypothesis and atheris.

Both drivers feed the same builder through a ``Chooser`` (``integer(lo, hi)``
and ``choice(seq)``, ``fuzz.draw.choosers``), so a Hypothesis example and an
atheris input describe the same space.

By default a case is a **deployment** (``draw_deployment``): a shipped model
(six hybrids; two attention-free Mamba models, with a ``--block-size`` of
{default, 64, 256, 1024}) x tensor parallel {1, 2, 4, 8} x KV-cache dtype
{auto, fp8} x speculative {off, MTP 1-3, MTP with the block drop, another
method: ``ngram``, ``eagle`` or ``eagle3`` 1-3 with the drop options on and
off (:data:`OTHER_METHODS`; every model, EAGLE-3 where vLLM serves it)} x GPU {h100, a100}, then the flags that leave the block size
alone: chunk budget, prefix match unit, retention (sparse / dense /
periodic), and, with speculative decoding and a unit below the block, the
shared-prefix checkpoint (``--enable-mamba-shared-prefix-checkpoint``); a
class that pins a hash unit prefers a deployment the engine resolves with
internal checkpoints and, three times in four, a unit finer than their grid
(``fuzz.draw.straddle``: prefills that end some at a checkpoint, some at a
hash-unit tail); last,
from a stream of its own, ``--scheduling-policy`` {default, fcfs, priority}
(a case carries no request priority: every request has priority 0); and,
in one deployment in four, a KV connector (vLLM's CPU offloading,
``--kv-offloading-size``: :data:`CONNECTOR_MODES`; ``kvspec fuzz
--kv-connector`` pins it). The engine resolves it with
vLLM's own code (``resolver``: deployment -> its block, hash block and
max_model_len, or None when vLLM rejects it), so the trace can be drawn on
the real block.

With ``synthetic=True`` a case is a hand geometry instead (production-like
and random block sizes): kvspec's choice, labelled synthetic in findings.

Traces are identical resends, longer siblings, siblings diverging at any
point, junction chains (a further sibling diverging at a junction an
earlier sibling created: the junction rule's state), interleaved
conversations, short prompts and block-aligned prompts (nB-1, nB, nB+1,
nB+r with 2 <= r <= n, and the same around hash-unit boundaries); each
request generates 1, 2 or 4 tokens. One case in five ends with a
concurrent wave: a new prompt and 1-3 requests sharing its prefix, sent
0-3 scheduler steps after one another (``_concurrent_wave``); one in
twenty a conversation before that (the chat shape: ``fuzz.draw.conversation``).

The random driver walks the deployment classes (:class:`DeploymentClass`:
model x speculative mode x hash unit x retention, the features the
promise's boundaries depend on; a non-MTP method is one ``other`` class per
model and hash unit, its method and retention drawn inside it) in turn (:func:`class_schedule`) rather
than drawing each feature apart, so a rare conjunction is reached within
a minute; atheris's inputs choose the class first (``fuzz.draw.codec``);
Hypothesis draws every feature apart.

The trace half (lengths, request kinds, outputs, waves, swarm testing)
lives in ``fuzz.draw.traces``. What comes out is a semantic case
(``reference.case.Case``), never bytes.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from fuzz.draw.choosers import BytesChooser, Chooser, HypothesisChooser
from fuzz.draw.straddle import FAVOUR_EVERY, may_straddle, settled, straddling_unit
from fuzz.draw.traces import (  # noqa: F401 (re-exported)
    EVERY_FEATURE,
    MAX_REQUESTS,
    SEGMENT_NAMES,
    Swarm,
    _concurrent_wave,
    _fit,
    _length,
    _outputs,
    _trace,
    _with_conversation,
    draw_swarm,
)
from fuzz.results.finding_text import prompt_text
from reference.case import Case, case_to_dict, parse_case

#: Production-like geometries: (attention block, Mamba block, Mamba groups, prefix_match_unit).
NAMED_GEOMETRIES = (
    (1600, 1600, 3, None),
    (1568, 1568, 3, None),
    (32, 16, 1, 16),
    (16, 32, 1, 16),
    (32, 32, 3, None),
    (64, 64, 1, None),
)
SPECULATIVE = (
    None,
    {"method": "mtp", "num_speculative_tokens": 2, "disable_lookahead_block_hashes": True},  # the block drop
    {"method": "mtp", "num_speculative_tokens": 2},  # 0.33.0: lookahead hashes
    {"method": "mtp", "num_speculative_tokens": 1, "disable_lookahead_block_hashes": True},
)

#: Shipped models a deployment draws from; those with an MTP layer; the
#: attention-free ones (one KV cache group, a block ``--block-size`` sets).
DEPLOYMENT_MODELS = (
    "qwen3_next",
    "qwen3_5",
    "nemotron_h",
    "falcon_h1",
    "granitemoehybrid",
    "jamba",
    "mamba2",
    "falcon_mamba",
)
MTP_MODELS = ("qwen3_next", "qwen3_5")
ATTENTION_FREE_MODELS = ("mamba2", "falcon_mamba")
DEVICES = ("h100", "a100")
#: The longest prompt a drawn trace may hold (tokens; the engine's cost).
MAX_DRAWN_PROMPT = 24_000
#: A resolver: a deployment dict -> {"block", "hash", "max_model_len"} or None.
Resolver = Callable[[dict], "dict | None"]
#: When every drawn deployment is rejected: one vLLM always builds.
FALLBACK_DEPLOYMENT = {
    "model": "qwen3_next",
    "vllm_args": ["--enable-prefix-caching"],
    "platform": "cuda",
    "device": "a100",
}


def _geometry(c: Chooser) -> dict:
    if c.integer(0, 3):
        attention, mamba, count, unit = c.choice(NAMED_GEOMETRIES)
    else:
        base = c.choice((16, 32, 64))
        attention, mamba = base * c.integer(1, 4), base * c.integer(1, 4)
        if max(attention, mamba) % min(attention, mamba):
            mamba = attention
        count, unit = c.integer(1, 3), None
    geometry = {
        "groups": [
            {"kind": "full_attention", "block_size": attention},
            {"kind": "mamba", "block_size": mamba, "count": count},
        ],
        "prefix_match_unit": unit,
    }
    scheduler = max(attention, mamba)
    retention = c.choice(("sparse", "sparse", "sparse", "dense", "periodic"))
    geometry["retention_interval"] = {"sparse": 0, "dense": None, "periodic": scheduler * c.integer(1, 3)}[retention]
    geometry["max_num_batched_tokens"] = c.choice((8192, 8192, 2048, scheduler * c.integer(1, 4)))
    return geometry


#: Speculative modes a deployment class names: off, MTP with lookahead
#: hashes (0.33.0; the drop before), MTP with the EAGLE block drop, and
#: ``other``: a method other than MTP, drawn inside the class
#: (:data:`OTHER_METHODS`), with the drop options on and off.
SPEC_MODES = ("off", "mtp", "drop", "other")
RETENTIONS = ("sparse", "dense", "periodic")
#: KV connectors a deployment may carry: ``drawn`` (one deployment in
#: four gets vLLM's CPU offloading connector), ``offloading`` (every one),
#: ``none``. ``--kv-offloading-size`` (GiB of CPU memory) selects vLLM's
#: ``OffloadingConnector`` (``VllmConfig._post_init_kv_transfer_config``,
#: 0.33.0), and with any connector vLLM keeps the legacy block hashes
#: (``num_hash_lookahead_tokens`` is 0): MTP deployments are back on the
#: EAGLE drop.
CONNECTOR_MODES = ("drawn", "offloading", "none")
OFFLOADING_GIB = ("1", "4", "16")
#: Speculative methods an ``other`` class draws, as vLLM 0.33.0 builds them
#: without a drafter named by the case. ``ngram`` (prompt lookup): no
#: drafter KV, so no EAGLE block drop and no lookahead hashes whatever the
#: options say; its drafts widen each decode step and size the Mamba
#: groups' speculative blocks. ``eagle``, ``eagle3``: kvspec's own one-layer
#: drafter (``engine_adapter.models.served.drafter_config``), its KV layer
#: in the attention group: the drop, or lookahead hashes, as single-module
#: MTP. EAGLE-3 only on :data:`EAGLE3_MODELS`. Draft models, DFlash and
#: suffix decoding are not drawn (the allow-list refuses them).
OTHER_METHODS = ("ngram", "eagle", "eagle3")
#: The shipped models whose vLLM 0.33.0 class implements ``SupportsEagle3``
#: (qwen3_next.py, qwen3_5.py, nemotron_h.py): vLLM's worker refuses
#: EAGLE-3 on the others (the resolver says so too).
EAGLE3_MODELS = ("qwen3_next", "qwen3_5", "nemotron_h")
#: ``--scheduling-policy`` values a deployment case draws (None: vLLM's
#: default, fcfs). A case carries no request priority, so under
#: ``priority`` every request has vLLM's default priority 0.
SCHEDULING_POLICIES = (None, "fcfs", "priority")
#: The retention an ``other`` class pins: ``any`` (drawn inside the class,
#: so the non-MTP methods add one class per model and hash unit, not three).
ANY_RETENTION = "any"


@dataclass(frozen=True)
class DeploymentClass:
    """The deployment features the promise's boundaries depend on (the
    reference model's knobs): the model (its layers, internal checkpoints,
    one or two KV cache groups), the speculative mode (the EAGLE drop, the
    lookahead hashes), whether a hash unit finer than the block is set
    (hash-unit tails, partial hits) and the retention mode (which states
    are kept: sparse, dense, periodic segment ends). Everything else
    (parallelism, dtype, GPU, chunk budget, the unit's value) is drawn."""

    model: str
    spec: str  # SPEC_MODES
    unit: bool
    retention: str  # RETENTIONS, or ANY_RETENTION for spec "other"

    def label(self) -> str:
        return f"{self.model}/{self.spec}/{'unit' if self.unit else 'block'}/{self.retention}"


@functools.cache
def deployment_classes() -> tuple[DeploymentClass, ...]:
    """Every class (the MTP modes only for the models with an MTP layer;
    ``other`` for every model, with its retention drawn; no finer hash
    unit for the attention-free models, whose one KV cache group vLLM lets
    hash only on the block)."""
    return tuple(
        DeploymentClass(m, spec, unit, ret)
        for m in DEPLOYMENT_MODELS
        for spec in (SPEC_MODES if m in MTP_MODELS else ("off", "other"))
        for unit in ((False,) if m in ATTENTION_FREE_MODELS else (False, True))
        for ret in ((ANY_RETENTION,) if spec == "other" else RETENTIONS)
    )


def class_schedule(rng, favoured: set[str] | None = None) -> Iterator[DeploymentClass]:
    """Every deployment class in turn, in a fresh seeded order each round,
    so a campaign of a minute visits each class many times instead of
    leaving a conjunction of rare features to chance. With ``favoured`` (the
    models a campaign saw a hash unit straddle the checkpoint grid on,
    filled as it draws: ``fuzz.draw.straddle``), one deployment in
    ``FAVOUR_EVERY`` is one of those models' unit classes, in a seeded
    rotation."""
    classes = list(deployment_classes())
    extra: list[DeploymentClass] = []
    n = 0
    while True:
        rng.shuffle(classes)
        for cls in classes:
            yield cls
            n += 1
            if favoured and n % (FAVOUR_EVERY - 1) == 0:
                if not extra:
                    extra = [k for k in classes if k.unit and k.model in favoured]
                    rng.shuffle(extra)
                if extra:
                    yield extra.pop()


def draw_deployment(c: Chooser, cls: DeploymentClass | None = None) -> dict:
    """A deployment's model, parallelism, KV-cache dtype, speculative
    decoding and GPU (the choices that move the block size); ``cls`` pins
    the model and the speculative mode."""
    model = c.choice(DEPLOYMENT_MODELS) if cls is None else cls.model
    args = [
        "--enable-prefix-caching",
        "--tensor-parallel-size",
        str(c.choice((1, 2, 4, 8))),
        "--kv-cache-dtype",
        c.choice(("auto", "fp8")),
    ]
    if model in ATTENTION_FREE_MODELS:
        # no attention backend sets the block: vLLM keeps --block-size (16 by
        # default) as the Mamba block, so a deployment picks its checkpoint spacing
        size = c.choice((None, 64, 256, 1024))
        if size is not None:
            args += ["--block-size", str(size)]
    if model in MTP_MODELS and (cls is None or cls.spec != "other"):
        if cls is None:
            spec = c.choice((None, None, 1, 2, 3, "drop", "other"))
        else:
            spec = None if cls.spec == "off" else "drop" if cls.spec == "drop" else c.choice((1, 2, 3))
        if spec == "other":
            args += ["--speculative-config", _other_speculative(c, model)]
        elif spec is not None:
            config = {"method": "mtp", "num_speculative_tokens": 2 if spec == "drop" else spec}
            if spec == "drop":
                config["disable_lookahead_block_hashes"] = True
            args += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    elif (cls is None and c.integer(0, 3) == 0) or (cls is not None and cls.spec == "other"):
        args += ["--speculative-config", _other_speculative(c, model)]
    return {"model": model, "vllm_args": args, "platform": "cuda", "device": c.choice(DEVICES)}


def _other_speculative(c: Chooser, model: str) -> str:
    """A non-MTP method (:data:`OTHER_METHODS`; EAGLE-3 only on
    :data:`EAGLE3_MODELS`, ngram only on the attention-free models) with 1-3 draft tokens and the drop options drawn
    on and off (ngram: prompt lookup of up to 2-5 tokens; the options must
    leave its hits alone: it has no drafter KV)."""
    if model in ATTENTION_FREE_MODELS:
        methods: tuple[str, ...] = ("ngram",)  # an EAGLE drafter there is outside kvspec's model (the resolver says so)
    else:
        methods = OTHER_METHODS if model in EAGLE3_MODELS else tuple(m for m in OTHER_METHODS if m != "eagle3")
    config: dict = {"method": c.choice(methods), "num_speculative_tokens": c.integer(1, 3)}
    if config["method"] == "ngram" and c.integer(0, 1):
        config["prompt_lookup_max"] = c.integer(2, 5)
    for option in ("disable_eagle_block_drop", "disable_lookahead_block_hashes"):
        if c.integer(0, 3) == 0:
            config[option] = True
    return json.dumps(config, separators=(",", ":"))


def _dividing_units(block: int) -> list[int]:
    """The ``--prefix-match-unit`` values drawn that divide the block (and
    are below it): the ones every release accepts."""
    return [u for u in (16, 32, 64, 128) if u < block and block % u == 0]


def _deployment_flags(c: Chooser, block: int, defaults: dict, cls: DeploymentClass | None = None) -> list[str]:
    """Flags that leave the block size alone: budget, match unit, retention
    (``cls`` pins whether a unit is set and the retention mode)."""
    args: list[str] = []
    budget = c.choice((None, 2048, 8192, 16384, block * c.integer(1, 4)))
    if budget is not None:
        args += ["--max-num-batched-tokens", str(budget)]
        if budget < defaults.get("max_num_seqs", 256):
            args += ["--max-num-seqs", str(max(1, min(budget, 16)))]
    units = _dividing_units(block)
    if units and (c.integer(0, 2) == 0 if cls is None else cls.unit):
        # and one unit that does not divide the block: vLLM rejects it (every
        # group's block size must be divisible by it); a build must too
        # (build_deployment_case keeps it only where the engine accepts it)
        units.append(
            next(u for u in range(48, block, 16) if block % u)
            if any(block % u for u in range(48, block, 16))
            else units[0]
        )
        args += ["--prefix-match-unit", str(c.choice(units))]
    pinned = cls is not None and cls.retention != ANY_RETENTION
    retention = (
        {"sparse": "0", "dense": "None", "periodic": "periodic"}[cls.retention]
        if pinned
        else c.choice(("0", "0", "0", "None", "periodic"))
    )
    if retention == "periodic":
        retention = str(block * c.integer(1, 3))
    args += ["--prefix-cache-retention-interval", retention]
    return args


def _connector_flags(c: Chooser, connector: str) -> list[str]:
    """A KV connector's flags (:data:`CONNECTOR_MODES`): drawn last, so the
    deployment's other draws stay those of a stream without it."""
    drawn, size = c.integer(0, 3) == 0, c.choice(OFFLOADING_GIB)  # both always drawn: the pin moves no later draw
    if connector == "offloading" or (connector == "drawn" and drawn):
        return ["--kv-offloading-size", size]
    return []


def first_resolved(
    draw: Callable[[], dict],
    resolver: Resolver,
    fallback: dict,
    unresolved: dict,
    tries: int = 4,
    prefer: Callable[[dict], bool] | None = None,
) -> tuple[dict, dict]:
    """The first of up to ``tries`` drawn deployments the engine resolves
    (``resolver``), with what it resolved; with ``prefer``, the first whose
    resolution it accepts, else the first resolved; else ``fallback`` (one
    the engine always builds), with ``unresolved``'s units if even that is
    not resolved."""
    first = None
    for _ in range(tries):
        dep = draw()
        info = resolver(dep)
        if info and (prefer is None or prefer(info)):
            return dep, info
        first = first or ((dep, info) if info else None)
    if first is not None:
        return first
    dep = dict(fallback)
    return dep, resolver(dep) or unresolved


def build_deployment_case(
    c: Chooser,
    resolver: Resolver,
    name: str | None = None,
    *,
    boundary_bias: bool = True,
    cls: DeploymentClass | None = None,
    connector: str = "drawn",
    pressure: str = "drawn",
    noted: set[str] | None = None,
) -> Case:
    """Draw a deployment case: a deployment vLLM builds (``resolver`` says
    which ones it rejects; up to four draws, then a fallback), then a trace
    on its resolved block. A drawn ``--prefix-match-unit`` that does not
    divide the block (or any unit, with the single KV cache group of an
    attention-free model) is kept only where the resolver (the engine under
    test) accepts it: a release rejects it, so the flag is dropped there;
    a build that accepts it gets the case (``resolution`` judges it).
    ``cls`` pins the deployment class (:class:`DeploymentClass`);
    ``connector`` whether it carries a KV connector (:data:`CONNECTOR_MODES`:
    kept only where the engine accepts it, as the unit is); ``noted``
    collects the model when its unit straddles the checkpoint grid
    (:func:`class_schedule`'s ``favoured``)."""
    wants_unit = cls is not None and cls.unit
    dep, info = first_resolved(
        lambda: draw_deployment(c, cls),
        resolver,
        FALLBACK_DEPLOYMENT,
        {"block": 544, "hash": 544, "max_model_len": 32768},
        # a unit class: a deployment whose checkpoint grid a unit can straddle (fuzz.draw.straddle)
        prefer=settled if wants_unit else None,
    )
    block = int(info["block"])
    args = list(dep["vllm_args"]) + _deployment_flags(
        c, block, info, cls if cls is not None and dep["model"] == cls.model else None
    )
    unit = None
    if "--prefix-match-unit" in args:
        unit = int(args[args.index("--prefix-match-unit") + 1])
        if (block % unit or dep["model"] in ATTENTION_FREE_MODELS) and not resolver({**dep, "vllm_args": args}):
            at = args.index("--prefix-match-unit")
            del args[at : at + 2]
            unit = None
            pinned = cls is not None and cls.unit and dep["model"] == cls.model
            dividing = _dividing_units(block)
            if pinned and dividing and dep["model"] not in ATTENTION_FREE_MODELS:
                # the class asks for a hash unit: the engine refused the probe,
                # so the case gets one it accepts instead of none (else half of
                # a unit class's cases would run without a unit)
                unit = c.choice(dividing)
                args[at:at] = ["--prefix-match-unit", str(unit)]
    straddle = unit is not None and block % unit == 0 and wants_unit and dep["model"] == cls.model
    if straddle and may_straddle(info) and c.integer(0, 3):
        # three in four: a unit finer than the checkpoint grid the engine resolves with it (a kept
        # unit that does not divide the block stays: it probes the engine's own check)
        at = args.index("--prefix-match-unit") + 1
        unit, straddled = straddling_unit(
            c, unit, block, lambda u: resolver({**dep, "vllm_args": [*args[:at], str(u), *args[at + 1 :]]})
        )
        args[at] = str(unit)
        if straddled and noted is not None:
            noted.add(dep["model"])
    if unit is not None and unit < block and "--speculative-config" in args and c.integer(0, 2) == 0:
        # vLLM 0.32.0+: a Mamba checkpoint at the shared-prefix junction (it
        # acts only with EAGLE/MTP and a unit below the block); a version
        # that does not know the flag rejects it, and it is dropped there
        args.append("--enable-mamba-shared-prefix-checkpoint")
        if not resolver({**dep, "vllm_args": args}):
            args.pop()
    extra = _connector_flags(c, connector)
    if extra and resolver({**dep, "vllm_args": args + extra}):
        args += extra
    return _case_on(
        c,
        {**dep, "vllm_args": args},
        info,
        unit,
        name,
        boundary_bias,
        policy=True,
        resolver=resolver,
        pressure=pressure,
    )


def _case_on(
    c: Chooser,
    deployment: dict,
    info: dict,
    unit: int | None,
    name: str | None,
    boundary_bias: bool,
    policy: bool = False,
    resolver: Resolver | None = None,
    pressure: str = "none",
) -> Case:
    """A trace drawn on a resolved deployment (``info``: its block and
    max_model_len; ``unit``: its hash unit, or None); with ``policy``, a
    ``--scheduling-policy`` (:data:`SCHEDULING_POLICIES`) drawn after
    everything else, from a stream of its own where the chooser has a side
    stream (the side stream's side: the wave reads the side stream at this
    point), so the deployment and trace a seed draws stay as they were. It
    leaves the block alone, so the resolution ``info`` still holds. Last,
    with a ``resolver``, the pool (``pressure``, ``fuzz.draw.generate_pressure``),
    from a stream of its own too, kept where the engine accepts it."""
    block = int(info["block"])
    cap = max(1, min(MAX_DRAWN_PROMPT, int(info.get("max_model_len") or MAX_DRAWN_PROMPT) - 64))
    trace = _with_conversation(c, _outputs(c, _trace(c, block, boundary_bias, unit, cap)), block, cap, cap)
    if policy and "--scheduling-policy" not in deployment["vllm_args"]:
        chosen = (c.side().side() if hasattr(c, "side") else c).choice(SCHEDULING_POLICIES)
        if chosen is not None:
            deployment = {**deployment, "vllm_args": [*deployment["vllm_args"], "--scheduling-policy", chosen]}
    if policy and info.get("async_scheduling") and "--no-async-scheduling" not in deployment["vllm_args"]:
        from fuzz.draw.generate_pressure import draw_scheduling  # async or sync, from a stream of its own

        chosen = draw_scheduling(c.side().side().side().side() if hasattr(c, "side") else c, True)
        deployment = {**deployment, "vllm_args": [*deployment["vllm_args"], *chosen]}
        info = {**info, "async_scheduling": not chosen}
    case = parse_case({"schema": 1, "name": name, "deployment": deployment, "trace": trace})
    if resolver is not None and pressure != "none" and info.get("groups"):
        case = _under_pressure(c, case, deployment, trace, info, resolver, pressure)
    return case


def _under_pressure(c: Chooser, case: Case, deployment: dict, trace: list, info: dict, resolver, mode: str) -> Case:
    """``case`` with a pinned pool at a drawn level (``fuzz.draw.generate_pressure``),
    drawn from a stream of its own (the side stream's third), so the
    deployment and trace stay those of a stream without it; the case as it
    was where the engine refuses the pool."""
    from fuzz.draw import generate_pressure as P

    stream = c.side().side().side() if hasattr(c, "side") else c
    level = P.draw_level(stream, mode)
    if level is None or P.POOL_FLAG in deployment["vllm_args"]:
        return case
    lengths = [r.num_prompt_tokens + r.max_tokens for r in case.trace]
    args = [a for a in deployment["vllm_args"]]
    if "--max-model-len" in args:
        at = args.index("--max-model-len")
        del args[at : at + 2]
    sizing = P.Sizing.of(lengths, info)
    flags = P.pressure_flags(P.draw_pool(stream, level, sizing), sizing)
    pinned = {**deployment, "vllm_args": args + flags}
    if not resolver(pinned):
        return case
    return parse_case({"schema": 1, "name": case.name, "deployment": pinned, "trace": trace})


def another_trace(c: Chooser, case: Case, resolver: Resolver, pressure: str = "drawn") -> Case | None:
    """Another trace on ``case``'s deployment (resolved again through
    ``resolver``, which a campaign keeps per deployment): a campaign draws a
    few traces per drawn deployment, so vLLM's resolution of it is paid
    once; None when the resolver no longer resolves it."""
    dep = case.deployment
    assert dep is not None
    from fuzz.draw.generate_pressure import strip_pool

    raw = {
        "model": dep.model,
        "vllm_args": strip_pool(list(dep.vllm_args)),
        "platform": dep.platform,
        "device": dep.device,
        **({"model_overrides": dict(dep.model_overrides)} if dep.model_overrides else {}),
    }
    info = resolver(raw)
    if not info:
        return None
    args = raw["vllm_args"]
    unit = int(args[args.index("--prefix-match-unit") + 1]) if "--prefix-match-unit" in args else None
    return _case_on(c, raw, info, unit, case.name, True, resolver=resolver, pressure=pressure)


def build_case(
    c: Chooser,
    name: str | None = None,
    *,
    boundary_bias: bool = True,
    geometry: dict | None = None,
    speculative: dict | None | str = "draw",
    resolver: Resolver | None = None,
    cls: DeploymentClass | None = None,
    connector: str = "drawn",
    pressure: str = "drawn",
    noted: set[str] | None = None,
) -> Case:
    """Draw one case. Every draw is valid by construction. With a
    ``resolver`` a deployment case (of class ``cls`` when given); without,
    a hand (synthetic) geometry, where ``geometry`` and ``speculative`` pin
    those parts instead of drawing them (``connector``: a deployment's KV
    connector, :data:`CONNECTOR_MODES`; ``pressure``: its pool,
    ``fuzz.draw.generate_pressure.PRESSURE_MODES``)."""
    if resolver is not None:
        return build_deployment_case(
            c, resolver, name, boundary_bias=boundary_bias, cls=cls, connector=connector, pressure=pressure, noted=noted
        )
    geometry = geometry if geometry is not None else _geometry(c)
    speculative = c.choice(SPECULATIVE) if speculative == "draw" else speculative
    block = max(g["block_size"] for g in geometry["groups"])
    trace = _with_conversation(c, _outputs(c, _trace(c, block, boundary_bias)), block, None, MAX_DRAWN_PROMPT)
    raw = {"schema": 1, "name": name, "geometry": geometry, "speculative": speculative, "trace": trace}
    return parse_case(raw)


def case_from_bytes(data: bytes, resolver: Resolver | None = None) -> Case:
    return build_case(BytesChooser(data), resolver=resolver)


def hypothesis_cases(resolver: Resolver | None = None, builder: Callable[[Chooser, Resolver], Case] | None = None):
    """A Hypothesis strategy of cases (deployments with a ``resolver``;
    ``builder(chooser, resolver)`` draws another family's instead, e.g.
    ``fuzz.draw.generate_sglang.build_sglang_case``)."""
    from hypothesis import strategies as st

    @st.composite
    def cases(draw):
        if builder is not None:
            return builder(HypothesisChooser(draw), resolver)
        return build_case(HypothesisChooser(draw), resolver=resolver)

    return cases()


def describe(case: Case) -> str:
    """A one-line description: geometry (or deployment), speculative, requests."""
    raw = case_to_dict(case)
    if raw.get("geometry") is None:
        reqs = " ".join(prompt_text(r["prompt"], sep="+") for r in raw["trace"])
        return f"{case.deployment.describe()} | {reqs}"
    g = raw["geometry"]
    groups = "+".join(f"{x['kind'][0]}{x['block_size']}x{x['count']}" for x in g["groups"])
    spec = raw["speculative"] or {}
    spec_text = (
        "off"
        if not spec
        else f"{spec['method']}{spec['num_speculative_tokens']}"
        + ("/drop" if spec.get("disable_lookahead_block_hashes") else "")
    )
    reqs = " ".join(prompt_text(r["prompt"], sep="+") for r in raw["trace"])
    return f"{groups} S={g['scheduler_block_size']} ret={g['retention_interval']} spec={spec_text} | {reqs}"
