"""Properties of the reference model over random geometries and traces."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference.boundaries import floor_to
from reference.predict import predict
from tests.conftest import MTP, MTP_DROP, hybrid, make_case

VERSIONS = st.sampled_from(["0.29.0", "0.30.0", "0.33.0"])
SPECS = st.sampled_from([None, MTP, MTP_DROP])
RULES = st.sampled_from(["promise", "replay", "legacy"])


@st.composite
def geometries(draw, retention=st.sampled_from([None, 0, "periodic"])):
    block = draw(st.sampled_from([16, 32, 64, 96]))
    interval = draw(retention)
    if interval == "periodic":
        interval = block * draw(st.integers(1, 3))
    return hybrid(
        block,
        block,
        draw(st.integers(1, 3)),
        retention_interval=interval,
        max_num_batched_tokens=draw(st.sampled_from([block, 3 * block, 8192])),
    )


@st.composite
def traces(draw):
    names = st.sampled_from("ABC")
    prompts = []
    for _ in range(draw(st.integers(1, 5))):
        prompts.append([(draw(names), draw(st.integers(1, 400))) for _ in range(draw(st.integers(1, 2)))])
    return prompts


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(geometries(), traces(), SPECS, VERSIONS, RULES)
def test_hits_never_exceed_cap_and_are_aligned(geometry, prompts, spec, version, rule):
    case = make_case(geometry, prompts, spec)
    result = predict(case, version, rule)
    unit = result["knobs"]["alignment"]
    for hit, query in zip(result["hits"], result["queries"]):
        assert 0 <= hit <= query - 1 or hit == 0
        assert hit % unit == 0


@settings(max_examples=100, deadline=None)
@given(geometries(retention=st.just(None)), st.integers(1, 600), SPECS, VERSIONS)
def test_dense_first_repeat_hits_the_scheduler_boundary(geometry, n, spec, version):
    case = make_case(geometry, [[("A", n)]] * 2, spec)
    result = predict(case, version)
    step = result["explain"][1]
    assert result["hits"][1] == floor_to(step["scheduler_boundary"], result["knobs"]["alignment"])


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([16, 32, 1600]), st.integers(1, 5000), st.integers(1, 2000), SPECS, VERSIONS)
def test_sparse_promise_equals_dense_for_resend_and_longer_sibling(block, n, extra, spec, version):
    prompts = [[("A", n)], [("A", n)], [("A", n + extra)]]
    sparse = predict(make_case(hybrid(block, block, retention_interval=0), prompts, spec), version)["hits"]
    dense = predict(make_case(hybrid(block, block, retention_interval=None), prompts, spec), version)["hits"]
    assert sparse == dense


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([16, 32]), st.integers(1, 400), st.integers(1, 400), SPECS)
def test_longer_sibling_of_fresh_prompt_matches_dense(block, n, extra, spec):
    prompts = [[("A", n)], [("A", n + extra)]]
    sparse = predict(make_case(hybrid(block, block), prompts, spec))["hits"]
    dense = predict(make_case(hybrid(block, block, retention_interval=None), prompts, spec))["hits"]
    assert sparse == dense


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("AB"), st.integers(1, 40)), min_size=1, max_size=3),
    st.lists(st.tuples(st.sampled_from("AB"), st.integers(1, 40)), min_size=1, max_size=3),
)
def test_common_prefix_shortcut_equals_token_comparison(p, q):
    from reference.case import prompt_tokens
    from reference.serial import common_prefix, known_common

    a, b = make_case(hybrid(16, 16), [p, q]).trace
    ta, tb = prompt_tokens(a), prompt_tokens(b)
    naive = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
    assert common_prefix(ta, tb, known_common(a.prompt, b.prompt)) == naive
