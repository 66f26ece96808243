"""The first-token index of reference/serial.py's pairwise definition
(``simulate_pairwise``) is a pure speed-up.

``serial.related`` leaves out the cached prompts whose first token differs
from the request's; the model's answers (hits, queries, every explain field)
must be exactly what comparing with every earlier prompt gives. Checked on
300 seeded random cases over every rule and version, including streams whose
first tokens collide (different segments, same first token id).
"""

from __future__ import annotations

import random
import time

import pytest

import reference.serial as serial
from reference.case import MAX_REQUESTS, segment_tokens
from reference.knobs import SUPPORTED_VERSIONS
from reference.predict import predict
from tests.conftest import MTP, MTP_DROP, hybrid, make_case


def _colliding_names() -> tuple[str, str]:
    """Two segment names whose streams start with the same token id."""
    seen: dict[int, str] = {}
    for k in range(5000):
        name = f"S{k}"
        first = segment_tokens(name, 1)[0]
        if first in seen:
            return seen[first], name
        seen[first] = name
    raise AssertionError("no collision among 5000 names")  # 1023 ids: impossible


def _random_case(rng: random.Random, names: list[str]):
    block = rng.choice([16, 32, 64])
    interval = rng.choice([None, 0, 0, block * rng.randint(1, 3)])
    geometry = hybrid(
        block,
        block * rng.choice([1, 2]) if rng.random() < 0.3 else block,
        rng.randint(1, 3),
        retention_interval=interval,
        max_num_batched_tokens=rng.choice([block, 3 * block, 8192]),
    )
    if geometry["groups"][1]["block_size"] != block:
        geometry["retention_interval"] = rng.choice([None, 0])
    prompts: list[list[tuple[str, int]]] = []
    for _ in range(rng.randint(1, 12)):
        if prompts and rng.random() < 0.5:
            base = rng.choice(prompts)
            cut = rng.randint(1, sum(n for _, n in base))
            prompt, left = [], cut
            for seg, n in base:
                if left <= 0:
                    break
                prompt.append((seg, min(n, left)))
                left -= n
            if rng.random() < 0.7:
                prompt.append((rng.choice(names), rng.randint(1, 4 * block)))
        else:
            prompt = [(rng.choice(names), rng.randint(1, 6 * block)) for _ in range(rng.randint(1, 2))]
        prompts.append(prompt)
    spec = rng.choice([None, MTP, MTP_DROP])
    return make_case(geometry, prompts, spec)


def _everything(case, version, rule):
    """The pairwise definition's answers (``simulate`` itself walks a radix
    tree instead: tests/reference/test_serial_radix.py)."""
    from reference.knobs import resolve_knobs

    return [s.as_dict() for s in serial.simulate_pairwise(case, resolve_knobs(case, version), rule)]


def test_index_changes_no_prediction(monkeypatch):
    rng = random.Random(20261130)
    a, b = _colliding_names()
    names = ["A", "B", "C", a, b]
    cases = [_random_case(rng, names) for _ in range(300)]
    runs = [(c, rng.choice(SUPPORTED_VERSIONS), rng.choice(serial.RULES)) for c in cases]
    indexed = [_everything(*run) for run in runs]
    monkeypatch.setattr(serial, "related", lambda index, tokens, n: list(range(n)))  # compare with every earlier prompt
    unindexed = [_everything(*run) for run in runs]
    assert indexed == unindexed
    # the collision was exercised: both names appear as first segments
    firsts = {r.prompt[0].segment for c, _, _ in runs for r in c.trace}
    assert {a, b} <= firsts


@pytest.mark.parametrize("rule", serial.RULES)
def test_a_full_case_of_unrelated_prompts_is_fast(rule):
    """MAX_REQUESTS prompts of distinct streams: the bound the issue's
    10,000-request hang is now refused above; it answers in seconds."""
    case = make_case(hybrid(16, 16, 1), [[(f"U{i}", 100)] for i in range(MAX_REQUESTS)])
    t0 = time.perf_counter()
    predict(case, "0.33.0", rule)
    assert time.perf_counter() - t0 < 10
