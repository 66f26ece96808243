"""What the engine observes of the model runner's Mamba writes
(engine_adapter.vllm_engine.writes, explain ``written``) and the ``stale`` oracle on it,
vLLM 0.33.0:

* an internal prefill checkpoint that is no chunk end is observed: Qwen3.5
  on an H100 (GDN on FlashInfer) writes 1600 inside the chunk ending at
  1632, placed by vLLM's own ``compute_mamba_prefill_checkpoints``;
* on 0.33.0's stale state after a partial hit the second request leaves a
  state held at 144 that it did not write, and the third and fourth resume
  there: ``stale`` names all three;
* with MTP the step loop proposes drafts after each sampling step, and
  every step after the prefill schedules the sampled token and both drafts
  (what ``split`` judges there);
* under async scheduling with MTP a chat turn resumes at a block boundary
  inside the previous turn's output that no recorded step start shows, and
  ``stale`` counts it written (every step keeps a token, so some step ends
  at the boundary or crosses it); the plain scheduler's stand-in reads
  there a state over exactly the key's tokens;
* a sibling that resumes from a KV connector's load of an earlier
  request's evicted state holds the loaded block: no state it keyed
  without computing.
"""

from __future__ import annotations

import json

import pytest

from fuzz.judge.oracles import check_stale, resolved
from ground.home import REPO_ROOT
from reference.case import case_to_dict, load_case, parse_case

pytestmark = pytest.mark.engine

EXAMPLES = REPO_ROOT / "examples"


def test_an_internal_checkpoint_that_is_no_chunk_end_is_observed_as_written(engine_033):
    obs = engine_033.run(load_case(EXAMPLES / "r1-hashed-periodic-eagle-drop-qwen3_5.json"))
    first = obs["explain"][0]
    assert first["chunk_ends"] == [1280, 1632, 1664]
    assert first["written"] == [1280, 1600, 1632, 1664]


def test_the_stale_oracle_names_the_requests_that_resume_where_nothing_was_written(engine_033):
    case = load_case(EXAMPLES / "stale-state-after-partial-hit-falcon_h1.json")
    obs = engine_033.run(case)
    assert obs["hits"] == [0, 16, 144, 144]
    assert [e["written"] for e in obs["explain"][:2]] == [[16, 17], [416, 428]]
    # the full-attention group's hit blocks at admission (hit_blocks reads them): ceil(hit / 144)
    assert [e["attention_blocks"] for e in obs["explain"]] == [[[144, 0]], [[144, 1]], [[144, 1]], [[144, 1]]]
    (div,) = check_stale(resolved(case, obs, engine_033.version), engine_033.version, obs)
    # request 1 (A:428, resumed at 16) leaves 144 held though it wrote 416 and 428;
    # requests 2 and 3 resume there
    assert (div.oracle, div.requests, div.expected[2]) == ("stale", [1, 2, 3], 17)
    assert div.context["stale_keys"][1] == [144]


def test_steps_after_the_prefill_carry_the_drafts_the_step_loop_proposes(engine_033):
    """Qwen3-Next, block 576, MTP K=2; A:575 decoding 4 tokens: the prefill
    samples one, then three steps each ask for and get 1 + 2 tokens (with
    all drafts rejected the request advances one token a step). On 0.33.0
    with ``start > prefill_end`` in ``_mamba_block_aligned_split`` the first
    one gets 1 (cut at 576). The repeat decodes nothing. That is the plain
    scheduler (``--no-async-scheduling``); under async scheduling (the
    deployment's default) the second step is scheduled before the first
    one's drafts are rolled back (``update_from_output``, scheduler.py:
    2356-2365), so it starts at 575 + 3 and the third at 578 + 3 - 2."""
    from fuzz.judge.oracles import check_split

    mtp = json.dumps({"method": "mtp", "num_speculative_tokens": 2})
    for extra, steps in (
        (["--no-async-scheduling"], [[575, 3, 3], [576, 3, 3], [577, 3, 3]]),
        ([], [[575, 3, 3], [578, 3, 3], [579, 3, 3]]),
    ):
        case = parse_case(
            {
                "schema": 1,
                "deployment": {
                    "model": "qwen3_next",
                    "platform": "cuda",
                    "device": "h100",
                    "vllm_args": ["--enable-prefix-caching", "--speculative-config", mtp, *extra],
                },
                "trace": [
                    {"prompt": [{"segment": "A", "length": 575}], "max_tokens": 4},
                    {"prompt": [{"segment": "A", "length": 575}]},
                ],
            }
        )
        obs = engine_033.run(case)
        assert [e["decode_steps"] for e in obs["explain"]] == [steps, []], extra
        assert [e["chunk_ends"] for e in obs["explain"]] == [[575], [575]]
        assert check_split(resolved(case, obs, engine_033.version), engine_033.version, obs) == []


def test_a_decoding_request_leaves_no_state_inside_its_output_under_sparse_retention(engine_033):
    """Qwen3-Next on an A100 (block 544), sparse retention, no speculative
    decoding; A:1087 decoding 4 tokens computes 1090, past the block end
    1088: the release keeps the prompt's state at 544 and none inside the
    output (``retained_output_states``), and the retention oracle agrees.
    With ``{N + 1, N}`` for ``{N - 1, N}`` in ``replay_boundaries`` it keeps
    1088 (``.kvspec/mutate``, replay-aba84fc0). Under periodic retention
    every 544 tokens the release keeps 1088, a segment end, and the oracle
    allows it (with the scan past the prompt planted to answer nothing,
    this fails)."""
    from fuzz.judge.oracles import check_retention

    case = parse_case(
        {
            "schema": 1,
            "deployment": {
                "model": "qwen3_next",
                "platform": "cuda",
                "device": "a100",
                "vllm_args": ["--enable-prefix-caching", "--prefix-cache-retention-interval", "0"],
            },
            "trace": [{"prompt": [{"segment": "A", "length": 1087}], "max_tokens": 4}],
        }
    )
    obs = engine_033.run(case)
    (e,) = obs["explain"]
    assert (e["decode_steps"], e["retained_mamba_blocks"], e["retained_output_states"]) == (
        [[1087, 1, 1], [1088, 1, 1], [1089, 1, 1]],
        {"544": [0]},
        [],
    )
    assert check_retention(resolved(case, obs, engine_033.version), engine_033.version, obs) == []
    # periodic retention every 544 tokens keeps the segment end 1088 inside the output, which the oracle allows
    periodic = parse_case(
        {
            **case_to_dict(case),
            "deployment": {
                **case_to_dict(case)["deployment"],
                "vllm_args": ["--enable-prefix-caching", "--prefix-cache-retention-interval", "544"],
            },
        }
    )
    obs = engine_033.run(periodic)
    assert obs["explain"][0]["retained_output_states"] == [1088]
    assert check_retention(resolved(periodic, obs, engine_033.version), engine_033.version, obs) == []


def test_an_async_speculative_decode_leaves_a_state_at_every_block_boundary(engine_033):
    """stale-fd08ce45 (a 10-minute campaign on the fixed base, seed 7):
    Qwen3-Next, block 576, hash unit 16, MTP 3, async scheduling; request 1
    (1149 prompt tokens) decodes, request 2 quotes its output and resumes at
    1152. Under async scheduling the step after 1149 is recorded at 1153
    (the step in flight counted as all accepted, scheduler.py:2356-2365
    rolls it back later), yet every step keeps a token, so some step ends at
    1152 or crosses it (postprocess_mamba_fused_kernel copies it out):
    ``stale`` stays quiet. The plain scheduler shows the stand-in's read:
    request 2's resumed state is over exactly its first 1152 tokens."""
    raw = json.loads((REPO_ROOT / "tests/engine/data/async-mtp-chat-qwen3-next.json").read_text())
    case = parse_case(raw)
    obs = engine_033.run(case)
    steps = [d[0] for d in obs["explain"][1]["decode_steps"][:3]]
    assert steps[0] == 1149 and steps[1] - steps[0] == 4 and obs["hits"][2] == 1152
    assert check_stale(resolved(case, obs, engine_033.version), engine_033.version, obs) == []
    raw["deployment"]["vllm_args"].append("--no-async-scheduling")
    sync = engine_033.run(parse_case(raw))
    assert sync["hits"][2] == 1152
    assert sync["explain"][2]["resumed_state"] == {
        "observable": True,
        "at": 1152,
        "tokens": 1152,
        "same_tokens": True,
        "column": 1,
    }


def test_a_state_a_connector_loaded_from_an_earlier_write_is_no_stale_key(engine_033):
    """stale-052d07f8 (the same campaign): Qwen3-Next, block 560, MTP 2,
    async, an offloading connector, pool 25. A:2352+B:449 writes 560..2801
    and the pool evicts its states at 560 and 1120; A:1695+C:1 resumes at
    1120 from the connector (``external_hit``) and holds the loaded block
    at 1120, request 0's write brought back (kv_cache_manager.py:590-600):
    ``stale`` stays quiet. The plain scheduler's stand-in reads there a
    state over exactly 1120 tokens."""
    raw = json.loads((REPO_ROOT / "tests/engine/data/connector-sibling-load-qwen3-next.json").read_text())
    case = parse_case(raw)
    obs = engine_033.run(case)
    first, second = obs["explain"][:2]
    assert obs["hits"] == [0, 1120] and second.get("external_hit") == 1120 and 1120 not in second["written"]
    assert 1120 in first["written"] and 1 in second["retained_mamba_blocks"]["560"]
    assert check_stale(resolved(case, obs, engine_033.version), engine_033.version, obs) == []
    raw["deployment"]["vllm_args"].append("--no-async-scheduling")
    sync = engine_033.run(parse_case(raw))
    assert sync["hits"] == [0, 1120]
    assert (sync["explain"][1]["resumed_state"] or {}).get("same_tokens") is True


def test_a_preempted_request_s_recomputed_chunks_are_observed_as_written(engine_029):
    """stale-23eac726 (vLLM 0.29.0, ``make check``'s campaign): Qwen3.5,
    block 288, EAGLE-3 with the drop, async, pool 26. A:1727 writes 576,
    1152 and 1727 and samples its first token; the pool preempts it twice,
    and each recompute (prompt and output, hit 1152 the second time) runs
    1152..1440 on what the pool has left, writing the state at 1440 that
    its allocation keyed (cache_blocks 1440; 0.29.0 kv_cache_manager.py:503-505
    frees, then allocates and caches up to the step's end). A recompute's
    chunk ends inside the prompt are writes like the first pass's, so
    ``stale`` stays quiet."""
    raw = json.loads((REPO_ROOT / "tests/engine/data/preempted-recompute-writes-qwen3_5.json").read_text())
    case = parse_case(raw)
    obs = engine_029.run(case)
    (first,) = obs["explain"]
    assert first["preempted_steps"] and first["chunk_ends"] == [576, 1152, 1727]
    assert first["written"] == [576, 1152, 1440, 1727] and 4 in first["retained_mamba_blocks"]["288"]
    assert check_stale(resolved(case, obs, engine_029.version), engine_029.version, obs) == []
