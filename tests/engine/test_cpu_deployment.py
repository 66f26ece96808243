"""The live CPU server's deployment, resolved and run in-process (vllm==0.32.0,
platform cpu: vLLM's own ``CpuPlatform`` in a worker under
``KVSPEC_PLATFORM=cpu``), and the engine core's start-up config step that
``vllm serve`` runs after building the scheduler
(``engine_adapter.vllm_engine.engine_core.engine_core_handshake``).

No server here: ``tests/live/test_agreement.py`` compares with the server.
The server's block size depends on the CPU (an SSM state in float32 where
the CPU has AVX512-BF16 doubles the Mamba page: 256 instead of 128), so
these tests read it from the resolution instead of assuming it.
"""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]

CPU_DEFAULT_BLOCK = 128  # CpuPlatform.check_and_update_config, vLLM 0.29.0-0.32.0


def _deployment(**config) -> dict:
    """``server_deployment`` of a ServerConfig (the live tier's import of
    httpx is not needed for it, but the server module is the source)."""
    from engine_adapter.live.server import ServerConfig, server_deployment

    return server_deployment(ServerConfig(**config))


def _case(deployment: dict, prompts, name: str = "cpu") -> dict:
    return {
        "schema": 1,
        "name": name,
        "deployment": deployment,
        "trace": [{"prompt": [{"segment": s, "length": n} for s, n in p]} for p in prompts],
    }


def test_the_live_servers_deployment_resolves_on_the_cpu_platform(engine_032):
    res = engine_032.resolve(_case(_deployment(), [[("A", 1)]]))
    facts, g = res["facts"], res["geometry"]
    assert facts["platform"] == "cpu" and facts["attention_backend"] == "CPU_ATTN"
    assert (
        facts["architecture"] == "Qwen3_5ForCausalLM" and facts["mamba_layers"] == 3 and facts["attention_layers"] == 1
    )
    block = facts["block_size"]
    assert block in (128, 256), block  # bf16 or float32 SSM state (the CPU's AVX512-BF16)
    assert g["groups"] == [
        {"kind": "mamba", "block_size": block, "count": 3},
        {"kind": "full_attention", "block_size": block, "count": 1},
    ]
    assert g["scheduler_block_size"] == g["hash_block_size"] == facts["mamba_block_size"] == block
    assert g["retention_interval"] == 0 and g["max_num_batched_tokens"] == 8192 and res["speculative"] is None
    # vllm serve's engine core re-runs VllmConfig.__post_init__: the CPU
    # platform resets the block the user did not set to its default
    assert facts["chunk_split_block_size"] == CPU_DEFAULT_BLOCK
    noted = [a for a in res["assumptions"] if "chunk split" in a]
    assert bool(noted) == (block != CPU_DEFAULT_BLOCK), res["assumptions"]


def test_an_explicit_block_size_survives_the_engine_core_step(engine_032):
    block = engine_032.resolve(_case(_deployment(), [[("A", 1)]]))["facts"]["block_size"]
    res = engine_032.resolve(_case(_deployment(block_size=block), [[("A", 1)]]))
    assert res["facts"]["block_size"] == res["facts"]["chunk_split_block_size"] == block
    assert not [a for a in res["assumptions"] if "chunk split" in a]


def test_a_resend_after_a_split_below_the_block(engine_032):
    """The pattern the live server shows (tests/live/test_agreement.py): with
    chunks split every 128 tokens while the KV blocks are 256, a 1,470-token
    prompt's first pass ends a chunk at 1408, not at the block boundary
    1280, so no Mamba state is kept there and its identical resend misses;
    the resend itself stops at the shared prefix 1280, so the third hits.
    With ``--block-size`` given, the split and the blocks agree, as they do
    on a CPU that resolves the split's own block (the resend hits)."""
    block = engine_032.resolve(_case(_deployment(), [[("A", 1)]]))["facts"]["block_size"]
    n = 5 * block + 190  # 1470 at block 256
    last = (n - 1) // block * block
    out = engine_032.run(_case(_deployment(), [[("A", n)]] * 3))
    if block == CPU_DEFAULT_BLOCK:  # this CPU resolves the split's block: they agree, the resend hits
        assert out["hits"] == [0, last, last], json.dumps(out["explain"])[:2000]
        assert out["explain"][0]["chunk_ends"] == [last, n]
        return
    assert out["hits"] == [0, 0, last], json.dumps(out["explain"])[:2000]
    assert out["explain"][0]["chunk_ends"] == [(n - 1) // CPU_DEFAULT_BLOCK * CPU_DEFAULT_BLOCK, n]
    fixed = engine_032.run(_case(_deployment(block_size=block), [[("A", n)]] * 3))
    assert fixed["hits"] == [0, last, last]
    assert fixed["explain"][0]["chunk_ends"] == [last, n]


def test_the_engine_core_step_changes_nothing_on_cuda(engine_033):
    """The same re-run on the cuda platform (a shipped model, MTP on): the
    split block is the KV block."""
    spec = json.dumps({"method": "mtp", "num_speculative_tokens": 2})
    res = engine_033.resolve(
        _case(
            {"model": "qwen3_next", "vllm_args": ["--enable-prefix-caching", "--speculative-config", spec]},
            [[("A", 1)]],
        )
    )
    assert res["facts"]["chunk_split_block_size"] == res["facts"]["block_size"]
    assert not [a for a in res["assumptions"] if "chunk split" in a]
