"""The choosers a case is drawn through: one interface (``integer(lo, hi)``
and ``choice(seq)``, :class:`Chooser`) over Hypothesis's ``draw``
(:class:`HypothesisChooser`), a fuzzer's bytes (:class:`BytesChooser`) and a
seeded ``random.Random`` (:class:`RandomChooser`), so every driver feeds the
one builder, ``fuzz.draw.generate.build_case``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol


class Chooser(Protocol):
    def integer(self, lo: int, hi: int) -> int: ...

    def choice(self, options: Sequence): ...


class HypothesisChooser:
    """Draws through a Hypothesis ``draw`` function (``st.composite``)."""

    def __init__(self, draw):
        from hypothesis import strategies as st

        self._draw, self._st = draw, st

    def integer(self, lo: int, hi: int) -> int:
        return self._draw(self._st.integers(lo, hi))

    def choice(self, options: Sequence):
        return self._draw(self._st.sampled_from(list(options)))


class BytesChooser:
    """Draws from fuzzer bytes (atheris ``FuzzedDataProvider`` semantics,
    without importing atheris): an exhausted input keeps yielding the
    smallest choice, so every input decodes to a valid case."""

    def __init__(self, data: bytes):
        self._data, self._pos = data, 0

    def _take(self, n: int) -> int:
        chunk = self._data[self._pos : self._pos + n]
        self._pos += n
        return int.from_bytes(chunk.ljust(n, b"\0"), "little")

    def integer(self, lo: int, hi: int) -> int:
        span = hi - lo + 1
        nbytes = max(1, (span.bit_length() + 7) // 8)
        return lo + self._take(nbytes) % span

    def choice(self, options: Sequence):
        return options[self.integer(0, len(options) - 1)]


class RandomChooser:
    """Draws from a seeded ``random.Random``."""

    def __init__(self, rng):
        self._rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return self._rng.randint(lo, hi)

    def choice(self, options: Sequence):
        return options[self._rng.randrange(len(options))]

    def side(self) -> RandomChooser:
        """A chooser seeded by this one's state that draws nothing from it:
        choices added after the stream was laid out leave it as it was."""
        return RandomChooser(random.Random(repr(self._rng.getstate())))
