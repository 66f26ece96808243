"""reference.rescale: one rule moves a case across blocks (the shrinker,
the seeds' deployments and a live replay use it)."""

from __future__ import annotations

import pytest

from reference.case import OUTPUT_SEGMENT, Case, Geometry, Group, Request, Segment
from reference.rescale import rescale_budget, rescale_case, rescale_interval, rescale_length


@pytest.mark.parametrize(
    ("length", "want"),
    [
        (3 * 160, 3 * 32),  # on the block
        (3 * 160 + 1, 3 * 32 + 1),  # +1
        (3 * 160 + 2, 3 * 32 + 2),  # +2
        (3 * 160 + 159, 3 * 32 + 31),  # -1
        (3 * 160 + 158, 3 * 32 + 30),  # -2
        (3 * 160 + 80, 3 * 32 + 16),  # proportional
        (3 * 160 + 3, 3 * 32 + 3),  # proportional, kept clear of +2
        (3 * 160 + 157, 3 * 32 + 29),  # proportional, kept clear of -2
    ],
)
def test_a_length_keeps_its_boundary_class(length: int, want: int) -> None:
    assert rescale_length(length, 160, 32) == want


def test_a_budget_scales_by_blocks_and_never_under_one_block() -> None:
    assert rescale_budget(640, 160, 32) == 128
    assert rescale_budget(1000, 160, 32) == 200
    assert rescale_budget(100, 160, 32) == 32


def test_an_interval_scales_and_dense_or_sparse_stay() -> None:
    assert rescale_interval(480, 160, 32) == 96
    assert rescale_interval(0, 160, 32) == 0
    assert rescale_interval(None, 160, 32) is None


def _case(**geometry) -> Case:
    g = Geometry((Group("full_attention", 160, 1), Group("mamba", 160, 2)), 160, 160, **geometry)
    first = Request(prompt=(Segment("a", 481),), max_tokens=2)
    second = Request(prompt=(Segment("a", 481), Segment(OUTPUT_SEGMENT, 2, output=0)))
    return Case(geometry=g, speculative=None, trace=(first, second))


def test_a_case_moves_with_every_other_geometry_field_kept() -> None:
    case = _case(retention_interval=320, max_num_batched_tokens=800, shared_prefix_checkpoint=True)
    moved = rescale_case(case, 160, 32)
    g = moved.geometry
    assert [(x.kind, x.block_size, x.count) for x in g.groups] == [("full_attention", 32, 1), ("mamba", 32, 2)]
    assert (g.hash_block_size, g.scheduler_block_size, g.prefix_match_unit) == (32, 32, None)
    assert (g.retention_interval, g.max_num_batched_tokens) == (64, 160)
    assert g.shared_prefix_checkpoint is True
    assert [s.length for s in moved.trace[0].prompt] == [3 * 32 + 1]
    assert moved.trace[1].prompt[1] == case.trace[1].prompt[1]  # an output segment stays


def test_the_default_budget_stays_the_default() -> None:
    assert rescale_case(_case(), 160, 32).geometry.max_num_batched_tokens == 8192
