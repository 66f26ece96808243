"""A hash unit finer than the kernel's checkpoint grid (fuzz.draw.straddle),
drawn against resolver TEST DOUBLES that state the grid rule of vLLM 0.33.0's
GDN prefill (lcm(unit, 64), the block without a unit, none off the 64 grid)."""

from __future__ import annotations

import math
import random

from fuzz.draw.choosers import RandomChooser
from fuzz.draw.generate import DeploymentClass, build_case, class_schedule, deployment_classes
from fuzz.draw.straddle import may_straddle, settled, straddles, straddling_unit, user_units


def _unit(args) -> int | None:
    return int(args[args.index("--prefix-match-unit") + 1]) if "--prefix-match-unit" in args else None


def gdn_like(dep: dict) -> dict | None:
    """TEST DOUBLE: block 576 at tensor parallel 1 and 2, else 544; the
    checkpoint grid lcm(unit, 64) on a block of the 64 grid, the block
    without a unit, none off it; units that do not divide the block refused."""
    args = dep["vllm_args"]
    block = 576 if args[args.index("--tensor-parallel-size") + 1] in ("1", "2") else 544
    unit = _unit(args)
    if unit and block % unit:
        return None
    grid = (math.lcm(unit, 64) if unit else block) if block % 64 == 0 else None
    return {"block": block, "hash": unit or block, "max_model_len": 32768, "checkpoint_grid": grid}


def fine_grid(dep: dict) -> dict | None:
    """TEST DOUBLE: Mamba-2-like, checkpoints on every token (grid 1), block 544."""
    unit = _unit(dep["vllm_args"])
    return (
        None
        if unit and 544 % unit
        else {"block": 544, "hash": unit or 544, "max_model_len": 32768, "checkpoint_grid": 1}
    )


def test_the_rule_reads_the_resolved_grid():
    assert user_units(320) == [16, 32, 64, 80, 160]
    assert 48 in user_units(576) and 576 not in user_units(576)
    assert straddles(32, {"checkpoint_grid": 64}) and straddles(80, {"checkpoint_grid": 320})
    assert not straddles(64, {"checkpoint_grid": 64}) and not straddles(16, {"checkpoint_grid": 1})
    assert not straddles(16, {"checkpoint_grid": None}) and not straddles(16, None)
    assert may_straddle({"checkpoint_grid": 576}) and not may_straddle({"checkpoint_grid": 1})
    assert settled({"checkpoint_grid": 1}) and not settled({"checkpoint_grid": None})


def test_straddling_unit_keeps_a_straddling_unit_and_else_finds_one():
    c = RandomChooser(random.Random(1))
    grid = lambda u: {"checkpoint_grid": math.lcm(u, 64)}  # noqa: E731
    assert straddling_unit(c, 32, 576, grid) == (32, True)
    found, straddled = straddling_unit(c, 64, 576, grid)
    assert straddled == bool(found % 64), found
    assert straddling_unit(c, 64, 576, lambda u: None) == (64, False)  # nothing resolves: the drawn unit stays


def test_a_unit_class_mostly_draws_a_unit_finer_than_the_resolved_grid():
    """On a model whose deployments export checkpoints on a coarse grid, a
    unit class prefers a deployment that exports them (block 576, not 544)
    and a unit off the grid; a class without a unit is left alone."""
    rng = random.Random(2)
    cls = DeploymentClass("qwen3_next", "drop", True, "dense")
    hits, noted = 0, set()
    for _ in range(80):
        dep = build_case(RandomChooser(rng), resolver=gdn_like, cls=cls, noted=noted).deployment.as_dict()
        info = gdn_like(dep)
        hits += straddles(_unit(dep["vllm_args"]), info)
    assert hits >= 55, hits  # about one in four with a uniform draw of block and unit
    assert noted == {"qwen3_next"}
    rng = random.Random(2)
    plain = DeploymentClass("qwen3_next", "drop", False, "dense")
    assert all(
        _unit(build_case(RandomChooser(rng), resolver=gdn_like, cls=plain).deployment.vllm_args) is None
        for _ in range(20)
    )


def test_a_fine_grid_keeps_the_units_as_drawn():
    """Checkpoints on every token: no unit straddles, so the dividing units
    of the block are drawn as before (16, 32 for 544)."""
    rng = random.Random(3)
    cls = DeploymentClass("nemotron_h", "off", True, "sparse")
    drawn = {_unit(build_case(RandomChooser(rng), resolver=fine_grid, cls=cls).deployment.vllm_args) for _ in range(40)}
    assert drawn <= {16, 32} and len(drawn) == 2, drawn


def test_the_schedule_visits_a_noted_models_unit_classes_once_more_every_few_deployments():
    import itertools

    every = len(deployment_classes())
    plain = list(itertools.islice(class_schedule(random.Random(4)), 3 * every))
    assert all(plain.count(k) == 3 for k in deployment_classes())  # every class once a round
    favoured: set[str] = set()
    schedule = class_schedule(random.Random(4), favoured)
    first = list(itertools.islice(schedule, every))
    assert first == plain[:every]  # nothing noted: the plain schedule
    favoured.add("qwen3_5")
    later = list(itertools.islice(schedule, 4 * every))
    mine = [k for k in later if k.model == "qwen3_5" and k.unit]
    others = [k for k in later if not (k.model == "qwen3_5" and k.unit)]
    assert len(mine) >= 4 * len([k for k in deployment_classes() if k.model == "qwen3_5" and k.unit]) + every // 2
    assert all(others.count(k) >= 2 for k in deployment_classes() if k not in mine)  # every other class still visited
