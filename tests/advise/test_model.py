"""advise.model: the minimum cacheable prefix (checked against every
length on small geometries), the failure classes, the retention sweep, the
memory of a state and the recommendation, on the reference model alone."""

from __future__ import annotations

import pytest

from advise import model, workloads
from ground.errors import Unsupported
from reference.case import Case
from reference.knobs import implemented_rule, resolve_knobs
from reference.serial import simulate
from tests.conftest import MTP, MTP_DROP, hybrid, make_case

SEED_FACTS = {"mamba_page_size_bytes": 1638400, "mamba_layers": 48, "tensor_parallel_size": 2, "max_model_len": 32768}


def _geometry(**kw):
    return make_case(hybrid(**kw) if "attention" in kw else kw["raw"], [[("A", 1)]]).geometry


def _seed(spec=MTP_DROP):
    return make_case(hybrid(1600, 1600), [[("A", 1)]], spec)


@pytest.mark.parametrize(
    "version, spec, first, any_, promise",
    [
        (
            "0.29.0",
            MTP_DROP,
            None,
            3201,
            3201,
        ),  # #53504: no first resend ever hits; a second one does from 2 blocks + 1
        ("0.33.0", MTP, 1601, 1601, 1601),  # lookahead hashes instead of the drop
        ("0.33.0", None, 1601, 1601, 1601),
    ],
)
def test_minimum_cacheable_prefix_on_the_seed_geometry(version, spec, first, any_, promise):
    case = _seed(spec)
    got = model.min_cacheable_prefix(case.geometry, case.speculative, version)
    assert (got["first_resend"] or {}).get("tokens") == first
    assert got["any_resend"]["tokens"] == any_
    assert got["promise"]["tokens"] == promise


def _brute(geometry, spec, version, rule, sends, limit):
    knobs = None
    for n in range(1, limit + 1):
        case = Case(geometry, spec, (make_case(hybrid(16, 16), [[("A", n)]]).trace[0],) * sends)
        knobs = knobs or resolve_knobs(case, version)
        if any(s.hit for s in simulate(case, knobs, rule)[1:]):
            return n
    return None


SMALL = [
    (hybrid(16, 16, max_num_batched_tokens=24), None),
    (hybrid(16, 16, max_num_batched_tokens=40), MTP),
    (hybrid(32, 32, max_num_batched_tokens=40), MTP_DROP),
    (hybrid(32, 32, prefix_match_unit=8, max_num_batched_tokens=56), MTP_DROP),
    (hybrid(32, 32, prefix_match_unit=8), None),
    (hybrid(16, 16, retention_interval=32, max_num_batched_tokens=24), MTP_DROP),
    (hybrid(32, 32, prefill_checkpoint_grid=1, max_num_batched_tokens=72), None),
]


def _takes(raw, spec, version) -> bool:
    try:
        resolve_knobs(make_case(raw, [[("A", 1)]], spec), version)
    except Unsupported:
        return False
    return True


BREAKPOINT_CASES = [
    (raw, spec, v) for raw, spec in SMALL for v in ("0.29.0", "0.30.0", "0.33.0") if _takes(raw, spec, v)
]


def test_only_the_internal_checkpoints_before_0_32_0_are_left_out_of_the_breakpoint_search():
    """The combinations the next test leaves out are those a version refuses
    (internal prefill checkpoints before 0.32.0), nothing else."""
    left_out = [
        (raw, spec, v)
        for raw, spec in SMALL
        for v in ("0.29.0", "0.30.0", "0.33.0")
        if (raw, spec, v) not in BREAKPOINT_CASES
    ]
    assert sorted(v for _, _, v in left_out) == ["0.29.0", "0.30.0"] and all(
        raw.get("prefill_checkpoint_grid") for raw, _, _ in left_out
    ), left_out


@pytest.mark.parametrize("raw, spec, version", BREAKPOINT_CASES)
def test_breakpoints_find_the_shortest_hitting_prompt(raw, spec, version):
    """The search looks only at breakpoint lengths; every length below the
    one it finds misses (checked one by one)."""
    case = make_case(raw, [[("A", 1)]], spec)
    g = case.geometry
    limit = model.search_limit(g, None)
    for rule, geo, first in (
        (implemented_rule(version), g, True),
        (implemented_rule(version), g, False),
        ("promise", g, True),
    ):
        found = model.first_hitting(geo, case.speculative, version, rule, limit, first_resend=first)
        expected = _brute(
            geo, case.speculative, version, rule, 2 if first else model.RESENDS, (found or (limit, None))[0]
        )
        assert (found[0] if found else None) == expected, (rule, first)


def test_retention_settings():
    assert model.retention_settings(1600, 11910) == [0, 1600, 3200, 6400, None]
    assert model.retention_settings(1600, 1000) == [0, None]
    assert model.retention_settings(1600, 11910, current=4800) == [0, 1600, 3200, 4800, 6400, None]
    assert len(model.retention_settings(16, 10**6)) == model.MAX_PERIODIC + 2


def test_state_bytes():
    got = model.state_bytes(SEED_FACTS)
    assert got["per_gpu"] == 48 * 1638400 and got["all_gpus"] == 2 * 48 * 1638400
    assert "48 Mamba layers" in got["how"]
    assert model.state_bytes({})["per_gpu"] is None


def test_recommend_takes_the_fewest_states_within_one_percent():
    rows = [
        {"interval": 0, "hit_tokens": 980, "states": 1},
        {"interval": 16, "hit_tokens": 1000, "states": 9},
        {"interval": 32, "hit_tokens": 995, "states": 4},
        {"interval": None, "hit_tokens": 1000, "states": 12},
    ]
    assert model.recommend(rows)["interval"] == 32
    rows[0]["hit_tokens"] = 990  # exactly 99% of the best
    assert model.recommend(rows)["interval"] == 0
    assert (
        model.recommend(
            [{"interval": 0, "hit_tokens": 0, "states": 0}, {"interval": None, "hit_tokens": 0, "states": 3}]
        )["interval"]
        == 0
    )


def test_advice_for_53504_on_the_model():
    w = workloads.build("resend", {"requests": 3, "prompt_tokens": 11910})
    case = Case(_seed().geometry, _seed().speculative, w.requests)
    a = model.advise(case, "0.29.0", SEED_FACTS)
    assert [r["implemented"] for r in a["requests"]] == [0, 0, 9600]
    assert [r["promise"] for r in a["requests"]] == [0, 9600, 9600]
    assert a["totals"]["lost_tokens"] == 9600
    rec = a["retention"]["recommended"]
    assert rec["interval"] == 3200 and rec["states"] == 1 and rec["bytes_per_gpu"] == 48 * 1638400
    assert a["outcomes"][3200].hits == [0, 9600, 9600]
    classes = {c["class"]: c for c in a["failure_classes"]}
    resend = classes["identical resend (#53504 class)"]
    assert resend["exposed"] and resend["case"]["trace"] == [[["A", 3201]]] * 3
    assert resend["case"]["implemented"] == [0, 0, 1600] and resend["case"]["promise"] == [0, 1600, 1600]


def test_no_loss_for_53504_with_lookahead_hashes():
    w = workloads.build("resend", {"requests": 3, "prompt_tokens": 11910})
    case = Case(_seed(MTP).geometry, _seed(MTP).speculative, w.requests)
    a = model.advise(case, "0.33.0", SEED_FACTS)
    assert a["totals"]["lost_tokens"] == 0
    assert a["retention"]["recommended"]["interval"] == 0
    assert not {c["class"]: c for c in a["failure_classes"]}["identical resend (#53504 class)"]["exposed"]


def test_state_counts_are_distinct_prefixes():
    """The count is the number of distinct (prefix with lookahead, position)
    states the requests kept: by definition on token lists, on cases where
    requests keep the same state twice (a resend recomputing what it could
    not reach, dense retention over a shared system prompt)."""
    from reference.case import prompt_tokens

    cases = [
        (
            make_case(
                hybrid(16, 16, retention_interval=None, max_num_batched_tokens=32),
                [[("S", 64), ("A", 20)], [("S", 64), ("B", 20)], [("S", 64), ("A", 40)], [("S", 64), ("A", 20)]],
            ),
            "0.33.0",
        ),
        (make_case(hybrid(16, 16), [[("A", 67)]] * 3, MTP_DROP), "0.29.0"),
        (
            make_case(hybrid(16, 16, retention_interval=None), [[("A", 64)]] * 3),
            "0.33.0",
        ),  # the resend recomputes (and keeps) the state at 64 it cannot hit (cap 63)
    ]
    duplicates = 0
    for case, version in cases:
        knobs = resolve_knobs(case, version)
        (outcome,) = model.run(case, knobs, [(case.geometry.retention_interval, implemented_rule(version))])
        kept = [model.kept_positions(s) for s in outcome.steps]
        L = knobs.hash_lookahead_tokens
        keys = {(tuple(prompt_tokens(r)[: p + L]), p) for r, ps in zip(case.trace, kept) for p in ps}
        assert outcome.states == len(keys)
        held, distinct = model.held_on_path(case.trace, kept, L)
        assert distinct == len(keys)
        duplicates += sum(len(k) for k in kept) - len(keys)
        for i, r in enumerate(case.trace):  # held on a prompt = every kept state on its path
            toks = prompt_tokens(r)
            assert held[i] == sorted(
                {
                    p
                    for j in range(i + 1)
                    for p in kept[j]
                    if prompt_tokens(case.trace[j])[: p + L] == toks[: p + L] and p + L <= len(toks)
                }
            )
    assert duplicates > 0
