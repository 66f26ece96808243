"""fuzz.draw.traces: a resend or extension repeats, one time in two, a
prompt beside a checkpoint (on the cache's key grid or one past it), from
the side stream; a chooser without a side stream keeps its draw."""

from __future__ import annotations

import random

from fuzz.draw.choosers import BytesChooser, RandomChooser
from fuzz.draw.traces import _beside_checkpoint, beside_checkpoint


def test_a_prompt_on_the_key_grid_or_one_past_it_is_beside_a_checkpoint():
    assert beside_checkpoint(288, 144) and beside_checkpoint(289, 144)  # the block grid
    assert not beside_checkpoint(290, 144) and not beside_checkpoint(143, 144)
    assert beside_checkpoint(1664, 320, 32) and beside_checkpoint(1665, 320, 32)  # the hash-unit grid
    assert not beside_checkpoint(1666, 320, 32)
    assert beside_checkpoint(320, 320, 320) and not beside_checkpoint(32, 320, 320)  # a unit of the block: the block


def test_a_repeat_takes_a_prompt_beside_a_checkpoint_half_the_time_and_never_moves_the_main_stream():
    off, on = [{"segment": "A", "length": 300}], [{"segment": "B", "length": 288}]
    taken = []
    for seed in range(200):
        rng = random.Random(seed)
        c = RandomChooser(rng)
        before = rng.getstate()
        taken.append(_beside_checkpoint(c, [off, on], off, "resend", 144, None) is on)
        assert rng.getstate() == before  # the side stream only
    assert 70 < sum(taken) < 130
    c = RandomChooser(random.Random(1))
    assert _beside_checkpoint(c, [off], off, "resend", 144, None) is off  # none beside: the draw stands
    assert all(_beside_checkpoint(c, [off, on], off, "sibling", 144, None) is off for _ in range(20))
    assert _beside_checkpoint(BytesChooser(b"\xff" * 8), [off, on], off, "resend", 144, None) is off
