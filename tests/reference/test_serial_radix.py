"""The radix tree of reference/radix.py is a pure speed-up of the serial model.

``serial.simulate`` walks each request down a radix tree of the earlier
prompts; ``serial.simulate_pairwise`` (the definition) compares it token by
token with every earlier prompt sharing its first token. Every step of every
request (hits, junctions, chunk ends, the states kept: the whole explain
record) must be the same, on seeded random cases over every rule, version and
speculative mode, with prompts built to stress the tree: shared system
prompts, extensions, prefixes of earlier prompts, siblings diverging inside
an edge, resends, streams whose first tokens collide, and partial hash hits
with lookahead hashes.
"""

from __future__ import annotations

import random

import pytest

import reference.serial as serial
from reference.case import segment_tokens
from reference.knobs import SUPPORTED_VERSIONS, resolve_knobs
from reference.radix import PrefixIndex, prompt_bytes
from tests.conftest import MTP, MTP_DROP, hybrid, make_case


def _colliding_names() -> tuple[str, str]:
    seen: dict[int, str] = {}
    for k in range(5000):
        name = f"S{k}"
        first = segment_tokens(name, 1)[0]
        if first in seen:
            return seen[first], name
        seen[first] = name
    raise AssertionError("no collision among 5000 names")


def _cut(prompt: list[tuple[str, int]], length: int) -> list[tuple[str, int]]:
    out, left = [], length
    for seg, n in prompt:
        if left <= 0:
            break
        out.append((seg, min(n, left)))
        left -= n
    return out


def _prompts(rng: random.Random, names: list[str], block: int) -> list[list[tuple[str, int]]]:
    system = [("SYS", rng.randint(1, 5 * block))]
    prompts: list[list[tuple[str, int]]] = []
    for _ in range(rng.randint(1, 14)):
        roll = rng.random()
        if prompts and roll < 0.2:
            prompts.append(list(rng.choice(prompts)))  # resend
        elif prompts and roll < 0.45:  # extension or sibling of an earlier prompt
            base = rng.choice(prompts)
            total = sum(n for _, n in base)
            keep = base if rng.random() < 0.4 else _cut(base, rng.randint(1, total))
            prompts.append(keep + [(rng.choice(names), rng.randint(1, 3 * block))])
        elif prompts and roll < 0.55:  # a strict prefix of an earlier prompt
            base = rng.choice(prompts)
            prompts.append(_cut(base, rng.randint(1, sum(n for _, n in base))))
        elif roll < 0.8:  # the shared system prompt plus a tail
            prompts.append(system + [(rng.choice(names), rng.randint(1, 2 * block))])
        else:
            prompts.append([(rng.choice(names), rng.randint(1, 6 * block))])
    return prompts


def _random_case(rng: random.Random, names: list[str]):
    block = rng.choice([16, 32, 64])
    partial = rng.random() < 0.3
    geometry = hybrid(
        block,
        block,
        rng.randint(1, 3),
        retention_interval=rng.choice([None, 0, 0, block * rng.randint(1, 3)]),
        max_num_batched_tokens=rng.choice([block, 3 * block, 8192]),
    )
    if partial:
        geometry["prefix_match_unit"] = block // rng.choice([2, 4])
    if rng.random() < 0.2:
        geometry["prefill_checkpoint_grid"] = rng.choice([1, 8])
    spec = rng.choice([None, MTP, MTP_DROP, {"method": "eagle", "num_speculative_tokens": 1}])
    return make_case(geometry, _prompts(rng, names, block), spec)


def _explain(steps):
    return [s.as_dict() for s in steps]


def test_radix_simulation_equals_the_pairwise_definition():
    rng = random.Random(20260513)
    a, b = _colliding_names()
    names = ["A", "B", "C", a, b]
    checked = 0
    for _ in range(400):
        case = _random_case(rng, names)
        version = rng.choice(SUPPORTED_VERSIONS)
        rule = rng.choice(serial.RULES)
        try:
            knobs = resolve_knobs(case, version)
        except Exception:  # a geometry this version does not take (e.g. checkpoints before 0.32.0)
            continue
        assert _explain(serial.simulate(case, knobs, rule)) == _explain(serial.simulate_pairwise(case, knobs, rule)), (
            version,
            rule,
            case,
        )
        checked += 1
    assert checked >= 300


def test_the_check_can_fail():
    """A tree that forgets marks below a split changes answers: the
    comparison above would see it."""
    case = make_case(
        hybrid(16, 16, retention_interval=None, max_num_batched_tokens=16),
        [[("A", 100)], [("A", 40), ("B", 30)], [("A", 40), ("C", 30)]],
    )
    knobs = resolve_knobs(case, "0.33.0")
    good = [s.hit for s in serial.simulate(case, knobs, "replay")]
    assert good == [s.hit for s in serial.simulate_pairwise(case, knobs, "replay")]
    assert good[1] > 0 and good[2] > 0

    class Forgetful(PrefixIndex):
        def _split(self, parent, child, depth):
            mid = super()._split(parent, child, depth)
            mid.states = {}
            return mid

    assert [s.hit for s in serial.simulate(case, knobs, "replay", index=Forgetful(0))] != good


def test_state_count_counts_each_prefix_once():
    """Three identical prompts under dense retention keep the states of one
    prefix: the tree counts them once."""
    case = make_case(hybrid(16, 16, retention_interval=None), [[("A", 100)]] * 3)
    knobs = resolve_knobs(case, "0.33.0")
    index = PrefixIndex(knobs.hash_lookahead_tokens)
    steps = serial.simulate(case, knobs, "replay", index=index)
    kept = {p for s in steps for p in (s.retained_tokens or {16: [(b + 1) * 16 for b in s.retained[16]]})[16]}
    assert index.state_count() == {16: len(kept)}


def test_a_used_index_is_refused():
    case = make_case(hybrid(16, 16), [[("A", 40)]])
    knobs = resolve_knobs(case, "0.33.0")
    index = PrefixIndex(0)
    serial.simulate(case, knobs, index=index)
    with pytest.raises(Exception, match="empty PrefixIndex"):
        serial.simulate(case, knobs, index=index)


def test_prompt_bytes_are_the_tokens():
    case = make_case(hybrid(16, 16), [[("A", 3), ("B", 70000)]])
    from array import array

    from reference.case import prompt_tokens

    (request,) = case.trace
    assert array("H", prompt_bytes(request)).tolist() == prompt_tokens(request)


def test_one_pass_over_many_settings_equals_one_simulation_each():
    """``simulate_many`` shares the tree between runs that differ in the
    retention interval and the rule; each run answers as ``simulate`` alone."""
    rng = random.Random(99)
    names = ["A", "B", "C"]
    checked = 0
    for _ in range(120):
        case = _random_case(rng, names)
        version = rng.choice(SUPPORTED_VERSIONS)
        try:
            knobs = resolve_knobs(case, version)
        except Exception:
            continue
        S = case.geometry.scheduler_block_size
        runs = [(rng.choice([None, 0, S, 2 * S]), rng.choice(serial.RULES)) for _ in range(rng.randint(1, 4))]
        if case.geometry.prefix_match_unit is not None or any(g.block_size != S for g in case.geometry.groups):
            runs = [(i if i in (None, 0) else 0, r) for i, r in runs]
        many = serial.simulate_many(case, knobs, runs)
        from dataclasses import replace

        for (interval, rule), got in zip(runs, many):
            alone = serial.simulate(
                replace(case, geometry=replace(case.geometry, retention_interval=interval)), knobs, rule
            )
            assert _explain(got) == _explain(alone), (version, runs, case)
        checked += 1
    assert checked >= 80
