"""fuzz.results.known_classes: a finding is sorted into the known class whose rule it
breaks, from its own fields; one that breaks no known rule is None. The
findings are built here from each class's example (examples/README.md:
the trace, the resolved geometry, the hits it reports)."""

from __future__ import annotations

import copy
import json

import pytest

from fuzz.results.known_classes import BY_ID, KNOWN_CLASSES, classify
from ground.home import REPO_ROOT
from reference.case import case_to_dict
from tests.conftest import MTP_DROP, hybrid, make_case


def _finding(
    oracle, geometry, prompts, expected, observed, *, spec=None, version="0.33.0", model="qwen3_next", drop=None
):
    case = case_to_dict(make_case(geometry, prompts, spec))
    case["deployment"] = {
        "model": model,
        "vllm_args": ["--enable-prefix-caching"],
        "platform": "cuda",
        "device": "a100",
    }
    case["resolved_by"] = f"vllm=={version}"
    first = next((i for i, (e, o) in enumerate(zip(expected, observed)) if e != o), None)
    drop = bool(spec and spec.get("disable_lookahead_block_hashes")) if drop is None else drop
    return {
        "oracle": oracle,
        "first_divergence": first,
        "expected": {"hits": expected},
        "observed": {"hits": observed},
        "engine": {"version": version, "knobs": {"eagle_drop": drop}},
        "case": case,
    }


CASES = {
    # seed-53504-deployment.json on 0.29.0: miss/miss/hit
    "resend-53504": _finding(
        "promise",
        hybrid(1600, 1600),
        [[("A", 11910)]] * 3,
        [0, 9600, 9600],
        [0, 0, 9600],
        spec=MTP_DROP,
        version="0.29.0",
    ),
    # make check's promise-79e92583 (0.29.0, Falcon-H1, block 144, dense, no drafts): A:288 twice,
    # 0 / 0 where the promise gives 0 / 144 (a third A:288 hits 144: miss, miss, hit)
    "aligned-resend": _finding(
        "promise",
        hybrid(144, 144, retention_interval=None),
        [[("A", 288)]] * 2,
        [0, 144],
        [0, 0],
        version="0.29.0",
        model="falcon_h1",
    ),
    # r2-block-aligned-extension-qwen3_next.json: 0 / 544 where the promise gives 0 / 1088
    "longer-sibling": _finding(
        "promise", hybrid(544, 544, retention_interval=0), [[("A", 1088)], [("A", 1089)]], [0, 1088], [0, 544]
    ),
    # the R2 class on Falcon-H1 with a 16-token hash unit (block 144): 272 where the promise gives 288
    "hashed-longer-sibling": _finding(
        "sparse_dense",
        hybrid(144, 144, prefix_match_unit=16, retention_interval=0),
        [[("A", 288)], [("A", 300)]],
        [0, 288],
        [0, 272],
        model="falcon_h1",
    ),
    # stale-state-after-partial-hit-falcon_h1.json
    "stale-state": _finding(
        "stale",
        hybrid(144, 144, prefix_match_unit=16, retention_interval=None),
        [[("A", 17)], [("A", 428)], [("A", 313)]],
        [0, 16, 16],
        [0, 16, 144],
        model="falcon_h1",
    ),
    # r1-hashed-periodic-eagle-drop-qwen3_5.json: 0 / 1280 where the promise gives 0 / 1632
    "resend-beside-checkpoint": _finding(
        "promise",
        hybrid(320, 320, prefix_match_unit=32, retention_interval=960),
        [[("C", 1664)]] * 2,
        [0, 1632],
        [0, 1280],
        spec=MTP_DROP,
        model="qwen3_5",
    ),
    # dense-below-sparse-hashed-qwen3_next.json: 0 / 1152 where the promise gives 0 / 1184
    "dense-below-sparse": _finding(
        "promise",
        hybrid(1152, 1152, prefix_match_unit=32, retention_interval=None),
        [[("A", 1216)], [("A", 1216), ("B", 17)]],
        [0, 1184],
        [0, 1152],
        spec=MTP_DROP,
    ),
}


def _stall_finding(geometry, prompts, request, steps, computed, *, pinned=True, asynchronous=False) -> dict:
    """An ``engine_error`` finding of the serial step loop's EngineStall
    (examples/stall-*.json: the trace and the resolved block and unit)."""
    n = sum(length for _, length in prompts[request])
    finding = _finding("engine_error", geometry, prompts, [], [], model="qwen3_5")
    message = (
        f"no progress: request {request} still unfinished after {steps} steps ({computed}/{n} prompt tokens computed)"
    )
    finding.update(
        first_divergence=request,
        observed={"hits": [0] * request, "error": {"kind": "vllm", "type": "EngineStall", "message": message}},
        resolution={"facts": {"pool_set_by_deployment": pinned, "async_scheduling": asynchronous}},
    )
    return finding


#: stall-partial-hit-cow-sync-qwen3_5.json: block 288, unit 16, request 1 hits 16 of A:32 (pool 19)
COW = (hybrid(288, 288, prefix_match_unit=16), [[("A", 32)], [("A", 320), ("B", 1), ("D", 256)]])
#: stall-async-self-preemption-qwen3_5.json: block 576, unit 16, dense retention (pool 23, async)
SELF_PREEMPTION = (
    hybrid(576, 576, prefix_match_unit=16, retention_interval=None),
    [[("A", 3455)], [("A", 1472), ("B", 318)], [("A", 2881), ("C", 234)], [("D", 2303)]],
)


def _sglang_finding(prompts, expected, observed) -> dict:
    """An SGLang finding on the grid-64 resolution (examples/sglang-*.json)."""
    case = case_to_dict(make_case(hybrid(64, 64, retention_interval=0), prompts, None))
    case.update(
        deployment={
            "model": "qwen3_next",
            "engine": "sglang",
            "sglang_args": ["--mamba-radix-cache-strategy", "extra_buffer", "--page-size", "64"],
        },
        resolved_by="sglang==0.5.23",
    )
    first = next((i for i, (e, o) in enumerate(zip(expected, observed)) if e != o), None)
    return {
        "oracle": "promise",
        "first_divergence": first,
        "expected": {"hits": expected},
        "observed": {"hits": observed},
        "engine": {"name": "sglang==0.5.23", "version": "sglang==0.5.23", "knobs": {}},
        "case": case,
    }


CASES.update(
    {
        "pinned-pool-cow-stall": _stall_finding(*COW, 1, 9, 0),
        "async-self-preemption": _stall_finding(*SELF_PREEMPTION, 2, 3181, 0, asynchronous=True),
        # sglang-grid-resend-qwen3_next.json: 0 / 2048 where the promise gives 0 / 3136
        "sglang-grid-resend": _sglang_finding([[("A", 3200)]] * 2, [0, 3136], [0, 2048]),
        # sglang-sibling-branch-qwen3_next.json: the sibling's resend, 640 where the promise gives 1024
        "sglang-sibling-branch": _sglang_finding(
            [[("A", 1024)], [("A", 640), ("B", 400)], [("A", 640), ("B", 400)]], [0, 0, 1024], [0, 0, 640]
        ),
    }
)


#: make check's block_table-65f6611d (vLLM 0.29.0, Falcon-H1, block 272, budget 544, A:1089):
#: once the step starting at 1088 is scheduled the table holds the block at column 1 under the
#: null gap at column 2 (the two-block chunk 544..1088 padded it)
NULL_GAP = json.loads((REPO_ROOT / "tests/engine/data/finding-null-gap-retirement-falcon-h1.json").read_text())
CASES["null-gap-retirement"] = NULL_GAP
#: make check's engine_error-dbb8ca62 (vLLM 0.29.0, Falcon-H1, block 272, unit 16, EAGLE 3, pool 10,
#: sync): A:676+C:157 computes to its own partial tail 832 and preempts itself there, 902 steps
COW_OVERCOUNT = json.loads((REPO_ROOT / "tests/engine/data/finding-tail-cow-overcount-falcon-h1.json").read_text())
CASES["tail-cow-overcount"] = COW_OVERCOUNT
#: make check's engine_error-6162dce4 (vLLM 0.29.0, granitemoehybrid, 7 Mamba groups, block 528,
#: unit 16, async, pool 19): A:16 computes to its own partial tail 16, preempts itself, and the
#: admission gate, counting each group's copy-on-write block twice, never takes it back (10 steps)
NEVER_READMITTED = json.loads(
    (REPO_ROOT / "tests/engine/data/finding-tail-cow-never-readmitted-granitemoehybrid.json").read_text()
)
#: make check's engine_error-ef99ab80 (vLLM 0.29.0, Jamba, block 160 = unit, EAGLE 3, async, pool 42):
#: A:797 preempted with its chunk in flight and resumed at 640, 866 steps; runs under sync
ASYNC_029 = json.loads((REPO_ROOT / "tests/engine/data/finding-async-self-preemption-0.29.0-jamba.json").read_text())
#: a 0.32.0 campaign's engine_error-3c799516 (seed 1; Jamba, block 80, unit 16, async, pool 20):
#: A:337 preempted once with its step in flight, never admitted again (11 steps, 0 computed)
SHUT_OUT_032 = json.loads(
    (REPO_ROOT / "tests/engine/data/finding-async-self-preemption-shut-out-0.32.0-jamba.json").read_text()
)
#: a 0.30.0 campaign's engine_error-53bd6870 (seed 1; Qwen3.5, MTP 2, block 144, unit 16, async):
#: A:1007 resumes one unit below its own partial tail 992 again and again (976 computed, 1,076 steps)
TAIL_COW_DROP_030 = json.loads(
    (REPO_ROOT / "tests/engine/data/finding-tail-cow-overcount-drop-0.30.0-qwen3_5.json").read_text()
)
#: the same campaign's engine_error-67a7f0a4 (Qwen3-Next, async): A:385 then a longer prompt, looped
ASYNC_030 = json.loads(
    (REPO_ROOT / "tests/engine/data/finding-async-self-preemption-0.30.0-qwen3_next.json").read_text()
)
#: bench/rediscovery's 0.29.0 seed 5 (Jamba, block 160, unit 32, async, pool 91): A:384 decoding 4
#: keys its partial tail 384 twice; request 4 (A:544+W:1) resumes at 384 from a state over 385 tokens
TAIL_RECACHE = json.loads((REPO_ROOT / "tests/engine/data/finding-async-tail-recache-jamba.json").read_text())
CASES["async-tail-recache"] = TAIL_RECACHE
#: a 0.30.0 campaign's promise-10a2a7e9 (seed 1; Qwen3-Next, MTP 2, block 144, unit 16, sparse):
#: A:288 resent hits 0 where the promise gives 128; a third request misses too
CASES["hashed-drop-resend"] = json.loads(
    (REPO_ROOT / "tests/engine/data/finding-hashed-drop-resend-0.30.0-qwen3_next.json").read_text()
)
#: the same campaign's promise-5d07c7a1 (Qwen3.5, MTP 3, block = unit 288, dense): A:864 resent hits 0
#: where the promise gives 288; a third request hits 288
ALIGNED_DROP_030 = json.loads(
    (REPO_ROOT / "tests/engine/data/finding-aligned-resend-drop-0.30.0-qwen3_5.json").read_text()
)


def test_every_known_class_has_a_finding_here_and_a_release():
    releases = ("0.29.0", "0.30.0", "0.33.0", "sglang==0.5.23")
    assert set(CASES) == set(BY_ID) and all(k.release in releases for k in KNOWN_CLASSES)


@pytest.mark.parametrize("cls", sorted(CASES))
def test_each_class_s_finding_is_recognised_as_that_class(cls):
    assert classify(CASES[cls]) == cls


def test_a_finding_that_breaks_no_known_rule_is_none():
    honest = dict(CASES["longer-sibling"], observed={"hits": [0, 1088]}, first_divergence=None)
    assert classify(honest) is None  # no divergence
    high = dict(CASES["longer-sibling"], observed={"hits": [0, 1600]})
    assert classify(high) is None  # a hit above the promise is not a lost-reuse class
    sibling = _finding(
        "junction", hybrid(544, 544, retention_interval=0), [[("A", 1088)], [("A", 600), ("B", 5)]], [0, 544], [0, 0]
    )
    assert classify(sibling) is None  # junction: no known class
    spec_off_resend = _finding(
        "promise", hybrid(1600, 1600), [[("A", 11910)]] * 2, [0, 11200], [0, 9600], version="0.33.0"
    )
    assert classify(spec_off_resend) is None  # a resend miss without the drop on 0.33.0 is not #53504


def test_a_stall_is_a_pinned_pool_class_only_where_its_rule_holds():
    geometry, prompts = COW
    assert classify(_stall_finding(geometry, prompts, 1, 9, 0, pinned=False)) is None  # a pool vLLM sized itself
    assert classify(_stall_finding(geometry, prompts, 1, 9, 5)) is None  # it ran: not never-admitted
    aligned = [[("A", 288)], [("A", 288), ("B", 289)]]  # the hit ends on the block: no copy-on-write block
    assert classify(_stall_finding(geometry, aligned, 1, 9, 0)) is None
    unhashed = hybrid(288, 288)  # no hash unit: no hit inside a block
    assert classify(_stall_finding(unhashed, prompts, 1, 9, 0)) is None
    assert classify(_stall_finding(*SELF_PREEMPTION, 2, 3181, 0, asynchronous=False)) is None  # sync: not this class
    other = _stall_finding(*SELF_PREEMPTION, 2, 3181, 0, asynchronous=True)
    other["engine"] = {**other["engine"], "version": "0.31.0"}  # a release it was not traced on
    assert classify(other) is None
    sglang = dict(CASES["pinned-pool-cow-stall"], engine={"version": "sglang==0.5.23", "knobs": {}})
    assert classify(sglang) is None  # another family's stall is not vLLM's class


def test_the_hash_unit_tail_under_periodic_retention_is_the_dense_below_sparse_class_for_an_extension():
    periodic = _finding(
        "promise",
        hybrid(192, 192, prefix_match_unit=32, retention_interval=192),
        [[("A", 600)], [("A", 700)]],
        [0, 224],
        [0, 192],
        spec=MTP_DROP,
        model="qwen3_5",
    )
    assert classify(periodic) == "dense-below-sparse"
    sparse = _finding(
        "promise",
        hybrid(192, 192, prefix_match_unit=32, retention_interval=0),
        [[("A", 600)], [("A", 700)]],
        [0, 224],
        [0, 192],
        spec=MTP_DROP,
        model="qwen3_5",
    )
    assert classify(sparse) == "hashed-longer-sibling"  # sparse retention: the hashed longer sibling


def test_the_longer_sibling_under_periodic_retention_without_a_hash_unit_is_the_longer_sibling_class():
    # a Granite 4.0-H deployment of a connector campaign (interval 3 blocks):
    # B then B+1 hits 0 where the promise gives B; the longer-sibling fix gives B
    periodic = _finding(
        "promise",
        hybrid(528, 528, retention_interval=1584),
        [[("A", 528)], [("A", 528), ("B", 1)]],
        [0, 528],
        [0, 0],
        model="granitemoehybrid",
    )
    assert classify(periodic) == "longer-sibling"
    dense = _finding(
        "promise",
        hybrid(528, 528, retention_interval=None),
        [[("A", 528)], [("A", 528), ("B", 1)]],
        [0, 528],
        [0, 0],
        model="granitemoehybrid",
    )
    assert classify(dense) is None  # dense retention keeps every state: not this class


def test_findings_lists_the_known_class_of_a_class(tmp_path):
    import json

    from fuzz.results.triage import read_findings, triage
    from kvspec.commands.findings import render

    (tmp_path / "promise-a.json").write_text(json.dumps(CASES["longer-sibling"]))
    described, malformed = read_findings(tmp_path)
    lines = render(triage(described), malformed, str(tmp_path))
    assert "     known class: longer-sibling" in lines, lines


def test_one_registry_each_family_declares_its_classes_and_the_report_reads_it():
    """One known-class registry: SGLang's classes come from its family's
    module (``ground.engines``' ``classes``), and ``kvspec report``'s prose
    (fuzz/data/report_vllm_classes.json) names classes of the registry and
    is chosen by its classifier: a report tells the class ``findings`` and
    triage tell."""
    import json
    from pathlib import Path

    from fuzz.results import report
    from fuzz.results.known_classes_sglang import CLASSES

    assert [c[0] for c in CLASSES] == [k.id for k in KNOWN_CLASSES if k.release.startswith("sglang==")]
    prose = [i for c in report.KNOWN_CLASSES for i in c["classes"]]
    assert prose and set(prose) <= set(BY_ID)
    data = Path(__file__).resolve().parents[2] / "tests" / "engine" / "data"
    stale = json.loads((data / "finding-stale-state-falcon-h1.json").read_text())  # a hit above the reference
    assert classify(stale) == "stale-state" and report.classify(stale)["id"] == "stale-state-after-partial-hit"
    sibling = json.loads((data / "finding-longer-sibling-qwen3-next.json").read_text())
    assert (
        classify(sibling) == "longer-sibling" and report.classify(sibling)["id"] == "longer-sibling-of-aligned-prompt"
    )
    sibling["first_divergence"] = None
    assert classify(sibling) is None and report.classify(sibling) is None


def test_a_partial_hits_copied_state_seen_by_resumed_state_is_the_stale_state_class():
    """A real 0.33.0 campaign finding (Falcon-H1, block 272, hash unit 16,
    the offloading connector): A:272, then A:272+B:273 resumes at the
    partial hit 256 and runs past 272 (its internal checkpoint is valid), so
    the block holding the copied state over 256 tokens is cached as the
    state after 272; A:272+F:1 resumes there. Request 0 wrote a state at
    272, so only ``resumed_state`` sees it: the stale-state class, by what
    the state held (the fixed base resumes correctly). A state over more
    tokens than the hit, or one outside the block, is another fault."""
    import copy
    import json
    from pathlib import Path

    data = Path(__file__).resolve().parents[2] / "tests" / "engine" / "data"
    real = json.loads((data / "finding-stale-state-resumed-falcon-h1.json").read_text())
    assert real["oracle"] == "resumed_state" and classify(real) == "stale-state"
    from fuzz.results import report

    assert report.classify(real)["fix"] == "fixes/vllm-0.33.0-stale-state-after-partial-hit.diff"  # the fix it names

    def held(tokens, at=272):
        f = copy.deepcopy(real)
        f["explain"]["engine"][2]["resumed_state"].update(tokens=tokens, at=at)
        return f

    assert classify(held(288)) is None  # a state ahead of its key (cap or key faults)
    assert classify(held(0)) is None  # a state from the block before
    assert classify(held(260)) is None  # off the hash unit: no partial hit lands there
    assert classify(held(256, at=271)) is None  # not a block boundary: not the cached block's end
    assert classify(held(None)) is None  # a slot no step wrote (not this mechanism)


def test_a_state_finding_on_sglang_is_no_known_class_not_vllms():
    """SGLang has no known state class: its off-page key was found only on
    deployments its launch check refuses (docs/sglang.md), which kvspec's
    resolver now refuses too. A ``stale`` or ``resumed_state`` finding on
    SGLang is new, never vLLM's stale-state; a vLLM stale finding stays
    stale-state."""
    resumed = dict(
        _sglang_finding([[("A", 3000)]] * 3, [0, 0, 0], [0, 2880, 2944]), oracle="resumed_state", first_divergence=1
    )
    assert classify(resumed) is None
    assert classify(dict(resumed, oracle="stale")) is None
    assert classify(CASES["stale-state"]) == "stale-state"
    assert "sglang-off-page-key" not in BY_ID


def test_a_stale_finding_without_partial_hits_is_no_stale_state():
    """The stale-state class is a partial hit's copied state cached as the
    next block boundary's, so it needs a hash unit below the block. The
    shape of a 10-minute campaign's stale-052d07f8 on the fixed base
    (Qwen3-Next, block 560, no hash unit: a connector-loaded state the
    oracle then took for one the request keyed) is not it; the same finding
    with a 16-token unit is."""
    g = hybrid(560, 560, retention_interval=None)
    bare = _finding("stale", g, [[("A", 2352), ("B", 449)], [("A", 1695), ("C", 1)]], [0, 1120], [0, 1120])
    assert classify(bare) is None
    unit = _finding(
        "stale",
        dict(g, prefix_match_unit=16),
        [[("A", 2352), ("B", 449)], [("A", 1695), ("C", 1)]],
        [0, 1120],
        [0, 1120],
    )
    assert classify(unit) == "stale-state"


def _sibling_after_junction(**geometry):
    """A campaign's seed-3 case on Qwen3-Next (block 1152, unit 32, MTP 2
    with the drop, dense retention, the shared-prefix checkpoint): A:3424,
    then a sibling A:2304 B:160 (junction 2272, its chunk [0, 2272) also
    exports an interim checkpoint at 2240), then a sibling A:2541 C:1 that
    the promise resumes at 2272; vLLM 0.33.0 hits 0 (the class's fix gives
    2272)."""
    g = dict(prefix_match_unit=32, retention_interval=None, shared_prefix_checkpoint=True, prefill_checkpoint_grid=64)
    g.update(geometry)
    return _finding(
        "promise",
        hybrid(1152, 1152, **g),
        [[("A", 3424)], [("A", 2304), ("B", 160)], [("A", 2541), ("C", 1)]],
        [0, 0, 2272],
        [0, 0, 0],
        spec=MTP_DROP,
    )


def test_a_sibling_missing_an_earlier_junction_beside_a_checkpoint_is_the_resend_beside_checkpoint_class():
    assert classify(_sibling_after_junction()) == "resend-beside-checkpoint"
    assert classify(_sibling_after_junction(retention_interval=1152)) == "resend-beside-checkpoint"
    # sparse retention exports no interim checkpoint; without the shared-prefix
    # checkpoint no junction is keyed; with the hash unit at the block there is
    # no partial key: none of these is this class
    assert classify(_sibling_after_junction(retention_interval=0)) is None
    assert classify(_sibling_after_junction(shared_prefix_checkpoint=False)) is None
    assert classify(_sibling_after_junction(prefix_match_unit=None)) is None
    assert (
        classify(dict(_sibling_after_junction(), engine={"version": "0.33.0", "knobs": {"eagle_drop": False}})) is None
    )


def test_a_block_table_finding_is_the_null_gap_class_only_on_0_29_with_unretired_blocks_only():
    """The stored finding is the class; the same table on 0.32.0 or 0.33.0
    (whose Mamba manager retires past null gaps) is not, nor one that also
    held a freed block, nor a leak once the request finished (no step
    recorded), nor another oracle's finding on the same request."""
    assert NULL_GAP["oracle"] == "block_table" and classify(NULL_GAP) == "null-gap-retirement"

    def edited(**engine_record):
        f = copy.deepcopy(NULL_GAP)
        f["explain"]["engine"][0].update(engine_record)
        return f

    for version in ("0.32.0", "0.33.0"):
        assert classify(dict(NULL_GAP, engine=dict(NULL_GAP["engine"], version=version))) is None
    assert classify(edited(block_table=[[1088, 1, 1]])) is None  # a freed block: another fault
    assert classify(edited(block_table=[], leaked_blocks=2)) is None  # a leak once finished
    assert classify(dict(NULL_GAP, oracle="hit_blocks")) is None
    assert all(classify(CASES[k]) != "null-gap-retirement" for k in CASES if k != "null-gap-retirement")


def test_a_stall_at_its_own_partial_tail_is_the_overcount_class_only_on_0_29_on_a_pinned_pool():
    """The stored stall is the class; the same on 0.33.0 (which counts the
    copy-on-write block once), on a pool vLLM sized itself, with its last
    key on a block boundary, or one that never ran (a pinned-pool stall of
    0.33.0's classes) is not; no other class's finding is labelled it."""
    assert classify(COW_OVERCOUNT) == "tail-cow-overcount"
    assert classify(dict(COW_OVERCOUNT, engine=dict(COW_OVERCOUNT["engine"], version="0.33.0"))) is None
    unpinned = copy.deepcopy(COW_OVERCOUNT)
    unpinned["resolution"]["facts"]["pool_set_by_deployment"] = False
    assert classify(unpinned) is None
    aligned = copy.deepcopy(COW_OVERCOUNT)  # A:676+C:140 = 816 tokens: its last key 816 ends block 3
    aligned["case"]["trace"][0]["prompt"][1]["length"] = 140
    aligned["observed"]["error"]["message"] = aligned["observed"]["error"]["message"].replace("832/833", "800/816")
    assert classify(aligned) is None
    never_ran = copy.deepcopy(COW_OVERCOUNT)
    never_ran["observed"]["error"]["message"] = (
        "no progress: request 0 still unfinished after 9 steps (0/833 prompt tokens computed)"
    )
    assert classify(never_ran) is None
    assert all(classify(CASES[k]) != "tail-cow-overcount" for k in CASES if k != "tail-cow-overcount")


def test_findings_says_how_many_files_of_a_class_no_known_class_names(tmp_path):
    import json

    from fuzz.results.triage import read_findings, triage
    from kvspec.commands.findings import render

    known = _stall_finding(*SELF_PREEMPTION, 2, 3181, 0, asynchronous=True)
    older = json.loads(json.dumps(known))
    older["engine"]["version"] = "0.31.0"  # the same stall on a release the class does not name
    (tmp_path / "engine_error-a.json").write_text(json.dumps(known))
    (tmp_path / "engine_error-b.json").write_text(json.dumps(older))
    described, malformed = read_findings(tmp_path)
    classes = triage(described)
    assert [(c["count"], c["known"], c["unknown"]) for c in classes] == [(2, ["async-self-preemption"], 1)]
    assert "     known class: async-self-preemption; 1 of 2 file(s) in none" in render(classes, malformed, "d")


def test_a_0_29_stall_is_the_overcount_with_its_own_partial_tail_and_the_self_preemption_without():
    """vLLM 0.29.0's stalls of make check: one whose prompt ends inside a
    Mamba block on a hash unit (its own partial tail t) and that stopped at
    t or at 0 is the overcount, under async scheduling too; one with no
    such tail under async is the self-preemption. Each is what its cause's
    removal ends (tests/engine/test_stalls.py)."""
    assert classify(NEVER_READMITTED) == "tail-cow-overcount"
    assert classify(ASYNC_029) == "async-self-preemption"
    assert "(0/16 prompt tokens computed)" in NEVER_READMITTED["observed"]["error"]["message"]
    assert "(640/797 prompt tokens computed)" in ASYNC_029["observed"]["error"]["message"]
    sync = copy.deepcopy(ASYNC_029)
    sync["resolution"]["facts"]["async_scheduling"] = False
    assert classify(sync) is None  # no partial tail, no async: neither
    midway = copy.deepcopy(NEVER_READMITTED)  # stopped below its tail, not at 0: not where the overcount stops
    midway["case"]["trace"][0]["prompt"][0]["length"] = 600
    stopped = "after 669 steps (528/600 prompt tokens computed)"  # the step loop's bound: 600 + 4 + 64
    midway["observed"]["error"]["message"] = "no progress: request 0 still unfinished " + stopped
    assert classify(midway) == "async-self-preemption"  # it was async, and looped
    midway["resolution"]["facts"]["async_scheduling"] = False
    assert classify(midway) is None
    newer = dict(NEVER_READMITTED, engine=dict(NEVER_READMITTED["engine"], version="0.33.0"))
    assert classify(newer) is None  # 0.33.0 counts the block once; a 10-step stall did not loop
    held = copy.deepcopy(SELF_PREEMPTION[1])
    tailed = _stall_finding(SELF_PREEMPTION[0], held, 2, 3181, 0, asynchronous=True)
    tailed["engine"] = {**tailed["engine"], "version": "0.29.0"}
    assert classify(tailed) == "tail-cow-overcount"  # 3115 tokens, unit 16: its own tail 3104 inside block 5


def test_a_0_29_resend_of_a_block_aligned_prompt_without_the_drop_is_the_aligned_resend_class():
    aligned = CASES["aligned-resend"]
    assert classify(aligned) == "aligned-resend"
    unaligned = _finding(
        "promise", hybrid(144, 144, retention_interval=None), [[("A", 289)]] * 2, [0, 288], [0, 0], version="0.29.0"
    )
    assert classify(unaligned) is None  # the first prefill stopped at 288: not this rule
    assert classify(dict(aligned, engine=dict(aligned["engine"], version="0.33.0"))) is None
    dropped = dict(aligned, engine=dict(aligned["engine"], knobs={"eagle_drop": True}))
    assert classify(dropped) == "resend-53504"  # under the drop it is #53504's
    sibling = _finding(
        "promise",
        hybrid(144, 144, retention_interval=None),
        [[("A", 288)], [("A", 144), ("B", 144)]],
        [0, 144],
        [0, 0],
        version="0.29.0",
    )
    assert classify(sibling) is None  # not a resend
    assert all(classify(CASES[k]) != "aligned-resend" for k in CASES if k != "aligned-resend")


def test_0_30_s_resends_under_the_drop_with_a_hash_unit_never_hit_and_its_aligned_resends_miss_once():
    """vLLM 0.30.0: a resend under the drop with a hash unit below the block
    is hashed-drop-resend whatever the retention (0.33.0's resend beside a
    checkpoint is another cause); a block-aligned resend with the drop and
    no hash unit is aligned-resend (miss, miss, hit with a third request),
    which on 0.29.0 is #53504's."""
    hashed = CASES["hashed-drop-resend"]
    assert classify(hashed) == "hashed-drop-resend"
    dense = copy.deepcopy(hashed)
    dense["case"]["geometry"]["retention_interval"] = None
    assert classify(dense) == "hashed-drop-resend"
    newer = copy.deepcopy(dense)
    newer["engine"]["version"] = "0.33.0"
    assert classify(newer) == "resend-beside-checkpoint"
    undropped = copy.deepcopy(hashed)
    undropped["engine"]["knobs"]["eagle_drop"] = False
    assert classify(undropped) == "aligned-resend"  # A:288 is two blocks of 144
    assert classify(ALIGNED_DROP_030) == "aligned-resend"
    older = copy.deepcopy(ALIGNED_DROP_030)
    older["engine"]["version"] = "0.29.0"
    assert classify(older) == "resend-53504"
    assert all(classify(CASES[k]) != "hashed-drop-resend" for k in CASES if k != "hashed-drop-resend")


def test_0_29_s_resend_under_the_drop_with_a_hash_unit_is_the_same_class():
    """make check's 0.29.0 campaign: Falcon-H1, EAGLE, block 144, unit 16,
    dense: A:288 resent hits 0 where the promise gives 128, and a third
    request misses too (0.29.0's lookup drops one unit, :778-779, as
    0.30.0's). It was labelled resend-beside-checkpoint, 0.33.0's cause,
    whose fix has no code to change in 0.29.0; on 0.33.0 it is that class."""
    older = json.loads((REPO_ROOT / "tests/engine/data/finding-hashed-drop-resend-0.29.0-falcon_h1.json").read_text())
    assert classify(older) == "hashed-drop-resend"
    newer = copy.deepcopy(older)
    newer["engine"]["version"] = "0.33.0"
    assert classify(newer) == "resend-beside-checkpoint"
    unhashed = copy.deepcopy(older)
    unhashed["case"]["geometry"].update(hash_block_size=144, prefix_match_unit=None)
    assert classify(unhashed) == "resend-53504"


def test_a_self_preempted_request_shut_out_by_its_own_hit_inside_a_block_is_the_async_class():
    """0.32.0 and 0.33.0: a request that ran under async scheduling and
    stopped at 0 computed, its own prompt's hit ending inside a block, is
    the self-preemption (tests/engine/test_stalls.py: sync runs it, the fix
    ends it); the same stall ending on a block, under sync, or on a release
    the class was not traced on is none."""
    assert classify(SHUT_OUT_032) == "async-self-preemption"
    assert "after 11 steps (0/337 prompt tokens computed)" in SHUT_OUT_032["observed"]["error"]["message"]
    newer = copy.deepcopy(SHUT_OUT_032)
    newer["engine"]["version"] = "0.33.0"
    assert classify(newer) == "async-self-preemption"
    sync = copy.deepcopy(SHUT_OUT_032)
    sync["resolution"]["facts"]["async_scheduling"] = False
    assert classify(sync) is None
    on_a_block = copy.deepcopy(SHUT_OUT_032)  # 321 - 1 floors to 320, a block boundary: no copy-on-write block
    on_a_block["case"]["trace"][0]["prompt"][0]["length"] = 321
    assert classify(on_a_block) is None
    untraced = copy.deepcopy(SHUT_OUT_032)
    untraced["engine"]["version"] = "0.31.0"
    assert classify(untraced) is None
    after = copy.deepcopy(SHUT_OUT_032)  # an earlier prompt's shared prefix ends inside a block (288), its own
    after["case"]["trace"] = [  # hit on one (320): the hit it finds after preempting itself is its own, the longer
        {"prompt": [{"segment": "C", "length": 300}], "max_tokens": 1},
        {"prompt": [{"segment": "C", "length": 321}], "max_tokens": 1},
    ]
    stalled = "after 11 steps (0/321 prompt tokens computed)"
    after["observed"]["error"]["message"] = "no progress: request 1 still unfinished " + stalled
    assert classify(after) is None
    computed = copy.deepcopy(SHUT_OUT_032)  # stopped with tokens computed, short of looping: not this rule
    stopped = "after 11 steps (80/337 prompt tokens computed)"
    computed["observed"]["error"]["message"] = "no progress: request 0 still unfinished " + stopped
    assert classify(computed) is None


def test_0_30_has_0_29_s_overcount_with_its_tail_one_unit_lower_in_an_eagle_group():
    """vLLM 0.30.0 counts the copy-on-write block as 0.29.0 does
    (single_type_kv_cache_manager.py:1797-1801): the cap back-ported
    (tests/engine/data/vllm-0.30.0-tail-cow-cap.diff) ended these stalls and
    the 0.33.0 async fix did not. In an EAGLE group 0.30.0 keys the partial
    tail one hash unit lower (:2083-2088), where the request resumes, and a
    block-aligned prompt has one. The async class's file ends with the
    async fix and not with the cap."""
    assert "(976/1007 prompt tokens computed)" in TAIL_COW_DROP_030["observed"]["error"]["message"]
    assert classify(TAIL_COW_DROP_030) == "tail-cow-overcount"
    undropped = copy.deepcopy(TAIL_COW_DROP_030)  # without the drop, 976 is not where it resumes
    undropped["engine"]["knobs"]["eagle_drop"] = False
    assert classify(undropped) == "async-self-preemption"  # async, and it looped
    newer = copy.deepcopy(TAIL_COW_DROP_030)
    newer["engine"]["version"] = "0.32.0"  # 0.32.0 caps the count
    assert classify(newer) == "async-self-preemption"
    aligned = json.loads(
        (REPO_ROOT / "tests/engine/data/finding-tail-cow-overcount-aligned-0.30.0-qwen3_5.json").read_text()
    )
    assert "(512/544 prompt tokens computed)" in aligned["observed"]["error"]["message"]  # block 544, unit 32, sync
    assert classify(aligned) == "tail-cow-overcount"
    older = copy.deepcopy(aligned)
    older["engine"]["version"] = "0.29.0"  # 0.29.0 keys no tail on a block-aligned prompt
    assert classify(older) is None
    assert classify(ASYNC_030) == "async-self-preemption"
    sync = copy.deepcopy(ASYNC_030)
    sync["resolution"]["facts"]["async_scheduling"] = False
    assert classify(sync) is None


def test_a_0_29_resume_past_an_earlier_prompts_own_tail_under_async_is_the_recache_class():
    assert classify(TAIL_RECACHE) == "async-tail-recache"
    rec = TAIL_RECACHE["explain"]["engine"][4]["resumed_state"]
    assert (rec["at"], rec["tokens"], rec["same_tokens"]) == (384, 385, False)
    sync = copy.deepcopy(TAIL_RECACHE)
    sync["resolution"]["facts"]["async_scheduling"] = False
    assert classify(sync) is None  # the second key needs the output in flight
    assert classify(dict(TAIL_RECACHE, engine=dict(TAIL_RECACHE["engine"], version="0.33.0"))) is None
    far = copy.deepcopy(TAIL_RECACHE)  # more tokens past the key than request 0 decoded: not its decode
    far["explain"]["engine"][4]["resumed_state"]["tokens"] = 384 + 5
    assert classify(far) is None
    short = copy.deepcopy(TAIL_RECACHE)  # a state short of the key is another fault
    short["explain"]["engine"][4]["resumed_state"]["tokens"] = 383
    assert classify(short) is None
    untailed = copy.deepcopy(TAIL_RECACHE)  # A:320 ends its block: no partial tail of its own
    untailed["case"]["trace"][0]["prompt"][0]["length"] = 320
    assert classify(untailed) is None


def test_a_stall_whose_hit_the_drop_moves_inside_a_block_is_the_copy_on_write_class():
    """bench/rediscovery's 0.33.0 seed 4 (Qwen3-Next, block 192, unit 32,
    MTP 2 with the drop, pool 23, sync): B:380+C:4 then B:380+C:4+T0:193.
    The shared prefix floors to 384, on a block boundary, but the drop
    backs the hit off one unit to 352, inside the block: never admitted
    (9 steps). vLLM gives 352 at pool 24; the admission fix refuses pool 23."""
    stored = json.loads(
        (REPO_ROOT / "tests/engine/data/finding-pinned-pool-cow-stall-drop-qwen3_next.json").read_text()
    )
    assert classify(stored) == "pinned-pool-cow-stall"
    undropped = copy.deepcopy(stored)
    undropped["engine"]["knobs"]["eagle_drop"] = False
    assert classify(undropped) is None  # a hit of 384 ends on the block: no copy-on-write block
