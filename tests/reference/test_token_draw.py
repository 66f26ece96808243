"""``reference.case.draw_tokens`` draws a segment stream's tokens in bulk;
the streams must stay exactly what the one-by-one definition gives
(``1 + rng.randrange(TOKEN_VOCAB - 1)`` per token), and the generator must be
left in the same state, so that a stream grown in several steps is the same
as one drawn at once."""

from __future__ import annotations

import random

import reference.tokens as tokens_module
from reference.tokens import TOKEN_VOCAB, draw_tokens, segment_tokens


def _one_by_one(rng: random.Random, count: int) -> list[int]:
    return [1 + rng.randrange(TOKEN_VOCAB - 1) for _ in range(count)]


def test_bulk_draw_equals_the_definition_and_leaves_the_same_state():
    meta = random.Random(7)
    for trial in range(300):
        seed = meta.getrandbits(128)
        a, b = random.Random(seed), random.Random(seed)
        counts = [meta.choice([0, 1, 2, 3, 31, 1000, 4097]) for _ in range(meta.randint(1, 4))]
        for n in counts:
            assert draw_tokens(a, n) == _one_by_one(b, n), (trial, counts)
        assert a.getstate() == b.getstate()


def test_rejections_are_exercised():
    """Enough draws that some try hits the rejected value (1023, one in 1,024)."""
    rng = random.Random(1)
    assert len(draw_tokens(rng, 20000)) == 20000
    probe = random.Random(1)
    rejected = sum((probe.getrandbits(32) >> 22) == TOKEN_VOCAB - 1 for _ in range(20000))
    assert rejected > 0


def test_streams_grown_in_steps_are_the_definition(monkeypatch):
    monkeypatch.setattr(tokens_module, "_STREAMS", {})
    monkeypatch.setattr(tokens_module, "_RNGS", {})
    grown = [segment_tokens("G", n) for n in (5, 3, 700, 2000)]
    from hashlib import blake2b

    rng = random.Random(int.from_bytes(blake2b(b"G", digest_size=16).digest(), "big"))
    whole = _one_by_one(rng, 2000)
    assert grown == [whole[:5], whole[:3], whole[:700], whole]


def test_the_check_can_fail():
    rng, other = random.Random(3), random.Random(3)
    other.getrandbits(32)  # one output ahead
    assert draw_tokens(rng, 50) != _one_by_one(other, 50)
