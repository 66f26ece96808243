"""SGLang deployments for a campaign (``kvspec fuzz --engine sglang==X``):
SGLang's own knobs, drawn here; the traces are the engine-neutral ones of
:mod:`fuzz.draw.generate` (resends, longer siblings, siblings diverging
anywhere, junction chains, lengths biased to kB-1, kB, kB+1 and kB+r)
drawn on the unit SGLang resolved, exactly as for vLLM.

A deployment: a shipped hybrid model SGLang routes through its hybrid
Mamba radix cache (four of them) x ``--mamba-radix-cache-strategy`` {auto, extra_buffer,
no_buffer} x ``--page-size`` {default, 1, 16, 64, 256} x
``--chunked-prefill-size`` {default, 512, 1024, 2048, 8192} x
``--mamba-track-interval`` {default, 256, 512, 1024} x
``--mamba-max-states-per-path`` {default, 1, 2, 4}, a cap kept in one
deployment of :data:`CAP_ODDS` (it leaves the promise unstated); then, in
one draw of :data:`OFF_GRID_ODDS` each, the budget and the track interval
moved off the grids as users set them (:func:`off_grid_chunk`: still a
multiple of the page, which SGLang's launch requires;
:func:`off_grid_interval`), with
``--disable-overlap-schedule`` where ``no_buffer`` needs it (SGLang 0.5.23
``arg_groups/mamba_hook.py validate_mamba_no_buffer``). What SGLang refuses
(``no_buffer`` with a page above 1, a track interval that is not a multiple
of the page) it refuses through the resolver, and another deployment is
drawn. The trace is drawn on what SGLang resolved (the resolver: the
checkpoint grid as the block, the page as the hash unit): SGLang's rule of
where a state can be kept, never a known bug's lengths. On a budget off
the grid, half the traces are read from a chunk start on
(:func:`from_chunk_start`): SGLang tracks relative to an extend's start.

Requests run one after another. One case in :data:`DECODE_ODDS` decodes
(from the chooser's side stream, so a seed's other draws stay): one request
asks for as many tokens as bring its computed end to the next decode track
point (``track``: SGLang's ``mamba_track_grid``, a fact of its resolution)
or one token either side, where a decode step tracks and where the finished
request's donation changes (``components/mamba.py:582
_select_finished_checkpoint``), and a later turn quotes its output. One
deployment in :data:`SPEC_ODDS` runs an EAGLE chain (``--speculative-algorithm``
EAGLE or NEXTN, 1-5 steps, topk 1), which SGLang takes with the extra
buffer. One case in five without speculation or decode gets a concurrent wave after
its serial trace (``fuzz.draw.traces._concurrent_wave``, as for vLLM: a head
extending an earlier prompt, then requests sent 0-3 steps after one another
that share its prefix), which the driver runs through SGLang's scheduler
loop (``engine_adapter/sglang_engine/batching.py``); speculation in a wave
is refused by the driver, so it is not drawn. One serial, one-token case
in :data:`PRESSURE_ODDS` pins SGLang's token pool (``--max-total-tokens``)
at room for its longest request alone or its two longest together
(:func:`with_pinned_pool`), so SGLang's own allocation evicts from the
radix cache (issue 43).
"""

from __future__ import annotations

from fuzz.draw.choosers import Chooser
from fuzz.draw.generate import MAX_DRAWN_PROMPT, _trace, first_resolved
from fuzz.draw.generate_pressure import without_flags
from fuzz.draw.traces import _concurrent_wave
from reference.case import Case, parse_case
from reference.deployment import parse_deployment

#: Shipped models SGLang 0.5.23 serves through its hybrid Mamba radix cache.
#: (The shipped nemotron_h config is refused by SGLang's own config class:
#: its ``layers_block_type`` spells the kinds as transformers 5.20 does,
#: ``full_attention``/``linear_attention``; SGLang's wants ``attention``/``mamba``.)
SGLANG_MODELS = ("qwen3_next", "qwen3_5", "falcon_h1", "granitemoehybrid")
STRATEGIES = (None, "extra_buffer", "no_buffer")
PAGE_SIZES = (None, 1, 16, 64, 256)
CHUNKED_PREFILL = (None, 512, 1024, 2048, 8192)
TRACK_INTERVALS = (None, 256, 512, 1024)
MAX_STATES = (None, 1, 2, 4)
#: One draw in this many moves the chunk budget off the page and grid, and
#: (apart) one in this many the track interval off the power-of-two grid.
#: Drawn from the chooser's side stream, so the on-grid draws (and the
#: traces after them) are the ones a seed drew before: a budget off the
#: checkpoint grid has no promise geometry (``resolve.SglangResolution.
#: geometry``: only the safety oracles judge it), so off-grid draws are
#: kept to a share that leaves the grid classes their runs.
OFF_GRID_ODDS = 4
#: One case in this many decodes (:func:`with_decode`), one deployment in
#: this many speculates (:func:`spec_flags`); both from the side stream.
#: A decode step costs about a prefill (a few ms here), so the share is
#: kept where the prefill classes keep most of the runs.
DECODE_ODDS = 8
SPEC_ODDS = 8
#: One deployment in this many keeps its drawn ``--mamba-max-states-per-path``
#: cap (from the side stream); the others run SGLang's default, -1
#: (unlimited: ``arg_groups/fields/exec_.py:497-503``). A cap makes SGLang
#: drop a path's shallowest interior states after each insert
#: (``unified_cache/components/mamba.py:265-312``
#: ``_evict_excess_path_states``), which neither the promise nor the replay
#: rule states (``resolve.SglangResolution.geometry``,
#: ``reference.sglang_prefill.SglangSetting.check``): a capped deployment
#: is judged by the safety oracles alone, like a budget off the grid, so it
#: is kept to the same share. (Drawn uniformly with the default, three caps
#: in four deployments left the promise unstated on about three of four:
#: seed 1 of stop 47 found no grid-class finding in 450 runs.)
CAP_ODDS = OFF_GRID_ODDS
#: The most speculative steps drawn (SGLang's own default for NEXTN is 3).
MAX_SPEC_STEPS = 5
#: The model's Mamba chunk when the page is SGLang's default (the grid is
#: ``lcm(max(chunk, page), page)``, ``runtime_context.py:1966``).
MODEL_CHUNK = 64


def grid_of(page: int | None) -> int:
    """The checkpoint grid a drawn page gives (power-of-two pages, a 64-token model chunk)."""
    return max(MODEL_CHUNK, page or 1)


def off_grid_chunk(c: Chooser, page: int | None, chunk: int | None) -> int | None:
    """A ``--chunked-prefill-size`` near ``chunk`` (SGLang's default: 4096,
    as it resolves for the CUDA platform) that SGLang launches with and
    that is not a multiple of the checkpoint grid: ``k x grid + r`` with r
    one page, half a grid or a grid less one page, or the round decimal
    size a user types (500, 1000, 2000, 4000, 8000) floored to the page.
    A launch takes only a budget that is a multiple of the page
    (``arg_groups/validation_hook.py:243-246``, asserted by
    ``check_server_args`` in ``Engine._launch_subprocesses``,
    ``entrypoints/engine.py:1165``, for the HTTP server and the Python
    engine alike; kvspec's resolver runs it too, and the draw keeps to it
    so that no drawn case is refused). So where the page is the grid (64
    and up: every multiple of the page is on the grid) no budget is both:
    ``chunk`` as drawn."""
    p, grid = page or 1, grid_of(page)
    rest = sorted({r for r in (p, grid // 2, grid - p) if 0 < r < grid and r % p == 0})
    if not rest:
        return chunk
    size = chunk or 4096
    if c.integer(0, 2) == 0:
        typed = max(100, size * 1000 // 1024 // 100 * 100) // p * p
        if typed % grid:
            return typed
    return max(1, size // grid) * grid + c.choice(rest)


def off_grid_interval(c: Chooser, page: int | None) -> int:
    """A ``--mamba-track-interval`` that SGLang takes (a multiple of the
    page, ``arg_groups/mamba_hook.py:135``) and is not a power-of-two
    multiple of the grid: 3, 5, 6 or 12 grids."""
    return c.choice((3, 5, 6, 12)) * grid_of(page)


def spec_flags(c: Chooser) -> list[str]:
    """An EAGLE chain as a user sets it: the algorithm, its steps, topk 1,
    one draft token more than the steps."""
    steps = c.integer(1, MAX_SPEC_STEPS)
    return [
        "--speculative-algorithm",
        c.choice(("EAGLE", "NEXTN")),
        "--speculative-num-steps",
        str(steps),
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        str(steps + 1),
    ]


def with_decode(c: Chooser, trace: list[dict], track: int) -> list[dict]:
    """``trace`` with one request decoding to the next track point past its
    prompt, or one token either side (its ``n + m - 1`` computed tokens on
    ``k x track + {-1, 0, 1}``), then a turn quoting its output and a new
    segment of up to one track grid."""
    out = [dict(r) for r in trace]
    j = c.integer(0, len(out) - 1)
    n = sum(int(s.get("length", 0)) for s in out[j]["prompt"])
    target = (n // track + 1) * track + c.choice((-1, 0, 1))
    out[j]["max_tokens"] = max(2, target - n + 1)
    follow = [dict(x) for x in out[j]["prompt"]] + [{"output": j}, {"segment": "Q", "length": c.integer(1, track)}]
    return out + [{"prompt": follow}]


def chunk_starts(chunk: int, page: int) -> tuple[int, int]:
    """Where a fresh prompt's second and third chunks start: the first
    admission extends the budget floored to the page
    (``managers/schedule_policy.py:1664-1670``,
    ``reference.sglang_prefill.first_chunk``), a continuing chunk the whole
    budget, unrounded (``schedule_policy.py:1140 add_chunked_req``,
    ``reference.sglang_prefill.next_chunk``)."""
    first = chunk // page * page
    return first, first + chunk


def from_chunk_start(c: Chooser, trace: list[dict], chunk: int, page: int, cap: int) -> list[dict]:
    """``trace`` with its first segment read from a chunk start on: every
    request's leading segment of that name ``start`` tokens longer (resends
    stay resends, prefixes stay prefixes), ``start`` one of
    :func:`chunk_starts`. The extra buffer tracks a state at the last grid
    point of an extend counted from the extend's own start
    (``schedule_batch.py _mamba_radix_cache_v2_req_prepare_for_extend``:
    ``prefix_len + (extend_len // grid) * grid``; ``reference.sglang_prefill.track``),
    and a continuing chunk's start is the previous chunk's end: so the
    trace's lengths on the grid (k x grid and one token either side) land
    on the points that extend tracks. Unchanged where a request would pass ``cap``."""
    if not trace or not trace[0]["prompt"]:
        return trace
    name = trace[0]["prompt"][0]["segment"]
    start = c.choice(chunk_starts(chunk, page))
    longest = max(sum(int(x.get("length", 0)) for x in r["prompt"]) for r in trace)
    if start <= 0 or longest + start > cap:
        return trace
    out = []
    for r in trace:
        prompt = [dict(x) for x in r["prompt"]]
        if prompt[0].get("segment") == name and "length" in prompt[0]:
            prompt[0]["length"] += start
        out.append({**r, "prompt": prompt})
    return out


#: When every drawn deployment is refused: one SGLang always builds.
FALLBACK = parse_deployment(
    {"model": "qwen3_next", "engine": "sglang", "sglang_args": ["--mamba-radix-cache-strategy", "extra_buffer"]}
).as_dict()


def draw_sglang_deployment(c: Chooser, strategy: str | None | bool = False) -> dict:
    """One SGLang deployment (a ``deployment`` block in its canonical form,
    ``Deployment.as_dict``: the key the campaign's resolver keeps it under,
    so a case's own deployment finds it again), its flags drawn apart.
    ``strategy``: pin ``--mamba-radix-cache-strategy`` (None: SGLang's
    default) instead of drawing it."""
    args: list[str] = []
    if strategy is False:
        strategy = c.choice(STRATEGIES)
    if strategy is not None:
        args += ["--mamba-radix-cache-strategy", strategy]
    drawn = {
        flag: c.choice(options)
        for flag, options in (
            ("--page-size", PAGE_SIZES),
            ("--chunked-prefill-size", CHUNKED_PREFILL),
            ("--mamba-track-interval", TRACK_INTERVALS),
            ("--mamba-max-states-per-path", MAX_STATES),
        )
    }
    side = c.side() if hasattr(c, "side") else c
    page = drawn["--page-size"]
    if side.integer(0, OFF_GRID_ODDS - 1) == 0:
        drawn["--chunked-prefill-size"] = off_grid_chunk(side, page, drawn["--chunked-prefill-size"])
    if side.integer(0, OFF_GRID_ODDS - 1) == 0:
        drawn["--mamba-track-interval"] = off_grid_interval(side, page)
    spec = []
    if strategy == "no_buffer":
        spec = ["--disable-overlap-schedule"]
    elif side.integer(0, SPEC_ODDS - 1) == 0:
        spec = spec_flags(side)
    if side.integer(0, CAP_ODDS - 1) != 0:  # after the draws above: they stay what the seed drew
        drawn["--mamba-max-states-per-path"] = None  # SGLang's default, -1: unlimited
    for flag, value in drawn.items():
        if value is not None:
            args += [flag, str(value)]
    args += spec
    return parse_deployment({"model": c.choice(SGLANG_MODELS), "engine": "sglang", "sglang_args": args}).as_dict()


def build_sglang_case(c: Chooser, resolver, name: str | None = None, *, boundary_bias: bool = True) -> Case:
    """A deployment SGLang builds (up to four draws, then :data:`FALLBACK`)
    and a serial trace on the unit it resolved."""
    dep, info = first_resolved(
        lambda: draw_sglang_deployment(c), resolver, FALLBACK, {"block": 64, "hash": 64, "max_model_len": 32768}
    )
    return sglang_case_on(c, dep, info, name, boundary_bias)


def sglang_case_on(c: Chooser, deployment: dict, info: dict, name: str | None, boundary_bias: bool = True) -> Case:
    """A trace on a resolved SGLang deployment (``info``: its block and hash
    unit). A pool pinned for an earlier trace on it is dropped first (it
    was sized for that trace's lengths: :func:`with_pinned_pool`)."""
    deployment = without_pinned_pool(deployment)
    block, unit = int(info["block"]), int(info["hash"])
    cap = max(1, min(MAX_DRAWN_PROMPT, int(info.get("max_model_len") or MAX_DRAWN_PROMPT) - 64))
    trace = _trace(c, block, boundary_bias, unit if unit < block else None, cap)
    side = c.side() if hasattr(c, "side") else None
    chunk = int(info.get("chunk") or 0)
    if side is not None and chunk > 0 and chunk % block and side.integer(0, 1) == 0:
        # a budget off the grid: its continuing chunks start off the grid (half of its cases)
        trace = from_chunk_start(side.side(), trace, chunk, unit, cap)
    track = int(info.get("track") or 0)
    decode = side is not None and side.integer(0, DECODE_ODDS - 1) == 0  # drawn whether or not a grid is known
    if decode and track > 0:
        trace = with_decode(side, trace, track)
    elif side is not None and "--speculative-algorithm" not in deployment.get("sglang_args", ()):
        trace = _concurrent_wave(side, trace, block, cap)  # one case in five, after the serial trace
    if side is not None:  # the side stream's last draws (the wave's ``side.side()`` stream would correlate)
        deployment = with_pinned_pool(side, deployment, trace, block)
    return parse_case({"schema": 1, "name": name, "deployment": deployment, "trace": trace})


#: One serial case in this many pins SGLang's token pool (:func:`with_pinned_pool`).
PRESSURE_ODDS = 8
#: Pool levels drawn (``fuzz.draw.generate_pressure.LEVELS``' ``one`` and
#: ``two``): room for the longest request alone, and for the two longest
#: together. (vLLM's ``floor``, the least its start-up check accepts, has no
#: counterpart drawn here yet.)
PRESSURE_LEVELS = ("one", "two")
#: Units of headroom past the requests' own tokens: SGLang's admission and
#: allocation keep a page back in several places (``schedule_policy.py:930,
#: 1013, 1404``); counted in checkpoint grids (at least a page each).
POOL_HEADROOM = 4
POOL_FLAG = "--max-total-tokens"


def pool_level(lengths: list[int], level: str, unit: int) -> int:
    """The token pool of ``level`` for requests of ``lengths`` tokens (prompt
    and output): each rounded up to ``unit`` (the checkpoint grid, a
    multiple of the page: SGLang allocates whole pages,
    ``PagedTokenToKVPoolAllocator``), the longest (``one``) or the two
    longest (``two``), plus :data:`POOL_HEADROOM` units."""
    need = sorted((-(-n // unit) * unit for n in lengths), reverse=True)
    return sum(need[: 1 if level == "one" else 2]) + POOL_HEADROOM * unit


def without_pinned_pool(deployment: dict) -> dict:
    """``deployment`` without a ``--max-total-tokens`` pin (its value too)."""
    args = list(deployment.get("sglang_args", ()))
    if POOL_FLAG not in args:
        return deployment
    return {**deployment, "sglang_args": without_flags(args, (POOL_FLAG,))}


def with_pinned_pool(c: Chooser, deployment: dict, trace: list[dict], unit: int) -> dict:
    """One serial, one-token case in :data:`PRESSURE_ODDS`: ``deployment``
    with ``--max-total-tokens`` at a level of :data:`PRESSURE_LEVELS`,
    derived from the trace's token counts (never a known bug's): a later
    prompt's allocation makes SGLang's radix cache evict an earlier one
    (``engine_adapter.sglang_engine.resolve.pinned_pools``: the pool as
    SGLang sizes it). The Mamba pool stays kvspec's (on a GPU, SGLang sizes
    it from memory, ``kv_cache_configurator.py:3348-3386``, far above a
    case's states). A wave or a decoding request is left alone: SGLang
    retracts decoding requests when a decode step finds no room
    (``retract_decode``), which the driver does not run."""
    if c.integer(0, PRESSURE_ODDS - 1):
        return deployment
    level = c.choice(PRESSURE_LEVELS)
    if any(r.get("arrival") is not None or r.get("max_tokens", 1) > 1 for r in trace):
        return deployment
    if any("length" not in x for r in trace for x in r["prompt"]) or POOL_FLAG in deployment.get("sglang_args", ()):
        return deployment
    lengths = [sum(int(x["length"]) for x in r["prompt"]) + 1 for r in trace]
    args = [*deployment.get("sglang_args", ()), POOL_FLAG, str(pool_level(lengths, level, unit))]
    return {**deployment, "sglang_args": args}


#: The deployments SGLang's boundary cases run on (``check-build``): the
#: extra buffer with a budget on the checkpoint grid and two on the page
#: but off the grid (a continuing chunk starts off the grid,
#: ``schedule_policy.py:1140``: 1008 and 1056 on page 16, grid 64), pages
#: 1, 16, 64 and 256 (the grid is lcm(max(model chunk, page), page):
#: ``runtime_context.py:1966``), and ``no_buffer`` (page 1). Each is one
#: SGLang launches: a budget off the page is refused by its launch check
#: (``check_server_args``, run by kvspec's resolver since stop 52; it had
#: two here, page 64 and page 16 with budget 1000, silently left out).
BOUNDARY_DEPLOYMENTS = (
    (
        "qwen3_next",
        ["--mamba-radix-cache-strategy", "extra_buffer", "--page-size", "64", "--chunked-prefill-size", "2048"],
    ),
    (
        "qwen3_next",
        ["--mamba-radix-cache-strategy", "extra_buffer", "--page-size", "16", "--chunked-prefill-size", "1008"],
    ),
    (
        "qwen3_next",
        ["--mamba-radix-cache-strategy", "extra_buffer", "--page-size", "16", "--chunked-prefill-size", "1056"],
    ),
    (
        "qwen3_next",
        ["--mamba-radix-cache-strategy", "extra_buffer", "--page-size", "256", "--chunked-prefill-size", "1536"],
    ),
    (
        "qwen3_next",
        ["--mamba-radix-cache-strategy", "extra_buffer", "--page-size", "1", "--chunked-prefill-size", "1000"],
    ),
    ("falcon_h1", ["--mamba-radix-cache-strategy", "extra_buffer", "--chunked-prefill-size", "1500"]),
    (
        "qwen3_next",
        ["--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule", "--chunked-prefill-size", "1000"],
    ),
)


def boundary_traces(grid: int, chunk: int) -> list[list[list[tuple[str, int]]]]:
    """Traces on SGLang's own boundaries, from its grid rule: a prompt of
    k x grid + {-1, 0, 1} tokens (a tracked point at its end, or not) sent
    twice and three times; one that spans a chunk budget by one token and
    by a grid; an extension by less than and by a grid; a sibling that
    diverges on the grid and one that diverges off it, resent and
    extended. ``grid``: the checkpoint grid SGLang resolved; ``chunk``:
    its chunk budget."""
    out = []
    for length in sorted({3 * grid - 1, 3 * grid, 3 * grid + 1, chunk + 1, chunk + grid, 2 * chunk + grid // 2 + 1}):
        if length > 1:
            out.append([[("A", length)]] * 3)
    base = 2 * grid + chunk
    out.append([[("A", base)], [("A", base), ("B", grid // 2 + 1)], [("A", base), ("B", grid + 3)]])
    for branch in (grid * max(1, chunk // grid // 2), grid * max(1, chunk // grid // 2) + grid // 2 + 1):
        sib = [("A", branch), ("B", grid + 7)]
        out.append([[("A", base)], sib, sib, sib + [("C", grid // 2)]])
    return out


def sglang_boundary_cases(resolver) -> list[Case]:
    """SGLang's boundary cases for ``check-build`` (no vLLM example runs on
    SGLang): :func:`boundary_traces` on each of :data:`BOUNDARY_DEPLOYMENTS`
    SGLang resolves, on the grid and budget it resolved."""
    out = []
    for j, (model, args) in enumerate(BOUNDARY_DEPLOYMENTS):
        dep = parse_deployment({"model": model, "engine": "sglang", "sglang_args": args}).as_dict()
        info = resolver(dep)
        if not info:
            continue
        grid = int(info["block"])
        chunk = int(args[args.index("--chunked-prefill-size") + 1])
        for k, trace in enumerate(boundary_traces(grid, chunk)):
            out.append(
                parse_case(
                    {
                        "schema": 1,
                        "name": f"sglang-boundary-d{j}-{model}-t{k}",
                        "deployment": dep,
                        "trace": [{"prompt": [{"segment": s, "length": n} for s, n in p]} for p in trace],
                    }
                )
            )
    return out


#: The family generator's protocol (``ground.engines.Family.generator``):
#: a case on a drawn deployment, and another trace on a resolved one.
build_case = build_sglang_case
case_on = sglang_case_on
