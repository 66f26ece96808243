"""The live server's ``ServerConfig`` as a kvspec deployment (no server, no engine)."""

from __future__ import annotations

from pathlib import Path

from engine_adapter.live.model import tiny_model_dir
from engine_adapter.live.server import BASE_FLAGS, ServerConfig, server_deployment
from reference.deployment import RESERVED_FLAGS, parse_deployment


def test_the_default_server_as_a_deployment():
    d = server_deployment(ServerConfig())
    assert (
        d["model"] == str(tiny_model_dir())
        and d["platform"] == "cpu"
        and d["device"] is None
        and d["model_overrides"] == {}
    )
    assert d["vllm_args"] == [
        *BASE_FLAGS,
        "--max-model-len",
        "16384",
        "--max-num-batched-tokens",
        "8192",
        "--prefix-cache-retention-interval",
        "0",
    ]
    assert not set(d["vllm_args"]) & set(RESERVED_FLAGS)
    dep = parse_deployment(d)  # kvspec's own shape check accepts it
    assert dep.platform == "cpu" and dep.vllm_args == tuple(d["vllm_args"])
    assert ServerConfig().deployment() == d


def test_every_cache_flag_the_server_gets_is_in_the_deployment(tmp_path):
    config = ServerConfig(
        model_dir=tmp_path,
        max_model_len=4096,
        max_num_batched_tokens=2048,
        block_size=256,
        retention_interval=768,
        speculative_config='{"method": "mtp", "num_speculative_tokens": 1}',
        extra_args=("--served-model-name=other", "--kv-cache-dtype", "auto", "--port=1", "--api-key", "k"),
    )
    d = server_deployment(config)
    assert d["model"] == str(tmp_path)
    args = d["vllm_args"]
    for flag, value in (
        ("--max-model-len", "4096"),
        ("--max-num-batched-tokens", "2048"),
        ("--block-size", "256"),
        ("--prefix-cache-retention-interval", "768"),
        ("--kv-cache-dtype", "auto"),
        ("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'),
    ):
        assert args[args.index(flag) + 1] == value, flag
    # where it listens, what it is called, its key and model: not cache settings
    assert not any(a.split("=", 1)[0] in RESERVED_FLAGS for a in args)
    assert "k" not in args and "1" not in args and "other" not in args
    # the server's own command line, less the reserved flags and their values, in order
    server_argv = config.args(Path(tmp_path), 8000)[2:]
    kept, skip = [], False
    for a in server_argv:
        if skip:
            skip = False
            continue
        flag, eq, _ = a.partition("=")
        if flag in RESERVED_FLAGS:
            skip = not eq
            continue
        kept.append(a)
    assert kept == args
    parse_deployment(d)


def test_retention_left_to_vllm_leaves_the_flag_out():
    d = server_deployment(ServerConfig(retention_interval=None))
    assert "--prefix-cache-retention-interval" not in d["vllm_args"]
