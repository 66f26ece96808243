"""vLLM 0.33.0's own prefix-cache tests as kvspec conformance cases.

Every serial-trace expectation that vLLM 0.33.0's ``tests/v1/core`` asserts
about a hybrid (full attention + Mamba "align") KV cache is written here as a
kvspec case (schema 1, a hand geometry with the test's block sizes, hash
unit, speculative settings, retention and token budget) plus the values the
test asserts, each with the ``file:line`` of its ``assert``. A test that
cannot be expressed is listed too, with the reason. Nothing here is vLLM
code: the expectations are restated (inputs and expected numbers), the
token streams are kvspec's own (only the prefix relations of the test's
token ids are kept).

``python -m tests.conformance.build`` writes ``tests/conformance/cases/*.json``
and ``tests/conformance/manifest.json`` (atomically); the conformance tests
check that the committed files are what this module builds.

Checks (``checks`` of an entry), each with ``role`` ``expect`` (what the
vLLM test asserts) or ``setup`` (a precondition: the case reproduces the
test's setup, e.g. its chunking, before the expectation is compared):

* ``hit``: request i's prefix-cache hit (``get_computed_blocks``' token count);
* ``junction``: request i's shared-prefix boundary at admission;
* ``chunk_ends``: request i's prefill chunk ends, exactly;
* ``chunk``: the prefill chunk of request i that starts at ``start`` ends at ``end``;
* ``states``: Mamba states (token counts) the block pool holds on request i's
  prompt once it finished: ``includes`` / ``excludes`` / ``exactly``.

``setup`` of an entry names the knobs the case must resolve to (checked on the
reference model and on the engine) so that a translation error shows as a
failed precondition, not as a disagreement. ``engine_options`` are the
adapter options that reproduce the test's own KV cache manager where the case
format has no field for it (``eagle_groups: "all"``: the test builds the
manager with ``use_eagle=True`` and no ``is_eagle_group``, so the coordinator
flags every group, the Mamba group included; a real 0.33.0 engine flags the
draft layer's group only, which is what the case alone runs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ground.files import write_json_atomic
from reference.case import parse_case, prompt_tokens
from reference.serial import common_prefix, known_common

HERE = Path(__file__).resolve().parent
CASES_DIR = HERE / "cases"
MANIFEST = HERE / "manifest.json"
VLLM_VERSION = "0.33.0"
SDIST_TESTS = "tests/v1/core"

PARTIAL = f"{SDIST_TESTS}/prefix_cache/test_partial_prefix_cache_hits.py"
PRIMITIVES = f"{SDIST_TESTS}/prefix_cache/test_partial_prefix_cache_primitives.py"
EAGLE_RESUME = f"{SDIST_TESTS}/prefix_cache/test_mamba_eagle_resume_checkpoint.py"
HIT_RATE = f"{SDIST_TESTS}/prefix_cache/test_hybrid_prefix_cache_hit_rate.py"
CHUNK_SPLIT = f"{SDIST_TESTS}/test_mamba_align_chunk_split.py"
PREFIX_CACHING = f"{SDIST_TESTS}/test_prefix_caching.py"
PREFIX_REPLAY = f"{SDIST_TESTS}/test_prefix_replay.py"

#: Why a test is not expressed, one category each (the entry's ``reason`` says more).
NOT_EXPRESSIBLE = {
    "primitive": "calls an internal primitive directly (no scheduler/KV cache manager trace)",
    "hand_state": "sets up by hand cache states or scheduler state that the scheduler never produces",
    "connector": "needs a KV connector's external computed tokens or its calls observed: a case can carry vLLM's CPU offloading connector (--kv-offloading-size), but kvspec's pool never evicts, so the connector never loads anything, and its offers and lookups are not observed",
    "dcp": "decode context parallelism (dcp_world_size > 1) is not a case setting",
    "group_kind": "a KV cache group kind the case format lacks (sliding window, MLA, circular buffer)",
    "multi_module_mtp": "hash lookahead above 1 token (multi-module MTP) is not a case setting",
    "concurrency": "depends on requests sharing a scheduler step (per-step budgets, same-step admission)",
    "internal": "asserts internal bookkeeping (block ids, copies, reservations, events), not a hit, chunk or state",
    "live": "a live server with a real model, tokenizer and chat template",
    "no_trace": "asserts no serial-trace value (a configuration error or only that a call does not raise)",
}

# ------------------------------------------------------------------ helpers


def geometry(groups, *, unit=None, retention=None, budget=8192, grid=None, shared=False) -> dict:
    """``groups``: [(kind, block_size), ...] with kind ``fa`` or ``m``, in the
    test's group order. ``retention`` None is dense: the KV cache managers the
    tests build default to ``prefix_cache_retention_interval=None``."""
    kinds = {"fa": "full_attention", "m": "mamba"}
    out = {
        "groups": [{"kind": kinds[k], "block_size": b} for k, b in groups],
        "prefix_match_unit": unit,
        "retention_interval": retention,
        "max_num_batched_tokens": budget,
    }
    if grid is not None:
        out["prefill_checkpoint_grid"] = grid
    if shared:
        out["shared_prefix_checkpoint"] = True
    return out


def mtp_drop(k: int = 1) -> dict:
    """The EAGLE block drop in force (``use_eagle=True``, no lookahead hashes)."""
    return {"method": "mtp", "num_speculative_tokens": k, "disable_lookahead_block_hashes": True}


def mtp_lookahead(k: int = 1) -> dict:
    """0.33.0's default for single-module MTP: one lookahead token, no drop."""
    return {"method": "mtp", "num_speculative_tokens": k}


def mtp_no_drop(k: int = 1) -> dict:
    """``use_eagle`` without the block drop (``disable_eagle_block_drop``)."""
    return {"method": "mtp", "num_speculative_tokens": k, "disable_eagle_block_drop": True}


def req(*segments) -> dict:
    return {"prompt": [{"segment": s, "length": n} for s, n in segments]}


def hit(i, value, line, role="expect"):
    return {"kind": "hit", "request": i, "value": value, "line": line, "role": role}


def junction(i, value, line, role="expect"):
    return {"kind": "junction", "request": i, "value": value, "line": line, "role": role}


def chunk_ends(i, value, line, role="expect"):
    return {"kind": "chunk_ends", "request": i, "value": list(value), "line": line, "role": role}


def chunk(i, start, end, line, role="expect"):
    return {"kind": "chunk", "request": i, "start": start, "end": end, "line": line, "role": role}


def states(i, line, *, includes=(), excludes=(), exactly=None, role="expect"):
    out = {"kind": "states", "request": i, "line": line, "role": role}
    if exactly is not None:
        out["exactly"] = sorted(exactly)
    else:
        out["includes"] = sorted(includes)
        out["excludes"] = sorted(excludes)
    return out


ENTRIES: list[dict] = []
CASES: dict[str, dict] = {}


def case(name: str, geom: dict, trace: list, speculative: dict | None = None) -> str:
    """Register a case file (cases/<name>.json); identical re-registration is fine."""
    doc = {
        "schema": 1,
        "name": f"vllm-0.33.0-conformance/{name}",
        "geometry": geom,
        "speculative": speculative,
        "trace": trace,
    }
    if name in CASES and CASES[name] != doc:
        raise ValueError(f"case {name} registered twice with different content")
    CASES[name] = doc
    return f"cases/{name}.json"


def expressed(
    id,
    test,
    what,
    case_path,
    checks,
    *,
    fidelity="exact",
    adaptation=None,
    setup=None,
    engine_options=None,
    xfail=None,
    note=None,
    not_expressed=None,
):
    """An expressible entry. ``test`` is ``FILE:LINE`` of the test function;
    ``xfail`` maps ``reference`` / ``engine`` / ``engine_default`` to the
    understood reason a check disagrees; ``not_expressed`` lists the parts of
    the test left out, with why."""
    ENTRIES.append(
        {
            "id": id,
            "vllm_test": test,
            "asserts": what,
            "expressible": True,
            "case": case_path,
            "fidelity": fidelity,
            "adaptation": adaptation,
            "setup": setup or {},
            "engine_options": engine_options or {},
            "checks": checks,
            "xfail": xfail or {},
            "note": note,
            "not_expressed": not_expressed,
        }
    )


def inexpressible(id, test, what, category, reason):
    assert category in NOT_EXPRESSIBLE, category
    ENTRIES.append(
        {
            "id": id,
            "vllm_test": test,
            "asserts": what,
            "expressible": False,
            "category": category,
            "reason": reason,
        }
    )


def knobs(S, H, bs, *, drop=False, L=0, partial=None) -> dict:
    """The knobs a case must resolve to: scheduler block, hash block, the
    scheduler's cache block (``cache_config.block_size``), the EAGLE drop,
    lookahead tokens, partial hash hits."""
    return {
        "scheduler_block_size": S,
        "hash_block_size": H,
        "cache_block_size": bs,
        "eagle_drop": drop,
        "hash_lookahead_tokens": L,
        "partial_hash_hits": (H < S) if partial is None else partial,
    }


ALL_GROUPS = {"eagle_groups": "all"}

# ---------------------------------------------- test_partial_prefix_cache_hits.py


def partial_prefix_cache_hits() -> None:
    F = PARTIAL
    inexpressible(
        "partial-hits/connector-common-lookup",
        f"{F}:44",
        "a connector without divergent-hit support uses the common lookup",
        "connector",
        "mocks the scheduler and a KV connector; asserts which KVCacheManager lookup is called",
    )
    inexpressible(
        "partial-hits/connector-divergent-lookup",
        f"{F}:61",
        "a capable connector uses get_computed_blocks_for_connector",
        "connector",
        "mocks the scheduler and a KV connector; asserts which KVCacheManager lookup is called",
    )
    inexpressible(
        "partial-hits/dcp-fine-hit-retention",
        f"{F}:166",
        "resend/extension hit and the one retained checkpoint under DCP 4 and 8",
        "dcp",
        "every parameter set has dcp_world_size 4 or 8 (attention block = block x DCP)",
    )

    # -- test_mamba_align_split_partial_tail_schedule[dcp_world_size=1]
    geo = geometry([("fa", 512), ("m", 512)], unit=32, retention=0, budget=8192)
    expressed(
        "partial-hits/align-split-partial-tail-schedule",
        f"{F}:237",
        "block 512, hash 32, prompt 10000, budget 8192: chunks end at 8192, 9728, 9984, 10000",
        case("align-split-b512-h32-n10000", geo, [req(("A", 10000))]),
        [chunk_ends(0, [8192, 9728, 9984, 10000], 263)],
        note="asserts at lines 263, 266, 269, 273: the four split() calls of a fresh 10000-token prompt (8192, +1536, +256, +16)",
        setup=knobs(512, 32, 512),
        not_expressed="dcp_world_size=4 (DCP is not a case setting)",
    )
    geo = geometry([("fa", 512), ("m", 512)], retention=0, budget=8192)
    expressed(
        "partial-hits/align-split-partial-hits-off",
        f"{F}:237",
        "partial hits off: the tail from 9728 runs in one chunk to 10000",
        case("align-split-b512-h512-n10000", geo, [req(("A", 10000))]),
        [chunk(0, 9728, 10000, 278)],
        fidelity="adapted",
        adaptation="the test turns mamba_partial_cache_hit off on the stub; the case has no prefix_match_unit (hash 512 = block), which is how a scheduler gets partial hits off",
        setup=knobs(512, 512, 512),
    )
    geo = geometry([("fa", 512), ("m", 512)], unit=32, retention=0, budget=8192)
    expressed(
        "partial-hits/align-split-resume-mid-block",
        f"{F}:237",
        "a request resumed mid-block at 9984 stops at the next block boundary 10240",
        case("align-split-resume-9984", geo, [req(("A", 10000)), req(("A", 12000))]),
        [hit(1, 9984, None, role="setup"), chunk(1, 9984, 10240, 286)],
        fidelity="adapted",
        adaptation="the test sets num_computed_tokens=9984 by hand; the case reaches it as a real partial hash hit: a 10000-token prompt keeps its tail checkpoint floor(9999/32)*32=9984 and a 12000-token extension resumes there",
        setup=knobs(512, 32, 512),
        not_expressed="line 288 (the next split with num_new_tokens=1000): a per-step budget of 1000 that a serial trace with one budget does not give",
    )

    # -- test_mamba_align_split_when_block_exceeds_scheduling_budget
    geo = geometry([("fa", 11392), ("m", 11392)], retention=0, budget=8192)
    ends = [8192, 3200, 8192, 3200, 7216]
    expressed(
        "partial-hits/align-split-block-exceeds-budget",
        f"{F}:291",
        "block 11392 > budget 8192, prompt 30000: chunks 8192, 3200, 8192, 3200, 7216",
        case("align-split-b11392-budget8192-n30000", geo, [req(("A", 30000))]),
        [chunk_ends(0, [sum(ends[: i + 1]) for i in range(len(ends))], 327)],
        setup=knobs(11392, 11392, 11392),
        not_expressed="line 312 (split returns 0 when max_num_scheduled_tokens equals the block and 8192 tokens are offered): a per-step budget",
    )

    # -- test_mamba_align_split_when_block_exceeds_long_prefill_threshold
    geo = geometry([("fa", 512), ("m", 512)], retention=0, budget=384)
    ends = [384, 128, 384, 128, 276]
    expressed(
        "partial-hits/align-split-block-exceeds-long-prefill-threshold",
        f"{F}:330",
        "block 512, long_prefill_token_threshold 384, prompt 1300: chunks 384, 128, 384, 128, 276",
        case("align-split-b512-budget384-n1300", geo, [req(("A", 1300))]),
        [chunk_ends(0, [sum(ends[: i + 1]) for i in range(len(ends))], 368)],
        fidelity="adapted",
        adaptation="long_prefill_token_threshold=384 (budget 8192) is not a case setting; the case's token budget 384 gives the split the same num_new_tokens and the same max_prefill_tokens (min of budget and threshold)",
        setup=knobs(512, 512, 512),
    )

    # -- the [0,0,1,1,2,2,3] owner / 8-token consumer family, attention 2 = hash, Mamba 4
    geo = geometry([("fa", 2), ("m", 4)])
    ext = case("fa2-m4-h2-n7-extend", geo, [req(("A", 7)), req(("A", 8))])
    sib = case("fa2-m4-h2-n7-sibling6", geo, [req(("A", 7)), req(("A", 6), ("B", 2))])
    owner_adapt = (
        "the test allocates 6 of the owner's 7 prompt tokens and frees it; the case runs the owner to completion, "
        "whose first chunk the scheduler also ends at 6 (its last cache position and tail checkpoint)"
    )
    expressed(
        "partial-hits/hybrid-mamba-align-partial-hash-hit",
        f"{F}:371",
        "owner [7 tokens] leaves a partial Mamba state at 6; an 8-token extension hits 6",
        ext,
        [chunk(0, 0, 6, 409, role="setup"), states(0, 418, includes=[6]), hit(0, 0, 407), hit(1, 6, 422)],
        fidelity="adapted",
        adaptation=owner_adapt,
        setup=knobs(4, 2, 2),
        not_expressed="block ids, the CoW copy and block_hash_num_tokens of the consumer's block (lines 423-443)",
    )
    inexpressible(
        "partial-hits/eagle-group-registers-unaligned-tail",
        f"{F}:446",
        "every group's cache_blocks is called with the unaligned token count",
        "internal",
        "sets use_eagle on the attention manager by hand and spies the num_tokens of cache_blocks calls",
    )
    inexpressible(
        "partial-hits/partial-tail-owner-cow-on-continue",
        f"{F}:520",
        "the owner continuing past its partial tail keeps its block and moves the cache entry to a copy",
        "internal",
        "asserts block-table ids and the queued CoW copy",
    )
    geo_ck = geometry([("fa", 2), ("m", 4)], grid=16)
    expressed(
        "partial-hits/partial-hit-then-internal-checkpoint",
        f"{F}:593",
        "a 14-token extension of a 7-token owner hits 6 with internal checkpoints on",
        case("fa2-m4-h2-grid16-n7-extend14", geo_ck, [req(("A", 7)), req(("A", 14))]),
        [chunk(0, 0, 6, 606, role="setup"), hit(1, 6, 622)],
        fidelity="adapted",
        adaptation=owner_adapt,
        setup=knobs(4, 2, 2),
        not_expressed="the distinct CoW / checkpoint / running Mamba block ids (lines 625-640)",
    )
    geo = geometry([("fa", 16), ("m", 32)], grid=16)
    expressed(
        "partial-hits/internal-checkpoint-partial-hash-lifecycle",
        f"{F}:643",
        "a 120-token prefill exports the internal checkpoint at 112 (not the full block at 96); a resend hits 112",
        case("fa16-m32-h16-grid16-n120-resend", geo, [req(("A", 120)), req(("A", 120))]),
        [chunk_ends(0, [120], 657, role="setup"), states(0, 670, includes=[112], excludes=[96]), hit(1, 112, 682)],
        setup=knobs(32, 16, 16),
        not_expressed="the checkpoint block's identity and the boundary-state offload (lines 671-678)",
    )

    # -- test_internal_checkpoint_publication_respects_retention
    for eagle in (False, True):
        for H in (16, 32):
            for ri in (None, 0, 32, 64, 256):
                geo = geometry([("fa", H), ("m", 32)], retention=ri, budget=128, grid=16)
                name = f"fa{H}-m32-grid16-r{'dense' if ri is None else ri}-{'drop' if eagle else 'off'}-n240-budget128"
                prompt_checkpoint = (240 if eagle else 239) // H * H - (H if eagle else 0)
                checks = [chunk_ends(0, [128, 240], 706, role="setup"), states(0, 742, includes=[prompt_checkpoint])]
                if ri in (None, 32, 64):
                    checks.append(states(0, 731, includes=[128]))
                expressed(
                    f"partial-hits/internal-checkpoint-publication-retention[ri={ri},H={H},eagle={eagle}]",
                    f"{F}:688",
                    f"prefill 240 as 128 + 112: the prompt checkpoint {prompt_checkpoint} is published under any retention"
                    + ("; the block at 128 too (retention None/32/64)" if ri in (None, 32, 64) else ""),
                    case(name, geo, [req(("A", 240))], mtp_drop(1) if eagle else None),
                    checks,
                    setup=knobs(32, H, H, drop=eagle),
                    engine_options=ALL_GROUPS if eagle else None,
                    note="the 128-token block is asserted right after the first chunk (line 731); the case checks the pool once the prompt finished",
                    not_expressed="the transient checkpoint after the first chunk and the boundary-state offloads (lines 716-728, 743-748)",
                )
    inexpressible(
        "partial-hits/transient-checkpoint-evicts-boundary-hash",
        f"{F}:751",
        "a checkpoint slot that coincides with a retained junction block evicts its stale hash",
        "hand_state",
        "sets shared_prefix_boundary=96 on a fresh request by hand and allocates a 128-token chunk across it; the scheduler ends every chunk at the junction",
    )
    for n in (120, 104, 96):
        geo = geometry([("fa", 32), ("m", 32)], retention=0, grid=16)
        checkpoint = (n - 1) // 32 * 32  # get_mamba_prefill_checkpoint_position(n, 32, drop_eagle_block=False)
        expressed(
            f"partial-hits/prompt-end-checkpoint-block-aligned-count[{n}]",
            f"{F}:783",
            f"hash = block = 32, sparse retention: the prompt-end checkpoint {checkpoint} of a {n}-token prompt stays published; a resend hits it",
            case(f"fa32-m32-grid16-r0-n{n}-resend", geo, [req(("A", n)), req(("A", n))]),
            [chunk_ends(0, [n], 802, role="setup"), states(0, 808, includes=[checkpoint]), hit(1, checkpoint, 814)],
            setup=knobs(32, 32, 32),
        )
    for ri in (None, 0):
        geo = geometry([("fa", 16), ("m", 32)], retention=ri, budget=128, grid=16)
        expressed(
            f"partial-hits/intermediate-checkpoint-reserved[ri={ri}]",
            f"{F}:818",
            "prefill 240 as 128 + 112: the prefill-end checkpoint 224 is published either way",
            case(f"fa16-m32-grid16-r{'dense' if ri is None else ri}-off-n240-budget128", geo, [req(("A", 240))]),
            [chunk_ends(0, [128, 240], 843, role="setup"), states(0, 854, includes=[224])],
            setup=knobs(32, 16, 16),
            not_expressed="whether the intermediate checkpoint is reserved and how many blocks are allocated (lines 844-852): internal bookkeeping",
        )
    geo = geometry([("fa", 32), ("m", 32)], grid=16)
    expressed(
        "partial-hits/eagle-block-aligned-checkpoint-replaces-newer-hash",
        f"{F}:857",
        "EAGLE, 104 tokens, hash = block = 32: the checkpoint at 64 is published, the full block at 96 is not",
        case("fa32-m32-grid16-dense-drop3-n104", geo, [req(("A", 104))], mtp_drop(3)),
        [chunk_ends(0, [104], 870, role="setup"), states(0, 876, includes=[64], excludes=[96])],
        setup=knobs(32, 32, 32, drop=True),
        engine_options=ALL_GROUPS,
        not_expressed="the checkpoint block's identity (line 877)",
    )
    expressed(
        "partial-hits/hash-aligned-query-end-regular-tail",
        f"{F}:884",
        "a 15-token prompt prefilled to 14 registers the partial tail at 14 (no internal checkpoint)",
        case("fa2-m4-h2-grid16-n15", geo_ck, [req(("A", 15))]),
        [chunk(0, 0, 14, 898, role="setup"), states(0, 906, includes=[14])],
        fidelity="adapted",
        adaptation="the test allocates 14 of 15 tokens and stops; the case runs the prompt to completion, whose first chunk the scheduler also ends at 14",
        setup=knobs(4, 2, 2),
        not_expressed="that no checkpoint is reserved and only one Mamba block is non-null (lines 900-902)",
    )
    inexpressible(
        "partial-hits/external-hit-running-cow",
        f"{F}:911",
        "an external mid-block hit continues with a running CoW",
        "connector",
        "10 external computed tokens (delay_cache_blocks) from a KV connector",
    )
    for line, name, what in (
        (983, "boundary-offloads-cow-target", "boundary hand-offs expose the CoW target"),
        (1061, "finished-partial-tail-table-source", "a finish hands off the unchanged table block once"),
        (1127, "connector-finish-registers-tail", "a connector finish registers the partial tail before cleanup"),
        (1168, "offload-dropped-when-freed", "a hand-off is dropped when the request dies before the drain"),
        (1216, "offloads-block-aligned-prompt", "a block-aligned prompt hands off its boundary snapshot once"),
    ):
        inexpressible(
            f"partial-hits/{name}",
            f"{F}:{line}",
            what,
            "connector",
            "boundary-state offloads to a KV connector; kvspec observes no connector call",
        )
    expressed(
        "partial-hits/truncate-computed-blocks-sparse-positions",
        f"{F}:1269",
        "an 8-token extension of a 7-token owner hits 6 (then truncates the lookup result)",
        ext,
        [chunk(0, 0, 6, 1306, role="setup"), hit(1, 6, 1314)],
        fidelity="adapted",
        adaptation=owner_adapt,
        setup=knobs(4, 2, 2),
        not_expressed="truncate_computed_blocks on the lookup result (lines 1315-1322): a primitive",
    )
    expressed(
        "partial-hits/truncate-computed-blocks-short-mamba",
        f"{F}:1325",
        "an 8-token extension of a 7-token owner hits 6 (then truncates external/short lookups)",
        ext,
        [chunk(0, 0, 6, 1361, role="setup"), hit(1, 6, 1369)],
        fidelity="adapted",
        adaptation=owner_adapt,
        setup=knobs(4, 2, 2),
        not_expressed="truncate_computed_blocks on hand-built block lists (lines 1370-1386): a primitive",
    )
    expressed(
        "partial-hits/partial-tail-owner-continue-preserves-later-hit",
        f"{F}:1389",
        "after the owner continues, a sibling sharing 6 tokens still hits 6",
        sib,
        [chunk(0, 0, 6, 1426, role="setup"), hit(1, 6, 1446)],
        fidelity="adapted",
        adaptation=owner_adapt
        + "; the owner then decodes (one sampled token), as the test's owner appends an output token",
        setup=knobs(4, 2, 2),
        not_expressed="which block the sibling hits (the moved copy) and its CoW (lines 1447-1463)",
    )
    expressed(
        "partial-hits/moved-partial-entry-defers-same-step-hit",
        f"{F}:1466",
        "a sibling sharing 6 tokens hits 6 (deferred in the move step, admitted the next)",
        sib,
        [chunk(0, 0, 6, 1506, role="setup"), hit(1, 6, 1518), hit(1, 6, 1524)],
        fidelity="adapted",
        adaptation=owner_adapt,
        setup=knobs(4, 2, 2),
        not_expressed="the same-step deferral (line 1519): requests sharing a step",
    )
    # attention = Mamba = 4, hash 2 (vLLM's align-mode layout, A = M = B > H)
    geo = geometry([("fa", 4), ("m", 4)], unit=2)
    amb = case("fa4-m4-h2-n7-extend", geo, [req(("A", 7)), req(("A", 8))])
    expressed(
        "partial-hits/full-attention-partial-hash-hit-cow",
        f"{F}:1528",
        "A = M = 4, H = 2: an 8-token extension of a 7-token owner hits 6 (full attention's partial tail)",
        amb,
        [states(0, None, includes=[6], role="setup"), hit(1, 6, 1577)],
        fidelity="adapted",
        adaptation="the test allocates 6 of the owner's 7 tokens in one chunk and frees it; the scheduler runs the owner as 4, 6, 7 (block, tail checkpoint, end), which also leaves both tails at 6",
        setup=knobs(4, 2, 4),
        not_expressed="the computed block counts and the attention CoW copy (lines 1578-1599)",
    )
    expressed(
        "partial-hits/partial-hit-cow-target-uncached",
        f"{F}:1602",
        "A = M = 4, H = 2: an 8-token extension hits 6 (the CoW targets start uncached)",
        amb,
        [states(0, 1651, includes=[6], role="setup"), hit(1, 6, 1655)],
        fidelity="adapted",
        adaptation="as partial-hits/full-attention-partial-hash-hit-cow",
        setup=knobs(4, 2, 4),
        not_expressed="the CoW targets' hash metadata (lines 1666-1682)",
    )
    inexpressible(
        "partial-hits/partial-hash-truncates-fa-hit",
        f"{F}:1685",
        "attention cached to a partial tail at 10 and Mamba at 6: the hit is 6",
        "hand_state",
        "caches blocks by hand through the BlockPool (attention full blocks + a partial tail at 10, a Mamba tail at 6) for a prompt the scheduler never prefilled",
    )
    inexpressible(
        "partial-hits/cow-retained-blocks-returned",
        f"{F}:1757",
        "new_step_starts returns CoW retentions",
        "internal",
        "CoW retention bookkeeping",
    )
    inexpressible(
        "partial-hits/free-cow-retained-defers",
        f"{F}:1810",
        "the scheduler defers releasing CoW retentions",
        "internal",
        "a mock scheduler's deferred-free queue",
    )
    inexpressible(
        "partial-hits/fa-eagle-drops-one-hash-unit",
        f"{F}:1846",
        "FullAttentionManager drops one hash unit under EAGLE (8 -> 6, partial 6 -> 4)",
        "primitive",
        "calls FullAttentionManager.find_longest_cache_hit on blocks cached by hand through the BlockPool",
    )
    geo = geometry([("fa", 4), ("m", 4)], unit=2)
    expressed(
        "partial-hits/partial-hit-eagle-within-group-blocks",
        f"{F}:1921",
        "EAGLE, A = M = 4, H = 2: owner [6] prefilled as 4 + 2; an 8-token extension hits 4",
        case("fa4-m4-h2-drop-n6-extend8", geo, [req(("A", 6)), req(("A", 8))], mtp_drop(1)),
        [chunk_ends(0, [4, 6], 1964, role="setup"), hit(1, 4, 1975)],
        setup=knobs(4, 2, 4, drop=True),
        engine_options=ALL_GROUPS,
        not_expressed="the per-group block counts of the lookup (line 1976)",
    )
    geo = geometry([("fa", 1536), ("m", 1536)], unit=128, retention=0, budget=8192)
    for n in (24576, 24577):
        expressed(
            f"partial-hits/align-split-below-eagle-proof-boundary[{n}]",
            f"{F}:1982",
            f"EAGLE drop, block 1536, hash 128, prompt {n}: the chunk from 23040 ends at 24448 (one hash unit below the last hash boundary)",
            case(f"align-split-b1536-h128-drop-n{n}", geo, [req(("A", n))], mtp_drop(1)),
            [chunk(0, 23040, 24448, 2006)],
            setup=knobs(1536, 128, 1536, drop=True),
            fidelity="adapted",
            adaptation="the test sets num_computed_tokens=23040 on a stub; a fresh prompt with budget 8192 reaches 23040 as a chunk end (7680, 15360, 23040)",
        )
    expressed(
        "partial-hits/align-split-below-eagle-proof-boundary[no-drop]",
        f"{F}:1982",
        "use_eagle without the block drop, prompt 24577: the chunk from 23040 ends at 24576",
        case("align-split-b1536-h128-nodrop-n24577", geo, [req(("A", 24577))], mtp_no_drop(1)),
        [chunk(0, 23040, 24576, 2017)],
        setup=knobs(1536, 128, 1536, drop=False),
        fidelity="adapted",
        adaptation="as the drop variant; the drop is turned off with disable_eagle_block_drop (use_eagle stays on)",
    )
    geo = geometry([("fa", 2), ("m", 4)])
    expressed(
        "partial-hits/mamba-partial-tail-below-eagle-proof-boundary",
        f"{F}:2020",
        "EAGLE, attention 2 = hash, Mamba 4, owner [9] prefilled as 6 + 3: the Mamba tail is at 6; a 13-token extension hits 6",
        case("fa2-m4-h2-drop-n9-extend13", geo, [req(("A", 9)), req(("A", 13))], mtp_drop(1)),
        [chunk_ends(0, [6, 9], 2065, role="setup"), states(0, 2076, includes=[6]), hit(1, 6, 2083)],
        setup=knobs(4, 2, 2, drop=True),
        engine_options=ALL_GROUPS,
    )
    geo = geometry([("fa", 4), ("m", 4)], retention=0)
    expressed(
        "partial-hits/mamba-coarse-checkpoint-below-eagle-proof-boundary",
        f"{F}:2086",
        "EAGLE, block = hash = 4, sparse retention, owner [9] prefilled as 4 + 5: the state at 4 is retained; a 13-token extension hits 4",
        case("fa4-m4-h4-r0-drop-n9-extend13", geo, [req(("A", 9)), req(("A", 13))], mtp_drop(1)),
        [chunk_ends(0, [4, 9], 2134, role="setup"), states(0, 2143, includes=[4]), hit(1, 4, 2152)],
        setup=knobs(4, 4, 4, drop=True),
        engine_options=ALL_GROUPS,
    )
    inexpressible(
        "partial-hits/sliding-window-disables-partial-hits",
        f"{F}:2155",
        "an EAGLE sliding-window draft group turns partial hash hits off",
        "group_kind",
        "a sliding-window KV cache group",
    )
    inexpressible(
        "partial-hits/resolved-alignment-matches-coordinator",
        f"{F}:2227",
        "resolve_cache_hit_alignment_tokens equals the coordinator's alignment",
        "primitive",
        "compares a configuration function with the coordinator's field (one parameter adds a sliding-window group)",
    )
    inexpressible(
        "partial-hits/opted-out-scratch-group",
        f"{F}:2292",
        "a circular-buffer scratch group keeps partial hash hits (hit 6)",
        "group_kind",
        "a CircularBufferSpec group",
    )
    inexpressible(
        "partial-hits/kpool-tail-128-token-hits",
        f"{F}:2348",
        "a 64-token circular-buffer pool keeps 128-token partial hits (hit 1536)",
        "group_kind",
        "a CircularBufferSpec group",
    )
    expressed(
        "partial-hits/partial-hash-hit-cow-under-dcp[1]",
        f"{F}:2412",
        "A = M = 4, H = 2, dcp_world_size 1: an 8-token extension of a 7-token owner hits 6",
        amb,
        [states(0, 2433, includes=[6], role="setup"), hit(1, 6, 2437)],
        fidelity="adapted",
        adaptation="as partial-hits/full-attention-partial-hash-hit-cow",
        setup=knobs(4, 2, 4),
        not_expressed="dcp_world_size 2 and 4 (DCP), the block counts and CoW copies (lines 2439-2452)",
    )
    for line, name, what in (
        (2457, "dcp-partial-hit-replicated-snapshot", "a DCP partial hit resumes on the replicated Mamba snapshot"),
        (2503, "dcp-joint-hit-bounded", "a DCP joint hit is bounded by the Mamba snapshots"),
        (2533, "dcp-partial-hit-eagle-rewinds", "DCP 2 + EAGLE rewinds one hash unit"),
    ):
        inexpressible(f"partial-hits/{name}", f"{F}:{line}", what, "dcp", "dcp_world_size 2 or 4")
    for line, name, what in (
        (2588, "retention-snapshots-exact-block-ids", "sparse retention hands off snapshots with exact block ids"),
        (2629, "snapshot-handoff-dense", "dense retention hands off every boundary snapshot"),
        (2680, "offer-more-than-two-mamba-groups", "one offer batch per Mamba group"),
        (2724, "offers-past-prompt-resumed-prefill", "boundaries past the prompt are offered for a resumed prefill"),
    ):
        inexpressible(
            f"partial-hits/{name}", f"{F}:{line}", what, "connector", "boundary-state offloads to a KV connector"
        )
    geo = geometry([("fa", 32), ("m", 32)], retention=0, budget=128, grid=16)
    expressed(
        "partial-hits/prompt-end-checkpoint-sparse-coarse-hash",
        f"{F}:2769",
        "hash = block = 32, sparse retention, 240 tokens as 128 + 112: the checkpoint 224 is published; a 280-token extension hits 224",
        case("fa32-m32-grid16-r0-n240-budget128-extend280", geo, [req(("A", 240)), req(("A", 240), ("B", 40))]),
        [chunk_ends(0, [128, 240], 2789, role="setup"), states(0, 2795, includes=[224]), hit(1, 224, 2800)],
        setup=knobs(32, 32, 32),
    )
    inexpressible(
        "partial-hits/checkpoint-reservation-matches-worker",
        f"{F}:2820",
        "each chunk's reserved checkpoint matches compute_mamba_prefill_checkpoints",
        "internal",
        "compares the manager's reservation with a worker function chunk by chunk, with output tokens appended before the prefill",
    )


# ------------------------------------------- test_partial_prefix_cache_primitives.py


def primitives() -> None:
    for line, name in (
        (113, "boundary-hashes-reuse-fine-chain"),
        (133, "cache-partial-block-events"),
        (197, "partial-block-event-mm-features"),
        (245, "partial-block-replacement-events"),
        (309, "later-request-hits-cached-partial-tail"),
        (350, "cache-partial-block-fine-boundary-hash"),
        (388, "cache-partial-block-requires-hash-boundary"),
        (409, "cache-partial-block-duplicate-check"),
        (448, "reset-prefix-cache-clears-partial-entries"),
        (466, "evict-removes-full-and-partial-entry"),
        (487, "partial-block-promotes-to-full-hash"),
    ):
        inexpressible(
            f"primitives/{name}",
            f"{PRIMITIVES}:{line}",
            "BlockPool / block-hash behaviour",
            "primitive",
            "calls BlockPool and hashing functions directly; no scheduler or KV cache manager",
        )


# -------------------------------------------- test_mamba_eagle_resume_checkpoint.py


def eagle_resume() -> None:
    F = EAGLE_RESUME
    orphan = (
        "the junction comes from an 'orphaned full-attention tail' that a KV connector leaves (the producer starts with "
        "prompt_len-1 external computed tokens); a serial trace without a connector always keeps the producer's Mamba tail under its attention tail"
    )
    inexpressible(
        "eagle-resume/sibling-resumes-from-observed-junction",
        f"{F}:148",
        "a sibling resumes at the observed junction",
        "connector",
        orphan,
    )
    geo = geometry([("fa", 16), ("m", 16)], unit=4, budget=1 << 20, shared=True)
    shared = 24
    expressed(
        "eagle-resume/sibling-resumes-below-block-grid",
        f"{F}:170",
        "B = 16, H = 4, shared-prefix checkpoint on, EAGLE: owner and follower share 24 tokens; a third sibling resumes at 24//16*16 - 4 = 12",
        case(
            "fa16-m16-h4-shared-drop-siblings24",
            geo,
            [req(("S", shared), ("O", 16)), req(("S", shared), ("F", 16)), req(("S", shared), ("T", 16))],
            mtp_drop(1),
        ),
        [hit(2, shared // 16 * 16 - 4, 195)],
        setup=knobs(16, 4, 16, drop=True),
        engine_options=ALL_GROUPS,
    )
    for identified in (False, True):
        geo = geometry([("fa", 1024), ("m", 1024)], unit=64, budget=1 << 20, shared=True)
        expressed(
            f"eagle-resume/mamba-prefix-cache-drops-hash-block[{identified}]",
            f"{F}:199",
            "B = 1024, H = 64, EAGLE: a 2100-token sibling of a 1600-token prompt hits 1600 - 64 = 1536",
            case(
                "fa1024-m1024-h64-shared-drop-n1600-extend",
                geo,
                [req(("A", 1600)), req(("A", 1600), ("X", 500))],
                mtp_drop(1),
            ),
            [hit(1, 1600 - 64, 217)],
            setup=knobs(1024, 64, 1024, drop=True),
            engine_options=None if identified else ALL_GROUPS,
            note="mtp_draft_group_identified=True flags the attention group only (what a 0.33.0 engine builds); False leaves every group flagged",
        )
    inexpressible(
        "eagle-resume/scheduler-never-stops-where-manager-refuses",
        f"{F}:236",
        "a junction stop is always cached",
        "connector",
        orphan,
    )
    inexpressible(
        "eagle-resume/junction-past-prompt-falls-back",
        f"{F}:286",
        "a junction past the prompt falls back to the block-floored stop",
        "hand_state",
        "calls Scheduler._mamba_block_aligned_split with a hand-set shared_prefix_boundary on a request with 2000 output tokens appended before its prefill",
    )
    inexpressible(
        "eagle-resume/enabling-never-reduces-reuse",
        f"{F}:335",
        "the flag never lowers a sibling's hit",
        "connector",
        orphan + "; also num_prefill_lookahead 2 and 33 (multi-module MTP)",
    )
    inexpressible(
        "eagle-resume/disabled-by-default",
        f"{F}:369",
        "off, the junction is block-floored",
        "connector",
        orphan + "; the second half calls the split directly with a hand-set junction",
    )


# ----------------------------------------------- test_mamba_align_chunk_split.py


def chunk_split() -> None:
    F = CHUNK_SPLIT
    inexpressible(
        "chunk-split/prefill-checkpoint-valid",
        f"{F}:66",
        "is_mamba_prefill_checkpoint_valid truth table",
        "primitive",
        "calls is_mamba_prefill_checkpoint_valid directly",
    )
    stub_adapt = (
        "the test's stub scheduler has cache_config.block_size = Mamba block 1600 while its manager's attention block is 16; "
        "no scheduler pairs a 1600-token cache block with a 16-token attention group, so the case uses attention = Mamba = 1600 "
        "(the split reads neither the attention block nor, with partial hits and internal checkpoints off or start 0, the 16-token hash unit)"
    )
    for n, budget, eagle, expected in (
        (2002, 16384, False, 2002),
        (3602, 2000, False, 1600),
        (3602, 16384, True, 3602),
        (2002, 16384, True, 2002),
        (3602, 1700, True, 1600),
    ):
        geo = geometry([("fa", 1600), ("m", 1600)], retention=0, budget=budget, grid=16)
        expressed(
            f"chunk-split/internal-checkpoint-split[{n}-{min(budget, n)}-{eagle}]",
            f"{F}:176",
            f"internal checkpoints on, prompt {n}, {min(budget, n)} tokens offered, EAGLE {eagle}: the first chunk has {expected} tokens",
            case(
                f"align-b1600-grid16-budget{budget}-{'drop3' if eagle else 'off'}-n{n}",
                geo,
                [req(("A", n))],
                mtp_drop(3) if eagle else None,
            ),
            [chunk(0, 0, expected, 180)],
            fidelity="adapted",
            adaptation=stub_adapt
            + ("; num_new_tokens below the prompt is restated as the token budget" if budget < n else ""),
            setup=knobs(1600, 1600, 1600, drop=eagle),
        )
    inexpressible(
        "chunk-split/internal-checkpoint-split[3602-512-True]",
        f"{F}:176",
        "512 tokens offered: no aligned chunk fits (0)",
        "concurrency",
        "512 tokens offered with a 16384-token budget is a step another request shares; a serial trace with budget 512 advances sub-block",
    )
    for grid in (None, 16):
        geo = geometry([("fa", 1600), ("m", 1600)], unit=16, retention=0, budget=16384, grid=grid)
        expressed(
            f"chunk-split/partial-checkpoint-resume-block-boundary[grid={grid}]",
            f"{F}:191",
            "a resume at 1984 (hash-aligned, mid-block) stops at the Mamba block boundary 3200",
            case(
                f"align-b1600-h16-{'grid16' if grid else 'nogrid'}-resume1984",
                geo,
                [req(("A", 2000)), req(("A", 3602))],
            ),
            [hit(1, 1984, None, role="setup"), chunk(1, 1984, 3200, 199 if grid is None else 212)],
            fidelity="adapted",
            adaptation="the test sets num_computed_tokens=1984 on a stub (cache block 1600, hash 16, partial hits on); the case reaches 1984 as a partial hash hit "
            "(a 2000-token prompt keeps its tail checkpoint 1984) with attention = Mamba = 1600 and prefix_match_unit 16",
            setup=knobs(1600, 16, 1600),
        )
    for drop in (True, False):
        geo = geometry([("fa", 1600), ("m", 1600)], retention=0, budget=16384)
        expressed(
            f"chunk-split/disabling-eagle-block-drop[drop={drop}]",
            f"{F}:224",
            f"prompt 3602, EAGLE {'with' if drop else 'without'} the block drop: the first chunk ends at {1600 if drop else 3200}",
            case(
                f"align-b1600-{'drop3' if drop else 'nodrop3'}-n3602",
                geo,
                [req(("A", 3602))],
                mtp_drop(3) if drop else mtp_no_drop(3),
            ),
            [chunk(0, 0, 1600 if drop else 2 * 1600, 230 if drop else 231)],
            fidelity="adapted",
            adaptation=stub_adapt,
            setup=knobs(1600, 1600, 1600, drop=drop),
        )
    frag = "per-step budgets model concurrent prefills sharing the token budget; the assertion is on what each Mamba slot holds"
    inexpressible(
        "chunk-split/fragmented-first-chunk",
        f"{F}:302",
        "a fragmented first chunk does not poison the cache",
        "concurrency",
        frag,
    )
    inexpressible(
        "chunk-split/fragmented-tail-chunk",
        f"{F}:312",
        "a fragmented tail chunk does not poison the cache",
        "concurrency",
        frag,
    )
    geo = geometry([("fa", 16), ("m", 1600)], budget=16384)
    expressed(
        "chunk-split/lookahead-split-caches-partial-tail[1]",
        f"{F}:323",
        "lookahead 1: a resend of a 3601-token prompt hits (3601-1)//16*16 = 3600",
        case("fa16-m1600-h16-lookahead-n3601-resend", geo, [req(("A", 3601)), req(("A", 3601))], mtp_lookahead(3)),
        [hit(1, (3601 - 1) // 16 * 16, 355)],
        fidelity="adapted",
        adaptation="the stub's cache block is the Mamba block 1600; the case's scheduler uses the attention block 16 (what vLLM sets for these groups), so the chunks differ but both end one at the tail checkpoint 3600",
        setup=knobs(1600, 16, 16, L=1),
    )
    inexpressible(
        "chunk-split/lookahead-split-caches-partial-tail[2]",
        f"{F}:323",
        "lookahead 2: a resend hits 3584",
        "multi_module_mtp",
        "num_hash_lookahead_tokens=2 (multi-module MTP)",
    )
    inexpressible(
        "chunk-split/intermediate-chunk-ends-block-aligned",
        f"{F}:359",
        "non-final chunk ends are block-aligned",
        "concurrency",
        frag,
    )
    inexpressible(
        "chunk-split/poisoning-block-size-independent", f"{F}:376", "large blocks are not safer", "concurrency", frag
    )
    inexpressible(
        "chunk-split/unaligned-resume-never-runs-past-block",
        f"{F}:393",
        "a mid-block resume re-aligns",
        "hand_state",
        "resume positions 331, 1599, 1601, 2531, 3011 set by hand (unaligned external tokens from a KV connector)",
    )


# --------------------------------------------------------- test_prefix_caching.py


def prefix_caching() -> None:
    F = PREFIX_CACHING
    inexpressible(
        "prefix-caching/mamba-boundary-handoffs-do-not-pin",
        f"{F}:1211",
        "connector offers do not pin old states",
        "connector",
        "boundary-state offers; a Mamba-only model",
    )
    inexpressible(
        "prefix-caching/per-group-dcp-geometry",
        f"{F}:1705",
        "prefix lookup uses each group's DCP size",
        "dcp",
        "dcp_world_size 8 with MLA groups",
    )
    combos = {
        "2g-full+mamba": [("fa", 16), ("m", 16)],
        "3g-full+2mamba": [("fa", 16), ("m", 16), ("m", 16)],
        "3g-2full+mamba": [("fa", 16), ("fa", 16), ("m", 16)],
        "4g-interleaved-full+mamba": [("fa", 16), ("m", 16), ("fa", 16), ("m", 16)],
    }
    for cid, groups in combos.items():
        geo = geometry(groups)
        expressed(
            f"prefix-caching/hybrid-model-combinations[{cid}]",
            f"{F}:2397",
            "48 shared + 7 tokens prefilled as 48 + 7; a 53-token sibling sharing 48 hits 48",
            case(f"combo-{cid.replace('+', '-')}", geo, [req(("P", 48), ("U", 7)), req(("P", 48), ("V", 5))]),
            [chunk_ends(0, [48, 55], 2441, role="setup"), hit(0, 0, 2435), hit(1, 48, 2453)],
            setup=knobs(16, 16, 16),
        )
    for cid in ("2g-sw+mamba", "3g-full+sw+mamba", "4g-sw+mamba+sw_large+mamba", "4g-2full+sw+mamba"):
        inexpressible(
            f"prefix-caching/hybrid-model-combinations[{cid}]",
            f"{F}:2397",
            "a sibling sharing 48 hits 48",
            "group_kind",
            "a sliding-window group",
        )
    inexpressible(
        "prefix-caching/prefill-hybrid-mamba-align",
        f"{F}:2548",
        "allocate_slots does not raise on null Mamba blocks",
        "no_trace",
        "asserts only that one 55-token allocation succeeds (a crash regression)",
    )
    geo = geometry([("fa", 16), ("m", 16)])
    det_adapt = "the test allocates req_0's 48 tokens in one chunk; the scheduler splits req_0 at its last cache position 32 and at 48"
    det = case(
        "fa16-m16-dense-shared-prefix-detection",
        geo,
        [req(("P", 48)), req(("P", 48), ("X", 7)), req(("P", 47), ("Y", 1))],
    )
    expressed(
        "prefix-caching/shared-prefix-detection[req1]",
        f"{F}:2588",
        "a 55-token extension of a 48-token prompt hits 48, no junction",
        det,
        [hit(0, 0, 2610), hit(1, 48, 2619), junction(1, 0, 2620)],
        setup=knobs(16, 16, 16),
        fidelity="adapted",
        adaptation=det_adapt,
    )
    expressed(
        "prefix-caching/shared-prefix-detection[req2]",
        f"{F}:2588",
        "a prompt sharing 47 of those 48 tokens misses (0) with the junction at 32; its first chunk ends at the junction",
        det,
        [hit(2, 0, 2628), junction(2, 32, 2630), chunk(2, 0, 32, 2653)],
        setup=knobs(16, 16, 16),
        fidelity="adapted",
        adaptation=det_adapt,
        xfail={
            "reference": "setup the scheduler never produces: the test allocates req_0's 48 tokens in one chunk, so no Mamba state exists at 32; "
            "the scheduler ends req_0's first chunk at its last cache position floor(47/16)*16 = 32 and dense retention keeps that state, "
            "so req_2 resumes at 32 with no junction",
            "engine": "as for the reference: the real scheduler splits req_0 at 32 and keeps the state there, so req_2 hits 32",
        },
    )
    inexpressible(
        "prefix-caching/mamba-align-dynamic-draft-tokens",
        f"{F}:2662",
        "allocate_slots survives a shrinking number of draft tokens",
        "no_trace",
        "a shrinking number of draft tokens per decode round; kvspec's step loop proposes the same K every round, and the test asserts only that allocation succeeds",
    )
    inexpressible(
        "prefix-caching/block-stored-event-group-idx",
        f"{F}:3798",
        "BlockStored events carry the group index",
        "internal",
        "KV cache events emitted by BlockPool.cache_full_blocks called directly",
    )
    for L in (0, 1):
        for ck in (0, 1):
            for fb in (64, 128):
                geo = geometry([("fa", fb), ("m", 512), ("fa", 64)], unit=64, grid=64 if ck else None)
                expected = 1088
                setup_ends = [1089] if ck else [expected, 1089]
                expressed(
                    f"prefix-caching/lookahead-checkpoint-available-hash[L={L},ck={ck},fa={fb}]",
                    f"{F}:4307",
                    f"lookahead {L}, prompt 1089, Mamba 512, hash 64: the checkpoint 1088 is cached and a resend hits it",
                    case(
                        f"fa{fb}-m512-fa64-h64-{'grid64' if ck else 'nogrid'}-{'lookahead' if L else 'off'}-n1089-resend",
                        geo,
                        [req(("A", 1089)), req(("A", 1089))],
                        mtp_lookahead(1) if L else None,
                    ),
                    [
                        chunk_ends(0, setup_ends, 4338, role="setup"),
                        states(0, 4342, includes=[expected]),
                        hit(1, expected, 4366),
                    ],
                    setup=knobs(512, 64, 64, L=L),
                    note="the test flags the third group (attention 64) as the EAGLE group when lookahead is on; the engine's draft layer joins the first attention group; no group drops (lookahead hashes)",
                )
    for L, n in ((2, 1089), (2, 1090), (3, 1089), (3, 1091)):
        inexpressible(
            f"prefix-caching/lookahead-checkpoint-available-hash[L={L},n={n}]",
            f"{F}:4307",
            "the checkpoint is reusable at the boundary its hash proves",
            "multi_module_mtp",
            f"num_hash_lookahead_tokens={L}",
        )
    geo = geometry([("fa", 16), ("m", 544)])
    expressed(
        "prefix-caching/eagle-hybrid-mamba-hits-partial-prompt-boundary",
        f"{F}:4369",
        "lookahead 1, Mamba 544, hash 16, 1249 tokens prefilled as 1248 + 1: a resend hits 1248",
        case("fa16-m544-h16-lookahead-n1249-resend", geo, [req(("A", 1249)), req(("A", 1249))], mtp_lookahead(1)),
        [chunk_ends(0, [1248, 1249], 4393, role="setup"), hit(1, 1248, 4410)],
        setup=knobs(544, 16, 16, L=1),
        not_expressed="find_longest_cache_hit_per_group (line 4415): a primitive",
    )
    for L in (0, 1):
        boundary = (1249 - max(1, L)) // 16 * 16
        for off in (0, 1, 2):
            shared = boundary + off
            expressed(
                f"prefix-caching/partial-hit-requires-lookahead-tokens[L={L},off={off}]",
                f"{F}:4420",
                f"lookahead {L}, a consumer sharing {shared} tokens of a 1249-token producer hits {boundary if off >= L else 0}",
                case(
                    f"fa16-m544-h16-{'lookahead' if L else 'off'}-n1249-share{shared}",
                    geo,
                    [req(("A", 1249)), req(("A", shared), ("C", 1249 + 16 - shared))],
                    mtp_lookahead(1) if L else None,
                ),
                [chunk_ends(0, [boundary, 1249], 4451, role="setup"), hit(1, boundary if off >= L else 0, 4472)],
                setup=knobs(544, 16, 16, L=L),
            )
    inexpressible(
        "prefix-caching/partial-hit-requires-lookahead-tokens[L=2]",
        f"{F}:4420",
        "a partial hit needs the lookahead tokens",
        "multi_module_mtp",
        "num_hash_lookahead_tokens=2",
    )
    inexpressible(
        "prefix-caching/positive-retention-rejects-full-attention",
        f"{F}:5072",
        "retention on a full-attention-only model is a ValueError",
        "no_trace",
        "a configuration error, no trace",
    )
    geo = geometry([("fa", 32), ("m", 32)], retention=0, budget=32)
    for name, second, line in (("resend", req(("A", 128)), 5390), ("longer", req(("A", 128), ("B", 32)), 5396)):
        expressed(
            f"prefix-caching/mamba-retention-mtp-resend-aligned[{name}]",
            f"{F}:5317",
            f"EAGLE K=3, block 32, sparse, 128 tokens prefilled block by block: states 64 and 96 kept; the {name} hits 96",
            case(f"fa32-m32-r0-drop3-budget32-n128-{name}", geo, [req(("A", 128)), second], mtp_drop(3)),
            [
                chunk_ends(0, [32, 64, 96, 128], 5373, role="setup"),
                states(0, 5382, exactly=[64, 96]),
                hit(1, 3 * 32, line),
            ],
            fidelity="adapted",
            adaptation="the test prefills one block per chunk; the case's token budget 32 makes the scheduler do the same",
            setup=knobs(32, 32, 32, drop=True),
            engine_options=ALL_GROUPS,
        )
    geo = geometry([("fa", 32), ("m", 32)], retention=0, budget=32)
    expressed(
        "prefix-caching/mamba-retention-lookahead-last-boundary",
        f"{F}:5399",
        "lookahead 1, block 32, sparse, 129 tokens prefilled block by block: only the state at 128 is kept; a resend hits 128",
        case("fa32-m32-r0-lookahead-budget32-n129-resend", geo, [req(("A", 129)), req(("A", 129))], mtp_lookahead(1)),
        [chunk_ends(0, [32, 64, 96, 128, 129], 5426, role="setup"), states(0, 5433, exactly=[128]), hit(1, 128, 5440)],
        fidelity="adapted",
        adaptation="the test prefills one block per chunk; the case's token budget 32 makes the scheduler do the same",
        setup=knobs(32, 32, 32, L=1),
    )
    mask_adapt = (
        "the test calls MambaManager.reachable_block_mask directly for a 256-token prompt; the case prefills that prompt with a 16-token budget, "
        "so every block ends a chunk and the mask alone decides which states stay"
    )
    for ri, blocks in ((None, range(16)), (16, range(16)), (64, (3, 7, 11, 14, 15)), (0, (14,))):
        geo = geometry([("fa", 16), ("m", 16)], retention=ri, budget=16)
        expressed(
            f"prefix-caching/reachable-mask-sparsifies[ri={ri}]",
            f"{F}:6078",
            f"retention {ri}: a 256-token prompt keeps the states of blocks {list(blocks) if ri not in (None, 16) else 'all'}",
            case(f"fa16-m16-r{'dense' if ri is None else ri}-budget16-n256", geo, [req(("A", 256))]),
            [
                chunk_ends(0, range(16, 257, 16), None, role="setup"),
                states(0, {None: 6106, 16: 6108, 64: 6111, 0: 6113}[ri], exactly=[(b + 1) * 16 for b in blocks]),
            ],
            fidelity="adapted",
            adaptation=mask_adapt,
            setup=knobs(16, 16, 16),
        )
    geo = geometry([("fa", 16), ("m", 16)], retention=0, budget=16)
    expressed(
        "prefix-caching/reachable-mask-pins-shared-prefix[0,96]",
        f"{F}:6116",
        "sparse retention with a junction at 96: the request keeps blocks 5 and 14 (states 96 and 240)",
        case("fa16-m16-r0-budget16-junction96", geo, [req(("S", 96), ("A", 160)), req(("S", 96), ("B", 160))]),
        [hit(1, 0, 6148, role="setup"), junction(1, 96, 6148, role="setup"), states(1, 6148, exactly=[96, 240])],
        fidelity="adapted",
        adaptation=mask_adapt + "; the junction at 96 is observed by a second prompt sharing 96 tokens with the first",
        setup=knobs(16, 16, 16),
        not_expressed="boundary 100 (a junction off the 16-token attention grid never arises), interval 64 (the sibling would then hit the shared state at 64), dense, out-of-range and absent boundaries (lines 6150-6159)",
    )
    geo = geometry([("fa", 16), ("m", 16)])
    expressed(
        "prefix-caching/mamba-align-siblings-hit-committed-boundary",
        f"{F}:6162",
        "a producer [32 shared + 8] commits the state at 32; three siblings each hit 32",
        case(
            "fa16-m16-dense-siblings32",
            geo,
            [req(("S", 32), ("P", 8)), req(("S", 32), ("X", 8)), req(("S", 32), ("Y", 8)), req(("S", 32), ("Z", 8))],
        ),
        [chunk_ends(0, [32, 40], 6183, role="setup"), hit(1, 32, 6193), hit(2, 32, 6193), hit(3, 32, 6193)],
        fidelity="adapted",
        adaptation="the test admits the siblings in the producer's last step; the case runs them one after another",
        setup=knobs(16, 16, 16),
        not_expressed="that no sibling is deferred in that step (line 6197): requests sharing a step",
    )
    for ri, line in ((None, 6243), (0, 6247)):
        geo = geometry([("fa", 16), ("m", 16)], retention=ri)
        expressed(
            f"prefix-caching/mamba-shared-prefix-reuse[ri={ri}]",
            f"{F}:6200",
            "req1 observes the junction at 32 and caches the state there; req2 sharing the same 32 tokens hits 32",
            case(
                f"fa16-m16-r{'dense' if ri is None else ri}-junction32",
                geo,
                [req(("S", 32), ("A", 32)), req(("S", 32), ("B", 32)), req(("S", 32), ("C", 32))],
            ),
            [hit(1, 0, None, role="setup"), junction(1, 32, 6231), hit(2, 32, line)],
            fidelity="adapted",
            adaptation="the test prefills req1 only up to the junction; the case runs it to completion (its first chunk also ends at the junction)",
            setup=knobs(16, 16, 16),
        )
    inexpressible(
        "prefix-caching/mamba-shared-prefix-reuse[ri=0,no-pin]",
        f"{F}:6200",
        "without the pin the junction is masked out (0)",
        "hand_state",
        "simulates a scheduler that does not record the junction (pin=False); the scheduler always passes shared_prefix_boundary",
    )
    inexpressible(
        "prefix-caching/reachable-mask-ignores-dcp",
        f"{F}:6416",
        "the Mamba mask ignores DCP",
        "dcp",
        "dcp_world_size 2",
    )
    inexpressible(
        "prefix-caching/reachable-mask-large-dcp-sparse",
        f"{F}:6452",
        "a large DCP keeps the mask sparse",
        "dcp",
        "dcp_world_size 16",
    )


def other_files() -> None:
    inexpressible(
        "hit-rate/prefix-cache-hit-rate",
        f"{HIT_RATE}:116",
        "multi-turn chats on Qwen/Qwen3.5-0.8B (MTP 1 or off): each turn's cached tokens >= floor(previous prompt, lcm(block, mamba_block)) - dropped blocks",
        "live",
        "prompt lengths and whether turn t's prompt extends turn t-1's come from the model's tokenizer and chat template, the block size from /metrics; the assertion is a lower bound over 8 concurrent sessions",
    )
    for line, name in (
        (116, "hit-replays-window"),
        (159, "replay-only-chunks-progress"),
        (196, "async-remote-hit-replays"),
        (224, "remote-hit-whole-blocks"),
        (252, "kv-load-window-no-replay"),
        (277, "decode-bench-fill-no-replay"),
        (291, "short-hit-ignored"),
        (326, "kv-load-zeroing-groups"),
    ):
        inexpressible(
            f"prefix-replay/{name}",
            f"{PREFIX_REPLAY}:{line}",
            "sliding-window bounded replay",
            "group_kind",
            "full attention + a sliding-window MLA group with bounded replay; no Mamba group",
        )


#: Cases on which the reference model and the real 0.33.0 engine disagree
#: (kvspec model bugs or adapter gaps), with what was found; the
#: reference-vs-engine test expects them to fail (strict).
REFERENCE_VS_ENGINE = {
    "cases/fa2-m4-h2-drop-n9-extend13.json": (
        "states[0]: the engine holds a Mamba state keyed at 8 that the reference does not predict. With the adapter's "
        "cache block 2 (the smallest group block) below the Mamba block 4, the owner's chunks are 0->6 and 6->9: the first ends "
        "mid-block (the EAGLE tail checkpoint 6), the second crosses the Mamba boundary 8 without stopping (the split's "
        "'next block boundary' stop uses the 2-token cache block). Mamba block 1 stays non-null (it held the state at 6), so "
        "cache_blocks(9) registers it as the full block ending at 8 although no chunk ended there: a state hashed as 8 tokens "
        "that holds the state at 6. The reference writes states only at chunk ends. vLLM's align mode on CUDA sets "
        "cache block = Mamba block, so a deployment does not build this geometry; the vLLM test builds it (attention 2, Mamba 4) "
        "without a scheduler."
    ),
}


def build() -> tuple[dict[str, dict], dict]:
    """(case files by relative path, the manifest) as this module states them."""
    ENTRIES.clear()
    CASES.clear()
    partial_prefix_cache_hits()
    primitives()
    eagle_resume()
    chunk_split()
    prefix_caching()
    other_files()
    ids = [e["id"] for e in ENTRIES]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise ValueError(f"duplicate entry ids: {sorted(dupes)}")
    cases = {f"cases/{name}.json": doc for name, doc in CASES.items()}
    for path, doc in cases.items():
        _check_case(path, doc)
    for path in REFERENCE_VS_ENGINE:
        if path not in cases:
            raise ValueError(f"REFERENCE_VS_ENGINE names an unknown case {path}")
    for e in ENTRIES:
        if e["expressible"] and e["case"] not in cases:
            raise ValueError(f"{e['id']}: unknown case {e['case']}")
    manifest = {
        "schema": 1,
        "vllm_version": VLLM_VERSION,
        "source": f"vllm-{VLLM_VERSION} sdist, {SDIST_TESTS}",
        "not_expressible_categories": NOT_EXPRESSIBLE,
        "reference_vs_engine_xfail": REFERENCE_VS_ENGINE,
        "entries": ENTRIES,
    }
    return cases, json.loads(json.dumps(manifest))


def _check_case(path: str, doc: dict) -> None:
    """The case parses, and its prompts share exactly the prefixes their
    segments say (a chance equal token where two streams meet would change
    the test's prefix relations)."""
    c = parse_case(doc)
    toks = [prompt_tokens(r) for r in c.trace]
    for i, r in enumerate(c.trace):
        for j in range(i):
            meant = known_common(c.trace[j].prompt, r.prompt)
            real = common_prefix(toks[j], toks[i])
            if real != meant:
                raise ValueError(f"{path}: requests {j} and {i} share {real} tokens, the segments say {meant}")


def write() -> int:
    cases, manifest = build()
    CASES_DIR.mkdir(parents=True, exist_ok=True)
    for path, doc in cases.items():
        write_json_atomic(HERE / path, doc)
    stale = {p.name for p in CASES_DIR.glob("*.json")} - {Path(p).name for p in cases}
    for name in sorted(stale):
        (CASES_DIR / name).unlink()
    write_json_atomic(MANIFEST, manifest)
    n_expr = sum(1 for e in manifest["entries"] if e["expressible"])
    print(f"{len(cases)} case files, {len(manifest['entries'])} entries ({n_expr} expressed)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(write())
