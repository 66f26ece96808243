"""advise.source without an engine or a server: the resolution cache (a
second advise of a deployment asks no engine; another deployment does), and
the geometry a server's /metrics labels give, with what is assumed."""

from __future__ import annotations

import pytest

from advise import source
from engine_adapter.live.geometry import ServerInfo
from ground.engines import EngineSpec
from ground.errors import Unsupported
from reference.case import parse_case

SUMMARY = {
    "geometry": {
        "groups": [{"kind": "full_attention", "block_size": 544}, {"kind": "mamba", "block_size": 544, "count": 3}],
        "hash_block_size": 544,
        "scheduler_block_size": 544,
        "retention_interval": 0,
        "max_num_batched_tokens": 8192,
    },
    "speculative": None,
    "facts": {"mamba_layers": 36, "mamba_page_size_bytes": 1114112, "tensor_parallel_size": 1},
    "assumptions": [],
}


def _case(*flags):
    return parse_case(
        {
            "schema": 1,
            "deployment": {"model": "qwen3_next", "vllm_args": ["--enable-prefix-caching", *flags]},
            "trace": [{"prompt": [{"segment": "A", "length": 1}]}],
        }
    )


class FakeEngine:
    def __init__(self):
        self.calls = 0

    def resolve(self, case):
        self.calls += 1
        return SUMMARY


def test_a_resolution_is_cached_per_deployment(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSPEC_HOME", str(tmp_path))
    engine = FakeEngine()
    first = source.from_deployment(_case(), EngineSpec("vllm", "0.33.0"), lambda: engine)
    again = source.from_deployment(_case(), EngineSpec("vllm", "0.33.0"), lambda: engine)
    assert (first.cached, again.cached, engine.calls) == (False, True, 1)
    assert again.geometry == first.geometry and again.geometry.scheduler_block_size == 544
    source.from_deployment(_case("--max-num-batched-tokens", "4096"), EngineSpec("vllm", "0.33.0"), lambda: engine)
    assert engine.calls == 2  # another deployment: resolved
    source.from_deployment(_case(), EngineSpec("vllm", "0.29.0"), lambda: engine)
    assert engine.calls == 3  # another engine: resolved
    source.from_deployment(_case(), EngineSpec("vllm", "0.33.0"), lambda: engine, use_cache=False)
    assert engine.calls == 4  # --fresh
    source.forget(EngineSpec("vllm", "0.33.0"), _case())
    source.from_deployment(_case(), EngineSpec("vllm", "0.33.0"), lambda: engine)
    assert engine.calls == 5


def test_an_unreadable_cache_entry_is_resolved_again(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSPEC_HOME", str(tmp_path))
    engine = FakeEngine()
    source.from_deployment(_case(), EngineSpec("vllm", "0.33.0"), lambda: engine)
    source.cache_path(EngineSpec("vllm", "0.33.0"), _case()).write_text("{torn")
    assert not source.from_deployment(_case(), EngineSpec("vllm", "0.33.0"), lambda: engine).cached
    assert engine.calls == 2


def _info(**labels):
    cc = {"enable_prefix_caching": "True", "block_size": "256", "mamba_cache_mode": "align", **labels}
    return ServerInfo("m", ("m",), 4096, "0.33.0", cc, None)


def test_server_geometry_from_metrics_labels():
    g, spec, assumed = source.server_geometry(_info(prefix_cache_retention_interval="512"))
    assert (g.scheduler_block_size, g.hash_block_size, g.retention_interval, spec) == (256, 256, 512, None)
    assert any("max_num_batched_tokens" in a for a in assumed)
    g, spec, assumed = source.server_geometry(
        ServerInfo(
            "m",
            ("m",),
            4096,
            "0.33.0",
            {"enable_prefix_caching": "True", "block_size": "256", "mamba_cache_mode": "align"},
            2,
        )
    )
    assert g.retention_interval == 0 and spec.num_speculative_tokens == 2
    assert any("retention interval 0" in a for a in assumed) and any("mtp with 2" in a for a in assumed)


@pytest.mark.parametrize(
    "labels, message",
    [
        ({"enable_prefix_caching": "False"}, "server enable_prefix_caching=False"),
        ({"mamba_cache_mode": "all"}, "server mamba_cache_mode=all"),
        ({"block_size": "None"}, "server block_size='None'"),
    ],
)
def test_server_geometry_refusals(labels, message):
    with pytest.raises(Unsupported, match=message):
        source.server_geometry(_info(**labels))


def test_the_resolver_digest_names_every_file_the_resolver_is_made_of():
    """The resolution cache key digests ``RESOLVER_FILES`` (a missing name
    is skipped without a word): each is there, and every ``vllm_engine``
    module ``resolve.py`` imports is among them."""
    import ast
    from pathlib import Path

    root = Path(source.__file__).resolve().parents[1] / "engine_adapter"
    assert [f for f in source.RESOLVER_FILES if not (root / f).is_file()] == []
    tree = ast.parse((root / "vllm_engine" / "resolve.py").read_text())
    imported = {
        n.module
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("engine_adapter.vllm_engine.")
    }
    imported |= {
        f"engine_adapter.vllm_engine.{a.name}"
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "engine_adapter.vllm_engine"
        for a in n.names
    }
    assert (
        imported
        and {m.removeprefix("engine_adapter.").replace(".", "/") + ".py" for m in imported} - set(source.RESOLVER_FILES)
        == set()
    )
