"""llama.cpp's checkpoint rule (reference/llamacpp.py) and its flags, pure:
no engine."""

from __future__ import annotations

import pytest

from ground.errors import InvalidArgument
from reference.case import parse_case
from reference.deployment import parse_deployment
from reference.llamacpp import (
    Settings,
    add_checkpoint,
    batch_ends,
    placements,
    simulate,
)
from reference.llamacpp_flags import parse_llamacpp_args


def _case(prompts, args=(), max_tokens=1):
    return parse_case(
        {
            "schema": 1,
            "deployment": {"model": "granitemoehybrid", "engine": "llamacpp", "llamacpp_args": list(args)},
            "trace": [
                {"prompt": [{"segment": s, "length": n} for s, n in p], "max_tokens": max_tokens} for p in prompts
            ],
        }
    )


def test_checkpoints_land_before_the_last_ubatch_and_four_before_the_end():
    st = Settings(n_batch=2048, n_ubatch=512)
    assert batch_ends(0, 1200, 2048, 512) == [684, 1196, 1200]
    assert placements(0, 1200, st) == [684, 1196]  # not at 0: the memory is empty there
    assert placements(0, 300, st) == [296]  # shorter than 4 + n_ubatch: one checkpoint
    assert placements(684, 1000, st) == [684, 996]
    assert placements(0, 5000, Settings(n_batch=2048, n_ubatch=512)) == [
        4484,
        4996,
    ]  # full batches until the last ubatch: none of those checkpointed
    assert placements(0, 1200, Settings(n_ctx_checkpoints=0)) == []


def test_issue_44_trace_resend_longer_diverging_then_again():
    steps = simulate(
        _case(
            [[("A", 1200)], [("A", 1200)], [("A", 1200), ("B", 300)], [("A", 800), ("C", 200)], [("A", 1200)]],
            max_tokens=4,
        ),
        Settings(),
    )
    assert [s.hit for s in steps] == [0, 1196, 1196, 684, 684]
    assert [s.restored for s in steps] == [None, 1196, 1196, 684, 684]
    assert steps[3].erased == [1196, 1496]  # past the resume point
    assert [s.held for s in steps] == [[684, 1196], [684, 1196], [684, 1196, 1496], [684, 996], [684, 1196]]


def test_a_prompt_extending_all_the_slot_holds_uses_the_slot_state():
    steps = simulate(_case([[("A", 1200)], [("A", 1200), ("B", 300)]]), Settings())
    assert steps[1].hit == 1200 and steps[1].restored is None  # max_tokens 1: the slot holds exactly A


def test_no_checkpoint_below_the_divergence_reprocesses_everything():
    steps = simulate(_case([[("A", 1200)], [("A", 600), ("C", 10)]]), Settings())
    assert steps[1].hit == 0 and steps[1].forced_full and steps[1].erased == [684, 1196]


def test_full_list_drops_other_tasks_checkpoints_within_min_step_then_the_oldest():
    from reference.llamacpp import Checkpoint

    cps = [Checkpoint(100, 0), Checkpoint(150, 0), Checkpoint(400, 0)]
    assert add_checkpoint(cps, 500, 1, Settings(n_ctx_checkpoints=3, checkpoint_min_step=64)) == [150]
    assert [c.n_tokens for c in cps] == [100, 400, 500]
    assert add_checkpoint(cps, 600, 1, Settings(n_ctx_checkpoints=3, checkpoint_min_step=0)) == [100]


def test_prompt_cache_loads_a_better_cached_prompt_on_lru():
    st = Settings(prompt_cache=True)
    steps = simulate(_case([[("A", 1000)], [("B", 600)], [("A", 1000), ("C", 300)]]), st)
    assert steps[2].prompt_cache_load and steps[2].hit == 1000
    assert (
        simulate(_case([[("A", 1000)], [("B", 600)], [("A", 1000), ("C", 300)]]), Settings(prompt_cache=False))[2].hit
        == 0
    )


def test_flags_allow_list_and_deployment():
    assert parse_llamacpp_args(["--ctx-size", "8192", "--no-cache-prompt", "--ubatch-size=64"]) == {
        "n_ctx": 8192,
        "cache_prompt": False,
        "n_ubatch": 64,
    }
    for bad in (
        ["--model", "x"],
        ["--ctx-size"],
        ["--ctx-size", "1e9"],
        ["--parallel", "99"],
        ["8192"],
        ["--swa-full=1"],
    ):
        with pytest.raises(InvalidArgument):
            parse_llamacpp_args(bad)
    d = parse_deployment({"model": "qwen3_next", "engine": "llamacpp", "llamacpp_args": ["--parallel", "2"]})
    assert d.platform == "cpu" and d.args == ("--parallel", "2") and d.as_dict()["llamacpp_args"] == ["--parallel", "2"]
    with pytest.raises(InvalidArgument):
        parse_deployment({"model": "qwen3_next", "llamacpp_args": ["--parallel", "2"]})
    with pytest.raises(InvalidArgument):
        parse_deployment({"model": "qwen3_next", "engine": "llamacpp", "platform": "cuda"})


def test_idle_slots_publish_a_copy_a_later_request_loads():
    """Two slots: the sibling state slot 1 held before a resend of the long
    prompt replaced it is found in the RAM cache (campaign seed 1 case 27,
    observed on the wheel: 0, 0, 0, 217, 473, 217)."""
    case = parse_case(
        {
            "schema": 1,
            "deployment": {"model": "nemotron_h", "engine": "llamacpp", "llamacpp_args": []},
            "trace": [
                {"prompt": [{"segment": "s1", "length": 1418}], "max_tokens": 3},
                {"prompt": [{"segment": "s1", "length": 389}, {"segment": "s2", "length": 88}], "max_tokens": 2},
                {"prompt": [{"segment": "s3", "length": 961}], "max_tokens": 3},
                {"prompt": [{"segment": "s1", "length": 1418}], "max_tokens": 4},
                {
                    "prompt": [
                        {"segment": "s1", "length": 389},
                        {"segment": "s2", "length": 88},
                        {"segment": "s4", "length": 202},
                    ],
                    "max_tokens": 3,
                },
                {"prompt": [{"segment": "s1", "length": 1418}], "max_tokens": 1},
            ],
        }
    )
    st = Settings(n_parallel=2, n_batch=1024, n_ubatch=256, checkpoint_min_step=16)
    assert [s.hit for s in simulate(case, st)] == [0, 0, 0, 217, 473, 217]
    no_idle = Settings(n_parallel=2, n_batch=1024, n_ubatch=256, checkpoint_min_step=16, cache_idle_slots=False)
    assert [s.hit for s in simulate(case, no_idle)][4] == 217  # without the idle copy the sibling's state is gone
