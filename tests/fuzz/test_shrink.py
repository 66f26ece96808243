"""The shrinker on its own: ``find_integer`` and the length ladders, against
plain predicates (no engine)."""

from __future__ import annotations

import math

import pytest

from fuzz.results.shrink import find_integer, shrink
from reference.case import parse_case
from tests.conftest import hybrid, make_case


@pytest.mark.parametrize("most", [1, 2, 3, 7, 64, 1000, 4095])
def test_find_integer_finds_the_threshold_of_a_monotone_predicate_in_logarithmic_calls(most):
    for threshold in sorted({0, 1, most // 3, most // 2, most - 1, most}):
        asked = []

        def holds(k, t=threshold):
            asked.append(k)
            return k <= t

        assert find_integer(holds, most) == threshold
        assert len(asked) <= 2 * math.ceil(math.log2(most + 1)) + 2, (threshold, asked)
        assert all(1 <= k <= most for k in asked)


def test_find_integer_asks_nothing_when_there_is_nothing_to_take():
    assert find_integer(lambda k: pytest.fail("asked"), 0) == 0


def test_a_long_segment_shrinks_to_its_smallest_residue_in_few_calls():
    # The divergence needs A to end 5 tokens past a 16-token block, at least
    # 6 blocks in: the smallest such length is 101.
    case = make_case(hybrid(16, 16), [[("A", 16 * 400 + 5)], [("A", 16 * 400 + 5)]])
    calls = []

    def fires(c):
        calls.append(c)
        return len(c.trace) == 2 and all(r.prompt[0].length % 16 == 5 and r.prompt[0].length > 96 for r in c.trace)

    small, n = shrink(case, fires)
    assert [r.prompt[0].length for r in small.trace] == [101, 101]
    assert n == len(calls) <= 40, n


def test_a_deployment_case_is_cut_by_the_block_it_resolves_to():
    # An unresolved deployment has no geometry: the caller names its block.
    case = parse_case(
        {
            "schema": 1,
            "deployment": {"model": "qwen3_next", "vllm_args": ["--enable-prefix-caching"]},
            "trace": [
                {"prompt": [{"segment": "A", "length": 1152 * 7 + 1}]},
                {"prompt": [{"segment": "A", "length": 1152 * 7 + 1}]},
            ],
        }
    )

    def fires(c):  # one token past a block boundary, two blocks in at least
        return len(c.trace) == 2 and all(r.prompt[0].length % 1152 == 1 and r.prompt[0].length > 2304 for r in c.trace)

    small, with_block = shrink(case, fires, block=1152)
    assert [r.prompt[0].length for r in small.trace] == [2305, 2305]
    assert with_block <= 30, with_block
    # Without it the cuts are by hash units and tokens, which move the
    # block residue: nothing below the drawn length holds.
    unaided, _n = shrink(case, fires)
    assert [r.prompt[0].length for r in unaided.trace] == [1152 * 7 + 1] * 2


def test_the_budget_of_calls_is_kept():
    case = make_case(hybrid(16, 16), [[("A", 5000)], [("A", 5000), ("B", 300)], [("C", 70)]])
    for budget in (0, 1, 5, 17):
        calls = []
        small, n = shrink(case, lambda c: calls.append(c) or True, max_calls=budget)
        assert n == len(calls) <= budget
        if budget == 0:
            assert small == case
