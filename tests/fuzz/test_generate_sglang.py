"""SGLang deployments and cases for a campaign (fuzz/draw/generate_sglang.py),
the SGLang known classes (fuzz/results/known_classes.py), and the flags that name
SGLang (reference/sglang_flags.py, reference/deployment.py,
reference/knobs.py). Engine-free: the resolver here is a named test double
(a function answering what a resolution would), never the engine."""

from __future__ import annotations

import random

import pytest

from fuzz.draw.choosers import RandomChooser
from fuzz.draw.generate_sglang import FALLBACK, build_sglang_case, draw_sglang_deployment, sglang_case_on
from fuzz.results.known_classes import BY_ID, classify
from ground.errors import InvalidArgument, Unsupported
from reference.case import parse_case, with_resolution
from reference.deployment import parse_deployment
from reference.knobs import implemented_rule, resolve_knobs
from reference.predict import predict
from reference.sglang_flags import check_sglang_args


def fake_resolver(refuse=lambda dep: False, block=64, hash_=1):
    """Test double of ``Campaign.resolver``: SGLang's answer, stated by hand."""
    seen = []

    def resolve(dep: dict) -> dict | None:
        seen.append(dep)
        return None if refuse(dep) else {"block": block, "hash": hash_, "max_model_len": 32768, "max_num_seqs": 256}

    resolve.seen = seen
    return resolve


def test_drawn_deployments_parse_and_keep_to_the_allow_list():
    c = RandomChooser(random.Random(3))
    for _ in range(200):
        dep = draw_sglang_deployment(c)
        parsed = parse_deployment(dep)
        assert parsed.engine == "sglang" and parsed.vllm_args == ()
        assert parsed.as_dict() == dep  # canonical: a case's own deployment is the key it was resolved under
        check_sglang_args(dep["sglang_args"])
        args = dep["sglang_args"]  # drawn in the long spelling, each flag once
        if (
            "--mamba-radix-cache-strategy" in args
            and args[args.index("--mamba-radix-cache-strategy") + 1] == "no_buffer"
        ):
            assert "--disable-overlap-schedule" in args


def test_cases_are_one_token_serial_requests_then_a_wave_drawn_on_the_resolved_unit():
    resolver = fake_resolver(block=256, hash_=16)
    cases = [build_sglang_case(RandomChooser(random.Random(s)), resolver) for s in range(40)]
    for case in cases:
        assert case.deployment.engine == "sglang"
        arrived = [i for i, r in enumerate(case.trace) if r.arrival is not None]
        serial = case.trace[: arrived[0] - 1] if arrived else case.trace  # before the wave's head
        assert all(r.max_tokens == 1 and r.arrival is None for r in serial)
        assert not arrived or arrived == list(range(arrived[0], len(case.trace)))  # one wave, at the end
    assert 0 < sum(any(r.arrival is not None for r in c.trace) for c in cases) < 20  # about one in five
    lengths = [r.num_prompt_tokens for case in cases for r in case.trace]
    assert any(n % 256 == 0 for n in lengths) and any(
        n % 256 not in (0, 1, 255) for n in lengths
    )  # biased to the grid, not only on it
    again = [build_sglang_case(RandomChooser(random.Random(s)), fake_resolver(block=256, hash_=16)) for s in range(40)]
    assert again == cases  # seeded


def test_the_random_driver_resolves_each_sglang_deployment_once():
    """The traces drawn on one deployment reuse its resolution (the
    campaign's resolver keeps it by the deployment's JSON)."""
    import itertools
    import json

    from fuzz.driving.drivers import TRACES_PER_DEPLOYMENT, random_cases

    keys, cache = [], {}

    def campaign_like(dep: dict):  # test double of Campaign.resolver: a cache by key over a fake answer
        key = json.dumps(dep, sort_keys=True)
        if key not in cache:
            keys.append(key)
            cache[key] = {"block": 64, "hash": 16, "max_model_len": 32768}
        return cache[key]

    cases = list(itertools.islice(random_cases(5, "sglang", resolver=campaign_like), 4 * TRACES_PER_DEPLOYMENT))
    from fuzz.draw.generate_sglang import without_pinned_pool

    def unpinned(key: str) -> str:  # a trace may pin a pool on its deployment (resolved once more, as drawn)
        return json.dumps(without_pinned_pool(json.loads(key)), sort_keys=True)

    drawn = {json.dumps(c.deployment.as_dict(), sort_keys=True) for c in cases}
    assert {unpinned(k) for k in keys} == {unpinned(d) for d in drawn}
    assert len({unpinned(k) for k in keys}) == 4 and len(keys) <= 8  # one per drawn deployment (and its first pin)


def test_a_refused_draw_is_drawn_again_then_the_fallback():
    refuse_all = fake_resolver(refuse=lambda dep: True)
    case = build_sglang_case(RandomChooser(random.Random(1)), refuse_all)
    from fuzz.draw.generate_sglang import without_pinned_pool

    fallback = without_pinned_pool(case.deployment.as_dict())  # the trace may pin a pool on it
    assert len(refuse_all.seen) == 5 and fallback["sglang_args"] == FALLBACK["sglang_args"]
    refuse_no_buffer = fake_resolver(refuse=lambda dep: "no_buffer" in dep["sglang_args"])
    for s in range(20):
        case = build_sglang_case(RandomChooser(random.Random(s)), refuse_no_buffer)
        assert "no_buffer" not in case.deployment.sglang_args


def test_sglang_flags_are_an_allow_list():
    with pytest.raises(InvalidArgument, match=r"^deployment.sglang_args\[2\]='--trust-remote-code': loads code"):
        check_sglang_args(["--page-size", "64", "--trust-remote-code"])
    with pytest.raises(InvalidArgument, match=r"--page-size='1_000': allowed: an integer"):
        check_sglang_args(["--page-size=1_000"])
    with pytest.raises(
        InvalidArgument, match=r"--mamba-radix-cache-strategy='all': allowed: auto, no_buffer, extra_buffer"
    ):
        check_sglang_args(["--mamba-radix-cache-strategy", "all"])
    with pytest.raises(InvalidArgument, match=r"--disable-radix-cache takes no value"):
        check_sglang_args(["--disable-radix-cache=1"])
    with pytest.raises(InvalidArgument, match=r"not a flag or a flag's value"):
        check_sglang_args(["64"])
    check_sglang_args(["--page_size", "64", "--chunked-prefill-size=2048", "--disable-overlap-schedule"])


def test_a_deployment_names_its_engine_and_keeps_vllms_form():
    vllm = parse_deployment({"model": "qwen3_next", "vllm_args": ["--block-size", "64"]})
    assert (
        "engine" not in vllm.as_dict() and vllm.engine == "vllm"
    )  # a vLLM deployment's JSON (and cache keys) as before
    sg = parse_deployment({"model": "qwen3_next", "engine": "sglang", "sglang_args": ["--page-size", "64"]})
    assert sg.as_dict()["engine"] == "sglang" and "vllm_args" not in sg.as_dict() and sg.args == ("--page-size", "64")
    assert parse_deployment(sg.as_dict()) == sg
    with pytest.raises(InvalidArgument, match=r"^deployment.vllm_args=.*with engine sglang the flags are sglang_args"):
        parse_deployment({"model": "qwen3_next", "engine": "sglang", "vllm_args": ["--block-size", "64"]})
    with pytest.raises(InvalidArgument, match=r"^deployment.platform='cpu': with engine sglang"):
        parse_deployment({"model": "qwen3_next", "engine": "sglang", "platform": "cpu"})


GRID = {
    "groups": [{"kind": "full_attention", "block_size": 64}, {"kind": "mamba", "block_size": 64}],
    "hash_block_size": 64,
    "scheduler_block_size": 64,
    "prefix_match_unit": None,
    "retention_interval": 0,
    "max_num_batched_tokens": 2048,
}


def _case(prompts: list[list[tuple[str, int]]]) -> dict:
    return {
        "schema": 1,
        "deployment": {"model": "qwen3_next", "engine": "sglang", "sglang_args": []},
        "trace": [{"prompt": [{"segment": s, "length": n} for s, n in p]} for p in prompts],
    }


def test_the_promise_on_an_sglang_resolution_has_no_eagle_drop_and_lands_on_the_grid():
    case = with_resolution(
        parse_case(_case([[("A", 3200)], [("A", 3200)], [("A", 3300)], [("A", 3300), ("B", 10)]])),
        GRID,
        None,
        "sglang==0.5.23",
    )
    assert implemented_rule("sglang==0.5.23") == "promise"
    knobs = resolve_knobs(case, "sglang==0.5.23")
    assert not knobs.eagle_drop and knobs.hash_lookahead_tokens == 0 and knobs.alignment == 64
    assert predict(case, "sglang==0.5.23", "promise")["hits"] == [0, 3136, 3200, 3264]
    with pytest.raises(InvalidArgument, match=r"supported: sglang==0.5.23"):
        resolve_knobs(case, "sglang==0.5.22")
    spec = with_resolution(
        parse_case(_case([[("A", 10)]])), GRID, {"method": "mtp", "num_speculative_tokens": 2}, "sglang==0.5.23"
    )
    with pytest.raises(Unsupported):
        resolve_knobs(spec, "sglang==0.5.23")


def _finding(prompts, expected, observed, first, grid_case=True) -> dict:
    raw = _case(prompts)
    if grid_case:
        raw = {**raw, "geometry": GRID, "speculative": None, "resolved_by": "sglang==0.5.23"}
    return {
        "oracle": "promise",
        "first_divergence": first,
        "expected": {"hits": expected},
        "observed": {"hits": observed},
        "case": raw,
        "engine": {"name": "sglang==0.5.23", "version": "sglang==0.5.23", "knobs": {}},
    }


def test_the_sglang_classes_are_told_apart_by_the_rule_they_break():
    assert BY_ID["sglang-grid-resend"].release == BY_ID["sglang-sibling-branch"].release == "sglang==0.5.23"
    grid = _finding([[("A", 128)], [("A", 128)]], [0, 64], [0, 0], 1)
    assert classify(grid) == "sglang-grid-resend"
    off_grid = _finding([[("A", 130)], [("A", 130)]], [0, 128], [0, 64], 1)
    assert classify(off_grid) is None  # low, but not this class's shape
    sibling_ext = _finding(
        [[("A", 128)], [("A", 64), ("B", 64)], [("A", 64), ("B", 64), ("D", 1)]], [0, 0, 128], [0, 0, 64], 2
    )
    assert classify(sibling_ext) == "sglang-sibling-branch"
    sibling_resend = _finding(
        [[("A", 146)], [("A", 108), ("B", 21)], [("A", 108), ("B", 21)]], [0, 0, 128], [0, 0, 64], 2
    )
    assert classify(sibling_resend) == "sglang-sibling-branch"
    as_vllm = {**grid, "engine": {"name": "vllm==0.33.0", "version": "0.33.0", "knobs": {}}}
    assert classify(as_vllm) is None  # the same numbers on vLLM are not an SGLang class
    high = _finding([[("A", 128)], [("A", 128)]], [0, 64], [0, 128], 1)
    assert classify(high) is None


def test_a_case_on_a_resolution_keeps_the_deployment():
    dep = {"model": "qwen3_5", "engine": "sglang", "sglang_args": ["--page-size", "16"]}
    case = sglang_case_on(RandomChooser(random.Random(2)), dep, {"block": 64, "hash": 16, "max_model_len": 500}, "n")
    assert case.deployment.as_dict()["sglang_args"] == ["--page-size", "16"] and case.name == "n"
    assert max(r.num_prompt_tokens for r in case.trace) <= 436  # capped below max_model_len


def _flag(args, flag):
    return int(args[args.index(flag) + 1]) if flag in args else None


def test_a_pinned_strategy_is_drawn_as_pinned():
    c = RandomChooser(random.Random(5))
    for _ in range(20):
        args = draw_sglang_deployment(c, "no_buffer")["sglang_args"]
        assert args[:2] == ["--mamba-radix-cache-strategy", "no_buffer"] and "--disable-overlap-schedule" in args
    assert all("--mamba-radix-cache-strategy" not in draw_sglang_deployment(c, None)["sglang_args"] for _ in range(20))


def test_boundary_cases_sit_on_the_resolved_grid_and_its_neighbours():
    from fuzz.draw.generate_sglang import BOUNDARY_DEPLOYMENTS, boundary_traces, sglang_boundary_cases

    traces = boundary_traces(64, 1000)
    lengths = {p[0][1] for t in traces for p in t if len(p) == 1}
    assert {191, 192, 193, 1001, 1064} <= lengths
    cases = sglang_boundary_cases(fake_resolver(block=64))
    assert len(cases) == len(BOUNDARY_DEPLOYMENTS) * len(traces) and all(c.deployment.engine == "sglang" for c in cases)
    refused = sglang_boundary_cases(fake_resolver(refuse=lambda dep: "no_buffer" in dep["sglang_args"]))
    assert len(refused) == (len(BOUNDARY_DEPLOYMENTS) - 1) * len(traces)  # a deployment SGLang refuses is left out


def test_some_budgets_and_intervals_are_drawn_off_the_grids_and_most_on_them():
    """Off-grid draws as users set them (issue 42 item 5): budgets that are
    not a multiple of the grid their page gives, track intervals that are
    not a power-of-two multiple of it but a multiple of the page (SGLang's
    own check, ``mamba_hook.py:135``); about one draw in OFF_GRID_ODDS each,
    so the grid classes keep most runs."""
    from fuzz.draw.generate_sglang import OFF_GRID_ODDS, grid_of

    c = RandomChooser(random.Random(5))
    n, off_chunk, off_interval = 800, 0, 0
    for _ in range(n):
        args = draw_sglang_deployment(c)["sglang_args"]
        value = {args[k]: args[k + 1] for k in range(len(args) - 1) if args[k].startswith("--")}
        page = int(value["--page-size"]) if "--page-size" in value else None
        grid = grid_of(page)
        if "--chunked-prefill-size" in value and int(value["--chunked-prefill-size"]) % grid:
            off_chunk += 1
        if "--mamba-track-interval" in value:
            t = int(value["--mamba-track-interval"])
            assert t % (page or 1) == 0
            off_interval += (t // grid) & (t // grid - 1) != 0
    share = n / OFF_GRID_ODDS
    # a budget moves off the grid only where the page is finer than the grid
    # (pages default/1/16 of five: SGLang launches only a budget on the page)
    assert 0.6 * share * 3 / 5 < off_chunk < 1.4 * share * 3 / 5, off_chunk
    assert 0.6 * share < off_interval < 1.4 * share, off_interval


def test_every_drawn_budget_is_one_sglang_launches_with():
    """SGLang's launch asserts ``chunked_prefill_size % page_size == 0``
    (``validation_hook.py:243-246``, ``check_server_args`` from
    ``Engine._launch_subprocesses``): no drawn budget breaks it, and off
    the grid it still is where the page is finer than the grid."""
    from fuzz.draw.generate_sglang import grid_of, off_grid_chunk

    c = RandomChooser(random.Random(11))
    for _ in range(600):
        args = draw_sglang_deployment(c)["sglang_args"]
        value = {args[k]: args[k + 1] for k in range(len(args) - 1) if args[k].startswith("--")}
        page = int(value.get("--page-size", 1))
        assert int(value.get("--chunked-prefill-size", page)) % page == 0, args
    for page in (None, 1, 16):
        for chunk in (None, 512, 2048):
            got = {off_grid_chunk(c, page, chunk) for _ in range(40)}
            assert all(g % (page or 1) == 0 and g % grid_of(page) for g in got), (page, chunk, got)
    assert {off_grid_chunk(c, p, 1024) for p in (64, 256) for _ in range(20)} == {1024}  # the page is the grid


def test_a_cap_on_states_per_path_is_kept_in_one_deployment_of_cap_odds():
    """``--mamba-max-states-per-path`` (SGLang's default -1, unlimited)
    leaves the promise unstated: a drawn cap is kept one deployment in
    CAP_ODDS (side stream), so most deployments keep the promise."""
    from fuzz.draw.generate_sglang import CAP_ODDS, MAX_STATES

    c = RandomChooser(random.Random(3))
    n = 800
    caps = sum("--mamba-max-states-per-path" in draw_sglang_deployment(c)["sglang_args"] for _ in range(n))
    share = n / CAP_ODDS * (len(MAX_STATES) - 1) / len(MAX_STATES)
    assert 0.6 * share < caps < 1.4 * share, caps


def test_a_trace_read_from_a_chunk_start_keeps_its_resends_and_prefixes():
    """On a budget off the grid, a trace's first segment is lengthened by a
    chunk start (the page-floored first budget, or that plus the budget):
    every request carrying it moves by the same amount, so a resend stays a
    resend and a prefix a prefix."""
    from fuzz.draw.generate_sglang import chunk_starts, from_chunk_start

    assert chunk_starts(1000, 16) == (992, 1992) and chunk_starts(96, 1) == (96, 192)
    trace = [
        {"prompt": [{"segment": "A", "length": 128}]},
        {"prompt": [{"segment": "A", "length": 128}]},
        {"prompt": [{"segment": "A", "length": 64}, {"segment": "B", "length": 9}]},
        {"prompt": [{"segment": "C", "length": 5}]},
    ]
    out = from_chunk_start(RandomChooser(random.Random(1)), trace, 1000, 16, 24_000)
    shift = out[0]["prompt"][0]["length"] - 128
    assert shift in (992, 1992)
    assert out[1] == out[0] and out[2]["prompt"] == [
        {"segment": "A", "length": 64 + shift},
        {"segment": "B", "length": 9},
    ]
    assert out[3] == trace[3] and trace[0]["prompt"][0]["length"] == 128  # the input is left as it was
    assert from_chunk_start(RandomChooser(random.Random(1)), trace, 1000, 16, 1000) == trace  # past the cap: unchanged


def test_some_cases_decode_to_a_track_point_and_some_deployments_speculate():
    """Decode and speculation drawn from the rules (issue 42 item 3): about
    one case in DECODE_ODDS has one request whose computed end lands on
    the next decode track point or one token either side, then a turn
    quoting its output; about one deployment in SPEC_ODDS (never under
    ``no_buffer``, which SGLang refuses with speculation) runs an EAGLE
    chain, its draft tokens one more than its steps. Side streams: without
    a track grid the cases are the ones a seed drew before."""
    from fuzz.draw.generate_sglang import DECODE_ODDS, SPEC_ODDS

    def with_track(dep):
        return {"block": 64, "hash": 64, "max_model_len": 32768, "max_num_seqs": 256, "track": 256}

    n, decoding = 400, 0
    for s in range(n):
        case = build_sglang_case(RandomChooser(random.Random(s)), with_track)
        plain = build_sglang_case(RandomChooser(random.Random(s)), fake_resolver(hash_=64))
        t = case.trace
        wave = {
            i for i in range(len(t)) if t[i].arrival is not None or (i + 1 < len(t) and t[i + 1].arrival is not None)
        }
        long = [(i, r) for i, r in enumerate(t) if r.max_tokens > 1 and i not in wave]
        if not long:
            assert case == plain  # no decode drawn: the same case
            continue
        decoding += 1
        (i, r), last = long[0], case.trace[-1]
        assert len(long) == 1 and (r.num_prompt_tokens + r.max_tokens - 1) % 256 in (255, 0, 1)
        assert any(getattr(seg, "output", None) == i for seg in last.prompt)  # the follow-up quotes it
        assert [x.prompt for x in case.trace[:-1]] == [x.prompt for x in plain.trace[: len(case.trace) - 1]]
    assert 0.6 * n / DECODE_ODDS < decoding < 1.4 * n / DECODE_ODDS, decoding
    c = RandomChooser(random.Random(7))
    deps = [draw_sglang_deployment(c)["sglang_args"] for _ in range(800)]
    spec = [a for a in deps if "--speculative-algorithm" in a]
    eligible = [a for a in deps if "no_buffer" not in a]
    assert 0.6 * len(eligible) / SPEC_ODDS < len(spec) < 1.4 * len(eligible) / SPEC_ODDS, len(spec)
    for a in spec:
        check_sglang_args(a)
        assert "no_buffer" not in a and a[a.index("--speculative-eagle-topk") + 1] == "1"
        assert (
            int(a[a.index("--speculative-num-draft-tokens") + 1]) == int(a[a.index("--speculative-num-steps") + 1]) + 1
        )


def test_a_serial_case_in_pressure_odds_pins_a_token_pool_sized_from_its_own_lengths():
    """Issue 43 on SGLang: about one serial one-token case in
    PRESSURE_ODDS carries ``--max-total-tokens`` at the level of its
    longest request alone or its two longest together (rounded to the
    grid, plus headroom), never below its longest request; a wave or a
    decoding case never does; a later trace on the same deployment starts
    from the deployment without the pin (sized for another trace)."""
    from fuzz.draw.generate_sglang import (
        POOL_FLAG,
        POOL_HEADROOM,
        PRESSURE_ODDS,
        pool_level,
        sglang_case_on,
        without_pinned_pool,
    )

    assert pool_level([100, 300, 65], "one", 64) == 320 + 4 * 64 and pool_level([100, 300, 65], "two", 64) == 448 + 256
    info = {"block": 64, "hash": 64, "max_model_len": 32768, "track": 256}
    dep = draw_sglang_deployment(RandomChooser(random.Random(0)), "extra_buffer")
    pinned, serial = 0, 0
    for s in range(600):
        case = sglang_case_on(RandomChooser(random.Random(s)), dep, info, None)
        args = list(case.deployment.sglang_args)
        plain = all(r.arrival is None and r.max_tokens == 1 for r in case.trace)
        serial += plain
        if POOL_FLAG not in args:
            continue
        assert plain, case.trace
        pinned += 1
        pool = int(args[args.index(POOL_FLAG) + 1])
        longest = max(r.num_prompt_tokens + 1 for r in case.trace)
        assert pool >= -(-longest // 64) * 64 + POOL_HEADROOM * 64
        again = sglang_case_on(RandomChooser(random.Random(s)), case.deployment.as_dict(), info, None)
        assert again == case  # the pin dropped, then drawn again from the same stream
        assert POOL_FLAG not in without_pinned_pool(case.deployment.as_dict())["sglang_args"]
    assert 0.6 * serial / PRESSURE_ODDS < pinned < 1.4 * serial / PRESSURE_ODDS, (pinned, serial)
