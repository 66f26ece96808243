"""Traces drawn from a stream of choices (``fuzz.draw.generate``'s trace half,
shared by the vLLM and SGLang generators): boundary-biased prompt lengths,
resends, longer siblings, siblings diverging anywhere, junction chains,
each request's outputs, and one case in five a concurrent wave. Swarm
testing (:class:`Swarm`) leaves a random subset of trace features out of
each case. Every choice goes through the ``Chooser``; what is drawn from a
chooser's side stream leaves its main stream as it was."""

from __future__ import annotations

from dataclasses import dataclass

from fuzz.draw.choosers import Chooser
from fuzz.draw.conversation import conversation

MAX_REQUESTS = 6
SEGMENT_NAMES = "ABCDEFGH"


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


def _length(
    c: Chooser,
    block: int,
    bias: bool = True,
    unit: int | None = None,
    cap: int | None = None,
    swarm: Swarm = EVERY_FEATURE,
) -> int:
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


def beside_checkpoint(tokens: int, block: int, unit: int | None = None) -> bool:
    """Whether a prompt of ``tokens`` sits beside a state a prefill of it
    leaves: on the cache's key grid (``unit`` where a finer hash unit is
    set, else the block), or one past it. The grid is where the rules put
    states and hits (vLLM 0.33.0: ``get_mamba_prefill_checkpoint_position``,
    ``v1/kv_cache_interface.py:1169-1186``, keeps the prompt's state at the
    last grid point below ``N - 1``, and ``KVCacheManager.get_computed_blocks``
    caps a hit at ``N - 1``, ``v1/core/kv_cache_manager.py:295-302``; SGLang
    0.5.23 tracks its state on its grid too): a prompt on the grid leaves its
    state one grid step below its end, one a token past it can be resumed
    exactly at a grid point. A resend or extension of such a prompt is what
    exercises those rules; one of a prompt off the grid recomputes a
    remainder any length would."""
    step = unit if unit is not None and 0 < unit < block else block
    return step > 0 and tokens >= step and tokens % step in (0, 1)


def _beside_checkpoint(
    c: Chooser, prompts: list[list[dict]], base: list[dict], op: str, block: int, unit: int | None
) -> list[dict]:
    """The earlier prompt a resend or extension repeats: ``base`` (drawn from
    the main stream, as before), or, one time in two, a prompt of the trace
    beside a checkpoint (:func:`beside_checkpoint`) where there is one,
    chosen from the chooser's ``side()`` stream (so the main stream draws
    what it drew; a chooser without one, atheris's bytes or Hypothesis,
    keeps ``base``)."""
    if op not in ("resend", "extend") or not hasattr(c, "side"):
        return base
    beside = [p for p in prompts if beside_checkpoint(sum(x["length"] for x in p), block, unit)]
    s = c.side()
    if not beside or not s.integer(0, 1):
        return base
    return s.choice(beside)


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
            prompt.append(
                {"segment": next(fresh, None) or c.choice(SEGMENT_NAMES) + "y", "length": c.integer(1, 2 * block)}
            )
            prompts.append(_fit(prompt, cap) if cap is not None else prompt)
            continue
        if op == "junction":
            op = "sibling"
        if op == "fresh":
            name = next(fresh, None) or c.choice(SEGMENT_NAMES)
            prompt = [{"segment": name, "length": _length(c, block, bias, unit, cap, swarm)}]
        else:
            base = _beside_checkpoint(c, prompts, c.choice(prompts), op, block, unit)
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
                prompt.append(
                    {"segment": next(fresh, None) or c.choice(SEGMENT_NAMES) + "x", "length": c.integer(1, 2 * block)}
                )
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


def _with_conversation(c: Chooser, serial: list[dict], block: int, cap: int | None, longest: int) -> list[dict]:
    """The serial trace, a conversation (the chat shape, ``fuzz.draw.conversation``:
    judged by every oracle; its prompts at most ``longest`` tokens), then the
    wave, drawn before the conversation so every earlier draw stays put."""
    full = _concurrent_wave(c, serial, block, cap)
    return serial + conversation(c, serial, block, longest) + full[len(serial) :]
