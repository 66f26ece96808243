"""Case generation from a stream of choices, shared by Hypothesis and atheris.

Both drivers feed the same builder through a ``Chooser`` (``integer(lo, hi)``
and ``choice(seq)``), so a Hypothesis example and an atheris input describe
the same space: production-like and random geometries, retention dense / 0 /
periodic, speculative off / MTP with and without the block drop, several
chunk budgets, and serial traces made of identical resends, longer siblings,
siblings diverging at any point, interleaved conversations, short prompts
and block-aligned prompts (nB-1, nB, nB+1).

What comes out is a semantic case (``reference.case.Case``), never bytes.
"""

from __future__ import annotations

from typing import Protocol, Sequence

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


class Chooser(Protocol):
    def integer(self, lo: int, hi: int) -> int: ...

    def choice(self, options: Sequence): ...


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


def _length(c: Chooser, block: int, bias: bool = True) -> int:
    """A prompt length, biased to block boundaries (kB-1, kB, kB+1) unless
    ``bias`` is off (plain uniform lengths, for comparison)."""
    if bias and c.integer(0, 2):
        k = c.integer(1, 8)
        return max(1, k * block + c.integer(-1, 1))
    return c.integer(1, 8 * block + block // 2)


def _trace(c: Chooser, block: int, bias: bool = True) -> list[dict]:
    prompts: list[list[dict]] = []
    fresh = iter(SEGMENT_NAMES)
    for _ in range(c.integer(1, MAX_REQUESTS)):
        op = c.choice(("fresh", "resend", "resend", "extend", "sibling")) if prompts else "fresh"
        if op == "fresh":
            name = next(fresh, None) or c.choice(SEGMENT_NAMES)
            prompt = [{"segment": name, "length": _length(c, block, bias)}]
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
                cut = _length(c, block, bias) if c.integer(0, 1) else c.integer(1, max(1, total))
                cut = min(max(cut, 1), total)
                prompt, left = [], cut
                for s in base:
                    if left <= 0:
                        break
                    prompt.append({"segment": s["segment"], "length": min(s["length"], left)})
                    left -= s["length"]
                prompt.append({"segment": next(fresh, None) or c.choice(SEGMENT_NAMES) + "x", "length": c.integer(1, 2 * block)})
        prompts.append(prompt)
    return [{"prompt": p} for p in prompts]


def build_case(c: Chooser, name: str | None = None, *, boundary_bias: bool = True, geometry: dict | None = None, speculative: dict | None | str = "draw") -> Case:
    """Draw one case. Every draw is valid by construction. ``geometry`` and
    ``speculative`` pin those parts instead of drawing them."""
    geometry = geometry if geometry is not None else _geometry(c)
    speculative = c.choice(SPECULATIVE) if speculative == "draw" else speculative
    block = max(g["block_size"] for g in geometry["groups"])
    raw = {"schema": 1, "name": name, "geometry": geometry, "speculative": speculative, "trace": _trace(c, block, boundary_bias)}
    return parse_case(raw)


# ------------------------------------------------------------- the choosers


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


def case_from_bytes(data: bytes) -> Case:
    return build_case(BytesChooser(data))


def hypothesis_cases():
    """A Hypothesis strategy of cases."""
    from hypothesis import strategies as st

    @st.composite
    def cases(draw):
        return build_case(HypothesisChooser(draw))

    return cases()


def describe(case: Case) -> str:
    """A one-line description: geometry, speculative, requests."""
    raw = case_to_dict(case)
    g = raw["geometry"]
    groups = "+".join(f"{x['kind'][0]}{x['block_size']}x{x['count']}" for x in g["groups"])
    spec = raw["speculative"] or {}
    spec_text = "off" if not spec else f"{spec['method']}{spec['num_speculative_tokens']}" + ("/drop" if spec.get("disable_lookahead_block_hashes") else "")
    reqs = " ".join("+".join(f"{s['segment']}:{s['length']}" for s in r["prompt"]) for r in raw["trace"])
    return f"{groups} S={g['scheduler_block_size']} ret={g['retention_interval']} spec={spec_text} | {reqs}"
