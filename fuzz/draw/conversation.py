"""Conversations: the chat shape a campaign draws (turn k+1's prompt is
turn k's prompt, its output and new text), each turn generating tens to
hundreds of tokens. ``fuzz.draw.generate`` serves one after the serial trace of
one case in :data:`CONVERSATION_RATE`; the rule it aims at is
``reference.serial.output_states`` (vLLM 0.33.0 keeps a decode step's
state on the block grid inside an output under dense and periodic
retention)."""

from __future__ import annotations

from fuzz.draw.choosers import Chooser

#: One case in this many gets a conversation (:func:`conversation`).
CONVERSATION_RATE = 20
#: The most turns a conversation has.
MAX_TURNS = 3
#: The most tokens a conversation's turn generates.
MAX_DECODE = 200


def _decode_length(c: Chooser) -> int:
    """A turn's ``max_tokens``: tens (10-99) or hundreds (100-MAX_DECODE)."""
    return c.integer(10, 99) if c.integer(0, 1) else c.integer(100, MAX_DECODE)


def conversation(c: Chooser, trace: list[dict], block: int, cap: int) -> list[dict]:
    """One case in CONVERSATION_RATE: a conversation of 2-MAX_TURNS turns to
    serve after the serial ``trace`` (turn k is request ``len(trace) + k``).
    Turn 1 is an earlier prompt plus new text, or new text alone; turn k+1's
    prompt is turn k's prompt, then turn k's output (``{"output": ...}``),
    then new text. Each turn generates tens to hundreds of tokens
    (:func:`_decode_length`). Where a follow-up may resume is where the
    earlier turn's decode left a Mamba state on the block grid
    (``reference.serial.output_states``: a multiple of the block inside its
    output), so half the turns take new text that ends the prompt within
    their output's reach of a block boundary (the boundary d tokens after
    the prompt, 1 <= d <= max_tokens). A turn whose prompt and output would
    pass ``cap`` (the drawn prompt's bound, under max_model_len) ends the
    conversation. Drawn from the chooser's ``side()`` stream where it has
    one, after the waves, so every earlier draw stays the same."""
    c = c.side() if hasattr(c, "side") else c
    if c.integer(0, CONVERSATION_RATE - 1):
        return []
    prompt = [dict(s) for s in c.choice(trace)["prompt"]] if trace and c.integer(0, 1) else []
    length = sum(s["length"] for s in prompt)
    turns: list[dict] = []
    for k in range(c.integer(2, MAX_TURNS)):
        m = _decode_length(c)
        if c.integer(0, 1):
            d = c.integer(1, m)
            text = (-(length + d)) % block or block
        else:
            text = c.integer(1, 2 * block)
        if length + text + m > cap:
            break
        prompt = prompt + [{"segment": f"T{k}", "length": text}]
        turns.append({"prompt": prompt, "max_tokens": m})
        prompt = prompt + [{"output": len(trace) + k}]
        length += text + m
    return turns if len(turns) >= 2 else []
