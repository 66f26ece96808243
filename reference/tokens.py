"""Token streams: how a case's named segments become token ids.

A segment ``{"segment": name, "length": n}`` is the first ``n`` tokens of
the stream ``name``, a pseudo-random sequence seeded by blake2b(name): the
same on every machine and Python version, and any shorter slice a prefix of
any longer one, so two requests share exactly the prefix their segments
share. Ids lie in [1, TOKEN_VOCAB). :func:`reference.case.prompt_tokens`
concatenates a request's segments. An output segment ``{"output": j}``
is request j's output: ``max_tokens`` copies of :data:`OUTPUT_TOKEN`
(:func:`output_tokens`).
"""

from __future__ import annotations

import random
import sys
from array import array
from hashlib import blake2b

#: Token ids of every segment stream lie in [1, TOKEN_VOCAB).
TOKEN_VOCAB = 1024
#: The token every request of a case generates, ``max_tokens`` times: a
#: request's output is that many copies of it (an output segment
#: ``{"output": j}`` stands for request j's). It lies outside every segment
#: stream, so an output extends a shared prefix only where a later prompt
#: quotes it. An engine driver's stood-in sampler samples it (vLLM's:
#: ``engine_adapter.vllm_engine.observe.SAMPLED_TOKEN``).
OUTPUT_TOKEN = TOKEN_VOCAB

try:  # numpy (matplotlib's dependency) draws tokens in bulk; without it, the same in pure Python
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None

_STREAMS: dict[str, list[int]] = {}
_RNGS: dict[str, random.Random] = {}


def segment_tokens(name: str, length: int) -> list[int]:
    """The first ``length`` tokens of stream ``name`` (ids in [1, TOKEN_VOCAB)).

    The stream is a pseudo-random sequence seeded by blake2b(name), so it is
    the same on every machine and Python version, and any shorter slice is a
    prefix of any longer one.
    """
    stream = _STREAMS.get(name)
    if stream is None:
        seed = int.from_bytes(blake2b(name.encode(), digest_size=16).digest(), "big")
        stream = _STREAMS[name] = []
        _RNGS[name] = random.Random(seed)
    if len(stream) < length:
        stream.extend(draw_tokens(_RNGS[name], length - len(stream)))
    return stream[:length]


def output_tokens(length: int) -> list[int]:
    """The first ``length`` tokens of any request's output."""
    return [OUTPUT_TOKEN] * length


#: ``randrange(TOKEN_VOCAB - 1)`` reads the top this-many bits of one 32-bit
#: output of the generator per try, and retries a value >= TOKEN_VOCAB - 1.
_TOKEN_BITS = (TOKEN_VOCAB - 1).bit_length()


def draw_tokens(rng: random.Random, count: int) -> list[int]:
    """``[1 + rng.randrange(TOKEN_VOCAB - 1) for _ in range(count)]``, drawn
    in bulk, leaving ``rng`` in the same state.

    ``randrange(n)`` takes ``getrandbits(k)`` (k = n's bit length: the top k
    bits of one 32-bit output) until it is below n; ``getrandbits(32 * m)``
    returns m outputs, the first one in the lowest bits. So m outputs give
    the tokens of the m tries, minus the rejected ones; the rejected ones are
    drawn again, exactly as many as were rejected, so no output is consumed
    that the one-by-one loop would not have consumed
    (``tests/reference/test_token_draw.py`` compares both)."""
    out: list[int] = []
    shift = 32 - _TOKEN_BITS
    limit = (TOKEN_VOCAB - 1) << shift  # w >> shift < TOKEN_VOCAB - 1
    while len(out) < count:
        m = count - len(out)
        words = array("I")
        if words.itemsize != 4:  # pragma: no cover - every platform CPython supports has a 4-byte unsigned int
            return out + [1 + rng.randrange(TOKEN_VOCAB - 1) for _ in range(m)]
        raw = rng.getrandbits(32 * m).to_bytes(4 * m, "little")
        if _np is not None and m >= 64:  # the same selection, vectorised
            w = _np.frombuffer(raw, dtype="<u4")
            out.extend((1 + (w[w < limit] >> shift)).tolist())
            continue
        words.frombytes(raw)
        if sys.byteorder != "little":  # pragma: no cover
            words.byteswap()
        out.extend([1 + (w >> shift) for w in words if w < limit])
    return out
