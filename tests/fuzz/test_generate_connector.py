"""The KV connector draw (``fuzz.draw.generate.CONNECTOR_MODES``) and its
``kvspec fuzz --kv-connector`` pin: seeded, kept only where the engine
accepts it, never on the paths that cannot carry it."""

from __future__ import annotations

import itertools
import random

import pytest

from fuzz.draw.choosers import RandomChooser
from fuzz.draw.generate import build_case
from fuzz.driving.drivers import random_cases
from ground.errors import InvalidArgument

FLAG = "--kv-offloading-size"


def accepting_resolver(dep: dict) -> dict:  # a test double of Campaign.resolver: every deployment resolves to block 544
    return {"block": 544, "hash": 544, "max_model_len": 32768}


def refusing_connectors(dep: dict) -> dict | None:  # a test double: an engine that rejects every connector deployment
    return None if FLAG in dep["vllm_args"] else accepting_resolver(dep)


def _args(seed: int, resolver, connector: str, n: int = 40) -> list[tuple[str, ...]]:
    return [
        c.deployment.vllm_args for c in itertools.islice(random_cases(seed, resolver=resolver, connector=connector), n)
    ]


def test_one_deployment_in_four_draws_the_offloading_connector_and_the_draw_is_seeded():
    drawn = _args(3, accepting_resolver, "drawn", 200)
    share = sum(FLAG in a for a in drawn) / len(drawn)
    assert 0.1 < share < 0.45, share
    assert drawn == _args(3, accepting_resolver, "drawn", 200)
    for a in drawn:
        if FLAG in a:
            assert a[a.index(FLAG) + 1] in ("1", "4", "16")


def test_the_pin_puts_it_on_every_deployment_or_on_none():
    assert all(FLAG in a for a in _args(5, accepting_resolver, "offloading"))
    assert not any(FLAG in a for a in _args(5, accepting_resolver, "none"))


def test_a_connector_the_engine_rejects_is_dropped_not_kept():
    assert not any(FLAG in a for a in _args(5, refusing_connectors, "offloading"))


def test_a_pinned_connector_does_not_move_the_other_draws():
    def strip(args):
        args = list(args)
        if FLAG in args:
            del args[args.index(FLAG) : args.index(FLAG) + 2]
        return args

    one = build_case(RandomChooser(random.Random(9)), resolver=accepting_resolver, connector="none")
    other = build_case(RandomChooser(random.Random(9)), resolver=accepting_resolver, connector="offloading")
    assert strip(one.deployment.vllm_args) == strip(other.deployment.vllm_args)
    assert one.deployment.model == other.deployment.model
    assert one.trace == other.trace


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--driver", "atheris", "--kv-connector", "offloading"], "--kv-connector"),
        (["--driver", "hypothesis", "--kv-connector", "none"], "--kv-connector"),
        (["--synthetic-geometry", "--kv-connector", "offloading"], "--kv-connector"),
        (["--engine", "sglang==0.5.23", "--kv-connector", "offloading"], "--kv-connector"),
        (["--kv-connector", "lmcache"], "--kv-connector"),
    ],
)
def test_the_pin_is_refused_where_no_drawn_deployment_could_carry_it(argv, field):
    import argparse

    from kvspec.commands import fuzz as command
    from kvspec.engine_options import parse_engine_options

    parser = argparse.ArgumentParser()
    command.configure(parser)
    args = parser.parse_args(argv)
    with pytest.raises(InvalidArgument) as e:
        command._validate(args, parse_engine_options(args))
    assert str(e.value).startswith(f"{field}="), e.value
