"""Case generation from a stream of choices, shared by Hypothesis and atheris.

Both drivers feed the same builder through a ``Chooser`` (``integer(lo, hi)``
and ``choice(seq)``, ``fuzz.choosers``), so a Hypothesis example and an
atheris input describe the same space.

By default a case is a **deployment** (``draw_deployment``): a shipped model
(six hybrids; two attention-free Mamba models, with a ``--block-size`` of
{default, 64, 256, 1024}) x tensor parallel {1, 2, 4, 8} x KV-cache dtype
{auto, fp8} x speculative {off, MTP 1-3, MTP with the block drop} x GPU
{h100, a100}, then the flags that leave the block size alone: chunk budget,
prefix match unit, retention (sparse / dense / periodic), with MTP and
a unit below the block the shared-prefix checkpoint
(``--enable-mamba-shared-prefix-checkpoint``), and, in one deployment in
four, a KV connector (vLLM's CPU offloading, ``--kv-offloading-size``:
:data:`CONNECTOR_MODES`; ``kvspec fuzz --kv-connector`` pins it). The engine resolves it with
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
0-3 scheduler steps after one another (``_concurrent_wave``).

The random driver walks the deployment classes (:class:`DeploymentClass`:
model x speculative mode x hash unit x retention, the features the
promise's boundaries depend on) in turn (:func:`class_schedule`) rather
than drawing each feature apart, so a rare conjunction is reached within
a minute; atheris's inputs choose the class first (``fuzz.codec``);
Hypothesis draws every feature apart.

What comes out is a semantic case (``reference.case.Case``), never bytes.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Callable, Iterator

from fuzz.choosers import BytesChooser, Chooser, HypothesisChooser
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
MAX_REQUESTS = 6
SEGMENT_NAMES = "ABCDEFGH"

#: Shipped models a deployment draws from; those with an MTP layer; the
#: attention-free ones (one KV cache group, a block ``--block-size`` sets).
DEPLOYMENT_MODELS = ("qwen3_next", "qwen3_5", "nemotron_h", "falcon_h1", "granitemoehybrid", "jamba", "mamba2", "falcon_mamba")
MTP_MODELS = ("qwen3_next", "qwen3_5")
ATTENTION_FREE_MODELS = ("mamba2", "falcon_mamba")
DEVICES = ("h100", "a100")
#: The longest prompt a drawn trace may hold (tokens; the engine's cost).
MAX_DRAWN_PROMPT = 24_000
#: A resolver: a deployment dict -> {"block", "hash", "max_model_len"} or None.
Resolver = Callable[[dict], "dict | None"]
#: When every drawn deployment is rejected: one vLLM always builds.
FALLBACK_DEPLOYMENT = {"model": "qwen3_next", "vllm_args": ["--enable-prefix-caching"], "platform": "cuda", "device": "a100"}


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
        "groups": [{"kind": "full_attention", "block_size": attention}, {"kind": "mamba", "block_size": mamba, "count": count}],
        "prefix_match_unit": unit,
    }
    scheduler = max(attention, mamba)
    retention = c.choice(("sparse", "sparse", "sparse", "dense", "periodic"))
    geometry["retention_interval"] = {"sparse": 0, "dense": None, "periodic": scheduler * c.integer(1, 3)}[retention]
    geometry["max_num_batched_tokens"] = c.choice((8192, 8192, 2048, scheduler * c.integer(1, 4)))
    return geometry


@dataclass(frozen=True)
class Swarm:
    """The trace features one case may use (swarm testing, Groce et al.,
    ISSTA 2012: each case leaves a random subset of features out, so a
    case that needs many of one kind, e.g. only longer siblings of prompts
    exactly on a boundary, is no longer diluted by the others). ``ops``:
    how a later request relates to an earlier one; ``offsets``: where a
    boundary-biased length sits around a boundary (-1, 0, +1, 2: a short
    remainder); ``unit_points``: boundaries of a finer hash unit too;
    ``uniform``: lengths off the boundaries too."""

    ops: tuple[str, ...] = ("resend", "resend", "extend", "sibling", "junction")
    offsets: tuple[int, ...] = (-1, 0, 1, 2)
    unit_points: bool = True
    uniform: bool = True


#: Every feature on: what a chooser without a side stream (atheris's bytes,
#: Hypothesis) draws with, so its inputs keep their meaning.
EVERY_FEATURE = Swarm()


def draw_swarm(c: Chooser) -> Swarm:
    """A case's feature subset, drawn from the chooser's ``side()`` stream
    (each feature kept with probability 1/2, never none of a kind); every
    feature for a chooser without one."""
    if not hasattr(c, "side"):
        return EVERY_FEATURE
    s = c.side()

    def subset(options: tuple) -> tuple:
        kept = tuple(o for o in dict.fromkeys(options) if s.integer(0, 1))
        return tuple(o for o in options if o in kept) or options

    return Swarm(subset(EVERY_FEATURE.ops), subset(EVERY_FEATURE.offsets), bool(s.integer(0, 1)), bool(s.integer(0, 1)))


def _length(c: Chooser, block: int, bias: bool = True, unit: int | None = None, cap: int | None = None, swarm: Swarm = EVERY_FEATURE) -> int:
    """A prompt length, biased to block boundaries (kB-1, kB, kB+1, and kB+r
    with a short remainder 2 <= r <= k) and, with
    a smaller hash ``unit``, to its boundaries too, unless ``bias`` is off
    (plain uniform lengths, for comparison); at most ``cap``. ``swarm``
    says which of these a case uses."""
    top = 8 * block + block // 2 if cap is None else max(1, min(8 * block + block // 2, cap))
    if bias and (c.integer(0, 2) or not swarm.uniform):
        k = c.integer(1, 8)
        if swarm.unit_points and unit is not None and unit < block and c.integer(0, 1):
            base = k * block + unit * c.integer(1, block // unit - 1) if block // unit > 1 else k * block
        else:
            base = k * block
        off = c.choice(swarm.offsets)
        if off == 2:
            # a short remainder, 2 <= N mod B <= N // B: where N % B and
            # N // B are confused in block arithmetic (replay_boundaries'
            # extension), a boundary lands inside the prompt
            off = c.integer(2, k) if k >= 2 else 1
        return max(1, min(base + off, top))
    return c.integer(1, top)


def _trace(c: Chooser, block: int, bias: bool = True, unit: int | None = None, cap: int | None = None) -> list[dict]:
    prompts: list[list[dict]] = []
    junctions: list[list[dict]] = []  # the shared prefixes siblings diverged at
    fresh = iter(SEGMENT_NAMES)
    swarm = draw_swarm(c)
    for _ in range(c.integer(1, MAX_REQUESTS)):
        op = c.choice(("fresh",) + swarm.ops) if prompts else "fresh"
        if op == "junction" and junctions:
            # another sibling diverging at a junction an earlier sibling
            # created: the state the junction rule says is kept there
            prompt = [dict(s) for s in c.choice(junctions)]
            prompt.append({"segment": next(fresh, None) or c.choice(SEGMENT_NAMES) + "y", "length": c.integer(1, 2 * block)})
            prompts.append(_fit(prompt, cap) if cap is not None else prompt)
            continue
        if op == "junction":
            op = "sibling"
        if op == "fresh":
            name = next(fresh, None) or c.choice(SEGMENT_NAMES)
            prompt = [{"segment": name, "length": _length(c, block, bias, unit, cap, swarm)}]
        else:
            base = c.choice(prompts)
            if op == "resend":
                prompt = [dict(s) for s in base]
            elif op == "extend":
                prompt = [dict(s) for s in base]
                tail = c.integer(1, 3 * block)
                last = prompt[-1]
                if len(prompt) == 1 and c.integer(0, 1):
                    last["length"] += tail  # the same stream, read further
                else:
                    prompt.append({"segment": next(fresh, None) or c.choice(SEGMENT_NAMES), "length": tail})
            else:  # a sibling diverging inside the base prompt
                total = sum(s["length"] for s in base)
                cut = _length(c, block, bias, unit, cap, swarm) if c.integer(0, 1) else c.integer(1, max(1, total))
                cut = min(max(cut, 1), total)
                prompt = _fit(base, cut)
                junctions.append([dict(s) for s in prompt])
                prompt.append({"segment": next(fresh, None) or c.choice(SEGMENT_NAMES) + "x", "length": c.integer(1, 2 * block)})
        if cap is not None:
            prompt = _fit(prompt, cap)
        prompts.append(prompt)
    return [{"prompt": p} for p in prompts]


def _outputs(c: Chooser, trace: list[dict]) -> list[dict]:
    """Each request's ``max_tokens``: 1 (half of them: the prefill's last
    step samples it), 2 or 4 (steps after the prefill, each with the drafts
    the step loop proposes under speculative decoding; states inside the
    output, which retention must not keep). Drawn after the prompts, so the
    prompts a stream draws stay the same."""
    for r in trace:
        r["max_tokens"] = c.choice((1, 1, 2, 4))
    return trace


#: Steps after the previous request a concurrent request is sent: within
#: the few steps a prefill takes, so it can meet a prompt it shares a
#: prefix with while that prompt is still being computed.
ARRIVALS = (0, 0, 1, 2, 3)


def _concurrent_wave(c: Chooser, trace: list[dict], block: int, cap: int | None = None) -> list[dict]:
    """One case in five gets a concurrent wave after its serial trace, so
    every serial request is still judged by every oracle (the wave starts
    after them). The wave is shaped by what the concurrent oracles state (a
    state is read only after the step that computes it; blocks given
    back): a head that extends an earlier prompt with new tokens (states
    nobody computed yet), then 1-3 requests sent 0-3 steps after one
    another that share a prefix with it: its resend, a longer sibling, a
    sibling diverging inside it. Drawn from the chooser's ``side()`` stream
    where it has one, after everything else, so the serial trace an input
    or a seeded campaign draws is the same as without waves."""
    c = c.side() if hasattr(c, "side") else c
    if c.integer(0, 4):
        return trace
    base = c.choice(trace)["prompt"]
    head = [dict(s) for s in base] + [{"segment": "W", "length": c.integer(1, 3 * block)}]
    if cap is not None:
        head = _fit(head, cap)
    total = sum(s["length"] for s in head)
    wave = [{"prompt": head, "max_tokens": c.choice((1, 2))}]
    for k in range(c.integer(1, 3)):
        op = c.choice(("resend", "resend", "extend", "sibling"))
        prompt = [dict(s) for s in head]
        if op == "extend":
            prompt.append({"segment": f"W{k}", "length": c.integer(1, 2 * block)})
        elif op == "sibling":
            prompt = _fit(head, c.integer(1, total))
            prompt.append({"segment": f"V{k}", "length": c.integer(1, block)})
        if cap is not None:
            prompt = _fit(prompt, cap)
        wave.append({"prompt": prompt, "max_tokens": c.choice((1, 2)), "arrival": c.choice(ARRIVALS)})
    return trace + wave


def _fit(prompt: list[dict], cap: int) -> list[dict]:
    """Cut a prompt to at most ``cap`` tokens (keeping its prefix)."""
    out, left = [], cap
    for seg in prompt:
        if left <= 0:
            break
        out.append({"segment": seg["segment"], "length": min(seg["length"], left)})
        left -= seg["length"]
    return out


#: Speculative modes a deployment class names: off, MTP with lookahead
#: hashes (0.33.0; the drop before), MTP with the EAGLE block drop.
SPEC_MODES = ("off", "mtp", "drop")
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
    retention: str  # RETENTIONS

    def label(self) -> str:
        return f"{self.model}/{self.spec}/{'unit' if self.unit else 'block'}/{self.retention}"


@functools.cache
def deployment_classes() -> tuple[DeploymentClass, ...]:
    """Every class (speculative modes only for the models with an MTP
    layer; no finer hash unit for the attention-free models, whose one KV
    cache group vLLM lets hash only on the block)."""
    return tuple(DeploymentClass(m, spec, unit, ret) for m in DEPLOYMENT_MODELS for spec in (SPEC_MODES if m in MTP_MODELS else ("off",))
                 for unit in ((False,) if m in ATTENTION_FREE_MODELS else (False, True)) for ret in RETENTIONS)


def class_schedule(rng) -> Iterator[DeploymentClass]:
    """Every deployment class in turn, in a fresh seeded order each round,
    so a campaign of a minute visits each class many times instead of
    leaving a conjunction of rare features to chance."""
    classes = list(deployment_classes())
    while True:
        rng.shuffle(classes)
        yield from classes


def draw_deployment(c: Chooser, cls: DeploymentClass | None = None) -> dict:
    """A deployment's model, parallelism, KV-cache dtype, speculative
    decoding and GPU (the choices that move the block size); ``cls`` pins
    the model and the speculative mode."""
    model = c.choice(DEPLOYMENT_MODELS) if cls is None else cls.model
    args = ["--enable-prefix-caching", "--tensor-parallel-size", str(c.choice((1, 2, 4, 8))), "--kv-cache-dtype", c.choice(("auto", "fp8"))]
    if model in ATTENTION_FREE_MODELS:
        # no attention backend sets the block: vLLM keeps --block-size (16 by
        # default) as the Mamba block, so a deployment picks its checkpoint spacing
        size = c.choice((None, 64, 256, 1024))
        if size is not None:
            args += ["--block-size", str(size)]
    if model in MTP_MODELS:
        if cls is None:
            spec = c.choice((None, None, 1, 2, 3, "drop"))
        else:
            spec = None if cls.spec == "off" else "drop" if cls.spec == "drop" else c.choice((1, 2, 3))
        if spec is not None:
            config = {"method": "mtp", "num_speculative_tokens": 2 if spec == "drop" else spec}
            if spec == "drop":
                config["disable_lookahead_block_hashes"] = True
            args += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    return {"model": model, "vllm_args": args, "platform": "cuda", "device": c.choice(DEVICES)}


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
        units.append(next(u for u in range(48, block, 16) if block % u) if any(block % u for u in range(48, block, 16)) else units[0])
        args += ["--prefix-match-unit", str(c.choice(units))]
    retention = c.choice(("0", "0", "0", "None", "periodic")) if cls is None else {"sparse": "0", "dense": "None", "periodic": "periodic"}[cls.retention]
    if retention == "periodic":
        retention = str(block * c.integer(1, 3))
    args += ["--prefix-cache-retention-interval", retention]
    return args


def _connector_flags(c: Chooser, connector: str) -> list[str]:
    """A KV connector's flags (:data:`CONNECTOR_MODES`): drawn last, so the
    deployment's other draws stay those of a stream without it."""
    drawn = c.integer(0, 3) == 0
    if connector == "offloading" or (connector == "drawn" and drawn):
        return ["--kv-offloading-size", c.choice(OFFLOADING_GIB)]
    return []


def first_resolved(draw: Callable[[], dict], resolver: Resolver, fallback: dict, unresolved: dict, tries: int = 4) -> tuple[dict, dict]:
    """The first of up to ``tries`` drawn deployments the engine resolves
    (``resolver``), with what it resolved; else ``fallback`` (one the engine
    always builds), with ``unresolved``'s units if even that is not resolved."""
    for _ in range(tries):
        dep = draw()
        info = resolver(dep)
        if info:
            return dep, info
    dep = dict(fallback)
    return dep, resolver(dep) or unresolved


def build_deployment_case(c: Chooser, resolver: Resolver, name: str | None = None, *, boundary_bias: bool = True, cls: DeploymentClass | None = None, connector: str = "drawn") -> Case:
    """Draw a deployment case: a deployment vLLM builds (``resolver`` says
    which ones it rejects; up to four draws, then a fallback), then a trace
    on its resolved block. A drawn ``--prefix-match-unit`` that does not
    divide the block (or any unit, with the single KV cache group of an
    attention-free model) is kept only where the resolver (the engine under
    test) accepts it: a release rejects it, so the flag is dropped there;
    a build that accepts it gets the case (``resolution`` judges it).
    ``cls`` pins the deployment class (:class:`DeploymentClass`);
    ``connector`` whether it carries a KV connector (:data:`CONNECTOR_MODES`:
    kept only where the engine accepts it, as the unit is)."""
    dep, info = first_resolved(lambda: draw_deployment(c, cls), resolver, FALLBACK_DEPLOYMENT, {"block": 544, "hash": 544, "max_model_len": 32768})
    block = int(info["block"])
    args = list(dep["vllm_args"]) + _deployment_flags(c, block, info, cls if cls is not None and dep["model"] == cls.model else None)
    unit = None
    if "--prefix-match-unit" in args:
        unit = int(args[args.index("--prefix-match-unit") + 1])
        if (block % unit or dep["model"] in ATTENTION_FREE_MODELS) and not resolver({**dep, "vllm_args": args}):
            at = args.index("--prefix-match-unit")
            del args[at:at + 2]
            unit = None
            pinned = cls is not None and cls.unit and dep["model"] == cls.model
            dividing = _dividing_units(block)
            if pinned and dividing and dep["model"] not in ATTENTION_FREE_MODELS:
                # the class asks for a hash unit: the engine refused the probe,
                # so the case gets one it accepts instead of none (else half of
                # a unit class's cases would run without a unit)
                unit = c.choice(dividing)
                args[at:at] = ["--prefix-match-unit", str(unit)]
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
    return _case_on(c, {**dep, "vllm_args": args}, info, unit, name, boundary_bias)


def _case_on(c: Chooser, deployment: dict, info: dict, unit: int | None, name: str | None, boundary_bias: bool) -> Case:
    """A trace drawn on a resolved deployment (``info``: its block and
    max_model_len; ``unit``: its hash unit, or None)."""
    block = int(info["block"])
    cap = max(1, min(MAX_DRAWN_PROMPT, int(info.get("max_model_len") or MAX_DRAWN_PROMPT) - 64))
    trace = _concurrent_wave(c, _outputs(c, _trace(c, block, boundary_bias, unit, cap)), block, cap)
    return parse_case({"schema": 1, "name": name, "deployment": deployment, "trace": trace})


def another_trace(c: Chooser, case: Case, resolver: Resolver) -> Case | None:
    """Another trace on ``case``'s deployment (resolved again through
    ``resolver``, which a campaign keeps per deployment): a campaign draws a
    few traces per drawn deployment, so vLLM's resolution of it is paid
    once; None when the resolver no longer resolves it."""
    dep = case.deployment
    assert dep is not None
    raw = {"model": dep.model, "vllm_args": list(dep.vllm_args), "platform": dep.platform, "device": dep.device, **({"model_overrides": dict(dep.model_overrides)} if dep.model_overrides else {})}
    info = resolver(raw)
    if not info:
        return None
    args = raw["vllm_args"]
    unit = int(args[args.index("--prefix-match-unit") + 1]) if "--prefix-match-unit" in args else None
    return _case_on(c, raw, info, unit, case.name, True)


def build_case(c: Chooser, name: str | None = None, *, boundary_bias: bool = True, geometry: dict | None = None, speculative: dict | None | str = "draw", resolver: Resolver | None = None, cls: DeploymentClass | None = None, connector: str = "drawn") -> Case:
    """Draw one case. Every draw is valid by construction. With a
    ``resolver`` a deployment case (of class ``cls`` when given); without,
    a hand (synthetic) geometry, where ``geometry`` and ``speculative`` pin
    those parts instead of drawing them (``connector``: a deployment's KV
    connector, :data:`CONNECTOR_MODES`)."""
    if resolver is not None:
        return build_deployment_case(c, resolver, name, boundary_bias=boundary_bias, cls=cls, connector=connector)
    geometry = geometry if geometry is not None else _geometry(c)
    speculative = c.choice(SPECULATIVE) if speculative == "draw" else speculative
    block = max(g["block_size"] for g in geometry["groups"])
    trace = _concurrent_wave(c, _outputs(c, _trace(c, block, boundary_bias)), block)
    raw = {"schema": 1, "name": name, "geometry": geometry, "speculative": speculative, "trace": trace}
    return parse_case(raw)


def case_from_bytes(data: bytes, resolver: Resolver | None = None) -> Case:
    return build_case(BytesChooser(data), resolver=resolver)


def hypothesis_cases(resolver: Resolver | None = None, builder: Callable[[Chooser, Resolver], Case] | None = None):
    """A Hypothesis strategy of cases (deployments with a ``resolver``;
    ``builder(chooser, resolver)`` draws another family's instead, e.g.
    ``fuzz.generate_sglang.build_sglang_case``)."""
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
        reqs = " ".join("+".join(f"{s['segment']}:{s['length']}" for s in r["prompt"]) for r in raw["trace"])
        return f"{case.deployment.describe()} | {reqs}"
    g = raw["geometry"]
    groups = "+".join(f"{x['kind'][0]}{x['block_size']}x{x['count']}" for x in g["groups"])
    spec = raw["speculative"] or {}
    spec_text = "off" if not spec else f"{spec['method']}{spec['num_speculative_tokens']}" + ("/drop" if spec.get("disable_lookahead_block_hashes") else "")
    reqs = " ".join("+".join(f"{s['segment']}:{s['length']}" for s in r["prompt"]) for r in raw["trace"])
    return f"{groups} S={g['scheduler_block_size']} ret={g['retention_interval']} spec={spec_text} | {reqs}"
