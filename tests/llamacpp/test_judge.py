"""llama.cpp through the one judge, without the engine (hand observations,
named as such): the family's own checks are declared in its registry line
and run by the reference and promise oracles; the promise stated for one
live state per slot; the family generator draws through the campaign's
chooser, seeded."""

from __future__ import annotations

import random

from fuzz.draw import generate_llamacpp as G
from fuzz.draw.choosers import RandomChooser
from fuzz.judge.oracle_llamacpp import check_rule, check_slot_promise, slot_promise
from fuzz.judge.oracles import oracles_for
from fuzz.judge.verdict import divergences, judge
from reference.case import case_to_dict, parse_case
from reference.llamacpp import Settings, predict

VERSION = "llamacpp==2026.10.11549"
SERVER = {"n_slots": 1, "n_ctx_checkpoints": 32, "checkpoint_min_step": 8192, "n_batch": 2048, "n_ubatch": 512}
SERVER |= {"prompt_cache": True, "cache_idle_slots": True}


def case(*lengths_and_segments, args=("--parallel", "1")):
    trace = [{"prompt": [{"segment": s, "length": n} for s, n in p], "max_tokens": 4} for p in lengths_and_segments]
    dep = {"model": "nemotron_h", "engine": "llamacpp", "llamacpp_args": list(args)}
    return parse_case({"schema": 1, "deployment": dep, "trace": trace})


def observed(c, server=SERVER, hits=None):
    """A HAND OBSERVATION: what the rule predicts, as the driver reports it,
    with ``hits`` put in place of the engine's."""
    ref = predict(c, Settings.of(server, {"cache_prompt": True}))
    explain = [dict(e, request=i) for i, e in enumerate(ref["explain"])]
    if hits is not None:
        for e, h in zip(explain, hits):
            e["hit"] = h
    return {
        "engine": VERSION,
        "hits": [e["hit"] for e in explain],
        "queries": ref["queries"],
        "explain": explain,
        "resolution": {"server": server, "params": {"cache_prompt": True}},
    }


SIBLINGS = case([("A", 1200)], [("A", 1200)], [("A", 1200), ("B", 300)], [("A", 800), ("C", 200)], [("A", 1200)])


def test_the_family_is_judged_by_its_own_checks_and_outputs():
    chosen = oracles_for(VERSION)
    assert {"promise", "reference", "outputs", "cap", "keys"} <= set(chosen)
    assert "knobs" not in chosen and "split" not in chosen  # vLLM's own rules


def test_the_rule_agrees_and_a_changed_hit_or_checkpoint_diverges():
    obs = observed(SIBLINGS)
    assert obs["hits"] == [0, 1196, 1196, 684, 684]
    assert divergences(SIBLINGS, VERSION, obs) == []
    bad = observed(SIBLINGS, hits=[0, 1196, 1196, 300, 684])
    d = check_rule(SIBLINGS, VERSION, bad)
    assert d and d[0].first == 3 and "300 by llama.cpp, 684 by the rule" in d[0].detail
    held = observed(SIBLINGS)
    held["explain"][2]["checkpoints_held"] = [684]
    assert check_rule(SIBLINGS, VERSION, held)[0].first == 2


def test_the_promise_for_one_live_state_per_slot():
    st = Settings.of(SERVER, {"cache_prompt": True})
    # a resend and a longer sibling of the request before: at least M - 4; nothing after a diverging sibling
    assert slot_promise(SIBLINGS, st) == [None, 1196, 1196, None, None]
    low = observed(SIBLINGS, hits=[0, 1196, 1000, 684, 684])
    d = check_slot_promise(SIBLINGS, VERSION, low)
    assert d and d[0].requests == [2] and d[0].expected[2] == 1196
    v = judge(None, low, divergences(SIBLINGS, VERSION, low))
    assert v.verdict == "diverges" and v.oracle == "promise" and v.first == 2
    # several slots, checkpoints off, or the prompt cache off: nothing promised
    for server, params in (
        ({**SERVER, "n_slots": 2}, {}),
        ({**SERVER, "n_ctx_checkpoints": 0}, {}),
        (SERVER, {"cache_prompt": False}),
    ):
        assert set(slot_promise(SIBLINGS, Settings.of(server, params))) == {None}
    assert slot_promise(case([("A", 4)], [("A", 4)]), st) == [None, None]  # no checkpoint at 0


def test_the_generator_draws_through_the_chooser_seeded():
    def draw(seed):
        c = RandomChooser(random.Random(seed))
        return [case_to_dict(G.build_case(c, None)) for _ in range(5)]

    assert draw(3) == draw(3) and draw(3) != draw(4)
    for d in draw(5):
        assert d["deployment"]["engine"] == "llamacpp" and 2 <= len(d["trace"]) <= 6
